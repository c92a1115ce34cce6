//! Turning an HTTP answer into an [`Outcome`]: 2xx delivered;
//! 429 throttles the sink; 408, 409, 425 and 5xx retry, honouring `Retry-After`; 410 and every
//! other status permanent.

use std::time::{Duration, SystemTime};

use crate::sink::Outcome;
use crate::sink::http::parse_retry_after;
/// The throttle applied on 429 when the receiver gives no `Retry-After`.
pub const DEFAULT_THROTTLE: Duration = Duration::from_secs(5);

/// Classifies a response by status, `Retry-After` and (for the reason) the body's start.
pub fn classify(status: u16, retry_after: Option<&str>, body_start: &str) -> Outcome {
    let after = retry_after.and_then(|v| parse_retry_after(v, SystemTime::now()));
    let reason = || {
        let body = body_start.trim();
        if body.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {body}")
        }
    };
    match status {
        200..=299 => Outcome::Delivered,
        429 => Outcome::Throttle {
            pause: after.unwrap_or(DEFAULT_THROTTLE),
            reason: reason(),
        },
        408 | 409 | 425 | 500..=599 => Outcome::Retry {
            after,
            reason: reason(),
        },
        300..=399 => Outcome::Retry {
            after: None,
            reason: format!(
                "{} (redirects are not followed; check the sink's url)",
                reason()
            ),
        },
        _ => Outcome::Permanent { reason: reason() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_outcomes() {
        assert_eq!(classify(204, None, ""), Outcome::Delivered);
        assert!(matches!(
            classify(500, None, ""),
            Outcome::Retry { after: None, .. }
        ));
        assert!(matches!(classify(408, None, ""), Outcome::Retry { .. }));
        assert!(matches!(classify(425, None, ""), Outcome::Retry { .. }));
        assert!(matches!(classify(410, None, ""), Outcome::Permanent { .. }));
        assert!(matches!(classify(302, None, ""), Outcome::Retry { .. }));
        match classify(400, None, "bad field") {
            Outcome::Permanent { reason } => assert_eq!(reason, "HTTP 400: bad field"),
            o => panic!("{o:?}"),
        }
        match classify(429, Some("7"), "") {
            Outcome::Throttle { pause, .. } => assert_eq!(pause, Duration::from_secs(7)),
            o => panic!("{o:?}"),
        }
        match classify(503, Some("2"), "") {
            Outcome::Retry { after, .. } => assert_eq!(after, Some(Duration::from_secs(2))),
            o => panic!("{o:?}"),
        }
    }
}
