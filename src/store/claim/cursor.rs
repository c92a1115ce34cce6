//! Where a claim's reads start (docs/design.md, "Claims", "Floors"), and the ordering keys
//! this store freed (which of them a claim reads: `keys.rs`).
//!
//! Each channel has a *floor*: its oldest window reads only rows above it. After a claim the
//! floor moves to the highest row up to which every row the window read was taken or not
//! claimable, so the next claim reads on from there instead of passing the same rows again:
//! a backlog whose rows wait behind their ordering keys is passed once, not at every claim.
//! Rows below a floor that become claimable are found without waiting when this store knows
//! of them:
//! - a keyed row of this store's finishes (or is given back): its key is *freed*, and the next
//!   claim reads that key's first unfinished rows, whatever the floors;
//! - a row of this store's is given back: its channel's floor drops to it;
//! - a retry or a delayed give-back of this store's comes due: its key is freed, or its
//!   channel's floor drops to it, at that moment.
//!
//! What this store cannot know of (another instance's claim expiring or its keyed row
//! finishing, a row whose transaction committed late below a floor) is found by the *full
//! walk*: every so often a claim also reads each channel from where the last full walk
//! stopped, a window at a time, from the lowest row up and round again, and a full walk that
//! takes rows below a floor moves the floor down to them.
//!
//! Guarantees:
//! - a floor only ever passes rows that were taken, or not claimable when a claim read them;
//! - the walk period is [`WALK_COST_SHARE`] times as long as the last walk took, at least
//!   [`FULL_WALK_EVERY`], at most [`FULL_WALK_LONGEST`];
//! - no part of a claim reads more than a bounded window: the cost of a claim does not grow
//!   with the rows waiting behind keys or for their retries.
//!
//! The state is per store, and so per relay loop: in claim mode each instance keeps its own.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::choose::{Candidate, Choice, KeyFate, keyed_share};
use super::keys::{ReadAhead, key_parts};
use super::plan::{KeyRef, NEWEST_WINDOW, Part, budgets, gaps, oldest_window};
use crate::store::model::{ClaimRequest, ClaimedRow, Completion, Resolution};

/// The shortest period of the full walk (the relay's default `poll_interval`).
pub const FULL_WALK_EVERY: Duration = Duration::from_millis(500);
/// The longest period of the full walk.
pub const FULL_WALK_LONGEST: Duration = Duration::from_secs(5);
/// The walk period is this many times the last walk's duration (within [`FULL_WALK_EVERY`]
/// and [`FULL_WALK_LONGEST`]).
const WALK_COST_SHARE: u32 = 20;
/// How many due times of this store's own retries and delayed give-backs are remembered.
/// Beyond it, a row waits for the full walk.
const DUE_REMEMBERED: usize = 10_000;
/// How many freed keys are remembered; beyond it, a key waits for the full walk.
const FREED_REMEMBERED: usize = 10_000;
/// How many keys in flight a read passes without a head look-up (each is a bound value of
/// every window of the read; MySQL takes at most 65,535 in a statement).
const BUSY_KEYS: usize = 1_024;
/// How many keys a read passes when, beyond [`BUSY_KEYS`], they are freed keys that came back
/// (see [`State::busy_keys`]).
const BUSY_KEYS_RETURNING: usize = 4_096;
/// How long a floor learnt from a window that reached a channel's newest row waits before it
/// is used. Ids are handed out when rows are inserted, not when their transactions commit, so
/// a row with a lower id can still appear after a claim read: a floor is used only once
/// transactions that were open when it was learnt have had this long to commit.
pub const COMMIT_GRACE: Duration = Duration::from_secs(1);

/// Per-channel floors, freed keys and the rows in flight that feed them.
#[derive(Default)]
pub struct Cursors(Mutex<State>);

/// What one claim (or idle read) planned to read.
#[derive(Debug, Clone, Default)]
pub struct Planned {
    pub parts: Vec<Part>,
    /// When the full walk this read makes was planned (`None`: it makes none).
    pub full_walk: Option<Instant>,
    /// The ordering keys of this store's rows in flight, sorted: the windows that are not a
    /// full walk's take their rows as behind an earlier row without looking it up
    /// (docs/design.md, "Ordering keys: windows past keys in flight").
    pub busy: Vec<String>,
}

