//! The operator's queries: `status`, `failed`, `requeue`, `purge`, and the periodic sample
//! behind the `rows{status}`, `oldest_pending_seconds` and `ordering_blocked_keys` gauges.
//!
//! Guarantees: `requeue` touches only FAILED rows (other ids are reported, not changed);
//! `purge` deletes only SUCCESS or FAILED rows ([`Finished`] cannot name another status), in
//! bounded batches so it never holds long locks.

use std::time::Duration;

use sqlx::Row;

use super::builder::Sql;
use super::{
    Dialect, FailedFilter, FailedRow, Finished, Requeue, RequeueReport, Sample, SqlStore, State,
    StatusReport,
};

/// Why `purge` (and the console's purge) cannot run on a mapped table without time columns.
pub const NO_AGE: &str = "the table maps neither table.columns.updated_at nor \
                          table.columns.created_at: purge and retention need one of them to \
                          tell a row's age";

/// Most rows one `requeue --all-failed` statement changes.
const REQUEUE_BATCH: i64 = 1000;

impl SqlStore {
    /// Counts and ages for `status`; `lease` names the lease row to show.
    pub async fn status(&self, lease: &str) -> anyhow::Result<StatusReport> {
        let t = &self.table;
        let d = self.dialect;
        let c = &self.cols;
        let counts = self
            .sql(&format!(
                "SELECT {}, {}, COUNT(*) FROM {t} GROUP BY 1, 2 ORDER BY 1, 2",
                c.status_name("", d),
                d.cast_text(&c.channel(""))
            ))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let oldest = self.oldest_pending_ms().await?;
        let lease = self.lease_row(lease).await?;
        let claims = self.live_claims().await?;
        Ok(StatusReport {
            counts,
            oldest_pending: oldest.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            lease,
            claims,
        })
    }

    /// Age of the oldest unfinished row, by `created_at`. PostgreSQL and SQLite: one probe of
    /// the index on unfinished rows' `created_at`. The relay's own MySQL table: a walk of the
    /// entries of unfinished rows in `open_idx`, which holds `created_at` (schema version 8).
    async fn oldest_pending_ms(&self) -> anyhow::Result<Option<i64>> {
        let Some(created) = &self.cols.created_at else {
            return Ok(None);
        };
        let (from, open, _) = self.unfinished_rows();
        Ok(self
            .sql(&format!(
                "SELECT {} FROM {from} WHERE {open}",
                self.dialect.age_ms(&format!("MIN({created})")),
            ))
            .fetch_one(&self.pool)
            .await?
            .try_get::<Option<i64>, _>(0)?)
    }

    /// What reads the unfinished rows' `created_at` and channel from an index: the table
    /// (with its hint), the condition, and the channel as text. On the relay's own MySQL
    /// table that is `open_idx`, which holds `open_channel`, `id` and `created_at` (schema
    /// version 8); elsewhere the status condition, which the index on unfinished rows'
    /// `created_at` serves.
    pub(super) fn unfinished_rows(&self) -> (String, String, String) {
        let t = &self.table;
        match self.dialect {
            Dialect::MySql { .. } if !self.cols.mapped => (
                format!("{t} FORCE INDEX ({t}_open_idx)"),
                "open_channel IS NOT NULL".to_string(),
                "open_channel".to_string(),
            ),
            d => (t.clone(), self.cols.open(""), self.cols.channel_text("", d)),
        }
    }

    /// FAILED rows, newest first.
    pub async fn failed(
        &self,
        limit: u32,
        channel: Option<&str>,
    ) -> anyhow::Result<Vec<FailedRow>> {
        let filter = FailedFilter {
            channel: channel.map(str::to_string),
            ..FailedFilter::default()
        };
        self.failed_page(&filter, None, limit).await
    }

    /// The SET clause that puts a FAILED row back in the queue with a fresh attempt budget
    /// (its last error stays, for the record).
    fn requeue_set(&self) -> String {
        let (d, c) = (self.dialect, &self.cols);
        format!(
            "{}, {} = 0, {} = {now}, claimed_by = NULL,
             claim_token = NULL, claimed_until = NULL{}",
            c.set(State::Pending),
            c.attempts,
            c.next_attempt_at,
            c.touch(d),
            now = d.now(),
        )
    }

