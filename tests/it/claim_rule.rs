//! The ordering-key claim rule as a model check, against the real store: random interleavings
//! of insert, claim, complete (success, retry, fail, give back) and claim expiry, across one to
//! three claimers (each its own `SqlStore`, with its own floors, as claim-mode instances are)
//! on one SQLite table. The store's claim decides what is claimable; the rule's model, the
//! one the relay's own tests run on (`outbox_relay::store::rule`), says what the rule allows
//! (docs/design.md, "What is claimable": due, under no live claim, and every earlier
//! unfinished row of its ordering key taken by the same claim, or the nearest one not taken a
//! tail the claimer offered and holds: "Ordering keys: chains"). Claims offer the claimer's
//! tails half the time; odd claimers take no more heads of keys new to them than half their
//! budget (`Budgets::starts`, as a claim-mode relay's claims do). The claimers finish the rows
//! of a key they hold as the relay sends them: one after another in the order claimed, and the
//! rest given back when one is not delivered. Checked after every step:
//!
//! - a claim returns only rows the model calls claimable, at most the channel's budget, so no
//!   row of a key is sent while an earlier row of that key is unfinished outside its claim;
//! - a result is written exactly when the model says the claim token is still the row's;
//! - the rows of each key are finished in id order;
//! - at the end, with nothing else happening, repeated claims finish every row (the floors
//!   skip nothing for longer than the longest full-walk period, `FULL_WALK_LONGEST`).
//!
//! Mostly on SQLite, where a case takes milliseconds and proptest can try many; a few cases on
//! PostgreSQL and MySQL/MariaDB, whose claims differ (`SKIP LOCKED`; MySQL's locking read).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_relay::store::rule::{RuleRow, RuleTable};
use outbox_relay::store::{
    Budgets, ClaimRequest, ClaimedRow, Completion, Queue, Resolution, SqlStore, State, Tail,
};
use proptest::prelude::*;

use crate::support::{Db, TestDb, db_time};

const CHANNELS: [&str; 2] = ["a", "b"];
const KEYS: [&str; 3] = ["k1", "k2", "k3"];

#[derive(Debug, Clone)]
enum Step {
    Insert {
        channel: usize,
        key: Option<usize>,
    },
    Claim {
        claimer: usize,
        budget: u32,
        newest: bool,
        /// The claimer offers its keys' tails (the last row of each key it holds), as the
        /// relay offers its chains.
        chain: bool,
    },
    /// The claimer finishes one of the rows it holds (`pick` modulo how many it holds).
    Complete {
        claimer: usize,
        pick: usize,
        how: How,
    },
    /// The claim of one live row (`pick` modulo their number) runs out, as a crashed
    /// claimer's would: every row of that claim.
    Expire {
        pick: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum How {
    Success,
    Retry,
    Fail,
    GiveBack,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..CHANNELS.len(), prop::option::weighted(0.8, 0..KEYS.len()))
            .prop_map(|(channel, key)| Step::Insert { channel, key }),
        4 => (0usize..3, 1u32..=4, any::<bool>(), any::<bool>())
            .prop_map(|(claimer, budget, newest, chain)| Step::Claim { claimer, budget, newest, chain }),
        4 => (0usize..3, any::<usize>(), prop_oneof![
                Just(How::Success), Just(How::Retry), Just(How::Fail), Just(How::GiveBack)
            ])
            .prop_map(|(claimer, pick, how)| Step::Complete { claimer, pick, how }),
        1 => any::<usize>().prop_map(|pick| Step::Expire { pick }),
    ]
}

/// The shared model of the rule (`outbox_relay::store::rule`), and the order in which each
/// key's rows finished. Retries are due at once here, so the wall clock serves.
#[derive(Default)]
struct Model {
    table: RuleTable<Instant>,
    /// Per key, the ids in the order they finished.
    finished: BTreeMap<String, Vec<i64>>,
}

