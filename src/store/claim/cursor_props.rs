//! The floors against a model table (docs/design.md, "Claims", "Floors"): random inserts,
//! claims, completions, retries coming due and another instance's claims, with the full walk
//! and the commit grace driven by hand. The model computes each claim's picks from the floors
//! exactly as the SQL does (the lowest claimable ids above the floor, the newest share from the
//! top), and checks, at every claim that uses floors:
//!
//! every claimable row at or below its channel's floor is *excused*: it became claimable, since
//! the last full walk could have taken it, by one of the events the design leaves to the full
//! walk (a retry's backoff ending, another instance's claim expiring or its keyed row
//! finishing). A row this store gave back, or that follows a keyed row this store finished, or
//! that was simply never claimed, is never below a floor. At a full walk the excused rows are
//! forgiven as far as that walk's budget reached, so none waits past a full-walk period longer
//! than the budget makes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::sink::Delivery;
use crate::store::claim::plan::newest_share;

const CHANNELS: [&str; 2] = ["a", "b"];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Where {
    /// PENDING or RETRY, due.
    Due,
    /// RETRY (or given back with a delay), not yet due.
    Waiting,
    /// Claimed by this store.
    Ours,
    /// Claimed by another instance.
    Theirs,
    Finished,
}

#[derive(Debug)]
struct Row {
    channel: &'static str,
    key: Option<u8>,
    at: Where,
}

#[derive(Debug, Clone)]
enum Step {
    Insert {
        channel: usize,
        key: Option<u8>,
    },
    Claim {
        budget: u32,
        newest: bool,
        full_walk: bool,
        /// A result written while the claim runs (after its statement looked, before the
        /// store records what it returned).
        meanwhile: Option<(usize, How)>,
    },
    Complete {
        pick: usize,
        how: How,
    },
    /// A retry's backoff ends.
    ComeDue {
        pick: usize,
    },
    /// Another instance claims a due row; later its claim expires or it finishes the row.
    TheirClaim {
        pick: usize,
    },
    TheirEnd {
        pick: usize,
        finished: bool,
    },
    /// COMMIT_GRACE passes.
    Grace,
}

#[derive(Debug, Clone, Copy)]
enum How {
    Success,
    Retry,
    Fail,
    GiveBack,
    GiveBackLater,
}

fn how() -> impl Strategy<Value = How> {
    prop_oneof![
        Just(How::Success),
        Just(How::Retry),
        Just(How::Fail),
        Just(How::GiveBack),
        Just(How::GiveBackLater)
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..CHANNELS.len(), prop::option::weighted(0.5, 0u8..3))
            .prop_map(|(channel, key)| Step::Insert { channel, key }),
        4 => (1u32..=10, any::<bool>(), prop::bool::weighted(0.15),
              prop::option::weighted(0.2, (any::<usize>(), how())))
            .prop_map(|(budget, newest, full_walk, meanwhile)| Step::Claim {
                budget, newest, full_walk, meanwhile,
            }),
        4 => (any::<usize>(), how()).prop_map(|(pick, how)| Step::Complete { pick, how }),
        1 => any::<usize>().prop_map(|pick| Step::ComeDue { pick }),
        1 => any::<usize>().prop_map(|pick| Step::TheirClaim { pick }),
        1 => (any::<usize>(), any::<bool>())
            .prop_map(|(pick, finished)| Step::TheirEnd { pick, finished }),
        1 => Just(Step::Grace),
    ]
}

#[derive(Default)]
struct Model {
    rows: BTreeMap<i64, Row>,
    /// Claimable rows a floor may skip until a full walk reaches them.
    excused: BTreeSet<i64>,
}

impl Model {
    fn claimable(&self, id: i64) -> bool {
        let Some(r) = self.rows.get(&id) else {
            return false;
        };
        r.at == Where::Due
            && r.key.is_none_or(|k| {
                !self
                    .rows
                    .range(..id)
                    .any(|(_, p)| p.key == Some(k) && p.at != Where::Finished)
            })
    }

