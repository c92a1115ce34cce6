//! The relay loop on a paused clock, over an in-memory [`Queue`] and timed fake sinks: what
//! the loop promises (docs/design.md, "Claims", "Sending", "Shutdown") without a database or
//! a process. Time only moves when every task waits, so each figure below is exact.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Relay;
use crate::BoxFuture;
use crate::config::{Mode, RelaySettings, RetrySettings};
use crate::lease::LeaseState;
use crate::sink::{Delivery, Outcome, Sink, SinkHandle, SinkRegistry};
use crate::store::{Arrivals, ClaimRequest, ClaimedRow, Completion, Probe, Queue, Resolution};
use crate::telemetry::Health;

/// A row of the in-memory table.
struct MemRow {
    channel: String,
    /// PENDING, RETRY, SUCCESS or FAILED.
    status: &'static str,
    attempts: u32,
    /// Not claimable before this.
    due: Instant,
    /// The live claim's token.
    token: Option<Arc<str>>,
}

/// One claim as the queue saw it.
#[derive(Debug, Clone)]
struct ClaimLog {
    at: Instant,
    /// Rows claimed and not yet completed when this claim arrived.
    outstanding: usize,
    /// Rows this claim took.
    got: usize,
    /// The epoch it was fenced on.
    epoch: Option<i64>,
    /// Whether it asked for some of each channel's newest rows too.
    newest: bool,
}

/// The outbox as a map, with the claim and result semantics of the SQL store (due rows in id
/// order, budgets per channel, results only under the live claim's token).
#[derive(Default)]
struct MemQueue {
    rows: Mutex<BTreeMap<i64, MemRow>>,
    claims: Mutex<Vec<ClaimLog>>,
    /// When each idle poll's read came, and what it found.
    probes: Mutex<Vec<(Instant, Probe)>>,
    results: Mutex<Vec<(Instant, Completion)>>,
    /// The next this many claims fail, as a database outage would.
    failing_claims: AtomicUsize,
    /// How long each claim statement takes.
    claim_delay: Mutex<Duration>,
}

impl MemQueue {
    fn with_rows(channels: &[(&str, usize)]) -> Arc<MemQueue> {
        let q = MemQueue::default();
        {
            let mut rows = q.rows.lock().expect("rows");
            let now = Instant::now();
            for (channel, n) in channels {
                for _ in 0..*n {
                    let id = rows.len() as i64 + 1;
                    rows.insert(
                        id,
                        MemRow {
                            channel: channel.to_string(),
                            status: "PENDING",
                            attempts: 0,
                            due: now,
                            token: None,
                        },
                    );
                }
            }
        }
        Arc::new(q)
    }

    /// Adds row `id` of channel `a` in `status` (attempted once if RETRY), due at `due`.
    fn put(&self, id: i64, status: &'static str, due: Instant) {
        let row = MemRow {
            channel: "a".into(),
            status,
            attempts: u32::from(status == "RETRY"),
            due,
            token: None,
        };
        self.rows.lock().expect("rows").insert(id, row);
    }

    fn count(&self, status: &str) -> usize {
        let rows = self.rows.lock().expect("rows");
        rows.values().filter(|r| r.status == status).count()
    }

    fn claims(&self) -> Vec<ClaimLog> {
        self.claims.lock().expect("claims").clone()
    }

    fn probes(&self) -> Vec<(Instant, Probe)> {
        self.probes.lock().expect("probes").clone()
    }

    fn results(&self) -> Vec<(Instant, Completion)> {
        self.results.lock().expect("results").clone()
    }
}

