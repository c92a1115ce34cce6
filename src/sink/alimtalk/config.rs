//! `[sinks.NAME]` keys of `kind = "alimtalk"`: the vendor (`provider`), its credentials and
//! base URL, and what to do with a send whose outcome is unknown.
//!
//! Guarantees: each provider's keys are required for it and refused for the other (a
//! `secret_key` under `provider = "solapi"` is a typo, not something to ignore); secrets
//! (`secret_key`, `api_secret`) are [`Secret`]s, may come from `*_file` paths, and are never
//! quoted in an error; every error names its key.

use serde::Deserialize;

use crate::config::{ConfigError, Secret};

/// NHN Cloud's current host (changed on 2026-02-27; the old one was
/// `https://api-alimtalk.cloud.toast.com`).
pub const NHN_ENDPOINT: &str = "https://kakaotalk-bizmessage.api.nhncloudservice.com";
/// Solapi's API host.
pub const SOLAPI_ENDPOINT: &str = "https://api.solapi.com";

/// An Alimtalk sink's settings, validated.
#[derive(Debug, Clone)]
pub struct AlimtalkConfig {
    /// The vendor and its credentials.
    pub provider: Provider,
    /// The vendor's base URL, without a trailing slash.
    pub endpoint: String,
    /// What a send whose outcome is unknown (timed out after it was sent) becomes.
    pub on_unknown_outcome: UnknownOutcome,
    /// Put before the row id in vendor idempotency and grouping keys; set it when several
    /// outbox tables share one vendor account, so their row ids cannot collide.
    pub key_prefix: String,
}

/// Which vendor, with its keys.
#[derive(Debug, Clone)]
pub enum Provider {
    /// NHN Cloud KakaoTalk Bizmessage, AlimTalk API v2.3.
    Nhn(NhnKeys),
    /// Solapi Messages API v4.
    Solapi(SolapiKeys),
}

/// NHN Cloud credentials.
#[derive(Debug, Clone)]
pub struct NhnKeys {
    /// The service's app key (part of the URL path).
    pub app_key: String,
    /// Sent as `X-Secret-Key`.
    pub secret_key: Secret,
    /// The KakaoTalk sender profile key (`senderKey`, 40 characters).
    pub sender_key: String,
}

/// Solapi credentials and sender identity.
#[derive(Debug, Clone)]
pub struct SolapiKeys {
    /// The API key (`apiKey=` in the Authorization header).
    pub api_key: String,
    /// The HMAC key of the signature.
    pub api_secret: Secret,
    /// The KakaoTalk channel's profile id (`kakaoOptions.pfId`).
    pub pf_id: String,
    /// The registered sender number (`from`, used for the SMS fallback).
    pub from: String,
}

/// What to do when a request may or may not have been acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownOutcome {
    /// FAILED with reason "outcome unknown: ..." (never a duplicate paid message).
    Fail,
    /// Retry like any transient failure (NHN reuses the idempotency key; Solapi may duplicate).
    Retry,
}

/// The table as written; checked in [`AlimtalkConfig::parse`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlimtalk {
    /// `nhn` or `solapi`.
    provider: Option<String>,
    /// See [`AlimtalkConfig::endpoint`].
    endpoint: Option<String>,
    /// See [`AlimtalkConfig::on_unknown_outcome`].
    on_unknown_outcome: Option<UnknownOutcome>,
    /// See [`AlimtalkConfig::key_prefix`].
    key_prefix: Option<String>,
    /// NHN: see [`NhnKeys::app_key`].
    app_key: Option<String>,
    /// NHN: see [`NhnKeys::secret_key`].
    secret_key: Option<Secret>,
    /// NHN: a file holding the secret key (instead of `secret_key`).
    secret_key_file: Option<String>,
    /// NHN: see [`NhnKeys::sender_key`].
    sender_key: Option<String>,
    /// Solapi: see [`SolapiKeys::api_key`].
    api_key: Option<String>,
    /// Solapi: see [`SolapiKeys::api_secret`].
    api_secret: Option<Secret>,
    /// Solapi: a file holding the API secret (instead of `api_secret`).
    api_secret_file: Option<String>,
    /// Solapi: see [`SolapiKeys::pf_id`].
    pf_id: Option<String>,
    /// Solapi: see [`SolapiKeys::from`].
    from: Option<String>,
}

