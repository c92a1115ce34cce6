//! `[sinks.NAME]` keys of `kind = "fcm"` and the service-account key they point at.
//!
//! Guarantees: the key is read and checked once, at start (a missing file, malformed JSON or a
//! private key that is not an RSA PEM key is a [`ConfigError`] naming the key); no error
//! message quotes the key's content (serde's messages can echo values, so only the position
//! of a JSON error is reported); the private key is a [`Secret`] and never shown by `Debug`.

use serde::Deserialize;

use crate::config::{ConfigError, Secret, number};

/// FCM's production host.
pub const DEFAULT_ENDPOINT: &str = "https://fcm.googleapis.com";
/// Google's token endpoint, used when the key file has no `token_uri`.
pub const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

/// An FCM sink's settings, validated.
#[derive(Debug, Clone)]
pub struct FcmConfig {
    /// The Firebase project messages are sent through (`projects/{project_id}`); defaults to
    /// the key's own `project_id`.
    pub project_id: String,
    /// The service-account key that mints access tokens.
    pub credentials: ServiceAccountKey,
    /// Base URL of the FCM API, without a trailing slash (tests point it at loopback).
    pub endpoint: String,
    /// Sends `validate_only: true`: FCM checks each message but delivers none (dry runs).
    pub validate_only: bool,
}

/// The fields of a Google service-account key file that the OAuth2 flow uses.
#[derive(Clone, Deserialize)]
pub struct ServiceAccountKey {
    /// `service_account` in real key files; checked when present.
    #[serde(default, rename = "type")]
    pub key_type: Option<String>,
    /// The account's address: the JWT's `iss`.
    pub client_email: String,
    /// The RSA private key, PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`).
    pub private_key: Secret,
    /// Sent as the JWT header's `kid` when present.
    #[serde(default)]
    pub private_key_id: Option<String>,
    /// Where the signed JWT is exchanged for an access token (and the JWT's `aud`).
    #[serde(default = "default_token_uri")]
    pub token_uri: String,
    /// The project the key belongs to; the default for the sink's `project_id`.
    #[serde(default)]
    pub project_id: Option<String>,
}

impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("private_key", &self.private_key)
            .field("token_uri", &self.token_uri)
            .field("project_id", &self.project_id)
            .finish_non_exhaustive()
    }
}

fn default_token_uri() -> String {
    DEFAULT_TOKEN_URI.to_string()
}

/// The table as written: everything optional, checked in [`FcmConfig::parse`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFcm {
    /// See [`FcmConfig::project_id`].
    #[serde(default)]
    project_id: Option<String>,
    /// Path of the service-account key file (e.g. a mounted Kubernetes Secret).
    #[serde(default)]
    credentials_file: Option<String>,
    /// The key file's JSON itself (e.g. from `OUTBOX_RELAY__SINKS__PUSH__CREDENTIALS_JSON`).
    #[serde(default)]
    credentials_json: Option<Secret>,
    /// See [`FcmConfig::endpoint`].
    #[serde(default)]
    endpoint: Option<String>,
    /// See [`FcmConfig::validate_only`].
    #[serde(default, deserialize_with = "number::flag")]
    validate_only: bool,
}

impl FcmConfig {
    pub(crate) fn parse(prefix: &str, value: config::Value) -> Result<Self, ConfigError> {
        let raw: RawFcm = value
            .try_deserialize()
            .map_err(|e| ConfigError::within(prefix, &e))?;
        let (key_name, text) = match (raw.credentials_file, raw.credentials_json) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    format!("{prefix}.credentials_json"),
                    "give either credentials_file or credentials_json, not both",
                ));
            }
            (None, None) => {
                return Err(ConfigError::new(
                    format!("{prefix}.credentials_file"),
                    "is required (or credentials_json): the service-account key FCM tokens \
                     are minted from",
                ));
            }
            (Some(path), None) => {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    ConfigError::new(
                        format!("{prefix}.credentials_file"),
                        format!("cannot read {path}: {e}"),
                    )
                })?;
                ("credentials_file", Secret::new(text))
            }
            (None, Some(json)) => ("credentials_json", json),
        };
        let at = format!("{prefix}.{key_name}");
        let credentials = parse_key(&at, &text)?;
        let project_id = match raw.project_id.or_else(|| credentials.project_id.clone()) {
            Some(p) if valid_project_id(&p) => p,
            Some(p) => {
                return Err(ConfigError::new(
                    format!("{prefix}.project_id"),
                    format!("\"{p}\" is not a Firebase project id (letters, digits, - and .)"),
                ));
            }
            None => {
                return Err(ConfigError::new(
                    format!("{prefix}.project_id"),
                    "is required (the key file names no project_id)",
                ));
            }
        };
        let endpoint = raw.endpoint.unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let endpoint = endpoint.trim().trim_end_matches('/').to_string();
        if !is_http_url(&endpoint) {
            return Err(ConfigError::new(
                format!("{prefix}.endpoint"),
                format!("\"{endpoint}\" is not an http:// or https:// URL"),
            ));
        }
        Ok(FcmConfig {
            project_id,
            credentials,
            endpoint,
            validate_only: raw.validate_only,
        })
    }
}

