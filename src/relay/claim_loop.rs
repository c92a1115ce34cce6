//! The relay loop as a struct: what it started (recorder, dispatcher, delivery slots and
//! tasks) and what it remembers between claim rounds, with one method per step of a round
//! (the loop itself is drawn at the top of `relay/mod.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::chains::{Chains, Place};
use super::{
    BUDGET_HORIZON, Dispatcher, GATHER_SLOTS, Job, NEWEST_EVERY, OTHERS_EVERY, Recorder, Relay,
    TOP_UP_POLL, TOP_UP_WAIT, budget, claim_grace, idle_wait, lease_changed, lease_moved,
    shutdown_budget,
};
use crate::BoxFuture;
use crate::config::Mode;
use crate::lease::{LeaseState, drift};
use crate::sink::{MovingAverage, SinkRegistry};
use crate::store::{Budgets, ClaimRequest, ClaimedRow, Fence, Probe};

/// What a step of a round gives the next, or `None`: the round is over (the step waited, or
/// found nothing to do) and the loop starts the next one, unless it is shutting down.
type Step<T> = Option<T>;

/// The relay loop's state.
pub(super) struct ClaimLoop {
    relay: Relay,
    recorder: Recorder,
    dispatcher: Arc<Dispatcher>,
    /// One permit per row in flight, from its claim until its result is written.
    slots: Arc<Semaphore>,
    /// One delivery task per claimed row.
    deliveries: JoinSet<()>,
    /// Claim only when at least this many slots are free (unless nothing is in flight):
    /// otherwise every finished send would trigger its own one-row claim statement.
    worth_claiming: usize,
    /// The lease state, as the loop's waits last saw it (leader mode with a lease).
    lease_rx: Option<watch::Receiver<LeaseState>>,
    /// Claims failed in a row (the database unreachable): how long the next wait is.
    failed_claims: u32,
    /// When a claim last looked for rows of channels no sink serves.
    others_looked_at: Instant,
    /// When a claim last took some of each channel's newest rows.
    newest_taken_at: Instant,
    /// The last claim took a channel's whole budget: rows are waiting behind it.
    backlog: bool,
    /// The loop has waited [`GATHER_SLOTS`] for half a batch of free slots: the next claim
    /// takes the slots that are free.
    gathered: bool,
    /// Since when a claim that would only top up the sinks' queues has been waiting.
    topping_up_since: Option<Instant>,
    /// The last claim (or read) found nothing, and nothing but the poll timer (or the lease)
    /// woke the loop since: read first whether anything is claimable, and claim only if so
    /// (what an idle relay costs the database: one plain read per poll; docs/design.md,
    /// "Idle cost").
    probe_next: bool,
    /// How long claims take: with each sink's send time it sizes the rows claimed ahead.
    claim_time: MovingAverage,
    /// Per ordering key, the last run handed out: the next goes behind it.
    chains: Chains,
}

impl ClaimLoop {
    /// Starts the recorder and the dispatcher for `relay`'s deliveries.
    pub(super) fn start(relay: Relay) -> ClaimLoop {
        let s = &relay.settings;
        let recorder = Recorder::start(relay.store.clone(), relay.wake.clone(), s.max_in_flight);
        let chains = Chains::new(relay.wake.clone());
        let dispatcher = Arc::new(Dispatcher {
            sinks: relay.sinks.clone(),
            recorder: recorder.handle(),
            wake: relay.wake.clone(),
            shutdown: relay.shutdown.clone(),
            lease: relay.lease.as_ref().map(|(_, rx)| rx.clone()),
            tracer: relay.tracer.clone(),
        });
        let full_batch = s.batch_size.min(s.max_in_flight) as usize;
        tracing::info!(
            instance = %s.instance_id,
            mode = ?s.mode,
            batch_size = s.batch_size,
            max_in_flight = s.max_in_flight,
            "relay started"
        );
        ClaimLoop {
            slots: Arc::new(Semaphore::new(s.max_in_flight as usize)),
            worth_claiming: (full_batch / 2).max(1),
            lease_rx: relay.lease.as_ref().map(|(_, rx)| rx.clone()),
            relay,
            recorder,
            dispatcher,
            deliveries: JoinSet::new(),
            failed_claims: 0,
            others_looked_at: Instant::now() - OTHERS_EVERY,
            newest_taken_at: Instant::now() - NEWEST_EVERY,
            backlog: false,
            gathered: false,
            topping_up_since: None,
            probe_next: false,
            claim_time: MovingAverage::default(),
            chains,
        }
    }