impl Model {
    fn key(&self, id: i64) -> Option<&str> {
        self.table.rows.get(&id).and_then(|r| r.key.as_deref())
    }

    /// Whether the row's claim under `token` is still live.
    fn live(&self, id: i64, token: &Arc<str>) -> bool {
        self.table
            .rows
            .get(&id)
            .is_some_and(|r| r.live && r.claim.as_ref() == Some(token))
    }

    fn unfinished(&self) -> Vec<(&i64, &RuleRow<Instant>)> {
        self.table.rows.iter().filter(|(_, r)| r.open()).collect()
    }
}

fn request(claimer: usize, budget: u32, newest: bool, tails: Vec<Tail>) -> ClaimRequest {
    ClaimRequest {
        tails,
        trace: false,
        limit: budget * CHANNELS.len() as u32,
        // Long: claims run out only when a step expires them.
        ttl: Duration::from_secs(600),
        claimer: format!("props{claimer}"),
        token: outbox_relay::random_token().into(),
        fence: None,
        alone: false,
        exclude_channels: Vec::new(),
        max_payload_bytes: None,
        newest,
        budgets: Some(Budgets {
            channels: CHANNELS.iter().map(|c| (c.to_string(), budget)).collect(),
            others: None,
            // Odd claimers take no more heads of keys new to them than half their budget.
            starts: (claimer % 2 == 1).then(|| {
                CHANNELS
                    .iter()
                    .map(|c| (c.to_string(), budget / 2))
                    .collect()
            }),
        }),
    }
}

fn resolution(how: How) -> Resolution {
    match how {
        How::Success => Resolution::Delivered,
        How::Retry => Resolution::Retry {
            delay: Duration::ZERO,
            error: "HTTP 503".into(),
        },
        How::Fail => Resolution::Failed {
            error: "HTTP 400".into(),
        },
        How::GiveBack => Resolution::Release {
            delay: Duration::ZERO,
            error: None,
        },
    }
}

/// Checks one claim's rows against the model and records the claim. `held` says whether a
/// token is one of the claimer's.
fn check_claim(
    model: &mut Model,
    req: &ClaimRequest,
    budget: u32,
    got: &[ClaimedRow],
    held: &dyn Fn(&str) -> bool,
) -> Result<(), TestCaseError> {
    for c in CHANNELS {
        let n = got.iter().filter(|r| r.delivery.channel == c).count();
        prop_assert!(n as u32 <= budget, "{n} rows of {c} over budget {budget}");
    }
    let with: Vec<i64> = got.iter().map(|r| r.delivery.id).collect();
    let now = Instant::now();
    for r in got {
        let id = r.delivery.id;
        let tails: Vec<i64> = req.tails.iter().map(|t| t.row).collect();
        prop_assert!(
            model.table.claimable_behind(id, &with, &tails, held, now),
            "row {id} claimed but not claimable: {:?}; rows {:?}",
            model.table.rows.get(&id),
            model.table.rows
        );
        if let Some(row) = model.table.rows.get(&id) {
            prop_assert_eq!(r.ordering_key.as_deref(), row.key.as_deref());
            prop_assert_eq!(&r.delivery.channel, &row.channel);
        }
    }
    for id in with {
        model.table.take(id, &req.token);
    }
    Ok(())
}

/// The row held at `i`, or, for a keyed row, the first row of its key the claimer holds: the
/// relay sends a key's rows in the order it claimed them (a run in id order, the runs of a
/// chain one after another).
fn first_of_its_chain(model: &Model, held: &[(i64, Arc<str>)], i: usize) -> (i64, Arc<str>) {
    let (id, token) = held[i].clone();
    match model.key(id) {
        Some(key) => held
            .iter()
            .find(|(h, _)| model.key(*h) == Some(key))
            .cloned()
            .unwrap_or((id, token)),
        None => (id, token),
    }
}

