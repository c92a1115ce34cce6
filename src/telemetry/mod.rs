//! Logs, metrics, health and the spans of delivery attempts ([`Tracer`], docs/tracing.md).
//! Metric names are defined once, in [`crate::metric`].

mod http;
mod spans;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

pub use http::serve;
pub use spans::{Attempt, Tracer};

use crate::config::{LogFormat, LogSettings};
use crate::metric;

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
        .set_buckets_for_metric(Matcher::Full(metric::END_TO_END.into()), END_TO_END_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .install_recorder()?;
    describe();
    metrics::gauge!(metric::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(handle)
}

fn describe() {
    for (name, kind, help) in metric::ALL {
        match kind {
            metric::Kind::Counter => metrics::describe_counter!(*name, *help),
            metric::Kind::Gauge => metrics::describe_gauge!(*name, *help),
            metric::Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
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