    fn claimable_of(&self, channel: &str) -> Vec<i64> {
        self.rows
            .iter()
            .filter(|(id, r)| r.channel == channel && self.claimable(**id))
            .map(|(id, _)| *id)
            .collect()
    }

    fn ids_where(&self, at: Where) -> Vec<i64> {
        self.rows
            .iter()
            .filter(|(_, r)| r.at == at)
            .map(|(id, _)| *id)
            .collect()
    }

    /// A row of another instance finished or stopped being claimed: what it made claimable
    /// (itself, or the next row of its key) is the full walk's to find.
    fn excuse_after(&mut self, id: i64) {
        let key = self.rows.get(&id).and_then(|r| r.key);
        let candidates: Vec<i64> = self
            .rows
            .range(id..)
            .filter(|(i, r)| **i == id || (key.is_some() && r.key == key))
            .map(|(i, _)| *i)
            .collect();
        for c in candidates {
            if self.claimable(c) {
                self.excused.insert(c);
            }
        }
    }
}

fn claimed_row(id: i64, r: &Row) -> ClaimedRow {
    ClaimedRow {
        delivery: Delivery {
            id,
            channel: r.channel.into(),
            recipient: None,
            payload: "{}".into(),
            attempts: 0,
        },
        ordering_key: r.key.map(|k| format!("k{k}")),
        age_at_claim: Duration::ZERO,
        undeliverable: None,
    }
}

fn resolution(how: How) -> Resolution {
    match how {
        How::Success => Resolution::Delivered,
        How::Retry => Resolution::Retry {
            delay: Duration::from_secs(1),
            error: "503".into(),
        },
        How::Fail => Resolution::Failed {
            error: "400".into(),
        },
        How::GiveBack => Resolution::Release {
            delay: Duration::ZERO,
            error: None,
        },
        How::GiveBackLater => Resolution::Release {
            delay: Duration::from_secs(5),
            error: None,
        },
    }
}