/// Something of this store's that comes due later.
#[derive(Debug, Clone)]
enum Due {
    /// A keyed row: its key is freed.
    Key(KeyRef),
    /// An unkeyed row: its channel's floor drops to it.
    Row { channel: String, id: i64 },
}

struct State {
    channels: HashMap<String, Channel>,
    /// Rows claimed and not yet completed: (channel, ordering key).
    in_flight: HashMap<i64, (String, Option<String>)>,
    /// Keys whose next rows may be claimable (key -> a row of it).
    freed: BTreeMap<String, i64>,
    /// Freed keys that came back: freed again, or a claim got a row of theirs through their
    /// freeing (at most [`FREED_REMEMBERED`]; see [`State::came_back`]).
    returning: HashSet<String>,
    /// Per key with rows in flight, its next rows a claim read and did not take.
    ahead: ReadAhead,
    due: BTreeMap<Instant, Vec<Due>>,
    last_full_walk: Option<Instant>,
    /// The period of the full walk now (see [`WALK_COST_SHARE`]).
    walk_every: Duration,
    /// When the full walk in progress was planned: its duration sets the next period.
    walking: Option<Instant>,
    /// The last claim's oldest windows took their whole room ([`Choice::crowded`]).
    crowded: bool,
}

impl Default for State {
    fn default() -> Self {
        State {
            channels: HashMap::new(),
            in_flight: HashMap::new(),
            freed: BTreeMap::new(),
            returning: HashSet::new(),
            ahead: ReadAhead::default(),
            due: BTreeMap::new(),
            last_full_walk: None,
            walk_every: FULL_WALK_EVERY,
            walking: None,
            crowded: false,
        }
    }
}

#[derive(Default)]
struct Channel {
    floor: Option<i64>,
    /// Where the next full walk reads this channel from (`None`: its lowest row).
    sweep: Option<i64>,
    /// Lowered by a completion since the current claim was planned: that claim may have read
    /// before the rows above it became claimable, so it raises the floor no higher.
    lowered_to: Option<i64>,
    /// Floors learnt from windows that reached the channel's newest row, with when: used
    /// after [`COMMIT_GRACE`].
    settling: VecDeque<(Instant, i64)>,
}

impl Channel {
    /// Lowers the floor so that row `id` is above it again.
    fn lower_to(&mut self, id: i64) {
        let to = id - 1;
        self.floor = self.floor.map(|f| f.min(to));
        for (_, f) in self.settling.iter_mut() {
            *f = (*f).min(to);
        }
        self.lowered_to = Some(self.lowered_to.map_or(to, |l| l.min(to)));
    }

    /// Its floor now, the settled ones that waited out [`COMMIT_GRACE`] included.
    fn settle(&mut self, now: Instant) -> Option<i64> {
        while let Some(&(at, f)) = self.settling.front() {
            if now.duration_since(at) < COMMIT_GRACE {
                break;
            }
            self.settling.pop_front();
            self.floor = Some(self.floor.map_or(f, |old| old.max(f)));
        }
        self.floor
    }

    /// `n` capped by a lowering since the claim was planned.
    fn cap(&self, n: i64) -> i64 {
        self.lowered_to.map_or(n, |l| n.min(l))
    }
}

