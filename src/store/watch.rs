//! Noticing new rows on databases without NOTIFY (MySQL/MariaDB, SQLite, and PostgreSQL with
//! `database.listen = false`): the newest id is read every [`NEW_ROWS_CHECK`] and the relay
//! loop is woken when it grows, so a committed row waits about that long instead of up to
//! `relay.poll_interval`.
//!
//! Cost: one `SELECT MAX(id)` per check, answered from the end of the primary key (one index
//! probe, whatever the table holds), about 16 per second, idle or not. With the idle poll's
//! read (`ClaimRequest::probe_first`, two a second) and the lease's renewals, an idle relay
//! stays under 20 statements a second in all (docs/design.md, "Idle cost"). It is only a hint,
//! like NOTIFY: the poll stays the source of truth. A row that commits after a row with a
//! higher id (MySQL allocates ids before commit) does not move the maximum; it is found by
//! the next claim or poll.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::sql::SqlStore;

/// How often the newest id is read: a new row waits at most this long before the claim
/// that takes it starts (32 ms on average). At 50 ms the checks alone were 20 a second, all
/// an idle relay may cost the database (docs/design.md, "Idle cost").
pub const NEW_ROWS_CHECK: Duration = Duration::from_millis(64);

impl SqlStore {
    /// The highest id in the table, if any row exists.
    pub async fn newest_id(&self) -> anyhow::Result<Option<i64>> {
        let row = self
            .sql(&format!("SELECT MAX({}) FROM {}", self.cols.id, self.table))
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<Option<i64>, _>(0)?)
    }
}

/// Wakes `wake` whenever the newest id grows, until `stop`. Errors are left to the relay loop
/// (its claims fail and report them); the check just tries again next time.
pub async fn watch_new_rows(store: Arc<SqlStore>, wake: Arc<Notify>, stop: CancellationToken) {
    // `None` until the first successful read; then the newest id seen (`None` in it: empty).
    let mut newest: Option<Option<i64>> = None;
    let mut tick = tokio::time::interval(NEW_ROWS_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Ok(now) = store.newest_id().await {
            match newest {
                Some(seen) if now > seen => {
                    wake.notify_one();
                    newest = Some(now);
                }
                Some(_) => {}
                None => newest = Some(now),
            }
        }
    }
}
