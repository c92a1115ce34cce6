//! The relay loop, in leader or claim mode (docs/design.md, "Claims" and "Results"):
//!
//! ```text
//! loop:
//!     leader mode: wait until the lease is held; claims carry its epoch (fencing)
//!     wait until enough delivery slots are free to make a claim worth a statement
//!     claim up to min(free slots, batch_size) due rows      -- one statement
//!     hand each row to a delivery task                       -- results batched by the recorder
//!     a full batch: claim again at once; otherwise sleep poll_interval (NOTIFY wakes sooner)
//!     idle: read whether anything is claimable before claiming; with NOTIFY, sleep until
//!         the next retry is due, at most 2 x poll_interval
//! on shutdown: claim nothing more, let sends in flight finish (bounded), write their results
//! ```
//!
//! Guarantees: the relay never claims more rows than it has free delivery slots, so every
//! claimed row starts at once (G4's deadline check gives back the rest); no claim is made
//! without a live lease in leader mode; a database outage pauses the loop (readiness goes
//! false) and never crashes it.

mod budget;
mod dispatch;
mod recorder;
pub mod retry;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use dispatch::{Dispatcher, Job};
pub use recorder::{Recorder, RecorderHandle};

use crate::config::{Mode, RelaySettings};
use crate::lease::{LeaseState, drift};
use crate::sink::{MovingAverage, SinkRegistry};
use crate::store::{Arrivals, ClaimRequest, Probe, Queue};
use crate::telemetry::Health;

/// How far ahead a rate-limited sink's budget looks: rows it cannot start within this are
/// left in the table for a later claim.
const BUDGET_HORIZON: Duration = Duration::from_millis(500);
/// Longest the loop waits for half a batch of free slots before claiming for the slots that
/// are free.
const GATHER_SLOTS: Duration = Duration::from_millis(20);
/// Longest a claim that would only top up the sinks' queues waits to be worth a statement
/// (half a batch), while every sink's slots are busy or promised.
const TOP_UP_WAIT: Duration = Duration::from_millis(3);
/// How often such a claim is looked at again while it waits (a freed slot of a hungry sink
/// wakes the loop sooner).
const TOP_UP_POLL: Duration = Duration::from_micros(500);
/// How often a claim also takes some of each channel's newest rows when no arrival was
/// signalled: under a backlog, a row committed without a signal (a NOTIFY lost while the
/// listener reconnects, a MySQL row that committed after a higher id) waits at most about this
/// long (plus one claim), not behind the backlog. A signalled arrival is taken from the newest
/// end by the next claim.
const NEWEST_EVERY: Duration = Duration::from_millis(100);
/// How often a claim also looks for rows of channels that no sink serves (to fail them):
/// that look cannot use the channel index, so it is not made on every claim.
const OTHERS_EVERY: Duration = Duration::from_secs(2);
/// With every insert announced (PostgreSQL's NOTIFY), how many poll intervals an idle relay
/// may go without reading the table: its reads are then only for rows whose time comes,
/// which the read itself foresees, and for changes nothing announces (a requeue by hand,
/// another instance's result, a notification lost with its connection). See [`idle_wait`].
const QUIET_POLLS: u32 = 2;

/// Everything the loop needs.
pub struct Relay {
    pub store: Arc<dyn Queue>,
    pub sinks: Arc<SinkRegistry>,
    pub settings: RelaySettings,
    /// The lease's name (fence key) and state, in leader mode with a lease backend.
    pub lease: Option<(String, watch::Receiver<LeaseState>)>,
    /// Woken by the recorder when results it wrote may have unblocked an ordering key, by a
    /// delivery that freed a slot of a hungry sink, and by `arrivals`.
    pub wake: Arc<Notify>,
    /// Rows arrived (PostgreSQL's NOTIFY, the newest-id check elsewhere); wakes `wake`.
    pub arrivals: Arc<Arrivals>,
    pub health: Arc<Health>,
    /// Cancelled on SIGTERM/SIGINT.
    pub shutdown: CancellationToken,
}

