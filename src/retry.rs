//! The retry policy: what a sink's [`Outcome`] means for the row.
//!
//! Backoff is exponential with jitter: attempt `n` waits a uniformly random time between
//! `initial_backoff` and `min(max_backoff, initial_backoff * multiplier^(n-1))`. The floor at
//! `initial_backoff` (rather than zero) keeps a struggling receiver from being hit again at
//! once while still spreading retries out. A `Retry-After` longer than that wins. Throttles and
//! config errors give the row back without counting the attempt.

use std::time::Duration;

use crate::config::RetrySettings;
use crate::sink::{CONFIG_ERROR_PAUSE, Outcome};
use crate::store::Resolution;

/// The backoff before attempt `attempt + 1`, after `attempt` failed attempts (1-based).
pub fn backoff(policy: &RetrySettings, attempt: u32) -> Duration {
    let initial = policy.initial_backoff.as_secs_f64();
    let exp = policy
        .multiplier
        .powi(attempt.saturating_sub(1).min(64) as i32);
    let ceiling = (initial * exp)
        .min(policy.max_backoff.as_secs_f64())
        .max(initial);
    let secs = if ceiling > initial {
        rand::random_range(initial..=ceiling)
    } else {
        initial
    };
    Duration::from_secs_f64(secs)
}

/// What to write for a row whose attempt (after `attempts_before` earlier ones) ended in
/// `outcome`.
pub fn resolve(outcome: &Outcome, attempts_before: u32, policy: &RetrySettings) -> Resolution {
    match outcome {
        Outcome::Delivered => Resolution::Delivered,
        Outcome::Retry { after, reason } => {
            let attempt = attempts_before.saturating_add(1);
            if attempt >= policy.max_attempts {
                Resolution::Failed {
                    error: format!("gave up after {attempt} attempts: {reason}"),
                }
            } else {
                let delay = backoff(policy, attempt).max(after.unwrap_or(Duration::ZERO));
                Resolution::Retry {
                    delay,
                    error: reason.clone(),
                }
            }
        }
        Outcome::Throttle { pause, reason } => Resolution::Release {
            delay: *pause,
            error: Some(format!("throttled: {reason}")),
        },
        Outcome::Permanent { reason } => Resolution::Failed {
            error: reason.clone(),
        },
        Outcome::ConfigError { reason } => Resolution::Release {
            delay: CONFIG_ERROR_PAUSE,
            error: Some(format!("sink configuration error: {reason}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetrySettings {
        RetrySettings {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            multiplier: 2.0,
            max_attempts: 4,
        }
    }

    #[test]
    fn backoff_grows_within_bounds() {
        let p = policy();
        for _ in 0..200 {
            assert_eq!(backoff(&p, 1), Duration::from_secs(1));
            let b3 = backoff(&p, 3);
            assert!(
                b3 >= Duration::from_secs(1) && b3 <= Duration::from_secs(4),
                "{b3:?}"
            );
            let b20 = backoff(&p, 20);
            assert!(b20 <= Duration::from_secs(60), "{b20:?}");
        }
    }

    #[test]
    fn retry_then_fail_at_max_attempts() {
        let p = policy();
        let o = Outcome::Retry {
            after: None,
            reason: "HTTP 500".into(),
        };
        assert!(matches!(resolve(&o, 0, &p), Resolution::Retry { .. }));
        assert!(matches!(resolve(&o, 2, &p), Resolution::Retry { .. }));
        match resolve(&o, 3, &p) {
            Resolution::Failed { error } => assert_eq!(error, "gave up after 4 attempts: HTTP 500"),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn max_attempts_one_never_retries() {
        let p = RetrySettings {
            max_attempts: 1,
            ..policy()
        };
        let o = Outcome::Retry {
            after: None,
            reason: "x".into(),
        };
        assert!(matches!(resolve(&o, 0, &p), Resolution::Failed { .. }));
    }

    #[test]
    fn retry_after_wins_over_shorter_backoff() {
        let o = Outcome::Retry {
            after: Some(Duration::from_secs(30)),
            reason: "503".into(),
        };
        match resolve(&o, 0, &policy()) {
            Resolution::Retry { delay, .. } => assert_eq!(delay, Duration::from_secs(30)),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn throttles_do_not_count_attempts() {
        let o = Outcome::Throttle {
            pause: Duration::from_secs(7),
            reason: "429".into(),
        };
        // Even at the last attempt a throttle is a release, not a failure.
        assert!(matches!(
            resolve(&o, 3, &policy()),
            Resolution::Release { delay, .. } if delay == Duration::from_secs(7)
        ));
    }
}