/// This store finishes one of `ours`.
fn complete(model: &mut Model, cursors: &Cursors, ours: &[i64], pick: usize, how: How) {
    if ours.is_empty() {
        return;
    }
    let id = ours[pick % ours.len()];
    if let Some(r) = model.rows.get_mut(&id) {
        r.at = match how {
            How::Success | How::Fail => Where::Finished,
            How::Retry | How::GiveBackLater => Where::Waiting,
            How::GiveBack => Where::Due,
        };
    }
    cursors.completed(&[Completion {
        id,
        token: Arc::from("t"),
        resolution: resolution(how),
    }]);
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let cursors = Cursors::default();
    let mut model = Model::default();
    let mut next_id = 1;
    for step in steps {
        match step {
            Step::Insert { channel, key } => {
                model.rows.insert(
                    next_id,
                    Row {
                        channel: CHANNELS[channel],
                        key,
                        at: Where::Due,
                    },
                );
                next_id += 1;
            }
            Step::Claim {
                budget,
                newest,
                full_walk,
                meanwhile,
            } => {
                // The full walk is due when its period has passed since the last one, or a
                // retry of this store's comes due (those walks are the unit tests'; here the
                // model's retries come due when `ComeDue` says, so they are forgotten).
                {
                    let mut s = cursors.lock();
                    let every = s.walk_every;
                    s.last_full_walk = Some(if full_walk {
                        Instant::now() - every
                    } else {
                        Instant::now()
                    });
                    s.due.clear();
                }
                // Only rows of earlier claims can finish while this one runs: the relay has
                // this claim's rows only once the store has recorded them.
                let earlier = model.ids_where(Where::Ours);
                let floors = cursors.plan();
                prop_assert_eq!(floors.is_empty() && full_walk, full_walk);
                if !full_walk {
                    for c in CHANNELS {
                        let Some(&floor) = floors.get(c) else {
                            continue;
                        };
                        for id in model.claimable_of(c) {
                            prop_assert!(
                                id > floor || model.excused.contains(&id),
                                "row {id} of {c} is claimable, below the floor {floor}, and \
                                 not excused; rows {:?}, excused {:?}",
                                model.rows,
                                model.excused
                            );
                        }
                    }
                }
                // The picks, as the SQL makes them: per channel the lowest claimable rows
                // above the floor, and a newest share from the top, each row once.
                let newest_n = newest_share(budget, newest);
                let mut got = BTreeSet::new();
                for c in CHANNELS {
                    let all = model.claimable_of(c);
                    let floor = floors.get(c).copied();
                    let oldest: Vec<i64> = all
                        .iter()
                        .copied()
                        .filter(|id| floor.is_none_or(|f| *id > f))
                        .take((budget - newest_n) as usize)
                        .collect();
                    if full_walk && oldest.len() == (budget - newest_n) as usize {
                        // Forgiven up to where the walk's budget reached.
                        if let Some(&last) = oldest.last() {
                            let reached: Vec<i64> =
                                all.iter().copied().filter(|id| *id <= last).collect();
                            for id in reached {
                                model.excused.remove(&id);
                            }
                        }
                    } else if full_walk {
                        for id in &all {
                            model.excused.remove(id);
                        }
                    }
                    got.extend(oldest);
                    got.extend(all.iter().rev().take(newest_n as usize).copied());
                }
                let rows: Vec<ClaimedRow> = got
                    .iter()
                    .filter_map(|id| model.rows.get(id).map(|r| claimed_row(*id, r)))
                    .collect();
                for id in &got {
                    if let Some(r) = model.rows.get_mut(id) {
                        r.at = Where::Ours;
                    }
                    model.excused.remove(id);
                }
                if let Some((pick, how)) = meanwhile {
                    complete(&mut model, &cursors, &earlier, pick, how);
                }
                let picked: Vec<(&str, u32, u32)> =
                    CHANNELS.iter().map(|c| (*c, budget, newest_n)).collect();
                cursors.claimed(&picked, &rows);
            }
            Step::Complete { pick, how } => {
                let ours = model.ids_where(Where::Ours);
                complete(&mut model, &cursors, &ours, pick, how);
            }
            Step::ComeDue { pick } => {
                let waiting = model.ids_where(Where::Waiting);
                if let Some(&id) = waiting.get(pick % waiting.len().max(1)) {
                    if let Some(r) = model.rows.get_mut(&id) {
                        r.at = Where::Due;
                    }
                    model.excuse_after(id);
                }
            }
            Step::TheirClaim { pick } => {
                let due: Vec<i64> = model
                    .rows
                    .keys()
                    .copied()
                    .filter(|id| model.claimable(*id))
                    .collect();
                if let Some(&id) = due.get(pick % due.len().max(1)) {
                    if let Some(r) = model.rows.get_mut(&id) {
                        r.at = Where::Theirs;
                    }
                    model.excused.remove(&id);
                }
            }
            Step::TheirEnd { pick, finished } => {
                let theirs = model.ids_where(Where::Theirs);
                if let Some(&id) = theirs.get(pick % theirs.len().max(1)) {
                    if let Some(r) = model.rows.get_mut(&id) {
                        r.at = if finished {
                            Where::Finished
                        } else {
                            Where::Due
                        };
                    }
                    model.excuse_after(id);
                }
            }
            Step::Grace => {
                let mut s = cursors.lock();
                for c in s.channels.values_mut() {
                    for (at, _) in c.settling.iter_mut() {
                        *at -= COMMIT_GRACE;
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_floor_skips_only_rows_the_full_walk_is_there_for(
        steps in prop::collection::vec(step(), 1..120),
    ) {
        run(steps)?;
    }
}
