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
mod http;
mod limits;
mod log;
mod spec;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

pub(crate) use http::{describe_send_error, http_client, read_capped, retry_after_header, snippet};
pub use limits::{Pause, RateLimiter};
pub use spec::{SinkCommon, SinkKind, SinkSpec};
use tokio::sync::Semaphore;

use crate::BoxFuture;
use crate::config::{RetrySettings, Settings};
use crate::store::Budgets;

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
    pub sink: Arc<dyn Sink>,
    /// Longest one delivery may take.
    pub timeout: Duration,
    /// The effective retry policy (global, with this sink's overrides).
    pub retry: RetrySettings,
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
    /// Rows claimed for this sink that do not hold one of its `slots` yet: promised
    /// capacity, not offered to the next claim.
    pub queued: AtomicUsize,
    /// The last claim took this sink's whole budget: it probably has more rows due, so a
    /// freed slot should wake the relay loop instead of waiting for the next poll.
    pub hungry: AtomicBool,
}

/// Most rows of channels no sink serves taken by one claim.
pub const OTHERS_PER_CLAIM: u32 = 32;

/// The payload limit of sinks without a setting of their own: FCM messages (4 KiB of data)
/// and Alimtalk templates (1,000 characters) are far smaller; the log sink is for tests.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// All sinks by name.
pub struct SinkRegistry {
    sinks: BTreeMap<String, Arc<SinkHandle>>,
}

impl SinkRegistry {
    /// Builds every sink in the settings (HTTP clients are created once here, not per row).
    pub fn build(settings: &Settings) -> anyhow::Result<SinkRegistry> {
        let mut sinks = BTreeMap::new();
        for (name, spec) in &settings.sinks {
            let sink: Arc<dyn Sink> = match &spec.kind {
                SinkKind::Log => Arc::new(log::LogSink::new(name)),
                SinkKind::Webhook(cfg) => {
                    Arc::new(webhook::WebhookSink::new(name, cfg, spec.common.timeout)?)
                }
                SinkKind::Fcm(cfg) => Arc::new(fcm::FcmSink::new(name, cfg, spec.common.timeout)?),
                SinkKind::Alimtalk(cfg) => {
                    Arc::new(alimtalk::AlimtalkSink::new(name, cfg, spec.common.timeout)?)
                }
            };
            let (max_payload_bytes, payload_limit_key) = match &spec.kind {
                SinkKind::Webhook(cfg) => {
                    (cfg.max_body_bytes, format!("sinks.{name}.max_body_bytes"))
                }
                _ => (
                    DEFAULT_MAX_PAYLOAD_BYTES,
                    format!("the payload limit of sink {name}"),
                ),
            };
            let handle = SinkHandle {
                name: name.clone(),
                sink,
                timeout: spec.common.timeout,
                retry: spec.common.retry_policy(&settings.retry),
                slots: Arc::new(Semaphore::new(spec.common.concurrency as usize)),
                rate: spec.common.rate_per_sec.map(RateLimiter::new),
                pause: Pause::new(name),
                max_payload_bytes,
                payload_limit_key,
                queued: AtomicUsize::new(0),
                hungry: AtomicBool::new(false),
            };
            sinks.insert(name.clone(), Arc::new(handle));
        }
        Ok(SinkRegistry { sinks })
    }

    /// The sink serving `channel`, if one is configured.
    pub fn get(&self, channel: &str) -> Option<&Arc<SinkHandle>> {
        self.sinks.get(channel)
    }

    /// Every sink, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<SinkHandle>> {
        self.sinks.values()
    }

    /// Per-channel budgets for a claim of at most `free` rows. Each sink asks for what it
    /// can start now: its free concurrency slots not already promised to claimed rows, and
    /// what its rate allows within `horizon`; a paused sink asks for nothing. When the asks
    /// add up to more than `free`, they are shared out evenly (the smallest asks are met in
    /// full, the rest split what is left), so a sink with a deep backlog cannot take the
    /// slots the others need. With `others`, a quarter of `free` (at most
    /// [`OTHERS_PER_CLAIM`]) goes to rows of channels no sink serves, which are finished FAILED.
    pub fn budgets(&self, free: u32, horizon: Duration, others: bool) -> Budgets {
        let mut asks: Vec<(&str, u32)> = self
            .sinks
            .values()
            .filter(|s| s.pause.remaining().is_none())
            .map(|s| {
                let slots = s
                    .slots
                    .available_permits()
                    .saturating_sub(s.queued.load(Ordering::Relaxed));
                let rate = s
                    .rate
                    .as_ref()
                    .map_or(usize::MAX, |r| r.starts_within(horizon));
                (s.name.as_str(), slots.min(rate).min(free as usize) as u32)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        asks.sort_by_key(|(name, n)| (*n, *name));
        // Channels no sink serves get a small share first, or a busy sink would starve them.
        let for_others = if others {
            (free / 4).clamp(u32::from(free > 0), OTHERS_PER_CLAIM)
        } else {
            0
        };
        let mut left = free - for_others;
        let mut channels = Vec::with_capacity(asks.len());
        let count = asks.len() as u32;
        for (i, (name, ask)) in asks.into_iter().enumerate() {
            let share = (left / (count - i as u32)).max(u32::from(left > 0));
            let n = ask.min(share);
            left -= n;
            if n > 0 {
                channels.push((name.to_string(), n));
            }
        }
        let others = (for_others > 0).then(|| (self.sinks.keys().cloned().collect(), for_others));
        Budgets { channels, others }
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