/// The other rows of `id`'s key the claimer holds: they go back unsent when `id` is not
/// delivered.
fn rest_of_chain(model: &Model, held: &[(i64, Arc<str>)], id: i64) -> Vec<(i64, Arc<str>)> {
    let Some(key) = model.key(id) else {
        return Vec::new();
    };
    held.iter()
        .filter(|(h, _)| *h != id && model.key(*h) == Some(key))
        .cloned()
        .collect()
}

/// The tails a claimer offers: per key, the last row of it that it holds, asking for runs
/// of 16, 32 or 64 rows behind it (by the row's id), as keys of different paces ask.
fn tails(model: &Model, held: &[(i64, Arc<str>)]) -> Vec<Tail> {
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for (id, _) in held {
        if let Some(key) = model.key(*id) {
            last.insert(key.to_string(), *id);
        }
    }
    last.into_iter()
        .map(|(key, row)| Tail {
            channel: (model.table.rows.get(&row)).map_or(String::new(), |r| r.channel.clone()),
            key,
            row,
            run: 16 << (row % 3),
        })
        .collect()
}

/// Applies a written result to the model; returns whether the store should have written it.
fn apply(model: &mut Model, id: i64, token: &Arc<str>, how: How) -> bool {
    let written = model
        .table
        .complete(id, token, &resolution(how), Instant::now());
    if written
        && matches!(how, How::Success | How::Fail)
        && let Some(k) = model.key(id).map(str::to_string)
    {
        model.finished.entry(k).or_default().push(id);
    }
    written
}

/// One case: the table, its claimers, the model, and what each claimer believes it holds:
/// (id, token).
struct Run {
    which: Db,
    db: TestDb,
    stores: Vec<Arc<SqlStore>>,
    model: Model,
    held: Vec<Vec<(i64, Arc<str>)>>,
}

fn failed<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> TestCaseError + '_ {
    move |e| TestCaseError::fail(format!("{what}: {e}"))
}

impl Run {
    async fn open(which: Db, claimers: usize) -> Result<Option<Run>, TestCaseError> {
        let Some(db) = TestDb::open(which, "claim_rule").await else {
            return Ok(None);
        };
        let mut stores: Vec<Arc<SqlStore>> = vec![db.store.clone()];
        for _ in 1..claimers {
            let s = SqlStore::connect(&db.url, &db.table, 2, Duration::from_secs(5))
                .await
                .map_err(failed("connect"))?;
            stores.push(Arc::new(s));
        }
        let (model, held) = (Model::default(), vec![Vec::new(); claimers]);
        Ok(Some(Run {
            which,
            db,
            stores,
            model,
            held,
        }))
    }

    async fn step(&mut self, step: Step) -> Result<(), TestCaseError> {
        let claimers = self.stores.len();
        match step {
            Step::Insert { channel, key } => {
                let key = key.map(|k| KEYS[k]);
                let id = self.db.enqueue(CHANNELS[channel], "{}", key).await;
                let now = Instant::now();
                (self.model.table).insert(id, CHANNELS[channel], key, State::Pending, now);
            }
            Step::Claim {
                claimer,
                budget,
                newest,
                chain,
            } => {
                let c = claimer % claimers;
                let offered = match chain {
                    true => tails(&self.model, &self.held[c]),
                    false => Vec::new(),
                };
                let req = request(c, budget, newest, offered);
                let got = self.stores[c].claim(&req).await.map_err(failed("claim"))?;
                let held = &self.held[c];
                let ours = |t: &str| held.iter().any(|(_, h)| &**h == t);
                check_claim(&mut self.model, &req, budget, &got, &ours)?;
                let token = &req.token;
                self.held[c].extend(got.iter().map(|r| (r.delivery.id, token.clone())));
                self.learn_gaps(&got).await?;
            }
            Step::Complete { claimer, pick, how } => {
                self.complete(claimer % claimers, pick, how).await?;
            }
            Step::Expire { pick } => self.expire(pick).await,
        }
        Ok(())
    }

