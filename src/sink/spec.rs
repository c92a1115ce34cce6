//! A sink's kind-specific settings: the configuration parses the keys every sink shares
//! ([`SinkCommon`]) and hands over the rest of `[sinks.NAME]` raw; each kind parses its own
//! keys here, refusing unknown ones, with errors that name the key (`sinks.hook.urll`).

use serde::Deserialize;

use super::alimtalk::AlimtalkConfig;
use super::fcm::FcmConfig;
use super::nats::NatsConfig;
use super::webhook::WebhookConfig;
use crate::config::{ConfigError, Settings, SinkCommon, SinkSettings};

/// One configured sink: its name, the shared settings and the kind-specific ones.
#[derive(Debug, Clone)]
pub struct SinkSpec {
    /// The table key, matched against each row's `channel`.
    pub name: String,
    pub common: SinkCommon,
    pub kind: SinkKind,
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
    /// NATS JetStream.
    Nats(NatsConfig),
}

impl SinkKind {
    /// The kind's name as configured (`kind = "..."`).
    pub fn name(&self) -> &'static str {
        match self {
            SinkKind::Log => "log",
            SinkKind::Webhook(_) => "webhook",
            SinkKind::Fcm(_) => "fcm",
            SinkKind::Alimtalk(_) => "alimtalk",
            SinkKind::Nats(_) => "nats",
        }
    }
}

impl SinkSpec {
    /// Parses a sink's own keys, by its kind.
    pub fn parse(sink: &SinkSettings) -> Result<SinkSpec, ConfigError> {
        let prefix = sink.key();
        let own = sink.options.clone();
        let kind = match sink.common.kind.as_str() {
            "log" => {
                let _: NoKeys = own
                    .try_deserialize()
                    .map_err(|e| ConfigError::within(&prefix, &e))?;
                SinkKind::Log
            }
            "webhook" => SinkKind::Webhook(WebhookConfig::parse(&prefix, own)?),
            "fcm" => SinkKind::Fcm(FcmConfig::parse(&prefix, own)?),
            "alimtalk" => SinkKind::Alimtalk(AlimtalkConfig::parse(&prefix, own)?),
            "nats" => SinkKind::Nats(NatsConfig::parse(&prefix, own)?),
            other => {
                return Err(ConfigError::new(
                    format!("{prefix}.kind"),
                    format!(
                        "unknown sink kind \"{other}\"; expected webhook, fcm, alimtalk, nats or log"
                    ),
                ));
            }
        };
        Ok(SinkSpec {
            name: sink.name.clone(),
            common: sink.common.clone(),
            kind,
        })
    }

    /// Every sink of `settings`, parsed (the first error wins, as the configuration's do).
    pub fn all(settings: &Settings) -> Result<Vec<SinkSpec>, ConfigError> {
        settings.sinks.values().map(SinkSpec::parse).collect()
    }
}

/// A kind without keys of its own.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoKeys {}
