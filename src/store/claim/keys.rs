//! Which ordering keys a claim reads, and how (docs/design.md, "Ordering keys: chains", "Ordering
//! keys: rows read ahead"): the keys with rows in flight at the relay from behind their tails,
//! then the keys this store freed from their first unfinished row; where the database reads
//! ahead, a key in flight whose next rows an earlier claim read behind that very tail by id.
//!
//! Guarantees: at most [`KEYS_PER_CLAIM`] keys a claim, each part bounded by a run; rows read
//! ahead are only candidates (the claim statement checks each as any other), forgotten as soon
//! as a claim of the key does not get every row it took or the tail moves elsewhere.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::choose::{Candidate, Choice, keyed_share};
use super::plan::{KeyRef, Part};
use super::{LONGEST_RUN, RUN};
use crate::store::model::{ClaimRequest, ClaimedRow, Tail};

/// How many keys one claim reads (each is one bounded part of its read).
const KEYS_PER_CLAIM: usize = 128;
/// How many keys' rows read ahead are remembered before those of keys no longer offered are
/// forgotten.
const AHEAD_REMEMBERED: usize = 1_024;

/// How long a key read as empty behind its tail is not read again while that tail is in
/// flight or just freed, unless a window reads a row of it meanwhile. A key per aggregate
/// (most keys one row) had each claim read 128 such keys, a member each, for nothing: on
/// MariaDB a 60 KB read of 4-12 ms a claim (docs/design.md, "Ordering keys: keys read as
/// empty").
const EMPTY_FOR: Duration = Duration::from_millis(100);

/// How old the rows read ahead of a key may be for a leader's claim to take them as they were
/// read instead of reading them again by id: as old as the rows a window read ahead may be
/// (`windows.rs`).
const AS_READ_FOR: Duration = Duration::from_millis(500);

/// A key's next rows read ahead: the rows right behind `after`, the key's last row in flight
/// when they were read, in id order (none: the key had no unfinished row behind it), and
/// when.
#[derive(Debug, Clone)]
struct Ahead {
    after: i64,
    rows: Vec<i64>,
    at: Instant,
}

/// The rows read ahead, per key with rows in flight; nothing unless [`ReadAhead::on`].
#[derive(Debug, Default)]
pub struct ReadAhead {
    on: bool,
    /// Whether a freed key is read from the rows read ahead behind the row that freed it
    /// (see [`ReadAhead::freeing_from_ahead`]).
    freed_from_ahead: bool,
    keys: HashMap<String, Ahead>,
    /// The channel of each row read ahead, as read (see [`ReadAhead::as_read`]).
    channels: HashMap<i64, Option<String>>,
    /// How many keys' entries are kept before the next pruning (see
    /// [`ReadAhead::forget_beyond`]).
    prune_past: usize,
}

impl ReadAhead {
    /// Reading ahead (every store's claims read so: `Cursors::reading_ahead`).
    pub fn on() -> ReadAhead {
        ReadAhead {
            on: true,
            ..ReadAhead::default()
        }
    }

    /// Reading freed keys from the rows read ahead behind the rows that freed them, by id
    /// (`freed_part`), where the database reads each key in a member of its own
    /// ([`ClaimSql::freed_keys_from_rows_ahead`](crate::store::claim::ClaimSql)).
    pub fn freeing_from_ahead(self, on: bool) -> ReadAhead {
        ReadAhead {
            freed_from_ahead: on,
            ..self
        }
    }