    /// A claim may take a row and give it back at once, unreported: a run whose first row the
    /// database refused (its tail no longer held) keeps no row behind the gap. Such a row was
    /// free, so the model's owner of it can only be an expired claim, which loses the row's
    /// result to that claim. Learnt from the table: every row an expired claim still owns in
    /// the model, and that this claim did not return, must still carry that claim's token,
    /// or be unclaimed, never taken by any other token.
    async fn learn_gaps(&mut self, got: &[ClaimedRow]) -> Result<(), TestCaseError> {
        let stale: Vec<(i64, Arc<str>)> = (self.model.table.rows.iter())
            .filter(|(id, r)| !r.live && !got.iter().any(|g| g.delivery.id == **id))
            .filter_map(|(id, r)| Some((*id, r.claim.clone()?)))
            .collect();
        for (id, token) in stale {
            // Tokens are hex: safe as a literal.
            let sql = format!(
                "SELECT CASE WHEN claim_token IS NULL THEN 0 WHEN claim_token = '{token}' \
                 THEN 1 ELSE 2 END FROM {{t}} WHERE id = {id}"
            );
            match self.db.scalar(&sql).await {
                1 => {}
                0 => {
                    if let Some(r) = self.model.table.rows.get_mut(&id) {
                        r.claim = None;
                    }
                }
                _ => prop_assert!(false, "row {} taken by a claim that did not return it", id),
            }
        }
        Ok(())
    }

    /// Claimer `c` finishes one row it holds, as the relay sends a claim's rows of one key:
    /// the first one held goes first, and when it is not delivered the rest go back unsent.
    async fn complete(&mut self, c: usize, pick: usize, how: How) -> Result<(), TestCaseError> {
        if self.held[c].is_empty() {
            return Ok(());
        }
        let (id, token) = first_of_its_chain(&self.model, &self.held[c], pick % self.held[c].len());
        // A claim that ran out sends nothing more (G4): its rows go back unsent.
        let how = if self.model.live(id, &token) {
            how
        } else {
            How::GiveBack
        };
        let mut finish = vec![(id, token, how)];
        if !matches!(how, How::Success) {
            let rest = rest_of_chain(&self.model, &self.held[c], id);
            finish.extend(rest.into_iter().map(|(r, t)| (r, t, How::GiveBack)));
        }
        for (id, token, how) in finish {
            self.held[c].retain(|(h, t)| !(*h == id && *t == token));
            self.write(c, id, &token, how).await?;
        }
        Ok(())
    }

    /// Writes claimer `c`'s result for row `id` and checks it was written exactly when the
    /// model says the token still owns the row.
    async fn write(
        &mut self,
        c: usize,
        id: i64,
        token: &Arc<str>,
        how: How,
    ) -> Result<(), TestCaseError> {
        let want = apply(&mut self.model, id, token, how);
        let done = [Completion {
            id,
            token: token.clone(),
            resolution: resolution(how),
        }];
        let written = self.stores[c]
            .complete(&done)
            .await
            .map_err(failed("complete"))?;
        prop_assert_eq!(written, u64::from(want), "result of row {} ({:?})", id, how);
        Ok(())
    }

    /// The claim of one live row runs out, and with it every row of that claim: they share one
    /// `claimed_until`.
    async fn expire(&mut self, pick: usize) {
        let live: Vec<i64> = (self.model.table.rows.iter())
            .filter(|(_, r)| r.live)
            .map(|(id, _)| *id)
            .collect();
        if live.is_empty() {
            return;
        }
        let ids = self.model.table.expire(live[pick % live.len()]);
        let list = ids
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        self.db
            .exec(&format!(
                "UPDATE {{t}} SET claimed_until = {} WHERE id IN ({list})",
                db_time(self.which, -5)
            ))
            .await;
    }

