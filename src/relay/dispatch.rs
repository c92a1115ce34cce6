//! Delivering one claimed row: route it to its sink, wait for the sink's slot and rate, check
//! that the claim and the lease still allow a send (G4), send, classify, and hand the result to
//! the recorder.
//!
//! Guarantees: a row is sent only if, at the moment of sending, the relay is not shutting down,
//! the lease (leader mode) is still held at the claim's epoch, and the claim's local deadline
//! leaves room for the sink's whole timeout, so the send ends before anyone else may claim
//! the row. A row that cannot be sent is given back at once, without counting an attempt.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::task::Poll;

use tokio::sync::{Notify, OwnedSemaphorePermit, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::chains::Place;
use super::recorder::RecorderHandle;
use super::retry;
use crate::lease::LeaseState;
use crate::sink::{CONFIG_ERROR_PAUSE, Outcome, SinkHandle, SinkRegistry};
use crate::store::{ClaimedRow, Completion, Resolution, Undeliverable};
use crate::telemetry::Tracer;

/// Extra time the relay allows a sink beyond its own timeout before giving up on it.
const TIMEOUT_GRACE: Duration = Duration::from_secs(1);

/// What every delivery shares.
pub struct Dispatcher {
    pub sinks: Arc<SinkRegistry>,
    pub recorder: RecorderHandle,
    /// Set on SIGTERM: rows not yet sent are given back.
    pub shutdown: CancellationToken,
    /// The lease state in leader mode; `None` when no lease applies.
    pub lease: Option<watch::Receiver<LeaseState>>,
    /// The relay loop's wake-up: a freed slot of a sink whose last claim took its whole
    /// budget means more of its rows can be claimed now.
    pub wake: Arc<Notify>,
    /// With `[tracing]` on, each send is a span (docs/tracing.md).
    pub tracer: Option<Arc<Tracer>>,
}

/// A claimed row and its claim.
pub struct Job {
    pub row: ClaimedRow,
    pub token: Arc<str>,
    /// The epoch the row was claimed under (leader mode).
    pub epoch: Option<i64>,
    /// When the claim statement was sent.
    pub claimed_at: Instant,
    /// After this (monotonic), the claim may have expired on the database clock.
    pub deadline: Instant,
    /// The relay's in-flight slot for this row: handed to the recorder with the result and
    /// released only once the result is written.
    pub slot: Option<OwnedSemaphorePermit>,
    /// Counted in its sink's queue ([`SinkHandle::queued`]): a run's first row from its claim
    /// on, each other row of the run once the row before it was delivered. A row behind
    /// another of its key waits for that row, not for a sink slot; counted, the rows of a few
    /// keys' runs would hold down every claim's budget for the sink while only one row of
    /// each can be sent at a time.
    pub queued: bool,
}

impl Dispatcher {
    /// Delivers the rows of one ordering key claimed together (a run, in id order), one after
    /// another: a row is sent only once the one before it was delivered; after any other
    /// result the rest go back unsent, no attempt counted (docs/design.md, "Sending"). A row
    /// of no key, or the only one of its key, is a run of one. A run in its key's chain
    /// (`place`) first waits for the run before it, and goes back unsent if that one was not
    /// delivered whole.
    pub async fn deliver_run(&self, jobs: Vec<Job>, mut place: Option<Place>) {
        let mut delivered = match place.as_mut() {
            Some(p) => p.may_send().await,
            None => true,
        };
        for mut job in jobs {
            if let Some(p) = &place {
                p.row_left();
            }
            if delivered {
                self.count_queued(&mut job);
                delivered = self.deliver(job).await;
            } else {
                self.hold_back(job);
            }
        }
        if let Some(p) = place {
            p.end(delivered);
        }
    }

    /// Counts `job` in its sink's queue, unless it is counted already or goes to no sink.
    pub fn count_queued(&self, job: &mut Job) {
        if !job.queued
            && job.row.undeliverable.is_none()
            && let Some(sink) = self.sinks.get(&job.row.delivery.channel)
        {
            sink.queued.fetch_add(1, Ordering::Relaxed);
            job.queued = true;
        }
    }

    /// A row of a run behind one that was not delivered: back in the table unsent.
    fn hold_back(&self, mut job: Job) {
        if job.queued
            && let Some(sink) = self.sinks.get(&job.row.delivery.channel)
        {
            sink.queued.fetch_sub(1, Ordering::Relaxed);
        }
        tracing::debug!(
            id = job.row.delivery.id,
            "row given back unsent: an earlier row of its key was not delivered"
        );
        self.recorder.record(
            Completion {
                id: job.row.delivery.id,
                token: job.token.clone(),
                resolution: Resolution::Release {
                    delay: Duration::ZERO,
                    error: None,
                },
            },
            job.row.ordering_key.is_some(),
            job.slot.take(),
        );
    }

    /// Delivers one row and records its result; true when it was delivered.
    pub async fn deliver(&self, mut job: Job) -> bool {
        let resolution = self.attempt(&mut job).await;
        let delivered = resolution == Resolution::Delivered;
        if let Some(sink) = self.sinks.get(&job.row.delivery.channel)
            && sink.hungry.load(Ordering::Relaxed)
        {
            self.wake.notify_one();
        }
        self.recorder.record(
            Completion {
                id: job.row.delivery.id,
                token: job.token.clone(),
                resolution,
            },
            job.row.ordering_key.is_some(),
            job.slot.take(),
        );
        delivered
    }

    /// Why the row may not be sent now, if it may not (G4).
    fn must_not_send(&self, job: &Job, timeout: Duration) -> Option<&'static str> {
        if self.shutdown.is_cancelled() {
            return Some("shutting down");
        }
        if let (Some(lease), Some(epoch)) = (&self.lease, job.epoch) {
            match *lease.borrow() {
                LeaseState::Held {
                    epoch: e, deadline, ..
                } if e == epoch && Instant::now() < deadline => {}
                _ => return Some("lease lost"),
            }
        }
        if Instant::now() + timeout + TIMEOUT_GRACE > job.deadline {
            return Some("claim too close to expiry to send");
        }
        None
    }

    /// One attempt at a row: what to write for it.
    async fn attempt(&self, job: &mut Job) -> Resolution {
        let sink = match self.route(job) {
            Ok(sink) => sink,
            Err(failed) => return failed,
        };
        // This row was counted in its sink's queue (`Job::queued`); it leaves the queue when
        // it holds a sink slot or is given back, whichever comes first.
        let queued = std::mem::take(&mut job.queued).then(|| Queued(&sink.queued));
        if let Some(failed) = too_large(job, sink) {
            return failed;
        }
        let _slot = match self.wait_to_send(job, sink, queued).await {
            Ok(slot) => slot,
            Err(unsent) => return unsent,
        };
        let outcome = self.send(job, sink).await;
        retry::resolve(&outcome, job.row.delivery.attempts, &sink.retry)
    }

    /// The row's sink, or (`Err`) the row is failed: it could not be read, or no sink serves
    /// its channel.
    fn route(&self, job: &Job) -> Result<&Arc<SinkHandle>, Resolution> {
        let d = &job.row.delivery;
        if let Some(Undeliverable::Unreadable(why)) = &job.row.undeliverable {
            tracing::warn!(id = d.id, reason = %why, "row cannot be read; marking it FAILED");
            metrics::counter!(crate::metric::ROWS_UNDELIVERABLE).increment(1);
            return Err(Resolution::Failed {
                error: format!("row could not be read: {why}"),
            });
        }
        self.sinks.get(&d.channel).ok_or_else(|| {
            metrics::counter!(crate::metric::DELIVERIES, "sink" => "none", "outcome" => "permanent").increment(1);
            Resolution::Failed {
                error: format!("no sink is configured for channel \"{}\"", d.channel),
            }
        })
    }

    /// Waits for the sink's slot (returned: held through the send) and rate, but never past
    /// the point where a send could no longer finish inside the claim; then checks that the
    /// row may still be sent (G4). `Err`: the row is given back unsent (`queued` is dropped
    /// either way).
    async fn wait_to_send(
        &self,
        job: &Job,
        sink: &SinkHandle,
        queued: Option<Queued<'_>>,
    ) -> Result<OwnedSemaphorePermit, Resolution> {
        let unsent = |why: &str| give_back(job, sink, why);
        if let Some(pause) = sink.pause.state() {
            return Err(paused(sink, pause));
        }
        let latest_start = job
            .deadline
            .checked_sub(sink.timeout + TIMEOUT_GRACE)
            .unwrap_or(job.claimed_at);
        let slot = tokio::select! {
            s = sink.slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => return Err(unsent("sink closed")),
            },
            _ = self.shutdown.cancelled() => return Err(unsent("shutting down")),
            _ = tokio::time::sleep_until(latest_start) => return Err(unsent("claim expired waiting for a sink slot")),
        };
        drop(queued);
        if let Some(rate) = &sink.rate {
            tokio::select! {
                _ = rate.acquire() => {}
                _ = self.shutdown.cancelled() => return Err(unsent("shutting down")),
                _ = tokio::time::sleep_until(latest_start) => return Err(unsent("claim expired waiting for the rate limit")),
            }
        }
        if let Some(pause) = sink.pause.state() {
            return Err(paused(sink, pause));
        }
        if let Some(why) = self.must_not_send(job, sink.timeout) {
            return Err(unsent(why));
        }
        Ok(slot)
    }

    /// Sends the row, records the send's metrics, and acts on what the sink answered (a
    /// throttle or a configuration error pauses the sink). With tracing on, the send is a
    /// span whose context the request carries (`job`'s delivery holds it from here on).
    async fn send(&self, job: &mut Job, sink: &SinkHandle) -> Outcome {
        let span = self
            .tracer
            .as_ref()
            .map(|t| t.begin(&sink.name, sink.kind, &mut job.row.delivery));
        let d = &job.row.delivery;
        let started = Instant::now();
        sink.series.in_flight().increment(1.0);
        // The send is polled only while it can still end inside the claim: the clock is read
        // before every poll, so a process paused (SIGSTOP, a long GC-like stall of the host)
        // past that point does not hand the request to the connection when it wakes.
        let stop = (started + sink.timeout + TIMEOUT_GRACE).min(job.deadline);
        let send = before(stop, sink.sink.deliver(d));
        let (sent, answer) = match &span {
            Some(_) => crate::sink::answered(send).await,
            None => (send.await, crate::sink::Answer::default()),
        };
        let outcome = match sent {
            Some(o) => o,
            None => Outcome::Retry {
                after: None,
                reason: format!("timed out after {:?}", sink.timeout),
            },
        };
        if let Some(span) = span {
            span.end(&outcome, &answer);
        }
        sink.series.in_flight().decrement(1.0);
        let took = started.elapsed();
        sink.send_time.record(took);
        sink.series.duration().record(took.as_secs_f64());
        sink.series.count(outcome.label());
        match &outcome {
            Outcome::Delivered => {
                let e2e = job.row.age_at_claim + job.claimed_at.elapsed();
                sink.series.end_to_end().record(e2e.as_secs_f64());
            }
            Outcome::Throttle { pause, reason } => sink.pause.pause_for(*pause, reason),
            Outcome::ConfigError { reason } => {
                tracing::error!(sink = %sink.name, reason, "sink configuration error; pausing the sink, rows stay pending");
                sink.pause.pause_for(CONFIG_ERROR_PAUSE, reason);
            }
            Outcome::Retry { reason, .. } => {
                tracing::debug!(id = d.id, sink = %sink.name, reason, "delivery failed; will retry");
            }
            Outcome::Permanent { reason } => {
                tracing::warn!(id = d.id, sink = %sink.name, reason, "delivery failed permanently");
            }
        }
        outcome
    }
}