impl AlimtalkConfig {
    pub(crate) fn parse(prefix: &str, value: config::Value) -> Result<Self, ConfigError> {
        let mut raw: RawAlimtalk = value
            .try_deserialize()
            .map_err(|e| ConfigError::within(prefix, &e))?;
        let section = Section(prefix);
        let (endpoint, key_prefix) = (raw.endpoint.take(), raw.key_prefix.take());
        let on_unknown_outcome = raw.on_unknown_outcome.unwrap_or(UnknownOutcome::Fail);
        let (provider, default_endpoint) = match raw.provider.take().as_deref() {
            Some("nhn") => (Provider::Nhn(raw.nhn(&section)?), NHN_ENDPOINT),
            Some("solapi") => (Provider::Solapi(raw.solapi(&section)?), SOLAPI_ENDPOINT),
            Some(other) => {
                return Err(ConfigError::new(
                    section.key("provider"),
                    format!("unknown provider \"{other}\"; expected nhn or solapi"),
                ));
            }
            None => {
                return Err(ConfigError::new(
                    section.key("provider"),
                    "is required: nhn or solapi",
                ));
            }
        };
        Ok(AlimtalkConfig {
            provider,
            endpoint: section.endpoint(endpoint, default_endpoint)?,
            on_unknown_outcome,
            key_prefix: section.key_prefix(key_prefix)?,
        })
    }
}

impl RawAlimtalk {
    /// `provider = "nhn"`: `app_key`, `secret_key` (or its file), `sender_key`; Solapi's keys
    /// refused.
    fn nhn(self, section: &Section) -> Result<NhnKeys, ConfigError> {
        section.refuse(
            &[
                ("api_key", self.api_key.is_some()),
                ("api_secret", self.api_secret.is_some()),
                ("api_secret_file", self.api_secret_file.is_some()),
                ("pf_id", self.pf_id.is_some()),
                ("from", self.from.is_some()),
            ],
            "nhn",
        )?;
        let app_key = section.required("app_key", self.app_key)?;
        if !app_key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::new(
                section.key("app_key"),
                "must be letters, digits, - and _ (it goes into the URL path)",
            ));
        }
        let secret_key = secret(
            section.0,
            "secret_key",
            self.secret_key,
            self.secret_key_file,
        )?;
        let sender_key = section.required("sender_key", self.sender_key)?;
        Ok(NhnKeys {
            app_key,
            secret_key,
            sender_key,
        })
    }

    /// `provider = "solapi"`: `api_key`, `api_secret` (or its file), `pf_id`, `from` (a phone
    /// number); NHN's keys refused.
    fn solapi(self, section: &Section) -> Result<SolapiKeys, ConfigError> {
        section.refuse(
            &[
                ("app_key", self.app_key.is_some()),
                ("secret_key", self.secret_key.is_some()),
                ("secret_key_file", self.secret_key_file.is_some()),
                ("sender_key", self.sender_key.is_some()),
            ],
            "solapi",
        )?;
        let api_key = section.required("api_key", self.api_key)?;
        if !api_key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::new(
                section.key("api_key"),
                "must be letters, digits, - and _",
            ));
        }
        let api_secret = secret(
            section.0,
            "api_secret",
            self.api_secret,
            self.api_secret_file,
        )?;
        let pf_id = section.required("pf_id", self.pf_id)?;
        let from: String = section
            .required("from", self.from)?
            .chars()
            .filter(|c| !matches!(c, '-' | ' '))
            .collect();
        if from.is_empty() || !from.chars().all(|c| c.is_ascii_digit()) {
            return Err(ConfigError::new(
                section.key("from"),
                "must be a phone number (digits, - and spaces)",
            ));
        }
        Ok(SolapiKeys {
            api_key,
            api_secret,
            pf_id,
            from,
        })
    }
}

/// The sink's section (`sinks.NAME`), for checking its keys and naming them in errors.
struct Section<'a>(&'a str);

impl Section<'_> {
    /// The full name of key `k`.
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.0)
    }

    /// Key `k`'s value, trimmed: it must be set and not empty.
    fn required(&self, k: &str, v: Option<String>) -> Result<String, ConfigError> {
        match v.map(|s| s.trim().to_string()) {
            Some(s) if !s.is_empty() => Ok(s),
            _ => Err(ConfigError::new(
                self.key(k),
                "is required for this provider",
            )),
        }
    }

    /// Refuses the first of the keys that is `present`: it belongs to another provider.
    fn refuse(&self, present: &[(&str, bool)], provider: &str) -> Result<(), ConfigError> {
        match present.iter().find(|(_, p)| *p) {
            Some((k, _)) => Err(ConfigError::new(
                self.key(k),
                format!("is not a key of provider \"{provider}\""),
            )),
            None => Ok(()),
        }
    }

    /// `endpoint` (the provider's own when unset): an http:// or https:// URL, without a
    /// trailing slash.
    fn endpoint(&self, endpoint: Option<String>, default: &str) -> Result<String, ConfigError> {
        let endpoint = endpoint.unwrap_or_else(|| default.to_string());
        let endpoint = endpoint.trim().trim_end_matches('/').to_string();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
            || reqwest::Url::parse(&endpoint).is_err()
        {
            return Err(ConfigError::new(
                self.key("endpoint"),
                format!("\"{endpoint}\" is not an http:// or https:// URL"),
            ));
        }
        Ok(endpoint)
    }

    /// `key_prefix` (empty when unset): at most 40 characters of a small set.
    fn key_prefix(&self, key_prefix: Option<String>) -> Result<String, ConfigError> {
        let key_prefix = key_prefix.unwrap_or_default();
        if key_prefix.len() > 40
            || !key_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        {
            return Err(ConfigError::new(
                self.key("key_prefix"),
                "must be at most 40 letters, digits, -, _, . or :",
            ));
        }
        Ok(key_prefix)
    }
}