    /// The row is under no live claim (nobody may be delivering it).
    fn no_live_claim(&self) -> String {
        format!(
            "(claimed_until IS NULL OR claimed_until < {})",
            self.dialect.now()
        )
    }

    /// Puts FAILED rows back to PENDING (attempts reset); other rows are left alone.
    pub async fn requeue(
        &self,
        selection: &Requeue,
        dry_run: bool,
    ) -> anyhow::Result<RequeueReport> {
        let t = &self.table;
        let (d, c) = (self.dialect, &self.cols);
        let id = &c.id;
        let failed_is = c.is("", State::Failed);
        let mut report = RequeueReport::default();
        match selection {
            Requeue::Ids(ids) => {
                for chunk in ids.chunks(500) {
                    let mut q = Sql::new(&format!(
                        "SELECT {id}, {} FROM {t} WHERE {id} IN (",
                        c.status_name("", d)
                    ));
                    q.ints(chunk.iter().copied()).push(")");
                    let found = q.query(self).fetch_all(&self.pool).await?;
                    let mut failed = Vec::new();
                    for r in &found {
                        let id: i64 = r.try_get(0)?;
                        let status: String = r.try_get(1)?;
                        if status == "FAILED" {
                            failed.push(id);
                        } else {
                            report.not_failed.push((id, status));
                        }
                    }
                    for id in chunk {
                        if !found
                            .iter()
                            .any(|r| r.try_get::<i64, _>(0).is_ok_and(|x| x == *id))
                        {
                            report.missing.push(*id);
                        }
                    }
                    if !dry_run && !failed.is_empty() {
                        let mut q = Sql::new(&format!(
                            "UPDATE {t} SET {} WHERE {failed_is} AND {} AND {id} IN (",
                            self.requeue_set(),
                            self.no_live_claim(),
                        ));
                        q.ints(failed).push(")");
                        report.requeued += q.query(self).execute(&self.pool).await?.rows_affected();
                    } else {
                        report.requeued += failed.len() as u64;
                    }
                }
            }
            Requeue::AllFailed { channel } => {
                let filter = FailedFilter {
                    channel: channel.clone(),
                    ..FailedFilter::default()
                };
                report.requeued = self.requeue_matching(&filter, dry_run).await?;
            }
            Requeue::Matching(filter) => {
                report.requeued = self.requeue_matching(filter, dry_run).await?;
            }
        }
        if !dry_run && report.requeued > 0 {
            self.announce().await;
        }
        Ok(report)
    }

    /// PostgreSQL with the insert trigger: NOTIFYs the relays as the trigger does, so that
    /// requeued rows go out at once (an idle relay that NOTIFY keeps informed reads the table
    /// only every second poll interval; docs/design.md, "Idle cost"). Only a hint: a failure
    /// is logged, and the rows are found by the next read anyway.
    async fn announce(&self) {
        if self.dialect != Dialect::Postgres || !self.cols.notify {
            return;
        }
        let mut q = Sql::new("SELECT pg_notify(");
        q.text(&super::postgres::notify_channel(&self.table))
            .push(", '')");
        if let Err(e) = q.query(self).execute(&self.pool).await {
            tracing::warn!(error = %e, "could not notify the relays of requeued rows");
        }
    }