/// A payload over the sink's limit (measured by the database at the claim, or here) fails
/// the row unsent.
fn too_large(job: &Job, sink: &SinkHandle) -> Option<Resolution> {
    let len = job.row.delivery.payload.len();
    let bytes = match &job.row.undeliverable {
        Some(Undeliverable::TooLarge { bytes }) => *bytes,
        _ if len > sink.max_payload_bytes => len as u64,
        _ => return None,
    };
    metrics::counter!(crate::metric::ROWS_UNDELIVERABLE).increment(1);
    Some(Resolution::Failed {
        error: format!(
            "payload of {bytes} bytes exceeds {} ({}); it was not sent",
            sink.payload_limit_key, sink.max_payload_bytes
        ),
    })
}

/// The row back in the table at once, no attempt counted: `why` it was not sent.
fn give_back(job: &Job, sink: &SinkHandle, why: &str) -> Resolution {
    tracing::debug!(id = job.row.delivery.id, sink = %sink.name, why, "row given back unsent");
    Resolution::Release {
        delay: Duration::ZERO,
        error: None,
    }
}

/// The row back in the table until the paused sink resumes (`rest`), no attempt counted. Its
/// `last_error` says why it was not sent: a row waiting with no attempt and no reason left
/// an operator nothing to go on. The pause's reason is a sink's classified answer (a 429, a
/// refused key), which names no secret, as every reason written for a row.
fn paused(sink: &SinkHandle, (rest, why): (Duration, String)) -> Resolution {
    Resolution::Release {
        delay: rest,
        error: Some(format!("not sent: sink {} paused ({why})", sink.name)),
    }
}

