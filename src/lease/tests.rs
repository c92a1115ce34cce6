//! The [`Keeper`] on a paused clock, over a scripted [`Lease`] and an in-memory epoch table:
//! renewal at ttl/3, loss, the deadline less the drift allowance, reconnection and release
//! (docs/design.md, "Leases and fencing"). Time moves only when every task waits, so the
//! instants asserted here are exact.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{Grant, Keeper, Lease, LeaseState, Tenure, drift};
use crate::BoxFuture;
use crate::store::{Answer, Epoch, Hold, LeaseTable};

/// What the next renewals answer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Renew {
    Ok,
    Reject,
    Fail,
    /// Never answers.
    Hang,
}

/// A lease backend that does what the test says.
struct Scripted {
    /// The name (`test`) and ttl; the holder is scripted (see [`Lease::holder`] below).
    tenure: Tenure,
    /// Whether an acquire succeeds now.
    free: AtomicBool,
    renew: Mutex<Renew>,
    renewals: Mutex<Vec<Instant>>,
    releases: Mutex<Vec<Instant>>,
    acquisitions: AtomicU32,
    reconnect: Notify,
    lost: Notify,
}

impl Scripted {
    fn new(ttl: Duration) -> Arc<Scripted> {
        Arc::new(Scripted {
            tenure: Tenure::new("test", "h", ttl),
            free: AtomicBool::new(true),
            renew: Mutex::new(Renew::Ok),
            renewals: Mutex::new(Vec::new()),
            releases: Mutex::new(Vec::new()),
            acquisitions: AtomicU32::new(0),
            reconnect: Notify::new(),
            lost: Notify::new(),
        })
    }

    fn set_renew(&self, r: Renew) {
        *self.renew.lock().expect("renew") = r;
    }

    fn renewals(&self) -> Vec<Instant> {
        self.renewals.lock().expect("renewals").clone()
    }
}

impl Lease for Scripted {
    fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    /// `h<n>` for the n-th acquisition: a fresh holder each time, as every backend's is.
    fn holder(&self) -> String {
        format!("h{}", self.acquisitions.load(Ordering::SeqCst))
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        Box::pin(async move {
            if !self.free.swap(false, Ordering::SeqCst) {
                return Ok(None);
            }
            self.acquisitions.fetch_add(1, Ordering::SeqCst);
            Ok(Some(Grant {
                epoch: None,
                sent_at: Instant::now(),
            }))
        })
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(async move {
            self.renewals.lock().expect("renewals").push(Instant::now());
            let mode = *self.renew.lock().expect("renew");
            match mode {
                Renew::Ok => Ok(true),
                Renew::Reject => Ok(false),
                Renew::Fail => anyhow::bail!("connection reset"),
                Renew::Hang => std::future::pending().await,
            }
        })
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            self.releases.lock().expect("releases").push(Instant::now());
            self.free.store(true, Ordering::SeqCst);
            Ok(())
        })
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(max.min(Duration::from_millis(100))))
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn reconnected(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.reconnect.notified())
    }

    fn lost(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.lost.notified())
    }
}

/// The epoch column of `outbox_relay_lease`, in memory.
#[derive(Default)]
struct Epochs {
    epoch: AtomicI64,
    /// How long a bump takes (waiting for a database connection, say).
    delay: Mutex<Duration>,
}

impl LeaseTable for Epochs {
    fn lease_acquire<'a>(&'a self, _: &'a str, _: &'a str, _: Duration) -> Epoch<'a> {
        Box::pin(async { anyhow::bail!("the keeper never takes the database lease itself") })
    }

    fn lease_renew<'a>(&'a self, _: Hold<'a>, _: Duration) -> Answer<'a, bool> {
        Box::pin(async { anyhow::bail!("not used by the keeper") })
    }

    fn lease_release<'a>(&'a self, _: Hold<'a>) -> Answer<'a, ()> {
        Box::pin(async { anyhow::bail!("not used by the keeper") })
    }

    fn advance_epoch<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, anyhow::Result<i64>> {
        Box::pin(async {
            let delay = *self.delay.lock().expect("delay");
            tokio::time::sleep(delay).await;
            Ok(self.epoch.fetch_add(1, Ordering::SeqCst) + 1)
        })
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

const TTL: Duration = Duration::from_secs(3);
const RENEW_TIMEOUT: Duration = Duration::from_millis(500);

fn start(lease: &Arc<Scripted>) -> (Keeper, watch::Receiver<LeaseState>) {
    let keeper = Keeper::start(lease.clone(), Arc::new(Epochs::default()), RENEW_TIMEOUT);
    let rx = keeper.state();
    (keeper, rx)
}

/// Waits for a state matching `want` and returns when it was seen.
async fn until(
    rx: &mut watch::Receiver<LeaseState>,
    want: impl Fn(&LeaseState) -> bool,
) -> Instant {
    let seen = tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|s| want(s)))
        .await
        .expect("state reached within a minute");
    drop(seen.expect("keeper alive"));
    Instant::now()
}