    /// Requeues (or, dry-run, counts) the FAILED rows `filter` matches; returns how many.
    async fn requeue_matching(&self, filter: &FailedFilter, dry_run: bool) -> anyhow::Result<u64> {
        let t = &self.table;
        let mut cond = self.failed_condition(filter);
        if dry_run {
            let mut q = Sql::new(&format!("SELECT COUNT(*) FROM {t} WHERE "));
            q.append(cond);
            return Ok(q
                .query(self)
                .fetch_one(&self.pool)
                .await?
                .try_get::<i64, _>(0)? as u64);
        }
        // In batches, so a large dead-letter backlog never becomes one huge lock. The
        // condition is checked again by the UPDATE itself, not only by the subquery that picks
        // the batch: a row changed since it was picked (requeued, purged, claimed) is left
        // alone (see docs/operations.md, "Admin verbs and a running relay").
        cond.push(&format!(" AND {}", self.no_live_claim()));
        let update = Sql::new(&format!("UPDATE {t} SET {} WHERE ", self.requeue_set()));
        let q = self.in_batches(update, cond, REQUEUE_BATCH);
        let mut requeued = 0;
        loop {
            let n = retry_transient(|| q.clone().query(self).execute(&self.pool))
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
        &self,
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
        let Some(changed) = self.cols.changed_at() else {
            anyhow::bail!(NO_AGE);
        };
        let mut cond = Sql::new(&self.cols.is("", state));
        cond.push(&format!(" AND {changed} < "))
            .now_minus(self.dialect, older_than);
        let delete = Sql::new(&format!("DELETE FROM {} WHERE ", self.table));
        let q = self.in_batches(delete, cond, batch as i64);
        Ok(
            retry_transient(|| q.clone().query(self).execute(&self.pool))
                .await?
                .rows_affected(),
        )
    }

    /// Counts for the table gauges. Without `count_success`, only the PENDING, RETRY and
    /// FAILED rows are counted, through the status index: the cost follows how many rows
    /// wait or failed, not how many were delivered, which on a table without retention is
    /// nearly all of it (the caller counts SUCCESS rarely, `housekeeping::SUCCESS_COUNT_EVERY`).
    pub async fn sample(&self, count_success: bool) -> anyhow::Result<Sample> {
        let t = &self.table;
        let c = &self.cols;
        let filter = if count_success {
            String::new()
        } else {
            format!(
                " WHERE {}",
                c.any_of("", &[State::Pending, State::Retry, State::Failed])
            )
        };
        let by_status = self
            .sql(&format!(
                "SELECT {}, COUNT(*) FROM {t}{filter} GROUP BY 1",
                c.status_name("", self.dialect)
            ))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<anyhow::Result<Vec<(String, i64)>>>()?;
        let oldest = self.oldest_pending_ms().await?;
        let blocked_keys = match (&c.ordering_key, self.dialect) {
            // MySQL/MariaDB: the indexed virtual column holding the key of unfinished rows
            // only (schema version 5, or `migrate --adopt`). On the plain column the inner
            // look-up had no index to use and the gauge cost grew with the square of the
            // backlog: 115 s on a keyed backlog of 50,000 rows in the chaos run.
            (Some(_), Dialect::MySql { .. }) => Some(format!(
                "SELECT COUNT(DISTINCT o.open_key) FROM {t} o WHERE o.open_key IS NOT NULL
                 AND EXISTS (SELECT 1 FROM {t} p WHERE p.open_key = o.open_key
                     AND p.{id} < o.{id})",
                id = c.id
            )),
            (Some(k), _) => Some(format!(
                "SELECT COUNT(DISTINCT o.{k}) FROM {t} o
                 WHERE {} AND o.{k} IS NOT NULL
                 AND EXISTS (SELECT 1 FROM {t} p WHERE p.{k} = o.{k}
                     AND p.{id} < o.{id} AND {})",
                c.open("o."),
                c.open("p."),
                id = c.id
            )),
            (None, _) => None,
        };
        let blocked: i64 = match blocked_keys {
            Some(q) => self.sql(&q).fetch_one(&self.pool).await?.try_get(0)?,
            None => 0,
        };
        Ok(Sample {
            by_status,
            oldest_pending: oldest.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            ordering_blocked_keys: blocked,
        })
    }
}

impl SqlStore {
    /// `{statement} {cond}` limited to the first `n` matching rows in id order. MySQL has
    /// `UPDATE/DELETE ... ORDER BY ... LIMIT`; elsewhere the batch is picked by a subquery, and
    /// `cond` is checked by the outer statement too, so a row changed since it was picked is
    /// left alone.
    fn in_batches(&self, mut statement: Sql, cond: Sql, n: i64) -> Sql {
        let id = &self.cols.id;
        if let Dialect::MySql { .. } = self.dialect {
            statement
                .append(cond)
                .push(&format!(" ORDER BY {id} LIMIT "))
                .int(n);
            return statement;
        }
        let t = &self.table;
        statement
            .append(cond.clone())
            .push(&format!(" AND {id} IN (SELECT {id} FROM {t} WHERE "))
            .append(cond)
            .push(&format!(" ORDER BY {id} LIMIT "))
            .int(n)
            .push(")");
        statement
    }
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
                if tries >= 5 || !super::is_transient(&e) {
                    return Err(e);
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