/// A row counted in its sink's [`SinkHandle::queued`](crate::sink::SinkHandle); uncounted
/// when dropped.
struct Queued<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs `fut` to its end unless `stop` comes first (`None`). Unlike `tokio::time::timeout`,
/// which polls the inner future before looking at the clock, this looks at the clock first:
/// after a pause that outlasted `stop`, the future is dropped without being polled again, so
/// no further bytes of the request are handed to the connection.
async fn before<T>(stop: Instant, fut: impl Future<Output = T>) -> Option<T> {
    let mut fut = std::pin::pin!(fut);
    let mut timer = std::pin::pin!(tokio::time::sleep_until(stop));
    std::future::poll_fn(|cx| {
        if Instant::now() >= stop {
            return Poll::Ready(None);
        }
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn before_stops_without_polling_after_the_deadline() {
        let polled = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let p = polled.clone();
        let stop = Instant::now() + Duration::from_millis(50);
        // Jump past the deadline before the first poll, as a paused process would.
        tokio::time::advance(Duration::from_millis(60)).await;
        let r = before(stop, async move {
            p.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            1
        })
        .await;
        assert_eq!(r, None);
        assert_eq!(polled.load(std::sync::atomic::Ordering::SeqCst), 0);
        let stop = Instant::now() + Duration::from_millis(50);
        assert_eq!(before(stop, async { 2 }).await, Some(2));
        let stop = Instant::now() + Duration::from_millis(50);
        assert_eq!(before(stop, std::future::pending::<u8>()).await, None);
    }
}
