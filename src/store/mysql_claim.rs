//! The MySQL/MariaDB claim: a read of the picks, then an `UPDATE` that marks the rows claimed,
//! in one short transaction (MySQL has no `UPDATE ... RETURNING`); and the index-only check
//! an idle read on MySQL asks first ([`anything_due`]).
//!
//! Guarantees, beyond those of every claim (`claim.rs`):
//! - in leader mode the lease epoch is checked inside the transaction, under a shared lock
//!   held until it commits (see [`fence_holds`]);
//! - in claim mode a claim locks only rows it returns, so instances never wait on rows another
//!   one merely looked at (docs/design.md, "Claim-mode locks on MySQL");
//! - a keyed row is claimed only if it is still the head of its key when the rows are locked
//!   (docs/design.md, "Ordering keys on MySQL/MariaDB").

use std::collections::HashSet;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::builder::Sql;
use super::claim::{Filter, Order, PickFence, plan};
use super::cursor::Floors;
use super::returned::{RETURNED_COLUMNS, has_ordering_key};
use super::sql::SqlStore;
use super::{Budgets, ClaimRequest};

/// How many candidates a claim-mode pick reads per row it may take (see [`read_then_lock`]).
const CANDIDATES_PER_ROW: u32 = 3;

/// The transaction a claim runs in.
type Tx<'t> = sqlx::Transaction<'t, sqlx::Any>;

/// How many rounds a claim-mode claim makes before it settles for what it has (see
/// [`read_then_lock`]): the first is one statement, each later one two.
const ROUNDS: usize = 3;

