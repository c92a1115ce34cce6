//! The `webhook` sink: POSTs each row's payload, byte for byte, to a URL with Standard Webhooks
//! headers and an `Idempotency-Key`, and classifies the answer.
//!
//! Guarantees: the body sent is exactly the stored payload (so the signature covers what the
//! receiver reads); `webhook-id` and `Idempotency-Key` are the row id on every attempt; the
//! signature is recomputed per attempt with a fresh `webhook-timestamp`; the secret never
//! appears in an outcome or a log line; a traced attempt carries its span's `traceparent` and
//! `tracestate` (docs/tracing.md).

mod classify;
mod config;
mod request;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

pub use classify::classify;
pub use config::WebhookConfig;
pub use request::{sign, signing_key};

use super::{Delivery, Outcome, Sink, describe_send_error, read_capped, snippet};
use crate::BoxFuture;

const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const TRACEPARENT: HeaderName = HeaderName::from_static(super::trace::TRACEPARENT);
const TRACESTATE: HeaderName = HeaderName::from_static(super::trace::TRACESTATE);

/// Most bytes of an error response read: enough for its snippet, never the whole body.
const ERROR_BODY_BYTES: usize = 4 * 1024;

/// Delivers rows to one HTTP endpoint.
pub struct WebhookSink {
    /// The sink's configured name (for logs).
    name: String,
    /// One client per sink: keeps connections alive across rows.
    client: reqwest::Client,
    url: reqwest::Url,
    /// The HMAC key, when a secret is configured.
    key: Option<Vec<u8>>,
    /// Extra headers from the config.
    headers: HeaderMap,
    max_body_bytes: usize,
}

impl WebhookSink {
    pub fn new(name: &str, cfg: &WebhookConfig, timeout: Duration) -> anyhow::Result<Self> {
        let url = reqwest::Url::parse(cfg.url.trim())?;
        let client = super::http_client_for(&url, timeout)?;
        let mut headers = HeaderMap::new();
        for (k, v) in &cfg.headers {
            headers.insert(
                HeaderName::from_bytes(k.as_bytes())?,
                HeaderValue::from_str(v.expose())?,
            );
        }
        Ok(WebhookSink {
            name: name.to_string(),
            client,
            url,
            key: cfg.secret.as_ref().and_then(signing_key),
            headers,
            max_body_bytes: cfg.max_body_bytes,
        })
    }

    async fn send(&self, d: &Delivery) -> Outcome {
        if d.payload.len() > self.max_body_bytes {
            return Outcome::Permanent {
                reason: format!(
                    "payload of {} bytes exceeds sinks.{}.max_body_bytes ({})",
                    d.payload.len(),
                    self.name,
                    self.max_body_bytes
                ),
            };
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&d.payload) {
            return Outcome::Permanent {
                reason: format!("payload is not valid JSON: {e}"),
            };
        }
        let id = d.idempotency_key();
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|t| t.as_secs())
            .unwrap_or(0);
        // The request's headers are built in one map sized for them and moved into the
        // request: the builder's `header` calls parse each name and grow the map
        // (docs/performance-log.md, "Less relay CPU per delivery"). The configured headers
        // come first and ours are appended, as the builder did.
        let mut headers = HeaderMap::with_capacity(self.headers.len() + 8);
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        // Both from the idempotency key, formatted once (a number: always valid header
        // values; the quoted form is built beside it rather than through `format!`).
        let mut quoted = String::with_capacity(id.len() + 2);
        quoted.push('"');
        quoted.push_str(&id);
        quoted.push('"');
        let (Ok(webhook_id), Ok(idempotency_key)) =
            (HeaderValue::from_str(&id), HeaderValue::try_from(quoted))
        else {
            return Outcome::Permanent {
                reason: "the row's idempotency key is not a valid header value".into(),
            };
        };
        headers.append(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.append(WEBHOOK_ID, webhook_id);
        headers.append(WEBHOOK_TIMESTAMP, HeaderValue::from(timestamp));
        headers.append(IDEMPOTENCY_KEY, idempotency_key);
        if let Some(key) = &self.key {
            // Base64 after "v1,": always a valid header value; never sent unsigned.
            match HeaderValue::try_from(sign(key, &id, timestamp, d.payload.as_bytes())) {
                Ok(v) => headers.append(WEBHOOK_SIGNATURE, v),
                Err(_) => {
                    return Outcome::Permanent {
                        reason: "the signature is not a valid header value".into(),
                    };
                }
            };
        }
        // The attempt span's W3C context, so the receiver's own spans join the writer's trace
        // (docs/tracing.md). Checked values (hex and printable ASCII), never refused here.
        if let Some(trace) = &d.trace {
            if let Ok(v) = HeaderValue::try_from(trace.traceparent()) {
                headers.append(TRACEPARENT, v);
            }
            if let Some(Ok(v)) = trace.state.as_deref().map(HeaderValue::from_str) {
                headers.append(TRACESTATE, v);
            }
        }
        let mut req = reqwest::Request::new(reqwest::Method::POST, self.url.clone());
        *req.headers_mut() = headers;
        *req.body_mut() = Some(d.payload.clone().into());
        let resp = match self.client.execute(req).await {
            Ok(r) => r,
            Err(e) => {
                // Without the URL (it may carry a token) and never headers.
                return Outcome::Retry {
                    after: None,
                    reason: describe_send_error(e),
                };
            }
        };
        let status = resp.status().as_u16();
        super::note_http_status(status);
        if resp.status().is_success() {
            return Outcome::Delivered;
        }
        let retry_after = super::http::retry_after_header(&resp);
        let body = read_capped(resp, ERROR_BODY_BYTES)
            .await
            .map(|b| String::from_utf8_lossy(&b.bytes).into_owned())
            .unwrap_or_default();
        classify(status, retry_after.as_deref(), &snippet(&body))
    }
}

impl Sink for WebhookSink {
    fn deliver<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Outcome> {
        Box::pin(self.send(d))
    }
}