    /// Whether shutdown has begun: no new round starts.
    pub(super) fn stopping(&self) -> bool {
        self.relay.shutdown.is_cancelled()
    }

    /// One claim round: the lease, free slots, the budgets, a read first when idle, the
    /// claim, a delivery task per row, then a wait for a reason to claim again.
    pub(super) async fn round(&mut self) -> Step<()> {
        while self.deliveries.try_join_next().is_some() {}
        let fence = self.fence().await?;
        let (limit, busy) = self.free_slots().await?;
        let budgets = self.plan(limit, busy).await?;
        let req = self.request(fence, &budgets);
        self.probe_first(&req).await?;
        let claimed_at = Instant::now();
        let rows = self.claim(&req).await?;
        let took = claimed_at.elapsed();
        let more = self.relay.store.more_behind();
        let full = self.took_whole_budget(&budgets, &rows, took, req.newest, more);
        let found_nothing = rows.is_empty();
        self.hand_out(rows, &req, claimed_at);
        // A channel took its whole budget: there is probably more; claim again at once (a
        // sink with no capacity left asks for nothing, and a freed slot of a hungry sink wakes
        // the loop).
        if !full {
            self.wait_after_short_claim(took, found_nothing).await;
        }
        Some(())
    }

    /// 1. Leader mode: only the lease holder claims, under its epoch. `Some(None)`: no lease
    ///    applies. Without a live lease, waits for the keeper's next state.
    async fn fence(&mut self) -> Step<Option<Fence>> {
        let fence = match &self.relay.lease {
            Some((name, rx)) if self.relay.settings.mode == Mode::Leader => {
                let state = *rx.borrow();
                state.fence(name)
            }
            _ => return Some(None),
        };
        if fence.is_none() {
            self.wait_for_lease().await;
            return None;
        }
        Some(fence)
    }

    /// 2. Enough free slots for a claim worth its statement: how many rows it may take, and
    ///    whether any slot is busy. A slot is freed only once its row's result is written, so
    ///    while results cannot be written nothing new is claimed (backpressure), and the rows
    ///    sent but not yet recorded never exceed max_in_flight.
    ///
    ///    Waiting for half a batch of free slots saves statements, but only for a moment:
    ///    slow sends may hold slots for seconds, and other sinks' rows must not wait for
    ///    them. (The semaphore is fair: a waiter for several permits would hold back a waiter
    ///    for one, so the two waits are never made at once.)
    async fn free_slots(&mut self) -> Step<(usize, bool)> {
        let s = &self.relay.settings;
        let free = self.slots.available_permits();
        let busy = (s.max_in_flight as usize).saturating_sub(free);
        if free == 0 {
            tokio::select! {
                p = self.slots.clone().acquire_owned() => drop(p),
                _ = self.relay.shutdown.cancelled() => {}
            }
            return None;
        }
        if free < self.worth_claiming && busy > 0 && !self.gathered {
            tokio::select! {
                p = self.slots.clone().acquire_many_owned(self.worth_claiming as u32) => drop(p),
                _ = tokio::time::sleep(GATHER_SLOTS) => self.gathered = true,
                _ = self.relay.shutdown.cancelled() => {}
            }
            return None;
        }
        self.gathered = false;
        let limit = free.min(s.batch_size as usize);
        (limit > 0).then_some((limit, busy > 0))
    }

    /// 3. Claim only what each sink can start now (its free slots and rate), shared fairly
    ///    when they ask for more than is free: rows of a slow or saturated sink never sit in
    ///    the relay's slots waiting for that sink while another sink's rows wait in the
    ///    table. Channels no sink serves are looked for now and then. Nothing to ask for:
    ///    waits a poll interval (or a wake-up).
    async fn plan(&mut self, limit: usize, busy: bool) -> Step<Budgets> {
        let others = self.others_looked_at.elapsed() >= OTHERS_EVERY;
        let budgets = budget::budgets(
            &self.relay.sinks,
            limit as u32,
            BUDGET_HORIZON,
            others,
            self.claim_time.get(),
        );
        if others {
            self.others_looked_at = Instant::now();
        }
        if self.only_tops_up(&budgets, busy) {
            let since = *self.topping_up_since.get_or_insert_with(Instant::now);
            if since.elapsed() < TOP_UP_WAIT {
                tokio::select! {
                    _ = self.relay.wake.notified() => {}
                    _ = tokio::time::sleep(TOP_UP_POLL) => {}
                    _ = self.relay.shutdown.cancelled() => {}
                }
                return None;
            }
        }
        self.topping_up_since = None;
        if budgets.total() == 0 {
            self.idle(self.relay.settings.poll_interval).await;
            return None;
        }
        Some(budgets)
    }

