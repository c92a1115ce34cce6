//! Delivery attempts as OpenTelemetry spans, children of the writer's trace context, exported
//! over OTLP/HTTP (docs/tracing.md).
//!
//! Guarantees:
//! - nothing of this exists unless `tracing.endpoint` is set ([`Tracer::start`] gives `None`):
//!   no span is built, no trace column is claimed, no header is sent;
//! - a span's attributes are the sink, the channel, the row id, the attempt number, the
//!   outcome and the receiver's HTTP status or vendor code: never the payload, the recipient,
//!   a reason text (which may echo either) or a secret;
//! - its parent is the row's context (columns or payload fields) when valid, else it starts a
//!   trace of its own; either way the request carries the attempt span's own context;
//! - ending a span never waits (`export.rs`).

mod export;
mod field;

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanExporter};

use crate::config::TracingSettings;
use crate::sink::{Answer, Delivery, Outcome, TraceContext};
use export::{Batching, Exporter};
use field::Fields;

/// The relay's tracer: builds one span per delivery attempt and exports them.
pub struct Tracer {
    tracer: SdkTracer,
    /// Kept so that the tracer's spans keep reaching the processor.
    _provider: SdkTracerProvider,
    exporter: Exporter,
    fields: Option<Fields>,
}

impl Tracer {
    /// The tracer `[tracing]` configures, its export task started on the current runtime;
    /// `None` when tracing is off (no `tracing.endpoint`). An error is a setting the exporter
    /// refuses (a configuration problem).
    pub fn start(s: &TracingSettings) -> anyhow::Result<Option<Arc<Tracer>>> {
        if !s.enabled() {
            return Ok(None);
        }
        let client = crate::sink::http_client(s.export_timeout)?;
        let headers = s
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .collect();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(s.traces_url())
            .with_timeout(s.export_timeout)
            .with_headers(headers)
            .build()
            // Its text may quote the endpoint, which may hold credentials: not shown.
            .map_err(|_| anyhow::anyhow!("tracing.endpoint: the OTLP exporter refused it"))?;
        let resource = Resource::builder_empty()
            .with_service_name(s.service_name.clone())
            .build();
        exporter.set_resource(&resource);
        Ok(Some(Arc::new(Tracer::with_exporter(exporter, s, resource))))
    }

    /// A tracer exporting through `exporter` (the OTLP one, or a test's).
    fn with_exporter<E: SpanExporter + 'static>(
        exporter: E,
        s: &TracingSettings,
        resource: Resource,
    ) -> Tracer {
        let (exporter, processor) = Exporter::start(
            exporter,
            Batching {
                queue_size: s.queue_size,
                batch_size: s.batch_size,
                export_timeout: s.export_timeout,
            },
        );
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                s.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer_with_scope(
            InstrumentationScope::builder("outbox-relay")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        Tracer {
            tracer,
            _provider: provider,
            exporter,
            fields: s.traceparent_field.as_ref().map(|tp| Fields {
                traceparent: tp.clone(),
                tracestate: s.tracestate_field.clone(),
            }),
        }
    }

    /// Starts the span of one attempt at `d` by sink `sink` (of `kind`), a child of the
    /// row's context (`d.trace` as claimed, else the payload's fields), and puts the span's
    /// own context into `d.trace` for the request to carry.
    pub fn begin(&self, sink: &str, kind: &str, d: &mut Delivery) -> Attempt {
        let parent = d
            .trace
            .take()
            .or_else(|| self.fields.as_ref().and_then(|f| f.read(&d.payload)));
        let cx = match &parent {
            Some(p) => Context::new().with_remote_span_context(span_context(p)),
            // A root of its own, never whatever context the task happens to hold.
            None => Context::new(),
        };
        let span = self
            .tracer
            .span_builder(format!("deliver {sink}"))
            .with_kind(match kind {
                "nats" => SpanKind::Producer,
                "log" => SpanKind::Internal,
                _ => SpanKind::Client,
            })
            .with_attributes([
                KeyValue::new("outbox.sink", sink.to_string()),
                KeyValue::new("outbox.channel", d.channel.clone()),
                KeyValue::new("outbox.row_id", d.id),
                KeyValue::new("outbox.attempt", i64::from(d.attempts) + 1),
            ])
            .start_with_context(&self.tracer, &cx);
        d.trace = Some(trace_context(span.span_context()));
        Attempt { span }
    }

    /// Sends the spans still queued, within `within`, and stops exporting.
    pub async fn shutdown(&self, within: Duration) {
        self.exporter.stop(within).await;
    }
}

/// The span of one delivery attempt, ended by [`Attempt::end`] (or when dropped, without an
/// outcome: the attempt did not finish).
pub struct Attempt {
    span: opentelemetry_sdk::trace::Span,
}

impl Attempt {
    /// Ends the span with the attempt's outcome and what the receiver answered.
    pub fn end(mut self, outcome: &Outcome, answer: &Answer) {
        let label = outcome.label();
        self.span
            .set_attribute(KeyValue::new("outbox.outcome", label));
        if let Some(status) = answer.http_status {
            self.span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if let Some(code) = &answer.vendor_code {
            self.span
                .set_attribute(KeyValue::new("outbox.vendor_code", code.clone()));
        }
        if !matches!(outcome, Outcome::Delivered) {
            // The label only: a reason may quote the receiver's answer or the payload.
            self.span.set_status(Status::error(Cow::Borrowed(label)));
        }
        self.span.end();
    }
}

/// The OpenTelemetry form of a row's context (a remote parent). A `tracestate` the SDK does
/// not accept is left out; the parent still holds.
fn span_context(p: &TraceContext) -> SpanContext {
    let state = p
        .state
        .as_deref()
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    SpanContext::new(
        TraceId::from_bytes(p.trace_id),
        SpanId::from_bytes(p.span_id),
        TraceFlags::new(p.flags),
        true,
        state,
    )
}

/// The context an attempt's request carries: its own span's.
fn trace_context(c: &SpanContext) -> TraceContext {
    let state = c.trace_state().header();
    TraceContext {
        trace_id: c.trace_id().to_bytes(),
        span_id: c.span_id().to_bytes(),
        flags: c.trace_flags().to_u8(),
        state: (!state.is_empty()).then_some(state),
    }
}
