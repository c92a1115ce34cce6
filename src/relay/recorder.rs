//! Batches result writes: completions from many deliveries are written together, one statement
//! per outcome kind (each row under its own claim token), instead of one statement per row.
//!
//! Guarantees:
//! - every completion handed to the recorder is written, retried while the database is
//!   unreachable, until [`Recorder::close`] gives up after its deadline (then the rows' claims
//!   simply expire and they are delivered again: at-least-once, never lost);
//! - each completion carries the relay's in-flight slot of its row, released only once the
//!   result is durably written (or given up on). So the rows sent but not yet recorded never
//!   exceed `max_in_flight`, and while results cannot be written the relay claims nothing new
//!   (backpressure) instead of piling up sends whose results it cannot record;
//! - a batch the database refuses for a reason that will not go away (a value it rejects, a
//!   trigger, a constraint) is split until the refused row is isolated; that row is finished
//!   FAILED with a generic reason, and every other result is written as usual. One bad row
//!   never blocks the others. Where even that is refused (a status column that cannot hold
//!   the FAILED value), the row is parked ([`Resolution::Park`]): only the relay's own claim
//!   columns are written, and it is never claimed, nor sent, again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc};
use tokio::task::JoinHandle;

use crate::store::{Completion, Failure, Queue, Resolution, WriteError};

/// Most completions written in one go.
const FLUSH_ROWS: usize = 256;
/// A write of fewer results than this waits up to [`GATHER`] for more: under load more arrive
/// within a millisecond or two, and one statement for 128 rows costs the database far less
/// than several for a few each (against a Node receiver, batches of about 50 made PostgreSQL's
/// statements per delivered row 0.018-0.022; 128 made them 0.016-0.017; 256 took MariaDB's
/// result writes from 0.0052 to 0.0037 a row at the same rows/s, docs/performance-log.md,
/// 2026-12-06). Never more than `max_in_flight` ([`gather_rows`]): with 64 in flight a wait
/// for 128 results always ran its whole course while every slot waited on it (0.6x the
/// rows/s; a quarter, 16, was 0.87x of waiting for all 64). Idle, a lone result waits at most
/// [`GATHER`].
const GATHER_ROWS: usize = 256;
/// See [`GATHER_ROWS`]: short next to a send and a claim, so the slots it holds back cost
/// little (the relay has `max_in_flight` of them, eight times a sink's sends at once). At
/// 2 ms, a receiver answering at a third of the usual rate left writes of about 90 results
/// and PostgreSQL at 0.020-0.022 statements per delivered row; at 5 ms, six alternate drains
/// each against Node: 0.0183 against 0.0201, rows/s 0.98x; in process 1.06x (PostgreSQL),
/// 1.04x (MariaDB) and 0.99x (SQLite), each with fewer statements (docs/design.md,
/// "Results").
const GATHER: Duration = Duration::from_millis(5);
/// The wait once a result of a row with an ordering key is among those gathered: the next
/// row of its key is claimable only after this write, so a chain of one key advances by one
/// row per write, and a shorter wait keeps it moving.
const GATHER_KEYED: Duration = Duration::from_millis(2);
/// Longest pause between retries of a write that failed transiently.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// One result on its way to the database.
pub struct Entry {
    pub completion: Completion,
    /// The row had an ordering key (writing it may let the next row of that key be claimed).
    pub keyed: bool,
    /// The row's in-flight slot, held until its result is written.
    pub slot: Option<OwnedSemaphorePermit>,
}

/// The handle deliveries send completions to.
#[derive(Clone)]
pub struct RecorderHandle {
    tx: mpsc::UnboundedSender<Entry>,
}

impl RecorderHandle {
    /// Queues a completion for writing; the slot is released once it is written.
    pub fn record(&self, completion: Completion, keyed: bool, slot: Option<OwnedSemaphorePermit>) {
        let entry = Entry {
            completion,
            keyed,
            slot,
        };
        if self.tx.send(entry).is_err() {
            tracing::error!(
                "result recorder has stopped; a result was not written (the row will be retried after its claim expires)"
            );
        }
    }
}

/// The recorder task.
pub struct Recorder {
    handle: RecorderHandle,
    task: JoinHandle<()>,
}