    /// After a claim: each key it read forgets what was read ahead of it before, and learns
    /// what this claim read ahead, where the claim got every row it took of the key (the
    /// rows ahead are then right behind the key's new tail). A key that lost a row to another
    /// claim, or stopped at a row not free, is read from its tail again.
    pub fn learn(&mut self, choice: &Choice, claimed: &[ClaimedRow]) {
        if !self.on {
            return;
        }
        for (key, _) in &choice.keys {
            self.keys.remove(&key.key);
        }
        let at = Instant::now();
        let got: HashSet<i64> = claimed.iter().map(|r| r.delivery.id).collect();
        for a in &choice.ahead {
            let after = match a.took.last() {
                Some(&last) if a.took.iter().all(|id| got.contains(id)) => last,
                Some(_) => continue,
                None => match a.after {
                    Some(after) => after,
                    None => continue,
                },
            };
            let rows = a.rows.clone();
            self.keys.insert(a.key.clone(), Ahead { after, rows, at });
        }
        // The channels of rows no longer ahead are dropped only past what the keys kept can
        // hold: a row's channel stays what it was, and a pass over them every claim cost more.
        if self.channels.len() > AHEAD_REMEMBERED * RUN as usize {
            let ahead: HashSet<i64> = self.keys.values().flat_map(|a| a.rows.clone()).collect();
            self.channels.retain(|id, _| ahead.contains(id));
        }
    }

    /// Before a claim chooses from what it read (and so before it learns): a key known as
    /// empty that a channel's window read a row of is empty no longer, or the row was passed
    /// as behind the key's tail ("windows past keys in flight"); it is read again.
    pub fn saw(&mut self, found: &[(Part, Vec<Candidate>)]) {
        if !self.on {
            return;
        }
        let keyed = found
            .iter()
            .filter(|(p, _)| matches!(p, Part::Key { .. } | Part::Known { .. }));
        for r in keyed.flat_map(|(_, rows)| rows) {
            self.channels.insert(r.id, r.channel.clone());
        }
        let windows = found
            .iter()
            .filter(|(p, _)| matches!(p, Part::Window { .. }));
        for key in windows.flat_map(|(_, rows)| rows.iter().filter_map(|r| r.key.as_deref())) {
            if self.keys.get(key).is_some_and(|a| a.rows.is_empty()) {
                self.keys.remove(key);
            }
        }
    }

    /// The rows of each [`Part::Known`] of `parts` as they were read ahead, by the part's
    /// index, for a leader's claim (no other claimer takes them meanwhile): free heads of
    /// their key behind its tail, of the channels they had. `None` (read them by id) unless
    /// every such part's rows were read behind its tail less than [`AS_READ_FOR`] before
    /// `now`, with their channels. The claim statement checks every row it takes as it does
    /// any (docs/design.md, "Ordering keys: rows read ahead"): a row that changed meanwhile is
    /// only left out, and its key read from its tail again.
    pub fn as_read(&self, parts: &[Part], now: Instant) -> Option<Vec<(usize, Vec<Candidate>)>> {
        let mut out = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let Part::Known {
                key, after, ids, ..
            } = part
            else {
                continue;
            };
            let a = self.keys.get(&key.key)?;
            if a.after != *after || now.saturating_duration_since(a.at) >= AS_READ_FOR {
                return None;
            }
            let rows = ids.iter().map(|&id| {
                Some(Candidate {
                    id,
                    channel: self.channels.get(&id)?.clone(),
                    key: Some(key.key.clone()),
                    free: true,
                    head: true,
                    last: false,
                })
            });
            out.push((i, rows.collect::<Option<Vec<_>>>()?));
        }
        (!out.is_empty()).then_some(out)
    }

    /// Forgets what was read ahead of `key` (its row in flight was given back or will be
    /// retried: the key is not empty behind it, it is that row).
    pub fn forget(&mut self, key: &str) {
        self.keys.remove(key);
    }

    /// Whether `key` was read, less than [`EMPTY_FOR`] before `now`, with no unfinished row
    /// behind `row` (its tail then, in flight or just finished), and no window has read a row
    /// of it since. Such a key need not be read behind that tail, nor from its first row once
    /// `row` frees it: a row of it that appears later is above the floors, where a window
    /// finds it. A row that commits late below them is the full walk's, as any is; the claim
    /// statement checks every row it takes whatever was read.
    pub fn empty_behind(&self, key: &str, row: i64, now: Instant) -> bool {
        self.keys.get(key).is_some_and(|a| {
            a.after == row && a.rows.is_empty() && now.saturating_duration_since(a.at) < EMPTY_FOR
        })
    }

    /// Keeps what is read ahead to about [`AHEAD_REMEMBERED`] keys: past it (or past twice
    /// what the last pruning kept), only keys `req` offers tails of (a chain that ended leaves
    /// its key's entry behind) and keys read as empty less than [`EMPTY_FOR`] before `now`. A
    /// key per row makes more keys empty than that in a few claims, and each is needed until
    /// its row frees it and the claim after skips it: pruned with the rest, every freed key
    /// was read from its first row for nothing (docs/design.md, "Ordering keys: keys read as
    /// empty").
    pub fn forget_beyond(&mut self, req: &ClaimRequest, now: Instant) {
        if self.keys.len() > self.prune_past.max(AHEAD_REMEMBERED) {
            let offered: HashSet<&str> = req.tails.iter().map(|t| t.key.as_str()).collect();
            self.keys.retain(|k, a| {
                offered.contains(k.as_str())
                    || (a.rows.is_empty() && now.saturating_duration_since(a.at) < EMPTY_FOR)
            });
            self.prune_past = self.keys.len().saturating_mul(2);
        }
    }
}

