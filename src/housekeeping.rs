//! Background chores of `run` besides delivery: sampling the table for the `rows{status}`,
//! `oldest_pending_seconds` and `ordering_blocked_keys` gauges, and retention (deleting old
//! SUCCESS / FAILED rows).
//!
//! Guarantees: retention deletes only finished rows, in small batches, and runs on one
//! instance at a time (it takes its own short database lease, `<lease.name>:retention`, so
//! this holds in claim mode and with the Redis lease too); a failing chore logs and tries
//! again later, never stopping delivery.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::RetentionSettings;
use crate::store::{Finished, Hold, LeaseTable, STATUSES, SqlStore};

/// How often the table is sampled for the gauges.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(15);
/// How often retention looks for old rows.
pub const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// Rows deleted per statement.
pub const PURGE_BATCH: u32 = 500;
/// The retention lease lasts this long; a pass stops before it runs out.
const RETENTION_LEASE: Duration = Duration::from_secs(300);

/// How often the SUCCESS rows are counted for `rows{status="SUCCESS"}`. They are nearly the
/// whole table, and counting them reads an index entry per row (a million rows: a full pass
/// of the status index every time); the other statuses are counted at every sample, at a cost
/// that follows how many rows wait or failed.
pub const SUCCESS_COUNT_EVERY: Duration = Duration::from_secs(300);

/// Samples the table every [`SAMPLE_EVERY`] (SUCCESS rows every [`SUCCESS_COUNT_EVERY`])
/// until `stop`.
pub async fn sample_loop(store: Arc<SqlStore>, stop: CancellationToken) {
    let mut success_counted: Option<tokio::time::Instant> = None;
    loop {
        let count_success = success_counted.is_none_or(|t| t.elapsed() >= SUCCESS_COUNT_EVERY);
        match store.sample(count_success).await {
            Ok(s) => {
                if count_success {
                    success_counted = Some(tokio::time::Instant::now());
                }
                for status in STATUSES {
                    if status == "SUCCESS" && !count_success {
                        // Keeps its last count.
                        continue;
                    }
                    let n = s
                        .by_status
                        .iter()
                        .find(|(st, _)| st == status)
                        .map_or(0, |(_, n)| *n);
                    metrics::gauge!(crate::metric::ROWS, "status" => status).set(n as f64);
                }
                metrics::gauge!(crate::metric::OLDEST_PENDING)
                    .set(s.oldest_pending.map_or(0.0, |d| d.as_secs_f64()));
                metrics::gauge!(crate::metric::ORDERING_BLOCKED_KEYS)
                    .set(s.ordering_blocked_keys as f64);
            }
            Err(e) => tracing::warn!(error = %e, "sampling the outbox table failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

/// Deletes rows older than the retention settings, every [`RETENTION_EVERY`], until `stop`.
pub async fn retention_loop(
    store: Arc<SqlStore>,
    retention: RetentionSettings,
    lease_name: String,
    holder: String,
    stop: CancellationToken,
) {
    let rules: Vec<(Finished, Duration)> = [
        (Finished::Success, retention.success_after),
        (Finished::Failed, retention.failed_after),
    ]
    .into_iter()
    .filter_map(|(s, d)| d.map(|d| (s, d)))
    .collect();
    if rules.is_empty() {
        return;
    }
    let lease = format!("{lease_name}:retention");
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RETENTION_EVERY) => {}
        }
        match store.lease_acquire(&lease, &holder, RETENTION_LEASE).await {
            Ok(Some(epoch)) => {
                match purge_all(store.as_ref(), &rules, &stop, RETENTION_LEASE / 2).await {
                    Ok(0) => {}
                    Ok(deleted) => tracing::info!(deleted, "retention: old rows deleted"),
                    Err(e) => tracing::warn!(error = %e, "retention: purge failed"),
                }
                if let Err(e) = store
                    .lease_release(Hold {
                        name: &lease,
                        holder: &holder,
                        epoch,
                    })
                    .await
                {
                    tracing::debug!(error = %e, "retention lease release failed; it expires");
                }
            }
            Ok(None) => {} // another instance does it
            Err(e) => tracing::warn!(error = %e, "retention: cannot take its lease"),
        }
    }
}

/// Deletes every row matching `rules`, batch by batch, until none is left, `stop`, or
/// `budget` has passed. Returns the rows deleted.
pub async fn purge_all(
    store: &SqlStore,
    rules: &[(Finished, Duration)],
    stop: &CancellationToken,
    budget: Duration,
) -> anyhow::Result<u64> {
    let until = tokio::time::Instant::now() + budget;
    let mut deleted = 0;
    for (status, older_than) in rules {
        loop {
            if stop.is_cancelled() || tokio::time::Instant::now() >= until {
                return Ok(deleted);
            }
            let n = store.purge(*status, *older_than, PURGE_BATCH).await?;
            if n == 0 {
                break;
            }
            deleted += n;
            // Let other work at the table between batches.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(deleted)
}
