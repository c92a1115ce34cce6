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
//! - everything else that comes due below a floor is found by a *full walk*, a claim (or an
//!   idle read) from the start of the index: a retry or a delayed give-back of this store's
//!   own rows when it comes due (at most [`FULL_WALK_EVERY`] later when several come due
//!   close together; at the next periodic walk when that walk's claim had no room for its
//!   channel, or more than [`DUE_REMEMBERED`] due times are waiting); what the store cannot
//!   know of (another instance's retry, a crashed
//!   instance's claim expiring, a row whose transaction committed late) within the walk
//!   period: [`WALK_COST_SHARE`] times as long as the last walk took, at least
//!   [`FULL_WALK_EVERY`], at most [`FULL_WALK_LONGEST`]. A floor never makes a row wait longer
//!   than that.
//!
//! Why the period follows the walk's cost: a full walk passes every unfinished row below the
//! floors, and after a sink's outage those can be 100,000 retries waiting for later. MariaDB
//! reads each: a walk took 0.25 s there, and walked every 500 ms they cost a drain behind them
//! 0.52-0.70x of its rows/s (docs/design.md, "Floors"). Where a walk is cheap, as over few
//! waiting rows, it is still made every 500 ms.
//!
//! The state is per store, and so per relay loop: in claim mode each instance keeps its own.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::model::{ClaimedRow, Completion, Resolution};

/// The shortest period of the full walk, a claim that ignores the floors and walks each
/// channel's index from its lowest id (the relay's default `poll_interval`).
pub const FULL_WALK_EVERY: Duration = Duration::from_millis(500);
/// The longest period of the full walk: the longest a row this store cannot know of waits
/// below a floor.
pub const FULL_WALK_LONGEST: Duration = Duration::from_secs(5);
/// The walk period is this many times the last walk's duration (within [`FULL_WALK_EVERY`]
/// and [`FULL_WALK_LONGEST`]): walks take at most a twentieth of the time, unless one takes
/// longer than [`FULL_WALK_LONGEST`] / 20 (250 ms).
const WALK_COST_SHARE: u32 = 20;
/// How many due times of this store's own retries and delayed give-backs are remembered for
/// their walks (at most one per [`FULL_WALK_EVERY`]: with the default `max_backoff` of 300 s,
/// 600). Beyond it, a row waits for the periodic walk.
const DUE_REMEMBERED: usize = 10_000;
/// How long a floor learnt from a claim that ran out of rows waits before it is used. Ids are
/// handed out when rows are inserted, not when their transactions commit, so a row with a
/// lower id can still appear after a claim looked: with no backlog, a floor is used only once
/// transactions that were open when it was learnt have had this long to commit.
pub const COMMIT_GRACE: Duration = Duration::from_secs(1);

/// Per-channel floors and the rows in flight that bound them.
#[derive(Default)]
pub struct Cursors(Mutex<State>);

struct State {
    channels: HashMap<String, Channel>,
    /// Rows claimed and not yet completed: (channel, has an ordering key).
    in_flight: HashMap<i64, (String, bool)>,
    last_full_walk: Option<Instant>,
    /// The period of the full walk now (see [`WALK_COST_SHARE`]).
    walk_every: Duration,
    /// When rows this store sent back for later (a retry, a delayed give-back) come due: a
    /// full walk is made at each.
    due: BTreeSet<Instant>,
    /// When the full walk in progress was planned: its duration sets the next period.
    walking: Option<Instant>,
}

impl Default for State {
    fn default() -> Self {
        State {
            channels: HashMap::new(),
            in_flight: HashMap::new(),
            last_full_walk: None,
            walk_every: FULL_WALK_EVERY,
            due: BTreeSet::new(),
            walking: None,
        }
    }
}

