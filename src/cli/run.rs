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
use crate::console;
use crate::housekeeping;
use crate::lease::{
    DatabaseLease, GetLockLease, Keeper, Lease, RedisLease, RedissonLease, RedlockLease,
    ShedLockLease,
};
use crate::relay::Relay;
use crate::sink::SinkRegistry;
use crate::store::{self, Dialect, ShedLockTable, SqlStore};
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
            prom.clone(),
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

    // The console starts once the database is connected (every page reads it) and stops with
    // the HTTP server, after the relay has drained.
    if settings.console.is_some() {
        let addr = console::serve(
            &settings,
            store.clone(),
            sinks.clone(),
            Some(prom),
            http_stop.clone(),
        )
        .await?;
        tracing::info!(%addr, "serving the console");
    }

    let wake = Arc::new(Notify::new());
    let arrivals = store::Arrivals::new(wake.clone());
    // A mapped table has the NOTIFY trigger only if `table.notify_trigger` installed it.
    if store.dialect() == Dialect::Postgres && settings.database.listen && store.columns().notify {
        tokio::spawn(store::listen(
            settings.database.url.expose().to_string(),
            settings.database.table.clone(),
            arrivals.clone(),
            shutdown.clone(),
        ));
    } else {
        // No NOTIFY: notice new rows by the table's newest id (a cheap probe, 20 per second).
        tokio::spawn(store::watch_new_rows(
            store.clone(),
            arrivals.clone(),
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
        (Mode::Leader, LeaseBackend::Redis | LeaseBackend::Redisson) => {
            let url = l.redis_url.as_ref().map(|u| u.expose()).unwrap_or_default();
            let id = &settings.relay.instance_id;
            let usage = |e: anyhow::Error| CliError::Usage(e.to_string());
            let lease: Arc<dyn Lease> = if l.backend == LeaseBackend::Redis {
                Arc::new(
                    RedisLease::connect(url, &l.name, id, l.ttl, l.renew_timeout).map_err(usage)?,
                )
            } else {
                Arc::new(
                    RedissonLease::connect(url, &l.name, id, l.ttl, l.renew_timeout)
                        .map_err(usage)?,
                )
            };
            Some(lease)
        }
        (Mode::Leader, LeaseBackend::Shedlock) => Some(Arc::new(ShedLockLease::new(
            store.clone(),
            ShedLockTable::new(
                &l.shedlock_table,
                l.shedlock_utc_offset_minutes().unwrap_or_default(),
            ),
            &l.name,
            &settings.relay.instance_id,
            l.ttl,
        ))),
        (Mode::Leader, LeaseBackend::MysqlGetLock) => Some(Arc::new(GetLockLease::new(
            store.clone(),
            &l.name,
            &settings.relay.instance_id,
            l.ttl,
        ))),
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
        // Claims and result writes run on the database thread (see `store::OnDbThread`).
        store: Arc::new(store::OnDbThread(store.clone())),
        sinks,
        settings: settings.relay.clone(),
        lease: keeper
            .as_ref()
            .map(|k| (settings.lease.name.clone(), k.state())),
        wake,
        arrivals,
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
        // On the database thread, so that the connections opened here are driven by it (see
        // `store::on_db_thread`).
        let owned = settings.clone();
        let attempt = store::on_db_thread(async move {
            let settings = &owned;
            let db = &settings.database;
            let store = store::connect_mapped(
                db.url.expose(),
                &db.table,
                &settings.table,
                db.max_connections,
                db.connect_timeout,
                store::WARM_CONNECTIONS,
            )
            .await?;
            if db.migrate {
                store.migrate().await?;
                super::admin::ensure_shedlock_table(settings, &store).await?;
            }
            let problems = store.check_table().await?;
            anyhow::Ok((store, problems))
        });
        let attempt = tokio::select! {
            r = attempt => r,
            _ = shutdown.cancelled() => return Ok(None),
        };
        match attempt {
            // A mapped table without the columns the relay needs is a configuration problem:
            // retrying will not fix it.
            Ok((_, problems)) if !problems.is_empty() => {
                let message = super::admin::table_problems(&db.table, &problems);
                tracing::error!(%message, "refusing to start");
                return Err(CliError::Usage(message));
            }
            Ok((store, _)) => {
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
