//! The console's reads: the overview, a page of FAILED rows under a filter, one row, the lease
//! row and the live claims (the last two shared with `status`).
//!
//! Guarantees: every read is bounded (a page is at most [`MAX_PAGE`] rows, found by keyset on
//! `id`; on the relay's own table through the FAILED-rows index of schema version 6, so a page
//! costs the same on the last page of a million failed rows as on the first); no read takes a
//! lock a relay waits on; times are compared and turned into text by the database, never by
//! this process. Every column and status value is named through [`super::Columns`], so the
//! same reads work on a table mapped by `[table]`: states are shown by the relay's names
//! (`PENDING`, ...) whatever the table stores, and an optional column the table does not have
//! reads as NULL, never as an error.

use std::time::Duration;

use sqlx::Row;

use super::admin::NO_AGE;
use super::builder::Sql;
use super::{
    ChannelCounts, Dialect, FailedFilter, FailedRow, Finished, LeaseRow, RowDetail, SqlStore,
    State, TimeBound,
};

/// Most rows one page of FAILED rows holds.
pub const MAX_PAGE: u32 = 200;

impl SqlStore {
    /// The lease row `name`: holder, epoch and time left (negative once expired).
    pub(super) async fn lease_row(&self, name: &str) -> anyhow::Result<Option<LeaseRow>> {
        let mut q = Sql::new(&format!(
            "SELECT holder, epoch, -({}) FROM outbox_relay_lease WHERE name = ",
            self.dialect.age_ms("lease_until")
        ));
        q.text(name);
        q.query(self)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| -> anyhow::Result<LeaseRow> {
                Ok(LeaseRow {
                    holder: r.try_get(0)?,
                    epoch: r.try_get(1)?,
                    remaining_ms: r.try_get(2)?,
                })
            })
            .transpose()
    }

    /// Live claims per instance: (claimed_by, rows under a claim that has not run out).
    pub async fn live_claims(&self) -> anyhow::Result<Vec<(String, i64)>> {
        self.sql(&format!(
            "SELECT claimed_by, COUNT(*) FROM {t}
             WHERE claimed_until > {now} AND {open}
             GROUP BY claimed_by ORDER BY claimed_by",
            t = self.table,
            now = self.dialect.now(),
            open = self.cols.open("")
        ))
        .fetch_all(&self.pool)
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

    /// The lease row `name`, for the console (`None` before any acquisition).
    pub async fn lease(&self, name: &str) -> anyhow::Result<Option<LeaseRow>> {
        self.lease_row(name).await
    }

    /// Per channel: unfinished and failed counts, deliveries written in the last hour, and
    /// the oldest unfinished row's age. Reads only unfinished and FAILED rows and the last
    /// hour of SUCCESS rows (on the relay's own table all through indexes on `status`; on a
    /// mapped table through whatever indexes the application's table has), never the whole
    /// history. On a mapped table the states are the table's own values, shown by the
    /// relay's names; without a `created_at` column the oldest age is unknown (`None`).
    pub async fn overview(&self) -> anyhow::Result<Vec<ChannelCounts>> {
        let t = &self.table;
        let (d, c) = (self.dialect, &self.cols);
        let mut out: Vec<ChannelCounts> = Vec::new();
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
        // A mapped channel column may hold NULL: such rows are counted under "".
        let channel_of = |r: &sqlx::any::AnyRow| -> anyhow::Result<String> {
            Ok(r.try_get::<Option<String>, _>(0)?.unwrap_or_default())
        };
        let ch = c.channel_text("", d);
        let rows = self
            .sql(&format!(
                "SELECT {ch}, {}, COUNT(*) FROM {t} WHERE {} GROUP BY 1, 2",
                c.status_name("", d),
                c.any_of("", &[State::Pending, State::Retry, State::Failed])
            ))
            .fetch_all(&self.pool)
            .await?;
        for r in &rows {
            let (status, n): (String, i64) = (r.try_get(1)?, r.try_get(2)?);
            let e = entry(&mut out, channel_of(r)?);
            match status.as_str() {
                "PENDING" => e.pending += n,
                "RETRY" => e.retry += n,
                _ => e.failed += n,
            }
        }
        // When a delivery was written: `updated_at` (set with every result), else the
        // `sent_at` the relay writes on success (its own, or the one `migrate --adopt` adds).
        let written = c.updated_at.as_deref().unwrap_or(&c.sent_at);
        let mut q = Sql::new(&format!(
            "SELECT {ch}, COUNT(*) FROM {t} WHERE {} AND {written} > ",
            c.is("", State::Success)
        ));
        q.now_minus(d, Duration::from_secs(3600))
            .push(" GROUP BY 1");
        for r in q.query(self).fetch_all(&self.pool).await? {
            let channel = channel_of(&r)?;
            entry(&mut out, channel).delivered_last_hour = r.try_get(1)?;
        }
        if let Some(created) = &c.created_at {
            let (from, open, channel) = self.unfinished_rows();
            let rows = self
                .sql(&format!(
                    "SELECT {channel}, {} FROM {from} WHERE {open} GROUP BY 1",
                    d.age_ms(&format!("MIN({created})")),
                ))
                .fetch_all(&self.pool)
                .await?;
            for r in &rows {
                let ms: Option<i64> = r.try_get(1)?;
                entry(&mut out, channel_of(r)?).oldest_pending =
                    ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
            }
        }
        out.sort_by(|a, b| a.channel.cmp(&b.channel));
        Ok(out)
    }

    /// The condition selecting the FAILED rows `f` matches (starts with the status test), in
    /// the table's own column names and status values (`[table]`; the relay's by default).
    pub(super) fn failed_condition(&self, f: &FailedFilter) -> Sql {
        let (d, c) = (self.dialect, &self.cols);
        let mut q = Sql::new(&c.is("", State::Failed));
        if let Some(ch) = &f.channel {
            q.push(&format!(" AND {} = ", c.channel(""))).text(ch);
        }
        if let Some(text) = &f.error_contains {
            // `!` escapes the wildcards, so the text is matched literally on every database.
            let pattern = format!(
                "%{}%",
                text.to_lowercase()
                    .replace('!', "!!")
                    .replace('%', "!%")
                    .replace('_', "!_")
            );
            // A table without a last_error column has no error text to match.
            match &c.last_error {
                Some(col) => q
                    .push(&format!(" AND LOWER({}) LIKE ", d.cast_text(col)))
                    .text(&pattern)
                    .push(" ESCAPE '!'"),
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
                        .now_minus(d, *ago);
                }
                Some(TimeBound::Unix(secs)) => {
                    q.push(&format!(" AND {created}"))
                        .push(op)
                        .unix_time(d, *secs);
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
        &self,
        f: &FailedFilter,
        before: Option<i64>,
        limit: u32,
    ) -> anyhow::Result<Vec<FailedRow>> {
        let d = self.dialect;
        let rows = self
            .newest_failed_first(f, before, limit.clamp(1, MAX_PAGE), &{
                let c = &self.cols;
                format!(
                    "{}, {}, {}, {}, {}, {}",
                    c.id,
                    c.channel_text("", d),
                    c.attempts_read(""),
                    c.text_or_null("", &c.last_error, d),
                    // When it failed: its last update, never its creation time.
                    c.time_or_null("", &c.updated_at, d),
                    c.time_or_null("", &c.created_at, d),
                )
            })
            .await?;
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
    pub async fn newest_failed(&self, f: &FailedFilter) -> anyhow::Result<Option<i64>> {
        let rows = self.newest_failed_first(f, None, 1, &self.cols.id).await?;
        rows.first()
            .map(|r| r.try_get::<i64, _>(0))
            .transpose()
            .map_err(Into::into)
    }

    /// `SELECT {columns}` of the FAILED rows `f` matches below `before`, newest first, at
    /// most `limit`, walking the FAILED-rows index backwards. MariaDB/MySQL and SQLite are
    /// told to use that index (measured on a million rows with 50,000 FAILED: left to itself
    /// MariaDB sorted every FAILED row of a channel, 150 ms, or walked the primary key, 760 ms;
    /// SQLite, without ANALYZE statistics, sorts every FAILED row; with the index a page takes
    /// under 1 ms). A table whose schema is older than version 6 has no such index, so the
    /// plain statement is the fallback.
    async fn newest_failed_first(
        &self,
        f: &FailedFilter,
        before: Option<i64>,
        limit: u32,
        columns: &str,
    ) -> anyhow::Result<Vec<sqlx::any::AnyRow>> {
        let t = &self.table;
        let statement = |from: &str, flag: &str| {
            let mut q = Sql::new(&format!("SELECT {columns} FROM {from} WHERE {flag}"));
            q.append(self.failed_condition(f));
            if let Some(b) = before {
                q.push(&format!(" AND {} < ", self.cols.id)).int(b);
            }
            q.push(&format!(" ORDER BY {} DESC LIMIT ", self.cols.id))
                .int(i64::from(limit));
            q
        };
        // A mapped table has no FAILED-rows index of the relay's (`migrate --adopt` adds only
        // the claim index): no hint.
        // MySQL's index is on `failed_flag` (schema version 8), which only a condition on
        // that column lets the server use.
        let hinted = match self.dialect {
            _ if self.cols.mapped => None,
            Dialect::MySql { .. } => Some((
                format!("{t} FORCE INDEX ({t}_failed_idx)"),
                "failed_flag = 1 AND ",
            )),
            Dialect::Sqlite => Some((format!("{t} INDEXED BY {t}_failed_idx"), "")),
            // PostgreSQL's statistics (kept fresh by autovacuum) pick the index by themselves.
            Dialect::Postgres => None,
        };
        if let Some((from, flag)) = hinted {
            match statement(&from, flag)
                .query(self)
                .fetch_all(&self.pool)
                .await
            {
                Ok(rows) => return Ok(rows),
                // No such index or column (a schema older than version 6, or on MySQL 8, when
                // `database.migrate` is off): the plain statement below.
                Err(e) => tracing::debug!(error = %e, "FAILED-rows index not usable"),
            }
        }
        Ok(statement(t, "").query(self).fetch_all(&self.pool).await?)
    }

    /// How many `status` rows were last changed more than `older_than` ago: what `purge`
    /// would delete now, by the same condition (the table's own status value and its
    /// `updated_at`, else `created_at`).
    pub async fn count_older(&self, status: Finished, older_than: Duration) -> anyhow::Result<i64> {
        let state = match status {
            Finished::Success => State::Success,
            Finished::Failed => State::Failed,
        };
        let Some(changed) = self.cols.changed_at() else {
            anyhow::bail!(NO_AGE);
        };
        let mut q = Sql::new(&format!(
            "SELECT COUNT(*) FROM {} WHERE {} AND {changed} < ",
            self.table,
            self.cols.is("", state)
        ));
        q.now_minus(self.dialect, older_than);
        Ok(q.query(self)
            .fetch_one(&self.pool)
            .await?
            .try_get::<i64, _>(0)?)
    }

    /// Every column of row `id` (the optional ones a mapped table lacks as `None`), or
    /// `None` if there is no such row.
    pub async fn row(&self, id: i64) -> anyhow::Result<Option<RowDetail>> {
        let (d, c) = (self.dialect, &self.cols);
        let mut q = Sql::new(&format!(
            "SELECT {id}, {channel}, {status}, {attempts}, {recipient}, {payload}, {key},
                    {error}, {next}, {created}, {updated}, {sent}, claimed_by,
                    CASE WHEN claimed_until > {now} THEN -({left}) END
             FROM {t} WHERE {id} = ",
            id = c.id,
            channel = c.channel_text("", d),
            status = c.status_name("", d),
            attempts = c.attempts_read(""),
            recipient = c.text_or_null("", &c.recipient, d),
            payload = d.payload_text(&c.payload("", d)),
            key = c.text_or_null("", &c.ordering_key, d),
            error = c.text_or_null("", &c.last_error, d),
            next = d.time_text(&c.next_attempt_at),
            created = c.time_or_null("", &c.created_at, d),
            updated = c.time_or_null("", &c.updated_at, d),
            sent = d.time_text(&c.sent_at),
            now = d.now(),
            left = d.age_ms("claimed_until"),
            t = self.table
        ));
        q.int(id);
        let Some(r) = q.query(self).fetch_optional(&self.pool).await? else {
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
}