impl State {
    /// Each channel's floor now (the settled ones that waited out [`COMMIT_GRACE`] included);
    /// `planned`: for a claim that uses them, whose results may raise them again.
    fn current(&mut self, now: Instant, planned: bool) -> Floors {
        let at = self
            .channels
            .iter_mut()
            .filter_map(|(name, c)| {
                if planned {
                    c.lowered_to = None;
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
            .collect();
        Floors {
            at,
            full: false,
            windowed: HashSet::new(),
        }
    }

    /// Whether the next read should be a full walk.
    fn walk_due(&self, now: Instant) -> bool {
        self.last_full_walk
            .is_none_or(|t| now.duration_since(t) >= self.walk_every)
            || self.due.first().is_some_and(|d| *d <= now)
    }

    /// A full walk that looked at `at`: the due times it served are forgotten.
    fn walked(&mut self, at: Instant) {
        self.last_full_walk = Some(at);
        while self.due.first().is_some_and(|d| *d <= at) {
            self.due.pop_first();
        }
    }

    /// After a full walk that took `took` (planned, read, and the claim's rows recorded).
    fn walk_took(&mut self, took: Duration) {
        self.walk_every = took
            .saturating_mul(WALK_COST_SHARE)
            .clamp(FULL_WALK_EVERY, FULL_WALK_LONGEST);
    }

    /// A row of this store's comes due `delay` after `now`: a walk then, unless one is
    /// already planned for at most [`FULL_WALK_EVERY`] later. (A delay too long for the clock,
    /// from a receiver's `Retry-After`, is left to the periodic walk.)
    fn remember_due(&mut self, now: Instant, delay: Duration) {
        let Some(at) = now.checked_add(delay) else {
            return;
        };
        let planned = match at.checked_add(FULL_WALK_EVERY) {
            Some(until) => self.due.range(at..=until).next().is_some(),
            None => self.due.range(at..).next().is_some(),
        };
        if !planned && self.due.len() < DUE_REMEMBERED {
            self.due.insert(at);
        }
    }
}

#[derive(Default)]
struct Channel {
    floor: Option<i64>,
    /// Keyed rows of this channel in flight: the floor never passes the lowest of them, so
    /// the rows behind them in their keys stay within the picks' reach.
    keyed: BTreeSet<i64>,
    /// Lowered by a completion since the current claim was planned: that claim may have
    /// looked before the rows above it became claimable, so it raises the floor no higher.
    /// (A completion during every claim, as when claims follow each other with rows in
    /// flight, used to keep the floor where it was for good: each claim walked every row
    /// finished since, on PostgreSQL and MariaDB their dead index entries too.)
    lowered_to: Option<i64>,
    /// Floors learnt from claims that ran out of rows, with when: used after [`COMMIT_GRACE`].
    settling: VecDeque<(Instant, i64)>,
}

/// What one claim's oldest-first picks start after, and how far they look.
#[derive(Clone, Debug, Default)]
pub struct Floors {
    /// Channel -> floor: its oldest pick reads ids above it (a channel not listed, or none
    /// listed for a full walk, is read from its lowest id).
    pub at: HashMap<String, i64>,
    /// A full walk: every channel is read from its lowest id, and none through a window.
    pub full: bool,
    /// Channels whose oldest pick reads only a window of the first unfinished rows above
    /// the floor, or from the lowest id without one (`window.rs`).
    pub windowed: HashSet<String>,
}

impl Floors {
    /// The floor of `channel`, if it has one.
    pub fn get(&self, channel: &str) -> Option<&i64> {
        self.at.get(channel)
    }

    /// No floor at all: a full walk.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

impl Cursors {
    /// The floors for the next claim.
    pub fn plan(&self) -> Floors {
        self.floors(true).0
    }

    /// The floors for a read that decides whether to claim (the idle read, `Queue::probe`),
    /// and, when they are a full walk's (none), the time it was planned, for
    /// [`Cursors::read_nothing`]. As [`Cursors::plan`], but a full walk that is due is left to
    /// the claim. Had the read taken it, a row it found below a floor (a claim of a killed
    /// instance expired) would make it say "claim", and the claim, with the floors, would miss
    /// that row: read and claim again at every poll, and never claim it.
    pub fn peek(&self) -> (Floors, Option<Instant>) {
        self.floors(false)
    }

    /// A read planned at `at` with no floors found nothing claimable: it did what a full walk
    /// does, and counts as one (so an idle relay does not walk every row waiting for later
    /// at every poll).
    pub fn read_nothing(&self, at: Instant) {
        let mut s = self.lock();
        if s.last_full_walk.is_some_and(|t| t >= at) {
            return;
        }
        s.walked(at);
        s.walk_took(at.elapsed());
    }

    /// A full walk now, and the next one `period` away, as a walk that took a twentieth of it
    /// would leave them (see `SqlStore::hold_full_walks`).
    pub fn hold_walks(&self, period: Duration) {
        let mut s = self.lock();
        s.walked(Instant::now());
        s.walk_every = period;
    }

    /// [`Cursors::plan`] (`take_walk`: for a claim) or [`Cursors::peek`].
    fn floors(&self, take_walk: bool) -> (Floors, Option<Instant>) {
        let mut s = self.lock();
        let now = Instant::now();
        let walk = s.walk_due(now);
        let floors = s.current(now, take_walk && !walk);
        if take_walk {
            s.walking = None;
        }
        if !walk {
            return (floors, None);
        }
        if take_walk {
            s.walked(now);
            s.walking = Some(now);
        }
        let full = Floors {
            full: true,
            ..Floors::default()
        };
        (full, Some(now))
    }

    /// After a claim: `picked` is, per channel, (its budget, how much of it the newest pick
    /// took). A channel's oldest pick returned the lowest claimable rows above its floor, at
    /// most `budget - newest` of them, so every claimable row up to the `budget - newest`-th
    /// lowest row returned was returned: that row is the new floor (a backlog: used at once).
    /// When fewer came back, the oldest pick ran out, and the highest row returned will be
    /// the floor after [`COMMIT_GRACE`]. Nothing returned: the floor stays.
    ///
    /// After a full walk, its duration sets the walk period.
    pub fn claimed(&self, picked: &[(&str, u32, u32)], rows: &[ClaimedRow]) {
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(planned) = s.walking.take() {
            s.walk_took(now.duration_since(planned));
        }
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
            let cap = |n: i64| c.lowered_to.map_or(n, |l| n.min(l));
            if ids.len() >= oldest {
                // Replaced, not raised: after a full walk that found a backlog below the old
                // floor (retries come due, a crashed instance's claims expired), the next
                // claims go on from there at full speed instead of taking one budget of it
                // per full walk. (A pick that started at a floor returns only rows above it.)
                if let Some(&n) = ids.get(oldest.saturating_sub(1)) {
                    c.floor = Some(cap(n));
                }
            } else if let Some(&n) = ids.last() {
                let n = cap(n);
                c.settling.push_back((now, n));
            }
        }
    }

    /// After results were written: rows that may have made others claimable below a floor
    /// (a keyed row finished, so the next of its key may be due; a row given back) lower
    /// their channel's floor to themselves; rows sent back for later have a full walk
    /// planned for when they come due.
    pub fn completed(&self, done: &[Completion]) {
        // Read after the results were written: the database set each row's due time from its
        // own clock before now, so this store's clock reaches it no earlier.
        let now = Instant::now();
        let mut s = self.lock();
        for d in done {
            let Some((channel, keyed)) = s.in_flight.remove(&d.id) else {
                continue;
            };
            match d.resolution {
                Resolution::Retry { delay, .. } => s.remember_due(now, delay),
                // A row given back for now is under the lowered floor below.
                Resolution::Release { delay, .. } if !delay.is_zero() => s.remember_due(now, delay),
                _ => {}
            }
            let released = matches!(d.resolution, Resolution::Release { .. });
            let c = s.channels.entry(channel.clone()).or_default();
            if keyed {
                c.keyed.remove(&d.id);
            }
            // An ordering key is not bound to a channel: the next row of a finished keyed row's
            // key may be in any channel, so every channel's floor drops, not only its own.
            for (name, c) in s.channels.iter_mut() {
                if keyed || (released && *name == channel) {
                    let to = d.id - 1;
                    c.floor = c.floor.map(|f| f.min(to));
                    for (_, f) in c.settling.iter_mut() {
                        *f = (*f).min(to);
                    }
                    c.lowered_to = Some(c.lowered_to.map_or(to, |l| l.min(to)));
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
        period_passed(&c);
        assert!(c.plan().is_empty());
        c.claimed(&[("a", 2, 0)], &[row(10, "a", None), row(11, "a", None)]);
        assert_eq!(
            c.plan().get("a"),
            Some(&11),
            "the next claims go on from the backlog"
        );
    }

    /// Makes the full walk due by its period.
    fn period_passed(c: &Cursors) {
        let mut s = c.lock();
        s.last_full_walk = Some(Instant::now() - s.walk_every);
    }

    #[test]
    fn the_walk_period_is_twenty_times_the_last_walks_duration_within_bounds() {
        let c = walked();
        c.claimed(&[("a", 2, 0)], &[row(100, "a", None), row(101, "a", None)]);
        let mut periods = Vec::new();
        for took in [10, 100, 200, 1000, 0] {
            period_passed(&c);
            assert!(c.plan().is_empty(), "a full walk");
            c.lock().walking = Some(Instant::now() - Duration::from_millis(took));
            c.claimed(&[("a", 2, 0)], &[]);
            periods.push(c.lock().walk_every.as_millis() / 100 * 100);
        }
        assert_eq!(periods, [500, 2000, 4000, 5000, 500]);
        // Between walks the floors are used.
        assert_eq!(c.plan().get("a"), Some(&101));
        // An idle read that did the walk's reading: its own duration.
        period_passed(&c);
        let (_, full) = c.peek();
        c.read_nothing(full.expect("due") - Duration::from_millis(150));
        assert_eq!(c.lock().walk_every.as_millis() / 100, 30);
    }

    #[test]
    fn a_retry_of_this_stores_own_has_a_full_walk_when_it_comes_due() {
        let c = walked();
        c.claimed(
            &[("a", 3, 0)],
            &[row(1, "a", None), row(2, "a", None), row(3, "a", None)],
        );
        c.lock().walk_every = FULL_WALK_LONGEST;
        let retry = |ms| Resolution::Retry {
            delay: Duration::from_millis(ms),
            error: "503".into(),
        };
        // A walk planned for a row due at most FULL_WALK_EVERY later serves one due first.
        c.completed(&[done(2, retry(80)), done(1, retry(60))]);
        assert_eq!(c.lock().due.len(), 1, "one walk serves both");
        assert_eq!(c.plan().get("a"), Some(&3), "not due yet");
        std::thread::sleep(Duration::from_millis(90));
        assert!(c.plan().is_empty(), "rows 1 and 2 are due: a full walk");
        assert!(c.lock().due.is_empty());
        assert_eq!(c.plan().get("a"), Some(&3), "one walk per due time");
        // A delayed give-back too; one for now is under its lowered floor instead.
        c.completed(&[done(
            3,
            Resolution::Release {
                delay: Duration::from_secs(60),
                error: None,
            },
        )]);
        assert_eq!(c.lock().due.len(), 1);
    }

    #[test]
    fn a_delay_too_long_for_the_clock_is_left_to_the_periodic_walk() {
        let c = walked();
        c.claimed(&[("a", 1, 0)], &[row(1, "a", None)]);
        let forever = Resolution::Retry {
            delay: Duration::MAX,
            error: "Retry-After: a very long time".into(),
        };
        c.completed(&[done(1, forever)]);
        assert!(c.lock().due.is_empty());
    }

    #[test]
    fn an_idle_read_with_no_floors_that_found_nothing_counts_as_a_full_walk() {
        let c = walked();
        c.claimed(&[("a", 1, 0)], &[row(5, "a", None)]);
        period_passed(&c);
        let (floors, full) = c.peek();
        assert!(floors.is_empty());
        let at = full.expect("the walk is due");
        assert!(c.peek().1.is_some(), "a read does not take the walk");
        c.read_nothing(at);
        let (floors, full) = c.peek();
        assert_eq!((floors.get("a"), full), (Some(&5), None));
        // A claim that walked after the read was planned is not undone by it.
        period_passed(&c);
        let (_, full) = c.peek();
        assert!(c.plan().is_empty());
        let walked_at = c.lock().last_full_walk;
        c.read_nothing(full.expect("due"));
        assert_eq!(c.lock().last_full_walk, walked_at);
    }

    #[test]
    fn every_full_walk_period_a_claim_ignores_the_floors() {
        let c = walked();
        c.claimed(&[("a", 1, 0)], &[row(40, "a", None)]);
        assert_eq!(c.plan().get("a"), Some(&40));
        period_passed(&c);
        assert!(c.plan().is_empty());
        assert_eq!(c.plan().get("a"), Some(&40), "the floor itself is kept");
    }
}

#[cfg(test)]
#[path = "cursor_props.rs"]
mod props;