impl Queue for MemQueue {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, anyhow::Result<Vec<ClaimedRow>>> {
        Box::pin(async move {
            if self
                .failing_claims
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                anyhow::bail!("connection refused");
            }
            let delay = *self.claim_delay.lock().expect("delay");
            tokio::time::sleep(delay).await;
            let now = Instant::now();
            let mut rows = self.rows.lock().expect("rows");
            let outstanding = rows.values().filter(|r| r.token.is_some()).count();
            let mut left: BTreeMap<Option<&str>, u32> = match &req.budgets {
                Some(b) => b
                    .channels
                    .iter()
                    .map(|(c, n)| (Some(c.as_str()), *n))
                    .chain(b.others.iter().map(|(_, n)| (None, *n)))
                    .collect(),
                None => BTreeMap::from([(None, req.limit)]),
            };
            let known: Vec<&str> = req
                .budgets
                .as_ref()
                .map(|b| b.channels.iter().map(|(c, _)| c.as_str()).collect())
                .unwrap_or_default();
            let mut claimed = Vec::new();
            for (id, row) in rows.iter_mut() {
                let claimable = matches!(row.status, "PENDING" | "RETRY")
                    && row.due <= now
                    && row.token.is_none();
                if !claimable {
                    continue;
                }
                let pick = if known.contains(&row.channel.as_str()) {
                    Some(row.channel.as_str())
                } else {
                    None
                };
                let Some(n) = left.get_mut(&pick).filter(|n| **n > 0) else {
                    continue;
                };
                *n -= 1;
                row.token = Some(req.token.clone());
                claimed.push(ClaimedRow {
                    delivery: Delivery {
                        id: *id,
                        channel: row.channel.clone(),
                        recipient: None,
                        payload: "{}".into(),
                        attempts: row.attempts,
                    },
                    ordering_key: None,
                    age_at_claim: Duration::ZERO,
                    undeliverable: None,
                });
            }
            self.claims.lock().expect("claims").push(ClaimLog {
                at: now,
                outstanding,
                got: claimed.len(),
                epoch: req.fence.as_ref().map(|f| f.epoch),
                newest: req.newest,
            });
            Ok(claimed)
        })
    }

    fn complete<'a>(&'a self, done: &'a [Completion]) -> BoxFuture<'a, anyhow::Result<u64>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut rows = self.rows.lock().expect("rows");
            let mut changed = 0;
            for c in done {
                self.results.lock().expect("results").push((now, c.clone()));
                let Some(row) = rows.get_mut(&c.id) else {
                    continue;
                };
                if row.token.as_deref() != Some(&*c.token) {
                    continue;
                }
                row.token = None;
                changed += 1;
                match &c.resolution {
                    Resolution::Delivered => {
                        row.status = "SUCCESS";
                        row.attempts += 1;
                    }
                    Resolution::Retry { delay, .. } => {
                        row.status = "RETRY";
                        row.attempts += 1;
                        row.due = now + *delay;
                    }
                    Resolution::Failed { .. } => {
                        row.status = "FAILED";
                        row.attempts += 1;
                    }
                    Resolution::Release { delay, .. } => row.due = now + *delay,
                }
            }
            Ok(changed)
        })
    }

    fn probe<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, anyhow::Result<Probe>> {
        Box::pin(async move {
            let now = Instant::now();
            let rows = self.rows.lock().expect("rows");
            let asked = |channel: &str| match &req.budgets {
                Some(b) => {
                    let known = b.channels.iter().any(|(c, n)| c == channel && *n > 0);
                    let other = b
                        .others
                        .as_ref()
                        .is_some_and(|(k, n)| *n > 0 && !k.iter().any(|c| c == channel));
                    known || other
                }
                None => req.limit > 0,
            };
            let open = || {
                rows.values()
                    .filter(|r| matches!(r.status, "PENDING" | "RETRY"))
            };
            let probe = if open().any(|r| r.due <= now && r.token.is_none() && asked(&r.channel)) {
                Probe::Claimable
            } else {
                Probe::Nothing {
                    quiet_for: open()
                        .map(|r| r.due.saturating_duration_since(now))
                        .min()
                        .unwrap_or(Duration::MAX),
                }
            };
            self.probes.lock().expect("probes").push((now, probe));
            Ok(probe)
        })
    }
}

