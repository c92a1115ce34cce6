//! The `database` lease: the row `outbox_relay_lease(name)` itself, ShedLock-style, but renewed
//! by the watchdog and fenced by its epoch. Acquire is a conditional UPDATE on the database
//! clock (free, or expired), which bumps the epoch in the same statement.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Grant, Lease, Tenure, poll_every};
use crate::BoxFuture;
use crate::store::{self, LeaseTable};

/// A lease kept in the outbox database.
pub struct DatabaseLease {
    store: Arc<dyn LeaseTable>,
    /// The row's name, the ttl, and while held the holder token (`<instance_id>#<random>` per
    /// acquisition) with the epoch the acquire bumped.
    tenure: Tenure,
}

impl DatabaseLease {
    pub fn new(store: Arc<dyn LeaseTable>, name: &str, instance_id: &str, ttl: Duration) -> Self {
        DatabaseLease {
            store,
            tenure: Tenure::new(name, instance_id, ttl),
        }
    }
}

impl DatabaseLease {
    /// The lease row as held under `token` at `epoch`.
    fn row<'a>(&'a self, token: &'a str, epoch: i64) -> store::Hold<'a> {
        store::Hold::new(self.name(), token, epoch)
    }
}

impl Lease for DatabaseLease {
    fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        Box::pin(async move {
            // Not `Tenure::acquire`: the grant carries the epoch this statement bumped.
            let token = self.tenure.new_token();
            let sent_at = Instant::now();
            let epoch = self
                .store
                .lease_acquire(self.name(), &token, self.ttl())
                .await?;
            Ok(epoch.map(|epoch| {
                let grant = Grant {
                    epoch: Some(epoch),
                    sent_at,
                };
                self.tenure.keep(token, grant)
            }))
        })
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(self.tenure.renew(move |hold| async move {
            // Every grant of this backend carries its epoch; a hold without one is not ours.
            let Some(epoch) = hold.epoch else {
                return Ok(false);
            };
            self.store
                .lease_renew(self.row(&hold.token, epoch), self.ttl())
                .await
        }))
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.tenure.release(move |hold| async move {
            match hold.epoch {
                Some(epoch) => self.store.lease_release(self.row(&hold.token, epoch)).await,
                None => Ok(()),
            }
        }))
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        // Standbys poll the row.
        Box::pin(tokio::time::sleep(poll_every(self.ttl()).min(max)))
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        self.store.ping()
    }
}