    /// Whether a claim would only top up the rows queued for busy sinks (no sink could start
    /// a row now), with fewer rows than half a batch: it then waits, for at most
    /// [`TOP_UP_WAIT`], until the sinks ask for more, since queued rows keep every sink busy
    /// meanwhile and under load claims of 30-80 rows become fewer claims of more
    /// (docs/performance-log.md has the measurements). A sink with a free slot and nothing
    /// queued is never kept waiting, so light load is claimed at once (docs/design.md,
    /// "Claims worth a statement").
    fn only_tops_up(&self, budgets: &Budgets, busy: bool) -> bool {
        (1..self.worth_claiming as u32).contains(&budgets.total())
            && busy
            && budgets.others.is_none()
            && !budget::starts_now(&self.relay.sinks, BUDGET_HORIZON)
    }

    /// The claim of `budgets` under `fence`. Under a backlog, rows that just arrived are
    /// taken from each channel's newest end by this claim, so they wait one claim round, not
    /// behind the backlog; without a backlog the oldest-first pick reaches them anyway and
    /// nothing extra is read.
    fn request(&mut self, fence: Option<Fence>, budgets: &Budgets) -> ClaimRequest {
        let arrived = self.relay.arrivals.take();
        let newest = (arrived && self.backlog) || self.newest_taken_at.elapsed() >= NEWEST_EVERY;
        if newest {
            self.newest_taken_at = Instant::now();
        }
        let s = &self.relay.settings;
        ClaimRequest {
            trace: self.relay.tracer.is_some(),
            limit: budgets.total(),
            ttl: s.claim_ttl,
            claimer: s.instance_id.clone(),
            token: Arc::from(crate::random_token()),
            fence,
            alone: s.mode == Mode::Leader,
            exclude_channels: Vec::new(),
            max_payload_bytes: Some(self.relay.sinks.max_payload_bytes() as u64),
            newest,
            budgets: Some(budgets.clone()),
            tails: self
                .chains
                .tails(key_runs(&self.relay.sinks, &self.claim_time)),
        }
    }

    /// An idle poll reads first; `None` when the read found nothing claimable (the loop has
    /// then waited). Under load claims find rows and never read first; a wake-up (NOTIFY, the
    /// newest-id check, a result that unblocked a key) means rows may have arrived, so it
    /// claims at once. A row that becomes claimable just after the read waits for the next
    /// poll or wake-up, as it would had the claim itself run a moment earlier. A read that
    /// fails goes on to the claim, which reports the failure and retries.
    async fn probe_first(&mut self, req: &ClaimRequest) -> Step<()> {
        if !std::mem::take(&mut self.probe_next) {
            return Some(());
        }
        let probe = tokio::select! {
            p = self.relay.store.probe(req) => p,
            _ = self.relay.shutdown.cancelled() => return None,
        };
        if let Ok(Probe::Nothing { quiet_for }) = probe {
            let announced = self.relay.arrivals.announced();
            let wait = idle_wait(self.relay.settings.poll_interval, quiet_for, announced);
            self.probe_next = !self.idle(wait).await;
            return None;
        }
        Some(())
    }

    /// The claim, raced against shutdown: a claim stuck on a locked table must not hold the
    /// process past shutdown_timeout. It gets a short grace first, so that an ordinary claim
    /// completes and its rows are given back at once by their tasks; a claim abandoned after
    /// that may still commit on the server, and its rows are then re-claimed after their
    /// claim expires. A failed claim marks the database unreachable and backs off: `None`.
    async fn claim(&mut self, req: &ClaimRequest) -> Step<Vec<ClaimedRow>> {
        let result = {
            let relay = &self.relay;
            let mut claim = std::pin::pin!(relay.store.claim(req));
            tokio::select! {
                r = &mut claim => r,
                _ = relay.shutdown.cancelled() => {
                    let grace = claim_grace(relay.settings.shutdown_timeout);
                    tokio::time::timeout(grace, &mut claim).await.ok()?
                }
            }
        };
        match result {
            Ok(rows) => {
                if self.failed_claims > 0 {
                    tracing::info!("database reachable again; claiming resumed");
                }
                self.failed_claims = 0;
                self.relay.health.set_database(true);
                Some(rows)
            }
            Err(e) => {
                self.back_off(e).await;
                None
            }
        }
    }

