//! Where each channel's oldest-first pick starts (docs/design.md, "Claims", "Floors").
//!
//! A pick walks its channel's index of unfinished rows from the lowest id. On PostgreSQL that
//! index keeps an entry for every row finished since the last vacuum (a result update leaves
//! the old entry behind), and on every database it holds the rows already claimed: without a
//! starting point, a claim in the middle of a 20,000-row backlog walked some 10,000 dead
//! entries to find its 100 rows (5.4 ms and 2,320 buffer reads, against 0.25 ms and 111 from
//! the right place). So each channel has a *floor*: its picks read only `id > floor`.
//!
//! Guarantees:
//! - a floor only ever skips rows that were not claimable when a claim looked at them, or that
//!   it claimed: it is set from what a claim returned, never past a row the claim's oldest pick
//!   could have taken (see [`Cursors::claimed`]);
//! - rows that become claimable again below a floor are found without waiting: when a keyed row
//!   finishes (the next row of its key may now be due) or a row is given back, the floor is
//!   lowered to that row's id; and the floor never passes a keyed row this store still has in
//!   flight;
//! - everything else that comes due below a floor (a retry's backoff ending, a claim of a
//!   crashed instance expiring) is found by a claim from the start of the index at least every
//!   [`FULL_WALK_EVERY`]; a floor never makes a row wait longer than that.
//!
//! The state is per store, and so per relay loop: in claim mode each instance keeps its own.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{ClaimedRow, Completion, Resolution};

/// How often a claim ignores the floors and walks each channel's index from its lowest id
/// (the relay's default `poll_interval`, the cadence at which retries come back anyway).
pub const FULL_WALK_EVERY: Duration = Duration::from_millis(500);
/// How long a floor learnt from a claim that ran out of rows waits before it is used. Ids are
/// handed out when rows are inserted, not when their transactions commit, so a row with a
/// lower id can still appear after a claim looked: with no backlog, a floor is used only once
/// transactions that were open when it was learnt have had this long to commit.
pub const COMMIT_GRACE: Duration = Duration::from_secs(1);

/// Per-channel floors and the rows in flight that bound them.
#[derive(Default)]
pub(super) struct Cursors(Mutex<State>);

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    /// Rows claimed and not yet completed: (channel, has an ordering key).
    in_flight: HashMap<i64, (String, bool)>,
    last_full_walk: Option<Instant>,
}

#[derive(Default)]
struct Channel {
    floor: Option<i64>,
    /// Keyed rows of this channel in flight: the floor never passes the lowest of them, so
    /// the rows behind them in their keys stay within the picks' reach.
    keyed: BTreeSet<i64>,
    /// Lowered by a completion since the current claim was planned: that claim may have
    /// looked before the row it was lowered for became claimable, so it does not raise it.
    lowered: bool,
    /// Floors learnt from claims that ran out of rows, with when: used after [`COMMIT_GRACE`].
    settling: VecDeque<(Instant, i64)>,
}

/// What one claim's oldest-first picks start after: channel -> floor (a channel not listed,
/// or an empty map for a full walk, is read from its lowest id).
pub(super) type Floors = HashMap<String, i64>;

impl Cursors {
    /// The floors for the next claim.
    pub(super) fn plan(&self) -> Floors {
        self.floors(true)
    }

    /// The floors for a read that decides whether to claim (the idle read, `Queue::probe`):
    /// as [`Cursors::plan`], but a full walk that is due is left to the claim. Had the read
    /// taken it, a row it found below a floor (a claim of a killed instance expired) would
    /// make it say "claim", and the claim, with the floors, would miss that row: read and
    /// claim again at every poll, and never claim it.
    pub(super) fn peek(&self) -> Floors {
        self.floors(false)
    }

    /// [`Cursors::plan`] (`take_walk`: for a claim) or [`Cursors::peek`].
    fn floors(&self, take_walk: bool) -> Floors {
        let mut s = self.lock();
        let now = Instant::now();
        if s.last_full_walk
            .is_none_or(|t| now.duration_since(t) >= FULL_WALK_EVERY)
        {
            if take_walk {
                s.last_full_walk = Some(now);
            }
            return Floors::new();
        }
        s.channels
            .iter_mut()
            .filter_map(|(name, c)| {
                if take_walk {
                    c.lowered = false;
                }
                while let Some(&(at, f)) = c.settling.front() {
                    if now.duration_since(at) < COMMIT_GRACE {
                        break;
                    }
                    c.settling.pop_front();
                    c.floor = Some(c.floor.map_or(f, |old| old.max(f)));
                }
                let keyed = c.keyed.first().map(|k| k - 1);
                let floor = c.floor.map(|f| keyed.map_or(f, |k| f.min(k)));
                floor.map(|f| (name.clone(), f))
            })
            .collect()
    }

