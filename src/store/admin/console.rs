//! The console's reads: the overview, a page of FAILED rows under a filter (also `failed`),
//! one row, and what `purge` would delete.
//!
//! Guarantees: every read is bounded (a page is at most [`MAX_PAGE`] rows, found by keyset on
//! `id`; on the relay's own table through the FAILED-rows index of schema version 6, so a page
//! costs the same on the last page of a million failed rows as on the first); no read takes a
//! lock a relay waits on; times are compared and turned into text by the database, never by
//! this process. Every column and status value is named through `Columns`, so the
//! same reads work on a table mapped by `[table]`: states are shown by the relay's names
//! (`PENDING`, ...) whatever the table stores, and an optional column the table does not have
//! reads as NULL, never as an error.

use std::time::Duration;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{AdminSql, NO_AGE};
use crate::store::db::Db;
use crate::store::model::{ChannelCounts, FailedFilter, FailedRow, Finished, RowDetail, TimeBound};
use crate::store::sql::{Sql, State};

/// Most rows one page of FAILED rows holds.
pub const MAX_PAGE: u32 = 200;

/// FAILED rows for `failed`, newest first.
pub async fn failed(
    db: &Db,
    sql: &dyn AdminSql,
    limit: u32,
    channel: Option<&str>,
) -> anyhow::Result<Vec<FailedRow>> {
    let filter = FailedFilter {
        channel: channel.map(str::to_string),
        ..FailedFilter::default()
    };
    failed_page(db, sql, &filter, None, limit).await
}

/// Per channel: unfinished and failed counts, deliveries written in the last hour, and
/// the oldest unfinished row's age. Reads only unfinished and FAILED rows and the last
/// hour of SUCCESS rows (on the relay's own table all through indexes on `status`; on a
/// mapped table through whatever indexes the application's table has), never the whole
/// history. On a mapped table the states are the table's own values, shown by the
/// relay's names; without a `created_at` column the oldest age is unknown (`None`).
pub async fn overview(db: &Db, sql: &dyn AdminSql) -> anyhow::Result<Vec<ChannelCounts>> {
    let mut out: Vec<ChannelCounts> = Vec::new();
    count_open_and_failed(db, &mut out).await?;
    count_unknown(db, &mut out).await?;
    count_delivered_last_hour(db, &mut out).await?;
    oldest_per_channel(db, sql, &mut out).await?;
    out.sort_by(|a, b| a.channel.cmp(&b.channel));
    Ok(out)
}

/// `channel`'s line of the overview, added if it is not there yet.
fn entry(out: &mut Vec<ChannelCounts>, channel: String) -> &mut ChannelCounts {
    let i = match out.iter().position(|c| c.channel == channel) {
        Some(i) => i,
        None => {
            out.push(ChannelCounts {
                channel,
                ..ChannelCounts::default()
            });
            out.len() - 1
        }
    };
    &mut out[i]
}

/// The channel in column 0 of an overview row. A mapped channel column may hold NULL: such
/// rows are counted under "".
fn channel_of(r: &AnyRow) -> anyhow::Result<String> {
    Ok(r.try_get::<Option<String>, _>(0)?.unwrap_or_default())
}

/// PENDING, RETRY, FAILED and parked rows per channel.
async fn count_open_and_failed(db: &Db, out: &mut Vec<ChannelCounts>) -> anyhow::Result<()> {
    let (s, c) = (db.syntax(), db.cols());
    let rows = db
        .sql(&format!(
            "SELECT {}, {}, COUNT(*) FROM {} WHERE {} GROUP BY 1, 2",
            c.channel_text("", s),
            c.state_name("", s),
            db.table(),
            c.any_of("", &[State::Pending, State::Retry, State::Failed])
        ))
        .fetch_all(db.pool())
        .await?;
    for r in &rows {
        let (status, n): (String, i64) = (r.try_get(1)?, r.try_get(2)?);
        let e = entry(out, channel_of(r)?);
        match status.as_str() {
            "PENDING" => e.pending += n,
            "RETRY" => e.retry += n,
            "PARKED" => e.parked += n,
            _ => e.failed += n,
        }
    }
    Ok(())
}

