//! Vendor result codes and HTTP statuses, sorted into classes and turned into [`Outcome`]s
//! (the vendors' documented result codes).
//!
//! | class | NHN `resultCode` | Solapi `statusCode` / `errorCode` | outcome |
//! |---|---|---|---|
//! | success | `0` | `2000` (`3000`, `4000`) | Delivered |
//! | already submitted | `-1005` (idempotency key seen) | | Delivered |
//! | retryable | `-9999`, `-7000` | `1024`, `2024`, `3024`, `DuplicatedSignature` | Retry |
//! | config | `-1000..-1003`, `-1006`, `-1014`, `-1019`, `-1027`, `-1030`, `-2017`, `-2502`, `-4004`, `-4005`, `-4029` | `1020`, `1030`, `2230`, `1041`, `1042`, `1062`, `2062`, `2063`, `3101`, `3105`, `3106`, `InvalidAPIKey`, `SignatureDoesNotMatch`, `RequestTimeTooSkewed` | ConfigError (sink paused, rows kept) |
//! | payload | `4`, `-1028`, `-2000..-2005`, `-2018`, `-2019`, `-2025..-2027`, `-2032`, `-2035`, `-3000..-3053`, `-3347`, `-8006`, `-8008`, `-9993..-9998` | `1010`, `1011`, `1025..1033`, `1043..1053`, `3103`, `ValidationError` | Permanent |
//! | recipient | `-5000`, `-4019`, `-3301` | `1060`, `2060`, `1061`, `2061`, `1064`, `2064`, `3010`, `3032`, `3102`, `3104`, `3107` | Permanent |
//! | send window | | `3108` (outside 08:00-20:00) | Retry after 30 min |
//! | unlisted | anything else | anything else | Retry (bounded by `max_attempts`) |
//!
//! Without a vendor code (HTML error pages, proxies), the HTTP status decides: 429 throttles
//! the sink (`Retry-After`, else 60 s); 408 and 5xx retry; 3xx, 401, 402, 403, 404 and 405 are
//! configuration errors (wrong endpoint or credentials); other 4xx are permanent.

use std::time::{Duration, SystemTime};

use crate::sink::Outcome;
use crate::sink::http::parse_retry_after;

/// How long a 429 without `Retry-After` pauses the sink.
pub const DEFAULT_THROTTLE: Duration = Duration::from_secs(60);
/// How long a send refused for the time of day waits (Solapi 3108).
pub const SEND_WINDOW_RETRY: Duration = Duration::from_secs(1800);

/// What a vendor code means for the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Accepted.
    Success,
    /// The vendor saw this idempotency key before: an earlier attempt was accepted.
    AlreadySubmitted,
    /// A vendor-side failure: try again.
    Retryable,
    /// Credentials, account, sender profile or template registration: pause the sink.
    Config,
    /// The message (template, parameters, buttons) can never be accepted.
    Payload,
    /// The recipient cannot receive it (bad number, blocked, opted out).
    Recipient,
    /// Refused for the time of day: try later.
    SendWindow,
    /// A code not in the tables.
    Unlisted,
}

impl Class {
    /// Short label used in reasons.
    pub fn label(self) -> &'static str {
        match self {
            Class::Success => "accepted",
            Class::AlreadySubmitted => "already submitted",
            Class::Retryable => "vendor error",
            Class::Config => "configuration",
            Class::Payload => "message rejected",
            Class::Recipient => "recipient rejected",
            Class::SendWindow => "outside the send window",
            Class::Unlisted => "unlisted code",
        }
    }

    /// The outcome for this class; `detail` says which code and what the vendor said.
    pub fn outcome(self, detail: &str) -> Outcome {
        let reason = format!("{detail} ({})", self.label());
        match self {
            Class::Success | Class::AlreadySubmitted => Outcome::Delivered,
            Class::Retryable | Class::Unlisted => Outcome::Retry {
                after: None,
                reason,
            },
            Class::SendWindow => Outcome::Retry {
                after: Some(SEND_WINDOW_RETRY),
                reason,
            },
            Class::Config => Outcome::ConfigError { reason },
            Class::Payload | Class::Recipient => Outcome::Permanent { reason },
        }
    }
}

/// NHN Cloud AlimTalk v2.3 `resultCode` (header or per recipient).
pub fn nhn(code: i64) -> Class {
    match code {
        0 => Class::Success,
        -1005 => Class::AlreadySubmitted,
        -9999 | -7000 => Class::Retryable,
        -1000 | -1001 | -1002 | -1003 | -1006 | -1014 | -1019 | -1027 | -1030 | -2017 | -2502
        | -4004 | -4005 | -4029 => Class::Config,
        -5000 | -4019 | -3301 => Class::Recipient,
        4
        | -1028
        | -2005..=-2000
        | -2018
        | -2019
        | -2027..=-2025
        | -2032
        | -2035
        | -3053..=-3000
        | -3347
        | -8006
        | -8008
        | -9998..=-9993 => Class::Payload,
        _ => Class::Unlisted,
    }
}

