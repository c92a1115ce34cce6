//! Turning an HTTP answer into an [`Outcome`]: 2xx delivered;
//! 429 throttles the sink; 408, 409, 425 and 5xx retry, honouring `Retry-After`; 410 and every
//! other status permanent.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::sink::Outcome;

/// The longest `Retry-After` honoured; a larger value is clamped to it.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
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

/// `Retry-After` as delta-seconds (`120`) or an HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`),
/// clamped to [`MAX_RETRY_AFTER`]. A date in the past gives zero.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let d = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = parse_http_date(value)?;
        let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
        Duration::from_secs(at.saturating_sub(now))
    };
    Some(d.min(MAX_RETRY_AFTER))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) into Unix seconds.
fn parse_http_date(s: &str) -> Option<u64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let day: u64 = parts[1].parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])? as u64
        + 1;
    let year: i64 = parts[3].parse().ok()?;
    let hms: Vec<u64> = parts[4]
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if hms.len() != 3 || hms[0] > 23 || hms[1] > 59 || hms[2] > 60 || !(1..=31).contains(&day) {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + (hms[0] * 3600 + hms[1] * 60 + hms[2]) as i64;
    u64::try_from(secs).ok()
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

    #[test]
    fn retry_after_in_both_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after("999999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after("Tue, 20 Oct 2015 07:28:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
