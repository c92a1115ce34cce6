//! The `alimtalk` sink: Kakao Alimtalk template messages through a vendor, NHN Cloud
//! (`provider = "nhn"`, `nhn.rs`) or Solapi (`provider = "solapi"`, `solapi.rs`).
//!
//! Guarantees:
//! - a row whose payload or phone number cannot be sent is Permanent before any (paid)
//!   request (`payload.rs`);
//! - each answer is classified on the vendor's result code: success, vendor error (retry),
//!   configuration (sink paused, row kept), message or recipient rejected (FAILED)
//!   (`classify.rs`);
//! - a request that never left (connection refused, TLS failure, connect timeout) retries;
//! - a request that may have been acted on but whose answer was lost (timed out after it was
//!   sent, connection dropped, a 2xx without a readable result) is an *unknown outcome*: with
//!   `on_unknown_outcome = "fail"` (default) the row is FAILED with reason
//!   "outcome unknown: ..." and never resent, since Alimtalk sends are paid and not
//!   idempotent; with `"retry"` it retries (NHN resends the same idempotency key, so NHN can
//!   drop the duplicate);
//! - secrets (`secret_key`, `api_secret`) are sent only in sensitive headers or used as HMAC
//!   keys; transport errors are reported without URLs (NHN's app key is in the path).

mod classify;
mod config;
mod idempotency;
mod nhn;
mod payload;
mod solapi;

use std::time::Duration;

pub use classify::{Class, DEFAULT_THROTTLE, SEND_WINDOW_RETRY};
pub use config::{
    AlimtalkConfig, NHN_ENDPOINT, NhnKeys, Provider, SOLAPI_ENDPOINT, SolapiKeys, UnknownOutcome,
};
pub use idempotency::{IdempotencyKeys, KeyFate};
/// The vendors' request bodies and answer reading, for the fuzz targets only (`fuzzing`).
#[doc(hidden)]
pub use nhn::{Nhn, interpret as interpret_nhn};
pub use payload::{Fallback, TemplateMessage, normalize_phone};
#[doc(hidden)]
pub use solapi::{Solapi, interpret as interpret_solapi};
pub use solapi::{authorization, iso8601, signature};

pub(crate) use super::snippet;
use super::{ANSWER_BYTES, Delivery, Outcome, Reply, Sink, describe_send_error, read_reply};
use crate::BoxFuture;

/// A vendor request's body for one row, or why the row cannot be sent (it fails).
pub type Body = Result<Vec<u8>, String>;

/// Delivers rows to one vendor account.
pub struct AlimtalkSink {
    /// The sink's configured name (for logs).
    name: String,
    /// One client per sink (connections kept alive across rows).
    client: reqwest::Client,
    /// The vendor and its request format.
    vendor: Vendor,
    /// What an unknown outcome becomes.
    on_unknown: UnknownOutcome,
}

/// The configured vendor.
enum Vendor {
    /// NHN Cloud AlimTalk v2.3.
    Nhn(nhn::Nhn),
    /// Solapi Messages v4.
    Solapi(solapi::Solapi),
}

/// What an exchange with the vendor established.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The vendor answered: this is the outcome (any idempotency key is used up).
    Definite(Outcome),
    /// No vendor answer, but a transient failure in front of it (5xx without the vendor's
    /// body): retry, resending the same idempotency key.
    RetrySameKey(Outcome),
    /// The request never left: retry.
    NotSent(String),
    /// The request may have been acted on; the answer is lost.
    Unknown(String),
}

impl AlimtalkSink {
    pub fn new(name: &str, cfg: &AlimtalkConfig, timeout: Duration) -> anyhow::Result<Self> {
        let client = super::http_client(timeout)?;
        let vendor = match &cfg.provider {
            Provider::Nhn(keys) => {
                Vendor::Nhn(nhn::Nhn::new(&cfg.endpoint, keys, &cfg.key_prefix)?)
            }
            Provider::Solapi(keys) => {
                Vendor::Solapi(solapi::Solapi::new(&cfg.endpoint, keys, &cfg.key_prefix))
            }
        };
        Ok(AlimtalkSink {
            name: name.to_string(),
            client,
            vendor,
            on_unknown: cfg.on_unknown_outcome,
        })
    }

