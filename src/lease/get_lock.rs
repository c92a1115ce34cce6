//! The `mysql-get-lock` lease: MySQL/MariaDB's named lock `GET_LOCK(lease.name, 0)`, held on
//! a dedicated connection of the relay's, so a Java poller that runs
//! `SELECT GET_LOCK('name', 0)` before each batch and the relay exclude each other.
//!
//! Guarantees:
//! - the lock is the server's: it is held exactly as long as the session that took it, and
//!   released by the server the moment that connection closes or dies (a relay killed with
//!   -9 frees it at once, with no ttl to wait out);
//! - while held, a watcher task asks the server every ttl/10 (50 ms to 1 s) whether this very
//!   session still holds it (`IS_USED_LOCK(name) = CONNECTION_ID()`), and so does the keeper's
//!   renewal every ttl/3. A failed query means the connection is gone, and with it the lock,
//!   so it is reported as lost (not "unknown"): the keeper publishes Standby and sending stops
//!   at once. `lease.ttl` bounds how long the relay keeps sending on a hold it has not
//!   re-confirmed; nothing on the server expires;
//! - release is `RELEASE_LOCK(name)` and closing the session, after the watchdog stopped;
//! - `GET_LOCK` has no wake-up: standbys try again every ttl/10 (50 ms to 1 s) on their own
//!   dedicated session;
//! - every acquisition also bumps the fencing epoch in `outbox_relay_lease` (for other
//!   relays; the Java poller is kept out by the lock itself).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use super::{Grant, Lease, Tenure, poll_every};
use crate::BoxFuture;
use crate::store::{LockSession, SqlStore};

/// A `GET_LOCK` named lock as a lease.
pub struct GetLockLease {
    store: Arc<SqlStore>,
    /// The lock's name, the ttl, and while held the holder token recorded with the epoch (the
    /// server knows the holder by its session, not by the token).
    tenure: Tenure,
    /// The dedicated session: kept while standing by too (a poll costs one statement, not a
    /// connection), dropped whenever a statement on it fails.
    session: Arc<Mutex<Option<LockSession>>>,
    /// True from an acquisition until the hold is known gone (released, or found lost by the
    /// watcher or a renewal); [`Lease::lost`] waits for false.
    holding: watch::Sender<bool>,
}

impl GetLockLease {
    pub fn new(store: Arc<SqlStore>, name: &str, instance_id: &str, ttl: Duration) -> Self {
        GetLockLease {
            store,
            tenure: Tenure::new(name, instance_id, ttl),
            session: Arc::new(Mutex::new(None)),
            holding: watch::Sender::new(false),
        }
    }

    /// Forgets the hold: no session, no token, and [`Lease::lost`] resolves.
    fn forget(&self, guard: &mut Option<LockSession>) {
        *guard = None;
        self.tenure.forget();
        self.holding.send_replace(false);
    }

    /// Starts the watcher of one hold: every [`poll_every`] it checks on its own task (so a
    /// query is never cut off half-way by the keeper's timers) that the session still holds
    /// the lock; when it does not, or the check fails, the session is dropped (closing it,
    /// which releases anything it held) and the hold is reported lost. It ends with the hold.
    fn watch_hold(&self) {
        let session = self.session.clone();
        let holding = self.holding.clone();
        let name = self.name().to_string();
        let every = poll_every(self.ttl());
        tokio::spawn(async move {
            let mut rx = holding.subscribe();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = rx.wait_for(|h| !*h) => return,
                }
                let mut guard = session.lock().await;
                if !*holding.borrow() {
                    return;
                }
                let ok = match guard.as_mut() {
                    Some(s) => {
                        match tokio::time::timeout(every.max(Duration::from_millis(500)), s.holds())
                            .await
                        {
                            Ok(Ok(h)) => h,
                            Ok(Err(e)) => {
                                tracing::warn!(lease = %name, error = %e, "GET_LOCK session lost");
                                false
                            }
                            Err(_) => {
                                tracing::warn!(lease = %name, "GET_LOCK session did not answer");
                                false
                            }
                        }
                    }
                    None => false,
                };
                if !ok {
                    *guard = None;
                    holding.send_replace(false);
                    return;
                }
            }
        });
    }
}

impl Lease for GetLockLease {
    fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        Box::pin(async move {
            let mut guard = self.session.lock().await;
            let sent_at = Instant::now();
            let what = "GET_LOCK (lease.backend = \"mysql-get-lock\")";
            let mut session = match guard.take() {
                Some(s) => s,
                None => self.store.lock_session(self.name()).await.context(what)?,
            };
            // On an error the session is dropped (closed): whatever it may hold goes with it.
            let taken = session.try_lock().await.context(what)?;
            *guard = Some(session);
            if !taken {
                return Ok(None);
            }
            // Not `Tenure::acquire`: the token only names the hold (the server knows the
            // session), and it is kept before the session's lock is let go.
            let grant = Grant {
                epoch: None,
                sent_at,
            };
            let grant = self.tenure.keep(self.tenure.new_token(), grant);
            drop(guard);
            // One watcher per hold (a hold the keeper gave up on by its deadline and then took
            // again on the same session is still watched by the first).
            if !self.holding.send_replace(true) {
                self.watch_hold();
            }
            Ok(Some(grant))
        })
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        // The hold's token is not sent: the server knows the holder by its session.
        Box::pin(self.tenure.renew(move |_| async move {
            let mut guard = self.session.lock().await;
            let holds = match guard.as_mut() {
                Some(session) => match session.holds().await {
                    Ok(h) => h,
                    Err(e) => {
                        // The session is gone, and the server released its lock with it.
                        tracing::warn!(lease = %self.name(), error = %e, "GET_LOCK session lost");
                        false
                    }
                },
                None => false,
            };
            if !holds {
                // Never keep a session that lost its lock: the next acquire starts afresh.
                self.forget(&mut guard);
            }
            Ok(holds)
        }))
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let session = {
                let mut guard = self.session.lock().await;
                let session = guard.take();
                self.forget(&mut guard);
                session
            };
            if let Some(session) = session {
                session.release().await?;
            }
            Ok(())
        })
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(poll_every(self.ttl()).min(max)))
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.store.ping())
    }

    fn lost(&self) -> BoxFuture<'_, ()> {
        let mut rx = self.holding.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|h| !*h).await;
        })
    }
}