/// The claim. Leader mode (a fence, or the `none` lease's single instance:
/// [`ClaimRequest::alone`]), and the picks that are not of one channel: a locking read of the
/// picks (`SKIP LOCKED` where the server has it), which stops at its budget; the rows it
/// walks stay locked until the commit, which costs no one anything where no other instance
/// claims. Claim mode's per-channel picks: [`read_then_lock`]. Then the `UPDATE`.
pub(super) async fn claim(
    store: &SqlStore,
    req: &ClaimRequest,
    skip_locked: bool,
    floors: &Floors,
) -> anyhow::Result<Vec<AnyRow>> {
    let lock = if skip_locked {
        "FOR UPDATE SKIP LOCKED"
    } else {
        "FOR UPDATE"
    };
    let mut tx = store.pool.begin().await?;
    if !fence_holds(store, req, &mut tx).await? {
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
            let mut rows = read_then_lock(store, &channels, lock, floors, &mut tx).await?;
            if b.others.is_some() {
                rows.extend(locking_picks(store, &others, lock, floors, &mut tx).await?);
            }
            rows
        }
        _ => locking_picks(store, req, lock, floors, &mut tx).await?,
    };
    if !rows.is_empty() {
        leave_rows_behind_their_key(store, &mut rows, &mut tx).await?;
    }
    if !rows.is_empty() {
        mark_claimed(store, req, &rows, &mut tx).await?;
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
    store: &SqlStore,
    req: &ClaimRequest,
    lock: &str,
    floors: &Floors,
    tx: &mut Tx<'_>,
) -> anyhow::Result<Vec<AnyRow>> {
    let picks = store.picks(
        req,
        floors,
        &store.returning_columns("o.", req),
        lock,
        &PickFence::None,
    );
    if picks.is_empty() {
        return Ok(Vec::new());
    }
    Ok(union(picks).query(store).fetch_all(&mut **tx).await?)
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
    store: &SqlStore,
    req: &ClaimRequest,
    lock: &str,
    floors: &Floors,
    tx: &mut Tx<'_>,
) -> anyhow::Result<Vec<AnyRow>> {
    let (t, id) = (&store.table, &store.cols.id);
    let (cols, claimable) = (store.returning_columns("o.", req), store.claimable());
    let mut req = req.clone();
    let mut floors = floors.clone();
    let mut rows: Vec<AnyRow> = Vec::new();
    let mut taken: HashSet<i64> = HashSet::new();
    for round in 0..ROUNDS {
        let plan = plan(&req);
        // No channel has room (the claim is for unserved channels' rows alone): no statement.
        if plan.is_empty() {
            break;
        }
        let wide: Vec<_> = plan
            .iter()
            .map(|&(f, n, o)| (f, n.saturating_mul(CANDIDATES_PER_ROW), o))
            .collect();
        // One pick of the locking read: `ids` (SQL) are its candidates.
        let locking = |select: &mut Sql, i: usize, ids: Sql| {
            let (_, n, order) = plan[i];
            let desc = if order == Order::Newest { " DESC" } else { "" };
            select
                .push(&format!(
                    "(SELECT {cols}, CAST({i} AS SIGNED) FROM {t} o WHERE o.{id} IN ("
                ))
                .append(ids)
                .push(&format!(
                    ") AND {claimable} ORDER BY o.{id}{desc} LIMIT {n} {lock})"
                ));
        };
        let mut select = Sql::default();
        // Round 1 reads the candidates inside the locking read; later rounds read them first,
        // to know how far they reached.
        let candidates = if round == 0 {
            let picks = store.picks_of(
                wide.clone(),
                &req,
                &floors,
                &format!("o.{id}"),
                "",
                &PickFence::None,
            );
            for (i, pick) in picks.into_iter().enumerate() {
                if i > 0 {
                    select.push(" UNION ALL ");
                }
                let mut ids = Sql::new(&format!("SELECT w.{id} FROM ("));
                ids.append(pick).push(") w");
                locking(&mut select, i, ids);
            }
            None
        } else {
            let picks = store.picks_of(
                wide.clone(),
                &req,
                &floors,
                &format!("CAST({{pick}} AS SIGNED), o.{id}"),
                "",
                &PickFence::None,
            );
            let mut candidates: Vec<Vec<i64>> = vec![Vec::new(); plan.len()];
            for r in union(picks).query(store).fetch_all(&mut **tx).await? {
                let (pick, row) = (r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?);
                if let Some(c) = usize::try_from(pick)
                    .ok()
                    .and_then(|p| candidates.get_mut(p))
                {
                    c.push(row);
                }
            }
            let mut parts = 0;
            for (i, ids) in candidates.iter().enumerate() {
                let fresh: Vec<i64> = ids.iter().copied().filter(|r| !taken.contains(r)).collect();
                if fresh.is_empty() {
                    continue;
                }
                if parts > 0 {
                    select.push(" UNION ALL ");
                }
                parts += 1;
                let mut list = Sql::default();
                list.ints(fresh);
                locking(&mut select, i, list);
            }
            if parts == 0 {
                break;
            }
            Some(candidates)
        };
        let first = rows.len();
        let mut got = vec![0u32; plan.len()];
        for r in select.query(store).fetch_all(&mut **tx).await? {
            let pick = usize::try_from(r.try_get::<i64, _>(RETURNED_COLUMNS)?)?;
            // The newest and oldest picks of a channel can both hold a row.
            if taken.insert(r.try_get::<i64, _>(0)?) {
                if let Some(g) = got.get_mut(pick) {
                    *g += 1;
                }
                rows.push(r);
            }
        }
        // What is left of the budget of each channel whose oldest pick came back short, and
        // where its next round starts: past every row this one saw (each was taken, locked
        // by another claim, or not claimable).
        let mut next = Vec::new();
        for (i, &(filter, n, order)) in plan.iter().enumerate() {
            let (Filter::Channel(channel), Order::Oldest) = (filter, order) else {
                continue;
            };
            let of_channel = |p: usize| matches!(plan[p].0, Filter::Channel(c) if c == channel);
            let channel_got: u32 = (0..plan.len())
                .filter(|&p| of_channel(p))
                .map(|p| got[p])
                .sum();
            let budget: u32 = (0..plan.len())
                .filter(|&p| of_channel(p))
                .map(|p| plan[p].1)
                .sum();
            if got[i] >= n || channel_got >= budget {
                continue;
            }
            let high = match &candidates {
                None => rows[first..]
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
        if next.is_empty() {
            break;
        }
        req = only(&req, next, None);
        req.newest = false;
    }
    Ok(rows)
}

/// The picks as one statement.
fn union(picks: Vec<Sql>) -> Sql {
    let mut select = Sql::default();
    for (i, p) in picks.into_iter().enumerate() {
        if i > 0 {
            select.push(" UNION ALL ");
        }
        select.push("(").append(p).push(")");
    }
    select
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
    store: &SqlStore,
    rows: &mut Vec<AnyRow>,
    tx: &mut Tx<'_>,
) -> anyhow::Result<()> {
    let keyed: Vec<i64> = rows
        .iter()
        .filter(|r| has_ordering_key(r))
        .filter_map(|r| r.try_get::<i64, _>(0).ok())
        .collect();
    let Some(behind) = store.behind_an_earlier_row() else {
        return Ok(());
    };
    if keyed.is_empty() {
        return Ok(());
    }
    let id = &store.cols.id;
    let mut check = Sql::new(&format!(
        "SELECT o.{id} FROM {} o WHERE o.{id} IN (",
        store.table
    ));
    check.ints(keyed).push(&format!(") AND {behind}"));
    let blocked: HashSet<i64> = check
        .query(store)
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
    store: &SqlStore,
    req: &ClaimRequest,
    rows: &[AnyRow],
    tx: &mut Tx<'_>,
) -> anyhow::Result<()> {
    let ids = rows
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<Vec<_>, _>>()?;
    let mut u = Sql::new(&format!("UPDATE {} SET claimed_by = ", store.table));
    let id = &store.cols.id;
    u.text(&req.claimer)
        .push(", claim_token = ")
        .text(&req.token)
        .push(", claimed_until = ")
        .now_plus(store.dialect, req.ttl)
        .push(&format!(" WHERE {id} IN ("))
        .ints(ids)
        .push(")");
    u.query(store).execute(&mut **tx).await?;
    Ok(())
}

/// MySQL/MariaDB, on the relay's own table: whether any unfinished row is due at all
/// (claimed or not), read from `open_idx` alone (it holds `next_attempt_at` since schema
/// version 9). The idle read asks this first. The picks walk a channel's unfinished rows
/// in id order and read each row to compare its `next_attempt_at` (MariaDB checks nothing
/// in an index on a virtual column before it reads the row): over 100,000 rows waiting
/// for a retry an hour away, each idle read took 74 ms of the server's time, twice a
/// second (docs/design.md, "Idle cost"). "No" is final: a row that is not due is not
/// claimable. "Yes" promises nothing (the due row may be claimed, or behind its key), so
/// the picks are read next. A mapped table's `open_idx` has no `next_attempt_at`.
pub(super) async fn anything_due(store: &SqlStore) -> anyhow::Result<bool> {
    let (t, now) = (&store.table, store.dialect.now());
    let sql = format!(
        "SELECT 1 FROM {t} FORCE INDEX ({t}_open_idx) \
         WHERE open_channel IS NOT NULL AND next_attempt_at <= {now} LIMIT 1"
    );
    Ok(store.sql(&sql).fetch_optional(&store.pool).await?.is_some())
}

/// Inside the claim's transaction: whether the lease epoch is still the claimer's, holding a
/// shared lock on the lease row until the claim commits (a new holder's epoch bump waits for
/// it, and later claims of the old holder see the bump).
async fn fence_holds(
    store: &SqlStore,
    req: &ClaimRequest,
    tx: &mut Tx<'_>,
) -> anyhow::Result<bool> {
    let Some(f) = &req.fence else {
        return Ok(true);
    };
    let mut q = Sql::new("SELECT epoch FROM outbox_relay_lease WHERE name = ");
    q.text(&f.lease)
        .push(" AND epoch = ")
        .int(f.epoch)
        .push(" LOCK IN SHARE MODE");
    Ok(q.query(store).fetch_optional(&mut **tx).await?.is_some())
}
