//! Who may claim in leader mode. A [`Lease`] is one backend's primitive operations (acquire,
//! renew, release, wait for a turn); the [`Keeper`] drives any backend the same way: acquire,
//! bump the fencing epoch, renew every `ttl / 3`, and publish a [`LeaseState`] the relay loop
//! reads before every claim and every send. What a backend keeps about its lease (name, ttl,
//! the token of the current hold) and what it does with a renewal's or a release's answer is
//! the same for all of them: a [`Tenure`] (`tenure.rs`).
//!
//! Guarantees (G4; docs/design.md, "Leases and fencing"):
//! - the holder's deadline is measured on the monotonic clock from when the acquire or the
//!   last successful renewal was *sent*, minus a drift allowance (`ttl * 1% + 2ms`), so a
//!   holder stops believing it holds the lease no later than the backend forgets it;
//! - a rejected renewal, or a deadline passing without a confirmed renewal, is published as
//!   [`LeaseState::Standby`] at once; the state carries the deadline itself, so the relay stops
//!   even if the keeper task is starved;
//! - a lease is never silently re-gained: after a loss it must be acquired afresh, with a new
//!   holder token and a new epoch;
//! - on shutdown the watchdog stops *before* the release is sent.

mod build;
mod database;
mod get_lock;
mod redis;
mod redisson;
mod redlock;
mod shedlock;
mod tenure;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use build::build;
pub use database::DatabaseLease;
pub use get_lock::GetLockLease;
pub use redis::RedisLease;
pub use redisson::{RedissonLease, UNLOCK_MESSAGE, channel_name as redisson_channel};
pub use redlock::RedlockLease;
pub use shedlock::ShedLockLease;
pub use tenure::Tenure;

use crate::BoxFuture;
use crate::store::{Fence, LeaseTable};

/// What a successful acquire returns.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    /// The epoch, when the backend bumped it itself (the `database` backend); otherwise the
    /// keeper bumps it in `outbox_relay_lease`.
    pub epoch: Option<i64>,
    /// When the acquire request was sent: the deadline counts from here.
    pub sent_at: Instant,
}

/// One lease backend's primitives. Implementations keep their name, ttl and holder token in a
/// [`Tenure`], and go through it to acquire, renew and release.
pub trait Lease: Send + Sync {
    /// The lease's name, ttl and current hold.
    fn tenure(&self) -> &Tenure;
    /// The lease's name (the `outbox_relay_lease` row).
    fn name(&self) -> &str {
        self.tenure().name()
    }
    /// The holder identity written to `outbox_relay_lease.holder` for this acquisition.
    fn holder(&self) -> String {
        self.tenure().holder()
    }
    /// How long a grant lasts without renewal.
    fn ttl(&self) -> Duration {
        self.tenure().ttl()
    }
    /// One attempt to take the lease: `Some` when taken.
    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>>;
    /// Extends the lease: `Ok(true)` renewed, `Ok(false)` lost to someone else, `Err` unknown.
    /// Never re-creates a lease that is no longer ours.
    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>>;
    /// Gives the lease up, if still ours, and tells standbys.
    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// While standing by: returns when it is worth trying again, after `max` at the latest.
    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()>;
    /// A cheap round trip to the backend, for `/readyz`.
    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// Resolves when the backend's connection is next re-established (the hold may have
    /// lapsed meanwhile, unseen). Never, for backends without a connection of their own.
    fn reconnected(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
    /// While held: resolves as soon as the backend itself learns that the hold is gone,
    /// between renewals (a named lock whose session died is released by the server at that
    /// moment, not at a ttl). Never, for backends that only learn it by renewing.
    fn lost(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
}

/// What the relay loop sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Not holding: claim nothing.
    Standby,
    /// Holding at `epoch` until `deadline` (monotonic), unless renewed. `confirmed` is false
    /// from a failed renewal or a reconnection of the backend until the next successful
    /// renewal: rows already claimed may still be sent before `deadline`, but nothing new is
    /// claimed until the backend has confirmed the hold.
    Held {
        epoch: i64,
        deadline: Instant,
        confirmed: bool,
    },
}

impl LeaseState {
    /// The fence to claim under, if the lease is held and its deadline has not passed.
    pub fn fence(&self, lease: &str) -> Option<Fence> {
        match *self {
            LeaseState::Held {
                epoch,
                deadline,
                confirmed: true,
            } if Instant::now() < deadline => Some(Fence {
                lease: lease.to_string(),
                epoch,
            }),
            _ => None,
        }
    }
}

/// [`LeaseState::Held`], as the keeper publishes it.
fn held(epoch: i64, deadline: Instant, confirmed: bool) -> LeaseState {
    LeaseState::Held {
        epoch,
        deadline,
        confirmed,
    }
}

/// How often a standby of a backend without wake-ups (a database row, a named lock) tries
/// again: a tenth of the ttl, 50 ms to 1 s, so a release is taken over well within one renewal
/// interval at the cost of one cheap statement per try.
pub(crate) fn poll_every(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// The drift allowance subtracted from every grant: `ttl * 1% + 2ms` (as Redlock does).
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// Until when a grant or renewal sent at `sent_at` may be relied on: `sent_at + ttl -
/// drift(ttl)`, strictly before the backend can forget it (the drift is never zero).
pub fn deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl - drift(ttl)
}

/// Drives a [`Lease`]: acquisition, epoch bump, watchdog renewals, release on shutdown.
pub struct Keeper {
    lease: Arc<dyn Lease>,
    state: watch::Receiver<LeaseState>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Keeper {
    /// Starts the keeper task. `renew_timeout` bounds each acquire and renew round trip.
    pub fn start(
        lease: Arc<dyn Lease>,
        store: Arc<dyn LeaseTable>,
        renew_timeout: Duration,
    ) -> Keeper {
        let (tx, rx) = watch::channel(LeaseState::Standby);
        let stop = CancellationToken::new();
        let task = tokio::spawn(
            KeeperTask {
                ttl: lease.ttl(),
                lease: lease.clone(),
                store,
                renew_timeout,
                tx,
                stop: stop.clone(),
                failed_acquires: 0,
            }
            .run(),
        );
        Keeper {
            lease,
            state: rx,
            stop,
            task,
        }
    }

    /// A receiver of the lease state.
    pub fn state(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// The lease's name and a receiver of its state: what the relay loop fences its claims
    /// with (`relay::Relay::lease`).
    pub fn watch(&self) -> (String, watch::Receiver<LeaseState>) {
        (self.lease.name().to_string(), self.state())
    }

    /// The backend, for `/readyz`'s round trip.
    pub fn lease(&self) -> Arc<dyn Lease> {
        self.lease.clone()
    }

    /// Stops renewing, then releases the lease if held (standbys are told at once).
    pub async fn release(self) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "lease keeper task failed");
        }
    }
}