/// Parses and checks a service-account key; errors are reported under `at`.
fn parse_key(at: &str, text: &Secret) -> Result<ServiceAccountKey, ConfigError> {
    let key: ServiceAccountKey = serde_json::from_str(text.expose()).map_err(|e| {
        // serde_json's message may quote a value from the key: say only what and where.
        let what = match e.classify() {
            serde_json::error::Category::Data => {
                "lacks a field or has one of the wrong type \
                 (client_email and private_key are required strings)"
            }
            _ => "is not valid JSON",
        };
        ConfigError::new(
            at,
            format!(
                "the service-account key {what} (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })?;
    if let Some(t) = &key.key_type
        && t != "service_account"
    {
        return Err(ConfigError::new(
            at,
            format!("the key's type is \"{t}\"; a service_account key is needed"),
        ));
    }
    if key.client_email.trim().is_empty() {
        return Err(ConfigError::new(at, "the key's client_email is empty"));
    }
    if super::jwt::RsaSigner::from_pem(key.private_key.expose()).is_none() {
        return Err(ConfigError::new(
            at,
            "the key's private_key is not an RSA private key in PEM form",
        ));
    }
    if !is_http_url(key.token_uri.trim()) {
        return Err(ConfigError::new(
            at,
            format!(
                "the key's token_uri \"{}\" is not an http:// or https:// URL",
                key.token_uri
            ),
        ));
    }
    Ok(key)
}

fn is_http_url(s: &str) -> bool {
    (s.starts_with("http://") || s.starts_with("https://")) && reqwest::Url::parse(s).is_ok()
}

/// Project ids are lowercase letters, digits and hyphens (older ones may carry a domain
/// prefix with `.` and `:`); anything else would break the request path.
fn valid_project_id(p: &str) -> bool {
    !p.is_empty()
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pairs: &[(&str, config::Value)]) -> config::Value {
        let map: config::Map<String, config::Value> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        config::Value::from(map)
    }

    #[test]
    fn errors_name_the_key_and_never_quote_the_key_file() {
        let e = FcmConfig::parse("sinks.push", table(&[])).unwrap_err();
        assert_eq!(e.key, "sinks.push.credentials_file");

        let json = r#"{"client_email": "a@b", "private_key": "TOPSECRET-not-pem"}"#;
        let e = FcmConfig::parse(
            "sinks.push",
            table(&[
                ("credentials_json", json.into()),
                ("project_id", "p".into()),
            ]),
        )
        .unwrap_err();
        assert_eq!(e.key, "sinks.push.credentials_json");
        assert!(!e.problem.contains("TOPSECRET"), "{e}");

        let json = r#"{"client_email": "a@b", "private_key": 7, "x": "TOPSECRET"}"#;
        let e = FcmConfig::parse("sinks.push", table(&[("credentials_json", json.into())]))
            .unwrap_err();
        assert!(!e.to_string().contains("TOPSECRET"), "{e}");
        assert!(e.problem.contains("line 1"), "{e}");

        let e = FcmConfig::parse(
            "sinks.push",
            table(&[("credentials_file", "/nonexistent/key.json".into())]),
        )
        .unwrap_err();
        assert_eq!(e.key, "sinks.push.credentials_file");

        let e = FcmConfig::parse("sinks.push", table(&[("projectid", "p".into())])).unwrap_err();
        assert_eq!(e.key, "sinks.push.projectid");
    }

    #[test]
    fn project_ids_are_checked() {
        assert!(valid_project_id("my-project-123"));
        assert!(valid_project_id("google.com:legacy"));
        assert!(!valid_project_id("a/b"));
        assert!(!valid_project_id(""));
    }
}
