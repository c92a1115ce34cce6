//! The `fcm` sink: Firebase Cloud Messaging HTTP v1. Each row becomes one
//! `POST {endpoint}/v1/projects/{project_id}/messages:send` with a bearer token minted from a
//! service-account key.
//!
//! Guarantees:
//! - a row whose message FCM would refuse for its shape (no or several targets, non-string
//!   `data` values, oversized payload) is Permanent without a request (`message.rs`);
//! - one cached access token serves all sends, refreshed early by a single request
//!   (`oauth.rs`); a 401 from FCM replaces the token once and resends once, and a second 401
//!   is a configuration error;
//! - answers are classified on the FCM error code first, then the HTTP status (`classify.rs`);
//!   transport failures and timeouts retry (FCM sends are safe to repeat: at worst a device
//!   shows a notification twice);
//! - the whole delivery, token fetch and resend included, fits in the sink's `timeout`;
//! - HTTP/2 is negotiated by ALPN on `https://` endpoints and connections are shared by all
//!   sends; plain `http://` (loopback tests) is HTTP/1.1;
//! - neither the private key nor a token appears in an outcome or a log line (the bearer
//!   header is marked sensitive, URLs are stripped from transport errors).

mod classify;
mod config;
mod jwt;
mod message;
mod oauth;

use std::time::Duration;

use reqwest::header::HeaderValue;
use tokio::time::Instant;

pub use classify::{DEFAULT_THROTTLE, ErrorBody, classify, wants_new_token};
pub use config::{DEFAULT_ENDPOINT, DEFAULT_TOKEN_URI, FcmConfig, ServiceAccountKey};
pub use message::{MAX_PAYLOAD, MAX_TOPIC_PAYLOAD, build as build_body};
pub use oauth::{AccessToken, SCOPE, TokenError, TokenSource, refresh_margin};

pub(crate) use super::snippet;
use super::{ANSWER_BYTES, Delivery, Outcome, Reply, Sink, describe_send_error, read_reply};
use crate::BoxFuture;

/// Delivers rows to one Firebase project.
pub struct FcmSink {
    /// The sink's configured name (for logs).
    name: String,
    /// One client per sink: HTTP/2 connections shared by every send and the token fetches.
    client: reqwest::Client,
    /// `{endpoint}/v1/projects/{project_id}/messages:send`.
    url: String,
    /// Mints and caches access tokens.
    tokens: TokenSource,
    /// Whether messages are only validated (`validate_only: true`).
    validate_only: bool,
    /// The budget of one delivery, token fetch and resend included.
    timeout: Duration,
}

impl FcmSink {
    pub fn new(name: &str, cfg: &FcmConfig, timeout: Duration) -> anyhow::Result<Self> {
        let client = super::http_client(timeout)?;
        let tokens = TokenSource::new(client.clone(), &cfg.credentials)?;
        Ok(FcmSink {
            name: name.to_string(),
            client,
            url: format!(
                "{}/v1/projects/{}/messages:send",
                cfg.endpoint, cfg.project_id
            ),
            tokens,
            validate_only: cfg.validate_only,
            timeout,
        })
    }

    async fn send(&self, d: &Delivery) -> Outcome {
        let deadline = Instant::now() + self.timeout;
        let body = match message::build(&d.payload, d.recipient.as_deref(), self.validate_only) {
            Ok(b) => b,
            Err(reason) => return Outcome::Permanent { reason },
        };
        let token = match self.tokens.token(deadline).await {
            Ok(t) => t,
            Err(e) => return e.into_outcome(),
        };
        let answer = match self.post(&body, &token, deadline).await {
            Ok(a) => a,
            Err(o) => return o,
        };
        let text = |a: &Reply| String::from_utf8_lossy(&a.body).into_owned();
        let answer = if wants_new_token(answer.status, &ErrorBody::parse(&text(&answer))) {
            tracing::info!(sink = %self.name, id = d.id, "FCM refused the access token (401); fetching a new one and resending once");
            let fresh = match self.tokens.replace(&token, deadline).await {
                Ok(t) => t,
                Err(e) => return e.into_outcome(),
            };
            match self.post(&body, &fresh, deadline).await {
                Ok(a) => a,
                Err(o) => return o,
            }
        } else {
            answer
        };
        super::note_http_status(answer.status);
        if (200..300).contains(&answer.status) {
            return Outcome::Delivered;
        }
        if let Some(code) = ErrorBody::parse(&text(&answer)).fcm_code() {
            super::note_vendor_code(code);
        }
        classify(answer.status, answer.retry_after.as_deref(), &text(&answer))
    }

    /// One POST within what is left of the budget; transport failures are `Retry`.
    async fn post(
        &self,
        body: &[u8],
        token: &AccessToken,
        deadline: Instant,
    ) -> Result<Reply, Outcome> {
        let Some(budget) = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return Err(Outcome::Retry {
                after: None,
                reason: format!("timed out after {:?}", self.timeout),
            });
        };
        let mut bearer = HeaderValue::from_str(&format!("Bearer {}", token.value.expose()))
            .map_err(|_| Outcome::ConfigError {
                reason: "the token endpoint returned an access token that is not a valid \
                         header value"
                    .into(),
            })?;
        bearer.set_sensitive(true);
        let resp = self
            .client
            .post(&self.url)
            .header("authorization", bearer)
            .header("content-type", "application/json; charset=UTF-8")
            .timeout(budget)
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| Outcome::Retry {
                after: None,
                reason: format!("FCM: {}", describe_send_error(e)),
            })?;
        match read_reply(resp, ANSWER_BYTES).await {
            Ok(reply) => Ok(reply),
            // A 2xx whose body was cut off still was accepted.
            Err((status, _)) if (200..300).contains(&status) => Ok(Reply {
                status,
                retry_after: None,
                body: Vec::new(),
            }),
            Err((status, e)) => Err(Outcome::Retry {
                after: None,
                reason: format!("FCM HTTP {status}: {}", describe_send_error(e)),
            }),
        }
    }
}

impl Sink for FcmSink {
    fn deliver<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Outcome> {
        Box::pin(self.send(d))
    }
}
