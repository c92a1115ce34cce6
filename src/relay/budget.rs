//! How many rows of each channel a claim asks for (docs/design.md, "Claims"): each sink asks
//! for what it can start now, and the asks are shared out fairly.
//!
//! Guarantees: a paused sink asks for nothing; a sink never asks for more than its free
//! concurrency slots not already promised to claimed rows, nor more than its rate allows
//! within the horizon; the total never exceeds the relay's free slots; rows of channels no
//! sink serves get a small share whenever they are looked for, so no busy sink starves them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::sink::SinkRegistry;
use crate::store::Budgets;

/// Most rows of channels no sink serves taken by one claim.
pub const OTHERS_PER_CLAIM: u32 = 32;

/// Per-channel budgets for a claim of at most `free` rows, in two rounds.
///
/// 1. What each sink can start now: its free concurrency slots not already promised to
///    claimed rows, and what its rate allows within `horizon`; a paused sink asks for
///    nothing. When the asks add up to more than `free`, they are shared out evenly (the
///    smallest asks are met in full, the rest split what is left), so a sink with a deep
///    backlog cannot take the slots the others need.
/// 2. Only from what round 1 left: up to one more round of each sink's concurrency, queued
///    in the relay for the moment a sink slot frees. The sink then never idles while its next
///    rows are being claimed (a claim round trip costs more than a loopback send), and when
///    relay slots are scarce this round gets nothing, so a slow sink's queued rows never take
///    slots another sink could start with now. The rate limit caps both rounds together.
///
/// With `others`, a quarter of `free` (at most [`OTHERS_PER_CLAIM`]) goes first to rows of
/// channels no sink serves, which are finished FAILED.
pub fn budgets(sinks: &SinkRegistry, free: u32, horizon: Duration, others: bool) -> Budgets {
    // (name, ask now, ask ahead) per sink that may send.
    let asks: Vec<(&str, u32, u32)> = sinks
        .iter()
        .filter(|s| s.pause.remaining().is_none())
        .map(|s| {
            let free_slots = s.slots.available_permits();
            let queued = s.queued.load(Ordering::Relaxed);
            let rate = s
                .rate
                .as_ref()
                .map_or(usize::MAX, |r| r.starts_within(horizon));
            let now = free_slots.saturating_sub(queued).min(rate);
            let total = (free_slots + s.concurrency as usize)
                .saturating_sub(queued)
                .min(rate);
            let cap = |n: usize| n.min(free as usize) as u32;
            (s.name.as_str(), cap(now), cap(total - now.min(total)))
        })
        .collect();
    // Channels no sink serves get a small share first, or a busy sink would starve them.
    let for_others = if others {
        (free / 4).clamp(u32::from(free > 0), OTHERS_PER_CLAIM)
    } else {
        0
    };
    let mut left = free - for_others;
    let mut granted: Vec<(&str, u32)> = Vec::with_capacity(asks.len());
    for round in [0, 1] {
        let mut wants: Vec<(&str, u32)> = asks
            .iter()
            .map(|(name, now, ahead)| (*name, if round == 0 { *now } else { *ahead }))
            .filter(|(_, n)| *n > 0)
            .collect();
        wants.sort_by_key(|(name, n)| (*n, *name));
        let count = wants.len() as u32;
        for (i, (name, ask)) in wants.into_iter().enumerate() {
            let share = (left / (count - i as u32)).max(u32::from(left > 0));
            let n = ask.min(share);
            left -= n;
            if n == 0 {
                continue;
            }
            match granted.iter_mut().find(|(g, _)| *g == name) {
                Some((_, m)) => *m += n,
                None => granted.push((name, n)),
            }
        }
    }
    let channels = granted
        .into_iter()
        .map(|(name, n)| (name.to_string(), n))
        .collect();
    let others =
        (for_others > 0).then(|| (sinks.iter().map(|s| s.name.clone()).collect(), for_others));
    Budgets { channels, others }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::RetrySettings;
    use crate::sink::{Delivery, Outcome, Sink, SinkHandle};

    /// A sink the budget never calls.
    struct Unused;

    impl Sink for Unused {
        fn deliver<'a>(&'a self, _: &'a Delivery) -> crate::BoxFuture<'a, Outcome> {
            Box::pin(async { Outcome::Delivered })
        }
    }

    fn registry(concurrency: &[(&str, u32)]) -> SinkRegistry {
        SinkRegistry::from_handles(
            concurrency.iter().map(|(name, c)| {
                SinkHandle::new(name, Arc::new(Unused), *c, RetrySettings::default())
            }),
        )
    }

    const H: Duration = Duration::from_millis(500);

    #[test]
    fn small_asks_are_met_and_the_rest_shared_evenly() {
        let sinks = registry(&[("a", 100), ("b", 100), ("c", 3)]);
        let b = budgets(&sinks, 43, H, false);
        assert_eq!(
            b.channels,
            vec![("c".into(), 3), ("a".into(), 20), ("b".into(), 20)]
        );
        assert_eq!(b.others, None);
        assert_eq!(b.total(), 43);
    }

    #[test]
    fn paused_full_and_promised_sinks_ask_for_nothing() {
        let sinks = registry(&[("paused", 10), ("busy", 2), ("free", 10)]);
        sinks
            .get("paused")
            .expect("sink")
            .pause
            .pause_for(Duration::from_secs(60), "throttled");
        let busy = sinks.get("busy").expect("sink");
        busy.queued.store(1, Ordering::Relaxed);
        let _slot = busy.slots.clone().try_acquire_owned().expect("a slot");
        // With just enough relay slots for what can start now, nothing is claimed ahead.
        let b = budgets(&sinks, 10, H, false);
        assert_eq!(b.channels, vec![("free".into(), 10)]);
        // With room to spare, a round of each sink's concurrency is claimed ahead; the paused
        // sink still gets nothing, and the busy one only what its queue leaves.
        let b = budgets(&sinks, 64, H, false);
        assert_eq!(b.channels, vec![("free".into(), 20), ("busy".into(), 2)]);
    }

    #[test]
    fn rows_ahead_come_only_from_slots_left_over() {
        let sinks = registry(&[("a", 8), ("b", 8)]);
        let total = |free| {
            let b = budgets(&sinks, free, H, false);
            let mut c = b.channels.clone();
            c.sort();
            c
        };
        assert_eq!(total(16), vec![("a".into(), 8), ("b".into(), 8)]);
        assert_eq!(total(20), vec![("a".into(), 10), ("b".into(), 10)]);
        assert_eq!(total(64), vec![("a".into(), 16), ("b".into(), 16)]);
        // Rows already queued count against the round ahead.
        sinks
            .get("a")
            .expect("a")
            .queued
            .store(8, Ordering::Relaxed);
        assert_eq!(total(64), vec![("a".into(), 8), ("b".into(), 16)]);
    }

    #[test]
    fn unserved_channels_get_a_share_capped_per_claim() {
        let sinks = registry(&[("a", 1000)]);
        let b = budgets(&sinks, 400, H, true);
        assert_eq!(b.others, Some((vec!["a".to_string()], OTHERS_PER_CLAIM)));
        assert_eq!(b.total(), 400);
        // Even one free slot is shared: unserved rows are not starved by a busy sink.
        let b = budgets(&sinks, 1, H, true);
        assert_eq!(b.others.map(|o| o.1), Some(1));
        assert!(b.channels.is_empty());
        assert_eq!(budgets(&sinks, 0, H, true).total(), 0);
    }

    #[test]
    fn a_rate_limit_caps_the_ask_to_the_horizon() {
        let mut h = SinkHandle::new("slow", Arc::new(Unused), 100, RetrySettings::default());
        h.rate = Some(crate::sink::RateLimiter::new(10.0));
        let sinks = SinkRegistry::from_handles([h]);
        // A full bucket (one second's worth: 10) plus 500 ms at 10/s.
        let n = budgets(&sinks, 100, H, false).total();
        assert!((15..=16).contains(&n), "expected 15, got {n}");
        let limiter = sinks
            .get("slow")
            .and_then(|s| s.rate.as_ref())
            .expect("a rate");
        for _ in 0..15 {
            limiter.reserve();
        }
        let n = budgets(&sinks, 100, H, false).total();
        assert!(n <= 1, "the bucket is spent, got {n}");
    }
}
