//! Batches result writes: completions from many deliveries are written together, one statement
//! per outcome kind and claim batch, instead of one statement per row.
//!
//! Guarantees: every completion handed to the recorder is written, retried while the database
//! is unreachable, until [`Recorder::close`] gives up after its deadline (then the rows' claims
//! simply expire and they are delivered again: at-least-once, never lost).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::store::{Completion, OutboxStore};

/// Flush when this many completions wait...
const FLUSH_ROWS: usize = 256;
/// ...or when the oldest has waited this long.
const FLUSH_AFTER: Duration = Duration::from_millis(10);

/// A completion and whether its row had an ordering key (writing it may let the next row of
/// that key be claimed).
type Entry = (Completion, bool);

/// The handle deliveries send completions to.
#[derive(Clone)]
pub struct RecorderHandle {
    tx: mpsc::UnboundedSender<Entry>,
}

impl RecorderHandle {
    /// Queues a completion for writing; `keyed` when the row had an ordering key.
    pub fn record(&self, c: Completion, keyed: bool) {
        if self.tx.send((c, keyed)).is_err() {
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
    /// `unblocked` (the relay loop): the next row of each such key may now be claimed, and
    /// the loop should not sleep a whole poll interval before looking.
    pub fn start(store: Arc<dyn OutboxStore>, unblocked: Arc<Notify>) -> Recorder {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(store, rx, unblocked));
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

async fn run(
    store: Arc<dyn OutboxStore>,
    mut rx: mpsc::UnboundedReceiver<Entry>,
    unblocked: Arc<Notify>,
) {
    let mut buf: Vec<Completion> = Vec::with_capacity(FLUSH_ROWS);
    let mut keyed = false;
    let mut open = true;
    while open || !buf.is_empty() {
        if buf.is_empty() {
            match rx.recv().await {
                Some((c, k)) => {
                    buf.push(c);
                    keyed |= k;
                }
                None => break,
            }
        }
        // Gather more for a short while, so concurrent results share a statement.
        let until = Instant::now() + FLUSH_AFTER;
        while open && buf.len() < FLUSH_ROWS {
            tokio::select! {
                c = rx.recv() => match c {
                    Some((c, k)) => {
                        buf.push(c);
                        keyed |= k;
                    }
                    None => open = false,
                },
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        flush(store.as_ref(), &mut buf).await;
        if std::mem::take(&mut keyed) {
            unblocked.notify_one();
        }
    }
}

async fn flush(store: &dyn OutboxStore, buf: &mut Vec<Completion>) {
    let mut wait = Duration::from_millis(100);
    loop {
        match store.complete(buf).await {
            Ok(changed) => {
                let expected = buf.len() as u64;
                if changed < expected {
                    tracing::warn!(
                        discarded = expected - changed,
                        "results discarded: those rows' claims had expired and were taken over"
                    );
                }
                buf.clear();
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, rows = buf.len(), "writing results failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}
