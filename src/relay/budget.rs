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
/// 2. Only from what round 1 left: rows queued in the relay for the moment a sink slot
///    frees, enough to keep the sink busy for two claims (the one being made and the next),
///    [`ahead_rounds`] of its concurrency. The sink then never idles while its next rows are
///    being claimed (a claim round trip costs more than a loopback send), and when relay
///    slots are scarce this round gets nothing, so a slow sink's queued rows never take slots
///    another sink could start with now. The rate limit caps both rounds together.
///
/// `claim_time` is how long claims take (a moving average; `None` before the first).
///
/// With `others`, a quarter of `free` (at most [`OTHERS_PER_CLAIM`]) goes first to rows of
/// channels no sink serves, which are finished FAILED. What round 1 granted each channel is
/// [`Budgets::starts`].
pub fn budgets(
    sinks: &SinkRegistry,
    free: u32,
    horizon: Duration,
    others: bool,
    claim_time: Option<Duration>,
) -> Budgets {
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
            let rounds = ahead_rounds(claim_time, s.send_time.get()) as usize;
            let total = (free_slots + rounds * s.concurrency as usize)
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
    let mut starts: Vec<(String, u32)> = Vec::new();
    for round in [0, 1] {
        if round == 1 {
            starts = granted.iter().map(|(n, k)| (n.to_string(), *k)).collect();
        }
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
    Budgets {
        channels,
        others,
        starts: Some(starts),
    }
}

/// Whether some sink could start a row now: it may send, and it has a free slot that no
/// claimed row is waiting for (and its rate allows a start within `horizon`). When none can, a
/// claim would only top up the rows queued for slots already busy, and the loop lets it grow
/// until it is worth a statement (see the relay loop, step 3).
pub fn starts_now(sinks: &SinkRegistry, horizon: Duration) -> bool {
    sinks.iter().any(|s| {
        s.pause.remaining().is_none()
            && s.slots.available_permits() > s.queued.load(Ordering::Relaxed)
            && s.rate.as_ref().is_none_or(|r| r.starts_within(horizon) > 0)
    })
}

/// Most rounds of a sink's concurrency claimed ahead of its sends.
pub const MAX_AHEAD_ROUNDS: u32 = 4;

/// How many rounds of a sink's concurrency to hold queued: a sink with `concurrency` slots and
/// sends of `send_time` finishes `concurrency * claim_time / send_time` rows while one claim
/// runs, and the rows of the claim being made arrive one claim later, so two claims' worth
/// keeps it busy. At least one round (a sink seen for the first time, or a slow one: its
/// queued rows then wait at most about one send), at most [`MAX_AHEAD_ROUNDS`] (a fast
/// sink's queue is bounded; relay slots bound it too).
pub fn ahead_rounds(claim_time: Option<Duration>, send_time: Option<Duration>) -> u32 {
    sends_in_two_claims(claim_time, send_time).map_or(1, |n| n.clamp(1, MAX_AHEAD_ROUNDS))
}

/// How many sends of `send_time` one after another fit in two claims of `claim_time`
/// (`None` until both were timed).
fn sends_in_two_claims(claim_time: Option<Duration>, send_time: Option<Duration>) -> Option<u32> {
    let (claim, send) = (claim_time?, send_time?);
    let needed = (2 * claim.as_micros()).div_ceil(send.as_micros().max(1));
    Some(u32::try_from(needed).unwrap_or(u32::MAX))
}

/// The shortest run of a key one claim takes behind its tail ([`key_run`]): the store's run
/// of 16, every key's run before runs followed their sink's pace.
pub const SHORTEST_KEY_RUN: usize = crate::store::RUN as usize;

/// The longest run of a key one claim takes behind its tail ([`key_run`]): the store's
/// bound, four of the shortest; its chain up to twice that deep.
pub const LONGEST_KEY_RUN: usize = crate::store::LONGEST_RUN as usize;

/// How many rows of an ordering key a claim takes behind its rows in flight, and below how
/// many unsent rows its chain wakes the claim loop for more (docs/design.md, "Ordering keys:
/// a key's pace"): what its sink sends one at a time while two claims run, as
/// [`ahead_rounds`] reckons for a whole sink, so that the key keeps sending while its next run
/// is claimed. At least a run of 16 (a sink or claims not yet timed, a slow receiver: its
/// rows then wait at most about 32 sends), at most [`LONGEST_KEY_RUN`], so that a key is
/// never claimed far ahead of its receiver.
pub fn key_run(claim_time: Option<Duration>, send_time: Option<Duration>) -> usize {
    let run = SHORTEST_KEY_RUN;
    sends_in_two_claims(claim_time, send_time)
        .map_or(run, |n| (n as usize).clamp(run, LONGEST_KEY_RUN))
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

    /// Pauses sink `name` for a minute, as a throttle would.
    fn pause(sinks: &SinkRegistry, name: &str) {
        let sink = sinks.get(name).expect("sink");
        sink.pause.pause_for(Duration::from_secs(60), "throttled");
    }

    #[test]
    fn small_asks_are_met_and_the_rest_shared_evenly() {
        let sinks = registry(&[("a", 100), ("b", 100), ("c", 3)]);
        let b = budgets(&sinks, 43, H, false, None);
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
        pause(&sinks, "paused");
        let busy = sinks.get("busy").expect("sink");
        busy.queued.store(1, Ordering::Relaxed);
        let _slot = busy.slots.clone().try_acquire_owned().expect("a slot");
        // With just enough relay slots for what can start now, nothing is claimed ahead.
        let b = budgets(&sinks, 10, H, false, None);
        assert_eq!(b.channels, vec![("free".into(), 10)]);
        // With room to spare, a round of each sink's concurrency is claimed ahead; the paused
        // sink still gets nothing, and the busy one only what its queue leaves.
        let b = budgets(&sinks, 64, H, false, None);
        assert_eq!(b.channels, vec![("free".into(), 20), ("busy".into(), 2)]);
    }

    #[test]
    fn a_sink_starts_now_only_with_a_slot_nothing_queued_waits_for() {
        let sinks = registry(&[("a", 2), ("paused", 4)]);
        pause(&sinks, "paused");
        let a = sinks.get("a").expect("sink");
        assert!(starts_now(&sinks, H), "two free slots, nothing queued");
        let _busy = a.slots.clone().try_acquire_owned().expect("a slot");
        a.queued.store(1, Ordering::Relaxed);
        assert!(
            !starts_now(&sinks, H),
            "its free slot is promised to a queued row"
        );
        a.queued.store(0, Ordering::Relaxed);
        assert!(
            starts_now(&sinks, H),
            "the queued row took its slot: one is free"
        );
        let _both = a.slots.clone().try_acquire_owned().expect("a slot");
        assert!(
            !starts_now(&sinks, H),
            "every slot busy; the paused sink never counts"
        );
    }

    #[test]
    fn rows_ahead_come_only_from_slots_left_over() {
        let sinks = registry(&[("a", 8), ("b", 8)]);
        let total = |free| {
            let b = budgets(&sinks, free, H, false, None);
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
    fn rows_ahead_cover_two_claims_of_sends() {
        let ms = Duration::from_millis;
        assert_eq!(ahead_rounds(None, Some(ms(1))), 1);
        assert_eq!(ahead_rounds(Some(ms(2)), None), 1);
        // A slow sink: one round, as before it was ever measured.
        assert_eq!(ahead_rounds(Some(ms(2)), Some(ms(20))), 1);
        assert_eq!(ahead_rounds(Some(ms(1)), Some(ms(1))), 2);
        assert_eq!(
            ahead_rounds(Some(Duration::from_micros(2300)), Some(ms(1))),
            4
        );
        assert_eq!(ahead_rounds(Some(ms(50)), Some(ms(1))), MAX_AHEAD_ROUNDS);

        let sinks = registry(&[("fast", 8), ("slow", 8)]);
        sinks.get("fast").expect("fast").send_time.record(ms(1));
        sinks.get("slow").expect("slow").send_time.record(ms(40));
        let b = budgets(&sinks, 200, H, false, Some(ms(2)));
        let mut c = b.channels.clone();
        c.sort();
        // Both start 8 now; ahead, the fast sink queues 4 rounds and the slow one 1.
        assert_eq!(c, vec![("fast".into(), 8 + 32), ("slow".into(), 8 + 8)]);
    }

    #[test]
    fn unserved_channels_get_a_share_capped_per_claim() {
        let sinks = registry(&[("a", 1000)]);
        let b = budgets(&sinks, 400, H, true, None);
        assert_eq!(b.others, Some((vec!["a".to_string()], OTHERS_PER_CLAIM)));
        assert_eq!(b.total(), 400);
        // Even one free slot is shared: unserved rows are not starved by a busy sink.
        let b = budgets(&sinks, 1, H, true, None);
        assert_eq!(b.others.map(|o| o.1), Some(1));
        assert!(b.channels.is_empty());
        assert_eq!(budgets(&sinks, 0, H, true, None).total(), 0);
    }

    #[test]
    fn a_rate_limit_caps_the_ask_to_the_horizon() {
        let mut h = SinkHandle::new("slow", Arc::new(Unused), 100, RetrySettings::default());
        h.rate = Some(crate::sink::RateLimiter::new(10.0));
        let sinks = SinkRegistry::from_handles([h]);
        // A full bucket (one second's worth: 10) plus 500 ms at 10/s.
        let n = budgets(&sinks, 100, H, false, None).total();
        assert!((15..=16).contains(&n), "expected 15, got {n}");
        let limiter = sinks
            .get("slow")
            .and_then(|s| s.rate.as_ref())
            .expect("a rate");
        for _ in 0..15 {
            limiter.reserve();
        }
        let n = budgets(&sinks, 100, H, false, None).total();
        assert!(n <= 1, "the bucket is spent, got {n}");
    }

    #[test]
    fn a_keys_run_covers_two_claims_of_its_sends_within_bounds() {
        // (claim time, send time, both in µs; the run; why)
        let cases = [
            (None, Some(100), 16, "claims not yet timed"),
            (Some(5000), None, 16, "the sink not yet timed"),
            (Some(1000), Some(100), 20, "two claims: 20 sends"),
            (Some(500), Some(100), 16, "never less than 16"),
            (Some(5000), Some(100), 64, "never more than 64"),
            (Some(5000), Some(300_000), 16, "a slow receiver"),
        ];
        for (claim, send, run, why) in cases {
            let us = |t: Option<u64>| t.map(Duration::from_micros);
            assert_eq!(key_run(us(claim), us(send)), run, "{why}");
        }
    }

    #[test]
    fn a_rate_limited_sinks_keys_keep_runs_of_16() {
        let mut h = SinkHandle::new("limited", Arc::new(Unused), 100, RetrySettings::default());
        h.rate = Some(crate::sink::RateLimiter::new(10.0));
        h.send_time.record(Duration::from_micros(100));
        let claim = Some(Duration::from_millis(5));
        assert_eq!(
            key_run(claim, h.send_time.get()),
            64,
            "by its answers alone"
        );
        assert_eq!(
            h.pace(),
            Some(Duration::from_millis(100)),
            "a start every 100 ms"
        );
        assert_eq!(key_run(claim, h.pace()), 16);
    }
}
