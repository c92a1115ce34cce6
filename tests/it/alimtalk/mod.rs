//! The `alimtalk` sink against loopback fakes of NHN Cloud AlimTalk v2.3 and Solapi v4.
//!
//! The fakes check what the vendors check: NHN the `X-Secret-Key` and the presence of the
//! idempotency key, Solapi the HMAC signature (recomputed here with this file's own code), the
//! date's freshness and that no salt is used twice; both check the body. Each answers per
//! recipient number, so one fake serves every result-code class. Sinks are built from TOML
//! through the public configuration API; the last test runs the relay binary.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::vendors::*;
use crate::support::wait::*;
use hmac::{Hmac, KeyInit, Mac};
use outbox_relay::sink::{Outcome, SinkHandle};
use serde_json::{Value, json};
use sha2::Sha256;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

mod nhn;
mod relay;
mod solapi;

pub(crate) const APP_KEY: &str = "AppKey123";
/// Distinctive secrets, looked for in the relay's log.
pub(crate) const SECRET_KEY: &str = "nhn-SECRET-KEY-4c1d8e2f9a";
const API_SECRET: &str = "solapi-API-SECRET-b7e05d3c61";
const API_KEY: &str = "NCSTESTAPIKEY01";
pub(crate) const SENDER_KEY: &str = "1234567890123456789012345678901234567890";
pub(crate) const NHN_PATH: &str = "/alimtalk/v2.3/appkeys/AppKey123/messages";
const SOLAPI_PATH: &str = "/messages/v4/send";

/// How a fake answers a request (given it and its number, 1-based).
pub(crate) type Script = Arc<dyn Fn(&Seen, usize) -> ResponseTemplate + Send + Sync>;
/// A vendor's request checks, and how it answers a request that fails them.
pub(crate) type Check = (
    fn(&Seen) -> Result<(), String>,
    fn(String) -> ResponseTemplate,
);

/// A loopback vendor: its server, what it received, what it found wrong.
pub(crate) struct Fake {
    pub(crate) server: MockServer,
    pub(crate) seen: Log,
    problems: Arc<Mutex<Vec<String>>>,
}

impl Fake {
    /// `check` finds what the vendor would refuse; `reject` answers it as the vendor would.
    pub(crate) async fn start(route: &'static str, check: Check, script: Script) -> Fake {
        let (check, reject) = check;
        let server = MockServer::start().await;
        let seen = Log::default();
        let problems = Arc::new(Mutex::new(Vec::new()));
        let (log, found) = (seen.clone(), problems.clone());
        Mock::given(method("POST"))
            .and(path(route))
            .respond_with(move |req: &Request| {
                let s = Seen::from(req);
                let n = log.push(s.clone());
                if let Err(p) = check(&s) {
                    found.lock().unwrap().push(p.clone());
                    return reject(p);
                }
                script(&s, n)
            })
            .mount(&server)
            .await;
        Fake {
            server,
            seen,
            problems,
        }
    }

    pub(crate) fn problems(&self) -> Vec<String> {
        self.problems.lock().unwrap().clone()
    }
}

// ------------------------------------------------------------------------------------------
// NHN Cloud

/// NHN's checks: the secret key, an idempotency key, a JSON body naming our sender.
fn nhn_check(s: &Seen) -> Result<(), String> {
    if s.header("x-secret-key") != Some(SECRET_KEY) {
        return Err("X-Secret-Key".into());
    }
    if s.header("x-nc-api-idempotency-key")
        .is_none_or(str::is_empty)
    {
        return Err("no X-NC-API-IDEMPOTENCY-KEY".into());
    }
    if !s
        .header("content-type")
        .unwrap_or("")
        .starts_with("application/json")
    {
        return Err("content-type".into());
    }
    let body: Value = serde_json::from_str(&s.body).map_err(|e| e.to_string())?;
    if body["senderKey"] != SENDER_KEY || body["recipientList"].as_array().map(Vec::len) != Some(1)
    {
        return Err(format!("body {body}"));
    }
    Ok(())
}

/// NHN's checks and its refusal (header-level -1001 with the problem as the message).
pub(crate) const NHN: Check = (nhn_check, |p| {
    ResponseTemplate::new(200).set_body_json(json!({
        "header": {"resultCode": -1001, "resultMessage": p, "isSuccessful": false}}))
});

fn nhn_answer(header_code: i64, recipient_code: Option<i64>) -> ResponseTemplate {
    let results = match recipient_code {
        Some(c) => json!([{"recipientSeq": 1, "recipientNo": "x", "resultCode": c,
                           "resultMessage": format!("code {c}")}]),
        None => json!([]),
    };
    ResponseTemplate::new(200).set_body_json(json!({
        "header": {"resultCode": header_code, "resultMessage": format!("header {header_code}"),
                   "isSuccessful": header_code == 0},
        "message": {"requestId": "req-1", "sendResults": results}
    }))
}