impl Recorder {
    /// Starts the recorder. After writing results of rows with an ordering key it wakes
    /// `written` (the relay loop): the next row of each such key may now be claimable, and the
    /// loop should not sleep a whole poll interval before looking.
    pub fn start(store: Arc<dyn Queue>, written: Arc<Notify>, max_in_flight: u32) -> Recorder {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(store, rx, written, gather_rows(max_in_flight)));
        Recorder {
            handle: RecorderHandle { tx },
            task,
        }
    }

    pub fn handle(&self) -> RecorderHandle {
        self.handle.clone()
    }

    /// Writes what is queued and stops. Call after every delivery has finished.
    pub async fn close(self, deadline: Duration) {
        drop(self.handle);
        let mut task = self.task;
        if tokio::time::timeout(deadline, &mut task).await.is_err() {
            tracing::error!(
                "could not write every result before the shutdown deadline; those rows will be retried after their claims expire"
            );
            task.abort();
        }
    }
}

/// How many results a small write waits for (see [`GATHER_ROWS`]).
fn gather_rows(max_in_flight: u32) -> usize {
    (max_in_flight as usize).clamp(1, GATHER_ROWS)
}

async fn run(
    store: Arc<dyn Queue>,
    mut rx: mpsc::UnboundedReceiver<Entry>,
    written: Arc<Notify>,
    gather_rows: usize,
) {
    let mut buf: Vec<Entry> = Vec::with_capacity(FLUSH_ROWS);
    let mut open = true;
    while open || !buf.is_empty() {
        if buf.is_empty() {
            match rx.recv().await {
                Some(e) => buf.push(e),
                None => break,
            }
        }
        // Take whatever else is already waiting; a small batch waits a moment (GATHER, or
        // GATHER_KEYED once it holds a keyed result) for more. Results that arrive during a
        // write share the next one (group commit).
        let started = tokio::time::Instant::now();
        let mut keyed = buf.iter().any(|e| e.keyed);
        while buf.len() < FLUSH_ROWS {
            match rx.try_recv() {
                Ok(e) => {
                    keyed |= e.keyed;
                    buf.push(e);
                }
                Err(mpsc::error::TryRecvError::Empty) if open && buf.len() < gather_rows => {
                    let wait = if keyed { GATHER_KEYED } else { GATHER };
                    match tokio::time::timeout_at(started + wait, rx.recv()).await {
                        Ok(Some(e)) => {
                            keyed |= e.keyed;
                            buf.push(e);
                        }
                        Ok(None) => {
                            open = false;
                            break;
                        }
                        Err(_) => break,
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let batch: Vec<Completion> = buf.iter().map(|e| e.completion.clone()).collect();
        let outcome = write(store.as_ref(), batch).await;
        if outcome.not_applied > 0 {
            tracing::warn!(
                rows = outcome.not_applied,
                "results not applied: those rows' claims had expired and were taken over (they will be, or were, delivered again)"
            );
        }
        // Results are durable (or given up on): free the slots (the loop, if it waits for
        // slots, wakes by itself), and wake the loop when an ordering key may be unblocked.
        let mut keyed = false;
        for e in buf.drain(..) {
            keyed |= e.keyed;
            drop(e.slot);
        }
        if keyed {
            written.notify_one();
        }
    }
}

/// What writing a batch came to.
#[derive(Debug, Default)]
struct Written {
    /// Results whose row no longer carried their claim token (expired and taken over).
    not_applied: u64,
}

/// Writes `batch`: retries transient failures, isolates refused rows. Returns when every
/// result is either written or given up on (a refused row whose fallback was refused too).
async fn write(store: &dyn Queue, batch: Vec<Completion>) -> Written {
    let mut out = Written::default();
    // Work list of sub-batches still to write; a refused batch is replaced by its halves.
    let mut work = vec![batch];
    while let Some(mut part) = work.pop() {
        let mut wait = Duration::from_millis(100);
        loop {
            let expected = part.len() as u64;
            match store.complete(&part).await {
                Ok(changed) => {
                    out.not_applied += expected.saturating_sub(changed);
                    break;
                }
                Err(e) => {
                    // Drop what the failed call did write, so it is neither written twice
                    // nor counted as not applied.
                    out.not_applied += (e.handled.len() as u64).saturating_sub(e.changed);
                    let mut i = 0;
                    part.retain(|_| {
                        let keep = !e.handled.contains(&i);
                        i += 1;
                        keep
                    });
                    if e.failure == Failure::Transient {
                        metrics::counter!(crate::metric::RESULT_WRITE_ERRORS, "kind" => "transient").increment(1);
                        tracing::warn!(error = %e, rows = part.len(), retry_in_ms = wait.as_millis() as u64, "writing results failed; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(MAX_RETRY_WAIT);
                        continue;
                    }
                    metrics::counter!(crate::metric::RESULT_WRITE_ERRORS, "kind" => "refused")
                        .increment(1);
                    if part.len() > 1 {
                        // Split until the refused row is alone; the others go through.
                        let rest = part.split_off(part.len() / 2);
                        work.push(rest);
                        work.push(part);
                    } else if let Some(c) = part.pop() {
                        isolate(c, &e, &mut work);
                    }
                    break;
                }
            }
        }
    }
    out
}

/// The reason written for a row whose own result the database refused: plain ASCII, so the
/// database cannot refuse it for its text. It names what the attempt came to, since a
/// delivered row ends FAILED here too (an operator must not requeue it blindly).
fn generic_reason(r: &Resolution) -> String {
    let outcome = match r {
        Resolution::Delivered => "delivered (the receiver accepted it)",
        Resolution::Retry { .. } => "a retryable failure",
        Resolution::Failed { .. } => "a permanent failure",
        Resolution::Release { .. } => "not sent",
        Resolution::Park => "parked",
    };
    format!(
        "the result of this attempt could not be stored (the database refused it; see the relay's log); the attempt was {outcome}"
    )
}

/// A single result the database refused: queue the row's fallback (FAILED with a generic
/// reason); if the refused result already was that fallback, park the row (docs/design.md,
/// "Results"); if even parking was refused, give up on the row (its claim expires and it is
/// delivered again later; logged and counted).
fn isolate(c: Completion, e: &WriteError, work: &mut Vec<Vec<Completion>>) {
    let is_fallback =
        matches!(&c.resolution, Resolution::Failed { error } if error.starts_with(FALLBACK_PREFIX));
    if is_fallback {
        tracing::error!(
            id = c.id,
            error = %e,
            "the database refused even the generic FAILED result for this row; parking it: it is not claimed again until `outbox-relay requeue` (see `status`)"
        );
        metrics::counter!(crate::metric::ROWS_PARKED).increment(1);
        work.push(vec![Completion {
            resolution: Resolution::Park,
            ..c
        }]);
        return;
    }
    if matches!(c.resolution, Resolution::Park) {
        tracing::error!(
            id = c.id,
            error = %e,
            "the database refused even parking this row; it stays claimed until its claim expires"
        );
        metrics::counter!(crate::metric::RESULT_WRITE_ERRORS, "kind" => "dropped").increment(1);
        return;
    }
    tracing::error!(
        id = c.id,
        resolution = ?c.resolution,
        error = %e,
        "the database refused this row's result; finishing it FAILED with a generic reason"
    );
    work.push(vec![Completion {
        resolution: Resolution::Failed {
            error: generic_reason(&c.resolution),
        },
        ..c
    }]);
}

/// How every [`generic_reason`] starts.
const FALLBACK_PREFIX: &str = "the result of this attempt could not be stored";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_reasons_are_plain_ascii_and_recognisable() {
        for r in [
            Resolution::Delivered,
            Resolution::Failed {
                error: "x\u{0}".into(),
            },
            Resolution::Retry {
                delay: Duration::ZERO,
                error: "y".into(),
            },
            Resolution::Release {
                delay: Duration::ZERO,
                error: None,
            },
        ] {
            let g = generic_reason(&r);
            assert!(g.is_ascii() && g.starts_with(FALLBACK_PREFIX), "{g}");
        }
    }

    #[test]
    fn a_small_write_never_waits_for_more_rows_than_can_be_in_flight() {
        let default = crate::config::RelaySettings::default().max_in_flight;
        assert_eq!(gather_rows(default), 256, "the default");
        assert_eq!(gather_rows(100_000), GATHER_ROWS);
        assert_eq!(gather_rows(64), 64, "64 in flight can never gather 256");
        assert_eq!(gather_rows(1), 1);
    }
}
