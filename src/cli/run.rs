//! `run`: wires the parts together and runs the relay until a signal.
//!
//! Start-up never crashes on an unreachable database: it logs, keeps `/readyz` false and
//! retries with backoff; `/healthz` answers from the first moment.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::config::Settings;
use crate::console;
use crate::housekeeping;
use crate::lease::Lease;
use crate::relay;
use crate::sink::SinkRegistry;
use crate::store::{self, SqlStore};
use crate::telemetry::{self, Health};

pub(super) async fn run(settings: Settings) -> Result<(), CliError> {
    telemetry::init_logging(&settings.log);
    let prom = telemetry::install_metrics()?;
    let shutdown = CancellationToken::new();
    crate::shutdown::on_signals(shutdown.clone());
    // Sinks first: a sink that cannot be built is a configuration problem, reported before
    // anything connects.
    let sinks = Arc::new(
        SinkRegistry::build(&settings).map_err(|e| CliError::Usage(format!("sinks: {e}")))?,
    );
    let http = Endpoints::serve(&settings, prom.clone()).await?;
    let Some(store) = connect(&settings, &shutdown).await? else {
        http.stop.cancel();
        return Ok(());
    };
    http.connected(&store);
    serve_console(&settings, &store, &sinks, prom, &http.stop).await?;

    let (relay, keeper) = relay::assemble(
        &settings,
        &store,
        sinks,
        http.health.clone(),
        shutdown.clone(),
    )
    .map_err(|e| CliError::Usage(e.to_string()))?;
    if let Some(k) = &keeper {
        let _ = http.lease.set(k.lease());
    }
    start_housekeeping(&settings, &store, &shutdown);
    relay.run_then_release(keeper).await;
    http.stop.cancel();
    Ok(())
}

/// `/metrics`, `/healthz` and `/readyz`, served from the first moment (when `http.listen` is
/// set): `/healthz` answers at once; `/readyz` is false until the database is connected, and
/// then pings it (and the lease backend, once there is one).
struct Endpoints {
    health: Arc<Health>,
    store: Arc<OnceCell<Arc<SqlStore>>>,
    lease: Arc<OnceCell<Arc<dyn Lease>>>,
    /// Stops the HTTP server and the console, after the relay has drained.
    stop: CancellationToken,
}

impl Endpoints {
    async fn serve(settings: &Settings, prom: PrometheusHandle) -> Result<Endpoints, CliError> {
        let http = Endpoints {
            health: Arc::new(Health::default()),
            store: Arc::new(OnceCell::new()),
            lease: Arc::new(OnceCell::new()),
            stop: CancellationToken::new(),
        };
        if !settings.http.listen.is_empty() {
            let addr = telemetry::serve(
                &settings.http.listen,
                prom,
                http.health.clone(),
                http.store.clone(),
                http.lease.clone(),
                http.stop.clone(),
            )
            .await?;
            tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
        }
        Ok(http)
    }

    /// The database is connected: `/readyz` checks it from now on.
    fn connected(&self, store: &Arc<SqlStore>) {
        let _ = self.store.set(store.clone());
        self.health.set_database(true);
    }
}

/// The console, if configured: it starts once the database is connected (every page reads
/// it) and stops with the HTTP server, after the relay has drained.
async fn serve_console(
    settings: &Settings,
    store: &Arc<SqlStore>,
    sinks: &Arc<SinkRegistry>,
    prom: PrometheusHandle,
    stop: &CancellationToken,
) -> Result<(), CliError> {
    if settings.console.is_some() {
        let addr = console::serve(
            settings,
            store.clone(),
            sinks.clone(),
            Some(prom),
            stop.clone(),
        )
        .await?;
        tracing::info!(%addr, "serving the console");
    }
    Ok(())
}

/// The table sample behind the gauges, and the retention of finished rows.
fn start_housekeeping(settings: &Settings, store: &Arc<SqlStore>, shutdown: &CancellationToken) {
    tokio::spawn(housekeeping::sample_loop(store.clone(), shutdown.clone()));
    tokio::spawn(housekeeping::retention_loop(
        store.clone(),
        settings.retention.clone(),
        settings.lease.name.clone(),
        settings.relay.instance_id.clone(),
        shutdown.clone(),
    ));
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