fn nhn_to(s: &Seen) -> String {
    s.json()["recipientList"][0]["recipientNo"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Answers by recipient number: `0100000000N` picks the class.
pub(crate) fn nhn_script() -> Script {
    Arc::new(|s, _| match nhn_to(s).as_str() {
        "01000000001" => nhn_answer(-1001, None),
        "01000000002" => nhn_answer(0, Some(-5000)),
        "01000000003" => nhn_answer(0, Some(-3003)),
        "01000000004" => nhn_answer(-9999, None),
        "01000000005" => ResponseTemplate::new(502).set_body_string("<html>Bad Gateway</html>"),
        "01000000006" => nhn_answer(0, Some(0)).set_delay(Duration::from_secs(3)),
        "01000000007" => nhn_answer(-1005, None),
        "01000000008" => ResponseTemplate::new(429).insert_header("retry-after", "5"),
        "01000000009" => ResponseTemplate::new(200).set_body_string("<html>ok?</html>"),
        _ => nhn_answer(0, Some(0)),
    })
}

fn nhn_toml(endpoint: &str, extra: &str) -> String {
    format!(
        "[lease]\nbackend = \"none\"\n\n[sinks.kakao]\nkind = \"alimtalk\"\nprovider = \"nhn\"\n\
         endpoint = \"{endpoint}\"\napp_key = \"{APP_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\n\
         sender_key = \"{SENDER_KEY}\"\ntimeout = \"1s\"\n{extra}\n"
    )
}

const ORDER: &str =
    r##"{"template_code":"ORDER_SHIPPED","parameters":{"#{name}":"홍길동","order":"1234"}}"##;

async fn send(sink: &SinkHandle, id: i64, phone: &str, attempts: u32) -> Outcome {
    sink.sink
        .deliver(&delivery(id, Some(phone), ORDER, attempts))
        .await
}

// ------------------------------------------------------------------------------------------
// Solapi

fn hex_hmac(secret: &str, data: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(data.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `2026-10-08T00:00:00.000Z` -> Unix seconds.
fn parse_date(d: &str) -> Option<u64> {
    let num = |r: std::ops::Range<usize>| d.get(r)?.parse::<i64>().ok();
    if d.len() != 24 || !d.ends_with('Z') || &d[10..11] != "T" {
        return None;
    }
    let (y, m, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, min, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + min * 60 + s).ok()
}

/// Salts seen by every Solapi fake in this process: none may repeat.
fn salts() -> &'static Mutex<Vec<String>> {
    static SALTS: std::sync::OnceLock<Mutex<Vec<String>>> = std::sync::OnceLock::new();
    SALTS.get_or_init(Mutex::default)
}

/// Solapi's checks of the Authorization header, then of the body.
fn solapi_check(s: &Seen) -> Result<(), String> {
    let auth = s.header("authorization").ok_or("no Authorization")?;
    let rest = auth.strip_prefix("HMAC-SHA256 ").ok_or("not HMAC-SHA256")?;
    let field = |k: &str| {
        rest.split(", ")
            .find_map(|p| p.strip_prefix(&format!("{k}=")))
            .map(str::to_string)
    };
    let (key, date, salt, sig) = (
        field("apiKey").ok_or("apiKey")?,
        field("date").ok_or("date")?,
        field("salt").ok_or("salt")?,
        field("signature").ok_or("signature")?,
    );
    if key != API_KEY {
        return Err(format!("apiKey {key}"));
    }
    let at = parse_date(&date).ok_or(format!("date {date}"))?;
    if at.abs_diff(unix_now()) > 15 * 60 {
        return Err("RequestTimeTooSkewed".into());
    }
    {
        let mut seen = salts().lock().unwrap();
        if salt.len() < 12 || seen.contains(&salt) {
            return Err(format!("salt {salt} reused or short"));
        }
        seen.push(salt.clone());
    }
    if sig != hex_hmac(API_SECRET, &format!("{date}{salt}")) {
        return Err("SignatureDoesNotMatch".into());
    }
    let m = &s.json()["message"];
    if m["type"] != "ATA" || m["from"] != "0212345678" || m["kakaoOptions"]["pfId"] != "KA01PF" {
        return Err(format!("body {m}"));
    }
    Ok(())
}

/// Solapi's checks and its refusal (403 with the problem as the errorCode).
const SOLAPI: Check = (solapi_check, |p| {
    ResponseTemplate::new(403).set_body_json(json!({"errorCode": p, "errorMessage": "refused"}))
});

fn solapi_status(code: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "groupId": "G4V1", "messageId": "M4V1", "type": "ATA", "statusCode": code,
        "statusMessage": format!("status {code}"), "to": "x", "from": "0212345678"}))
}

fn solapi_error(status: u16, code: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .set_body_json(json!({"errorCode": code, "errorMessage": format!("{code} message")}))
}

fn solapi_script() -> Script {
    Arc::new(
        |s, _| match s.json()["message"]["to"].as_str().unwrap_or("") {
            "01000000001" => solapi_status("1030"),
            "01000000002" => solapi_status("3104"),
            "01000000003" => solapi_status("1043"),
            "01000000004" => solapi_status("1024"),
            "01000000005" => solapi_error(403, "InvalidAPIKey"),
            "01000000006" => solapi_status("2000").set_delay(Duration::from_secs(3)),
            "01000000007" => solapi_error(400, "ValidationError"),
            "01000000008" => ResponseTemplate::new(429),
            "01000000009" => solapi_error(500, "InternalError"),
            _ => solapi_status("2000"),
        },
    )
}

/// A config whose sink is named `kakao` too, so the same helpers serve both vendors.
fn solapi_toml(endpoint: &str, secret: &str, extra: &str) -> String {
    format!(
        "[lease]\nbackend = \"none\"\n\n[sinks.kakao]\nkind = \"alimtalk\"\nprovider = \"solapi\"\n\
         endpoint = \"{endpoint}\"\napi_key = \"{API_KEY}\"\napi_secret = \"{secret}\"\n\
         pf_id = \"KA01PF\"\nfrom = \"02-1234-5678\"\ntimeout = \"1s\"\n{extra}\n"
    )
}