impl State {
    /// The ordering keys of the rows in flight, sorted, once each, at most [`BUSY_KEYS`]
    /// (any of them will do: a row of a key left out is looked up as before). Each such row
    /// frees its key when its result is written (or when the retry it was sent back for
    /// comes due), so a row a window passes as behind one of them is read again through its
    /// freed key. After a crowded claim, the keys this store freed as well: the claim reads
    /// them through their own parts, the keys that moved longest ago first, within the keyed
    /// share, and its windows must not take their heads past that share (docs/design.md,
    /// "Ordering keys: a keyed share"); each stays freed until a claim gets its head.
    ///
    /// Beyond [`BUSY_KEYS`], up to [`BUSY_KEYS_RETURNING`] with the freed keys that came back
    /// (a key of many rows, among more than [`BUSY_KEYS`] keys), not with those freed once (a
    /// key per row, whose freed keys mostly have no row left, and passing them cost every
    /// window a longer list; docs/design.md, "Ordering keys: a keyed share").
    fn busy_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = (self.in_flight.values())
            .filter_map(|(_, key)| key.clone())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.truncate(BUSY_KEYS);
        if self.crowded {
            let (returning, once): (Vec<&String>, Vec<&String>) =
                (self.freed.keys()).partition(|k| self.returning.contains(k.as_str()));
            let room = BUSY_KEYS_RETURNING.saturating_sub(keys.len());
            keys.extend(returning.into_iter().take(room).cloned());
            let room = BUSY_KEYS.saturating_sub(keys.len());
            keys.extend(once.into_iter().take(room).cloned());
            keys.sort_unstable();
            keys.dedup();
        }
        keys
    }

    /// Remembers `key` as a freed key that came back (see [`State::busy_keys`]). Full, the
    /// set starts over rather than stop learning: over a relay's life keys long gone would
    /// fill it for good.
    fn came_back(&mut self, key: &str) {
        if self.returning.len() >= FREED_REMEMBERED {
            self.returning.clear();
        }
        if !self.returning.contains(key) {
            self.returning.insert(key.to_string());
        }
    }

    /// Serves what came due by `now`: keys are freed, floors lowered.
    fn serve_due(&mut self, now: Instant) {
        while let Some(entry) = self.due.first_entry() {
            if *entry.key() > now {
                break;
            }
            for due in entry.remove() {
                match due {
                    Due::Key(k) => self.free(k),
                    Due::Row { channel, id } => {
                        self.channels.entry(channel).or_default().lower_to(id)
                    }
                }
            }
        }
    }

    fn free(&mut self, k: KeyRef) {
        let known = self.freed.contains_key(&k.key);
        if known {
            self.came_back(&k.key);
        }
        if known || self.freed.len() < FREED_REMEMBERED {
            self.freed.insert(k.key, k.row);
        }
    }

    /// Whether the next read should be a full walk.
    fn walk_due(&self, now: Instant) -> bool {
        self.last_full_walk
            .is_none_or(|t| now.duration_since(t) >= self.walk_every)
    }

    /// Something of this store's comes due `delay` after `now`. (A delay too long for the
    /// clock, from a receiver's `Retry-After`, is left to the full walk.)
    fn remember_due(&mut self, now: Instant, delay: Duration, due: Due) {
        let Some(at) = now.checked_add(delay) else {
            return;
        };
        if self.due.values().map(Vec::len).sum::<usize>() < DUE_REMEMBERED {
            self.due.entry(at).or_default().push(due);
        }
    }

    /// The parts of a read for `req` at `now`, with a full walk's when `full`.
    fn parts(&mut self, req: &ClaimRequest, now: Instant, full: bool) -> Vec<Part> {
        let mut parts = Vec::new();
        for b in budgets(req) {
            let c = self.channels.entry(b.channel.clone()).or_default();
            let floor = c.settle(now);
            // Rows behind the keys in flight of this channel count against its budget (after a
            // crowded claim, up to the keyed share that goes before the windows): the oldest
            // window reads that many fewer (what it finds there would not be taken).
            let chained = req.tails.iter().filter(|t| t.channel == b.channel).count();
            let chained = u32::try_from(chained).unwrap_or(u32::MAX);
            let chained = match self.crowded {
                true => chained.min(keyed_share(b.total)),
                false => chained,
            };
            let oldest = b.total - b.newest;
            let window = oldest_window(oldest.saturating_sub(chained));
            if oldest > 0 {
                if full && c.sweep != floor {
                    parts.push(Part::Window {
                        channel: b.channel.clone(),
                        from: c.sweep,
                        rows: window,
                        newest: false,
                        sweep: true,
                    });
                }
                parts.push(Part::Window {
                    channel: b.channel.clone(),
                    from: floor,
                    rows: window,
                    newest: false,
                    sweep: false,
                });
            }
            if b.newest > 0 {
                parts.push(Part::Window {
                    channel: b.channel.clone(),
                    from: None,
                    rows: b.newest.saturating_mul(NEWEST_WINDOW),
                    newest: true,
                    sweep: false,
                });
            }
        }
        if req.budgets.is_some() {
            self.ahead.forget_beyond(req, now);
            // A key freed by the tail it was read as empty behind has nothing to read.
            let ahead = &self.ahead;
            let returning = &mut self.returning;
            self.freed.retain(|key, row| {
                let empty = ahead.empty_behind(key, *row, now);
                if empty {
                    returning.remove(key);
                }
                !empty
            });
            parts.extend(key_parts(req, &self.freed, &self.ahead, now, self.crowded));
        }
        match &req.budgets {
            Some(b) => {
                if let Some((served, n)) = &b.others {
                    parts.extend(gaps(served, *n));
                }
            }
            None => parts.extend(gaps(&req.exclude_channels, req.limit)),
        }
        parts
    }
}

