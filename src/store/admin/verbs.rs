//! The verbs that change rows: `enqueue`, `requeue` (also the console's) and `purge` (also
//! retention's and the console's).
//!
//! Guarantees: `requeue` touches only FAILED rows under no live claim (other ids are
//! reported, not changed); `purge` deletes only SUCCESS or FAILED rows ([`Finished`] cannot
//! name another status), in bounded batches so it never holds long locks. Both check their
//! condition again when they write, not only when they pick a batch (docs/design.md, "Admin
//! verbs").

use std::time::Duration;

use sqlx::Row;

use super::console::failed_condition;
use super::{AdminSql, NO_AGE};
use crate::sink::TraceContext;
use crate::store::db::Db;
use crate::store::fault::is_transient;
use crate::store::model::{FailedFilter, Finished, NewRow, Requeue, RequeueReport};
use crate::store::sql::{Sql, State};

/// Most rows one `requeue --all-failed` statement changes.
const REQUEUE_BATCH: i64 = 1000;

/// Inserts a row into the relay's own table and returns its id (the `enqueue` verb, tests
/// and benchmarks).
pub async fn enqueue(
    db: &Db,
    sql: &dyn AdminSql,
    row: &NewRow,
    trace: Option<&TraceContext>,
) -> anyhow::Result<i64> {
    anyhow::ensure!(
        !db.cols().mapped,
        "enqueue writes the relay's own table; a table mapped by [table] is written by its \
         application"
    );
    // The trace columns are named only when given, so that a row without them inserts into
    // a table of any schema version.
    let traced = if trace.is_some() {
        ", traceparent, tracestate"
    } else {
        ""
    };
    let mut q = Sql::new(&format!(
        "INSERT INTO {} (channel, recipient, payload, ordering_key{traced}) VALUES (",
        db.table()
    ));
    q.text(&row.channel)
        .push(", ")
        .opt_text(row.recipient.clone())
        .push(", ");
    q.payload(db.syntax(), &row.payload)
        .push(", ")
        .opt_text(row.ordering_key.clone());
    if let Some(t) = trace {
        q.push(", ")
            .text(&t.traceparent())
            .push(", ")
            .opt_text(t.state.clone());
    }
    q.push(")");
    sql.insert(db, q).await
}

/// The SET clause that puts a FAILED row back in the queue with a fresh attempt budget
/// (its last error stays, for the record).
fn requeue_set(db: &Db) -> String {
    let (s, c) = (db.syntax(), db.cols());
    format!(
        "{}, {} = 0, {} = {now}, claimed_by = NULL,
         claim_token = NULL, claimed_until = NULL{}",
        c.set(State::Pending),
        c.attempts,
        c.next_attempt_at,
        c.touch(s),
        now = s.now(),
    )
}

/// The row is under no live claim (nobody may be delivering it).
fn no_live_claim(db: &Db) -> String {
    format!(
        "(claimed_until IS NULL OR claimed_until < {})",
        db.syntax().now()
    )
}

/// Puts FAILED rows back to PENDING (attempts reset); other rows are left alone.
pub async fn requeue(
    db: &Db,
    sql: &dyn AdminSql,
    selection: &Requeue,
    dry_run: bool,
) -> anyhow::Result<RequeueReport> {
    let mut report = RequeueReport::default();
    match selection {
        Requeue::Ids(ids) => {
            for chunk in ids.chunks(500) {
                requeue_ids(db, chunk, dry_run, &mut report).await?;
            }
        }
        Requeue::AllFailed { channel } => {
            let filter = FailedFilter {
                channel: channel.clone(),
                ..FailedFilter::default()
            };
            report.requeued = requeue_matching(db, sql, &filter, dry_run).await?;
        }
        Requeue::Matching(filter) => {
            report.requeued = requeue_matching(db, sql, filter, dry_run).await?;
        }
    }
    if !dry_run && report.requeued > 0 {
        sql.announce(db).await;
    }
    Ok(report)
}

