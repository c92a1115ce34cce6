//! The claim rule (G1, G2; docs/design.md, "What is claimable") stated once, over rows in
//! memory: a row may be claimed when it is unfinished, due, under no live claim, and every
//! earlier unfinished row of its ordering key is taken by the same claim, or the nearest of
//! them not taken is a tail the claimer offered and holds under a live claim; a result is
//! written only under the token of the row's last claim.
//!
//! The relay never runs this. It is the model the tests share: the relay loop's unit tests
//! run on a queue made of it, and tests/it/claim_rule.rs checks every database's claim
//! against it, step by step. Kept beside the SQL it models, so that a change of the rule is
//! made in both places at once.

use std::collections::BTreeMap;
use std::ops::Add;
use std::sync::Arc;
use std::time::Duration;

use super::super::model::{Budgets, Resolution};
use super::super::sql::State;

/// One row of the model.
#[derive(Debug, Clone)]
pub struct RuleRow<T> {
    pub channel: String,
    pub key: Option<String>,
    pub state: State,
    pub attempts: u32,
    /// Not claimable before this.
    pub due: T,
    /// The token of the row's last claim: its result is written under it, live or not (an
    /// expired claim nobody took since still owns the row's result).
    pub claim: Option<Arc<str>>,
    /// Whether that claim is live (not run out, not finished).
    pub live: bool,
    /// Parked: its result was refused for good, and no claim takes it again.
    pub parked: bool,
}

impl<T> RuleRow<T> {
    /// PENDING or RETRY.
    pub fn open(&self) -> bool {
        matches!(self.state, State::Pending | State::Retry)
    }
}

/// The rows, by id, with times of type `T` (a paused tokio clock's, or the wall clock's).
#[derive(Debug)]
pub struct RuleTable<T> {
    pub rows: BTreeMap<i64, RuleRow<T>>,
}

impl<T> Default for RuleTable<T> {
    fn default() -> Self {
        RuleTable {
            rows: BTreeMap::new(),
        }
    }
}

impl<T: Ord + Copy + Add<Duration, Output = T>> RuleTable<T> {
    /// Adds row `id` in `state` (attempted once if RETRY), due at `due`.
    pub fn insert(&mut self, id: i64, channel: &str, key: Option<&str>, state: State, due: T) {
        let row = RuleRow {
            channel: channel.to_string(),
            key: key.map(str::to_string),
            state,
            attempts: u32::from(state == State::Retry),
            due,
            claim: None,
            live: false,
            parked: false,
        };
        self.rows.insert(id, row);
    }

    /// Whether row `id` may be taken at `now` by a claim of the rows `with`.
    pub fn claimable(&self, id: i64, with: &[i64], now: T) -> bool {
        self.claimable_behind(id, with, &[], &|_| false, now)
    }

    /// Whether row `id` may be taken at `now` by a claim of the rows `with` whose claimer
    /// offers `tails` (docs/design.md, "Ordering keys: chains") and holds the claims whose
    /// tokens `held` says: walking back over the earlier unfinished rows of its key, each is
    /// in `with` until there is none, or one of `tails` held under a live claim.
    pub fn claimable_behind(
        &self,
        id: i64,
        with: &[i64],
        tails: &[i64],
        held: &dyn Fn(&str) -> bool,
        now: T,
    ) -> bool {
        let Some(r) = self.rows.get(&id) else {
            return false;
        };
        let free = r.open() && r.due <= now && !r.live && !r.parked;
        let Some(k) = r.key.as_ref().filter(|_| free) else {
            return free;
        };
        let earlier = self.rows.range(..id).rev();
        for (i, p) in earlier.filter(|(_, p)| p.key.as_ref() == Some(k) && p.open()) {
            if with.contains(i) {
                continue;
            }
            return tails.contains(i) && p.live && p.claim.as_deref().is_some_and(held);
        }
        true
    }

