//! Where rows go. A [`Sink`] turns one row into one request and classifies the answer into an
//! [`Outcome`]; it never touches the database. Routing (`channel` -> sink), concurrency caps,
//! rate limits and pauses are the same for every kind and live in [`SinkHandle`].
//!
//! Guarantees:
//! - a payload a sink cannot send (malformed, oversized, wrong shape) is [`Outcome::Permanent`]
//!   with a readable reason, never a panic (G5);
//! - every request carries a key derived only from the row ([`Delivery::idempotency_key`]), the
//!   same on every attempt (G3);
//! - secrets are never put into an outcome's reason.

pub mod alimtalk;
pub mod fcm;
pub mod http;
mod limits;
mod log;
pub mod nats;
mod spec;
pub mod trace;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

pub(crate) use http::{
    ANSWER_BYTES, Reply, describe_send_error, http_client, http_client_for, read_capped,
    read_reply, snippet,
};
pub use limits::{MovingAverage, Pause, RateLimiter};
pub use spec::{SinkKind, SinkSpec};
use tokio::sync::Semaphore;
pub use trace::{Answer, TraceContext, answered, note_http_status, note_vendor_code};

use crate::BoxFuture;
use crate::config::{RetrySettings, Settings};

/// One row on its way to a sink: what a sink may read of it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: i64,
    pub channel: String,
    pub recipient: Option<String>,
    /// The payload as stored (JSON text).
    pub payload: String,
    /// Attempts already made before this one.
    pub attempts: u32,
    /// The W3C trace context this attempt's request carries (docs/tracing.md): the writer's,
    /// as claimed, until the relay replaces it with the attempt span's own; `None` when
    /// tracing is off or the row has none. Sinks whose receivers take it as headers send it.
    pub trace: Option<TraceContext>,
}

impl Delivery {
    /// The stable key receivers deduplicate on: the same for every attempt of this row.
    pub fn idempotency_key(&self) -> String {
        self.id.to_string()
    }
}

/// How one delivery attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The receiver accepted the request.
    Delivered,
    /// A transient failure: try again after backoff (or after `after`, from `Retry-After`).
    Retry {
        after: Option<Duration>,
        reason: String,
    },
    /// The receiver asks us to slow down: pause the whole sink for `pause`; the attempt does
    /// not count against the row.
    Throttle { pause: Duration, reason: String },
    /// This row can never be delivered: FAILED.
    Permanent { reason: String },
    /// The sink itself is misconfigured (credentials, permissions): pause it and alert; the
    /// row stays pending and the attempt does not count.
    ConfigError { reason: String },
}

impl Outcome {
    /// The label used in `deliveries_total{outcome}`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Retry { .. } => "retry",
            Outcome::Throttle { .. } => "throttle",
            Outcome::Permanent { .. } => "permanent",
            Outcome::ConfigError { .. } => "config_error",
        }
    }

    /// The reason given (empty for [`Outcome::Delivered`]).
    pub fn reason(&self) -> &str {
        match self {
            Outcome::Delivered => "",
            Outcome::Retry { reason, .. }
            | Outcome::Throttle { reason, .. }
            | Outcome::Permanent { reason }
            | Outcome::ConfigError { reason } => reason,
        }
    }
}

/// A destination for rows.
pub trait Sink: Send + Sync {
    /// Sends one row and classifies the answer. Must finish within the sink's `timeout`
    /// (the relay also enforces it) and must not panic on any payload.
    fn deliver<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Outcome>;
}

/// How long a sink pauses after a [`Outcome::ConfigError`] before trying again by itself.
pub const CONFIG_ERROR_PAUSE: Duration = Duration::from_secs(60);