impl Relay {
    /// Runs until `shutdown`, then drains. Returns once every in-flight result is written
    /// (or `shutdown_timeout` has passed).
    pub async fn run(self) {
        let s = &self.settings;
        let recorder = Recorder::start(self.store.clone(), self.wake.clone(), s.max_in_flight);
        let dispatcher = Arc::new(Dispatcher {
            sinks: self.sinks.clone(),
            recorder: recorder.handle(),
            wake: self.wake.clone(),
            shutdown: self.shutdown.clone(),
            lease: self.lease.as_ref().map(|(_, rx)| rx.clone()),
        });
        let slots = Arc::new(Semaphore::new(s.max_in_flight as usize));
        let full_batch = s.batch_size.min(s.max_in_flight) as usize;
        // Claim only when at least this many slots are free (unless nothing is in flight):
        // otherwise every finished send would trigger its own one-row claim statement.
        let worth_claiming = (full_batch / 2).max(1);
        let mut tasks = JoinSet::new();
        let mut lease_rx = self.lease.as_ref().map(|(_, rx)| rx.clone());
        let mut db_failures = 0u32;
        let mut last_others = Instant::now() - OTHERS_EVERY;
        let mut last_newest = Instant::now() - NEWEST_EVERY;
        // The last claim took a channel's whole budget: rows are waiting behind it.
        let mut backlog = false;
        let mut gathered = false;
        // Since when a claim that would only top up the sinks' queues has been waiting.
        let mut topping_up: Option<Instant> = None;
        // The last claim (or read) found nothing, and nothing but the poll timer (or the lease)
        // woke the loop since: read first whether anything is claimable, and claim only if so
        // (what an idle relay costs the database: one plain read per poll; docs/design.md,
        // "Idle cost").
        let mut probe_next = false;
        // How long claims take: with each sink's send time it sizes the rows claimed ahead.
        let claim_time = MovingAverage::default();
        tracing::info!(
            instance = %s.instance_id,
            mode = ?s.mode,
            batch_size = s.batch_size,
            max_in_flight = s.max_in_flight,
            "relay started"
        );

        while !self.shutdown.is_cancelled() {
            while tasks.try_join_next().is_some() {}

            // 1. Leader mode: only the lease holder claims, under its epoch.
            let fence = match &self.lease {
                Some((name, rx)) if s.mode == Mode::Leader => {
                    let state = *rx.borrow();
                    match state.fence(name) {
                        Some(f) => Some(f),
                        None => {
                            self.wait_for_lease(&mut lease_rx).await;
                            continue;
                        }
                    }
                }
                _ => None,
            };

            // 2. Enough free slots for a claim worth its statement. A slot is freed only once
            //    its row's result is written, so while results cannot be written nothing new
            //    is claimed (backpressure), and the rows sent but not yet recorded never
            //    exceed max_in_flight.
            let free = slots.available_permits();
            let busy = (s.max_in_flight as usize).saturating_sub(free);
            //    Waiting for half a batch of free slots saves statements, but only for a
            //    moment: slow sends may hold slots for seconds, and other sinks' rows must
            //    not wait for them.
            //    (The semaphore is fair: a waiter for several permits would hold back a
            //    waiter for one, so the two waits are never made at once.)
            if free == 0 {
                tokio::select! {
                    p = slots.clone().acquire_owned() => drop(p),
                    _ = self.shutdown.cancelled() => {}
                }
                continue;
            }
            if free < worth_claiming && busy > 0 && !gathered {
                tokio::select! {
                    p = slots.clone().acquire_many_owned(worth_claiming as u32) => drop(p),
                    _ = tokio::time::sleep(GATHER_SLOTS) => gathered = true,
                    _ = self.shutdown.cancelled() => {}
                }
                continue;
            }
            gathered = false;
            let limit = free.min(s.batch_size as usize);
            if limit == 0 {
                continue;
            }

            // 3. Claim only what each sink can start now (its free slots and rate), shared
            //    fairly when they ask for more than is free: rows of a slow or saturated sink
            //    never sit in the relay's slots waiting for that sink while another sink's
            //    rows wait in the table. Channels no sink serves are looked for now and then.
            let others = last_others.elapsed() >= OTHERS_EVERY;
            let budgets = budget::budgets(
                &self.sinks,
                limit as u32,
                BUDGET_HORIZON,
                others,
                claim_time.get(),
            );
            if others {
                last_others = Instant::now();
            }
            //    A claim that would only top up the rows queued for busy sinks (no sink could
            //    start a row now) waits, for at most TOP_UP_WAIT, until the sinks ask for half
            //    a batch: queued rows keep every sink busy meanwhile, and under load claims of
            //    30-80 rows become fewer claims of more. Against a Node receiver on PostgreSQL,
            //    nine alternate drains each: 0.0149 statements per delivered row against
            //    0.0201 (over the 0.02 target in four of nine), 1.06x the rows/s. A sink with
            //    a free slot and nothing queued is never kept waiting, so light load is
            //    claimed at once (docs/design.md, "Claims worth a statement").
            if (1..worth_claiming as u32).contains(&budgets.total())
                && busy > 0
                && budgets.others.is_none()
                && !budget::starts_now(&self.sinks, BUDGET_HORIZON)
            {
                let since = *topping_up.get_or_insert_with(Instant::now);
                if since.elapsed() < TOP_UP_WAIT {
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(TOP_UP_POLL) => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                    continue;
                }
            }
            topping_up = None;
            if budgets.total() == 0 {
                self.idle(s.poll_interval, &mut lease_rx).await;
                continue;
            }
            //    Under a backlog, rows that just arrived are taken from each channel's newest end
            //    by this claim, so they wait one claim round, not behind the backlog; without a
            //    backlog the oldest-first pick reaches them anyway and nothing extra is read.
            let arrived = self.arrivals.take();
            let newest = (arrived && backlog) || last_newest.elapsed() >= NEWEST_EVERY;
            if newest {
                last_newest = Instant::now();
            }
            let token: Arc<str> = Arc::from(crate::random_token());
            let epoch = fence.as_ref().map(|f| f.epoch);
            let req = ClaimRequest {
                limit: budgets.total(),
                ttl: s.claim_ttl,
                claimer: s.instance_id.clone(),
                token: token.clone(),
                fence,
                alone: s.mode == Mode::Leader,
                exclude_channels: Vec::new(),
                max_payload_bytes: Some(self.sinks.max_payload_bytes() as u64),
                newest,
                budgets: Some(budgets.clone()),
            };
            //    An idle poll reads first. Under load claims find rows and never read first; a
            //    wake-up (NOTIFY, the newest-id check, a result that unblocked a key) means
            //    rows may have arrived, so it claims at once. A row that becomes claimable
            //    just after the read waits for the next poll or wake-up, as it would had the
            //    claim itself run a moment earlier.
            if std::mem::take(&mut probe_next) {
                let probe = tokio::select! {
                    p = self.store.probe(&req) => p,
                    _ = self.shutdown.cancelled() => break,
                };
                if let Ok(Probe::Nothing { quiet_for }) = probe {
                    let wait = idle_wait(s.poll_interval, quiet_for, self.arrivals.announced());
                    probe_next = !self.idle(wait, &mut lease_rx).await;
                    continue;
                }
                // Claimable, or the read failed: claim (a failure is reported and retried
                // there).
            }
            let claimed_at = Instant::now();
            // Raced against shutdown: a claim stuck on a locked table must not hold the
            // process past shutdown_timeout. It gets a short grace first, so that an ordinary
            // claim completes and its rows are given back at once by their tasks; a claim
            // abandoned after that may still commit on the server, and its rows are then
            // re-claimed after their claim expires.
            let mut claim = std::pin::pin!(self.store.claim(&req));
            let claim = tokio::select! {
                r = &mut claim => r,
                _ = self.shutdown.cancelled() => {
                    match tokio::time::timeout(claim_grace(s.shutdown_timeout), &mut claim).await {
                        Ok(r) => r,
                        Err(_) => break,
                    }
                }
            };
            let rows = match claim {
                Ok(rows) => {
                    if db_failures > 0 {
                        tracing::info!("database reachable again; claiming resumed");
                    }
                    db_failures = 0;
                    self.health.set_database(true);
                    rows
                }
                Err(e) => {
                    db_failures += 1;
                    self.health.set_database(false);
                    let wait = (Duration::from_millis(250) * 2u32.pow(db_failures.min(5)))
                        .min(Duration::from_secs(5));
                    tracing::warn!(error = %format!("{e:#}"), retry_in_ms = wait.as_millis() as u64, "claim failed");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                    continue;
                }
            };
            let took = claimed_at.elapsed();
            claim_time.record(took);
            metrics::histogram!(crate::metric::CLAIM_DURATION).record(took.as_secs_f64());
            metrics::counter!(crate::metric::CLAIMED).increment(rows.len() as u64);
            // A channel that got its whole budget probably has more rows due.
            let mut full = false;
            for (channel, budget) in &budgets.channels {
                let got = rows
                    .iter()
                    .filter(|r| &r.delivery.channel == channel)
                    .count();
                let hungry = got >= *budget as usize;
                full |= hungry;
                if let Some(sink) = self.sinks.get(channel) {
                    sink.hungry.store(hungry, Ordering::Relaxed);
                }
            }
            if let Some((known, budget)) = &budgets.others {
                let got = rows
                    .iter()
                    .filter(|r| !known.contains(&r.delivery.channel))
                    .count();
                full |= got >= *budget as usize;
            }
            let deadline = claimed_at + s.claim_ttl - drift(s.claim_ttl);
            let found_nothing = rows.is_empty();
            backlog = full;

            // 4. One delivery task per row; each holds one in-flight slot.
            for row in rows {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    // Cannot happen: only this loop takes slots and it claimed no more than
                    // were free. Giving the row back keeps it safe if it ever does.
                    tracing::error!(
                        "no free slot for a claimed row; it will be retried after its claim expires"
                    );
                    continue;
                };
                if row.undeliverable.is_none()
                    && let Some(sink) = self.sinks.get(&row.delivery.channel)
                {
                    // Released by the delivery once it holds the sink's slot.
                    sink.queued.fetch_add(1, Ordering::Relaxed);
                }
                let dispatcher = dispatcher.clone();
                let job = Job {
                    row,
                    token: token.clone(),
                    epoch,
                    claimed_at,
                    deadline,
                    slot: Some(permit),
                };
                tasks.spawn(async move { dispatcher.deliver(job).await });
            }

            // 5. A channel took its whole budget: there is probably more; claim again at once
            //    (a sink with no capacity left asks for nothing, and a freed slot of a
            //    hungry sink wakes the loop).
            if full {
                continue;
            }
            // Only a wake-up says rows may have arrived (NOTIFY, the newest-id check, a result
            // that unblocked an ordering key, a freed slot of a hungry sink); the poll timer
            // and the lease say nothing about the table.
            let woken = self.idle(s.poll_interval, &mut lease_rx).await;
            if woken {
                self.gather_unblocked(&slots, s.max_in_flight, took).await;
            }
            probe_next = found_nothing && !woken;
        }