fn publish(tx: &watch::Sender<LeaseState>, state: LeaseState) {
    let held = matches!(state, LeaseState::Held { .. });
    metrics::gauge!(crate::metric::LEASE_HELD).set(if held { 1.0 } else { 0.0 });
    tx.send_replace(state);
}

/// The keeper task: one backend, the table of fencing epochs, and where the state is
/// published.
struct KeeperTask {
    lease: Arc<dyn Lease>,
    store: Arc<dyn LeaseTable>,
    /// Bounds each acquire, renew and release round trip.
    renew_timeout: Duration,
    ttl: Duration,
    tx: watch::Sender<LeaseState>,
    stop: CancellationToken,
    /// Acquires failed in a row: how long the next backoff is.
    failed_acquires: u32,
}

impl KeeperTask {
    /// Acquires, holds and loses (or, on shutdown, releases) the lease, over and over.
    async fn run(mut self) {
        publish(&self.tx, LeaseState::Standby);
        while !self.stop.is_cancelled() {
            let Some(grant) = self.acquire().await else {
                continue;
            };
            let deadline = self::deadline(grant.sent_at, self.ttl);
            let Some(epoch) = self.fence(&grant, deadline).await else {
                continue;
            };
            metrics::counter!(crate::metric::LEASE_ACQUISITIONS).increment(1);
            metrics::gauge!(crate::metric::LEASE_EPOCH).set(epoch as f64);
            tracing::info!(lease = self.lease.name(), holder = %self.lease.holder(), epoch, "lease acquired");
            publish(&self.tx, held(epoch, deadline, true));
            let lost_reason = self.hold(epoch, deadline, grant.sent_at).await;
            publish(&self.tx, LeaseState::Standby);
            self.end_hold(epoch, lost_reason).await;
        }
        publish(&self.tx, LeaseState::Standby);
    }

    /// One attempt to take the lease. `None`: not taken; it has waited for a turn (someone
    /// else holds it) or backed off (the attempt failed).
    async fn acquire(&mut self) -> Option<Grant> {
        let (lease, ttl) = (&self.lease, self.ttl);
        let attempt = tokio::time::timeout(self.renew_timeout, lease.try_acquire()).await;
        match attempt {
            Ok(Ok(Some(grant))) => {
                self.failed_acquires = 0;
                Some(grant)
            }
            Ok(Ok(None)) => {
                self.failed_acquires = 0;
                tokio::select! {
                    _ = self.stop.cancelled() => {}
                    _ = lease.wait_turn(ttl) => {}
                }
                None
            }
            Ok(Err(e)) => {
                self.failed_acquires += 1;
                tracing::warn!(lease = lease.name(), error = %e, "lease acquire failed");
                backoff(&self.stop, self.failed_acquires, ttl / 3).await;
                None
            }
            Err(_) => {
                self.failed_acquires += 1;
                tracing::warn!(lease = lease.name(), "lease acquire timed out");
                backoff(&self.stop, self.failed_acquires, ttl / 3).await;
                None
            }
        }
    }