    async fn send(&self, d: &Delivery) -> Outcome {
        let msg = match TemplateMessage::parse(&d.payload) {
            Ok(m) => m,
            Err(reason) => return Outcome::Permanent { reason },
        };
        let phone = match normalize_phone(d.recipient.as_deref()) {
            Ok(p) => p,
            Err(reason) => return Outcome::Permanent { reason },
        };
        let verdict = match &self.vendor {
            Vendor::Nhn(n) => {
                let body = match n.body(d, &msg, &phone) {
                    Ok(b) => b,
                    Err(reason) => return Outcome::Permanent { reason },
                };
                let key = n.keys.key(d);
                let verdict = match exchange(n.request(&self.client, body, &key)).await {
                    Ok(reply) => nhn::interpret(&reply),
                    Err(v) => v,
                };
                n.keys.settle(d.id, &key, self.key_fate(&verdict));
                verdict
            }
            Vendor::Solapi(s) => {
                let body = match s.body(d, &msg, &phone) {
                    Ok(b) => b,
                    Err(reason) => return Outcome::Permanent { reason },
                };
                match exchange(s.request(&self.client, body)).await {
                    Ok(reply) => solapi::interpret(&reply),
                    Err(v) => v,
                }
            }
        };
        self.outcome(d, verdict)
    }

    /// What becomes of an NHN idempotency key after `verdict`.
    fn key_fate(&self, verdict: &Verdict) -> KeyFate {
        match verdict {
            Verdict::Definite(
                Outcome::Delivered | Outcome::Permanent { .. } | Outcome::Retry { .. },
            ) => KeyFate::Forget,
            Verdict::Definite(Outcome::Throttle { .. } | Outcome::ConfigError { .. }) => {
                KeyFate::Spent
            }
            Verdict::RetrySameKey(_) => KeyFate::Reuse,
            Verdict::NotSent(_) => KeyFate::Unsent,
            Verdict::Unknown(_) => match self.on_unknown {
                UnknownOutcome::Retry => KeyFate::Reuse,
                UnknownOutcome::Fail => KeyFate::Forget,
            },
        }
    }

    fn outcome(&self, d: &Delivery, verdict: Verdict) -> Outcome {
        match verdict {
            Verdict::Definite(o) | Verdict::RetrySameKey(o) => o,
            Verdict::NotSent(reason) => Outcome::Retry {
                after: None,
                reason,
            },
            Verdict::Unknown(what) => {
                tracing::warn!(sink = %self.name, id = d.id, what, policy = ?self.on_unknown, "Alimtalk send with an unknown outcome");
                match self.on_unknown {
                    UnknownOutcome::Fail => Outcome::Permanent {
                        reason: format!(
                            "outcome unknown: {what}; not resent (on_unknown_outcome = \"fail\")"
                        ),
                    },
                    UnknownOutcome::Retry => Outcome::Retry {
                        after: None,
                        reason: format!("outcome unknown: {what}; resending"),
                    },
                }
            }
        }
    }
}

impl Sink for AlimtalkSink {
    fn deliver<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Outcome> {
        Box::pin(self.send(d))
    }
}

/// Sends a request and reads the whole answer. A failure before the request could leave is
/// [`Verdict::NotSent`]; any later one is [`Verdict::Unknown`].
async fn exchange(req: reqwest::RequestBuilder) -> Result<Reply, Verdict> {
    let resp = req.send().await.map_err(|e| {
        if e.is_connect() || e.is_builder() {
            Verdict::NotSent(describe_send_error(e))
        } else {
            Verdict::Unknown(format!(
                "{} after the request was sent",
                describe_send_error(e)
            ))
        }
    })?;
    super::note_http_status(resp.status().as_u16());
    read_reply(resp, ANSWER_BYTES).await.map_err(|(status, e)| {
        Verdict::Unknown(format!(
            "HTTP {status} but its body was lost ({})",
            describe_send_error(e)
        ))
    })
}

/// A vendor's answer as [`exchange`] reads it: `status` and `body`, no `Retry-After`; for the
/// answer-reading tests of both vendors (`nhn.rs`, `solapi.rs`).
#[cfg(test)]
fn reply(status: u16, body: &str) -> Reply {
    Reply {
        status,
        retry_after: None,
        body: body.as_bytes().to_vec(),
    }
}
