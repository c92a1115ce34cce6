//! The MySQL/MariaDB claim: a read of the picks, then an `UPDATE` that marks the rows claimed,
//! in one short transaction (MySQL has no `UPDATE ... RETURNING`); and the idle read, which
//! asks the index of unfinished rows first ([`open_index::anything_due`]).
//!
//! Guarantees, beyond those of every claim (`store/claim/`):
//! - in leader mode the lease epoch is checked inside the transaction, under a shared lock
//!   held until it commits (see [`fence_holds`]);
//! - in claim mode a claim locks only rows it returns, so instances never wait on rows another
//!   one merely looked at (docs/design.md, "Claim-mode locks on MySQL");
//! - a keyed row is claimed only if it is still the head of its key when the rows are locked
//!   (docs/design.md, "Ordering keys on MySQL/MariaDB").

use std::collections::HashSet;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::MySql;
use super::open_index::{self, open_columns};
use crate::BoxFuture;
use crate::store::claim::ClaimSql;
use crate::store::claim::cursor::Floors;
use crate::store::claim::picks::{OpenColumns, PickFence, Picker, union_all};
use crate::store::claim::plan::{Filter, Order, Pick, plan};
use crate::store::claim::returned::{RETURNED_COLUMNS, has_ordering_key, select_list};
use crate::store::db::Db;
use crate::store::model::{Budgets, ClaimRequest};
use crate::store::queue::results::ResultSql;
use crate::store::sql::Sql;

/// How many candidates a claim-mode pick reads per row it may take (see [`read_then_lock`]).
const CANDIDATES_PER_ROW: u32 = 3;

/// The transaction a claim runs in.
type Tx<'t> = sqlx::Transaction<'t, sqlx::Any>;

/// How many rounds a claim-mode claim makes before it settles for what it has (see
/// [`read_then_lock`]): the first is one statement, each later one two.
const ROUNDS: usize = 3;

impl ClaimSql for MySql {
    fn claim_rows<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        floors: &'a Floors,
    ) -> BoxFuture<'a, anyhow::Result<Vec<AnyRow>>> {
        Box::pin(claim(db, req, floors))
    }

    fn open_columns(&self, db: &Db) -> OpenColumns {
        open_columns(db)
    }

    /// On the relay's own table the index of unfinished rows says whether any is due (a
    /// mapped table's index has no `next_attempt_at`).
    fn maybe_due<'a>(&'a self, db: &'a Db) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move {
            match db.cols().mapped {
                true => Ok(true),
                false => open_index::anything_due(db).await,
            }
        })
    }

    /// MariaDB 10.11 answered the plain read of the picks of every channel but some, sorted
    /// by id, with no rows while due rows were there (under load, with rows changed moments
    /// before; docs/design.md, "Claim-mode locks on MySQL"). Unsorted it found them.
    fn any_order(&self) -> bool {
        true
    }
}

/// Result writes select their rows the default way.
impl ResultSql for MySql {}

