//! Batches result writes: completions from many deliveries are written together, one statement
//! per outcome kind and claim batch, instead of one statement per row.
//!
//! Guarantees: every completion handed to the recorder is written, retried while the database
//! is unreachable, until [`Recorder::close`] gives up after its deadline (then the rows' claims
//! simply expire and they are delivered again: at-least-once, never lost).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::store::{Completion, OutboxStore};

/// Flush when this many completions wait...
const FLUSH_ROWS: usize = 256;
/// ...or when the oldest has waited this long.
const FLUSH_AFTER: Duration = Duration::from_millis(10);

/// The handle deliveries send completions to.
#[derive(Clone)]
pub struct RecorderHandle {
    tx: mpsc::UnboundedSender<Completion>,
}

impl RecorderHandle {
    /// Queues a completion for writing.
    pub fn record(&self, c: Completion) {
        if self.tx.send(c).is_err() {
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
    pub fn start(store: Arc<dyn OutboxStore>) -> Recorder {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(store, rx));
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

async fn run(store: Arc<dyn OutboxStore>, mut rx: mpsc::UnboundedReceiver<Completion>) {
    let mut buf: Vec<Completion> = Vec::with_capacity(FLUSH_ROWS);
    let mut open = true;
    while open || !buf.is_empty() {
        if buf.is_empty() {
            match rx.recv().await {
                Some(c) => buf.push(c),
                None => break,
            }
        }
        // Gather more for a short while, so concurrent results share a statement.
        let until = Instant::now() + FLUSH_AFTER;
        while open && buf.len() < FLUSH_ROWS {
            tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => buf.push(c),
                    None => open = false,
                },
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        flush(store.as_ref(), &mut buf).await;
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