/// Solapi v4 `statusCode` of an accepted-or-refused message.
pub fn solapi_status(code: &str) -> Class {
    let Ok(n) = code.trim().parse::<u32>() else {
        return Class::Unlisted;
    };
    match n {
        2000 | 3000 | 4000 => Class::Success,
        1024 | 2024 | 3024 => Class::Retryable,
        1020 | 1030 | 2230 | 1041 | 1042 | 1062 | 2062 | 2063 | 3101 | 3105 | 3106 => Class::Config,
        1060 | 2060 | 1061 | 2061 | 1064 | 2064 | 3010 | 3032 | 3102 | 3104 | 3107 => {
            Class::Recipient
        }
        1010 | 1011 | 1025..=1033 | 1043..=1053 | 3103 => Class::Payload,
        3108 => Class::SendWindow,
        _ => Class::Unlisted,
    }
}

/// Solapi's `errorCode` on an HTTP error, when it says more than the status.
pub fn solapi_error(code: &str) -> Option<Class> {
    match code {
        "InvalidAPIKey" | "SignatureDoesNotMatch" | "RequestTimeTooSkewed" => Some(Class::Config),
        "DuplicatedSignature" => Some(Class::Retryable),
        "ValidationError" => Some(Class::Payload),
        _ => None,
    }
}

/// The outcome of an HTTP answer that carries no vendor code.
pub fn http_status(status: u16, retry_after: Option<&str>, detail: &str) -> Outcome {
    let after = retry_after.and_then(|v| parse_retry_after(v, SystemTime::now()));
    let reason = format!("HTTP {status}{detail}");
    match status {
        429 => Outcome::Throttle {
            pause: after.unwrap_or(DEFAULT_THROTTLE),
            reason,
        },
        408 | 500..=599 => Outcome::Retry { after, reason },
        300..=399 | 401..=405 => Outcome::ConfigError {
            reason: format!("{reason} (check the sink's endpoint and credentials)"),
        },
        _ => Outcome::Permanent { reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nhn_codes() {
        assert_eq!(nhn(0), Class::Success);
        assert_eq!(nhn(-1005), Class::AlreadySubmitted);
        assert_eq!(nhn(-9999), Class::Retryable);
        for c in [-1000, -1001, -1006, -1027, -2017, -4004, -4005] {
            assert_eq!(nhn(c), Class::Config, "{c}");
        }
        for c in [4, -2000, -2019, -3003, -3049, -3347, -9995] {
            assert_eq!(nhn(c), Class::Payload, "{c}");
        }
        for c in [-5000, -4019, -3301] {
            assert_eq!(nhn(c), Class::Recipient, "{c}");
        }
        assert_eq!(nhn(-1031), Class::Unlisted);
    }

    #[test]
    fn solapi_codes() {
        assert_eq!(solapi_status("2000"), Class::Success);
        assert_eq!(solapi_status("1024"), Class::Retryable);
        assert_eq!(solapi_status("1030"), Class::Config);
        assert_eq!(solapi_status("3104"), Class::Recipient);
        assert_eq!(solapi_status("1043"), Class::Payload);
        assert_eq!(solapi_status("3108"), Class::SendWindow);
        assert_eq!(solapi_status("x"), Class::Unlisted);
        assert_eq!(solapi_error("InvalidAPIKey"), Some(Class::Config));
        assert_eq!(solapi_error("Other"), None);
    }

    #[test]
    fn classes_become_outcomes() {
        assert_eq!(Class::AlreadySubmitted.outcome("d"), Outcome::Delivered);
        assert_eq!(
            Class::Recipient.outcome("NHN -5000: bad"),
            Outcome::Permanent {
                reason: "NHN -5000: bad (recipient rejected)".into()
            }
        );
        assert!(matches!(
            Class::Config.outcome("x"),
            Outcome::ConfigError { .. }
        ));
        assert!(matches!(
            Class::SendWindow.outcome("x"),
            Outcome::Retry {
                after: Some(SEND_WINDOW_RETRY),
                ..
            }
        ));
    }

    #[test]
    fn bare_statuses() {
        assert!(matches!(
            http_status(429, None, ""),
            Outcome::Throttle { pause, .. } if pause == DEFAULT_THROTTLE
        ));
        assert!(matches!(
            http_status(503, Some("4"), ""),
            Outcome::Retry { after: Some(d), .. } if d == Duration::from_secs(4)
        ));
        assert!(matches!(
            http_status(404, None, ""),
            Outcome::ConfigError { .. }
        ));
        assert!(matches!(
            http_status(400, None, ": bad"),
            Outcome::Permanent { .. }
        ));
    }
}