/// Rows of a mapped table whose status is NULL or no state's value, per channel. (The
/// relay's own table holds only its four states.) No index serves this condition: the read
/// passes the table, as the console's overview of a mapped table must to show such rows.
async fn count_unknown(db: &Db, out: &mut Vec<ChannelCounts>) -> anyhow::Result<()> {
    let (s, c) = (db.syntax(), db.cols());
    if !c.mapped {
        return Ok(());
    }
    let rows = db
        .sql(&format!(
            "SELECT {}, COUNT(*) FROM {} WHERE {} IS NULL OR NOT ({}) GROUP BY 1",
            c.channel_text("", s),
            db.table(),
            c.status,
            c.any_of("", &State::ALL)
        ))
        .fetch_all(db.pool())
        .await?;
    for r in &rows {
        let n: i64 = r.try_get(1)?;
        entry(out, channel_of(r)?).unknown += n;
    }
    Ok(())
}

/// SUCCESS rows per channel whose result was written in the last hour.
async fn count_delivered_last_hour(db: &Db, out: &mut Vec<ChannelCounts>) -> anyhow::Result<()> {
    let (s, c) = (db.syntax(), db.cols());
    // When a delivery was written: `updated_at` (set with every result), else the
    // `sent_at` the relay writes on success (its own, or the one `migrate --adopt` adds).
    let written = c.updated_at.as_deref().unwrap_or(&c.sent_at);
    let mut q = Sql::new(&format!(
        "SELECT {}, COUNT(*) FROM {} WHERE {} AND {written} > ",
        c.channel_text("", s),
        db.table(),
        c.is("", State::Success)
    ));
    q.now_minus(s, Duration::from_secs(3600))
        .push(" GROUP BY 1");
    for r in db.query(q).fetch_all(db.pool()).await? {
        let channel = channel_of(&r)?;
        entry(out, channel).delivered_last_hour = r.try_get(1)?;
    }
    Ok(())
}

/// The age of each channel's oldest unfinished row (none without a `created_at` column).
async fn oldest_per_channel(
    db: &Db,
    sql: &dyn AdminSql,
    out: &mut Vec<ChannelCounts>,
) -> anyhow::Result<()> {
    let Some(created) = &db.cols().created_at else {
        return Ok(());
    };
    let (from, open, channel) = sql.unfinished_rows(db);
    let rows = db
        .sql(&format!(
            "SELECT {channel}, {} FROM {from} WHERE {open} GROUP BY 1",
            db.syntax().age_ms(&format!("MIN({created})")),
        ))
        .fetch_all(db.pool())
        .await?;
    for r in &rows {
        let ms: Option<i64> = r.try_get(1)?;
        entry(out, channel_of(r)?).oldest_pending =
            ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
    }
    Ok(())
}

