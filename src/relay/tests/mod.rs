//! The relay loop on a paused clock, over an in-memory [`Queue`] and timed fake sinks: what
//! the loop promises (docs/design.md, "Claims", "Sending", "Shutdown") without a database or
//! a process. Time only moves when every task waits, so each figure below is exact.

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
use crate::store::rule::{RuleTable, Shares};
use crate::store::{
    Arrivals, ClaimRequest, ClaimedRow, Completion, Probe, Queue, Resolution, State, WriteError,
};
use crate::telemetry::Health;

mod claims;
mod faults;
mod idle;

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

/// The outbox as the shared model of the claim rule ([`RuleTable`]): due rows in id order,
/// budgets per channel, ordering keys, results only under the claim's token.
#[derive(Default)]
struct MemQueue {
    rows: Mutex<RuleTable<Instant>>,
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
                    let id = rows.rows.len() as i64 + 1;
                    rows.insert(id, channel, None, State::Pending, now);
                }
            }
        }
        Arc::new(q)
    }

    /// Adds row `id` of channel `a` in `state` (attempted once if RETRY), due at `due`.
    fn put(&self, id: i64, state: State, due: Instant) {
        self.put_keyed(id, None, state, due);
    }

    /// Adds row `id` of channel `a` with ordering key `key`.
    fn put_keyed(&self, id: i64, key: Option<&str>, state: State, due: Instant) {
        (self.rows.lock().expect("rows")).insert(id, "a", key, state, due);
    }

    fn count(&self, state: State) -> usize {
        self.rows.lock().expect("rows").count(state)
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
            let outstanding = rows.rows.values().filter(|r| r.live).count();
            let shares = Shares::of(req.budgets.as_ref(), req.limit);
            // One relay claims here: every live claim is its own.
            let tails: Vec<i64> = req.tails.iter().map(|t| t.row).collect();
            let taken = rows.claim(&req.token, now, shares, &tails, &|_| true);
            let claimed: Vec<ClaimedRow> = taken
                .iter()
                .filter_map(|id| Some((*id, rows.rows.get(id)?)))
                .map(|(id, row)| ClaimedRow {
                    delivery: Delivery {
                        id,
                        channel: row.channel.clone(),
                        recipient: None,
                        payload: "{}".into(),
                        attempts: row.attempts,
                        trace: None,
                    },
                    ordering_key: row.key.clone(),
                    age_at_claim: Duration::ZERO,
                    undeliverable: None,
                })
                .collect();
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
                changed += u64::from(rows.complete(c.id, &c.token, &c.resolution, now));
            }
            Ok(changed)
        })
    }

    fn probe<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, anyhow::Result<Probe>> {
        Box::pin(async move {
            let now = Instant::now();
            let rows = self.rows.lock().expect("rows");
            let shares = Shares::of(req.budgets.as_ref(), req.limit);
            let open = || rows.rows.iter().filter(|(_, r)| r.open() && !r.parked);
            let probe =
                if open().any(|(id, r)| rows.claimable(*id, &[], now) && shares.asks(&r.channel)) {
                    Probe::Claimable
                } else {
                    Probe::Nothing {
                        quiet_for: open()
                            .map(|(_, r)| r.due.saturating_duration_since(now))
                            .min()
                            .unwrap_or(Duration::MAX),
                    }
                };
            self.probes.lock().expect("probes").push((now, probe));
            Ok(probe)
        })
    }
}

/// A sink whose every send takes `delay` and succeeds, but the first send of each row in
/// `refuse_once` (a 503); it counts what it saw.
struct TimedSink {
    delay: Duration,
    refuse_once: Mutex<Vec<i64>>,
    sent: Mutex<Vec<(i64, Instant)>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

impl TimedSink {
    fn new(delay: Duration) -> Arc<TimedSink> {
        Arc::new(TimedSink {
            delay,
            refuse_once: Mutex::new(Vec::new()),
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
            let mut refuse = self.refuse_once.lock().expect("refuse");
            match refuse.iter().position(|id| *id == d.id) {
                Some(i) => {
                    refuse.remove(i);
                    Outcome::Retry {
                        after: Some(Duration::from_secs(1)),
                        reason: "HTTP 503".into(),
                    }
                }
                None => Outcome::Delivered,
            }
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
    queue: &Arc<MemQueue>,
    sinks: Vec<(&str, &Arc<TimedSink>, u32)>,
    settings: RelaySettings,
    lease: Option<watch::Receiver<LeaseState>>,
) -> (Relay, CancellationToken) {
    let shutdown = CancellationToken::new();
    let registry = SinkRegistry::from_handles(sinks.into_iter().map(|(name, sink, c)| {
        let sink = sink.clone();
        let mut h = SinkHandle::new(name, sink, c, RetrySettings::default());
        h.timeout = Duration::from_secs(10);
        h
    }));
    let wake = Arc::new(Notify::new());
    let relay = Relay {
        store: queue.clone(),
        sinks: Arc::new(registry),
        settings,
        lease: lease.map(|rx| ("test".to_string(), rx)),
        arrivals: Arrivals::new(wake.clone()),
        wake,
        health: Arc::new(Health::default()),
        shutdown: shutdown.clone(),
        tracer: None,
    };
    (relay, shutdown)
}

/// A relay over an empty queue with one sink `a` (8 at once, 5 ms a send), not yet running.
fn idle_relay() -> (Arc<MemQueue>, Arc<TimedSink>, Relay, CancellationToken) {
    let queue = MemQueue::with_rows(&[]);
    let a = TimedSink::new(Duration::from_millis(5));
    let (relay, stop) = relay(&queue, vec![("a", &a, 8)], settings(64, 32), None);
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
