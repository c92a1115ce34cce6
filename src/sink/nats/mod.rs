//! The `nats` sink: publishes each row to a NATS JetStream stream and counts it delivered
//! only on the stream's acknowledgement (docs/sinks.md, "nats").
//!
//! Guarantees:
//! - the message body is the stored payload, byte for byte; the subject is the configured
//!   one, or the payload field's value under `subject_prefix` (never a wildcard, an API subject
//!   or an inbox: `subject.rs`);
//! - every attempt of a row carries the same `Nats-Msg-Id`, `{msg_id_prefix}{row id}`
//!   (default prefix `outbox-<database.table>-`), so a stream whose duplicate window outlasts
//!   a crash's re-send (docs/design.md, "Failure model") stores the row once; a PubAck that
//!   says `duplicate` is delivered too: the stream already holds the row;
//! - with `stream` set, every publish carries `Nats-Expected-Stream`, so a subject captured by
//!   another stream is refused by the server, not stored in the wrong place;
//! - delivered only on a PubAck: a publish without one is retried (same id), never assumed;
//! - nothing is handed to the client while it is not connected (it would send it whenever it
//!   reconnects, however late: docs/design.md, "Sending");
//! - credentials never appear in an outcome, a log line or `check-config` output.

mod classify;
mod config;
mod link;
mod subject;

use std::sync::Arc;
use std::time::Duration;

use async_nats::header;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use tokio::sync::OnceCell;

pub use classify::{Attempt, Context, FULL_PAUSE, RECOVERY_GRACE, classify};
pub use config::{Auth, DEFAULT_MAX_PAYLOAD_BYTES, NatsConfig};
pub use subject::Route;

use self::link::{Link, Watch};
use super::{Delivery, Outcome, Sink};
use crate::BoxFuture;
use crate::config::{ConfigError, Settings};

/// What a NATS sink takes from the rest of the configuration.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// `Nats-Msg-Id` prefix when `msg_id_prefix` is not set: `outbox-<database.table>-`.
    pub msg_id_prefix: String,
    /// The shortest duplicate window that covers a crash's re-send: `relay.claim_ttl` (the
    /// claim must run out) plus `lease.ttl` (another instance must take over).
    pub needed_window: Duration,
}

impl Defaults {
    pub fn from_settings(settings: &Settings) -> Defaults {
        Defaults {
            msg_id_prefix: format!("outbox-{}-", settings.database.table),
            needed_window: settings.relay.claim_ttl + settings.lease.ttl,
        }
    }
}

/// Publishes rows to NATS JetStream.
pub struct NatsSink {
    inner: Arc<Inner>,
}

struct Inner {
    /// The sink's configured name.
    name: String,
    cfg: NatsConfig,
    /// The sink's `timeout`: the wait for a PubAck, and for a connection.
    timeout: Duration,
    msg_id_prefix: String,
    needed_window: Duration,
    link: OnceCell<Link>,
    watch: Arc<Watch>,
}

impl NatsSink {
    /// A sink for `cfg`. Inside a runtime (`run`), it starts connecting at once and checks
    /// `stream`, logging what it finds under the key's name; otherwise on first use.
    pub fn new(name: &str, cfg: &NatsConfig, timeout: Duration, defaults: &Defaults) -> Self {
        let inner = Arc::new(Inner {
            name: name.to_string(),
            cfg: cfg.clone(),
            timeout,
            msg_id_prefix: cfg
                .msg_id_prefix
                .clone()
                .unwrap_or_else(|| defaults.msg_id_prefix.clone()),
            needed_window: defaults.needed_window,
            link: OnceCell::new(),
            watch: Arc::new(Watch::default()),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let inner = inner.clone();
            rt.spawn(async move { inner.check_at_start().await });
        }
        NatsSink { inner }
    }
}

impl Sink for NatsSink {
    fn deliver<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Outcome> {
        Box::pin(self.inner.send(d))
    }
}

impl Inner {
    async fn link(&self) -> Result<&Link, async_nats::ConnectError> {
        self.link
            .get_or_try_init(|| {
                link::open(
                    &self.name,
                    &self.cfg,
                    self.timeout,
                    self.watch.clone(),
                    true,
                )
            })
            .await
    }