/// A secret given inline or as a file (one of the two), trimmed and non-empty.
fn secret(
    prefix: &str,
    name: &str,
    inline: Option<Secret>,
    file: Option<String>,
) -> Result<Secret, ConfigError> {
    let value = match (inline, file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                format!("{prefix}.{name}_file"),
                format!("give either {name} or {name}_file, not both"),
            ));
        }
        (Some(s), None) => Secret::new(s.expose().trim()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                ConfigError::new(
                    format!("{prefix}.{name}_file"),
                    format!("cannot read {path}: {e}"),
                )
            })?;
            Secret::new(text.trim())
        }
        (None, None) => {
            return Err(ConfigError::new(
                format!("{prefix}.{name}"),
                format!("is required for this provider (or {name}_file)"),
            ));
        }
    };
    if value.is_empty() {
        return Err(ConfigError::new(format!("{prefix}.{name}"), "is empty"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<AlimtalkConfig, ConfigError> {
        let map: config::Map<String, config::Value> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), config::Value::from(*v)))
            .collect();
        AlimtalkConfig::parse("sinks.kakao", config::Value::from(map))
    }

    #[test]
    fn nhn_keys() {
        let c = parse(&[
            ("provider", "nhn"),
            ("app_key", "APP"),
            ("secret_key", " s3cret "),
            ("sender_key", "SK"),
        ])
        .unwrap();
        assert_eq!(c.endpoint, NHN_ENDPOINT);
        assert_eq!(c.on_unknown_outcome, UnknownOutcome::Fail);
        match &c.provider {
            Provider::Nhn(k) => assert_eq!(k.secret_key.expose(), "s3cret"),
            p => panic!("{p:?}"),
        }
        assert!(!format!("{c:?}").contains("s3cret"));
        let e = parse(&[
            ("provider", "nhn"),
            ("app_key", "APP"),
            ("sender_key", "SK"),
        ])
        .unwrap_err();
        assert_eq!(e.key, "sinks.kakao.secret_key");
        let e = parse(&[
            ("provider", "nhn"),
            ("app_key", "APP"),
            ("secret_key", "s"),
            ("sender_key", "SK"),
            ("pf_id", "x"),
        ])
        .unwrap_err();
        assert_eq!(e.key, "sinks.kakao.pf_id");
    }

    #[test]
    fn solapi_keys_and_common_errors() {
        let c = parse(&[
            ("provider", "solapi"),
            ("api_key", "K"),
            ("api_secret", "S"),
            ("pf_id", "PF"),
            ("from", "02-1234-5678"),
            ("endpoint", "http://127.0.0.1:9/"),
            ("on_unknown_outcome", "retry"),
        ])
        .unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert_eq!(c.on_unknown_outcome, UnknownOutcome::Retry);
        match &c.provider {
            Provider::Solapi(k) => assert_eq!(k.from, "0212345678"),
            p => panic!("{p:?}"),
        }
        assert_eq!(parse(&[]).unwrap_err().key, "sinks.kakao.provider");
        assert_eq!(
            parse(&[("provider", "kakao")]).unwrap_err().key,
            "sinks.kakao.provider"
        );
        assert_eq!(
            parse(&[("provider", "solapi"), ("secret_key", "x")])
                .unwrap_err()
                .key,
            "sinks.kakao.secret_key"
        );
        assert_eq!(
            parse(&[("provider", "nhn"), ("on_unknown_outcome", "maybe")])
                .unwrap_err()
                .key,
            "sinks.kakao.on_unknown_outcome"
        );
        assert_eq!(
            parse(&[("provider", "nhn"), ("appkey", "x")])
                .unwrap_err()
                .key,
            "sinks.kakao.appkey"
        );
    }
}