/// The condition selecting the FAILED rows `f` matches (starts with the status test), in
/// the table's own column names and status values (`[table]`; the relay's by default).
pub fn failed_condition(db: &Db, f: &FailedFilter) -> Sql {
    let (s, c) = (db.syntax(), db.cols());
    let mut q = Sql::new(&c.is("", State::Failed));
    if let Some(ch) = &f.channel {
        q.push(&format!(" AND {} = ", c.channel(""))).text(ch);
    }
    if let Some(text) = &f.error_contains {
        // `!` escapes the wildcards, so the text is matched literally on every database. Both
        // sides are folded by the database's own LOWER(), never by this process: a row's own
        // text, typed in any case the database counts as the same, finds the row
        // (docs/console.md, "Pages"; Rust and the databases fold non-ASCII text differently).
        let pattern = format!(
            "%{}%",
            text.replace('!', "!!")
                .replace('%', "!%")
                .replace('_', "!_")
        );
        // A table without a last_error column has no error text to match.
        match &c.last_error {
            Some(col) => q
                .push(&format!(" AND LOWER({}) LIKE LOWER(", s.cast_text(col)))
                .text(&pattern)
                .push(") ESCAPE '!'"),
            None => q.push(" AND 1 = 0"),
        };
    }
    // A table without a created_at column: time bounds match nothing rather than all.
    let created = c.created_at.clone().unwrap_or_else(|| "NULL".into());
    for (bound, op) in [(&f.created_from, " >= "), (&f.created_to, " < ")] {
        match bound {
            Some(TimeBound::Ago(ago)) => {
                q.push(&format!(" AND {created}"))
                    .push(op)
                    .now_minus(s, *ago);
            }
            Some(TimeBound::Unix(secs)) => {
                q.push(&format!(" AND {created}"))
                    .push(op)
                    .unix_time(s, *secs);
            }
            None => {}
        }
    }
    if let Some(max) = f.max_id {
        q.push(&format!(" AND {} <= ", c.id)).int(max);
    }
    q
}

/// Up to `limit` (at most [`MAX_PAGE`]) FAILED rows matching `f` with ids below `before`,
/// newest first: keyset paging, `WHERE status = 'FAILED' AND id < ? ORDER BY id DESC`.
pub async fn failed_page(
    db: &Db,
    sql: &dyn AdminSql,
    f: &FailedFilter,
    before: Option<i64>,
    limit: u32,
) -> anyhow::Result<Vec<FailedRow>> {
    let (s, c) = (db.syntax(), db.cols());
    let columns = format!(
        "{}, {}, {}, {}, {}, {}",
        c.id,
        c.channel_text("", s),
        c.attempts_read(""),
        c.text_or_null("", &c.last_error, s),
        // When it failed: its last update, never its creation time.
        c.time_or_null("", &c.updated_at, s),
        c.time_or_null("", &c.created_at, s),
    );
    let rows = newest_failed_first(db, sql, f, before, limit.clamp(1, MAX_PAGE), &columns).await?;
    rows.iter()
        .map(|r| {
            Ok(FailedRow {
                id: r.try_get(0)?,
                channel: r.try_get::<Option<String>, _>(1)?.unwrap_or_default(),
                attempts: r.try_get(2)?,
                last_error: r.try_get(3)?,
                // NULL on a mapped table without such a column.
                updated_at: r.try_get(4)?,
                created_at: r.try_get(5)?,
            })
        })
        .collect()
}

/// The newest FAILED row `f` matches (what a confirmed selection is capped at).
pub async fn newest_failed(
    db: &Db,
    sql: &dyn AdminSql,
    f: &FailedFilter,
) -> anyhow::Result<Option<i64>> {
    let rows = newest_failed_first(db, sql, f, None, 1, &db.cols().id).await?;
    rows.first()
        .map(|r| r.try_get::<i64, _>(0))
        .transpose()
        .map_err(Into::into)
}

