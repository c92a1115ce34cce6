//! `status` and the periodic sample behind the `rows{status}`, `oldest_pending_seconds` and
//! `ordering_blocked_keys` gauges.
//!
//! Guarantee: neither grows with the delivered rows unless asked to (`sample` counts SUCCESS
//! rows only when told, see `housekeeping::SUCCESS_COUNT_EVERY`).

use std::time::Duration;

use sqlx::Row;

use super::AdminSql;
use crate::store::db::Db;
use crate::store::locks::lease_table::lease_row;
use crate::store::model::{Sample, StatusReport};
use crate::store::sql::State;

/// Counts and ages for `status`; `lease` names the lease row to show. Every row is counted
/// under a state: the relay's, `PARKED`, or on a mapped table `NULL` and `UNKNOWN(<value>)`
/// (see `Columns::state_name`); a NULL channel shows as `NULL`.
pub async fn status(db: &Db, sql: &dyn AdminSql, lease: &str) -> anyhow::Result<StatusReport> {
    let (s, c) = (db.syntax(), db.cols());
    let counts = db
        .sql(&format!(
            "SELECT {}, {}, COUNT(*) FROM {} GROUP BY 1, 2 ORDER BY 1, 2",
            c.state_name("", s),
            s.cast_text(&c.channel("")),
            db.table()
        ))
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| {
            let channel: Option<String> = r.try_get(1)?;
            let channel = channel.unwrap_or_else(|| "NULL".into());
            Ok((r.try_get(0)?, channel, r.try_get(2)?))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let oldest = oldest_pending_ms(db, sql).await?;
    Ok(StatusReport {
        counts,
        oldest_pending: oldest.map(|ms| Duration::from_millis(ms.max(0) as u64)),
        lease: lease_row(db, lease).await?,
        claims: live_claims(db).await?,
    })
}

/// Age of the oldest unfinished row, by `created_at`, read from an index of unfinished rows
/// ([`AdminSql::unfinished_rows`]).
async fn oldest_pending_ms(db: &Db, sql: &dyn AdminSql) -> anyhow::Result<Option<i64>> {
    let Some(q) = oldest_pending_sql(db, sql) else {
        return Ok(None);
    };
    Ok(db
        .sql(&q)
        .fetch_one(db.pool())
        .await?
        .try_get::<Option<i64>, _>(0)?)
}

/// [`oldest_pending_ms`]'s statement; `None` where the table has no `created_at`.
fn oldest_pending_sql(db: &Db, sql: &dyn AdminSql) -> Option<String> {
    let created = db.cols().created_at.as_ref()?;
    let (from, open, _) = sql.unfinished_rows(db);
    Some(format!(
        "SELECT {} FROM {from} WHERE {open}",
        db.syntax().age_ms(&format!("MIN({created})")),
    ))
}

/// The statements of the two gauges that read the unfinished rows (the oldest row's age,
/// the blocked keys), as [`sample`] runs them, for tests of their plans.
pub fn gauge_statements(db: &Db, sql: &dyn AdminSql) -> Vec<String> {
    [oldest_pending_sql(db, sql), sql.blocked_keys(db)]
        .into_iter()
        .flatten()
        .collect()
}

/// Live claims per instance: (claimed_by, rows under a claim that has not run out). Parked
/// rows are not claims of an instance (`status` counts them as `PARKED`).
pub async fn live_claims(db: &Db) -> anyhow::Result<Vec<(String, i64)>> {
    db.sql(&format!(
        "SELECT claimed_by, COUNT(*) FROM {t}
         WHERE claimed_until > {now} AND {open} AND NOT ({parked})
         GROUP BY claimed_by ORDER BY claimed_by",
        t = db.table(),
        now = db.syntax().now(),
        open = db.cols().open(""),
        parked = db.cols().parked("")
    ))
    .fetch_all(db.pool())
    .await?
    .iter()
    .map(|r| {
        Ok((
            r.try_get::<Option<String>, _>(0)?.unwrap_or_default(),
            r.try_get(1)?,
        ))
    })
    .collect()
}

/// Counts for the table gauges. Without `count_success`, only the PENDING, RETRY and
/// FAILED rows are counted, through the status index: the cost follows how many rows
/// wait or failed, not how many were delivered, which on a table without retention is
/// nearly all of it (the caller counts SUCCESS rarely, `housekeeping::SUCCESS_COUNT_EVERY`).
pub async fn sample(db: &Db, sql: &dyn AdminSql, count_success: bool) -> anyhow::Result<Sample> {
    let c = db.cols();
    let filter = if count_success {
        String::new()
    } else {
        format!(
            " WHERE {}",
            c.any_of("", &[State::Pending, State::Retry, State::Failed])
        )
    };
    let by_status = db
        .sql(&format!(
            "SELECT {}, COUNT(*) FROM {}{filter} GROUP BY 1",
            c.status_name("", db.syntax()),
            db.table()
        ))
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<anyhow::Result<Vec<(String, i64)>>>()?;
    let oldest = oldest_pending_ms(db, sql).await?;
    let blocked: i64 = match sql.blocked_keys(db) {
        Some(q) => db.sql(&q).fetch_one(db.pool()).await?.try_get(0)?,
        None => 0,
    };
    Ok(Sample {
        by_status,
        oldest_pending: oldest.map(|ms| Duration::from_millis(ms.max(0) as u64)),
        ordering_blocked_keys: blocked,
    })
}