/// The parts that read ordering keys, at most [`KEYS_PER_CLAIM`]: first the keys with rows in
/// flight at the relay, from behind their tails ([`ClaimRequest::tails`]), each read for a
/// fair share of the budget (a claim takes them breadth first); then the freed keys without
/// rows in flight, oldest first, from their first unfinished row, for a whole run.
///
/// With `crowded` (the last claim's oldest windows took the whole budget they were left), no
/// more keys than the keyed share of the budgets (`choose::keyed_share`), the keys that moved
/// longest ago first, tails or freed: the claim takes no more keys' first rows than that
/// before the windows, and the windows will likely leave none for more (docs/design.md,
/// "Ordering keys: a keyed share").
pub fn key_parts(
    req: &ClaimRequest,
    freed: &BTreeMap<String, i64>,
    ahead: &ReadAhead,
    now: Instant,
    crowded: bool,
) -> Vec<Part> {
    let mut tails: Vec<&Tail> = (req.tails.iter())
        .filter(|t| !ahead.empty_behind(&t.key, t.row, now))
        .take(KEYS_PER_CLAIM)
        .collect();
    let chained: HashSet<&str> = tails.iter().map(|t| t.key.as_str()).collect();
    let room = if crowded {
        let room = keyed_room(req);
        let freed_rows = oldest_freed(&chained, freed, ahead, now, room);
        longest_still(&mut tails, freed_rows.iter().map(|(row, _)| *row), room);
        room
    } else {
        KEYS_PER_CLAIM
    };
    let total = req.budgets.as_ref().map_or(req.limit, |b| b.total());
    let share = (total / u32::try_from(tails.len()).unwrap_or(u32::MAX).max(1)).saturating_mul(2);
    let mut parts: Vec<Part> = tails
        .iter()
        .map(|t| {
            let key = KeyRef {
                key: t.key.clone(),
                row: t.row,
            };
            let run = tail_run(t);
            let share = share.clamp(2, run);
            let (after, rows) = (Some(t.row), share);
            if !ahead.on {
                return Part::Key { key, after, rows };
            }
            match ahead.keys.get(&t.key) {
                // The rows read behind this very tail: by id, the claim's share of them.
                Some(a) if a.after == t.row && !a.rows.is_empty() => {
                    let (ids, more) = a.rows.split_at((share as usize).min(a.rows.len()));
                    Part::Known {
                        key,
                        after: t.row,
                        ids: ids.to_vec(),
                        more: more.to_vec(),
                    }
                }
                // A whole run: what this claim does not take is read ahead for the next.
                _ => Part::Key {
                    key,
                    after,
                    rows: run,
                },
            }
        })
        .collect();
    parts.extend(
        oldest_freed(&chained, freed, ahead, now, room - tails.len())
            .into_iter()
            .map(|(row, key)| freed_part(key, row, ahead, crowded)),
    );
    parts
}

