//! `[sinks.NAME]` as far as the configuration knows it: the keys every sink kind shares
//! (kind, timeout, concurrency, rate, retry overrides), parsed and checked here, and the kind's
//! own keys, kept as a raw table for the sink module, which owns them (`sink::SinkSpec`).
//!
//! The split keeps dependencies one way (sinks read the configuration; the configuration does
//! not know the sink kinds) while both halves still refuse unknown keys: a typo such as
//! `urll` is reported as `sinks.hook.urll: unknown key` by whichever half owns the table.

use std::time::Duration;

use serde::Deserialize;

use super::number::{self, U32_MAX, int, int_opt};
use super::{ConfigError, RetrySettings, duration, multiplier};

/// Keys that every sink kind accepts.
const COMMON_KEYS: &[&str] = &[
    "kind",
    "timeout",
    "concurrency",
    "rate_per_sec",
    "initial_backoff",
    "max_backoff",
    "multiplier",
    "max_attempts",
];

/// One `[sinks.NAME]` table.
#[derive(Clone)]
pub struct SinkSettings {
    /// The table key, matched against each row's `channel`.
    pub name: String,
    /// The keys every kind shares.
    pub common: SinkCommon,
    /// The kind's own keys, not yet parsed (the sink module parses them).
    pub options: config::Value,
}

/// Settings every sink has.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkCommon {
    /// `webhook`, `fcm`, `alimtalk`, `nats` or `log`.
    pub kind: String,
    /// Longest a single delivery may take, connect to last byte.
    #[serde(
        default = "default_timeout",
        deserialize_with = "duration::deserialize"
    )]
    pub timeout: Duration,
    /// Most deliveries to this sink running at once.
    #[serde(
        default = "default_concurrency",
        deserialize_with = "int::<_, _, 1, U32_MAX>"
    )]
    pub concurrency: u32,
    /// Most deliveries started per second (token bucket); unlimited when absent.
    #[serde(default, deserialize_with = "rate")]
    pub rate_per_sec: Option<f64>,
    /// Overrides of the global `[retry]` section; absent keys inherit.
    #[serde(default, deserialize_with = "duration::deserialize_opt")]
    pub initial_backoff: Option<Duration>,
    #[serde(default, deserialize_with = "duration::deserialize_opt")]
    pub max_backoff: Option<Duration>,
    #[serde(default, deserialize_with = "multiplier_opt")]
    pub multiplier: Option<f64>,
    #[serde(default, deserialize_with = "int_opt::<_, _, 1, U32_MAX>")]
    pub max_attempts: Option<u32>,
}

/// `rate_per_sec`: from one start every 1,000 seconds to a million a second.
fn rate<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    number::float(d, 0.001, 1_000_000.0).map(Some)
}

fn multiplier_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    multiplier(d).map(Some)
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

/// A sink's `concurrency` when the config leaves it out: one sink sends at most this many at
/// once, and one to a few times as many more are claimed ahead for it while relay slots are
/// free (an eighth of `relay.max_in_flight`'s default). 128 rather than 64 since the relay
/// loop, its deliveries and its database work moved to threads of their own: against a
/// loopback receiver the receiver, the relay and the database each sat idle part of the time
/// while 64 requests went back and forth; with 128 sends at once (and 1,024 slots)
/// the release binary drained 1.11x the rows/s on PostgreSQL (three alternate pairs of 60,000
/// rows), 1.06x on MariaDB and 1.09x on SQLite (three pairs of 40,000 each), at the same CPU
/// per row (docs/design.md, "Sends at once"). A vendor's limit on requests a second is set
/// with `rate_per_sec`, a limit on requests at once with `concurrency`.
pub const DEFAULT_CONCURRENCY: u32 = 128;

fn default_concurrency() -> u32 {
    DEFAULT_CONCURRENCY
}

impl SinkCommon {
    /// The effective retry policy: this sink's overrides on top of the global one.
    pub fn retry_policy(&self, global: &RetrySettings) -> RetrySettings {
        RetrySettings {
            initial_backoff: self.initial_backoff.unwrap_or(global.initial_backoff),
            max_backoff: self.max_backoff.unwrap_or(global.max_backoff),
            multiplier: self.multiplier.unwrap_or(global.multiplier),
            max_attempts: self.max_attempts.unwrap_or(global.max_attempts),
        }
    }
}

/// Shows the kind's own keys by name only: their values are not parsed yet, so secrets
/// among them are not yet [`super::Secret`]s.
impl std::fmt::Debug for SinkSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<String> = self
            .options
            .clone()
            .into_table()
            .map(|t| t.into_keys().collect())
            .unwrap_or_default();
        f.debug_struct("SinkSettings")
            .field("name", &self.name)
            .field("common", &self.common)
            .field("option_keys", &keys)
            .finish()
    }
}

impl SinkSettings {
    /// The sink the built-in defaults carry, so `enqueue --channel log` works at once.
    pub fn default_log() -> SinkSettings {
        SinkSettings {
            name: "log".into(),
            common: SinkCommon {
                kind: "log".into(),
                timeout: default_timeout(),
                concurrency: default_concurrency(),
                rate_per_sec: None,
                initial_backoff: None,
                max_backoff: None,
                multiplier: None,
                max_attempts: None,
            },
            options: config::Value::from(config::Map::<String, config::Value>::new()),
        }
    }

    /// Splits and checks the table `[sinks.NAME]`.
    pub(super) fn parse(name: &str, value: config::Value) -> Result<SinkSettings, ConfigError> {
        let prefix = format!("sinks.{name}");
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        {
            return Err(ConfigError::new(
                prefix,
                "sink names use lowercase letters, digits, _ and - (they are matched against \
                 the channel column and set from OUTBOX_RELAY__SINKS__NAME__KEY)",
            ));
        }
        let table = value
            .into_table()
            .map_err(|_| ConfigError::new(&prefix, "must be a table"))?;
        let (common, own): (config::Map<_, _>, config::Map<_, _>) = table
            .into_iter()
            .partition(|(k, _)| COMMON_KEYS.contains(&k.as_str()));
        let common: SinkCommon = config::Value::from(common)
            .try_deserialize()
            .map_err(|e| ConfigError::within(&prefix, &e))?;
        if common.timeout.is_zero() {
            return Err(ConfigError::new(
                format!("{prefix}.timeout"),
                "must be above zero",
            ));
        }
        Ok(SinkSettings {
            name: name.to_string(),
            common,
            options: config::Value::from(own),
        })
    }

    /// `sinks.NAME`, the prefix of this sink's keys in errors.
    pub fn key(&self) -> String {
        format!("sinks.{}", self.name)
    }
}
