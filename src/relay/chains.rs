//! Ordering keys' chains (docs/design.md, "Ordering keys: chains"): a key's runs claimed one
//! after another while the earlier ones are still in flight, each sent only once the run
//! before it was delivered whole.
//!
//! A claim may take a key's rows right behind the last row of it this relay has in flight
//! (the key's *tail*, offered to the claim by [`Chains::tails`]); the database takes them only
//! while this claimer holds that tail under a live claim. The relay keeps, per key, the last
//! run it handed out; a new run of the key goes behind it ([`Chains::join`]) and waits for its
//! outcome: delivered whole, the new run is sent; stopped (a row failed, was given back, or its
//! task ended without a word), the new run goes back to the table unsent. So a key's rows leave
//! the relay in id order across claims as within one, and a key moves at the speed its
//! receiver accepts rows, not at one run per result write and claim round.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, watch};

use crate::store::Tail;

/// A run of a key that is not known to go quicker (`budget::key_run`): 16 rows, the store's
/// run. A chain two such runs deep keeps its key sending through a claim or two
/// without claiming far ahead of its receiver (with one, drains of 20 keys of 2,500 rows went
/// at 0.84x: docs/performance-log.md, "Chains two runs deep").
pub const RUN: usize = super::budget::SHORTEST_KEY_RUN;

/// A chain's rows handed out and not yet sent (or given back), and below how many of them
/// it wakes the claim loop (as of when it was last extended).
struct Unsent {
    rows: AtomicUsize,
    wake_below: AtomicUsize,
}

/// How a run ended, for the run behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Still sending (or waiting for the run before it).
    Running,
    /// Every row of it (and of the runs before it) was delivered.
    Delivered,
    /// A row of it (or of a run before it) was not delivered: the rows behind go back unsent.
    Stopped,
}

/// A run's place in its key's chain.
pub struct Place {
    /// The outcome of the run before it, if one was handed out.
    before: Option<watch::Receiver<Outcome>>,
    /// Its own outcome, for the run behind it.
    done: watch::Sender<Outcome>,
    /// The chain's rows handed out and not yet sent (or given back).
    unsent: Arc<Unsent>,
    /// The claim loop's wake-up.
    wake: Arc<Notify>,
}

impl Place {
    /// Waits for the run before this one; whether it was delivered whole (true without one).
    pub async fn may_send(&mut self) -> bool {
        let Some(before) = self.before.as_mut() else {
            return true;
        };
        loop {
            match outcome(before) {
                Outcome::Delivered => return true,
                Outcome::Stopped => return false,
                Outcome::Running => {
                    if before.changed().await.is_err() {
                        return false;
                    }
                }
            }
        }
    }

    /// One row of the run leaves the chain (sent, or given back). When the chain falls below
    /// a run's worth of unsent rows (its key's run when it was last extended) the claim loop
    /// is woken to extend it ([`Chains::tails`]): left to wake at the next result
    /// written, a key's next run was claimed after its last run had gone out, and a hot key
    /// stood still between runs for most of its time (docs/design.md, "Ordering keys:
    /// chains"). Woken at its depth instead, a key whose claims took a run at a time never
    /// reached it, and was never woken for.
    pub fn row_left(&self) {
        let before = self.unsent.rows.fetch_sub(1, Ordering::Relaxed);
        if before == self.unsent.wake_below.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }

    /// The run ended: delivered whole, or not.
    pub fn end(self, delivered: bool) {
        let outcome = if delivered {
            Outcome::Delivered
        } else {
            Outcome::Stopped
        };
        // No receiver left is fine: no run was handed out behind this one.
        let _ = self.done.send(outcome);
    }
}

/// The last run of a key, as the chain keeps it.
struct Link {
    tail: i64,
    channel: String,
    done: watch::Receiver<Outcome>,
    unsent: Arc<Unsent>,
}

/// The relay loop's chains, per ordering key.
#[derive(Default)]
pub struct Chains {
    links: HashMap<String, Link>,
    /// The claim loop's wake-up, for chains that may be extended again.
    wake: Arc<Notify>,
}