    /// After a failed claim: readiness goes false, and the loop waits 0.5 s, doubling with
    /// each failure in a row up to 5 s.
    async fn back_off(&mut self, e: anyhow::Error) {
        self.failed_claims += 1;
        self.relay.health.set_database(false);
        let wait = (Duration::from_millis(250) * 2u32.pow(self.failed_claims.min(5)))
            .min(Duration::from_secs(5));
        tracing::warn!(error = %format!("{e:#}"), retry_in_ms = wait.as_millis() as u64, "claim failed");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.relay.shutdown.cancelled() => {}
        }
    }

    /// Records what a claim that took `took` found, marks each sink hungry or not, and
    /// returns whether a channel got its whole budget: it probably has more rows due.
    ///
    /// With `newest`, a channel's budget held a share for its newest rows that its oldest
    /// rows could not take, and which the newest rows may not fill: under a backlog they are
    /// often rows waiting behind their keys (a burst of keyed rows after the rest) or held by
    /// another claimer. Such a channel counts as having got its whole budget once its oldest
    /// share is full. Counted against the whole budget instead, the claim came back short,
    /// the loop waited `poll_interval`, and the next claim (100 ms later, so again with the
    /// newest share) came back short again: a backlog drained one claim per poll
    /// (docs/design.md, "When the loop claims"). With `more` (`Queue::more_behind`) the claim
    /// came back short with rows likely behind what it read, and every sink counts as
    /// hungry: its next freed slot wakes the loop, should the next round find no budget.
    fn took_whole_budget(
        &mut self,
        budgets: &Budgets,
        rows: &[ClaimedRow],
        took: Duration,
        newest: bool,
        more: bool,
    ) -> bool {
        self.claim_time.record(took);
        metrics::histogram!(crate::metric::CLAIM_DURATION).record(took.as_secs_f64());
        metrics::counter!(crate::metric::CLAIMED).increment(rows.len() as u64);
        let mut full = false;
        for (channel, budget) in &budgets.channels {
            let got = rows
                .iter()
                .filter(|r| &r.delivery.channel == channel)
                .count();
            let oldest = budget - crate::store::newest_share(*budget, newest);
            let hungry = more || got >= oldest as usize;
            full |= hungry;
            if let Some(sink) = self.relay.sinks.get(channel) {
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
        self.backlog = full;
        full
    }

    /// 4. One delivery task per run: the rows of an ordering key claimed together are sent
    ///    one after another, each only once the one before it was delivered; every other row
    ///    is a run of its own. Each row holds one in-flight slot.
    fn hand_out(&mut self, rows: Vec<ClaimedRow>, req: &ClaimRequest, claimed_at: Instant) {
        let ttl = self.relay.settings.claim_ttl;
        let deadline = claimed_at + ttl - drift(ttl);
        let epoch = req.fence.as_ref().map(|f| f.epoch);
        let mut runs: Vec<Vec<Job>> = Vec::new();
        let mut by_key: HashMap<String, usize> = HashMap::new();
        for row in rows {
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                // Cannot happen: only this loop takes slots and it claimed no more than were
                // free. Giving the row back keeps it safe if it ever does.
                tracing::error!(
                    "no free slot for a claimed row; it will be retried after its claim expires"
                );
                continue;
            };
            let key = row.ordering_key.clone();
            let job = Job {
                row,
                token: req.token.clone(),
                epoch,
                claimed_at,
                deadline,
                slot: Some(permit),
                queued: false,
            };
            // Rows come in id order, so a key's run is in id order too.
            match key.and_then(|k| match by_key.get(&k) {
                Some(&i) => Some(i),
                None => {
                    by_key.insert(k, runs.len());
                    None
                }
            }) {
                Some(i) => runs[i].push(job),
                None => runs.push(vec![job]),
            }
        }
        for mut run in runs {
            // A run's first row waits for a sink slot from now on (in a chain, for the run
            // before it first: one row a key at most), released by the delivery once it holds
            // one; the rest are counted as their turn comes (`Job::queued`).
            if let Some(first) = run.first_mut() {
                self.dispatcher.count_queued(first);
            }
            let place = self.chain(&run);
            let dispatcher = self.dispatcher.clone();
            // Boxed: the delivery's future is large (the waits, the send, its timers), and
            // the task would move it whole several times (spawned, polled, finished); boxed,
            // the task moves a pointer.
            let delivery: BoxFuture<'static, ()> =
                Box::pin(async move { dispatcher.deliver_run(run, place).await });
            self.deliveries.spawn(delivery);
        }
    }

    /// A keyed run goes at the end of its key's chain, behind the key's rows still in flight
    /// (docs/design.md, "Ordering keys: chains").
    fn chain(&mut self, run: &[Job]) -> Option<Place> {
        let last = run.last()?;
        let key = last.row.ordering_key.clone()?;
        let channel = &last.row.delivery.channel;
        let key_run = key_runs(&self.relay.sinks, &self.claim_time)(channel);
        Some(
            self.chains
                .join(key, channel, last.row.delivery.id, run.len(), key_run),
        )
    }

    /// 5. After a claim that left every budget short: waits a poll interval or a wake-up.
    ///    Only a wake-up says rows may have arrived (NOTIFY, the newest-id check, a result
    ///    that unblocked an ordering key, a freed slot of a hungry sink); the poll timer and
    ///    the lease say nothing about the table, so after a claim that found nothing the next
    ///    poll reads first.
    async fn wait_after_short_claim(&mut self, took: Duration, found_nothing: bool) {
        let woken = self.idle(self.relay.settings.poll_interval).await;
        if woken {
            self.gather_unblocked(took).await;
        }
        self.probe_next = found_nothing && !woken;
    }

    /// Waits for a wake-up, `wait`, shutdown, or the lease lost or taken at another epoch
    /// (not its renewals: they say nothing about the table, and each would cost an idle relay
    /// a read). Returns whether a wake-up ended it: rows may have arrived.
    async fn idle(&mut self, wait: Duration) -> bool {
        let relay = &self.relay;
        tokio::select! {
            _ = relay.wake.notified() => true,
            _ = tokio::time::sleep(wait) => false,
            _ = relay.shutdown.cancelled() => false,
            _ = lease_moved(&mut self.lease_rx) => false,
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
    async fn gather_unblocked(&self, took: Duration) {
        let relay = &self.relay;
        let free = self.slots.available_permits();
        let busy = (relay.settings.max_in_flight as usize).saturating_sub(free);
        // Keys with rows in flight are read from behind them, whatever the other keys do:
        // waiting would only hold their next rows back.
        if busy < 2 || relay.arrivals.pending() || self.chains.any_running() {
            return;
        }
        let Ok(all) = u32::try_from(free + busy) else {
            return;
        };
        let finished = self.slots.clone().acquire_many_owned(all);
        let until = tokio::time::sleep(took);
        tokio::pin!(finished, until);
        loop {
            tokio::select! {
                _ = &mut finished => return,
                _ = &mut until => return,
                _ = relay.shutdown.cancelled() => return,
                _ = relay.wake.notified() => {
                    if relay.arrivals.pending() {
                        return;
                    }
                }
            }
        }
    }

    /// Waits for the keeper to publish a new state (or a short while: a deadline can pass
    /// without any publication if the keeper task is starved).
    async fn wait_for_lease(&mut self) {
        tokio::select! {
            _ = lease_changed(&mut self.lease_rx) => {}
            _ = self.relay.shutdown.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }

    /// Shutdown: nothing more is claimed; rows not yet sent are given back by their tasks.
    /// The whole shutdown fits in shutdown_timeout whatever the database does: a claim in
    /// progress gets 5% of it, sends 75%, writing their results 10%, and the caller's lease
    /// release the rest (see [`shutdown_budget`]).
    pub(super) async fn drain(self) {
        let ClaimLoop {
            relay,
            recorder,
            dispatcher,
            mut deliveries,
            ..
        } = self;
        relay.health.set_draining();
        let (drain, record) = shutdown_budget(relay.settings.shutdown_timeout);
        let in_flight = deliveries.len();
        tracing::info!(in_flight, "shutting down: waiting for deliveries in flight");
        let drained = tokio::time::timeout(drain, async {
            while deliveries.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                left = deliveries.len(),
                "shutdown_timeout passed with sends still running; their rows will be retried after their claims expire"
            );
            deliveries.abort_all();
        }
        drop(dispatcher);
        recorder.close(record).await;
        tracing::info!("relay stopped");
    }
}

/// How many rows of a key of a channel a claim takes behind its rows in flight, by how long
/// claims take and how long the channel's sink takes a row (`SinkHandle::pace`; docs/design.md,
/// "Ordering keys: a key's pace").
fn key_runs<'a>(
    sinks: &'a SinkRegistry,
    claim_time: &'a MovingAverage,
) -> impl Fn(&str) -> usize + 'a {
    move |channel| {
        let send = sinks.get(channel).and_then(|s| s.pace());
        budget::key_run(claim_time.get(), send)
    }
}
