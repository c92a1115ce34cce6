//! `run`: wires the parts together and runs the relay until a signal.
//!
//! Start-up never crashes on an unreachable database: it logs, keeps `/readyz` false and
//! retries with backoff; `/healthz` answers from the first moment.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::config::{LeaseBackend, Mode, Settings};
use crate::housekeeping;
use crate::lease::{DatabaseLease, Keeper, Lease, RedisLease, RedlockLease};
use crate::relay::Relay;
use crate::sink::SinkRegistry;
use crate::store::{self, Dialect, SqlStore};
use crate::telemetry::{self, Health};

pub(super) async fn run(settings: Settings) -> Result<(), CliError> {
    telemetry::init_logging(&settings.log);
    let prom = telemetry::install_metrics()?;
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    crate::shutdown::on_signals(shutdown.clone());
    // Sinks first: a sink that cannot be built is a configuration problem, reported before
    // anything connects.
    let sinks = Arc::new(
        SinkRegistry::build(&settings).map_err(|e| CliError::Usage(format!("sinks: {e}")))?,
    );

    let store_cell: Arc<OnceCell<Arc<SqlStore>>> = Arc::new(OnceCell::new());
    let lease_cell: Arc<OnceCell<Arc<dyn Lease>>> = Arc::new(OnceCell::new());
    let http_stop = CancellationToken::new();
    if !settings.http.listen.is_empty() {
        let addr = telemetry::serve(
            &settings.http.listen,
            prom,
            health.clone(),
            store_cell.clone(),
            lease_cell.clone(),
            http_stop.clone(),
        )
        .await?;
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    }

    let Some(store) = connect(&settings, &shutdown).await? else {
        http_stop.cancel();
        return Ok(());
    };
    let _ = store_cell.set(store.clone());
    health.set_database(true);

    let wake = Arc::new(Notify::new());
    if store.dialect() == Dialect::Postgres && settings.database.listen {
        tokio::spawn(store::listen(
            settings.database.url.expose().to_string(),
            settings.database.table.clone(),
            wake.clone(),
            shutdown.clone(),
        ));
    } else {
        // No NOTIFY: notice new rows by the table's newest id (a cheap probe, 20 per second).
        tokio::spawn(store::watch_new_rows(
            store.clone(),
            wake.clone(),
            shutdown.clone(),
        ));
    }

    let l = &settings.lease;
    let lease: Option<Arc<dyn Lease>> = match (settings.relay.mode, l.backend) {
        (Mode::Leader, LeaseBackend::Database) => Some(Arc::new(DatabaseLease::new(
            store.clone(),
            &l.name,
            &settings.relay.instance_id,
            l.ttl,
        ))),
        (Mode::Leader, LeaseBackend::Redis) => {
            let url = l.redis_url.as_ref().map(|u| u.expose()).unwrap_or_default();
            let lease = RedisLease::connect(
                url,
                &l.name,
                &settings.relay.instance_id,
                l.ttl,
                l.renew_timeout,
            )
            .map_err(|e| CliError::Usage(e.to_string()))?;
            Some(Arc::new(lease))
        }
        (Mode::Leader, LeaseBackend::Redlock) => {
            let urls: Vec<&str> = l.redlock_urls.iter().map(|u| u.expose()).collect();
            let lease = RedlockLease::connect(
                &urls,
                &l.name,
                &settings.relay.instance_id,
                l.ttl,
                l.renew_timeout,
            )
            .map_err(|e| CliError::Usage(e.to_string()))?;
            Some(Arc::new(lease))
        }
        _ => None,
    };
    if let Some(lease) = &lease {
        let _ = lease_cell.set(lease.clone());
    }
    let keeper = lease.map(|lease| Keeper::start(lease, store.clone(), l.renew_timeout));

    tokio::spawn(housekeeping::sample_loop(store.clone(), shutdown.clone()));
    tokio::spawn(housekeeping::retention_loop(
        store.clone(),
        settings.retention.clone(),
        settings.lease.name.clone(),
        settings.relay.instance_id.clone(),
        shutdown.clone(),
    ));

    let relay = Relay {
        store: store.clone(),
        sinks,
        settings: settings.relay.clone(),
        lease: keeper
            .as_ref()
            .map(|k| (settings.lease.name.clone(), k.state())),
        wake,
        health,
        shutdown,
    };
    let release_budget = settings.relay.shutdown_timeout / 10;
    relay.run().await;
    if let Some(k) = keeper {
        // Bounded: a lease backend that does not answer must not keep the process past
        // shutdown_timeout (the lease then simply expires after its ttl).
        if tokio::time::timeout(release_budget, k.release())
            .await
            .is_err()
        {
            tracing::warn!("releasing the lease timed out; it will expire after its ttl");
        }
    }
    http_stop.cancel();
    Ok(())
}

/// Connects (and migrates, if configured), retrying with backoff until it works or a signal
/// arrives (`None`).
async fn connect(
    settings: &Settings,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<SqlStore>>, CliError> {
    let db = &settings.database;
    let mut wait = Duration::from_millis(500);
    loop {
        let attempt = async {
            let store = store::connect(
                db.url.expose(),
                &db.table,
                db.max_connections,
                db.connect_timeout,
            )
            .await?;
            if db.migrate {
                store.migrate().await?;
            }
            anyhow::Ok(store)
        };
        let attempt = tokio::select! {
            r = attempt => r,
            _ = shutdown.cancelled() => return Ok(None),
        };
        match attempt {
            Ok(store) => {
                tracing::info!(
                    database = %settings.database_url_redacted(),
                    dialect = store.dialect().name(),
                    table = %db.table,
                    "database connected"
                );
                return Ok(Some(store));
            }
            Err(e) => {
                tracing::error!(
                    database = %settings.database_url_redacted(),
                    error = %e,
                    retry_in_ms = wait.as_millis() as u64,
                    "database unavailable; not ready, retrying"
                );
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
        wait = (wait * 2).min(Duration::from_secs(10));
    }
}