/// The part that reads `key`, freed by `row`: where the store reads freed keys so
/// ([`ReadAhead::freeing_from_ahead`]), the rows read ahead right behind `row` by id, a run of
/// them, where a claim read them behind it (the row finished since; they are the
/// key's next unfinished rows, and the claim statement checks each as any) and they make a
/// whole run, or any of them for a `crowded` claim; else the key's first unfinished rows
/// through its index, a whole run. A crowded claim takes a key's first row and seldom more,
/// and each such row frees its key: read from its first row every time, each such claim read
/// a run of every key for the one row it took (docs/design.md, "Ordering keys: rows read
/// ahead"). Otherwise a key takes a run, which a few rows left ahead would cut short.
fn freed_part(key: &str, row: i64, ahead: &ReadAhead, crowded: bool) -> Part {
    let key_ref = KeyRef {
        key: key.to_string(),
        row,
    };
    let enough = |n: usize| n > 0 && (crowded || n >= RUN as usize);
    match ahead.keys.get(key) {
        Some(a) if ahead.on && ahead.freed_from_ahead && a.after == row && enough(a.rows.len()) => {
            let (ids, more) = a.rows.split_at((RUN as usize).min(a.rows.len()));
            Part::Known {
                key: key_ref,
                after: row,
                ids: ids.to_vec(),
                more: more.to_vec(),
            }
        }
        _ => Part::Key {
            key: key_ref,
            after: None,
            rows: RUN,
        },
    }
}

/// Keeps of `tails` those among the `room` keys that moved longest ago, by their last row
/// claimed (a tail's) or finished (`freed`'s, oldest first): the keys a crowded claim reads.
fn longest_still(tails: &mut Vec<&Tail>, freed: impl Iterator<Item = i64>, room: usize) {
    tails.sort_by_key(|t| t.row);
    let mut moved: Vec<i64> = tails.iter().map(|t| t.row).chain(freed).collect();
    moved.sort_unstable();
    if let Some(&newest) = moved.get(room.saturating_sub(1)) {
        tails.retain(|t| t.row <= newest);
    }
    tails.truncate(room);
}

/// How many keys a crowded claim of `req` reads: the keyed shares of its channels' budgets,
/// at most [`KEYS_PER_CLAIM`].
fn keyed_room(req: &ClaimRequest) -> usize {
    let budgets = req.budgets.iter().flat_map(|b| b.channels.iter());
    let room: u32 = budgets.map(|(_, n)| keyed_share(*n)).sum();
    (room as usize).clamp(1, KEYS_PER_CLAIM)
}

/// The most rows a claim takes of a key behind `tail`: what the relay asks for by the key's
/// pace, at least a [`RUN`] and at most [`LONGEST_RUN`] (docs/design.md, "Ordering keys: a
/// key's pace").
pub fn tail_run(tail: &Tail) -> u32 {
    tail.run.clamp(RUN, LONGEST_RUN)
}

/// The most rows a claim of `req` takes of any key: a [`RUN`], or more behind a tail whose
/// key goes quicker ([`tail_run`]). Each key's own part reads no more than its own.
pub fn longest_run(req: &ClaimRequest) -> u32 {
    req.tails.iter().map(tail_run).fold(RUN, u32::max)
}

/// The freed keys a claim may read, oldest first (by the row that freed them), at most
/// `room`: not those read behind their tails (`chained`), nor those known empty
/// behind the row that freed them. Oldest first, not in the keys' text order: a key sorting
/// late was left out of claim after claim while earlier ones kept being freed again, and its
/// next row waited for the full walk (docs/performance-log.md, 2026-12-06).
fn oldest_freed<'a>(
    chained: &HashSet<&str>,
    freed: &'a BTreeMap<String, i64>,
    ahead: &ReadAhead,
    now: Instant,
    room: usize,
) -> Vec<(i64, &'a String)> {
    if room == 0 {
        return Vec::new();
    }
    let mut oldest: Vec<(i64, &String)> = freed
        .iter()
        .filter(|(key, _)| !chained.contains(key.as_str()))
        .filter(|(key, row)| !ahead.empty_behind(key, **row, now))
        .map(|(key, row)| (*row, key))
        .collect();
    if oldest.len() > room {
        oldest.select_nth_unstable(room);
        oldest.truncate(room);
    }
    oldest.sort_unstable();
    oldest
}

#[cfg(test)]
mod tests;