        // Shutdown: nothing more is claimed; rows not yet sent are given back by their tasks.
        // The whole shutdown fits in shutdown_timeout whatever the database does: a claim in
        // progress gets 5% of it, sends 75%, writing their results 10%, and the caller's lease
        // release the rest (see `shutdown_budget`).
        self.health.set_draining();
        let (drain, record) = shutdown_budget(s.shutdown_timeout);
        let in_flight = tasks.len();
        tracing::info!(in_flight, "shutting down: waiting for deliveries in flight");
        let drained =
            tokio::time::timeout(drain, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(
                left = tasks.len(),
                "shutdown_timeout passed with sends still running; their rows will be retried after their claims expire"
            );
            tasks.abort_all();
        }
        drop(dispatcher);
        recorder.close(record).await;
        tracing::info!("relay stopped");
    }

    /// Waits for a wake-up, `wait`, shutdown, or the lease lost or taken at another epoch
    /// (not its renewals: they say nothing about the table, and each would cost an idle relay
    /// a read). Returns whether a wake-up ended it: rows may have arrived.
    async fn idle(
        &self,
        wait: Duration,
        lease_rx: &mut Option<watch::Receiver<LeaseState>>,
    ) -> bool {
        tokio::select! {
            _ = self.wake.notified() => true,
            _ = tokio::time::sleep(wait) => false,
            _ = self.shutdown.cancelled() => false,
            _ = lease_moved(lease_rx) => false,
        }
    }

    /// Woken after a claim that came back short, and not by an arrival (by a result that
    /// unblocked an ordering key): waits until the rows in flight have finished, at most as
    /// long as that claim took, before claiming again; an arrival ends the wait.
    ///
    /// Why: when the backlog holds fewer keys than rows in flight, every key's head is soon
    /// out and every row left waits behind one, so each claim walks all of them to fill its
    /// budget. Claimed again at each result that unblocked a few keys, the keys split into
    /// small groups, each paying that walk for a few rows (docs/design.md, "Ordering keys
    /// and claim rounds"). Waiting as long as the claim took keeps claims to at most half
    /// the loop's time; rows without keys never wake the loop this way.
    async fn gather_unblocked(&self, slots: &Arc<Semaphore>, max_in_flight: u32, took: Duration) {
        let free = slots.available_permits();
        let busy = (max_in_flight as usize).saturating_sub(free);
        if busy < 2 || self.arrivals.pending() {
            return;
        }
        let Ok(all) = u32::try_from(free + busy) else {
            return;
        };
        let finished = slots.clone().acquire_many_owned(all);
        let until = tokio::time::sleep(took);
        tokio::pin!(finished, until);
        loop {
            tokio::select! {
                _ = &mut finished => return,
                _ = &mut until => return,
                _ = self.shutdown.cancelled() => return,
                _ = self.wake.notified() => {
                    if self.arrivals.pending() {
                        return;
                    }
                }
            }
        }
    }

    /// Waits for the keeper to publish a new state (or a short while: a deadline can pass
    /// without any publication if the keeper task is starved).
    async fn wait_for_lease(&self, rx: &mut Option<watch::Receiver<LeaseState>>) {
        tokio::select! {
            _ = lease_changed(rx) => {}
            _ = self.shutdown.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Resolves when the lease state changes (never, without a lease).
async fn lease_changed(rx: &mut Option<watch::Receiver<LeaseState>>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// Resolves when the lease is lost, or held at another epoch or confirmation, than when
/// called (never, without a lease); a renewal, which only moves the deadline, does not count.
async fn lease_moved(rx: &mut Option<watch::Receiver<LeaseState>>) {
    let hold = |s: &LeaseState| match *s {
        LeaseState::Held {
            epoch, confirmed, ..
        } => Some((epoch, confirmed)),
        LeaseState::Standby => None,
    };
    match rx {
        Some(rx) => {
            let now = hold(&rx.borrow_and_update());
            if rx.wait_for(|s| hold(s) != now).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// How long an idle relay waits before it reads the table again, after a read that found
/// nothing claimable: `poll_interval`, unless every insert is announced (PostgreSQL's NOTIFY,
/// its listener connected). Then the read is only for rows whose time comes (a retry coming
/// due), and the read said none comes for `quiet_for`: the relay waits that long,
/// at least `poll_interval` and at most [`QUIET_POLLS`] of them, for what nothing announces.
/// An idle relay on PostgreSQL then reads the table once a second with the defaults, not
/// twice (docs/design.md, "Idle cost").
fn idle_wait(poll_interval: Duration, quiet_for: Duration, announced: bool) -> Duration {
    if announced {
        quiet_for.clamp(poll_interval, poll_interval * QUIET_POLLS)
    } else {
        poll_interval
    }
}

/// How long a claim in progress at shutdown may still take (its rows are then given back at
/// once): a twentieth of `shutdown_timeout`, taken from the sends' share.
fn claim_grace(shutdown_timeout: Duration) -> Duration {
    shutdown_timeout / 20
}

/// How `shutdown_timeout` is shared out: (waiting for sends in flight, writing their
/// results). Before these, a claim in progress gets [`claim_grace`]; what is left (a tenth)
/// is for releasing the lease.
pub fn shutdown_budget(shutdown_timeout: Duration) -> (Duration, Duration) {
    (shutdown_timeout * 3 / 4, shutdown_timeout / 10)
}
