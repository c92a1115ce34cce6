//! When a channel's oldest pick reads only a window of the rows above its floor
//! (docs/design.md, "Ordering keys and claim rounds").
//!
//! A pick walks its channel's unfinished rows from the floor (or the lowest id) until it has
//! its rows. When the backlog holds fewer ordering keys than the relay has rows in flight,
//! every row left waits behind its key's head, and the walk passes all of them for the few
//! heads that came free: on MariaDB a drain of 20,000 rows of 200 keys spent 7.0 s in 168
//! claims of about 42 ms. So after a walk that came back short and was slow, the next picks
//! of that channel read only the first [`WINDOW_PER_ROW`] times their rows of unfinished rows
//! above the floor, where such heads are.
//!
//! Guarantees:
//! - a window never hides a row for long: when a windowed pick finds fewer rows than the last
//!   whole walk did, the same claim walks the channel again ([`Windows::walk_again`]), and a
//!   whole walk is made at least every [`WALK_COST_SHARE`] times the last one's duration;
//! - the floors are untouched: a windowed pick that fills its share returned the lowest
//!   claimable rows above the floor (the window is a prefix of them), and one that does not
//!   is handled as any short pick (`cursor.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::cursor::Floors;

/// A windowed pick looks at this many unfinished rows above the floor per row it takes.
pub const WINDOW_PER_ROW: u32 = 4;
/// Only walks that took at least this long make the next picks windowed: a cheap walk costs
/// nothing worth saving, and keeps every claim as it was.
const SLOW_WALK: Duration = Duration::from_millis(5);
/// A whole walk again once this many times the last one's duration has passed: rows beyond
/// the window that came free wait at most that long (a tenth of the time on whole walks).
const WALK_COST_SHARE: u32 = 10;

/// The last whole walk of one channel that came back short and slow.
#[derive(Clone, Copy, Debug)]
struct Walk {
    /// Rows its oldest pick returned.
    found: usize,
    /// When it finished.
    at: Instant,
    /// How long its claim took.
    took: Duration,
}

/// Per channel, the last slow short walk (the state is per store, as the floors are).
pub struct Windows {
    walks: Mutex<HashMap<String, Walk>>,
    /// [`SLOW_WALK`], in microseconds; tests lower it ([`Windows::every_short_walk`]).
    slow_walk_us: AtomicU64,
    /// Claims with a windowed pick, for tests.
    claims: AtomicU64,
}

impl Default for Windows {
    fn default() -> Self {
        Windows {
            walks: Mutex::default(),
            slow_walk_us: AtomicU64::new(SLOW_WALK.as_micros() as u64),
            claims: AtomicU64::new(0),
        }
    }
}

impl Windows {
    /// Which of `channels` read a window in the claim planned now from `floors` (none in a
    /// full walk, which is for what lies anywhere below the floors).
    pub fn plan<'a>(
        &self,
        channels: impl Iterator<Item = &'a String>,
        floors: &Floors,
        now: Instant,
    ) -> HashSet<String> {
        if floors.full {
            return HashSet::new();
        }
        let walks = self.lock();
        channels
            .filter(|c| {
                walks.get(*c).is_some_and(|w| {
                    now.saturating_duration_since(w.at) < w.took.saturating_mul(WALK_COST_SHARE)
                })
            })
            .cloned()
            .collect()
    }

    /// Whether `channel`'s windowed pick, which returned `found` rows of the `wanted` it
    /// could take, may have left rows beyond its window that the last whole walk would have
    /// found: then the same claim walks the channel again.
    pub fn walk_again(&self, channel: &str, found: usize, wanted: usize) -> bool {
        self.lock()
            .get(channel)
            .is_some_and(|w| found < wanted.min(w.found))
    }

    /// A whole walk of `channel` (from its floor, or a full walk) returned `found` of the
    /// `wanted` rows its oldest pick could take, in a claim that took `took`.
    pub fn walked(&self, channel: &str, found: usize, wanted: usize, took: Duration) {
        let slow = Duration::from_micros(self.slow_walk_us.load(Ordering::Relaxed));
        let mut walks = self.lock();
        if found < wanted && took >= slow {
            let at = Instant::now();
            walks.insert(channel.to_string(), Walk { found, at, took });
        } else {
            walks.remove(channel);
        }
    }

    /// A claim with a windowed pick is being made (counted for tests).
    pub fn count_windowed_claim(&self) {
        self.claims.fetch_add(1, Ordering::Relaxed);
    }

    /// For tests: a short walk makes the next picks of its channel windowed however fast it
    /// was (over a test's few rows every walk is far faster than [`SLOW_WALK`]).
    pub fn every_short_walk(&self) {
        self.slow_walk_us.store(0, Ordering::Relaxed);
    }

    /// For tests: how many claims had a windowed pick.
    pub fn windowed_claims(&self) -> u64 {
        self.claims.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Walk>> {
        // Each update is whole under the lock: a poisoned lock is still good.
        self.walks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(channels: &[&str]) -> Vec<String> {
        channels.iter().map(|c| c.to_string()).collect()
    }

    /// The channels of `channels` windowed in a claim (not a full walk) planned at `now`.
    fn plan(w: &Windows, channels: &[&str], now: Instant) -> HashSet<String> {
        w.plan(names(channels).iter(), &Floors::default(), now)
    }

    #[test]
    fn only_a_slow_short_walk_makes_the_next_picks_windowed() {
        let w = Windows::default();
        let now = Instant::now();
        w.walked("a", 200, 224, Duration::from_millis(1));
        assert!(plan(&w, &["a"], now).is_empty(), "a cheap walk");
        w.walked("a", 224, 224, Duration::from_millis(50));
        assert!(plan(&w, &["a"], now).is_empty(), "a full pick");
        w.walked("a", 200, 224, Duration::from_millis(50));
        assert_eq!(
            plan(&w, &["a", "b"], Instant::now()),
            HashSet::from(["a".to_string()])
        );
        let full = Floors {
            full: true,
            ..Floors::default()
        };
        assert!(
            w.plan(names(&["a"]).iter(), &full, Instant::now())
                .is_empty(),
            "a full walk is never windowed"
        );
    }

    #[test]
    fn a_whole_walk_again_after_ten_times_its_duration() {
        let w = Windows::default();
        w.walked("a", 200, 224, Duration::from_millis(50));
        let then = Instant::now();
        assert_eq!(plan(&w, &["a"], then).len(), 1);
        assert!(plan(&w, &["a"], then + Duration::from_millis(500)).is_empty());
    }

    #[test]
    fn a_window_that_finds_fewer_than_the_last_walk_walks_again() {
        let w = Windows::default();
        w.walked("a", 200, 224, Duration::from_millis(50));
        assert!(
            !w.walk_again("a", 200, 224),
            "as many as the walk: the heads"
        );
        assert!(
            w.walk_again("a", 1, 224),
            "a hot key's next row, and others beyond"
        );
        assert!(!w.walk_again("a", 100, 100), "all it could take");
        assert!(!w.walk_again("b", 0, 224), "not windowed");
    }
}
