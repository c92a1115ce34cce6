//! Solapi Messages API v4: `POST {endpoint}/messages/v4/send`, one `ATA` (Alimtalk) message,
//! signed with `Authorization: HMAC-SHA256 apiKey=..., date=..., salt=..., signature=...`.
//!
//! Guarantees:
//! - the signature is `hex(HMAC-SHA256(api_secret, date + salt))` with a fresh date and a
//!   fresh random salt for every request, retries included (Solapi refuses a signature seen
//!   within 15 minutes);
//! - the body is Solapi's: `to`, `from`, `type: "ATA"`, `kakaoOptions{pfId, templateId,
//!   variables (names WITH #{})}`, and `customFields.outboxId` = the row's key for
//!   reconciliation (Solapi documents no idempotency key, so a resend after an unknown
//!   outcome may duplicate: hence `on_unknown_outcome = "fail"` by default);
//! - success only for `statusCode` 2000 (or the later 3000/4000); other codes and HTTP
//!   `errorCode`s are classified ([`super::classify`]);
//! - the secret is used only as the HMAC key; the header carrying the signature is sensitive.

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::Sha256;

use super::classify;
use super::config::SolapiKeys;
use super::payload::{Fallback, TemplateMessage};
use super::{Body, Reply, Verdict, snippet};
use crate::config::Secret;
use crate::sink::Delivery;

/// One Solapi account and KakaoTalk channel.
pub struct Solapi {
    /// `{endpoint}/messages/v4/send`.
    url: String,
    /// `apiKey=`.
    api_key: String,
    /// The HMAC key.
    api_secret: Secret,
    /// `kakaoOptions.pfId`.
    pf_id: String,
    /// `from`.
    from: String,
    /// Prefix of `customFields.outboxId`.
    key_prefix: String,
}

/// Solapi's answer: a message status, or an error.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    /// The message's status (`2000` accepted).
    #[serde(default)]
    status_code: Option<String>,
    /// Solapi's text for the status.
    #[serde(default)]
    status_message: Option<String>,
    /// On HTTP errors: `ValidationError`, `InvalidAPIKey`, ...
    #[serde(default)]
    error_code: Option<String>,
    /// Solapi's text for the error.
    #[serde(default)]
    error_message: Option<String>,
}