/// The claim. Leader mode (a fence, or the `none` lease's single instance:
/// [`ClaimRequest::alone`]), and the picks that are not of one channel: a locking read of the
/// picks (`SKIP LOCKED` where the server has it), which stops at its budget; the rows it
/// walks stay locked until the commit, which costs no one anything where no other instance
/// claims. Claim mode's per-channel picks: [`read_then_lock`]. Then the `UPDATE`.
async fn claim(db: &Db, req: &ClaimRequest, floors: &Floors) -> anyhow::Result<Vec<AnyRow>> {
    let lock = if db.dialect().skip_locked() {
        "FOR UPDATE SKIP LOCKED"
    } else {
        "FOR UPDATE"
    };
    let picker = Picker::new(db, open_columns(db));
    let mut tx = db.pool().begin().await?;
    if !fence_holds(db, req, &mut tx).await? {
        tx.rollback().await?;
        return Ok(Vec::new());
    }
    let mut rows = match (&req.fence, &req.budgets) {
        // Claim mode: other instances claim at the same moment.
        (None, Some(b)) if !req.alone => {
            // The rows of channels no sink serves are failed as soon as they are claimed, so
            // the `NOT IN` pick walks few rows; read plainly it would also need a sort, which
            // MariaDB 10.11 got wrong (see docs/design.md, "Claim-mode locks on MySQL").
            let (channels, others) = (
                only(req, b.channels.clone(), None),
                only(req, Vec::new(), b.others.clone()),
            );
            let mut rows = read_then_lock(db, &picker, &channels, lock, floors, &mut tx).await?;
            if b.others.is_some() {
                rows.extend(locking_picks(db, &picker, &others, lock, floors, &mut tx).await?);
            }
            rows
        }
        _ => locking_picks(db, &picker, req, lock, floors, &mut tx).await?,
    };
    if !rows.is_empty() {
        leave_rows_behind_their_key(db, &picker, &mut rows, &mut tx).await?;
    }
    if !rows.is_empty() {
        mark_claimed(db, req, &rows, &mut tx).await?;
    }
    tx.commit().await?;
    Ok(rows)
}

/// `req` with only these budgets.
fn only(
    req: &ClaimRequest,
    channels: Vec<(String, u32)>,
    others: Option<(Vec<String>, u32)>,
) -> ClaimRequest {
    ClaimRequest {
        budgets: Some(Budgets { channels, others }),
        ..req.clone()
    }
}

/// The picks as one `UNION ALL` of locking reads.
async fn locking_picks(
    db: &Db,
    picker: &Picker<'_>,
    req: &ClaimRequest,
    lock: &str,
    floors: &Floors,
    tx: &mut Tx<'_>,
) -> anyhow::Result<Vec<AnyRow>> {
    let cols = select_list(db, "o.", req);
    let picks = picker.picks(plan(req), req, floors, &cols, lock, PickFence::None);
    if picks.is_empty() {
        return Ok(Vec::new());
    }
    Ok(db.query(union_all(picks)).fetch_all(&mut **tx).await?)
}

/// Claim mode's per-channel picks: each reads its candidates plainly (no lock), and locks
/// only those it takes, through the primary key, checking again that each is claimable.
///
/// Why: InnoDB keeps the lock on every row a locking read walks through a secondary index,
/// also those that fail its `WHERE`, until the transaction ends, even at READ COMMITTED (walks
/// of the primary key release them). A pick walks its channel's index of unfinished rows,
/// past retries not yet due, rows under another instance's claim and rows behind an earlier
/// one of their ordering key, so one claim of 10 past 300 rows not due held 620 row locks,
/// and another instance's claim skipped those rows or waited on them. Now a pick is
/// `SELECT ... WHERE id IN (SELECT id FROM (<the pick, plain, for 3x its rows>) w) AND
/// <claimable> ORDER BY id LIMIT <its rows> FOR UPDATE SKIP LOCKED`: the derived table is
/// read without locks, and the outer read locks only the rows it returns.
///
/// Instances that claim at the same moment read the same candidates: with
/// [`CANDIDATES_PER_ROW`] times its rows a second instance finds its rows among them past the
/// first's. A pick that still comes back short reads again, for what is left of its channel's
/// budget, past the rows it took (round 2) and then past the candidates it saw (round 3),
/// each a plain read of candidates and a locking read of them. A claim that comes back short
/// makes the loop wait for the next poll, so without these rounds an instance could sit idle
/// while the others drain the table. The cost: one more statement when a claim-mode claim
/// on MySQL takes less than its budget (at light load, or the last claim of a backlog).
async fn read_then_lock(
    db: &Db,
    picker: &Picker<'_>,
    req: &ClaimRequest,
    lock: &str,
    floors: &Floors,
    tx: &mut Tx<'_>,
) -> anyhow::Result<Vec<AnyRow>> {
    let mut rounds = Rounds {
        db,
        picker,
        lock,
        cols: select_list(db, "o.", req),
        claimable: picker.claimable(),
        rows: Vec::new(),
        taken: HashSet::new(),
    };
    let mut req = req.clone();
    let mut floors = floors.clone();
    for round in 0..ROUNDS {
        let picks = plan(&req);
        // No channel has room (the claim is for unserved channels' rows alone): no statement.
        if picks.is_empty() {
            break;
        }
        let wide: Vec<_> = picks
            .iter()
            .map(|&(f, n, o)| (f, n.saturating_mul(CANDIDATES_PER_ROW), o))
            .collect();
        // Round 1 reads the candidates inside the locking read; later rounds read them first,
        // to know how far they reached.
        let (select, candidates) = if round == 0 {
            (rounds.first_select(&picks, &wide, &req, &floors), None)
        } else {
            match rounds
                .later_select(&picks, &wide, &req, &floors, tx)
                .await?
            {
                Some((select, candidates)) => (select, Some(candidates)),
                None => break,
            }
        };
        let first = rounds.rows.len();
        let got = rounds.lock(select, picks.len(), tx).await?;
        let left = rounds.left(
            &picks,
            &wide,
            &got,
            first,
            candidates.as_deref(),
            &mut floors,
        );
        if left.is_empty() {
            break;
        }
        req = only(&req, left, None);
        req.newest = false;
    }
    Ok(rounds.rows)
}

