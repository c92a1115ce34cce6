//! The relay loop, in leader or claim mode (docs/design.md, "Claims" and "Results"):
//!
//! ```text
//! loop:
//!     leader mode: wait until the lease is held; claims carry its epoch (fencing)
//!     wait until enough delivery slots are free to make a claim worth a statement
//!     claim up to min(free slots, batch_size) due rows      -- one statement
//!     hand each row to a delivery task                       -- results batched by the recorder
//!         (a key's rows: one task per run, behind the key's runs in flight, chains.rs)
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
mod chains;
mod claim_loop;
mod dispatch;
mod recorder;
pub mod retry;
#[cfg(test)]
mod tests;
mod wiring;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

pub use dispatch::{Dispatcher, Job};
pub use recorder::{Recorder, RecorderHandle};
pub use wiring::{assemble, watch_arrivals};

use crate::config::RelaySettings;
use crate::lease::LeaseState;
use crate::sink::SinkRegistry;
use crate::store::{Arrivals, Queue};
use crate::telemetry::{Health, Tracer};
use claim_loop::ClaimLoop;

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
    /// Spans of delivery attempts, when `[tracing]` is on (docs/tracing.md): claims then
    /// return each row's trace context, and each send is a span.
    pub tracer: Option<Arc<Tracer>>,
}

impl Relay {
    /// Runs until `shutdown`, then drains. Returns once every in-flight result is written
    /// (or `shutdown_timeout` has passed).
    pub async fn run(self) {
        let mut rounds = ClaimLoop::start(self);
        while !rounds.stopping() {
            rounds.round().await;
        }
        rounds.drain().await;
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
