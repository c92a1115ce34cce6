//! Turning an FCM answer into an [`Outcome`] (FCM HTTP v1 error codes, as docs/sinks.md lists them).
//!
//! The FCM error code in `error.details[]` (`@type` ...`google.firebase.fcm.v1.FcmError`)
//! decides first, because the top-level `status` can say `NOT_FOUND` while the code says
//! `UNREGISTERED`; the HTTP status decides when there is no such code (or it is
//! `UNSPECIFIED_ERROR`). Bodies that are not JSON (HTML from Google's front ends) fall back to
//! the status too.
//!
//! | FCM code / status | outcome |
//! |---|---|
//! | `UNREGISTERED`, `INVALID_ARGUMENT`, `SENDER_ID_MISMATCH`; 400, other 4xx | Permanent |
//! | `QUOTA_EXCEEDED`; 429 | Throttle for `Retry-After`, else 60 s |
//! | `UNAVAILABLE`, `INTERNAL`; 408, 5xx | Retry, honouring `Retry-After` |
//! | `THIRD_PARTY_AUTH_ERROR`; 401 (after the one refresh), 403, 404 without `UNREGISTERED`, 3xx | ConfigError |

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::snippet;
use crate::sink::Outcome;
use crate::sink::http::parse_retry_after;

/// How long a 429 pauses the sink when FCM gives no `Retry-After` (Firebase's guidance).
pub const DEFAULT_THROTTLE: Duration = Duration::from_secs(60);

/// Google's JSON error envelope.
#[derive(Debug, Default, Deserialize)]
pub struct ErrorBody {
    /// The error itself (empty when the body was not the envelope).
    #[serde(default)]
    pub error: ErrorInfo,
}

/// `error` of the envelope: the canonical status and its details.
#[derive(Debug, Default, Deserialize)]
pub struct ErrorInfo {
    /// Canonical gRPC status name (`NOT_FOUND`, `UNAUTHENTICATED`, ...).
    #[serde(default)]
    pub status: Option<String>,
    /// Human-readable text.
    #[serde(default)]
    pub message: Option<String>,
    /// Typed details; the FCM error code is in one of them.
    #[serde(default)]
    pub details: Vec<Detail>,
}

/// One entry of `error.details[]`.
#[derive(Debug, Default, Deserialize)]
pub struct Detail {
    /// `@type`, e.g. `type.googleapis.com/google.firebase.fcm.v1.FcmError`.
    #[serde(default, rename = "@type")]
    pub type_url: Option<String>,
    /// Set on `google.firebase.fcm.v1.FcmError` entries.
    #[serde(default, rename = "errorCode")]
    pub error_code: Option<String>,
}

impl ErrorBody {
    /// Parses a body; anything that is not the envelope gives an empty one.
    pub fn parse(body: &str) -> ErrorBody {
        serde_json::from_str(body).unwrap_or_default()
    }

    /// The FCM error code, if a detail carries one.
    pub fn fcm_code(&self) -> Option<&str> {
        self.error
            .details
            .iter()
            .find(|d| {
                d.type_url
                    .as_deref()
                    .is_some_and(|t| t.ends_with("google.firebase.fcm.v1.FcmError"))
            })
            .and_then(|d| d.error_code.as_deref())
    }
}

/// True when a 401 asks for a new access token (not an APNs/web-push credential problem).
pub fn wants_new_token(status: u16, body: &ErrorBody) -> bool {
    status == 401 && body.fcm_code() != Some("THIRD_PARTY_AUTH_ERROR")
}

/// Classifies a non-2xx answer. `retry_after` is the raw header; `raw` the body text.
pub fn classify(status: u16, retry_after: Option<&str>, raw: &str) -> Outcome {
    let body = ErrorBody::parse(raw);
    let after = retry_after.and_then(|v| parse_retry_after(v, SystemTime::now()));
    let code = body.fcm_code().filter(|c| *c != "UNSPECIFIED_ERROR");
    let reason = reason(status, code, &body, raw);
    match code {
        Some("UNREGISTERED" | "INVALID_ARGUMENT" | "SENDER_ID_MISMATCH") => {
            return Outcome::Permanent { reason };
        }
        Some("QUOTA_EXCEEDED") => {
            return Outcome::Throttle {
                pause: after.unwrap_or(DEFAULT_THROTTLE),
                reason,
            };
        }
        Some("UNAVAILABLE" | "INTERNAL") => return Outcome::Retry { after, reason },
        Some("THIRD_PARTY_AUTH_ERROR") => return Outcome::ConfigError { reason },
        _ => {}
    }
    match status {
        429 => Outcome::Throttle {
            pause: after.unwrap_or(DEFAULT_THROTTLE),
            reason,
        },
        408 | 500..=599 => Outcome::Retry { after, reason },
        401 => Outcome::ConfigError {
            reason: format!("{reason} (a freshly minted access token was refused)"),
        },
        403 => Outcome::ConfigError {
            reason: format!("{reason} (is the FCM API enabled and may the service account send?)"),
        },
        404 => Outcome::ConfigError {
            reason: format!("{reason} (check the sink's project_id and endpoint)"),
        },
        300..=399 => Outcome::ConfigError {
            reason: format!("{reason} (redirects are not followed; check the sink's endpoint)"),
        },
        _ => Outcome::Permanent { reason },
    }
}