    /// After a claim: `picked` is, per channel, (its budget, how much of it the newest pick
    /// took). A channel's oldest pick returned the lowest claimable rows above its floor, at
    /// most `budget - newest` of them, so every claimable row up to the `budget - newest`-th
    /// lowest row returned was returned: that row is the new floor (a backlog: used at once).
    /// When fewer came back, the oldest pick ran out, and the highest row returned will be
    /// the floor after [`COMMIT_GRACE`]. Nothing returned: the floor stays.
    pub(super) fn claimed(&self, picked: &[(&str, u32, u32)], rows: &[ClaimedRow]) {
        let now = Instant::now();
        let mut s = self.lock();
        for r in rows {
            s.in_flight.insert(
                r.delivery.id,
                (r.delivery.channel.clone(), r.ordering_key.is_some()),
            );
            if r.ordering_key.is_some() {
                s.channels
                    .entry(r.delivery.channel.clone())
                    .or_default()
                    .keyed
                    .insert(r.delivery.id);
            }
        }
        for (name, budget, newest) in picked {
            let ids: Vec<i64> = rows
                .iter()
                .filter(|r| r.delivery.channel == *name)
                .map(|r| r.delivery.id)
                .collect(); // in id order: the store sorts what a claim returns
            let oldest = budget.saturating_sub(*newest) as usize;
            let c = s.channels.entry(name.to_string()).or_default();
            if c.lowered {
                continue;
            }
            if ids.len() >= oldest {
                // Replaced, not raised: after a full walk that found a backlog below the old
                // floor (retries come due, a crashed instance's claims expired), the next
                // claims go on from there at full speed instead of taking one budget of it
                // per full walk. (A pick that started at a floor returns only rows above it.)
                if let Some(&n) = ids.get(oldest.saturating_sub(1)) {
                    c.floor = Some(n);
                }
            } else if let Some(&n) = ids.last() {
                c.settling.push_back((now, n));
            }
        }
    }

