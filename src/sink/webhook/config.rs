//! `[sinks.NAME]` keys of `kind = "webhook"`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::{ConfigError, Secret, number};

/// A webhook sink's own settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Where rows are POSTed (`http://` or `https://`).
    pub url: String,
    /// Standard Webhooks signing secret (`whsec_<base64>`, or any other string used as raw
    /// key bytes). No signature header is sent without one.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// A file holding the secret (e.g. a mounted Kubernetes Secret); read at start.
    #[serde(default)]
    pub secret_file: Option<String>,
    /// Extra headers sent with every request (values may be credentials, so they are
    /// [`Secret`]s and never shown).
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Larger payloads are FAILED without being sent.
    #[serde(
        default = "default_max_body",
        deserialize_with = "number::int::<_, _, 1, { number::USIZE_MAX }>"
    )]
    pub max_body_bytes: usize,
}

fn default_max_body() -> usize {
    1024 * 1024
}

impl WebhookConfig {
    pub(crate) fn parse(prefix: &str, value: config::Value) -> Result<Self, ConfigError> {
        let mut cfg: WebhookConfig = value
            .try_deserialize()
            .map_err(|e| ConfigError::within(prefix, &e))?;
        let url = cfg.url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://"))
            || reqwest::Url::parse(url).is_err()
        {
            return Err(ConfigError::new(
                format!("{prefix}.url"),
                format!("\"{}\" is not an http:// or https:// URL", cfg.url),
            ));
        }
        if let Some(path) = cfg.secret_file.take() {
            if cfg.secret.is_some() {
                return Err(ConfigError::new(
                    format!("{prefix}.secret_file"),
                    "give either secret or secret_file, not both",
                ));
            }
            let text = std::fs::read_to_string(&path).map_err(|e| {
                ConfigError::new(
                    format!("{prefix}.secret_file"),
                    format!("cannot read {path}: {e}"),
                )
            })?;
            cfg.secret = Some(Secret::new(text.trim()));
        }
        if let Some(secret) = &cfg.secret {
            if secret.is_empty() {
                return Err(ConfigError::new(format!("{prefix}.secret"), "is empty"));
            }
            if super::request::signing_key(secret).is_none() {
                return Err(ConfigError::new(
                    format!("{prefix}.secret"),
                    "starts with whsec_ but the rest is not valid base64",
                ));
            }
        }
        crate::config::check_headers(&format!("{prefix}.headers"), &cfg.headers)?;
        Ok(cfg)
    }
}