    /// Quiet now: the claimers finish what they hold, in held order (the order each key's
    /// rows were claimed). A row whose claim ran out is given back unsent (G4), and so are the
    /// rows of its key held behind it.
    async fn finish_held(&mut self) -> Result<(), TestCaseError> {
        for c in 0..self.held.len() {
            let mut broken: Vec<String> = Vec::new();
            for (id, token) in std::mem::take(&mut self.held[c]) {
                let key = self.model.key(id).map(str::to_string);
                let expired = !self.model.live(id, &token);
                let behind = key.as_ref().is_some_and(|k| broken.contains(k));
                let how = if expired || behind {
                    if let Some(k) = key {
                        broken.push(k);
                    }
                    How::GiveBack
                } else {
                    How::Success
                };
                self.write(c, id, &token, how).await?;
            }
        }
        Ok(())
    }

    /// Claims and delivers until nothing is left. A row a floor skipped is found by the next
    /// full walk, at most FULL_WALK_LONGEST (5 s) away.
    async fn drain(&mut self) -> Result<(), TestCaseError> {
        let until = Instant::now() + Duration::from_secs(7);
        while !self.model.unfinished().is_empty() {
            prop_assert!(
                Instant::now() < until,
                "rows never claimed again: {:?}",
                self.model.unfinished()
            );
            let mut any = false;
            for (c, s) in self.stores.iter().enumerate() {
                let req = request(c, 4, false, Vec::new());
                let got = s.claim(&req).await.map_err(failed("claim"))?;
                check_claim(&mut self.model, &req, 4, &got, &|_| false)?;
                any |= !got.is_empty();
                let done: Vec<Completion> = (got.iter())
                    .map(|r| completion(r.delivery.id, &req.token))
                    .collect();
                for d in &done {
                    apply(&mut self.model, d.id, &d.token, How::Success);
                }
                s.complete(&done).await.map_err(failed("complete"))?;
            }
            if !any {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Every key finished in id order, and the table holds no unfinished row.
    async fn check_end(self) -> Result<(), TestCaseError> {
        for (key, ids) in &self.model.finished {
            prop_assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "key {key} finished out of order: {ids:?}"
            );
        }
        let open = (self.db)
            .scalar("SELECT COUNT(*) FROM {t} WHERE status IN ('PENDING', 'RETRY')")
            .await;
        prop_assert_eq!(open, 0);
        self.db.drop_table().await;
        for s in self.stores {
            s.pool().close().await;
        }
        Ok(())
    }
}

fn completion(id: i64, token: &Arc<str>) -> Completion {
    Completion {
        id,
        token: token.clone(),
        resolution: Resolution::Delivered,
    }
}

async fn run(which: Db, steps: Vec<Step>, claimers: usize) -> Result<(), TestCaseError> {
    let Some(mut run) = Run::open(which, claimers).await? else {
        return Ok(());
    };
    for step in steps {
        run.step(step).await?;
    }
    run.finish_held().await?;
    run.drain().await?;
    run.check_end().await
}

fn case(which: Db, steps: Vec<Step>, claimers: usize) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TestCaseError::fail(format!("runtime: {e}")))?;
    rt.block_on(run(which, steps, claimers))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_key_is_delivered_in_order_and_every_row_finishes(
        claimers in 1usize..=3,
        steps in prop::collection::vec(step(), 1..80),
    ) {
        case(Db::Sqlite, steps, claimers)?;
    }
}

// The servers too, with fewer cases (each makes a table): PostgreSQL runs the same claim
// under `FOR UPDATE SKIP LOCKED`, MySQL its own (a locking read, then an UPDATE).
proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn the_rule_holds_on_postgres(
        claimers in 1usize..=3,
        steps in prop::collection::vec(step(), 1..60),
    ) {
        case(Db::Postgres, steps, claimers)?;
    }

    #[test]
    fn the_rule_holds_on_mysql(
        claimers in 1usize..=3,
        steps in prop::collection::vec(step(), 1..60),
    ) {
        case(Db::MySql, steps, claimers)?;
    }
}
