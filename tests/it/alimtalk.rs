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
use hmac::{Hmac, KeyInit, Mac};
use outbox_relay::sink::{Outcome, SinkHandle};
use serde_json::{Value, json};
use sha2::Sha256;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

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

#[tokio::test]
async fn nhn_request_carries_nhn_fields() {
    let fake = Fake::start(NHN_PATH, NHN, nhn_script()).await;
    let sink = sink_from_toml(&nhn_toml(&fake.server.uri(), ""), "kakao");
    let payload = r##"{"template_code":"ORDER_SHIPPED","parameters":{"#{name}":"홍길동","order":"1234"},
        "buttons":[{"ordering":1,"type":"WL","name":"Track","linkMo":"https://t.example/1"}],
        "fallback":{"isResend":true,"resendType":"LMS"}}"##;
    let o = sink
        .sink
        .deliver(&delivery(7, Some("010-1234-5678"), payload, 0))
        .await;
    assert_eq!(o, Outcome::Delivered);
    assert_eq!(fake.problems(), Vec::<String>::new());
    let s = &fake.seen.all()[0];
    assert_eq!(s.header("x-nc-api-idempotency-key"), Some("7-0"));
    assert_eq!(
        s.json(),
        json!({
            "senderKey": SENDER_KEY,
            "templateCode": "ORDER_SHIPPED",
            "senderGroupingKey": "7",
            "recipientList": [{
                "recipientNo": "01012345678",
                "templateParameter": {"name": "홍길동", "order": "1234"},
                "recipientGroupingKey": "7",
                "buttons": [{"ordering": 1, "type": "WL", "name": "Track", "linkMo": "https://t.example/1"}],
                "resendParameter": {"isResend": true, "resendType": "LMS"},
            }]
        })
    );
}

#[tokio::test]
async fn nhn_result_code_classes() {
    let fake = Fake::start(NHN_PATH, NHN, nhn_script()).await;
    let sink = sink_from_toml(&nhn_toml(&fake.server.uri(), ""), "kakao");
    assert_eq!(send(&sink, 1, "01000000000", 0).await, Outcome::Delivered);
    match send(&sink, 2, "01000000001", 0).await {
        Outcome::ConfigError { reason } => assert!(reason.contains("-1001"), "{reason}"),
        o => panic!("{o:?}"),
    }
    match send(&sink, 3, "01000000002", 0).await {
        Outcome::Permanent { reason } => {
            assert!(
                reason.contains("-5000") && reason.contains("recipient"),
                "{reason}"
            )
        }
        o => panic!("{o:?}"),
    }
    match send(&sink, 4, "01000000003", 0).await {
        Outcome::Permanent { reason } => {
            assert!(
                reason.contains("-3003") && reason.contains("message"),
                "{reason}"
            )
        }
        o => panic!("{o:?}"),
    }
    match send(&sink, 5, "01000000004", 0).await {
        Outcome::Retry { reason, .. } => assert!(reason.contains("-9999"), "{reason}"),
        o => panic!("{o:?}"),
    }
    assert!(matches!(
        send(&sink, 6, "01000000005", 0).await,
        Outcome::Retry { .. }
    ));
    // -1005: NHN has seen the idempotency key: an earlier attempt was accepted.
    assert_eq!(send(&sink, 7, "01000000007", 0).await, Outcome::Delivered);
    assert_eq!(
        send(&sink, 8, "01000000008", 0).await,
        Outcome::Throttle {
            pause: Duration::from_secs(5),
            reason: "HTTP 429 from NHN: ".into()
        }
    );
    // Unknown outcomes: FAILED by default, never resent.
    for (id, phone, what) in [
        (9, "01000000006", "timed out after the request was sent"),
        (10, "01000000009", "without a readable result"),
    ] {
        let started = Instant::now();
        match send(&sink, id, phone, 0).await {
            Outcome::Permanent { reason } => {
                assert!(reason.starts_with("outcome unknown: "), "{reason}");
                assert!(reason.contains(what), "{reason}");
            }
            o => panic!("{o:?}"),
        }
        assert!(started.elapsed() < Duration::from_millis(2500));
    }
    assert_eq!(fake.problems(), Vec::<String>::new());
}