impl Chains {
    /// Chains whose keys, once they may be extended again, wake the claim loop by `wake`.
    pub fn new(wake: Arc<Notify>) -> Chains {
        Chains {
            links: HashMap::new(),
            wake,
        }
    }

    /// The keys whose last run is still running and whose chain holds fewer unsent rows than
    /// two of their runs (`run`, by channel, at least [`RUN`]), those with the fewest first,
    /// each with the run a claim may take behind it: what a claim may extend. Chains that
    /// ended are forgotten here (their keys' next rows are heads again once the results are
    /// written).
    pub fn tails(&mut self, run: impl Fn(&str) -> usize) -> Vec<Tail> {
        self.links
            .retain(|_, l| outcome(&l.done) == Outcome::Running);
        let mut open: Vec<(usize, Tail)> = self
            .links
            .iter()
            .filter_map(|(key, l)| {
                let unsent = l.unsent.rows.load(Ordering::Relaxed);
                let run = run(&l.channel).max(RUN);
                let tail = Tail {
                    key: key.clone(),
                    row: l.tail,
                    channel: l.channel.clone(),
                    run: u32::try_from(run).unwrap_or(u32::MAX),
                };
                (unsent < 2 * run).then_some((unsent, tail))
            })
            .collect();
        open.sort_by_key(|(unsent, t)| (*unsent, t.row));
        open.into_iter().map(|(_, t)| t).collect()
    }

    /// A run of `rows` rows of `key`, the last being `tail` (of `channel`), goes at the end of
    /// the key's chain: it waits for the run handed out before it, if that one has not ended.
    /// The chain wakes the claim loop below `run` unsent rows (see [`wake_below`]).
    pub fn join(
        &mut self,
        key: String,
        channel: &str,
        tail: i64,
        rows: usize,
        run: usize,
    ) -> Place {
        let (done, rx) = watch::channel(Outcome::Running);
        let before = self.links.get(&key);
        let unsent = match before {
            Some(l) if outcome(&l.done) == Outcome::Running => l.unsent.clone(),
            _ => Arc::new(Unsent {
                rows: AtomicUsize::new(0),
                wake_below: AtomicUsize::new(0),
            }),
        };
        let after = unsent.rows.fetch_add(rows, Ordering::Relaxed) + rows;
        let wake = wake_below(run.max(RUN), after);
        unsent.wake_below.store(wake, Ordering::Relaxed);
        let before = before.map(|l| l.done.clone());
        let link = Link {
            tail,
            channel: channel.to_string(),
            done: rx,
            unsent: unsent.clone(),
        };
        self.links.insert(key, link);
        Place {
            before,
            done,
            unsent,
            wake: self.wake.clone(),
        }
    }

    /// Whether any chain is still running.
    pub fn any_running(&self) -> bool {
        self.links
            .values()
            .any(|l| outcome(&l.done) == Outcome::Running)
    }
}

/// Below how many unsent rows a chain of `unsent` rows wakes the claim loop: its `run`, or
/// at once (its first row to leave) if it holds less than that but at least a [`RUN`]; a
/// chain of fewer never wakes it (a key whose claim took so few rows likely has no more).
/// Woken only below a run of 64, a key whose claims took 16 rows (a freed key's first run)
/// was never woken for, and went a run of 16, a result write and a claim at a time.
fn wake_below(run: usize, unsent: usize) -> usize {
    if unsent < RUN { 0 } else { run.min(unsent) }
}