    async fn send(&self, d: &Delivery) -> Outcome {
        if d.payload.len() > self.cfg.max_payload_bytes {
            return Outcome::Permanent {
                reason: format!(
                    "payload of {} bytes exceeds sinks.{}.max_payload_bytes ({})",
                    d.payload.len(),
                    self.name,
                    self.cfg.max_payload_bytes
                ),
            };
        }
        // A subject_field route parses the payload anyway (and refuses what is not a JSON
        // object); a fixed subject only needs to know it is JSON.
        if let Route::Fixed(_) = self.cfg.route
            && let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&d.payload)
        {
            return Outcome::Permanent {
                reason: format!("payload is not valid JSON: {e}"),
            };
        }
        let subject = match self.cfg.route.subject_for(&d.payload) {
            Ok(s) => s,
            Err(reason) => return Outcome::Permanent { reason },
        };
        let attempt = match self.link().await {
            Ok(link) => self.publish(link, &subject, d).await,
            Err(e) => Attempt::Other(format!("cannot open a NATS client: {e}")),
        };
        if let Attempt::Acked {
            duplicate: true,
            stream,
        } = &attempt
        {
            tracing::debug!(id = d.id, sink = %self.name, stream, "already in the stream (duplicate Nats-Msg-Id): delivered");
        }
        let violation = self
            .watch
            .violation(&subject, self.timeout + Duration::from_secs(1));
        let cx = Context {
            sink: &self.name,
            subject: &subject,
            stream: self.cfg.stream.as_deref(),
            violation: violation.as_deref(),
            auth_refused: self.watch.auth_refused(),
        };
        classify(&attempt, &cx)
    }

    /// One publish and its PubAck, as an [`Attempt`].
    async fn publish(&self, link: &Link, subject: &str, d: &Delivery) -> Attempt {
        // A client that is still connecting (or reconnecting) gets a moment; past it nothing
        // is handed over (see the module docs).
        let wait = self.timeout.min(Duration::from_secs(2));
        if !link::connected_within(&link.client, &self.watch, wait).await {
            return Attempt::NotConnected;
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            header::NATS_MESSAGE_ID,
            format!("{}{}", self.msg_id_prefix, d.idempotency_key()),
        );
        if let Some(stream) = &self.cfg.stream {
            headers.insert(header::NATS_EXPECTED_STREAM, stream.as_str());
        }
        // The attempt span's W3C context as message headers, where consumers that trace read
        // it (docs/tracing.md).
        if let Some(trace) = &d.trace {
            headers.insert(crate::sink::trace::TRACEPARENT, trace.traceparent());
            if let Some(state) = &trace.state {
                headers.insert(crate::sink::trace::TRACESTATE, state.as_str());
            }
        }
        let message = PublishMessage::build()
            .payload(d.payload.clone().into())
            .headers(headers);
        let ack = match link.js.send_publish(subject.to_string(), message).await {
            Ok(ack) => ack,
            Err(e) => return self.attempt_of(&e),
        };
        match ack.await {
            Ok(ack) => Attempt::Acked {
                stream: ack.stream,
                duplicate: ack.duplicate,
            },
            Err(e) => self.attempt_of(&e),
        }
    }

    /// What a publish error says, as an [`Attempt`].
    fn attempt_of(&self, e: &async_nats::jetstream::context::PublishError) -> Attempt {
        match e.kind() {
            PublishErrorKind::StreamNotFound => Attempt::NoResponders {
                since_reconnect: self.watch.since_reconnect(),
            },
            PublishErrorKind::TimedOut => Attempt::TimedOut,
            PublishErrorKind::BrokenPipe => Attempt::ConnectionLost,
            PublishErrorKind::MaxPayloadExceeded => Attempt::TooLarge {
                detail: e.to_string(),
            },
            _ => match api_error(e) {
                Some((status, code, description)) => {
                    crate::sink::note_vendor_code(&code.to_string());
                    Attempt::Refused {
                        status,
                        code,
                        description,
                    }
                }
                None => Attempt::Other(e.to_string()),
            },
        }
    }

