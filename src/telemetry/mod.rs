//! Logs, metrics and health. Metric names are public interface (the README's Metrics section): dashboards
//! and alerts depend on them, so they are defined here once.

mod http;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

pub use http::serve;

use crate::config::{LogFormat, LogSettings};

/// Starts logging to stderr. `RUST_LOG` overrides `log.level`.
pub fn init_logging(log: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match log.format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    // Already initialised (tests): keep the first subscriber.
    let _ = result;
}

/// Histogram buckets for latencies, in seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets for end-to-end latency (created to delivered), which includes retries.
const END_TO_END_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Installs the global metrics recorder and describes every metric.
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("outbox_relay_end_to_end_seconds".into()),
            END_TO_END_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .install_recorder()?;
    describe();
    metrics::gauge!("outbox_relay_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "outbox_relay_deliveries_total",
        "Delivery attempts by sink and outcome."
    );
    describe_histogram!(
        "outbox_relay_delivery_duration_seconds",
        "Time one delivery attempt took."
    );
    describe_histogram!(
        "outbox_relay_end_to_end_seconds",
        "From the row's created_at to its delivery."
    );
    describe_counter!("outbox_relay_claimed_total", "Rows claimed.");
    describe_counter!(
        "outbox_relay_rows_undeliverable_total",
        "Claimed rows finished FAILED because a column could not be read or the payload was over every sink's limit."
    );
    describe_counter!(
        "outbox_relay_result_write_errors_total",
        "Failed result writes by kind: transient (retried), refused (the batch is split to isolate the row), dropped (even the generic result was refused)."
    );
    describe_histogram!(
        "outbox_relay_claim_duration_seconds",
        "Time one claim statement took."
    );
    describe_gauge!("outbox_relay_in_flight", "Deliveries being sent right now.");
    describe_gauge!(
        "outbox_relay_lease_held",
        "1 while this instance holds the lease."
    );
    describe_gauge!(
        "outbox_relay_lease_epoch",
        "The fencing epoch of the lease last acquired."
    );
    describe_counter!(
        "outbox_relay_lease_acquisitions_total",
        "Times this instance acquired the lease."
    );
    describe_counter!(
        "outbox_relay_lease_renewals_total",
        "Lease renewals by result."
    );
    describe_counter!(
        "outbox_relay_lease_lost_total",
        "Times a held lease was lost."
    );
    describe_gauge!(
        "outbox_relay_sink_paused",
        "1 while a sink is paused (throttle or config error)."
    );
    describe_gauge!("outbox_relay_build_info", "Build information.");
    describe_gauge!(
        "outbox_relay_rows",
        "Rows in the outbox table by status (sampled)."
    );
    describe_gauge!(
        "outbox_relay_oldest_pending_seconds",
        "Age of the oldest PENDING or RETRY row (sampled)."
    );
    describe_gauge!(
        "outbox_relay_ordering_blocked_keys",
        "Ordering keys with rows held back behind an unfinished earlier row (sampled)."
    );
}

/// What `/readyz` reports, shared by the parts that know.
#[derive(Debug, Default)]
pub struct Health {
    /// The last database round trip succeeded.
    database: AtomicBool,
    /// Shutdown has begun.
    draining: AtomicBool,
}

impl Health {
    pub fn set_database(&self, ok: bool) {
        self.database.store(ok, Ordering::Relaxed);
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn database_ok(&self) -> bool {
        self.database.load(Ordering::Relaxed)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