/// A sink whose every send takes `delay` and succeeds; it counts what it saw.
struct TimedSink {
    delay: Duration,
    sent: Mutex<Vec<(i64, Instant)>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

impl TimedSink {
    fn new(delay: Duration) -> Arc<TimedSink> {
        Arc::new(TimedSink {
            delay,
            sent: Mutex::new(Vec::new()),
            running: AtomicUsize::new(0),
            most_running: AtomicUsize::new(0),
        })
    }

    fn sent(&self) -> Vec<(i64, Instant)> {
        self.sent.lock().expect("sent").clone()
    }
}

impl Sink for TimedSink {
    fn deliver<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            self.sent.lock().expect("sent").push((d.id, Instant::now()));
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_running.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            Outcome::Delivered
        })
    }
}

fn settings(max_in_flight: u32, batch_size: u32) -> RelaySettings {
    RelaySettings {
        instance_id: "test:1".into(),
        mode: Mode::Claim,
        poll_interval: Duration::from_millis(500),
        batch_size,
        max_in_flight,
        claim_ttl: Duration::from_secs(60),
        shutdown_timeout: Duration::from_secs(20),
    }
}

/// The relay over `queue` with `sinks` (name, sink, concurrency), not yet running.
fn relay(
    queue: Arc<MemQueue>,
    sinks: Vec<(&str, Arc<TimedSink>, u32)>,
    settings: RelaySettings,
    lease: Option<watch::Receiver<LeaseState>>,
) -> (Relay, CancellationToken) {
    let shutdown = CancellationToken::new();
    let registry = SinkRegistry::from_handles(sinks.into_iter().map(|(name, sink, c)| {
        let mut h = SinkHandle::new(name, sink, c, RetrySettings::default());
        h.timeout = Duration::from_secs(10);
        h
    }));
    let wake = Arc::new(Notify::new());
    let relay = Relay {
        store: queue,
        sinks: Arc::new(registry),
        settings,
        lease: lease.map(|rx| ("test".to_string(), rx)),
        arrivals: Arrivals::new(wake.clone()),
        wake,
        health: Arc::new(Health::default()),
        shutdown: shutdown.clone(),
    };
    (relay, shutdown)
}

/// A relay over an empty queue with one sink `a` (8 at once, 5 ms a send), not yet running.
fn idle_relay() -> (Arc<MemQueue>, Arc<TimedSink>, Relay, CancellationToken) {
    let queue = MemQueue::with_rows(&[]);
    let a = TimedSink::new(Duration::from_millis(5));
    let (relay, stop) = relay(
        queue.clone(),
        vec![("a", a.clone(), 8)],
        settings(64, 32),
        None,
    );
    (queue, a, relay, stop)
}

/// Runs until `done` holds (checked every 10 ms of paused time), then shuts down and waits.
async fn run_until(relay: Relay, stop: CancellationToken, done: impl Fn() -> bool) {
    let task = tokio::spawn(relay.run());
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "not done within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    task.await.expect("relay task");
}

#[tokio::test(start_paused = true)]
async fn claims_only_into_free_slots_and_delivers_everything() {
    let queue = MemQueue::with_rows(&[("a", 50), ("b", 50)]);
    let a = TimedSink::new(Duration::from_millis(200));
    let b = TimedSink::new(Duration::from_millis(30));
    let (relay, stop) = relay(
        queue.clone(),
        vec![("a", a.clone(), 8), ("b", b.clone(), 8)],
        settings(16, 100),
        None,
    );
    let q = queue.clone();
    let t0 = Instant::now();
    run_until(relay, stop, move || q.count("SUCCESS") == 100).await;
    let claims = queue.claims();
    for c in &claims {
        assert!(
            c.outstanding + c.got <= 16,
            "a claim took {} rows with {} still in flight: {claims:?}",
            c.got,
            c.outstanding
        );
    }
    assert!(a.most_running.load(Ordering::SeqCst) <= 8);
    assert_eq!(a.sent().len() + b.sent().len(), 100, "each row sent once");
    // The fast sink is not held up behind the slow one: its 50 rows (30 ms each, 8 at a
    // time) are done in well under a second, while the slow sink needs 1.25 s at best.
    let last = |s: &TimedSink| s.sent().iter().map(|x| x.1).max().expect("sends");
    assert!(
        last(&b) - t0 < Duration::from_millis(500),
        "the fast sink's last send started at {:?}",
        last(&b) - t0
    );
    assert!(last(&a) - t0 >= Duration::from_millis(1050));
}