/// `FCM HTTP 404 UNREGISTERED: Requested entity was not found.`
fn reason(status: u16, code: Option<&str>, body: &ErrorBody, raw: &str) -> String {
    let label = code.or(body.error.status.as_deref());
    let text = match &body.error.message {
        Some(m) => snippet(m),
        None => snippet(raw),
    };
    match (label, text.is_empty()) {
        (Some(l), false) => format!("FCM HTTP {status} {l}: {text}"),
        (Some(l), true) => format!("FCM HTTP {status} {l}"),
        (None, false) => format!("FCM HTTP {status}: {text}"),
        (None, true) => format!("FCM HTTP {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fcm_error(status: u16, canonical: &str, code: &str) -> String {
        serde_json::json!({"error": {"code": status, "message": "m", "status": canonical,
            "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                         "errorCode": code}]}})
        .to_string()
    }

    #[test]
    fn the_fcm_code_decides_first() {
        // 404 NOT_FOUND with UNREGISTERED: the token is dead, not the config.
        let o = classify(404, None, &fcm_error(404, "NOT_FOUND", "UNREGISTERED"));
        assert_eq!(
            o,
            Outcome::Permanent {
                reason: "FCM HTTP 404 UNREGISTERED: m".into()
            }
        );
        for code in ["INVALID_ARGUMENT", "SENDER_ID_MISMATCH"] {
            assert!(matches!(
                classify(400, None, &fcm_error(400, "X", code)),
                Outcome::Permanent { .. }
            ));
        }
        match classify(
            429,
            Some("7"),
            &fcm_error(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"),
        ) {
            Outcome::Throttle { pause, .. } => assert_eq!(pause, Duration::from_secs(7)),
            o => panic!("{o:?}"),
        }
        match classify(
            503,
            Some("3"),
            &fcm_error(503, "UNAVAILABLE", "UNAVAILABLE"),
        ) {
            Outcome::Retry { after, .. } => assert_eq!(after, Some(Duration::from_secs(3))),
            o => panic!("{o:?}"),
        }
        assert!(matches!(
            classify(500, None, &fcm_error(500, "INTERNAL", "INTERNAL")),
            Outcome::Retry { after: None, .. }
        ));
        assert!(matches!(
            classify(
                401,
                None,
                &fcm_error(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR")
            ),
            Outcome::ConfigError { .. }
        ));
    }

    #[test]
    fn the_status_decides_without_a_code() {
        match classify(
            429,
            None,
            r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMIT_EXCEEDED"}]}}"#,
        ) {
            Outcome::Throttle { pause, .. } => assert_eq!(pause, DEFAULT_THROTTLE),
            o => panic!("{o:?}"),
        }
        assert!(matches!(
            classify(403, None, r#"{"error":{"status":"PERMISSION_DENIED"}}"#),
            Outcome::ConfigError { .. }
        ));
        // A 404 without UNREGISTERED (HTML from the front end): wrong project or URL.
        assert!(matches!(
            classify(404, None, "<html>Not Found</html>"),
            Outcome::ConfigError { .. }
        ));
        assert!(matches!(
            classify(502, None, "<html>bad gateway</html>"),
            Outcome::Retry { .. }
        ));
        assert!(matches!(
            classify(401, None, "{}"),
            Outcome::ConfigError { .. }
        ));
        assert!(matches!(
            classify(
                400,
                None,
                &fcm_error(400, "INVALID_ARGUMENT", "UNSPECIFIED_ERROR")
            ),
            Outcome::Permanent { .. }
        ));
        assert!(matches!(classify(413, None, ""), Outcome::Permanent { .. }));
    }

    #[test]
    fn only_plain_401s_ask_for_a_new_token() {
        assert!(wants_new_token(401, &ErrorBody::parse("{}")));
        assert!(!wants_new_token(
            401,
            &ErrorBody::parse(&fcm_error(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR"))
        ));
        assert!(!wants_new_token(403, &ErrorBody::parse("{}")));
    }
}