/// A configured sink with what the relay needs around it: limits, pause state, retry policy.
pub struct SinkHandle {
    /// The sink's name (the `channel` value it serves).
    pub name: String,
    /// Its kind as configured (`webhook`, `nats`, ...; `custom` for a handle built around a
    /// sink of its own): what a traced attempt's span names.
    pub kind: &'static str,
    pub sink: Arc<dyn Sink>,
    /// Longest one delivery may take.
    pub timeout: Duration,
    /// The effective retry policy (global, with this sink's overrides).
    pub retry: RetrySettings,
    /// Most deliveries in flight to this sink.
    pub concurrency: u32,
    /// Caps deliveries in flight to this sink at `concurrency`.
    pub slots: Arc<Semaphore>,
    /// Spaces out delivery starts when `rate_per_sec` is set.
    pub rate: Option<RateLimiter>,
    /// Set by throttles and config errors; the relay does not send while it lasts.
    pub pause: Pause,
    /// Longest payload (bytes) this sink accepts; longer rows are FAILED unsent, and rows
    /// longer than every sink's limit are not even loaded by the claim.
    pub max_payload_bytes: usize,
    /// The setting behind `max_payload_bytes`, for reasons and logs.
    pub payload_limit_key: String,
    /// Rows claimed for this sink that wait for one of its `slots`: promised capacity, not
    /// offered to the next claim. The rows of a key's run behind its next row wait for that
    /// row, not for a slot, and count only once their turn comes (`relay::dispatch::Job`).
    pub queued: AtomicUsize,
    /// The last claim took this sink's whole budget: it probably has more rows due, so a
    /// freed slot should wake the relay loop instead of waiting for the next poll.
    pub hungry: AtomicBool,
    /// How long its sends take, on average: with the claim's own duration, it decides how
    /// many of its rows are claimed ahead (see `relay/budget.rs`).
    pub send_time: MovingAverage,
    /// Its delivery metrics, registered once.
    pub series: crate::metric::SinkSeries,
}

/// The payload limit of sinks without a setting of their own: FCM messages (4 KiB of data)
/// and Alimtalk templates (1,000 characters) are far smaller; the log sink is for tests.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 64 * 1024;

impl SinkHandle {
    /// A handle around `sink` with `concurrency` slots and the defaults of a configured sink
    /// (10 s timeout, no rate limit, [`DEFAULT_MAX_PAYLOAD_BYTES`]).
    pub fn new(name: &str, sink: Arc<dyn Sink>, concurrency: u32, retry: RetrySettings) -> Self {
        SinkHandle {
            name: name.to_string(),
            kind: "custom",
            sink,
            timeout: Duration::from_secs(10),
            retry,
            concurrency,
            slots: Arc::new(Semaphore::new(concurrency as usize)),
            rate: None,
            pause: Pause::new(name),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            payload_limit_key: format!("the payload limit of sink {name}"),
            queued: AtomicUsize::new(0),
            hungry: AtomicBool::new(false),
            send_time: MovingAverage::default(),
            series: crate::metric::SinkSeries::new(name),
        }
    }

    /// How long this sink takes rows sent one after another, as an ordering key's rows go:
    /// its mean send time, or the interval its rate limit leaves between two starts if that
    /// is longer (`None` before its first send). A rate-limited sink answers quickly but
    /// starts no sooner than its rate allows, and a key's rows claimed for its quick answers
    /// would wait past their claims.
    pub fn pace(&self) -> Option<Duration> {
        let send = self.send_time.get()?;
        let interval = self.rate.as_ref().and_then(|r| r.interval());
        Some(interval.map_or(send, |i| send.max(i)))
    }
}

/// All sinks by name.
pub struct SinkRegistry {
    sinks: BTreeMap<String, Arc<SinkHandle>>,
}