    /// The epoch to fence claims with under `grant`, good until `deadline`. `None`: the
    /// grant could not be used and was given back.
    ///
    /// The epoch is bumped only while the grant is still ours: a bump that landed after our
    /// hold ran out (say, after waiting for a database connection) would come after the next
    /// holder's bump and fence that holder out for as long as it renews (found by the chaos
    /// run: a whole cluster stalled). So the bump is abandoned at the deadline.
    async fn fence(&self, grant: &Grant, deadline: Instant) -> Option<i64> {
        let lease = &self.lease;
        let epoch = match grant.epoch {
            Some(e) => e,
            None => match tokio::time::timeout_at(
                deadline,
                self.store.advance_epoch(lease.name(), &lease.holder()),
            )
            .await
            {
                Ok(Ok(e)) => e,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not record the lease epoch; giving the lease back");
                    let _ = lease.release().await;
                    backoff(&self.stop, 1, self.ttl / 3).await;
                    return None;
                }
                Err(_) => {
                    tracing::warn!(
                        lease = lease.name(),
                        "the lease epoch was not recorded before the grant ran out; giving the lease back"
                    );
                    let _ = lease.release().await;
                    return None;
                }
            },
        };
        if Instant::now() >= deadline {
            tracing::warn!(
                lease = lease.name(),
                "lease granted too late to use; releasing"
            );
            let _ = lease.release().await;
            return None;
        }
        Some(epoch)
    }

    /// The watchdog: renews every ttl/3 (sooner after a failed renewal) until shutdown
    /// (`None`) or the hold is lost (why).
    async fn hold(
        &self,
        epoch: i64,
        mut deadline: Instant,
        sent_at: Instant,
    ) -> Option<&'static str> {
        let lease = &self.lease;
        let mut next = sent_at + self.ttl / 3;
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return None,
                _ = tokio::time::sleep_until(next.min(deadline)) => {}
                _ = lease.lost() => return Some("the backend reported the hold gone"),
                _ = lease.reconnected() => {
                    // The backend's connection was re-established: whether the hold survived
                    // is unknown until a renewal confirms it; claim nothing new until then.
                    tracing::info!(lease = lease.name(), "lease backend reconnected; confirming the hold before claiming again");
                    publish(&self.tx, held(epoch, deadline, false));
                }
            }
            if Instant::now() >= deadline {
                return Some("deadline passed without a confirmed renewal");
            }
            match self.renew(epoch, deadline).await {
                Ok(renewed) => (deadline, next) = renewed,
                Err(reason) => return Some(reason),
            }
        }
    }

    /// Sends one renewal and publishes what it says: the deadline and when to renew next,
    /// or (`Err`) why the hold is lost.
    async fn renew(
        &self,
        epoch: i64,
        deadline: Instant,
    ) -> Result<(Instant, Instant), &'static str> {
        let (lease, ttl) = (&self.lease, self.ttl);
        let sent = Instant::now();
        let outcome = tokio::time::timeout(self.renew_timeout, lease.renew()).await;
        let result = match &outcome {
            Ok(Ok(true)) => "ok",
            Ok(Ok(false)) => "rejected",
            Ok(Err(_)) => "error",
            Err(_) => "timeout",
        };
        metrics::counter!(crate::metric::LEASE_RENEWALS, "result" => result).increment(1);
        match outcome {
            Ok(Ok(true)) => {
                let deadline = self::deadline(sent, ttl);
                publish(&self.tx, held(epoch, deadline, true));
                return Ok((deadline, sent + ttl / 3));
            }
            Ok(Ok(false)) => return Err("renewal rejected: another holder has the lease"),
            Ok(Err(e)) => {
                tracing::warn!(lease = lease.name(), error = %e, "lease renewal failed; retrying")
            }
            Err(_) => tracing::warn!(lease = lease.name(), "lease renewal timed out; retrying"),
        }
        let next = Instant::now() + (ttl / 10).max(Duration::from_millis(20));
        publish(&self.tx, held(epoch, deadline, false));
        Ok((deadline, next))
    }

    /// After a hold: a loss is counted and reported; on shutdown (the watchdog has stopped)
    /// the lease is given back.
    async fn end_hold(&self, epoch: i64, lost_reason: Option<&'static str>) {
        let lease = &self.lease;
        if let Some(reason) = lost_reason {
            metrics::counter!(crate::metric::LEASE_LOST).increment(1);
            tracing::warn!(
                lease = lease.name(),
                epoch,
                reason,
                "lease lost; delivery stopped"
            );
            return;
        }
        match tokio::time::timeout(self.renew_timeout, lease.release()).await {
            Ok(Ok(())) => tracing::info!(lease = lease.name(), epoch, "lease released"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "lease release failed; it will expire")
            }
            Err(_) => tracing::warn!("lease release timed out; it will expire"),
        }
    }
}

/// Waits after a failed acquire: exponential, but never longer than `cap` (the renewal
/// interval), so that after a backend outage a standby still tries at least once per renewal
/// interval and a holder that dies is replaced within ttl + ttl/3, as when nothing failed.
async fn backoff(stop: &CancellationToken, failures: u32, cap: Duration) {
    let d = Duration::from_millis(200) * 2u32.saturating_pow(failures.min(5));
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(d.min(cap).min(Duration::from_secs(5))) => {}
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod props;