/// A run's outcome as its receiver sees it: a run whose task ended without a word (aborted)
/// stopped.
fn outcome(rx: &watch::Receiver<Outcome>) -> Outcome {
    match *rx.borrow() {
        Outcome::Running if rx.has_changed().is_err() => Outcome::Stopped,
        o => o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every channel at the run of a key not known to go quicker.
    fn slow(_: &str) -> usize {
        RUN
    }

    #[tokio::test]
    async fn a_run_waits_for_the_one_before_and_follows_its_outcome() {
        let mut chains = Chains::default();
        let first = chains.join("k".into(), "a", 3, 2, RUN);
        let mut second = chains.join("k".into(), "a", 5, 2, RUN);
        assert_eq!(
            chains.tails(slow),
            [Tail {
                key: "k".into(),
                row: 5,
                channel: "a".into(),
                run: 16,
            }],
            "the key is offered from its last row in flight"
        );
        let waiting = tokio::spawn(async move { second.may_send().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the second run waits for the first");
        first.end(true);
        assert!(waiting.await.unwrap(), "the first was delivered: send");

        let stopped = chains.join("j".into(), "a", 7, 1, RUN);
        let mut behind = chains.join("j".into(), "a", 8, 1, RUN);
        stopped.end(false);
        assert!(
            !behind.may_send().await,
            "the run before stopped: give back"
        );
    }

    #[tokio::test]
    async fn an_aborted_run_counts_as_stopped_and_ended_chains_are_forgotten() {
        let mut chains = Chains::default();
        let lost = chains.join("k".into(), "a", 1, 1, RUN);
        let mut behind = chains.join("k".into(), "a", 2, 1, RUN);
        drop(lost);
        assert!(!behind.may_send().await);
        behind.end(true);
        assert!(chains.tails(slow).is_empty(), "the key's last run ended");
        assert!(!chains.any_running());
    }

    /// Whether `wake` is notified within 50 ms.
    async fn woken(wake: &Notify) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(50), wake.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_chain_that_may_be_extended_again_wakes_the_claim_loop() {
        let wake = Arc::new(Notify::new());
        let mut chains = Chains::new(wake.clone());
        let place = chains.join("k".into(), "a", 40, RUN + 1, RUN);
        place.row_left();
        assert!(
            !woken(&wake).await,
            "a run's worth still unsent: no wake-up"
        );
        place.row_left();
        assert!(
            woken(&wake).await,
            "less than a run unsent: woken to extend it"
        );
        assert_eq!(chains.tails(slow).len(), 1);
        place.row_left();
        assert!(!woken(&wake).await, "woken once, when it crossed");
    }

    #[tokio::test]
    async fn a_quick_keys_chain_wakes_the_claim_loop_a_longer_run_ahead() {
        let wake = Arc::new(Notify::new());
        let mut chains = Chains::new(wake.clone());
        let first = chains.join("k".into(), "a", 1, 1, 64);
        let place = chains.join("k".into(), "a", 70, 64, 64);
        first.row_left();
        assert!(!woken(&wake).await, "a run of 64 still unsent");
        place.row_left();
        assert!(woken(&wake).await, "fewer than a run of 64 unsent: woken");

        let freed = chains.join("j".into(), "a", 90, RUN, 64);
        freed.row_left();
        assert!(
            woken(&wake).await,
            "a run of 16 is below 64 already: woken at once"
        );
        let short = chains.join("i".into(), "a", 95, RUN - 1, 64);
        short.row_left();
        assert!(
            !woken(&wake).await,
            "fewer than 16: likely nothing more of its key"
        );
    }

    #[test]
    fn a_chain_is_offered_while_it_holds_fewer_than_two_of_its_runs() {
        let mut chains = Chains::default();
        let run = |channel: &str| if channel == "quick" { 64 } else { 4 };
        let _q = chains.join("q".into(), "quick", 10, 127, 64);
        let _s = chains.join("s".into(), "slow", 20, 31, RUN);
        let offered: HashMap<String, u32> = (chains.tails(run).into_iter())
            .map(|t| (t.key, t.run))
            .collect();
        assert_eq!(offered["q"], 64, "a quick key's run");
        assert_eq!(offered["s"], 16, "never less than a run of 16");
        let _q = chains.join("q".into(), "quick", 11, 1, 64);
        let _s = chains.join("s".into(), "slow", 21, 1, RUN);
        assert!(chains.tails(run).is_empty(), "128 and 32 rows unsent");
    }

    #[test]
    fn a_deep_chain_is_not_offered() {
        let mut chains = Chains::default();
        let place = chains.join("deep".into(), "a", 40, 2 * RUN, RUN);
        let _short = chains.join("short".into(), "a", 50, 1, RUN);
        let keys: Vec<String> = chains.tails(slow).into_iter().map(|t| t.key).collect();
        assert_eq!(keys, ["short"]);
        for _ in 0..2 * RUN {
            place.row_left();
        }
        assert_eq!(chains.tails(slow).len(), 2);
    }
}