/// `hex(HMAC-SHA256(secret, date + salt))`, lowercase.
pub fn signature(secret: &str, date: &str, salt: &str) -> String {
    let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(date.as_bytes());
    mac.update(salt.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `Authorization` value for `date` and `salt`.
pub fn authorization(api_key: &str, secret: &str, date: &str, salt: &str) -> String {
    format!(
        "HMAC-SHA256 apiKey={api_key}, date={date}, salt={salt}, signature={}",
        signature(secret, date, salt)
    )
}

/// `2026-10-08T00:00:00.000Z` for `t`.
pub fn iso8601(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

impl Solapi {
    pub fn new(endpoint: &str, keys: &SolapiKeys, key_prefix: &str) -> Self {
        Solapi {
            url: format!("{endpoint}/messages/v4/send"),
            api_key: keys.api_key.clone(),
            api_secret: keys.api_secret.clone(),
            pf_id: keys.pf_id.clone(),
            from: keys.from.clone(),
            key_prefix: key_prefix.to_string(),
        }
    }

    /// The request body for one row.
    pub fn body(&self, d: &Delivery, msg: &TemplateMessage, phone: &str) -> Body {
        let variables: Map<String, Value> = msg
            .parameters
            .iter()
            .map(|(k, v)| (format!("#{{{k}}}"), Value::String(v.clone())))
            .collect();
        let mut kakao = Map::new();
        kakao.insert("pfId".into(), json!(self.pf_id));
        kakao.insert("templateId".into(), json!(msg.template_code));
        kakao.insert("variables".into(), Value::Object(variables));
        if let Some(b) = &msg.buttons {
            kakao.insert("buttons".into(), Value::Array(b.clone()));
        }
        match &msg.fallback {
            Some(Fallback::Enabled(on)) => {
                kakao.insert("disableSms".into(), json!(!on));
            }
            Some(Fallback::Nhn(_)) => {
                return Err(
                    "fallback as an object is NHN's resendParameter; Solapi takes true or false"
                        .into(),
                );
            }
            None => {}
        }
        for (k, v) in &msg.vendor {
            if kakao.contains_key(k) {
                return Err(format!("vendor.{k} is set by the relay"));
            }
            kakao.insert(k.clone(), v.clone());
        }
        let body = json!({
            "message": {
                "to": phone,
                "from": self.from,
                "type": "ATA",
                "kakaoOptions": kakao,
                "customFields": { "outboxId": format!("{}{}", self.key_prefix, d.id) },
            }
        });
        serde_json::to_vec(&body).map_err(|e| format!("cannot encode the message: {e}"))
    }

    /// The request, signed now with a fresh salt.
    pub fn request(&self, client: &reqwest::Client, body: Vec<u8>) -> reqwest::RequestBuilder {
        let date = iso8601(SystemTime::now());
        let salt = crate::random_token();
        let auth = authorization(&self.api_key, self.api_secret.expose(), &date, &salt);
        let mut auth =
            HeaderValue::from_str(&auth).unwrap_or_else(|_| HeaderValue::from_static(""));
        auth.set_sensitive(true);
        client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("authorization", auth)
            .body(body)
    }
}

/// What Solapi's answer means.
pub fn interpret(reply: &Reply) -> Verdict {
    let parsed = serde_json::from_slice::<Response>(&reply.body).ok();
    let ok = (200..300).contains(&reply.status);
    if let Some(r) = &parsed {
        if let Some(code) = &r.status_code {
            crate::sink::note_vendor_code(code);
            let detail = format!(
                "Solapi {code}: {}",
                snippet(r.status_message.as_deref().unwrap_or(""))
            );
            return Verdict::Definite(
                classify::solapi_status(code).outcome(detail.trim_end_matches([':', ' '])),
            );
        }
        if !ok && let Some(code) = &r.error_code {
            let detail = format!(
                "Solapi HTTP {} {code}: {}",
                reply.status,
                snippet(r.error_message.as_deref().unwrap_or(""))
            );
            if let Some(class) = classify::solapi_error(code) {
                return Verdict::Definite(class.outcome(&detail));
            }
            return Verdict::Definite(classify::http_status(
                reply.status,
                reply.retry_after.as_deref(),
                &format!(
                    " {code}: {}",
                    snippet(r.error_message.as_deref().unwrap_or(""))
                ),
            ));
        }
    }
    if ok {
        return Verdict::Unknown(format!(
            "Solapi answered HTTP {} without a statusCode",
            reply.status
        ));
    }
    let text = snippet(&String::from_utf8_lossy(&reply.body));
    Verdict::Definite(classify::http_status(
        reply.status,
        reply.retry_after.as_deref(),
        &format!(" from Solapi: {text}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Outcome;
    use crate::sink::alimtalk::reply;

    /// Solapi's documented signature example: key `test-key`, secret `test-secret`.
    #[test]
    fn matches_the_test_vector() {
        assert_eq!(
            signature("test-secret", "2026-10-08T00:00:00.000Z", "abc123"),
            "01ed74b1a957a9670695979fd98b45116ee25697ed1ec792422ae5dc0dac1ac7"
        );
        assert_eq!(
            authorization(
                "test-key",
                "test-secret",
                "2026-10-08T00:00:00.000Z",
                "abc123"
            ),
            "HMAC-SHA256 apiKey=test-key, date=2026-10-08T00:00:00.000Z, salt=abc123, \
             signature=01ed74b1a957a9670695979fd98b45116ee25697ed1ec792422ae5dc0dac1ac7"
        );
    }

    #[test]
    fn dates_are_iso8601_utc() {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_791_417_600_123);
        assert_eq!(iso8601(t), "2026-10-08T00:00:00.123Z");
        assert_eq!(iso8601(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400 + 3661);
        assert_eq!(iso8601(leap), "2000-02-29T01:01:01.000Z");
    }

    #[test]
    fn answers() {
        assert!(matches!(
            interpret(&reply(200, r#"{"statusCode":"2000","statusMessage":"ok"}"#)),
            Verdict::Definite(Outcome::Delivered)
        ));
        match interpret(&reply(
            200,
            r#"{"statusCode":"3104","statusMessage":"not a user"}"#,
        )) {
            Verdict::Definite(Outcome::Permanent { reason }) => {
                assert_eq!(reason, "Solapi 3104: not a user (recipient rejected)")
            }
            v => panic!("{v:?}"),
        }
        assert!(matches!(
            interpret(&reply(
                403,
                r#"{"errorCode":"SignatureDoesNotMatch","errorMessage":"x"}"#
            )),
            Verdict::Definite(Outcome::ConfigError { .. })
        ));
        assert!(matches!(
            interpret(&reply(
                400,
                r#"{"errorCode":"ValidationError","errorMessage":"x"}"#
            )),
            Verdict::Definite(Outcome::Permanent { .. })
        ));
        assert!(matches!(
            interpret(&reply(
                500,
                r#"{"errorCode":"InternalError","errorMessage":"x"}"#
            )),
            Verdict::Definite(Outcome::Retry { .. })
        ));
        assert!(matches!(interpret(&reply(200, "{}")), Verdict::Unknown(_)));
    }
}
