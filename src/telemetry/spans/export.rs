//! Ended spans on their way to the collector: a bounded queue that a delivery only ever
//! `try_send`s into, and one task that takes batches from it and exports them over OTLP/HTTP
//! (docs/tracing.md, "Export").
//!
//! Guarantees:
//! - a delivery never waits for export: ending a span is a non-blocking push; when the queue
//!   is full (the collector slow or down) the span is dropped and counted in
//!   `spans_dropped_total{reason="queue_full"}`;
//! - memory is bounded: at most `queue_size` spans wait, and one batch of at most
//!   `batch_size` is being sent; a batch the collector refuses, or that does not go through
//!   within `export_timeout`, is dropped and counted (`reason="export_failed"`), never
//!   retried or kept;
//! - at shutdown what is queued is sent within the time given ([`Exporter::stop`]); spans
//!   ended after that are counted (`reason="shutdown"`).

use std::sync::Mutex;
use std::time::Duration;

use metrics::Counter;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metric;

/// How long a batch waits to fill before it is sent anyway.
pub(super) const BATCH_DELAY: Duration = Duration::from_secs(1);
/// Least time between two warnings about failed exports (each failure is counted).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The counters of spans dropped, by reason, registered once (a down collector drops at the
/// rate of deliveries).
#[derive(Debug, Clone)]
struct Dropped {
    queue_full: Counter,
    export_failed: Counter,
    shutdown: Counter,
}

impl Dropped {
    fn new() -> Dropped {
        let reason = |r: &'static str| metrics::counter!(metric::SPANS_DROPPED, "reason" => r);
        Dropped {
            queue_full: reason("queue_full"),
            export_failed: reason("export_failed"),
            shutdown: reason("shutdown"),
        }
    }
}

/// The span processor the tracer provider calls when a recorded span ends: a push into the
/// bounded queue, or a counted drop.
#[derive(Debug)]
pub(super) struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
    dropped: Dropped,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        match self.queue.try_send(span) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.dropped.queue_full.increment(1),
            Err(mpsc::error::TrySendError::Closed(_)) => self.dropped.shutdown.increment(1),
        }
    }

    /// The export task sends on its own schedule; a flush on request would have to wait for
    /// it, which no caller here may do.
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// The queue is drained by [`Exporter::stop`], which bounds the wait; the provider's own
    /// shutdown (when it is dropped) must not block.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task and how to stop it.
pub(super) struct Exporter {
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// How the export task batches and bounds its requests.
pub(super) struct Batching {
    pub queue_size: usize,
    pub batch_size: usize,
    pub export_timeout: Duration,
}

impl Exporter {
    /// Starts the export task on the current runtime with `exporter`, and returns it with the
    /// processor that feeds it.
    pub(super) fn start<E>(exporter: E, b: Batching) -> (Exporter, QueueProcessor)
    where
        E: SpanExporter + 'static,
    {
        let (tx, rx) = mpsc::channel(b.queue_size.max(1));
        let stop = CancellationToken::new();
        let dropped = Dropped::new();
        let task = tokio::spawn(run(exporter, rx, b, stop.clone(), dropped.clone()));
        (
            Exporter {
                stop,
                task: Mutex::new(Some(task)),
            },
            QueueProcessor { queue: tx, dropped },
        )
    }

    /// Sends what is queued, then stops, within `within`; spans ended from now on are dropped
    /// and counted. A collector that does not answer in time loses the rest.
    pub(super) async fn stop(&self, within: Duration) {
        self.stop.cancel();
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(mut task) = task
            && tokio::time::timeout(within, &mut task).await.is_err()
        {
            task.abort();
            tracing::warn!("exporting the last spans timed out at shutdown; they are lost");
        }
    }
}

/// The export task: a batch when `batch_size` spans are queued or [`BATCH_DELAY`] after the
/// first of them, one request at a time.
async fn run<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<SpanData>,
    b: Batching,
    stop: CancellationToken,
    dropped: Dropped,
) {
    let mut health = Health::default();
    let mut stopping = false;
    loop {
        let mut batch = Vec::with_capacity(b.batch_size);
        let got = tokio::select! {
            n = rx.recv_many(&mut batch, b.batch_size) => n,
            _ = stop.cancelled(), if !stopping => {
                // What is queued still goes; nothing more comes in.
                stopping = true;
                rx.close();
                continue;
            }
        };
        if got == 0 {
            // Closed and drained.
            return;
        }
        let until = Instant::now() + BATCH_DELAY;
        while !stopping && batch.len() < b.batch_size {
            let room = b.batch_size - batch.len();
            tokio::select! {
                n = rx.recv_many(&mut batch, room) => if n == 0 { break },
                _ = tokio::time::sleep_until(until) => break,
                _ = stop.cancelled() => break,
            }
        }
        let n = batch.len() as u64;
        let result = tokio::time::timeout(b.export_timeout, exporter.export(batch)).await;
        match result {
            Ok(Ok(())) => {
                metrics::counter!(metric::SPANS_EXPORTED).increment(n);
                health.ok();
            }
            Ok(Err(e)) => {
                dropped.export_failed.increment(n);
                health.failed(n, &e.to_string());
            }
            Err(_) => {
                dropped.export_failed.increment(n);
                health.failed(n, "timed out (tracing.export_timeout)");
            }
        }
    }
}

/// Whether exports go through, for logs that say so once per change (and at most every
/// [`WARN_EVERY`] while they keep failing), never once per batch.
#[derive(Default)]
struct Health {
    failing_since_warned: Option<Instant>,
    lost: u64,
}

impl Health {
    fn ok(&mut self) {
        if self.failing_since_warned.take().is_some() {
            tracing::info!(
                lost_spans = self.lost,
                "exporting spans works again (tracing.endpoint)"
            );
        }
        self.lost = 0;
    }

    fn failed(&mut self, spans: u64, why: &str) {
        self.lost += spans;
        let due = self
            .failing_since_warned
            .is_none_or(|at| at.elapsed() >= WARN_EVERY);
        if due {
            // The error names no URL or header (the exporter's own text, without them).
            tracing::warn!(
                error = %why,
                lost_spans = self.lost,
                "exporting spans failed; they are dropped (counted in outbox_relay_spans_dropped_total)"
            );
            self.failing_since_warned = Some(Instant::now());
        }
    }
}
