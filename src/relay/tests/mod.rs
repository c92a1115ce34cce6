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
use crate::store::{
    Arrivals, ClaimRequest, ClaimedRow, Completion, Probe, Queue, Resolution, WriteError,
};
use crate::telemetry::Health;

mod claims;
mod faults;
mod idle;

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
    /// Whether it said no other instance claims (leader mode).
    alone: bool,
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
                alone: req.alone,
            });
            Ok(claimed)
        })
    }

    fn complete<'a>(&'a self, done: &'a [Completion]) -> BoxFuture<'a, Result<u64, WriteError>> {
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
                    // Stays claimed for good, as the store parks it.
                    Resolution::Park => row.due = now + Duration::from_secs(365 * 86_400),
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