    /// A claim under `token` at `now` of the claimable rows, oldest first, as far as their
    /// channels' `shares` go, behind `tails` held under the tokens `held` says are the
    /// claimer's (see [`RuleTable::claimable_behind`]). The SQL claims take a subset of these
    /// rows (they read bounded windows), never a row outside them.
    pub fn claim(
        &mut self,
        token: &Arc<str>,
        now: T,
        mut shares: Shares,
        tails: &[i64],
        held: &dyn Fn(&str) -> bool,
    ) -> Vec<i64> {
        let mut taken = Vec::new();
        let ids: Vec<i64> = self.rows.keys().copied().collect();
        for id in ids {
            if self.claimable_behind(id, &taken, tails, held, now)
                && self.rows.get(&id).is_some_and(|r| shares.take(&r.channel))
            {
                taken.push(id);
            }
        }
        for id in &taken {
            self.take(*id, token);
        }
        taken
    }

    /// Records that row `id` was claimed under `token`.
    pub fn take(&mut self, id: i64, token: &Arc<str>) {
        if let Some(r) = self.rows.get_mut(&id) {
            r.claim = Some(token.clone());
            r.live = true;
        }
    }

    /// Writes `resolution` for row `id` under `token` at `now`; false (nothing written) when
    /// the row's last claim is not `token`'s.
    pub fn complete(&mut self, id: i64, token: &str, resolution: &Resolution, now: T) -> bool {
        let Some(r) = self.rows.get_mut(&id) else {
            return false;
        };
        if r.claim.as_deref() != Some(token) {
            return false;
        }
        r.claim = None;
        r.live = false;
        match resolution {
            Resolution::Delivered => (r.state, r.attempts) = (State::Success, r.attempts + 1),
            Resolution::Failed { .. } => (r.state, r.attempts) = (State::Failed, r.attempts + 1),
            Resolution::Retry { delay, .. } => {
                (r.state, r.attempts, r.due) = (State::Retry, r.attempts + 1, now + *delay);
            }
            Resolution::Release { delay, .. } => r.due = now + *delay,
            Resolution::Park => r.parked = true,
        }
        true
    }

    /// The claim of row `id` runs out, and with it every row of the same claim (they share
    /// one `claimed_until`). Its token still owns the rows' results until another claim.
    pub fn expire(&mut self, id: i64) -> Vec<i64> {
        let token = self.rows.get(&id).and_then(|r| r.claim.clone());
        let mut ids = Vec::new();
        for (i, r) in self.rows.iter_mut() {
            if r.live && token.is_some() && r.claim == token {
                r.live = false;
                ids.push(*i);
            }
        }
        ids
    }

    /// How many rows are in `state` (parked ones included).
    pub fn count(&self, state: State) -> usize {
        self.rows.values().filter(|r| r.state == state).count()
    }
}

/// How many rows of each channel a claim may take, counted as the SQL claims count them: a
/// channel with a budget against its own, a channel no sink serves against the `others`
/// share, a served channel without a budget not at all.
#[derive(Debug, Clone)]
pub struct Shares {
    channels: BTreeMap<String, u32>,
    /// (the channels that have sinks, rows left for every other channel).
    others: Option<(Vec<String>, u32)>,
}

impl Shares {
    /// The shares of a claim with `budgets`; without, one share of `limit` for every channel.
    pub fn of(budgets: Option<&Budgets>, limit: u32) -> Shares {
        match budgets {
            Some(b) => Shares {
                channels: b.channels.iter().cloned().collect(),
                others: b.others.clone(),
            },
            None => Shares {
                channels: BTreeMap::new(),
                others: Some((Vec::new(), limit)),
            },
        }
    }

    /// Whether a row of `channel` would be taken.
    pub fn asks(&self, channel: &str) -> bool {
        match self.channels.get(channel) {
            Some(n) => *n > 0,
            None => self
                .others
                .as_ref()
                .is_some_and(|(served, n)| *n > 0 && !served.iter().any(|c| c == channel)),
        }
    }

    /// Counts a row of `channel` if its share has room; whether it had.
    fn take(&mut self, channel: &str) -> bool {
        if !self.asks(channel) {
            return false;
        }
        match self.channels.get_mut(channel) {
            Some(n) => *n -= 1,
            None => {
                if let Some((_, n)) = self.others.as_mut() {
                    *n -= 1;
                }
            }
        }
        true
    }
}
