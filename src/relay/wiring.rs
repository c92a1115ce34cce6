//! The relay as `outbox-relay run` and the benchmark both assemble it, written once so that
//! they cannot drift apart: the arrival watcher, the lease (`lease::build`), the tracer
//! (`[tracing]`), and the lease's release and the last spans' export after the drain.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Relay;
use crate::config::Settings;
use crate::lease::{self, Keeper};
use crate::sink::SinkRegistry;
use crate::store::{self, Arrivals, Dialect, SqlStore};
use crate::telemetry::{Health, Tracer};

/// The relay over `store` as `settings` configure it, not yet running, and the keeper of its
/// lease (see [`Relay::run_then_release`]): its arrival watcher is started and its lease
/// built and kept. Claims and result writes run on the database thread (see
/// `store::OnDbThread`). An error is a lease or tracing configuration problem
/// (`lease::build`, `Tracer::start`).
pub fn assemble(
    settings: &Settings,
    store: &Arc<SqlStore>,
    sinks: Arc<SinkRegistry>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> anyhow::Result<(Relay, Option<Keeper>)> {
    let wake = Arc::new(Notify::new());
    let arrivals = watch_arrivals(settings, store, wake.clone(), &shutdown);
    let keeper = lease::build(settings, store)?;
    let tracer = Tracer::start(&settings.tracing)?;
    let relay = Relay {
        store: Arc::new(store::OnDbThread(store.clone())),
        sinks,
        settings: settings.relay.clone(),
        lease: keeper.as_ref().map(Keeper::watch),
        wake,
        arrivals,
        health,
        shutdown,
        tracer,
    };
    Ok((relay, keeper))
}

/// Starts the task that tells the loop rows may have arrived, until `shutdown`, and returns
/// the arrivals it signals (each waking `wake`): PostgreSQL's LISTEN/NOTIFY when
/// `database.listen` is on and the table has the NOTIFY trigger (a mapped table has it only
/// if `table.notify_trigger` installed it); otherwise the newest-id check, a cheap read every
/// `store::NEW_ROWS_CHECK`.
pub fn watch_arrivals(
    settings: &Settings,
    store: &Arc<SqlStore>,
    wake: Arc<Notify>,
    shutdown: &CancellationToken,
) -> Arc<Arrivals> {
    let arrivals = Arrivals::new(wake);
    if store.dialect() == Dialect::Postgres && settings.database.listen && store.columns().notify {
        tokio::spawn(store::listen(
            settings.database.url.expose().to_string(),
            settings.database.table.clone(),
            arrivals.clone(),
            shutdown.clone(),
        ));
    } else {
        tokio::spawn(store::watch_new_rows(
            store.clone(),
            arrivals.clone(),
            shutdown.clone(),
        ));
    }
    arrivals
}

impl Relay {
    /// Runs the loop (see [`Relay::run`]), then releases `keeper`'s lease within the tenth of
    /// `shutdown_timeout` the drain leaves for it (see [`super::shutdown_budget`]): a lease
    /// backend that does not answer must not keep the process past shutdown_timeout (the
    /// lease then simply expires after its ttl). The spans still queued are exported in the
    /// same tenth, beside the release (a collector that does not answer loses them).
    pub async fn run_then_release(self, keeper: Option<Keeper>) {
        let release_budget = self.settings.shutdown_timeout / 10;
        let tracer = self.tracer.clone();
        self.run().await;
        let release = async {
            if let Some(k) = keeper
                && tokio::time::timeout(release_budget, k.release())
                    .await
                    .is_err()
            {
                tracing::warn!("releasing the lease timed out; it will expire after its ttl");
            }
        };
        let flush = async {
            if let Some(t) = &tracer {
                t.shutdown(release_budget).await;
            }
        };
        tokio::join!(release, flush);
    }
}