    /// At start (`run`): connects, and checks `stream` when it is set. Logs only; the first
    /// publish pauses the sink if the stream is missing.
    async fn check_at_start(&self) {
        let Some(stream) = &self.cfg.stream else {
            let _ = self.link().await;
            return;
        };
        let key = format!("sinks.{}.stream", self.name);
        let link = match self.link().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(sink = %self.name, error = %e, "cannot open a NATS client; {key} not checked");
                return;
            }
        };
        if !link::connected_within(&link.client, &self.watch, self.timeout).await {
            tracing::warn!(sink = %self.name, urls = %self.cfg.urls_text(), "NATS not reachable yet; {key} not checked");
            return;
        }
        match stream_check(link, stream, self.needed_window).await {
            StreamCheck::Found { warning: None, .. } => {
                tracing::info!(sink = %self.name, stream, "the stream exists");
            }
            StreamCheck::Found {
                warning: Some(w), ..
            } => tracing::warn!(sink = %self.name, stream, "{key}: {w}"),
            StreamCheck::Missing(why) => {
                tracing::error!(sink = %self.name, stream, "{key}: {why}; rows of this sink stay pending until it exists")
            }
            StreamCheck::Unknown(why) => {
                tracing::warn!(sink = %self.name, stream, "{key} not checked: {why}")
            }
        }
    }
}

/// The JetStream API error inside a publish error: (status, error code, description).
fn api_error(e: &async_nats::jetstream::context::PublishError) -> Option<(usize, u64, String)> {
    let source = std::error::Error::source(e)?;
    let js = source.downcast_ref::<async_nats::jetstream::Error>()?;
    // Its text is "<description> (code <status>, error code <code>)"; the description alone
    // is what the classifier reads (10077 carries the store's reason only there).
    let text = js.to_string();
    let description = match text.rfind(" (code ") {
        Some(at) => text[..at].to_string(),
        None => text,
    };
    Some((js.code(), js.error_code().0, description))
}

/// What the server says about a configured stream.
enum StreamCheck {
    /// It exists; `warning` when its duplicate window is shorter than needed.
    Found {
        window: Duration,
        warning: Option<String>,
    },
    /// It does not exist (or JetStream is off): a configuration error.
    Missing(String),
    /// The question got no clear answer.
    Unknown(String),
}

async fn stream_check(link: &Link, stream: &str, needed: Duration) -> StreamCheck {
    use async_nats::jetstream::context::GetStreamErrorKind;
    match link.js.get_stream(stream).await {
        Ok(s) => {
            let window = s.cached_info().config.duplicate_window;
            let warning = (window < needed).then(|| {
                format!(
                    "the stream's duplicate_window ({}) is shorter than relay.claim_ttl + \
                     lease.ttl ({}): a row re-sent after a crash may be stored twice",
                    crate::config::duration::format(window),
                    crate::config::duration::format(needed)
                )
            });
            StreamCheck::Found { window, warning }
        }
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(js) if js.error_code().0 == 10059 => {
                StreamCheck::Missing(format!("stream {stream} does not exist"))
            }
            GetStreamErrorKind::Request => StreamCheck::Missing(format!(
                "no answer from JetStream about stream {stream} (is JetStream enabled?): {e}"
            )),
            _ => StreamCheck::Unknown(e.to_string()),
        },
    }
}

/// `check-config` for one sink: with `stream` set, connects (bounded by the sink's timeout)
/// and checks that the stream exists. A line to print, or the configuration error.
pub async fn check_config(
    name: &str,
    cfg: &NatsConfig,
    timeout: Duration,
    defaults: &Defaults,
) -> Result<Option<String>, ConfigError> {
    let Some(stream) = &cfg.stream else {
        return Ok(None);
    };
    let key = format!("sinks.{name}.stream");
    let urls = cfg.urls_text();
    let opened = tokio::time::timeout(
        timeout,
        link::open(name, cfg, timeout, Arc::new(Watch::default()), false),
    )
    .await;
    let link = match opened {
        Ok(Ok(link)) => link,
        Ok(Err(e)) => {
            return Ok(Some(format!(
                "sink {name}: {key} not checked: could not reach NATS at {urls} ({e})"
            )));
        }
        Err(_) => {
            return Ok(Some(format!(
                "sink {name}: {key} not checked: could not reach NATS at {urls} within {}",
                crate::config::duration::format(timeout)
            )));
        }
    };
    let line = match stream_check(&link, stream, defaults.needed_window).await {
        StreamCheck::Found { window, warning } => {
            let d = crate::config::duration::format(window);
            match warning {
                None => format!("sink {name}: stream {stream} exists (duplicate_window {d})"),
                Some(w) => format!("sink {name}: stream {stream} exists; warning, {key}: {w}"),
            }
        }
        StreamCheck::Missing(why) => {
            return Err(ConfigError::new(key, format!("{why} on NATS at {urls}")));
        }
        StreamCheck::Unknown(why) => format!("sink {name}: {key} not checked: {why}"),
    };
    Ok(Some(line))
}