/// Row 42: a vendor error (definite: next attempt gets a new key), then a timeout after
/// sending (unknown, retried: the same key again), then NHN answers -1005 for the repeated key,
/// which is a delivery.
#[tokio::test]
async fn nhn_reuses_the_idempotency_key_only_after_an_unknown_outcome() {
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let k = keys.clone();
    let script: Script = Arc::new(move |s, n| {
        let key = s
            .header("x-nc-api-idempotency-key")
            .unwrap_or("")
            .to_string();
        let mut keys = k.lock().unwrap();
        let repeated = keys.contains(&key);
        keys.push(key);
        match n {
            1 => nhn_answer(-9999, None),
            2 => nhn_answer(0, Some(0)).set_delay(Duration::from_secs(3)),
            _ if repeated => nhn_answer(-1005, None),
            _ => nhn_answer(0, Some(0)),
        }
    });
    let fake = Fake::start(NHN_PATH, NHN, script).await;
    let sink = sink_from_toml(
        &nhn_toml(&fake.server.uri(), "on_unknown_outcome = \"retry\""),
        "kakao",
    );
    assert!(matches!(
        send(&sink, 42, "01012345678", 0).await,
        Outcome::Retry { .. }
    ));
    match send(&sink, 42, "01012345678", 1).await {
        Outcome::Retry { reason, .. } => {
            assert!(reason.starts_with("outcome unknown: "), "{reason}")
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(send(&sink, 42, "01012345678", 2).await, Outcome::Delivered);
    assert_eq!(*keys.lock().unwrap(), vec!["42-0", "42-1", "42-1"]);
    for s in fake.seen.all() {
        assert_eq!(s.json()["recipientList"][0]["recipientGroupingKey"], "42");
    }
}

#[tokio::test]
async fn bad_rows_and_unreachable_vendors() {
    let fake = Fake::start(NHN_PATH, NHN, nhn_script()).await;
    let sink = sink_from_toml(&nhn_toml(&fake.server.uri(), ""), "kakao");
    for (recipient, payload, why) in [
        (Some("010-CALL-ME"), ORDER, "not a phone number"),
        (None, ORDER, "recipient (a phone number) is missing"),
        (
            Some("01012345678"),
            r#"{"parameters":{}}"#,
            "lacks template_code",
        ),
        (
            Some("01012345678"),
            r#"{"template_code":"T","parameters":{"n":1}}"#,
            "must be a string",
        ),
        (
            Some("01012345678"),
            r#"{"template_code":"T","vendor":{"recipientNo":"1"}}"#,
            "set by the relay",
        ),
    ] {
        match sink.sink.deliver(&delivery(1, recipient, payload, 0)).await {
            Outcome::Permanent { reason } => assert!(reason.contains(why), "{why}: {reason}"),
            o => panic!("{why}: {o:?}"),
        }
    }
    assert_eq!(fake.seen.len(), 0, "no request for a bad row");

    // Nothing listens: the request never left, so it is retried (not an unknown outcome).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!("http://127.0.0.1:{port}");
    for toml in [nhn_toml(&dead, ""), solapi_toml(&dead, API_SECRET, "")] {
        let sink = sink_from_toml(&toml, "kakao");
        match send(&sink, 1, "01012345678", 0).await {
            Outcome::Retry { reason, .. } => {
                assert!(reason.contains("connection failed"), "{reason}");
                assert!(!reason.contains(APP_KEY), "URLs are not quoted: {reason}");
            }
            o => panic!("{o:?}"),
        }
    }
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

#[tokio::test]
async fn solapi_signs_every_request_afresh() {
    let fake = Fake::start(SOLAPI_PATH, SOLAPI, solapi_script()).await;
    let sink = sink_from_toml(&solapi_toml(&fake.server.uri(), API_SECRET, ""), "kakao");
    for attempt in 0..3 {
        assert_eq!(
            send(&sink, 5, "+82 10-1234-5678", attempt).await,
            Outcome::Delivered
        );
    }
    assert_eq!(
        fake.problems(),
        Vec::<String>::new(),
        "signature, date and salts verified"
    );
    let body = fake.seen.all()[0].json();
    assert_eq!(
        body,
        json!({"message": {
            "to": "01012345678", "from": "0212345678", "type": "ATA",
            "kakaoOptions": {"pfId": "KA01PF", "templateId": "ORDER_SHIPPED",
                             "variables": {"#{name}": "홍길동", "#{order}": "1234"}},
            "customFields": {"outboxId": "5"},
        }})
    );
    let auths: Vec<String> = fake
        .seen
        .all()
        .iter()
        .map(|s| s.header("authorization").unwrap().to_string())
        .collect();
    assert_ne!(auths[0], auths[1], "a fresh salt per attempt");

    // Signed with the wrong secret: Solapi refuses the signature; a configuration error.
    let wrong = sink_from_toml(
        &solapi_toml(&fake.server.uri(), "not-the-secret", ""),
        "kakao",
    );
    match send(&wrong, 6, "01012345678", 0).await {
        Outcome::ConfigError { reason } => {
            assert!(reason.contains("SignatureDoesNotMatch"), "{reason}")
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(fake.problems(), vec!["SignatureDoesNotMatch".to_string()]);
}

#[tokio::test]
async fn solapi_status_code_classes() {
    let fake = Fake::start(SOLAPI_PATH, SOLAPI, solapi_script()).await;
    let sink = sink_from_toml(&solapi_toml(&fake.server.uri(), API_SECRET, ""), "kakao");
    let reason_of = |o: Outcome| reason(&o).to_string();
    assert_eq!(send(&sink, 1, "01000000000", 0).await, Outcome::Delivered);
    let o = send(&sink, 2, "01000000001", 0).await;
    assert!(
        matches!(o, Outcome::ConfigError { .. }) && reason_of(o.clone()).contains("1030"),
        "{o:?}"
    );
    let o = send(&sink, 3, "01000000002", 0).await;
    assert!(
        matches!(o, Outcome::Permanent { .. }) && reason_of(o.clone()).contains("recipient"),
        "{o:?}"
    );
    let o = send(&sink, 4, "01000000003", 0).await;
    assert!(
        matches!(o, Outcome::Permanent { .. }) && reason_of(o.clone()).contains("1043"),
        "{o:?}"
    );
    let o = send(&sink, 5, "01000000004", 0).await;
    assert!(
        matches!(o, Outcome::Retry { .. }) && reason_of(o.clone()).contains("1024"),
        "{o:?}"
    );
    let o = send(&sink, 6, "01000000005", 0).await;
    assert!(
        matches!(o, Outcome::ConfigError { .. }) && reason_of(o.clone()).contains("InvalidAPIKey"),
        "{o:?}"
    );
    let o = send(&sink, 7, "01000000007", 0).await;
    assert!(
        matches!(o, Outcome::Permanent { .. }) && reason_of(o.clone()).contains("ValidationError"),
        "{o:?}"
    );
    assert!(matches!(
        send(&sink, 8, "01000000008", 0).await,
        Outcome::Throttle { pause, .. } if pause == Duration::from_secs(60)
    ));
    assert!(matches!(
        send(&sink, 9, "01000000009", 0).await,
        Outcome::Retry { .. }
    ));
    match send(&sink, 10, "01000000006", 0).await {
        Outcome::Permanent { reason } => {
            assert!(reason.starts_with("outcome unknown: "), "{reason}")
        }
        o => panic!("{o:?}"),
    }
    // With on_unknown_outcome = "retry", the same timeout is retried.
    let retrying = sink_from_toml(
        &solapi_toml(
            &fake.server.uri(),
            API_SECRET,
            "on_unknown_outcome = \"retry\"",
        ),
        "kakao",
    );
    match send(&retrying, 11, "01000000006", 0).await {
        Outcome::Retry { reason, .. } => {
            assert!(reason.starts_with("outcome unknown: "), "{reason}")
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(fake.problems(), Vec::<String>::new());
}

#[test]
fn configuration_errors_name_the_key() {
    let base = "[sinks.kakao]\nkind = \"alimtalk\"\n";
    let e = config_error(base);
    assert!(e.starts_with("sinks.kakao.provider:"), "{e}");
    let e = config_error(&format!(
        "{base}provider = \"nhn\"\napp_key = \"a\"\nsender_key = \"s\"\n"
    ));
    assert!(e.starts_with("sinks.kakao.secret_key:"), "{e}");
    let e = config_error(&format!(
        "{base}provider = \"solapi\"\napi_key = \"k\"\napi_secret = \"{API_SECRET}\"\npf_id = \"p\"\n"
    ));
    assert!(e.starts_with("sinks.kakao.from:"), "{e}");
    assert!(!e.contains(API_SECRET));
    let e = config_error(&format!("{base}provider = \"nhn\"\nsecretkey = \"x\"\n"));
    assert!(e.starts_with("sinks.kakao.secretkey:"), "{e}");
    let e = config_error(&format!(
        "{base}provider = \"nhn\"\non_unknown_outcome = \"resend\"\n"
    ));
    assert!(e.starts_with("sinks.kakao.on_unknown_outcome"), "{e}");
}

/// The relay binary with both vendors, at RUST_LOG=debug: deliveries, an unknown outcome
/// (FAILED "outcome unknown"), a configuration error (row kept, sink paused) and a refused
/// signature; neither vendor secret appears in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_binary_outcomes_and_no_secret_in_the_log() {
    let nhn = Fake::start(NHN_PATH, NHN, nhn_script()).await;
    let sol = Fake::start(SOLAPI_PATH, SOLAPI, solapi_script()).await;
    let outbox = Outbox::create().await;
    let config = outbox.write(
        "relay.toml",
        &format!(
            "[relay]\npoll_interval = \"50ms\"\n\n[lease]\nbackend = \"none\"\n\n\
             [retry]\ninitial_backoff = \"1s\"\nmax_backoff = \"2s\"\nmax_attempts = 2\n\n\
             [sinks.kakao]\nkind = \"alimtalk\"\nprovider = \"nhn\"\nendpoint = \"{}\"\n\
             app_key = \"{APP_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\nsender_key = \"{SENDER_KEY}\"\n\
             timeout = \"1s\"\n\n\
             [sinks.sol]\nkind = \"alimtalk\"\nprovider = \"solapi\"\nendpoint = \"{}\"\n\
             api_key = \"{API_KEY}\"\napi_secret = \"{API_SECRET}\"\npf_id = \"KA01PF\"\n\
             from = \"0212345678\"\ntimeout = \"1s\"\n",
            nhn.server.uri(),
            sol.server.uri()
        ),
    );
    let ok = outbox.enqueue("kakao", "010-1234-5678", ORDER).await;
    let unknown = outbox.enqueue("kakao", "01000000006", ORDER).await;
    let gone = outbox.enqueue("kakao", "01000000002", ORDER).await;
    let sol_ok = outbox.enqueue("sol", "01012345678", ORDER).await;
    let sol_denied = outbox.enqueue("sol", "01000000005", ORDER).await;
    let mut relay = Relay::start(&outbox, &config);

    let wait = Duration::from_secs(20);
    outbox.wait_status(&relay, ok, "SUCCESS", wait).await;
    outbox.wait_status(&relay, sol_ok, "SUCCESS", wait).await;
    outbox.wait_status(&relay, gone, "FAILED", wait).await;
    outbox.wait_status(&relay, unknown, "FAILED", wait).await;
    let (_, attempts, error) = outbox.row(unknown).await;
    assert!(
        error
            .as_deref()
            .unwrap_or("")
            .starts_with("outcome unknown: "),
        "{error:?}"
    );
    assert_eq!(attempts, 1);
    let sent_to = |fake: &Fake, to: &str| {
        fake.seen
            .all()
            .iter()
            .filter(|s| s.body.contains(to))
            .count()
    };
    assert_eq!(
        sent_to(&nhn, "01000000006"),
        1,
        "an unknown outcome is not resent"
    );
    // The configuration error keeps the row and counts no attempt.
    let deadline = Instant::now() + wait;
    loop {
        let (status, attempts, error) = outbox.row(sol_denied).await;
        if error.as_deref().unwrap_or("").contains("InvalidAPIKey") {
            assert_eq!((status.as_str(), attempts), ("PENDING", 0));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no config error; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.stop().await;
    assert_eq!(nhn.problems(), Vec::<String>::new());
    assert_eq!(sol.problems(), Vec::<String>::new());
    let log = relay.log();
    assert!(log.contains("sink configuration error"), "{log}");
    assert!(log.contains("outcome unknown"), "{log}");
    relay.assert_log_free_of(&[SECRET_KEY, API_SECRET]);
}