#[tokio::test(start_paused = true)]
async fn never_more_rows_claimed_than_relay_slots_whatever_the_sinks_allow() {
    let queue = MemQueue::with_rows(&[("a", 40)]);
    let a = TimedSink::new(Duration::from_millis(50));
    let (relay, stop) = relay(
        queue.clone(),
        vec![("a", a.clone(), 100)],
        settings(8, 100),
        None,
    );
    let q = queue.clone();
    run_until(relay, stop, move || q.count("SUCCESS") == 40).await;
    let claims = queue.claims();
    assert!(
        claims.iter().all(|c| c.outstanding + c.got <= 8),
        "{claims:?}"
    );
    assert!(a.most_running.load(Ordering::SeqCst) <= 8);
    assert_eq!(a.sent().len(), 40);
}

#[tokio::test(start_paused = true)]
async fn a_claim_worth_its_statement_waits_for_half_a_batch_of_slots() {
    let queue = MemQueue::with_rows(&[("a", 200)]);
    let a = TimedSink::new(Duration::from_millis(100));
    let (relay, stop) = relay(queue.clone(), vec![("a", a, 64)], settings(64, 64), None);
    let q = queue.clone();
    run_until(relay, stop, move || q.count("SUCCESS") == 200).await;
    let claims = queue.claims();
    // 200 rows in a handful of claims, not one statement per finished send: a claim for less
    // than half a batch while sends run is made only after waiting GATHER_SLOTS for more.
    assert!(claims.len() <= 12, "{} claims: {claims:?}", claims.len());
    let took: Vec<&ClaimLog> = claims.iter().filter(|c| c.got > 0).collect();
    for w in took.windows(2) {
        if w[1].got < 32 && w[1].outstanding > 0 {
            assert!(w[1].at - w[0].at >= super::GATHER_SLOTS, "{w:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_database_outage_pauses_claims_and_never_loses_rows() {
    let queue = MemQueue::with_rows(&[("a", 10)]);
    queue.failing_claims.store(4, Ordering::SeqCst);
    let a = TimedSink::new(Duration::from_millis(5));
    let (relay, stop) = relay(
        queue.clone(),
        vec![("a", a.clone(), 4)],
        settings(4, 4),
        None,
    );
    let health = relay.health.clone();
    let q = queue.clone();
    let t0 = Instant::now();
    run_until(relay, stop, move || q.count("SUCCESS") == 10).await;
    assert!(
        health.database_ok(),
        "readiness recovered with the database"
    );
    // Four failures back off 0.5 + 1 + 2 + 4 s before the fifth claim gets through.
    let first = queue.claims()[0].at;
    assert_eq!(first - t0, Duration::from_millis(7500));
    assert_eq!(a.sent().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn leader_mode_claims_only_under_a_live_confirmed_lease() {
    let queue = MemQueue::with_rows(&[("a", 6)]);
    let a = TimedSink::new(Duration::from_millis(10));
    let (tx, rx) = watch::channel(LeaseState::Standby);
    let mut s = settings(4, 4);
    s.mode = Mode::Leader;
    let (relay, stop) = relay(queue.clone(), vec![("a", a.clone(), 4)], s, Some(rx));
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(queue.claims().is_empty(), "claimed without the lease");
    // Held but unconfirmed (after a failed renewal): still nothing new is claimed.
    let deadline = Instant::now() + Duration::from_secs(20);
    tx.send_replace(LeaseState::Held {
        epoch: 7,
        deadline,
        confirmed: false,
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        queue.claims().is_empty(),
        "claimed under an unconfirmed hold"
    );
    tx.send_replace(LeaseState::Held {
        epoch: 7,
        deadline,
        confirmed: true,
    });
    while queue.count("SUCCESS") < 6 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(queue.claims().iter().all(|c| c.epoch == Some(7)));
    // The deadline passes without a renewal: claims stop by themselves, even though the
    // keeper published nothing.
    queue.put(100, "PENDING", deadline + Duration::from_secs(1));
    tokio::time::sleep_until(deadline + Duration::from_secs(5)).await;
    assert_eq!(
        queue.count("PENDING"),
        1,
        "claimed after the lease deadline"
    );
    stop.cancel();
    task.await.expect("relay task");
}

/// The lease's renewals (every ttl/3) say nothing about the table: they do not wake an idle
/// relay into an extra read. A new epoch does wake it, and its next claim is fenced with it.
#[tokio::test(start_paused = true)]
async fn an_idle_relay_reads_on_its_poll_not_on_each_lease_renewal() {
    let queue = MemQueue::with_rows(&[]);
    let a = TimedSink::new(Duration::from_millis(5));
    let held = |epoch: i64| LeaseState::Held {
        epoch,
        deadline: Instant::now() + Duration::from_secs(10),
        confirmed: true,
    };
    let (tx, rx) = watch::channel(held(3));
    let mut s = settings(8, 8);
    s.mode = Mode::Leader;
    let (relay, stop) = relay(queue.clone(), vec![("a", a.clone(), 8)], s, Some(rx));
    let start = Instant::now();
    let task = tokio::spawn(relay.run());
    // Renewed every 300 ms for 2.1 s.
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.send_replace(held(3));
    }
    let ms = |at: Instant| at.duration_since(start).as_millis();
    let reads: Vec<u128> = queue.probes().iter().map(|p| ms(p.0)).collect();
    assert_eq!(reads, [500, 1000, 1500, 2000], "a renewal woke the loop");
    // Lost and taken again at another epoch (as after a hand-off): the loop looks at once.
    tx.send_replace(LeaseState::Standby);
    tokio::time::sleep(Duration::from_millis(10)).await;
    queue.put(1, "PENDING", Instant::now());
    tx.send_replace(held(4));
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    task.await.expect("relay task");
    let claims = queue.claims();
    let last = claims.last().expect("claims");
    assert_eq!((last.got, last.epoch), (1, Some(4)), "{claims:?}");
    assert!(ms(last.at) < 2_250, "claimed at {} ms", ms(last.at));
}

#[tokio::test(start_paused = true)]
async fn rows_claimed_as_the_lease_is_lost_are_given_back_unsent() {
    // The claim statement takes 100 ms (a slow database) and the lease is lost while it runs:
    // the claim was fenced when it began, but no row it returns may be sent (G4).
    let queue = MemQueue::with_rows(&[("a", 5)]);
    *queue.claim_delay.lock().expect("delay") = Duration::from_millis(100);
    let a = TimedSink::new(Duration::from_millis(10));
    let (tx, rx) = watch::channel(LeaseState::Held {
        epoch: 1,
        deadline: Instant::now() + Duration::from_secs(30),
        confirmed: true,
    });
    let mut s = settings(8, 8);
    s.mode = Mode::Leader;
    let (relay, stop) = relay(queue.clone(), vec![("a", a.clone(), 8)], s, Some(rx));
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send_replace(LeaseState::Standby);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    task.await.expect("relay task");
    assert_eq!(queue.claims().len(), 1);
    assert_eq!(queue.claims()[0].got, 5);
    assert!(a.sent().is_empty(), "sent after the lease was lost");
    let results = queue.results();
    assert_eq!(results.len(), 5);
    assert!(
        results
            .iter()
            .all(|(_, c)| matches!(c.resolution, Resolution::Release { .. })),
        "{results:?}"
    );
    let rows = queue.rows.lock().expect("rows");
    assert!(
        rows.values()
            .all(|r| r.token.is_none() && r.status == "PENDING" && r.attempts == 0),
        "a given-back row is still claimed or counted an attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_sends_in_flight_finish_and_records_them_and_claims_nothing_more() {
    let queue = MemQueue::with_rows(&[("a", 20)]);
    let a = TimedSink::new(Duration::from_secs(3));
    let (relay, stop) = relay(
        queue.clone(),
        vec![("a", a.clone(), 4)],
        settings(4, 4),
        None,
    );
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let claims_before = queue.claims().len();
    let stopped_at = Instant::now();
    stop.cancel();
    task.await.expect("relay task");
    // The four sends in flight ran to their end (2 s more) and their results were written
    // before run() returned; nothing was claimed after the signal.
    let took = stopped_at.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2100),
        "{took:?}"
    );
    assert_eq!(queue.count("SUCCESS"), 4);
    assert_eq!(queue.claims().len(), claims_before);
    assert_eq!(a.sent().len(), 4);
    assert!(queue.results().iter().all(|(at, _)| *at <= Instant::now()));
}

#[tokio::test(start_paused = true)]
async fn shutdown_gives_up_on_sends_that_outlast_its_budget() {
    let queue = MemQueue::with_rows(&[("a", 2)]);
    let a = TimedSink::new(Duration::from_secs(3600));
    let mut s = settings(4, 4);
    s.shutdown_timeout = Duration::from_secs(8);
    let (relay, stop) = relay(queue.clone(), vec![("a", a, 4)], s, None);
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped_at = Instant::now();
    stop.cancel();
    task.await.expect("relay task");
    // Sends get 75% of shutdown_timeout and results 10%: run() is back within 85% of it.
    assert!(stopped_at.elapsed() <= Duration::from_millis(6800));
    assert_eq!(queue.count("SUCCESS"), 0);
}

#[tokio::test(start_paused = true)]
async fn an_idle_poll_reads_first_and_a_wake_up_claims_at_once() {
    let (queue, a, relay, stop) = idle_relay();
    let wake = relay.wake.clone();
    let task = tokio::spawn(relay.run());
    // Claims at 0, 500, 1000 and 1500 ms find nothing; only the poll timer woke the loop.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    queue.put(1, "PENDING", Instant::now());
    // A wake-up (NOTIFY, the newest-id check) means rows arrived: claimed without a probe.
    wake.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    task.await.expect("relay task");
    assert_eq!(a.sent().len(), 1);
    let got: Vec<usize> = queue.claims().iter().map(|c| c.got).collect();
    assert_eq!(
        got,
        [0, 1],
        "the first claim and the one after a wake-up claim at once; polls after an empty claim read first"
    );
    let probes: Vec<Probe> = queue.probes().iter().map(|p| p.1).collect();
    let empty = Probe::Nothing {
        quiet_for: Duration::MAX,
    };
    assert_eq!(probes, [empty; 3], "a read at 500, 1000 and 1500 ms");
}

/// After a claim that came back short, with rows in flight: a wake-up that is not an arrival
/// (a result that unblocked an ordering key) waits for the rows in flight to finish, at most
/// as long as that claim took (10 ms here), before the next claim; an arrival (NOTIFY,
/// the newest-id check) is claimed at once (docs/design.md, "Ordering keys and claim rounds").
#[tokio::test(start_paused = true)]
async fn a_wake_up_that_is_not_an_arrival_waits_as_long_as_the_short_claim_took() {
    for arrival in [false, true] {
        let queue = MemQueue::with_rows(&[("a", 8)]);
        *queue.claim_delay.lock().expect("delay") = Duration::from_millis(10);
        let a = TimedSink::new(Duration::from_millis(40));
        let (relay, stop) = relay(
            queue.clone(),
            vec![("a", a.clone(), 16)],
            settings(64, 32),
            None,
        );
        let (wake, arrivals) = (relay.wake.clone(), relay.arrivals.clone());
        let started = Instant::now();
        let task = tokio::spawn(relay.run());
        // The first claim ends at 10 ms with 8 rows, fewer than asked; they are sent until 50.
        tokio::time::sleep(Duration::from_millis(12)).await;
        for id in 9..=12 {
            queue.put(id, "PENDING", Instant::now());
        }
        match arrival {
            true => arrivals.signal(),
            false => wake.notify_one(),
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        stop.cancel();
        task.await.expect("relay task");
        let claims = queue.claims();
        let at: Vec<u128> = claims
            .iter()
            .map(|c| (c.at - started).as_millis())
            .collect();
        let got: Vec<usize> = claims.iter().map(|c| c.got).collect();
        // Each claim is logged when its 10 ms statement ends.
        let want = if arrival { [10, 22] } else { [10, 32] };
        assert_eq!(at, want, "arrival: {arrival}, claims {claims:?}");
        assert_eq!(got, [8, 4]);
    }
}

/// With every insert announced (NOTIFY), an idle relay reads the table every
/// `QUIET_POLLS` poll intervals, and sooner when a waiting row's retry comes due: such a row
/// is still claimed when it is due, not later; a wake-up still claims at once. Without the
/// announcement it reads every poll interval.
#[tokio::test(start_paused = true)]
async fn an_announced_idle_relay_reads_when_a_retry_comes_due_and_seldom_otherwise() {
    for announced in [true, false] {
        let (queue, a, relay, stop) = idle_relay();
        relay.arrivals.set_announced(announced);
        let arrivals = relay.arrivals.clone();
        let start = Instant::now();
        let task = tokio::spawn(relay.run());
        // Idle for 2.1 s; then a row retrying 2.1 s from now (at 4.2 s) is written without a
        // signal (another instance's result), and at 6.05 s one is inserted and announced.
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        queue.put(1, "RETRY", Instant::now() + Duration::from_millis(2_100));
        tokio::time::sleep(Duration::from_millis(3_950)).await;
        queue.put(2, "PENDING", Instant::now());
        arrivals.signal();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
        task.await.expect("relay task");

        let ms = |at: Instant| at.duration_since(start).as_millis();
        let reads: Vec<u128> = queue.probes().iter().map(|p| ms(p.0)).collect();
        let claims: Vec<(u128, usize)> = queue.claims().iter().map(|c| (ms(c.at), c.got)).collect();
        let sent: Vec<(i64, u128)> = a.sent().iter().map(|(id, at)| (*id, ms(*at))).collect();
        if announced {
            // Reads a second apart while nothing is due soon; at 3500 the retry is 700 ms
            // away, so the next read is at 4200, when it is due (never sooner than a poll
            // interval: a row due but not claimable must not make the loop spin).
            assert_eq!(reads[..5], [500, 1500, 2500, 3500, 4200], "{reads:?}");
            assert_eq!(claims[..2], [(0, 0), (4200, 1)], "{claims:?}");
        } else {
            assert_eq!(reads[..4], [500, 1000, 1500, 2000], "{reads:?}");
            assert_eq!(claims[..2], [(0, 0), (4500, 1)], "{claims:?}");
        }
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[1].0, 2);
        assert!(sent[1].1 <= 6_060, "an announced row waited: {sent:?}");
    }
}

/// Under a backlog, a claim takes each channel's newest rows too when an arrival was signalled
/// since the last claim (NOTIFY, the newest-id check), so a row just committed waits one claim
/// round; without a signal only every `NEWEST_EVERY` (100 ms).
#[tokio::test(start_paused = true)]
async fn under_a_backlog_the_claim_after_an_arrival_takes_the_newest_rows() {
    let queue = MemQueue::with_rows(&[("a", 5_000)]);
    *queue.claim_delay.lock().expect("delay") = Duration::from_millis(1);
    let a = TimedSink::new(Duration::from_millis(5));
    let (relay, stop) = relay(
        queue.clone(),
        vec![("a", a.clone(), 8)],
        settings(64, 32),
        None,
    );
    let arrivals = relay.arrivals.clone();
    let task = tokio::spawn(relay.run());
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(130)).await;
    let signalled_at = Instant::now();
    arrivals.signal();
    tokio::time::sleep(Duration::from_millis(60)).await;
    stop.cancel();
    task.await.expect("relay task");

    let claims = queue.claims();
    let at = |c: &ClaimLog| c.at.duration_since(start);
    assert!(
        claims.iter().all(|c| c.got > 0),
        "a backlog: every claim found rows"
    );
    // Without a signal: the first claim and one every 100 ms.
    let timed: Vec<Duration> = claims
        .iter()
        .filter(|c| c.newest && c.at < signalled_at)
        .map(at)
        .collect();
    assert_eq!(
        timed.len(),
        2,
        "newest picks before the signal at {timed:?}"
    );
    let between = claims
        .iter()
        .filter(|c| at(c) > timed[0] + Duration::from_millis(5) && at(c) < timed[1])
        .count();
    assert!(
        between >= 5,
        "claims without the newest pick between the timed ones: {between}"
    );
    // After the signal: the next claim (or the one after, if one was on its way) asks for the
    // newest rows, well before the timer would.
    let after: Vec<&ClaimLog> = claims.iter().filter(|c| c.at > signalled_at).collect();
    let first = after
        .iter()
        .position(|c| c.newest)
        .expect("a claim with the newest pick after the signal");
    assert!(
        first <= 1,
        "the newest pick came {first} claims after the signal"
    );
    assert!(
        after[first].at.duration_since(signalled_at) < Duration::from_millis(20),
        "and within a claim round"
    );
    // One signal, one extra pick: the claims after it go back to oldest first.
    assert!(
        after.iter().skip(first + 1).take(4).all(|c| !c.newest),
        "claims after the signalled one: {:?}",
        after.iter().map(|c| c.newest).collect::<Vec<_>>()
    );
}

/// The recorder writes a lone result after waiting briefly for others to share the statement:
/// 5 ms, or 2 ms once a result of a row with an ordering key is among them (that key's next
/// row waits for the write). Results arriving while it waits go in the same write.
#[tokio::test(start_paused = true)]
async fn a_lone_result_waits_briefly_for_company_and_a_keyed_one_less() {
    let queue = MemQueue::with_rows(&[("hook", 4)]);
    let recorder = super::Recorder::start(queue.clone(), Arc::new(Notify::new()), 512);
    let handle = recorder.handle();
    let done = |id: i64| Completion {
        id,
        token: Arc::from("t"),
        resolution: Resolution::Delivered,
    };
    let written_after = async |from: Instant, n: usize| {
        while queue.results().len() < n {
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        queue.results()[n - 1].0 - from
    };

    let start = Instant::now();
    handle.record(done(1), false, None);
    tokio::time::sleep(Duration::from_millis(1)).await;
    handle.record(done(2), false, None);
    assert_eq!(written_after(start, 2).await, Duration::from_millis(5));
    let results = queue.results();
    assert_eq!(results[0].0, results[1].0, "one write for both");

    let start = Instant::now();
    handle.record(done(3), false, None);
    tokio::time::sleep(Duration::from_millis(1)).await;
    handle.record(done(4), true, None);
    assert_eq!(written_after(start, 4).await, Duration::from_millis(2));
    recorder.close(Duration::from_secs(1)).await;
}
