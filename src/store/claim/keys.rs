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

use super::choose::{Candidate, Choice};
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
pub fn key_parts(
    req: &ClaimRequest,
    freed: &BTreeMap<String, i64>,
    ahead: &ReadAhead,
    now: Instant,
) -> Vec<Part> {
    let tails: Vec<&Tail> = (req.tails.iter())
        .filter(|t| !ahead.empty_behind(&t.key, t.row, now))
        .take(KEYS_PER_CLAIM)
        .collect();
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
    let chained: HashSet<&str> = tails.iter().map(|t| t.key.as_str()).collect();
    parts.extend(
        oldest_freed(&chained, freed, ahead, now, KEYS_PER_CLAIM - tails.len())
            .into_iter()
            .map(|(row, key)| Part::Key {
                key: KeyRef {
                    key: key.clone(),
                    row,
                },
                after: None,
                rows: RUN,
            }),
    );
    parts
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
mod tests {
    use super::*;
    use crate::store::claim::choose::{self, KeyFate};
    use crate::store::claim::fixtures::{self, row};
    use crate::store::claim::plan::budgets;
    use crate::store::model::Tail;

    fn request(tail: i64) -> ClaimRequest {
        ClaimRequest {
            tails: vec![Tail {
                key: "k".into(),
                row: tail,
                channel: "hook".into(),
                run: 16,
            }],
            ..fixtures::request()
        }
    }

    /// The key part a claim offered the tail `tail` of key `k` reads.
    fn part(ahead: &ReadAhead, tail: i64) -> Part {
        let parts = key_parts(&request(tail), &BTreeMap::new(), ahead, Instant::now());
        assert_eq!(parts.len(), 1, "{parts:?}");
        parts[0].clone()
    }

    /// A claim that read key `k` behind tail 10, took 11 and 12, and read 13 and 14 ahead.
    fn took_two_of_four() -> Choice {
        Choice {
            keys: vec![(
                KeyRef {
                    key: "k".into(),
                    row: 10,
                },
                KeyFate::Taken,
            )],
            ahead: vec![choose::Ahead {
                key: "k".into(),
                took: vec![11, 12],
                after: Some(10),
                rows: vec![13, 14],
            }],
            ..Choice::default()
        }
    }

    /// A leader's claim takes the rows read ahead as they were read (with the channels they
    /// had), while they are fresh, behind the same tail, and every row's channel is known;
    /// otherwise it reads them by id.
    #[test]
    fn rows_read_ahead_are_taken_as_read_while_fresh() {
        let cand = |id: i64| Candidate {
            id,
            channel: Some(format!("ch{id}")),
            key: Some("k".into()),
            free: true,
            head: id == 11,
            last: false,
        };
        let read = Part::Key {
            key: KeyRef {
                key: "k".into(),
                row: 10,
            },
            after: Some(10),
            rows: RUN,
        };
        let mut ahead = ReadAhead::on();
        ahead.saw(&[(read, (11..=14).map(cand).collect())]);
        ahead.learn(&took_two_of_four(), &[row(11), row(12)]);
        let parts = [part(&ahead, 12)];
        let as_read = ahead.as_read(&parts, Instant::now()).expect("fresh rows");
        let expected = |id: i64| Candidate {
            head: true,
            ..cand(id)
        };
        assert_eq!(as_read, vec![(0, vec![expected(13), expected(14)])]);
        let later = Instant::now() + AS_READ_FOR;
        assert_eq!(ahead.as_read(&parts, later), None, "too old: read by id");
        // Behind another tail (the key's chain moved on): read from it.
        let moved = Part::Known {
            key: KeyRef {
                key: "k".into(),
                row: 14,
            },
            after: 14,
            ids: vec![15],
            more: vec![],
        };
        assert_eq!(ahead.as_read(&[moved], Instant::now()), None);
        // A row whose channel this store did not see: read by id.
        let mut ahead = ReadAhead::on();
        ahead.saw(&[(parts[0].clone(), vec![cand(13)])]);
        ahead.learn(&took_two_of_four(), &[row(11), row(12)]);
        assert_eq!(ahead.as_read(&parts, Instant::now()), None);
        // Nothing read ahead among the parts: nothing to take.
        assert_eq!(ReadAhead::on().as_read(&[], Instant::now()), None);
    }

    /// The rows read ahead of a key are read by id by the next claim, while the key's tail is
    /// the last row the claim got; a claim that did not get them all, or a tail that moved
    /// elsewhere, reads the key from its tail again, a whole run.
    #[test]
    fn rows_read_ahead_are_read_by_id_behind_the_same_tail() {
        let mut ahead = ReadAhead::on();
        ahead.learn(&took_two_of_four(), &[row(11), row(12)]);
        let known = Part::Known {
            key: KeyRef {
                key: "k".into(),
                row: 12,
            },
            after: 12,
            ids: vec![13, 14],
            more: vec![],
        };
        assert_eq!(part(&ahead, 12), known);
        let whole_run = |p: Part| matches!(p, Part::Key { rows: RUN, .. });
        assert!(whole_run(part(&ahead, 11)), "another tail: read from it");
        // The claim got 11 but not 12: 13 may not be right behind the tail.
        let mut ahead = ReadAhead::on();
        ahead.learn(&took_two_of_four(), &[row(11)]);
        assert!(whole_run(part(&ahead, 11)));
        // A later claim that read the key and found nothing ahead forgets what was.
        let mut ahead = ReadAhead::on();
        ahead.learn(&took_two_of_four(), &[row(11), row(12)]);
        let done = Choice {
            keys: vec![(
                KeyRef {
                    key: "k".into(),
                    row: 12,
                },
                KeyFate::Done,
            )],
            ..Choice::default()
        };
        ahead.learn(&done, &[]);
        assert!(whole_run(part(&ahead, 12)));
        // Not reading ahead: nothing learnt, nothing read by id.
        let mut off = ReadAhead::default();
        off.learn(&took_two_of_four(), &[row(11), row(12)]);
        assert!(matches!(part(&off, 12), Part::Key { .. }));
    }

    /// A claim that read key `k` behind tail 10 and found no row at all.
    fn empty_behind_ten() -> Choice {
        let key = KeyRef {
            key: "k".into(),
            row: 10,
        };
        let read = vec![(
            Part::Key {
                key,
                after: Some(10),
                rows: RUN,
            },
            vec![],
        )];
        choose::choose(&read, &budgets(&fixtures::request()), RUN)
    }

    /// A key read as empty behind its tail is not read again behind that tail, nor from its
    /// first row once that tail frees it, for [`EMPTY_FOR`]; then, or once a window reads a
    /// row of it, or behind another tail, it is.
    #[test]
    fn a_key_read_as_empty_behind_its_tail_is_not_read_again_for_a_while() {
        let mut ahead = ReadAhead::on();
        ahead.learn(&empty_behind_ten(), &[]);
        let now = Instant::now();
        let parts = |ahead: &ReadAhead, tail: i64, now: Instant| {
            key_parts(&request(tail), &BTreeMap::new(), ahead, now).len()
        };
        let freed_by = |ahead: &ReadAhead, row: i64| {
            let freed = BTreeMap::from([("k".to_string(), row)]);
            key_parts(&fixtures::request(), &freed, ahead, now).len()
        };
        assert_eq!(parts(&ahead, 10, now), 0, "in flight: not read");
        assert_eq!(parts(&ahead, 12, now), 1, "another tail: read");
        assert_eq!(
            freed_by(&ReadAhead::on(), 10),
            1,
            "freed, nothing known: read"
        );
        assert_eq!(freed_by(&ahead, 10), 0, "freed by 10: not read");
        assert_eq!(freed_by(&ahead, 12), 1, "freed by another row: read");
        assert_eq!(parts(&ahead, 10, now + EMPTY_FOR), 1, "read again later");
        // A window read a row of `k` (a row passed behind the tail, or one that came since).
        let seen = Candidate {
            id: 20,
            channel: Some("hook".into()),
            key: Some("k".into()),
            free: true,
            head: false,
            last: false,
        };
        let window = Part::Window {
            channel: "hook".into(),
            from: None,
            rows: 10,
            newest: false,
            sweep: false,
        };
        ahead.saw(&[(window, vec![seen])]);
        assert_eq!(parts(&ahead, 10, now), 1, "a window saw a row: read");
        // Not reading ahead: every key is read.
        let mut off = ReadAhead::default();
        off.learn(&empty_behind_ten(), &[]);
        assert_eq!(parts(&off, 10, now), 1);
        // A window took 10 as its key's only unfinished row: once the claim got it, the key
        // is empty behind its new tail.
        let alone = Choice {
            ahead: vec![choose::Ahead {
                key: "k".into(),
                took: vec![10],
                after: None,
                rows: vec![],
            }],
            ..Choice::default()
        };
        let mut ahead = ReadAhead::on();
        ahead.learn(&alone, &[]);
        assert_eq!(parts(&ahead, 10, Instant::now()), 1, "not got: read");
        ahead.learn(&alone, &[row(10)]);
        assert_eq!(parts(&ahead, 10, Instant::now()), 0, "got: not read");
    }

    /// More keys known empty than [`AHEAD_REMEMBERED`] (a key per row: every row a window
    /// takes is its key's only one) are kept while fresh, though no claim offers their tails
    /// (their rows are freeing them), so that the claim after skips them as freed; pruned once
    /// older than [`EMPTY_FOR`].
    #[test]
    fn keys_known_empty_outlive_the_pruning_while_fresh() {
        let n = AHEAD_REMEMBERED as i64 * 3;
        let alone = |keys: std::ops::Range<i64>| {
            let choice = Choice {
                ahead: keys
                    .clone()
                    .map(|i| choose::Ahead {
                        key: format!("k{i}"),
                        took: vec![i],
                        after: None,
                        rows: vec![],
                    })
                    .collect(),
                ..Choice::default()
            };
            (choice, keys.map(row).collect::<Vec<ClaimedRow>>())
        };
        let mut ahead = ReadAhead::on();
        let (choice, claimed) = alone(0..n);
        ahead.learn(&choice, &claimed);
        let now = Instant::now();
        // Every key's row finished: freed by it, no tail offered.
        let freed: BTreeMap<String, i64> = (0..n).map(|i| (format!("k{i}"), i)).collect();
        let req = fixtures::request();
        ahead.forget_beyond(&req, now);
        assert_eq!(ahead.keys.len(), n as usize, "fresh: kept");
        assert_eq!(
            key_parts(&req, &freed, &ahead, now),
            vec![],
            "all known empty"
        );
        // Past twice what was kept, the stale ones go.
        let (choice, claimed) = alone(n..n * 5);
        ahead.learn(&choice, &claimed);
        ahead.forget_beyond(&req, now + EMPTY_FOR * 2);
        assert!(ahead.keys.is_empty(), "stale: pruned");
        assert_eq!(key_parts(&req, &freed, &ahead, now).len(), KEYS_PER_CLAIM);
    }

    /// Freed keys are read oldest first (by the row that freed them), not in their text's
    /// order, after the tails, up to [`KEYS_PER_CLAIM`] parts in all; a key read behind its
    /// tail is not read again as freed.
    #[test]
    fn freed_keys_are_read_oldest_first_after_the_tails() {
        // 300 freed keys whose text order is the reverse of their age: "k000" freed last.
        let freed: BTreeMap<String, i64> =
            (0..300).map(|i| (format!("k{i:03}"), 10_000 - i)).collect();
        let mut req = request(5);
        req.tails[0].key = "k299".into();
        let parts = key_parts(&req, &freed, &ReadAhead::default(), Instant::now());
        assert_eq!(parts.len(), KEYS_PER_CLAIM);
        let read: Vec<(&str, Option<i64>)> = parts
            .iter()
            .map(|p| match p {
                Part::Key { key, after, .. } => (key.key.as_str(), *after),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(read[0], ("k299", Some(5)), "the tail first");
        // Then the oldest: k298 (freed by row 9,702), k297, ...; k299 not twice.
        let expected: Vec<String> = (172..299).rev().map(|i| format!("k{i:03}")).collect();
        let freed_read: Vec<&str> = read[1..].iter().map(|(k, _)| *k).collect();
        assert_eq!(freed_read, expected);
        assert!(read[1..].iter().all(|(_, after)| after.is_none()));
    }
}
