//! Which ordering keys a claim reads, and how (docs/design.md, "Ordering keys: chains", "Ordering
//! keys: rows read ahead"): the keys with rows in flight at the relay from behind their tails,
//! then the keys this store freed from their first unfinished row; where the database reads
//! ahead, a key in flight whose next rows an earlier claim read behind that very tail by id.
//!
//! Guarantees: at most [`KEYS_PER_CLAIM`] keys a claim, each part bounded by a run; rows read
//! ahead are only candidates (the claim statement checks each as any other), forgotten as soon
//! as a claim of the key does not get every row it took or the tail moves elsewhere.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::RUN;
use super::choose::Choice;
use super::plan::{KeyRef, Part};
use crate::store::model::{ClaimRequest, ClaimedRow};

/// How many keys one claim reads (each is one bounded part of its read).
const KEYS_PER_CLAIM: usize = 128;
/// How many keys' rows read ahead are remembered before those of keys no longer offered are
/// forgotten.
const AHEAD_REMEMBERED: usize = 1_024;

/// A key's next rows read ahead: the rows right behind `after`, the key's last row in flight
/// when they were read, in id order.
#[derive(Debug, Clone)]
struct Ahead {
    after: i64,
    rows: Vec<i64>,
}

/// The rows read ahead, per key with rows in flight; nothing unless [`ReadAhead::on`].
#[derive(Debug, Default)]
pub struct ReadAhead {
    on: bool,
    keys: HashMap<String, Ahead>,
}

impl ReadAhead {
    /// Reading ahead (`ClaimSql::reads_ahead`).
    pub fn on() -> ReadAhead {
        ReadAhead {
            on: true,
            keys: HashMap::new(),
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
            self.keys.insert(a.key.clone(), Ahead { after, rows });
        }
    }

    /// Keeps what is read ahead to [`AHEAD_REMEMBERED`] keys: past it, only keys `req` offers
    /// tails of (a chain that ended leaves its key's entry behind).
    pub fn forget_beyond(&mut self, req: &ClaimRequest) {
        if self.keys.len() > AHEAD_REMEMBERED {
            let offered: HashSet<&str> = req.tails.iter().map(|t| t.key.as_str()).collect();
            self.keys.retain(|k, _| offered.contains(k.as_str()));
        }
    }
}

/// The parts that read ordering keys, at most [`KEYS_PER_CLAIM`]: first the keys with rows in
/// flight at the relay, from behind their tails ([`ClaimRequest::tails`]), each read for a
/// fair share of the budget (a claim takes them breadth first); then the freed keys without
/// rows in flight, from their first unfinished row, for a whole run.
pub fn key_parts(
    req: &ClaimRequest,
    freed: &BTreeMap<String, i64>,
    ahead: &ReadAhead,
) -> Vec<Part> {
    let tails = &req.tails[..req.tails.len().min(KEYS_PER_CLAIM)];
    let total = req.budgets.as_ref().map_or(req.limit, |b| b.total());
    let share = (total / u32::try_from(tails.len()).unwrap_or(u32::MAX).max(1)).saturating_mul(2);
    let share = share.clamp(2, RUN);
    let mut parts: Vec<Part> = tails
        .iter()
        .map(|t| {
            let key = KeyRef {
                key: t.key.clone(),
                row: t.row,
            };
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
                    rows: RUN,
                },
            }
        })
        .collect();
    let chained: HashSet<&str> = tails.iter().map(|t| t.key.as_str()).collect();
    parts.extend(
        freed
            .iter()
            .filter(|(key, _)| !chained.contains(key.as_str()))
            .take(KEYS_PER_CLAIM - tails.len())
            .map(|(key, row)| Part::Key {
                key: KeyRef {
                    key: key.clone(),
                    row: *row,
                },
                after: None,
                rows: RUN,
            }),
    );
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::claim::choose::{self, KeyFate};
    use crate::store::claim::fixtures::{self, row};
    use crate::store::model::Tail;

    fn request(tail: i64) -> ClaimRequest {
        ClaimRequest {
            tails: vec![Tail {
                key: "k".into(),
                row: tail,
                channel: "hook".into(),
            }],
            ..fixtures::request()
        }
    }

    /// The key part a claim offered the tail `tail` of key `k` reads.
    fn part(ahead: &ReadAhead, tail: i64) -> Part {
        let parts = key_parts(&request(tail), &BTreeMap::new(), ahead);
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
}
