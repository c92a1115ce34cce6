//! Parsing `[sinks.NAME]` tables: the keys every kind shares, then the kind's own keys.
//!
//! Each table is split in two so both halves can refuse unknown keys: a typo such as `urll`
//! is reported as `sinks.hook.urll: unknown key` instead of being ignored.

use std::time::Duration;

use serde::Deserialize;

use super::alimtalk::AlimtalkConfig;
use super::fcm::FcmConfig;
use super::webhook::WebhookConfig;
use crate::config::{ConfigError, RetrySettings, duration};

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

/// One configured sink: its name, the shared settings and the kind-specific ones.
#[derive(Debug, Clone)]
pub struct SinkSpec {
    /// The table key, matched against each row's `channel`.
    pub name: String,
    pub common: SinkCommon,
    pub kind: SinkKind,
}

/// Settings every sink has.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkCommon {
    /// `webhook`, `fcm`, `alimtalk` or `log`.
    pub kind: String,
    /// Longest a single delivery may take, connect to last byte.
    #[serde(
        default = "default_timeout",
        deserialize_with = "duration::deserialize"
    )]
    pub timeout: Duration,
    /// Most deliveries to this sink running at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: u32,
    /// Most deliveries started per second (token bucket); unlimited when absent.
    #[serde(default)]
    pub rate_per_sec: Option<f64>,
    /// Overrides of the global `[retry]` section; absent keys inherit.
    #[serde(default, deserialize_with = "duration::deserialize_opt")]
    pub initial_backoff: Option<Duration>,
    #[serde(default, deserialize_with = "duration::deserialize_opt")]
    pub max_backoff: Option<Duration>,
    #[serde(default)]
    pub multiplier: Option<f64>,
    #[serde(default)]
    pub max_attempts: Option<u32>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

/// The same as `relay.max_in_flight`'s default, so that one sink alone can use every slot.
fn default_concurrency() -> u32 {
    64
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

/// The kind-specific part of a sink.
#[derive(Debug, Clone)]
pub enum SinkKind {
    /// Logs each delivery and succeeds.
    Log,
    /// POSTs to an HTTP endpoint with Standard Webhooks headers.
    Webhook(WebhookConfig),
    /// Firebase Cloud Messaging HTTP v1.
    Fcm(FcmConfig),
    /// Kakao Alimtalk through a vendor (NHN Cloud or Solapi).
    Alimtalk(AlimtalkConfig),
}

impl SinkSpec {
    /// The sink the built-in defaults carry, so `enqueue --channel log` works at once.
    pub fn default_log() -> SinkSpec {
        SinkSpec {
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
            kind: SinkKind::Log,
        }
    }

    /// Parses the table `[sinks.NAME]`.
    pub fn parse(name: &str, value: config::Value) -> Result<SinkSpec, ConfigError> {
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
            .map_err(|e| keyed(&prefix, &e))?;
        if common.concurrency == 0 {
            return Err(ConfigError::new(
                format!("{prefix}.concurrency"),
                "must be at least 1",
            ));
        }
        if common.timeout.is_zero() {
            return Err(ConfigError::new(
                format!("{prefix}.timeout"),
                "must be above zero",
            ));
        }
        if let Some(rate) = common.rate_per_sec
            && !(0.001..=1_000_000.0).contains(&rate)
        {
            return Err(ConfigError::new(
                format!("{prefix}.rate_per_sec"),
                "must be a number from 0.001 to 1000000",
            ));
        }
        let own = config::Value::from(own);
        let kind = match common.kind.as_str() {
            "log" => {
                let _: NoKeys = own.try_deserialize().map_err(|e| keyed(&prefix, &e))?;
                SinkKind::Log
            }
            "webhook" => SinkKind::Webhook(WebhookConfig::parse(&prefix, own)?),
            "fcm" => SinkKind::Fcm(FcmConfig::parse(&prefix, own)?),
            "alimtalk" => SinkKind::Alimtalk(AlimtalkConfig::parse(&prefix, own)?),
            other => {
                return Err(ConfigError::new(
                    format!("{prefix}.kind"),
                    format!(
                        "unknown sink kind \"{other}\"; expected webhook, fcm, alimtalk or log"
                    ),
                ));
            }
        };
        Ok(SinkSpec {
            name: name.to_string(),
            common,
            kind,
        })
    }
}

/// A kind without keys of its own.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoKeys {}

/// Prefixes a deserialization error of a sink table with the table's key.
pub(crate) fn keyed(prefix: &str, e: &config::ConfigError) -> ConfigError {
    let text = e.to_string();
    if let Some(k) = crate::config::unknown_field_key(&text) {
        return ConfigError::new(format!("{prefix}.{}", k.key), k.problem);
    }
    if let Some(start) = text.find("for key `") {
        let rest = &text[start + 9..];
        if let Some(end) = rest.find('`') {
            return ConfigError::new(
                format!("{prefix}.{}", &rest[..end]),
                text[..start].trim_end(),
            );
        }
    }
    ConfigError::new(prefix, text)
}