/// Requeues (or, dry-run, counts) the FAILED and parked rows among `ids`; reports the
/// others. A parked row (the database refused every result for it, docs/design.md
/// "Results") is put back in the queue the same way, whatever its status.
async fn requeue_ids(
    db: &Db,
    ids: &[i64],
    dry_run: bool,
    report: &mut RequeueReport,
) -> anyhow::Result<()> {
    let (t, c) = (db.table(), db.cols());
    let id = &c.id;
    let mut q = Sql::new(&format!(
        "SELECT {id}, {} FROM {t} WHERE {id} IN (",
        c.state_name("", db.syntax())
    ));
    q.ints(ids.iter().copied()).push(")");
    let found = db.query(q).fetch_all(db.pool()).await?;
    let mut failed = Vec::new();
    for r in &found {
        let id: i64 = r.try_get(0)?;
        let status: String = r.try_get(1)?;
        if status == "FAILED" || status == "PARKED" {
            failed.push(id);
        } else {
            report.not_failed.push((id, status));
        }
    }
    for id in ids {
        if !found
            .iter()
            .any(|r| r.try_get::<i64, _>(0).is_ok_and(|x| x == *id))
        {
            report.missing.push(*id);
        }
    }
    if dry_run || failed.is_empty() {
        report.requeued += failed.len() as u64;
        return Ok(());
    }
    let mut q = Sql::new(&format!(
        "UPDATE {t} SET {} WHERE (({} AND {}) OR {}) AND {id} IN (",
        requeue_set(db),
        c.is("", State::Failed),
        no_live_claim(db),
        c.parked(""),
    ));
    q.ints(failed).push(")");
    report.requeued += db.query(q).execute(db.pool()).await?.rows_affected();
    Ok(())
}

/// Requeues (or, dry-run, counts) the FAILED rows `filter` matches; returns how many.
async fn requeue_matching(
    db: &Db,
    sql: &dyn AdminSql,
    filter: &FailedFilter,
    dry_run: bool,
) -> anyhow::Result<u64> {
    let t = db.table();
    let mut cond = failed_condition(db, filter);
    if dry_run {
        let mut q = Sql::new(&format!("SELECT COUNT(*) FROM {t} WHERE "));
        q.append(cond);
        return Ok(db
            .query(q)
            .fetch_one(db.pool())
            .await?
            .try_get::<i64, _>(0)? as u64);
    }
    // In batches, so a large dead-letter backlog never becomes one huge lock. The
    // condition is checked again by the UPDATE itself, not only by the subquery that picks
    // the batch: a row changed since it was picked (requeued, purged, claimed) is left
    // alone (see docs/operations.md, "Admin verbs and a running relay").
    cond.push(&format!(" AND {}", no_live_claim(db)));
    let update = Sql::new(&format!("UPDATE {t} SET {} WHERE ", requeue_set(db)));
    let q = sql.in_batches(db, update, cond, REQUEUE_BATCH);
    let mut requeued = 0;
    loop {
        let n = retry_transient(|| db.query(q.clone()).execute(db.pool()))
            .await?
            .rows_affected();
        requeued += n;
        if n == 0 {
            return Ok(requeued);
        }
    }
}

/// Deletes up to `batch` rows of `status` last updated more than `older_than` ago.
pub async fn purge(
    db: &Db,
    sql: &dyn AdminSql,
    status: Finished,
    older_than: Duration,
    batch: u32,
) -> anyhow::Result<u64> {
    // The status and age are checked again by the DELETE itself, not only by the subquery
    // that picks the batch: a row requeued since it was picked is never deleted.
    let state = match status {
        Finished::Success => State::Success,
        Finished::Failed => State::Failed,
    };
    let Some(changed) = db.cols().changed_at() else {
        anyhow::bail!(NO_AGE);
    };
    let mut cond = Sql::new(&db.cols().is("", state));
    cond.push(&format!(" AND {changed} < "))
        .now_minus(db.syntax(), older_than);
    let delete = Sql::new(&format!("DELETE FROM {} WHERE ", db.table()));
    let q = sql.in_batches(db, delete, cond, batch as i64);
    Ok(retry_transient(|| db.query(q.clone()).execute(db.pool()))
        .await?
        .rows_affected())
}

/// Runs a statement again (up to 5 times, 50 ms apart) when it failed transiently: admin
/// verbs race the relay and each other, and MySQL/MariaDB answer such races with deadlocks
/// (1213) that are meant to be retried.
async fn retry_transient<T, F, Fut>(mut statement: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = 0;
    loop {
        match statement().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let e = anyhow::Error::new(e);
                tries += 1;
                if tries >= 5 || !is_transient(&e) {
                    return Err(e);
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
