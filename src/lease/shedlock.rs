//! The `shedlock` lease: the row `lease.name` of a ShedLock table (`lease.shedlock_table`, in
//! the outbox database), taken, extended and released with ShedLock's own statements (see
//! `store/shedlock.rs`), so a Spring poller whose `@SchedulerLock(name = ...)` names the same
//! row and the relay exclude each other.
//!
//! Guarantees:
//! - the row is taken only when it is absent or its `lock_until` has passed on the database
//!   clock, exactly as ShedLock takes it; a Java run holding it keeps the relay out until it
//!   ends (ShedLock then sets `lock_until` to now, or to `locked_at + lockAtLeastFor`) or its
//!   `lockAtMostFor` runs out;
//! - while held, the keeper extends `lock_until` to now + `lease.ttl` every ttl/3, like
//!   ShedLock's `KeepAliveLockProvider`, and only while `locked_by` is still ours and the row
//!   unexpired: an expired row is never revived (the relay stands by at once);
//! - `locked_by` is `<instance_id>#<random>`, new for every acquisition, so a restarted relay
//!   is a new holder and never extends its predecessor's row;
//! - release sets `lock_until` to now, only on our own row, after the watchdog stopped;
//! - ShedLock has no wake-up: standbys poll the row every ttl/10 (50 ms to 1 s), so a release
//!   is taken over well within one renewal interval;
//! - every acquisition also bumps the fencing epoch in `outbox_relay_lease` (for other
//!   relays; the Java poller is kept out by the row itself).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::{Grant, Lease, Tenure, poll_every};
use crate::BoxFuture;
use crate::store::{ShedLockTable, SqlStore};

/// A ShedLock row as a lease.
pub struct ShedLockLease {
    store: Arc<SqlStore>,
    /// The ShedLock table and the clock its times are in.
    table: ShedLockTable,
    /// The row's `name` (the `@SchedulerLock` name of the Java side), the ttl, and our
    /// `locked_by` while we believe we hold the row.
    tenure: Tenure,
}

impl ShedLockLease {
    pub fn new(
        store: Arc<SqlStore>,
        table: ShedLockTable,
        name: &str,
        instance_id: &str,
        ttl: Duration,
    ) -> Self {
        ShedLockLease {
            store,
            table,
            tenure: Tenure::new(name, instance_id, ttl),
        }
    }

    /// Errors name the setting and table (a missing table is the usual one).
    fn context(&self) -> String {
        format!("ShedLock table {} (lease.shedlock_table)", self.table.table)
    }
}

impl Lease for ShedLockLease {
    fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        Box::pin(self.tenure.acquire(move |token| async move {
            self.store
                .shedlock(&self.table)
                .acquire(self.name(), &token, self.ttl())
                .await
                .with_context(|| self.context())
        }))
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(self.tenure.renew(move |hold| async move {
            self.store
                .shedlock(&self.table)
                .extend(self.name(), &hold.token, self.ttl())
                .await
                .with_context(|| self.context())
        }))
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.tenure.release(move |hold| async move {
            self.store
                .shedlock(&self.table)
                .release(self.name(), &hold.token)
                .await
                .with_context(|| self.context())
        }))
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        // ShedLock publishes nothing: poll.
        Box::pin(tokio::time::sleep(poll_every(self.ttl()).min(max)))
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.store.ping())
    }
}