impl Cursors {
    /// Cursors that read ahead of the keys in flight (docs/design.md, "Ordering keys: rows
    /// read ahead"): a key read from behind its tail reads a whole run, and the rows a claim
    /// does not take are read by id by the next claims, or taken as read by a leader's. Every
    /// database's claims read so: a leader's claims then skip the keys' read, which on
    /// MySQL/MariaDB costs a member per key. With `freed_from_ahead`, so are freed keys
    /// ([`ReadAhead::freeing_from_ahead`]).
    pub fn reading_ahead(freed_from_ahead: bool) -> Cursors {
        let c = Cursors::default();
        c.lock().ahead = ReadAhead::on().freeing_from_ahead(freed_from_ahead);
        c
    }

    /// What the next claim for `req` reads.
    pub fn plan(&self, req: &ClaimRequest) -> Planned {
        let mut s = self.lock();
        let now = Instant::now();
        s.serve_due(now);
        for c in s.channels.values_mut() {
            c.lowered_to = None;
        }
        let full = s.walk_due(now);
        if full {
            s.last_full_walk = Some(now);
            s.walking = Some(now);
        }
        Planned {
            parts: s.parts(req, now, full),
            full_walk: full.then_some(now),
            busy: s.busy_keys(),
        }
    }

    /// What an idle read for `req` reads: as [`Cursors::plan`], but a full walk that is due
    /// is only read, not taken (the claim after it takes it, see [`Cursors::read_nothing`]).
    pub fn peek(&self, req: &ClaimRequest) -> Planned {
        let mut s = self.lock();
        let now = Instant::now();
        s.serve_due(now);
        let full = s.walk_due(now);
        Planned {
            parts: s.parts(req, now, full),
            full_walk: full.then_some(now),
            busy: s.busy_keys(),
        }
    }

    /// An idle read planned at `at` found nothing claimable: it did a full walk's reading,
    /// and counts as one (so an idle relay does not read the waiting rows at every poll);
    /// its sweep windows move on.
    pub fn read_nothing(&self, at: Instant, choice: &Choice) {
        let mut s = self.lock();
        if s.last_full_walk.is_some_and(|t| t >= at) {
            return;
        }
        s.last_full_walk = Some(at);
        s.walk_every = at
            .elapsed()
            .saturating_mul(WALK_COST_SHARE)
            .clamp(FULL_WALK_EVERY, FULL_WALK_LONGEST);
        for seen in choice.seen.iter().filter(|s| s.sweep) {
            let c = s.channels.entry(seen.channel.clone()).or_default();
            c.sweep = if seen.reached_end { None } else { seen.settled };
        }
    }

    /// A full walk now, and the next one `period` away (see `SqlStore::hold_full_walks`).
    pub fn hold_walks(&self, period: Duration) {
        let mut s = self.lock();
        s.last_full_walk = Some(Instant::now());
        s.walk_every = period;
    }

