//! A loopback OTLP/HTTP collector for the tracing tests (and the benchmark's `tracing`
//! variation): an axum server on `127.0.0.1:0` that takes `POST /v1/traces`, decodes each body
//! as an `ExportTraceServiceRequest` (protobuf, with opentelemetry-proto's generated messages
//! and prost, not the relay's exporter code) and keeps every span it holds, flattened.
//!
//! [`Collector::hang`] makes it take requests and never answer (a collector that is up but
//! stuck); [`refusing_url`] is an address where nothing listens.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// One received span, flattened with its resource's service name.
#[derive(Debug, Clone)]
pub struct Span {
    pub service: String,
    pub name: String,
    /// The protobuf enum: 3 CLIENT, 4 PRODUCER, 1 INTERNAL.
    pub kind: i32,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// Every attribute as text (strings as they are, integers in decimal).
    pub attributes: BTreeMap<String, String>,
    /// The status code (2: error).
    pub status: i32,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Inner {
    spans: Mutex<Vec<Span>>,
    requests: AtomicU64,
    hang: AtomicBool,
    /// The `authorization` header of the last request, if any.
    authorization: Mutex<Option<String>>,
}

/// The collector; stops when dropped.
pub struct Collector {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start() -> Collector {
        let inner = Arc::new(Inner::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind collector");
        let addr = listener.local_addr().expect("collector address");
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Collector { addr, inner, task }
    }

    /// The `tracing.endpoint` to configure: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, take requests and never answer them.
    pub fn hang(&self) {
        self.inner.hang.store(true, Ordering::SeqCst);
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.inner.spans.lock().expect("spans").clone()
    }

    /// Export requests received (answered or not).
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::SeqCst)
    }

    /// The `authorization` header of the last export request.
    pub fn authorization(&self) -> Option<String> {
        self.inner.authorization.lock().expect("auth").clone()
    }

    /// Waits (bounded) until `pred` holds for the spans received; false on timeout.
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&[Span]) -> bool) -> bool {
        super::wait::holds_within(timeout, async || pred(&self.spans())).await
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A URL where nothing listens (a port bound and let go): connections are refused.
pub fn refusing_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

async fn traces(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    inner.requests.fetch_add(1, Ordering::SeqCst);
    if let Some(a) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        *inner.authorization.lock().expect("auth") = Some(a.to_string());
    }
    if inner.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    if headers.get("content-type").and_then(|v| v.to_str().ok()) != Some("application/x-protobuf") {
        return StatusCode::UNSUPPORTED_MEDIA_TYPE;
    }
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Span {
                    service: service.clone(),
                    name: s.name,
                    kind: s.kind,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    attributes: s
                        .attributes
                        .iter()
                        .map(|kv| {
                            let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                            (kv.key.clone(), text(v))
                        })
                        .collect(),
                    status: s.status.map(|st| st.code).unwrap_or_default(),
                });
            }
        }
    }
    inner.spans.lock().expect("spans").extend(out);
    StatusCode::OK
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
