//! NHN Cloud KakaoTalk Bizmessage, AlimTalk API v2.3:
//! `POST {endpoint}/alimtalk/v2.3/appkeys/{app_key}/messages` with `X-Secret-Key` and
//! `X-NC-API-IDEMPOTENCY-KEY`, one recipient per request.
//!
//! Guarantees:
//! - the body is NHN's: `senderKey`, `templateCode`, `recipientList[{recipientNo,
//!   templateParameter (names without #{}), recipientGroupingKey}]`; both grouping keys are the
//!   row's key (`key_prefix` + row id), so a send can be found with NHN's list API;
//! - success only when `header.isSuccessful`, `header.resultCode == 0` and every
//!   `sendResults[].resultCode == 0`; any other code is classified ([`super::classify::nhn`]);
//!   `-1005` (idempotency key already used) means an earlier attempt was accepted;
//! - the idempotency key is `{key}-{attempts}`: the same key is sent again only after an
//!   answer that leaves the outcome unknown (timeout after sending, 5xx without NHN's JSON),
//!   so NHN can drop the duplicate; after a definite refusal (NHN spends a key for 10 min)
//!   the next request gets a new key, also when the refusal did not count an attempt
//!   ([`super::idempotency`]);
//! - the secret key is sent only as a sensitive header value.

use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::classify::{self, Class};
use super::config::NhnKeys;
use super::idempotency::IdempotencyKeys;
use super::payload::{Fallback, TemplateMessage};
use super::{Body, Reply, Verdict, snippet};
use crate::sink::Delivery;

/// One NHN Cloud AlimTalk service.
pub struct Nhn {
    /// `{endpoint}/alimtalk/v2.3/appkeys/{app_key}/messages`.
    url: String,
    /// `X-Secret-Key`, marked sensitive.
    secret: HeaderValue,
    /// `senderKey`.
    sender_key: String,
    /// Prefix of grouping and idempotency keys.
    key_prefix: String,
    /// Which idempotency key each row's next request carries.
    pub keys: IdempotencyKeys,
}

/// NHN's response envelope.
#[derive(Deserialize)]
struct Response {
    /// The request's result; absent when the body is not NHN's.
    header: Option<Header>,
    /// Per-recipient results.
    #[serde(default)]
    message: Option<Message>,
}

/// `header` of the envelope.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    /// 0 on success, a negative code otherwise.
    result_code: i64,
    /// NHN's text for the code.
    #[serde(default)]
    result_message: Option<String>,
    /// True only when the request as a whole succeeded.
    #[serde(default)]
    is_successful: bool,
}

/// `message` of the envelope.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Message {
    /// One entry per recipient (we send one).
    #[serde(default)]
    send_results: Option<Vec<SendResult>>,
}

/// One recipient's result.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendResult {
    /// 0 when accepted for this recipient.
    result_code: i64,
    /// NHN's text for the code.
    #[serde(default)]
    result_message: Option<String>,
}

impl Nhn {
    pub fn new(endpoint: &str, keys: &NhnKeys, key_prefix: &str) -> anyhow::Result<Self> {
        let mut secret = HeaderValue::from_str(keys.secret_key.expose())
            .map_err(|_| anyhow::anyhow!("the NHN secret_key is not a valid header value"))?;
        secret.set_sensitive(true);
        Ok(Nhn {
            url: format!("{endpoint}/alimtalk/v2.3/appkeys/{}/messages", keys.app_key),
            secret,
            sender_key: keys.sender_key.clone(),
            key_prefix: key_prefix.to_string(),
            keys: IdempotencyKeys::new(key_prefix),
        })
    }

    /// The request body for one row.
    pub fn body(&self, d: &Delivery, msg: &TemplateMessage, phone: &str) -> Body {
        let grouping = format!("{}{}", self.key_prefix, d.id);
        let mut recipient = Map::new();
        recipient.insert("recipientNo".into(), json!(phone));
        recipient.insert("templateParameter".into(), json!(msg.parameters));
        recipient.insert("recipientGroupingKey".into(), json!(grouping));
        if let Some(b) = &msg.buttons {
            recipient.insert("buttons".into(), Value::Array(b.clone()));
        }
        match &msg.fallback {
            Some(Fallback::Enabled(false)) => {
                recipient.insert("resendParameter".into(), json!({ "isResend": false }));
            }
            Some(Fallback::Nhn(p)) => {
                recipient.insert("resendParameter".into(), Value::Object(p.clone()));
            }
            Some(Fallback::Enabled(true)) | None => {}
        }
        let mut body = Map::new();
        body.insert("senderKey".into(), json!(self.sender_key));
        body.insert("templateCode".into(), json!(msg.template_code));
        body.insert("senderGroupingKey".into(), json!(grouping));
        for (k, v) in &msg.vendor {
            // requestDate (scheduled send) belongs to the request; the rest to the recipient.
            let target = if k == "requestDate" {
                &mut body
            } else {
                &mut recipient
            };
            if target.contains_key(k) {
                return Err(format!("vendor.{k} is set by the relay"));
            }
            target.insert(k.clone(), v.clone());
        }
        body.insert("recipientList".into(), json!([recipient]));
        serde_json::to_vec(&body).map_err(|e| format!("cannot encode the message: {e}"))
    }