    /// After a claim that chose `choice` and claimed `claimed`: the rows in flight, the
    /// floors (only when the claim `looked`: a claim whose rows were all taken meanwhile, or
    /// whose fence failed, learnt nothing), the keys read, and the walk period.
    pub fn claimed(&self, choice: &Choice, claimed: &[ClaimedRow], looked: bool) {
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(planned) = s.walking.take() {
            s.walk_every = now
                .duration_since(planned)
                .saturating_mul(WALK_COST_SHARE)
                .clamp(FULL_WALK_EVERY, FULL_WALK_LONGEST);
        }
        for r in claimed {
            s.in_flight.insert(
                r.delivery.id,
                (r.delivery.channel.clone(), r.ordering_key.clone()),
            );
        }
        // Only the freeing this claim read is used up: a row of the key that finished while
        // the claim ran freed it again, and that freeing must stay (it may be the key's last
        // row in flight; lost, the key would wait for the next full walk).
        // A key whose chosen rows the claim did not get (the database found them taken, or
        // behind a row finished or given back meanwhile) keeps its freeing too.
        for (key, fate) in &choice.keys {
            let used = match fate {
                KeyFate::Done => true,
                KeyFate::Taken => claimed
                    .iter()
                    .any(|r| r.ordering_key.as_deref() == Some(key.key.as_str())),
                KeyFate::Deferred => false,
            };
            if used && s.freed.get(&key.key) == Some(&key.row) {
                s.freed.remove(&key.key);
                // A row of it after the one that freed it: the key came back.
                if matches!(fate, KeyFate::Taken) {
                    s.came_back(&key.key);
                }
            }
        }
        s.ahead.learn(choice, claimed);
        if !looked {
            return;
        }
        s.crowded = choice.crowded;
        for seen in &choice.seen {
            let c = s.channels.entry(seen.channel.clone()).or_default();
            let Some(settled) = seen.settled.map(|n| c.cap(n)) else {
                continue;
            };
            if seen.sweep {
                c.sweep = if seen.reached_end {
                    None
                } else {
                    Some(settled)
                };
                // A full walk that took rows below the floor found a backlog there (retries
                // came due, another instance's claims expired): the next claims go on from
                // there at full speed.
                if seen.took > 0 && c.floor.is_none_or(|f| settled < f) {
                    c.floor = Some(settled);
                }
                continue;
            }
            if seen.reached_end {
                c.settling.push_back((now, settled));
            } else {
                c.floor = Some(c.floor.map_or(settled, |f| f.max(settled)));
            }
        }
    }

    /// The rows of `parts` read ahead, as read (see [`ReadAhead::as_read`]).
    pub fn as_read(&self, parts: &[Part]) -> Option<Vec<(usize, Vec<Candidate>)>> {
        self.lock().ahead.as_read(parts, Instant::now())
    }

    /// What a claim read, before it chooses from it (see [`ReadAhead::saw`]).
    pub fn saw(&self, found: &[(Part, Vec<Candidate>)]) {
        self.lock().ahead.saw(found);
    }

    /// After results were written: a keyed row that finished or was given back frees its
    /// key; an unkeyed row given back lowers its channel's floor to it; rows sent back for
    /// later are remembered for when they come due.
    pub fn completed(&self, done: &[Completion]) {
        // Read after the results were written: the database set each row's due time from its
        // own clock before now, so this store's clock reaches it no earlier.
        let now = Instant::now();
        let mut s = self.lock();
        for d in done {
            let Some((channel, key)) = s.in_flight.remove(&d.id) else {
                continue;
            };
            let later = |delay: Duration| (!delay.is_zero()).then_some(delay);
            let delay = match &d.resolution {
                Resolution::Retry { delay, .. } => Some(*delay),
                Resolution::Release { delay, .. } => later(*delay),
                _ => None,
            };
            if let (Some(key), Resolution::Retry { .. } | Resolution::Release { .. }) =
                (&key, &d.resolution)
            {
                // The row itself is unfinished again: its key must be read from it.
                s.ahead.forget(key);
            }
            match (key, delay) {
                (Some(key), Some(delay)) => {
                    s.remember_due(now, delay, Due::Key(KeyRef { key, row: d.id }))
                }
                (Some(key), None) => s.free(KeyRef { key, row: d.id }),
                (None, Some(delay)) => s.remember_due(now, delay, Due::Row { channel, id: d.id }),
                (None, None) if matches!(d.resolution, Resolution::Release { .. }) => {
                    s.channels.entry(channel).or_default().lower_to(d.id)
                }
                (None, None) => {}
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
mod tests;
