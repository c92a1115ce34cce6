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

    /// Properties over random policies the configuration accepts (`config/validate.rs`,
    /// `validate_retry`: `max_attempts >= 1`, `1.0 <= multiplier <= 100.0`,
    /// `0 < initial_backoff <= max_backoff`). What the module promises: attempt `n` waits
    /// between `initial_backoff` and `min(max_backoff, initial_backoff * multiplier^(n-1))`
    /// (the jitter never goes below the floor), a `Retry-After` longer than that wins, and a
    /// row is attempted exactly `max_attempts` times, throttles and config errors not counting.
    mod props {
        use proptest::prelude::*;

        use super::*;

        fn policy() -> impl Strategy<Value = RetrySettings> {
            (
                1u64..=3_600_000_000,
                0u64..=86_400_000_000,
                1.0f64..=100.0,
                1u32..=40,
            )
                .prop_map(|(initial_us, extra_us, multiplier, max_attempts)| {
                    RetrySettings {
                        initial_backoff: Duration::from_micros(initial_us),
                        max_backoff: Duration::from_micros(initial_us + extra_us),
                        multiplier,
                        max_attempts,
                    }
                })
        }

        proptest! {
            #[test]
            fn backoff_stays_between_initial_and_the_capped_exponential(
                p in policy(),
                attempt in 1u32..=200,
            ) {
                let b = backoff(&p, attempt);
                prop_assert!(b >= p.initial_backoff, "{b:?} below {:?}", p.initial_backoff);
                prop_assert!(b <= p.max_backoff, "{b:?} above {:?}", p.max_backoff);
                let ceiling = p.initial_backoff.as_secs_f64()
                    * p.multiplier.powi(attempt.saturating_sub(1).min(64) as i32);
                // One microsecond of slack for the f64 round trip of the drawn value.
                prop_assert!(
                    b.as_secs_f64() <= ceiling + 1e-6,
                    "{b:?} above the exponential {ceiling}s"
                );
            }

            #[test]
            fn a_row_is_attempted_exactly_max_attempts_times(
                p in policy(),
                // Per attempt: how many throttles or config errors come before the failure,
                // and the receiver's Retry-After, if any.
                answers in prop::collection::vec(
                    (0usize..3, prop::option::of(0u64..=7_200)),
                    40,
                ),
            ) {
                let retry = |after: Option<u64>| Outcome::Retry {
                    after: after.map(Duration::from_secs),
                    reason: "HTTP 503".into(),
                };
                let mut attempts = 0u32;
                let failed = loop {
                    let (pauses, after) = answers[attempts as usize];
                    for i in 0..pauses {
                        let o = if i % 2 == 0 {
                            Outcome::Throttle { pause: Duration::from_secs(1), reason: "429".into() }
                        } else {
                            Outcome::ConfigError { reason: "401".into() }
                        };
                        let r = resolve(&o, attempts, &p);
                        prop_assert!(matches!(r, Resolution::Release { .. }), "{r:?}");
                    }
                    match resolve(&retry(after), attempts, &p) {
                        Resolution::Retry { delay, .. } => {
                            attempts += 1;
                            prop_assert!(delay >= p.initial_backoff);
                            prop_assert!(delay >= Duration::from_secs(after.unwrap_or(0)));
                            if after.is_none() {
                                prop_assert!(delay <= p.max_backoff);
                            }
                        }
                        Resolution::Failed { error } => break (attempts + 1, error),
                        r => prop_assert!(false, "unexpected {r:?}"),
                    }
                    prop_assert!(attempts < p.max_attempts, "still retrying after {attempts}");
                };
                prop_assert_eq!(failed.0, p.max_attempts);
                let want = format!("gave up after {} attempts", p.max_attempts);
                prop_assert!(failed.1.starts_with(&want), "{}", failed.1);
            }
        }
    }
}