    /// After results were written: rows that may have made others claimable below a floor
    /// (a keyed row finished, so the next of its key may be due; a row given back) lower
    /// their channel's floor to themselves.
    pub(super) fn completed(&self, done: &[Completion]) {
        let mut s = self.lock();
        for d in done {
            let Some((channel, keyed)) = s.in_flight.remove(&d.id) else {
                continue;
            };
            let released = matches!(d.resolution, Resolution::Release { .. });
            let c = s.channels.entry(channel.clone()).or_default();
            if keyed {
                c.keyed.remove(&d.id);
            }
            // An ordering key is not bound to a channel: the next row of a finished keyed row's
            // key may be in any channel, so every channel's floor drops, not only its own.
            for (name, c) in s.channels.iter_mut() {
                if keyed || (released && *name == channel) {
                    c.floor = c.floor.map(|f| f.min(d.id - 1));
                    c.settling.clear();
                    c.lowered = true;
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is only ever updated whole under the lock; a panic elsewhere cannot leave
        // it half-written, so a poisoned lock is still good.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sink::Delivery;

    fn row(id: i64, channel: &str, key: Option<&str>) -> ClaimedRow {
        ClaimedRow {
            delivery: Delivery {
                id,
                channel: channel.into(),
                recipient: None,
                payload: "{}".into(),
                attempts: 0,
            },
            ordering_key: key.map(String::from),
            age_at_claim: Duration::ZERO,
            undeliverable: None,
        }
    }

    fn done(id: i64, resolution: Resolution) -> Completion {
        Completion {
            id,
            token: Arc::from("t"),
            resolution,
        }
    }

    /// A store's cursors just after their first (full) walk.
    fn walked() -> Cursors {
        let c = Cursors::default();
        assert!(c.plan().is_empty(), "the first claim walks from the start");
        c
    }

    #[test]
    fn a_full_oldest_pick_sets_the_floor_at_once_and_the_newest_rows_do_not_move_it() {
        let c = walked();
        // Budget 8, of which the newest pick took 1: the oldest pick's rows are the 7 lowest.
        let rows: Vec<_> = (1..=7).chain([500]).map(|i| row(i, "a", None)).collect();
        c.claimed(&[("a", 8, 1)], &rows);
        assert_eq!(c.plan().get("a"), Some(&7));
    }

    #[test]
    fn a_short_claim_sets_its_floor_only_after_the_commit_grace() {
        let c = walked();
        c.claimed(&[("a", 100, 0)], &[row(3, "a", None), row(9, "a", None)]);
        assert_eq!(c.plan().get("a"), None, "a lower id may still commit");
        c.lock().channels.get_mut("a").unwrap().settling[0].0 -= COMMIT_GRACE;
        assert_eq!(c.plan().get("a"), Some(&9));
    }

    #[test]
    fn the_floor_never_passes_a_keyed_row_in_flight_and_drops_when_it_finishes() {
        let c = walked();
        let rows = [row(5, "a", Some("k")), row(6, "a", None), row(7, "a", None)];
        c.claimed(&[("a", 3, 0)], &rows);
        assert_eq!(c.plan().get("a"), Some(&4), "below the keyed row 5");
        c.completed(&[
            done(6, Resolution::Delivered),
            done(7, Resolution::Delivered),
        ]);
        assert_eq!(c.plan().get("a"), Some(&4));
        c.completed(&[done(5, Resolution::Delivered)]);
        assert_eq!(
            c.plan().get("a"),
            Some(&4),
            "the next row of key k may be due"
        );
    }

    #[test]
    fn a_finished_keyed_row_lowers_every_channels_floor() {
        // Found by the floor model (props): key k spans channels a and b; row 6 (b) was not
        // claimable while row 5 (a) was unfinished, and b's floor had passed it.
        let c = walked();
        c.claimed(&[("a", 1, 0)], &[row(5, "a", Some("k"))]);
        c.claimed(&[("b", 1, 0)], &[row(9, "b", None)]);
        assert_eq!(c.plan().get("b"), Some(&9));
        c.completed(&[done(5, Resolution::Delivered)]);
        assert_eq!(c.plan().get("b"), Some(&4), "row 6 of key k may be due now");
    }

    #[test]
    fn a_row_given_back_lowers_the_floor_and_a_claim_in_progress_does_not_raise_it() {
        let c = walked();
        c.claimed(
            &[("a", 3, 0)],
            &[row(10, "a", None), row(11, "a", None), row(12, "a", None)],
        );
        assert_eq!(c.plan().get("a"), Some(&12));
        // A claim is planned; meanwhile row 11 is given back; the claim returns later rows.
        c.completed(&[done(
            11,
            Resolution::Release {
                delay: Duration::ZERO,
                error: None,
            },
        )]);
        c.claimed(&[("a", 2, 0)], &[row(20, "a", None), row(21, "a", None)]);
        assert_eq!(c.plan().get("a"), Some(&10));
    }

    #[test]
    fn a_full_walk_that_finds_a_backlog_below_the_floor_moves_the_floor_down_to_it() {
        let c = walked();
        c.claimed(&[("a", 2, 0)], &[row(100, "a", None), row(101, "a", None)]);
        assert_eq!(c.plan().get("a"), Some(&101));
        // Retries below the floor came due; a full walk takes the first budget of them.
        c.lock().last_full_walk = Some(Instant::now() - FULL_WALK_EVERY);
        assert!(c.plan().is_empty());
        c.claimed(&[("a", 2, 0)], &[row(10, "a", None), row(11, "a", None)]);
        assert_eq!(
            c.plan().get("a"),
            Some(&11),
            "the next claims go on from the backlog"
        );
    }

    #[test]
    fn every_full_walk_period_a_claim_ignores_the_floors() {
        let c = walked();
        c.claimed(&[("a", 1, 0)], &[row(40, "a", None)]);
        assert_eq!(c.plan().get("a"), Some(&40));
        c.lock().last_full_walk = Some(Instant::now() - FULL_WALK_EVERY);
        assert!(c.plan().is_empty());
        assert_eq!(c.plan().get("a"), Some(&40), "the floor itself is kept");
    }
}

#[cfg(test)]
#[path = "cursor_props.rs"]
mod props;