/// Candidate ids per pick of a round.
type Candidates = Vec<Vec<i64>>;

/// The state of one claim-mode claim across its rounds.
struct Rounds<'a> {
    db: &'a Db,
    picker: &'a Picker<'a>,
    lock: &'a str,
    /// The select list of the claim.
    cols: String,
    claimable: String,
    /// The rows locked so far, with their pick's index after the select list.
    rows: Vec<AnyRow>,
    taken: HashSet<i64>,
}

impl Rounds<'_> {
    /// One pick of the locking read: `ids` (SQL) are its candidates.
    fn locking(&self, select: &mut Sql, i: usize, pick: (u32, Order), ids: Sql) {
        let (t, id) = (self.db.table(), &self.db.cols().id);
        let (n, order) = pick;
        let desc = if order == Order::Newest { " DESC" } else { "" };
        select
            .push(&format!(
                "(SELECT {}, CAST({i} AS SIGNED) FROM {t} o WHERE o.{id} IN (",
                self.cols
            ))
            .append(ids)
            .push(&format!(
                ") AND {} ORDER BY o.{id}{desc} LIMIT {n} {})",
                self.claimable, self.lock
            ));
    }

    /// The plain reads of the candidates of `wide` (each pick for more rows than it takes),
    /// selecting `cols`.
    fn candidates(
        &self,
        wide: &[Pick<'_>],
        req: &ClaimRequest,
        floors: &Floors,
        cols: &str,
    ) -> Vec<Sql> {
        self.picker
            .picks(wide.to_vec(), req, floors, cols, "", PickFence::None)
    }

    /// Round 1: each pick's candidates read inside its locking read.
    fn first_select(
        &self,
        picks: &[Pick<'_>],
        wide: &[Pick<'_>],
        req: &ClaimRequest,
        floors: &Floors,
    ) -> Sql {
        let id = &self.db.cols().id;
        let candidates = self.candidates(wide, req, floors, &format!("o.{id}"));
        let mut select = Sql::default();
        for (i, pick) in candidates.into_iter().enumerate() {
            if i > 0 {
                select.push(" UNION ALL ");
            }
            let mut ids = Sql::new(&format!("SELECT w.{id} FROM ("));
            ids.append(pick).push(") w");
            self.locking(&mut select, i, (picks[i].1, picks[i].2), ids);
        }
        select
    }

    /// Later rounds: the candidates read first (plainly), then the locking read of those not
    /// taken yet. `None`: no candidate is left.
    async fn later_select(
        &self,
        picks: &[Pick<'_>],
        wide: &[Pick<'_>],
        req: &ClaimRequest,
        floors: &Floors,
        tx: &mut Tx<'_>,
    ) -> anyhow::Result<Option<(Sql, Candidates)>> {
        let id = &self.db.cols().id;
        let read = self.candidates(
            wide,
            req,
            floors,
            &format!("CAST({{pick}} AS SIGNED), o.{id}"),
        );
        let mut candidates: Candidates = vec![Vec::new(); picks.len()];
        for r in self.db.query(union_all(read)).fetch_all(&mut **tx).await? {
            let (pick, row) = (r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?);
            if let Some(c) = usize::try_from(pick)
                .ok()
                .and_then(|p| candidates.get_mut(p))
            {
                c.push(row);
            }
        }
        let mut select = Sql::default();
        let mut parts = 0;
        for (i, ids) in candidates.iter().enumerate() {
            let fresh: Vec<i64> = ids
                .iter()
                .copied()
                .filter(|r| !self.taken.contains(r))
                .collect();
            if fresh.is_empty() {
                continue;
            }
            if parts > 0 {
                select.push(" UNION ALL ");
            }
            parts += 1;
            let mut list = Sql::default();
            list.ints(fresh);
            self.locking(&mut select, i, (picks[i].1, picks[i].2), list);
        }
        Ok((parts > 0).then_some((select, candidates)))
    }

    /// Runs a round's locking read: the rows it locked are kept (each once: the newest and
    /// oldest picks of a channel can both hold a row). Returns how many each pick took.
    async fn lock(
        &mut self,
        select: Sql,
        picks: usize,
        tx: &mut Tx<'_>,
    ) -> anyhow::Result<Vec<u32>> {
        let mut got = vec![0u32; picks];
        for r in self.db.query(select).fetch_all(&mut **tx).await? {
            let pick = usize::try_from(r.try_get::<i64, _>(RETURNED_COLUMNS)?)?;
            if self.taken.insert(r.try_get::<i64, _>(0)?) {
                if let Some(g) = got.get_mut(pick) {
                    *g += 1;
                }
                self.rows.push(r);
            }
        }
        Ok(got)
    }

    /// What is left of the budget of each channel whose oldest pick came back short, and
    /// where its next round starts (raised in `floors`): past every row this one saw (each
    /// was taken, locked by another claim, or not claimable).
    fn left(
        &self,
        picks: &[Pick<'_>],
        wide: &[Pick<'_>],
        got: &[u32],
        first: usize,
        candidates: Option<&[Vec<i64>]>,
        floors: &mut Floors,
    ) -> Vec<(String, u32)> {
        let mut next = Vec::new();
        for (i, &(filter, n, order)) in picks.iter().enumerate() {
            let (Filter::Channel(channel), Order::Oldest) = (filter, order) else {
                continue;
            };
            let of_channel = |p: usize| matches!(picks[p].0, Filter::Channel(c) if c == channel);
            let sum = |v: &dyn Fn(usize) -> u32| {
                (0..picks.len())
                    .filter(|&p| of_channel(p))
                    .map(v)
                    .sum::<u32>()
            };
            let (channel_got, budget) = (sum(&|p| got[p]), sum(&|p| picks[p].1));
            if got[i] >= n || channel_got >= budget {
                continue;
            }
            let high = match candidates {
                None => self.rows[first..]
                    .iter()
                    .filter(|r| {
                        r.try_get::<i64, _>(RETURNED_COLUMNS)
                            .is_ok_and(|p| p == i as i64)
                    })
                    .filter_map(|r| r.try_get::<i64, _>(0).ok())
                    .max(),
                // The candidates ran out: so did the channel's claimable rows.
                Some(c) if c[i].len() < wide[i].1 as usize => continue,
                Some(c) => c[i].iter().copied().max(),
            };
            if let Some(high) = high {
                let floor = floors.at.entry(channel.to_string()).or_insert(high);
                *floor = (*floor).max(high);
            }
            next.push((channel.to_string(), budget - channel_got));
        }
        next
    }
}

/// Leaves out of `rows` each keyed row that is no longer the head of its key.
///
/// A locking read reads the newest committed rows, but the picks' `NOT EXISTS` test of an
/// earlier unfinished row of the same ordering key is a plain read of the snapshot taken
/// when that test first ran in the statement. Two rows of one key written in one
/// transaction (an application recording two events of an order at once) and committed
/// while the picks walk are both seen by the locking read, while the test does not see the
/// first: both were claimed and sent at once. (PostgreSQL reads both sides from one
/// snapshot; SQLite has one writer.) Found by the chaos run (two keys out of order in
/// 100,000 rows) and reproduced by `claim_rule::mysql_a_key_committed_during_a_slow_pick_
/// is_not_overtaken`. So keyed rows are checked again by a statement that reads after the
/// picks saw them (sessions run at READ COMMITTED: each statement reads what is committed
/// when it runs), and those behind an earlier unfinished row (one picked with them
/// included) are left alone: not claimed, their locks released at commit. See
/// docs/design.md, "Ordering keys on MySQL/MariaDB".
async fn leave_rows_behind_their_key(
    db: &Db,
    picker: &Picker<'_>,
    rows: &mut Vec<AnyRow>,
    tx: &mut Tx<'_>,
) -> anyhow::Result<()> {
    let keyed: Vec<i64> = rows
        .iter()
        .filter(|r| has_ordering_key(r))
        .filter_map(|r| r.try_get::<i64, _>(0).ok())
        .collect();
    let Some(behind) = picker.behind_an_earlier_row() else {
        return Ok(());
    };
    if keyed.is_empty() {
        return Ok(());
    }
    let id = &db.cols().id;
    let mut check = Sql::new(&format!(
        "SELECT o.{id} FROM {} o WHERE o.{id} IN (",
        db.table()
    ));
    check.ints(keyed).push(&format!(") AND {behind}"));
    let blocked: HashSet<i64> = db
        .query(check)
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<_, _>>()?;
    if !blocked.is_empty() {
        tracing::debug!(
            ?blocked,
            "picked rows behind an earlier row of their key left alone"
        );
        rows.retain(|r| {
            r.try_get::<i64, _>(0)
                .map_or(true, |id| !blocked.contains(&id))
        });
    }
    Ok(())
}

/// Marks `rows` claimed by `req`'s claimer and token until `now + ttl`.
async fn mark_claimed(
    db: &Db,
    req: &ClaimRequest,
    rows: &[AnyRow],
    tx: &mut Tx<'_>,
) -> anyhow::Result<()> {
    let ids = rows
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<Vec<_>, _>>()?;
    let mut u = Sql::new(&format!("UPDATE {} SET claimed_by = ", db.table()));
    u.text(&req.claimer)
        .push(", claim_token = ")
        .text(&req.token)
        .push(", claimed_until = ")
        .now_plus(db.syntax(), req.ttl)
        .push(&format!(" WHERE {} IN (", db.cols().id))
        .ints(ids)
        .push(")");
    db.query(u).execute(&mut **tx).await?;
    Ok(())
}

/// Inside the claim's transaction: whether the lease epoch is still the claimer's, holding a
/// shared lock on the lease row until the claim commits (a new holder's epoch bump waits for
/// it, and later claims of the old holder see the bump).
async fn fence_holds(db: &Db, req: &ClaimRequest, tx: &mut Tx<'_>) -> anyhow::Result<bool> {
    let Some(f) = &req.fence else {
        return Ok(true);
    };
    let mut q = Sql::new("SELECT epoch FROM outbox_relay_lease WHERE name = ");
    q.text(&f.lease)
        .push(" AND epoch = ")
        .int(f.epoch)
        .push(" LOCK IN SHARE MODE");
    Ok(db.query(q).fetch_optional(&mut **tx).await?.is_some())
}
