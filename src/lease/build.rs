//! The lease the configuration asks for, built and kept (as `SinkRegistry::build` builds the
//! sinks): the one place `outbox-relay run` and the benchmark get their lease from.

use std::sync::Arc;
use std::time::Duration;

use super::{
    DatabaseLease, GetLockLease, Keeper, Lease, RedisLease, RedissonLease, RedlockLease,
    ShedLockLease, Tenure,
};
use crate::config::{LeaseBackend, Mode, Settings};
use crate::store::{ShedLockTable, SqlStore};

/// The `[lease]` backend of `settings` over `store`, with its [`Keeper`] started: `None`
/// outside leader mode and with the `none` backend. An error is a configuration problem (a
/// Redis URL that does not parse, too few Redlock nodes); an unreachable backend is not one
/// (the keeper retries).
pub fn build(settings: &Settings, store: &Arc<SqlStore>) -> anyhow::Result<Option<Keeper>> {
    let Some(lease) = backend(settings, store)? else {
        return Ok(None);
    };
    Ok(Some(Keeper::start(
        lease,
        store.clone(),
        settings.lease.renew_timeout,
    )))
}

/// The backend alone (see [`build`]).
fn backend(settings: &Settings, store: &Arc<SqlStore>) -> anyhow::Result<Option<Arc<dyn Lease>>> {
    let l = &settings.lease;
    let id = &settings.relay.instance_id;
    if settings.relay.mode != Mode::Leader {
        return Ok(None);
    }
    let lease: Arc<dyn Lease> = match l.backend {
        LeaseBackend::None => return Ok(None),
        LeaseBackend::Database => Arc::new(DatabaseLease::new(store.clone(), &l.name, id, l.ttl)),
        LeaseBackend::Redis => on_redis(settings, RedisLease::connect)?,
        LeaseBackend::Redisson => on_redis(settings, RedissonLease::connect)?,
        LeaseBackend::Shedlock => {
            let offset = l.shedlock_utc_offset_minutes().unwrap_or_default();
            let table = ShedLockTable::new(&l.shedlock_table, offset);
            Arc::new(ShedLockLease::new(store.clone(), table, &l.name, id, l.ttl))
        }
        LeaseBackend::MysqlGetLock => {
            Arc::new(GetLockLease::new(store.clone(), &l.name, id, l.ttl))
        }
        LeaseBackend::Redlock => {
            let urls: Vec<&str> = l.redlock_urls.iter().map(|u| u.expose()).collect();
            Arc::new(RedlockLease::connect(
                &urls,
                &l.name,
                id,
                l.ttl,
                l.renew_timeout,
            )?)
        }
    };
    Ok(Some(lease))
}

/// A backend on `lease.redis_url` (empty when unset: validation requires it for these
/// backends), connected by `connect` (the `redis` or the `redisson` backend).
fn on_redis<L: Lease + 'static>(
    settings: &Settings,
    connect: impl FnOnce(&str, Tenure, Duration) -> anyhow::Result<L>,
) -> anyhow::Result<Arc<dyn Lease>> {
    let l = &settings.lease;
    let url = l.redis_url.as_ref().map(|u| u.expose()).unwrap_or_default();
    let tenure = Tenure::new(&l.name, &settings.relay.instance_id, l.ttl);
    Ok(Arc::new(connect(url, tenure, l.renew_timeout)?))
}