/// `SELECT {columns}` of the FAILED rows `f` matches below `before`, newest first, at most
/// `limit`, walking the FAILED-rows index backwards: where the database must be told to use
/// that index ([`AdminSql::failed_rows_index`]), it is (without it a page sorted every FAILED
/// row, or walked the primary key; docs/performance-log.md). A table whose schema is older
/// than version 6 has no such index, so the plain statement is the fallback.
async fn newest_failed_first(
    db: &Db,
    sql: &dyn AdminSql,
    f: &FailedFilter,
    before: Option<i64>,
    limit: u32,
    columns: &str,
) -> anyhow::Result<Vec<AnyRow>> {
    let id = &db.cols().id;
    let statement = |from: &str, flag: &str| {
        let mut q = Sql::new(&format!("SELECT {columns} FROM {from} WHERE {flag}"));
        q.append(failed_condition(db, f));
        if let Some(b) = before {
            q.push(&format!(" AND {id} < ")).int(b);
        }
        q.push(&format!(" ORDER BY {id} DESC LIMIT "))
            .int(i64::from(limit));
        q
    };
    // A mapped table has no FAILED-rows index of the relay's (`migrate --adopt` adds only
    // the claim index): no hint.
    let hinted = match db.cols().mapped {
        true => None,
        false => sql.failed_rows_index(db),
    };
    if let Some((from, flag)) = hinted {
        match db.query(statement(&from, flag)).fetch_all(db.pool()).await {
            Ok(rows) => return Ok(rows),
            // No such index or column (a schema older than version 6, or on MySQL 8, when
            // `database.migrate` is off): the plain statement below.
            Err(e) => tracing::debug!(error = %e, "FAILED-rows index not usable"),
        }
    }
    Ok(db
        .query(statement(db.table(), ""))
        .fetch_all(db.pool())
        .await?)
}

/// How many `status` rows were last changed more than `older_than` ago: what `purge`
/// would delete now, by the same condition (the table's own status value and its
/// `updated_at`, else `created_at`).
pub async fn count_older(db: &Db, status: Finished, older_than: Duration) -> anyhow::Result<i64> {
    let state = match status {
        Finished::Success => State::Success,
        Finished::Failed => State::Failed,
    };
    let Some(changed) = db.cols().changed_at() else {
        anyhow::bail!(NO_AGE);
    };
    let mut q = Sql::new(&format!(
        "SELECT COUNT(*) FROM {} WHERE {} AND {changed} < ",
        db.table(),
        db.cols().is("", state)
    ));
    q.now_minus(db.syntax(), older_than);
    Ok(db
        .query(q)
        .fetch_one(db.pool())
        .await?
        .try_get::<i64, _>(0)?)
}

/// Every column of row `id` (the optional ones a mapped table lacks as `None`), or `None`
/// if there is no such row.
pub async fn row(db: &Db, id: i64) -> anyhow::Result<Option<RowDetail>> {
    let (s, c) = (db.syntax(), db.cols());
    let mut q = Sql::new(&format!(
        "SELECT {id}, {channel}, {status}, {attempts}, {recipient}, {payload}, {key},
                {error}, {next}, {created}, {updated}, {sent}, claimed_by,
                CASE WHEN claimed_until > {now} THEN -({left}) END
         FROM {t} WHERE {id} = ",
        id = c.id,
        channel = c.channel_text("", s),
        status = c.state_name("", s),
        attempts = c.attempts_read(""),
        recipient = c.text_or_null("", &c.recipient, s),
        payload = s.payload_text(&c.payload("", s)),
        key = c.text_or_null("", &c.ordering_key, s),
        error = c.text_or_null("", &c.last_error, s),
        next = s.time_text(&c.next_attempt_at),
        created = c.time_or_null("", &c.created_at, s),
        updated = c.time_or_null("", &c.updated_at, s),
        sent = s.time_text(&c.sent_at),
        now = s.now(),
        left = s.age_ms("claimed_until"),
        t = db.table()
    ));
    q.int(id);
    let Some(r) = db.query(q).fetch_optional(db.pool()).await? else {
        return Ok(None);
    };
    Ok(Some(RowDetail {
        id: r.try_get(0)?,
        channel: r.try_get::<Option<String>, _>(1)?.unwrap_or_default(),
        status: r.try_get(2)?,
        attempts: r.try_get(3)?,
        recipient: r.try_get(4)?,
        payload: r.try_get(5)?,
        ordering_key: r.try_get(6)?,
        last_error: r.try_get(7)?,
        next_attempt_at: r.try_get(8)?,
        created_at: r.try_get(9)?,
        updated_at: r.try_get(10)?,
        sent_at: r.try_get(11)?,
        claimed_by: r.try_get(12)?,
        claim_left_ms: r.try_get(13)?,
    }))
}