    /// The request, ready to send.
    pub fn request(
        &self,
        client: &reqwest::Client,
        body: Vec<u8>,
        idempotency_key: &str,
    ) -> reqwest::RequestBuilder {
        client
            .post(&self.url)
            .header("content-type", "application/json;charset=UTF-8")
            .header("x-secret-key", self.secret.clone())
            .header("x-nc-api-idempotency-key", idempotency_key)
            .body(body)
    }
}

/// What NHN's answer means.
pub fn interpret(reply: &Reply) -> Verdict {
    let parsed = serde_json::from_slice::<Response>(&reply.body)
        .ok()
        .and_then(|r| r.header.map(|h| (h, r.message)));
    let Some((header, message)) = parsed else {
        let text = snippet(&String::from_utf8_lossy(&reply.body));
        return match reply.status {
            200..=299 => Verdict::Unknown(format!(
                "NHN answered HTTP {} without a readable result",
                reply.status
            )),
            408 | 500..=599 => Verdict::RetrySameKey(classify::http_status(
                reply.status,
                reply.retry_after.as_deref(),
                &format!(" from NHN without a result: {text}"),
            )),
            _ => Verdict::Definite(classify::http_status(
                reply.status,
                reply.retry_after.as_deref(),
                &format!(" from NHN: {text}"),
            )),
        };
    };
    let results = message.and_then(|m| m.send_results).unwrap_or_default();
    let failing = results.iter().find(|r| r.result_code != 0);
    let (code, text) = match failing {
        Some(f) => (f.result_code, f.result_message.as_deref()),
        None if header.is_successful && header.result_code == 0 => {
            if results.is_empty() {
                return Verdict::Unknown(
                    "NHN accepted the request but returned no per-recipient result".into(),
                );
            }
            return Verdict::Definite(Class::Success.outcome("NHN 0"));
        }
        None => (header.result_code, header.result_message.as_deref()),
    };
    crate::sink::note_vendor_code(&code.to_string());
    let class = classify::nhn(code);
    if class == Class::AlreadySubmitted {
        tracing::info!(
            code,
            "NHN saw this idempotency key before: an earlier attempt was accepted"
        );
    }
    let detail = format!("NHN {code}: {}", snippet(text.unwrap_or("")));
    Verdict::Definite(class.outcome(detail.trim_end_matches([':', ' '])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Outcome;
    use crate::sink::alimtalk::reply;

    #[test]
    fn success_needs_the_header_and_every_result() {
        let ok = r#"{"header":{"resultCode":0,"resultMessage":"SUCCESS","isSuccessful":true},
            "message":{"requestId":"r","sendResults":[{"recipientSeq":1,"resultCode":0}]}}"#;
        assert!(matches!(
            interpret(&reply(200, ok)),
            Verdict::Definite(Outcome::Delivered)
        ));
        let bad_recipient = r#"{"header":{"resultCode":0,"isSuccessful":true},
            "message":{"sendResults":[{"resultCode":-5000,"resultMessage":"Invalid recipientNo"}]}}"#;
        match interpret(&reply(200, bad_recipient)) {
            Verdict::Definite(Outcome::Permanent { reason }) => assert_eq!(
                reason,
                "NHN -5000: Invalid recipientNo (recipient rejected)"
            ),
            v => panic!("{v:?}"),
        }
        let bad_key = r#"{"header":{"resultCode":-1001,"resultMessage":"Invalid secretKey","isSuccessful":false}}"#;
        assert!(matches!(
            interpret(&reply(200, bad_key)),
            Verdict::Definite(Outcome::ConfigError { .. })
        ));
        let dup = r#"{"header":{"resultCode":-1005,"isSuccessful":false}}"#;
        assert!(matches!(
            interpret(&reply(200, dup)),
            Verdict::Definite(Outcome::Delivered)
        ));
        let no_results = r#"{"header":{"resultCode":0,"isSuccessful":true},"message":{}}"#;
        assert!(matches!(
            interpret(&reply(200, no_results)),
            Verdict::Unknown(_)
        ));
        assert!(matches!(
            interpret(&reply(200, "<html>")),
            Verdict::Unknown(_)
        ));
        assert!(matches!(
            interpret(&reply(502, "<html>bad gateway</html>")),
            Verdict::RetrySameKey(Outcome::Retry { .. })
        ));
        assert!(matches!(
            interpret(&reply(404, "")),
            Verdict::Definite(Outcome::ConfigError { .. })
        ));
    }
}