impl SinkRegistry {
    /// Builds every sink in the settings (HTTP clients are created once here, not per row).
    pub fn build(settings: &Settings) -> anyhow::Result<SinkRegistry> {
        let mut sinks = BTreeMap::new();
        for spec in SinkSpec::all(settings)? {
            let name = &spec.name;
            let sink: Arc<dyn Sink> = match &spec.kind {
                SinkKind::Log => Arc::new(log::LogSink::new(name)),
                SinkKind::Webhook(cfg) => {
                    Arc::new(webhook::WebhookSink::new(name, cfg, spec.common.timeout)?)
                }
                SinkKind::Fcm(cfg) => Arc::new(fcm::FcmSink::new(name, cfg, spec.common.timeout)?),
                SinkKind::Alimtalk(cfg) => {
                    Arc::new(alimtalk::AlimtalkSink::new(name, cfg, spec.common.timeout)?)
                }
                SinkKind::Nats(cfg) => Arc::new(nats::NatsSink::new(
                    name,
                    cfg,
                    spec.common.timeout,
                    &nats::Defaults::from_settings(settings),
                )),
            };
            let (max_payload_bytes, payload_limit_key) = match &spec.kind {
                SinkKind::Webhook(cfg) => {
                    (cfg.max_body_bytes, format!("sinks.{name}.max_body_bytes"))
                }
                SinkKind::Nats(cfg) => (
                    cfg.max_payload_bytes,
                    format!("sinks.{name}.max_payload_bytes"),
                ),
                _ => (
                    DEFAULT_MAX_PAYLOAD_BYTES,
                    format!("the payload limit of sink {name}"),
                ),
            };
            let mut handle = SinkHandle::new(
                name,
                sink,
                spec.common.concurrency,
                spec.common.retry_policy(&settings.retry),
            );
            handle.kind = spec.kind.name();
            handle.timeout = spec.common.timeout;
            handle.rate = spec.common.rate_per_sec.map(RateLimiter::new);
            handle.max_payload_bytes = max_payload_bytes;
            handle.payload_limit_key = payload_limit_key;
            sinks.insert(name.clone(), Arc::new(handle));
        }
        Ok(SinkRegistry { sinks })
    }

    /// A registry of ready-made handles (the relay's unit tests build theirs this way).
    pub fn from_handles(handles: impl IntoIterator<Item = SinkHandle>) -> SinkRegistry {
        SinkRegistry {
            sinks: handles
                .into_iter()
                .map(|h| (h.name.clone(), Arc::new(h)))
                .collect(),
        }
    }

    /// The sink serving `channel`, if one is configured.
    pub fn get(&self, channel: &str) -> Option<&Arc<SinkHandle>> {
        self.sinks.get(channel)
    }

    /// Every sink, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<SinkHandle>> {
        self.sinks.values()
    }

    /// The largest payload any sink accepts: longer payloads are not loaded by claims.
    pub fn max_payload_bytes(&self) -> usize {
        self.sinks
            .values()
            .map(|s| s.max_payload_bytes)
            .max()
            .unwrap_or(DEFAULT_MAX_PAYLOAD_BYTES)
    }
}

/// What `check-config` can check of the sinks beyond their keys: a `nats` sink's `stream`
/// exists (when NATS can be reached). A line for each check made, or the first configuration
/// error.
pub async fn check_remote(settings: &Settings) -> Result<Vec<String>, crate::config::ConfigError> {
    let mut lines = Vec::new();
    for spec in SinkSpec::all(settings)? {
        if let SinkKind::Nats(cfg) = &spec.kind {
            let defaults = nats::Defaults::from_settings(settings);
            let checked = nats::check_config(&spec.name, cfg, spec.common.timeout, &defaults);
            lines.extend(checked.await?);
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::Outcome;
    use crate::metric::OUTCOMES;

    /// Every outcome's label has a kept counter in `SinkSeries`.
    #[test]
    fn every_outcome_label_is_kept() {
        let outcomes = [
            Outcome::Delivered,
            Outcome::Retry {
                after: None,
                reason: String::new(),
            },
            Outcome::Throttle {
                pause: std::time::Duration::ZERO,
                reason: String::new(),
            },
            Outcome::Permanent {
                reason: String::new(),
            },
            Outcome::ConfigError {
                reason: String::new(),
            },
        ];
        for o in &outcomes {
            assert!(OUTCOMES.contains(&o.label()), "{}", o.label());
        }
        assert_eq!(outcomes.len(), OUTCOMES.len());
    }
}