fn held(s: &LeaseState) -> bool {
    matches!(
        s,
        LeaseState::Held {
            confirmed: true,
            ..
        }
    )
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl_and_extends_the_deadline_from_each_send() {
    let lease = Scripted::new(TTL);
    let (keeper, mut rx) = start(&lease);
    let acquired = until(&mut rx, held).await;
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    let renewals = lease.renewals();
    assert_eq!(renewals.len(), 10, "{renewals:?}");
    for (i, at) in renewals.iter().enumerate() {
        assert_eq!(*at - acquired, TTL / 3 * (i as u32 + 1));
    }
    match *rx.borrow() {
        LeaseState::Held {
            epoch,
            deadline,
            confirmed,
        } => {
            assert_eq!(epoch, 1);
            assert!(confirmed);
            assert_eq!(deadline, renewals[9] + TTL - drift(TTL));
        }
        s => panic!("not held: {s:?}"),
    }
    keeper.release().await;
}

#[tokio::test(start_paused = true)]
async fn unanswered_renewals_end_the_hold_at_the_deadline_less_the_drift() {
    let lease = Scripted::new(TTL);
    let (keeper, mut rx) = start(&lease);
    let acquired = until(&mut rx, held).await;
    lease.set_renew(Renew::Hang);
    let deadline = acquired + TTL - drift(TTL);
    // The first renewal times out: still held until the deadline, but nothing new may be
    // claimed until a renewal confirms it.
    let unconfirmed = until(&mut rx, |s| {
        matches!(
            s,
            LeaseState::Held {
                confirmed: false,
                ..
            }
        )
    })
    .await;
    assert_eq!(unconfirmed - acquired, TTL / 3 + RENEW_TIMEOUT);
    assert!(rx.borrow().fence("test").is_none());
    // The relay stops at the deadline from the state itself, whatever the keeper is doing.
    let state = *rx.borrow();
    tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
    assert!(matches!(state, LeaseState::Held { deadline: d, .. } if d == deadline));
    let lost = until(&mut rx, |s| *s == LeaseState::Standby).await;
    assert!(
        lost >= deadline && lost <= deadline + RENEW_TIMEOUT,
        "{:?}",
        lost - acquired
    );
    keeper.release().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_renewal_is_retried_soon_and_a_success_confirms_the_hold_again() {
    let lease = Scripted::new(TTL);
    let (keeper, mut rx) = start(&lease);
    let acquired = until(&mut rx, held).await;
    lease.set_renew(Renew::Fail);
    until(&mut rx, |s| {
        matches!(
            s,
            LeaseState::Held {
                confirmed: false,
                ..
            }
        )
    })
    .await;
    lease.set_renew(Renew::Ok);
    let confirmed = until(&mut rx, held).await;
    // Retried after ttl/10 (300 ms), not after another ttl/3.
    assert_eq!(confirmed - acquired, TTL / 3 + TTL / 10);
    assert_eq!(
        lease.acquisitions.load(Ordering::SeqCst),
        1,
        "the hold was kept"
    );
    keeper.release().await;
}

#[tokio::test(start_paused = true)]
async fn a_rejected_renewal_ends_the_hold_at_once_and_the_next_hold_has_a_new_epoch() {
    let lease = Scripted::new(TTL);
    let (keeper, mut rx) = start(&lease);
    let acquired = until(&mut rx, held).await;
    assert!(matches!(*rx.borrow(), LeaseState::Held { epoch: 1, .. }));
    lease.set_renew(Renew::Reject);
    let lost = until(&mut rx, |s| *s == LeaseState::Standby).await;
    assert_eq!(lost - acquired, TTL / 3);
    // Someone else holds it for a while; then it is free again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(*rx.borrow(), LeaseState::Standby);
    lease.set_renew(Renew::Ok);
    lease.free.store(true, Ordering::SeqCst);
    until(&mut rx, held).await;
    assert!(matches!(*rx.borrow(), LeaseState::Held { epoch: 2, .. }));
    assert_eq!(lease.holder(), "h2", "a fresh holder token");
    keeper.release().await;
}

#[tokio::test(start_paused = true)]
async fn a_reconnected_backend_is_unconfirmed_until_a_renewal_confirms_the_hold() {
    let lease = Scripted::new(TTL);
    let (keeper, mut rx) = start(&lease);
    let acquired = until(&mut rx, held).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The reconnection is noticed at once and a renewal is sent at once to confirm the hold;
    // until it answers, nothing new may be claimed.
    lease.set_renew(Renew::Hang);
    lease.reconnect.notify_one();
    let unconfirmed = until(&mut rx, |s| {
        matches!(
            s,
            LeaseState::Held {
                confirmed: false,
                ..
            }
        )
    })
    .await;
    assert_eq!(unconfirmed - acquired, Duration::from_millis(200));
    assert!(rx.borrow().fence("test").is_none());
    assert_eq!(
        lease.renewals(),
        vec![unconfirmed],
        "renewed at the reconnection"
    );
    lease.set_renew(Renew::Ok);
    // That renewal times out (500 ms); the retry 300 ms later confirms the hold.
    let confirmed = until(&mut rx, held).await;
    assert_eq!(confirmed - unconfirmed, RENEW_TIMEOUT + TTL / 10);
    assert!(rx.borrow().fence("test").is_some());
    keeper.release().await;
}

#[tokio::test(start_paused = true)]
async fn a_hold_the_backend_reports_lost_stops_at_once_without_a_release() {
    let lease = Scripted::new(TTL);
    let (keeper, mut rx) = start(&lease);
    let acquired = until(&mut rx, held).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A GET_LOCK session found dead between renewals: Standby at that instant, not at the
    // next renewal, and no release is sent for a hold that is gone.
    lease.lost.notify_one();
    let standby = until(&mut rx, |s| *s == LeaseState::Standby).await;
    assert_eq!(standby - acquired, Duration::from_millis(200));
    assert!(lease.renewals().is_empty(), "no renewal was due yet");
    assert!(lease.releases.lock().expect("releases").is_empty());
    keeper.release().await;
}

#[tokio::test(start_paused = true)]
async fn release_stops_the_watchdog_before_giving_the_lease_back() {
    let lease = Scripted::new(TTL);
    let (keeper, mut rx) = start(&lease);
    until(&mut rx, held).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    keeper.release().await;
    let released = lease.releases.lock().expect("releases").clone();
    assert_eq!(released.len(), 1);
    assert!(lease.renewals().iter().all(|r| *r <= released[0]));
    assert_eq!(*rx.borrow(), LeaseState::Standby);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(lease.renewals().len(), 1, "renewed after the release");
}

#[tokio::test(start_paused = true)]
async fn an_epoch_bump_slower_than_the_grant_is_abandoned_and_the_lease_given_back() {
    // A bump landing after the hold ran out would follow the next holder's and fence it out.
    let lease = Scripted::new(TTL);
    let epochs = Arc::new(Epochs::default());
    *epochs.delay.lock().expect("delay") = TTL * 2;
    let keeper = Keeper::start(lease.clone(), epochs.clone(), RENEW_TIMEOUT);
    let mut rx = keeper.state();
    tokio::time::sleep(TTL * 3).await;
    assert_eq!(
        *rx.borrow(),
        LeaseState::Standby,
        "never held on a late bump"
    );
    assert_eq!(
        epochs.epoch.load(Ordering::SeqCst),
        0,
        "no bump after the deadline"
    );
    assert!(
        !lease.releases.lock().expect("releases").is_empty(),
        "given back"
    );
    // A bump within the grant: held, at the bumped epoch.
    *epochs.delay.lock().expect("delay") = TTL / 10;
    until(&mut rx, held).await;
    assert!(matches!(*rx.borrow(), LeaseState::Held { epoch: 1, .. }));
    keeper.release().await;
}
