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
    Dialect, FailedRow, Finished, LeaseRow, Requeue, RequeueReport, Sample, SqlStore, StatusReport,
};

/// Most rows one `requeue --all-failed` statement changes.
const REQUEUE_BATCH: i64 = 1000;

impl SqlStore {
    /// Counts and ages for `status`; `lease` names the lease row to show.
    pub async fn status(&self, lease: &str) -> anyhow::Result<StatusReport> {
        let t = &self.table;
        let d = self.dialect;
        let counts = self
            .sql(&format!(
                "SELECT status, channel, COUNT(*) FROM {t} GROUP BY status, channel
                 ORDER BY status, channel"
            ))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let oldest = self.oldest_pending_ms().await?;
        let mut q = Sql::new(&format!(
            "SELECT holder, epoch, -({}) FROM outbox_relay_lease WHERE name = ",
            d.age_ms("lease_until")
        ));
        q.text(lease);
        let lease = q
            .query(self)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| -> anyhow::Result<LeaseRow> {
                Ok(LeaseRow {
                    holder: r.try_get(0)?,
                    epoch: r.try_get(1)?,
                    remaining_ms: r.try_get(2)?,
                })
            })
            .transpose()?;
        let claims = self
            .sql(&format!(
                "SELECT claimed_by, COUNT(*) FROM {t}
                 WHERE claimed_until > {now} AND status IN ('PENDING', 'RETRY')
                 GROUP BY claimed_by ORDER BY claimed_by",
                now = d.now()
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
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(StatusReport {
            counts,
            oldest_pending: oldest.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            lease,
            claims,
        })
    }

    /// Age of the oldest unfinished row, by `created_at` (an index on unfinished rows'
    /// `created_at` makes this one index probe).
    async fn oldest_pending_ms(&self) -> anyhow::Result<Option<i64>> {
        let t = &self.table;
        Ok(self
            .sql(&format!(
                "SELECT {} FROM {t} WHERE status IN ('PENDING', 'RETRY')",
                self.dialect.age_ms("MIN(created_at)")
            ))
            .fetch_one(&self.pool)
            .await?
            .try_get::<Option<i64>, _>(0)?)
    }

    /// FAILED rows, newest first.
    pub async fn failed(
        &self,
        limit: u32,
        channel: Option<&str>,
    ) -> anyhow::Result<Vec<FailedRow>> {
        let mut q = Sql::new(&format!(
            "SELECT id, channel, attempts, last_error, {} FROM {} WHERE status = 'FAILED'",
            self.dialect.time_text("updated_at"),
            self.table
        ));
        if let Some(c) = channel {
            q.push(" AND channel = ").text(c);
        }
        q.push(" ORDER BY id DESC LIMIT ").int(limit as i64);
        q.query(self)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                Ok(FailedRow {
                    id: r.try_get(0)?,
                    channel: r.try_get(1)?,
                    attempts: r.try_get(2)?,
                    last_error: r.try_get(3)?,
                    updated_at: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// The SET clause that puts a FAILED row back in the queue with a fresh attempt budget
    /// (its last error stays, for the record).
    fn requeue_set(&self) -> String {
        let now = self.dialect.now();
        format!(
            "status = 'PENDING', attempts = 0, next_attempt_at = {now}, claimed_by = NULL,
             claim_token = NULL, claimed_until = NULL, updated_at = {now}"
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
        let mut report = RequeueReport::default();
        match selection {
            Requeue::Ids(ids) => {
                for chunk in ids.chunks(500) {
                    let mut q = Sql::new(&format!("SELECT id, status FROM {t} WHERE id IN ("));
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
                            "UPDATE {t} SET {} WHERE status = 'FAILED' AND {} AND id IN (",
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
                let mut filter = Sql::new("status = 'FAILED'");
                if let Some(c) = channel {
                    filter.push(" AND channel = ").text(c);
                }
                if dry_run {
                    let mut q = Sql::new(&format!("SELECT COUNT(*) FROM {t} WHERE "));
                    q.append(filter);
                    report.requeued = q
                        .query(self)
                        .fetch_one(&self.pool)
                        .await?
                        .try_get::<i64, _>(0)? as u64;
                    return Ok(report);
                }
                // In batches, so a large dead-letter backlog never becomes one huge lock. The
                // condition is checked again by the UPDATE itself, not only by the subquery
                // that picks the batch: a row changed since it was picked (requeued, purged,
                // claimed) is left alone (see docs/operations.md, "Admin verbs and a running
                // relay").
                filter.push(&format!(" AND {}", self.no_live_claim()));
                let update = Sql::new(&format!("UPDATE {t} SET {} WHERE ", self.requeue_set()));
                let q = self.in_batches(update, filter, REQUEUE_BATCH);
                loop {
                    let n = retry_transient(|| q.clone().query(self).execute(&self.pool))
                        .await?
                        .rows_affected();
                    report.requeued += n;
                    if n == 0 {
                        break;
                    }
                }
            }
        }
        Ok(report)
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
        let mut cond = Sql::new("status = ");
        cond.text(status.as_str())
            .push(" AND updated_at < ")
            .now_minus(self.dialect, older_than);
        let delete = Sql::new(&format!("DELETE FROM {} WHERE ", self.table));
        let q = self.in_batches(delete, cond, batch as i64);
        Ok(
            retry_transient(|| q.clone().query(self).execute(&self.pool))
                .await?
                .rows_affected(),
        )
    }

    /// Counts for the table gauges.
    pub async fn sample(&self) -> anyhow::Result<Sample> {
        let t = &self.table;
        let by_status = self
            .sql(&format!("SELECT status, COUNT(*) FROM {t} GROUP BY status"))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<anyhow::Result<Vec<(String, i64)>>>()?;
        let oldest = self.oldest_pending_ms().await?;
        let blocked: i64 = self
            .sql(&format!(
                "SELECT COUNT(DISTINCT o.ordering_key) FROM {t} o
                 WHERE o.status IN ('PENDING', 'RETRY') AND o.ordering_key IS NOT NULL
                 AND EXISTS (SELECT 1 FROM {t} p WHERE p.ordering_key = o.ordering_key
                     AND p.id < o.id AND p.status IN ('PENDING', 'RETRY'))"
            ))
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
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
        if let Dialect::MySql { .. } = self.dialect {
            statement.append(cond).push(" ORDER BY id LIMIT ").int(n);
            return statement;
        }
        let t = &self.table;
        statement
            .append(cond.clone())
            .push(&format!(" AND id IN (SELECT id FROM {t} WHERE "))
            .append(cond)
            .push(" ORDER BY id LIMIT ")
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
