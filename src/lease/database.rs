//! The `database` lease: the row `outbox_relay_lease(name)` itself, ShedLock-style, but renewed
//! by the watchdog and fenced by its epoch. Acquire is a conditional UPDATE on the database
//! clock (free, or expired), which bumps the epoch in the same statement.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Grant, Held, Lease, holder_token, poll_every};
use crate::BoxFuture;
use crate::store::LeaseTable;

/// A lease kept in the outbox database.
pub struct DatabaseLease {
    store: Arc<dyn LeaseTable>,
    /// The row's name.
    name: String,
    /// This instance's id; the holder token is `<instance_id>#<random>` per acquisition.
    instance_id: String,
    ttl: Duration,
    /// (holder token, epoch) while held.
    held: Held<(String, i64)>,
}

impl DatabaseLease {
    pub fn new(store: Arc<dyn LeaseTable>, name: &str, instance_id: &str, ttl: Duration) -> Self {
        DatabaseLease {
            store,
            name: name.to_string(),
            instance_id: instance_id.to_string(),
            ttl,
            held: Held::new(),
        }
    }
}

impl Lease for DatabaseLease {
    fn name(&self) -> &str {
        &self.name
    }

    fn holder(&self) -> String {
        self.held
            .get()
            .map(|(h, _)| h)
            .unwrap_or_else(|| self.instance_id.clone())
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        Box::pin(async move {
            let token = holder_token(&self.instance_id);
            let sent_at = Instant::now();
            match self
                .store
                .lease_acquire(&self.name, &token, self.ttl)
                .await?
            {
                Some(epoch) => {
                    self.held.set(Some((token, epoch)));
                    Ok(Some(Grant {
                        epoch: Some(epoch),
                        sent_at,
                    }))
                }
                None => Ok(None),
            }
        })
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(async move {
            let Some((token, epoch)) = self.held.get() else {
                return Ok(false);
            };
            let renewed = self
                .store
                .lease_renew(&self.name, &token, epoch, self.ttl)
                .await?;
            if !renewed {
                self.held.set(None);
            }
            Ok(renewed)
        })
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            if let Some((token, epoch)) = self.held.get() {
                self.held.set(None);
                self.store.lease_release(&self.name, &token, epoch).await?;
            }
            Ok(())
        })
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        // Standbys poll the row.
        Box::pin(tokio::time::sleep(poll_every(self.ttl).min(max)))
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        self.store.ping()
    }
}
