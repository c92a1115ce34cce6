//! The `fcm` sink against loopback fakes of FCM HTTP v1 and Google's OAuth2 token endpoint.
//!
//! The fake token endpoint verifies every assertion as Google would: the form's grant type,
//! the RS256 signature (checked by the `openssl` CLI against the public half of a key made for
//! this run, so the relay's signer cannot vouch for itself) and the claims (`iss`, `scope`,
//! `aud` = token_uri, `exp` = `iat` + 3600). Sinks are built from TOML through the public
//! configuration API; the last test runs the relay binary.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::vendors::*;
use outbox_relay::sink::{Outcome, SinkHandle};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
const EMAIL: &str = "relay@demo.iam.gserviceaccount.com";
const SEND_PATH: &str = "/v1/projects/demo/messages:send";
/// Part of every access token the fake issues: looked for in the relay's log.
const TOKEN_MARK: &str = "SECRET-ACCESS-TOKEN-7f3a9c";

/// What the fake token endpoint knows and has done.
struct TokenState {
    /// The key assertions must verify with.
    public_pem: String,
    /// The expected `aud`.
    token_uri: String,
    /// `expires_in` of the tokens it issues.
    expires_in: AtomicUsize,
    /// Tokens issued so far.
    issued: AtomicUsize,
    /// Assertions refused, with why.
    refused: Mutex<Vec<String>>,
    /// When set, every request gets this answer instead.
    forced: Mutex<Option<ResponseTemplate>>,
}

impl TokenState {
    fn issued(&self) -> usize {
        self.issued.load(Ordering::SeqCst)
    }

    fn refused(&self) -> Vec<String> {
        self.refused.lock().unwrap().clone()
    }

    fn answer(&self, req: &Request) -> ResponseTemplate {
        if let Some(r) = self.forced.lock().unwrap().clone() {
            return r;
        }
        match self.check(req) {
            Ok(()) => {
                let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
                ResponseTemplate::new(200).set_body_json(json!({
                    "access_token": token(n),
                    "expires_in": self.expires_in.load(Ordering::SeqCst),
                    "token_type": "Bearer",
                }))
            }
            Err(why) => {
                self.refused.lock().unwrap().push(why.clone());
                ResponseTemplate::new(400)
                    .set_body_json(json!({"error": "invalid_grant", "error_description": why}))
            }
        }
    }

    /// Google's checks of a JWT-bearer token request.
    fn check(&self, req: &Request) -> Result<(), String> {
        let ct = req
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if ct != "application/x-www-form-urlencoded" {
            return Err(format!("content-type {ct}"));
        }
        let body = String::from_utf8_lossy(&req.body).into_owned();
        let form: Vec<(&str, &str)> = body.split('&').filter_map(|p| p.split_once('=')).collect();
        let field = |k: &str| form.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let grant = field("grant_type").unwrap_or("").replace("%3A", ":");
        if grant != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
            return Err(format!("grant_type {grant}"));
        }
        let jwt = field("assertion").ok_or("no assertion")?;
        let (header, claims) = verify_rs256(jwt, &self.public_pem)?;
        let expect = |what: &str, got: &Value, want: Value| {
            if *got == want {
                Ok(())
            } else {
                Err(format!("{what} is {got}, expected {want}"))
            }
        };
        expect("alg", &header["alg"], json!("RS256"))?;
        expect("typ", &header["typ"], json!("JWT"))?;
        expect("kid", &header["kid"], json!("kid-1"))?;
        expect("iss", &claims["iss"], json!(EMAIL))?;
        expect("scope", &claims["scope"], json!(SCOPE))?;
        expect("aud", &claims["aud"], json!(self.token_uri))?;
        let iat = claims["iat"].as_u64().ok_or("no iat")?;
        let exp = claims["exp"].as_u64().ok_or("no exp")?;
        if exp != iat + 3600 {
            return Err(format!("exp - iat = {}", exp as i64 - iat as i64));
        }
        if iat.abs_diff(unix_now()) > 60 {
            return Err(format!("iat {iat} is not now"));
        }
        Ok(())
    }
}

/// The n-th access token the fake issues.
fn token(n: usize) -> String {
    format!("ya29.{TOKEN_MARK}-{n}")
}

/// Which token (by number) a request carried, 0 if none of the fake's.
fn token_number(seen: &Seen) -> usize {
    seen.header("authorization")
        .and_then(|a| a.strip_prefix(&format!("Bearer ya29.{TOKEN_MARK}-")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// How the fake FCM answers: given the request and its number (1-based).
type Script = Arc<dyn Fn(&Seen, usize) -> ResponseTemplate + Send + Sync>;

/// A loopback FCM with its token endpoint.
struct Fake {
    server: MockServer,
    tokens: Arc<TokenState>,
    fcm: Log,
}

impl Fake {
    async fn start(script: Script) -> Fake {
        let server = MockServer::start().await;
        let tokens = Arc::new(TokenState {
            public_pem: service_key().public_pem.clone(),
            token_uri: format!("{}/token", server.uri()),
            expires_in: AtomicUsize::new(3600),
            issued: AtomicUsize::new(0),
            refused: Mutex::new(Vec::new()),
            forced: Mutex::new(None),
        });
        let t = tokens.clone();
        Mock::given(method("POST"))
            .and(path("/token"))
            .respond_with(move |req: &Request| t.answer(req))
            .mount(&server)
            .await;
        let fcm = Log::default();
        let log = fcm.clone();
        Mock::given(method("POST"))
            .and(path(SEND_PATH))
            .respond_with(move |req: &Request| {
                let seen = Seen::from(req);
                let n = log.push(seen.clone());
                script(&seen, n)
            })
            .mount(&server)
            .await;
        Fake {
            server,
            tokens,
            fcm,
        }
    }

    /// The service-account key file's JSON, signing with `key`.
    fn credentials(&self, key: &KeyPair) -> String {
        json!({
            "type": "service_account",
            "project_id": "demo",
            "private_key_id": "kid-1",
            "private_key": key.private_pem,
            "client_email": EMAIL,
            "client_id": "1",
            "token_uri": self.tokens.token_uri,
        })
        .to_string()
    }

    /// A config with the sink `push` pointing at this fake; `extra` goes into the sink table.
    fn toml(&self, key: &KeyPair, endpoint: &str, extra: &str) -> String {
        format!(
            "[lease]\nbackend = \"none\"\n\n[sinks.push]\nkind = \"fcm\"\n\
             credentials_json = '''{}'''\nendpoint = \"{endpoint}\"\ntimeout = \"2s\"\n{extra}\n",
            self.credentials(key)
        )
    }

    fn sink(&self, extra: &str) -> Arc<SinkHandle> {
        sink_from_toml(&self.toml(service_key(), &self.server.uri(), extra), "push")
    }
}

fn ok() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"name": "projects/demo/messages/0:1"}))
}

fn fcm_error(status: u16, canonical: &str, code: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({"error": {
        "code": status, "message": format!("{code} happened"), "status": canonical,
        "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}]
    }}))
}

async fn deliver(sink: &SinkHandle, recipient: &str, payload: &str) -> Outcome {
    sink.sink
        .deliver(&delivery(1, Some(recipient), payload, 0))
        .await
}

const NOTE: &str =
    r##"{"notification":{"title":"Order shipped","body":"#1234"},"data":{"order":"1234"}}"##;

#[tokio::test]
async fn sends_with_a_verified_token_minted_once() {
    let fake = Fake::start(Arc::new(|_, _| ok())).await;
    let sink = fake.sink("");
    // Twelve sends at once on a cold cache: one token request serves them all.
    let mut tasks = Vec::new();
    for i in 0..12 {
        let sink = sink.clone();
        tasks.push(tokio::spawn(async move {
            let d = delivery(i, Some(&format!("device-{i}")), NOTE, 0);
            sink.sink.deliver(&d).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), Outcome::Delivered);
    }
    assert_eq!(fake.tokens.refused(), Vec::<String>::new());
    assert_eq!(fake.tokens.issued(), 1, "single-flight: one token for all");
    let seen = fake.fcm.all();
    assert_eq!(seen.len(), 12);
    for s in &seen {
        assert_eq!(s.path, SEND_PATH);
        assert_eq!(token_number(s), 1);
        assert!(
            s.header("content-type")
                .unwrap()
                .starts_with("application/json")
        );
        let body = s.json();
        let token = body["message"]["token"].as_str().unwrap();
        assert!(token.starts_with("device-"), "{body}");
        assert_eq!(body["message"]["data"], json!({"order": "1234"}));
        assert_eq!(body["message"]["notification"]["title"], "Order shipped");
        assert!(body.get("validate_only").is_none());
    }
    // Later sends reuse the cached token.
    assert_eq!(deliver(&sink, "device-x", NOTE).await, Outcome::Delivered);
    assert_eq!(fake.tokens.issued(), 1);

    // validate_only is passed on; a topic message has no token.
    let dry = fake.sink("validate_only = true");
    assert_eq!(
        dry.sink
            .deliver(&delivery(
                2,
                None,
                r#"{"topic":"news","data":{"k":"v"}}"#,
                0
            ))
            .await,
        Outcome::Delivered
    );
    let last = fake.fcm.all().pop().unwrap().json();
    assert_eq!(
        last,
        json!({"message": {"topic": "news", "data": {"k": "v"}}, "validate_only": true})
    );
}

#[tokio::test]
async fn every_fcm_error_class() {
    let script: Script = Arc::new(|seen, _| {
        let body = seen.json();
        match body["message"]["token"].as_str().unwrap_or("") {
            "unregistered" => fcm_error(404, "NOT_FOUND", "UNREGISTERED"),
            "invalid" => fcm_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
            "mismatch" => fcm_error(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"),
            "quota" => fcm_error(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED")
                .insert_header("retry-after", "7"),
            "ratelimit" => ResponseTemplate::new(429).set_body_json(json!({"error": {
                "code": 429, "status": "RESOURCE_EXHAUSTED", "message": "Quota exceeded",
                "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED"}]}})),
            "unavailable" => {
                fcm_error(503, "UNAVAILABLE", "UNAVAILABLE").insert_header("retry-after", "3")
            }
            "internal" => fcm_error(500, "INTERNAL", "INTERNAL"),
            "apns" => fcm_error(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR"),
            "denied" => ResponseTemplate::new(403).set_body_json(json!({"error": {
                "code": 403, "status": "PERMISSION_DENIED",
                "message": "Firebase Cloud Messaging API has not been used in project demo"}})),
            "notfound" => ResponseTemplate::new(404).set_body_string("<html>Not Found</html>"),
            "gateway" => ResponseTemplate::new(502).set_body_string("<html>Bad Gateway</html>"),
            "slow" => ok().set_delay(Duration::from_secs(4)),
            _ => ok(),
        }
    });
    let fake = Fake::start(script).await;
    let sink = fake.sink("");
    let permanent = |o: &Outcome, what: &str| {
        assert!(
            matches!(o, Outcome::Permanent { reason } if reason.contains(what)),
            "{what}: {o:?}"
        )
    };
    let config = |o: &Outcome, what: &str| {
        assert!(
            matches!(o, Outcome::ConfigError { reason } if reason.contains(what)),
            "{what}: {o:?}"
        )
    };
    permanent(&deliver(&sink, "unregistered", NOTE).await, "UNREGISTERED");
    permanent(&deliver(&sink, "invalid", NOTE).await, "INVALID_ARGUMENT");
    permanent(
        &deliver(&sink, "mismatch", NOTE).await,
        "SENDER_ID_MISMATCH",
    );
    assert_eq!(
        deliver(&sink, "quota", NOTE).await,
        Outcome::Throttle {
            pause: Duration::from_secs(7),
            reason: "FCM HTTP 429 QUOTA_EXCEEDED: QUOTA_EXCEEDED happened".into()
        }
    );
    match deliver(&sink, "ratelimit", NOTE).await {
        Outcome::Throttle { pause, .. } => assert_eq!(pause, Duration::from_secs(60)),
        o => panic!("{o:?}"),
    }
    match deliver(&sink, "unavailable", NOTE).await {
        Outcome::Retry { after, reason } => {
            assert_eq!(after, Some(Duration::from_secs(3)));
            assert!(reason.contains("UNAVAILABLE"), "{reason}");
        }
        o => panic!("{o:?}"),
    }
    assert!(matches!(
        deliver(&sink, "internal", NOTE).await,
        Outcome::Retry { after: None, .. }
    ));
    config(
        &deliver(&sink, "apns", NOTE).await,
        "THIRD_PARTY_AUTH_ERROR",
    );
    config(&deliver(&sink, "denied", NOTE).await, "PERMISSION_DENIED");
    config(&deliver(&sink, "notfound", NOTE).await, "project_id");
    assert!(matches!(
        deliver(&sink, "gateway", NOTE).await,
        Outcome::Retry { .. }
    ));
    let started = Instant::now();
    match deliver(&sink, "slow", NOTE).await {
        Outcome::Retry { reason, .. } => assert!(reason.contains("timed out"), "{reason}"),
        o => panic!("{o:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the 2s timeout held"
    );
    // THIRD_PARTY_AUTH_ERROR is about APNs/web-push credentials: no new token was fetched.
    assert_eq!(fake.tokens.issued(), 1);

    // FCM unreachable (nothing listens on the port): retry.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = sink_from_toml(
        &fake.toml(service_key(), &format!("http://127.0.0.1:{port}"), ""),
        "push",
    );
    match deliver(&dead, "device", NOTE).await {
        Outcome::Retry { reason, .. } => assert!(reason.contains("connection"), "{reason}"),
        o => panic!("{o:?}"),
    }
}

#[tokio::test]
async fn invalid_messages_fail_without_a_request() {
    let fake = Fake::start(Arc::new(|_, _| ok())).await;
    let sink = fake.sink("");
    let big = json!({"data": {"blob": "x".repeat(5000)}}).to_string();
    for (recipient, payload, why) in [
        (None, NOTE, "no target"),
        (Some("device"), r#"{"topic":"news"}"#, "two targets"),
        (
            None,
            r#"{"topic":"a","condition":"'a' in topics"}"#,
            "targets",
        ),
        (
            Some("device"),
            r#"{"data":{"count":3}}"#,
            "must be a string",
        ),
        (Some("device"), &big, "FCM allows 4096"),
        (Some("device"), "not json", "not valid JSON"),
    ] {
        match sink.sink.deliver(&delivery(9, recipient, payload, 0)).await {
            Outcome::Permanent { reason } => assert!(reason.contains(why), "{why}: {reason}"),
            o => panic!("{why}: {o:?}"),
        }
    }
    assert_eq!(fake.fcm.len(), 0, "no request reached FCM");
    assert_eq!(fake.tokens.issued(), 0, "no token was even minted");
}

#[tokio::test]
async fn tokens_are_refreshed_early_and_on_expiry() {
    let fake = Fake::start(Arc::new(|_, _| ok())).await;
    // A 4 s token: refreshed from 3 s on (a quarter early), unusable from 3.6 s.
    fake.tokens.expires_in.store(4, Ordering::SeqCst);
    let sink = fake.sink("");
    assert_eq!(deliver(&sink, "d", NOTE).await, Outcome::Delivered);
    tokio::time::sleep(Duration::from_millis(3300)).await;
    // Due for refresh but still valid: refreshed now, in the early window.
    assert_eq!(deliver(&sink, "d", NOTE).await, Outcome::Delivered);
    assert_eq!(deliver(&sink, "d", NOTE).await, Outcome::Delivered);
    tokio::time::sleep(Duration::from_millis(3800)).await;
    // Past expiry: a new token before sending.
    assert_eq!(deliver(&sink, "d", NOTE).await, Outcome::Delivered);
    let used: Vec<usize> = fake.fcm.all().iter().map(token_number).collect();
    assert_eq!(used, vec![1, 2, 2, 3]);
    assert_eq!(fake.tokens.issued(), 3);
    assert_eq!(fake.tokens.refused(), Vec::<String>::new());
}

#[tokio::test]
async fn a_401_gets_one_new_token_and_one_resend() {
    // FCM refuses the first token (revoked, say) and takes the next.
    let fake = Fake::start(Arc::new(|seen, _| {
        if token_number(seen) == 1 {
            ResponseTemplate::new(401).set_body_json(json!({"error": {
                "code": 401, "status": "UNAUTHENTICATED",
                "message": "Request had invalid authentication credentials."}}))
        } else {
            ok()
        }
    }))
    .await;
    let sink = fake.sink("");
    let mut tasks = Vec::new();
    for i in 0..5 {
        let sink = sink.clone();
        tasks.push(tokio::spawn(async move {
            sink.sink
                .deliver(&delivery(i, Some("device"), NOTE, 0))
                .await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), Outcome::Delivered);
    }
    // Five sends saw token 1 refused: one refresh between them, each resent once.
    assert_eq!(fake.tokens.issued(), 2);
    let used: Vec<usize> = fake.fcm.all().iter().map(token_number).collect();
    assert_eq!(used.len(), 10, "{used:?}");
    assert_eq!(used.iter().filter(|n| **n == 1).count(), 5);
    assert_eq!(used.iter().filter(|n| **n == 2).count(), 5);

    // FCM refuses every token: one refresh, one resend, then a configuration error.
    let fake = Fake::start(Arc::new(|_, _| {
        ResponseTemplate::new(401)
            .set_body_json(json!({"error": {"code": 401, "status": "UNAUTHENTICATED"}}))
    }))
    .await;
    let sink = fake.sink("");
    match deliver(&sink, "device", NOTE).await {
        Outcome::ConfigError { reason } => assert!(reason.contains("401"), "{reason}"),
        o => panic!("{o:?}"),
    }
    assert_eq!(fake.tokens.issued(), 2);
    assert_eq!(fake.fcm.len(), 2);
}

#[tokio::test]
async fn token_endpoint_failures() {
    let fake = Fake::start(Arc::new(|_, _| ok())).await;
    // Signed with a key Google does not know: invalid_grant is a configuration error.
    let stranger = sink_from_toml(&fake.toml(other_key(), &fake.server.uri(), ""), "push");
    match deliver(&stranger, "device", NOTE).await {
        Outcome::ConfigError { reason } => {
            assert!(reason.contains("invalid_grant"), "{reason}");
            assert!(reason.contains("400"), "{reason}");
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(fake.tokens.refused().len(), 1);
    assert_eq!(fake.fcm.len(), 0);

    // A token endpoint in trouble: retry.
    *fake.tokens.forced.lock().unwrap() = Some(ResponseTemplate::new(503).set_body_string("busy"));
    let sink = fake.sink("");
    match deliver(&sink, "device", NOTE).await {
        Outcome::Retry { reason, .. } => assert!(reason.contains("503"), "{reason}"),
        o => panic!("{o:?}"),
    }
    *fake.tokens.forced.lock().unwrap() =
        Some(ResponseTemplate::new(200).set_delay(Duration::from_secs(4)));
    match deliver(&sink, "device", NOTE).await {
        Outcome::Retry { reason, .. } => assert!(reason.contains("timed out"), "{reason}"),
        o => panic!("{o:?}"),
    }
    assert_eq!(fake.fcm.len(), 0);
}

#[test]
fn configuration_errors_name_the_key() {
    let base = "[sinks.push]\nkind = \"fcm\"\n";
    let e = config_error(base);
    assert!(e.starts_with("sinks.push.credentials_file:"), "{e}");
    let e = config_error(&format!(
        "{base}project_id = \"demo\"\ncredentials_json = '''{{\"client_email\":\"a@b\",\"private_key\":\"MIIEvQ-TOPSECRET\"}}'''\n"
    ));
    assert!(e.starts_with("sinks.push.credentials_json:"), "{e}");
    assert!(!e.contains("TOPSECRET"), "{e}");
    let e = config_error(&format!("{base}credentials_file = \"/nonexistent.json\"\n"));
    assert!(e.starts_with("sinks.push.credentials_file:"), "{e}");
    let e = config_error(&format!("{base}credential_file = \"x\"\n"));
    assert!(e.starts_with("sinks.push.credential_file:"), "{e}");
    let json = json!({"client_email": EMAIL, "private_key": service_key().private_pem}).to_string();
    let e = config_error(&format!("{base}credentials_json = '''{json}'''\n"));
    assert!(e.starts_with("sinks.push.project_id:"), "{e}");
    let e = config_error(&format!(
        "{base}credentials_json = '''{json}'''\nproject_id = \"demo\"\nendpoint = \"fcm.googleapis.com\"\n"
    ));
    assert!(e.starts_with("sinks.push.endpoint:"), "{e}");
}

/// The relay binary: a 429 pauses the whole sink (no request reaches FCM during the pause,
/// the throttled row keeps its attempts), bad rows fail alone, and at RUST_LOG=debug neither
/// the private key nor an access token appears in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_pauses_the_sink_and_no_secret_is_logged() {
    let fake = Fake::start(Arc::new(|seen, n| {
        if n == 1 {
            return fcm_error(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED")
                .insert_header("retry-after", "2");
        }
        match seen.json()["message"]["token"].as_str() {
            Some("gone") => fcm_error(404, "NOT_FOUND", "UNREGISTERED"),
            _ => ok(),
        }
    }))
    .await;
    let outbox = Outbox::create().await;
    let key_file = outbox.write("sa.json", &fake.credentials(service_key()));
    let config = outbox.write(
        "relay.toml",
        &format!(
            "[relay]\npoll_interval = \"50ms\"\n\n[lease]\nbackend = \"none\"\n\n\
             [retry]\ninitial_backoff = \"1s\"\nmax_backoff = \"2s\"\nmax_attempts = 3\n\n\
             [sinks.push]\nkind = \"fcm\"\ncredentials_file = \"{}\"\nendpoint = \"{}\"\n\
             timeout = \"5s\"\n",
            key_file.display(),
            fake.server.uri()
        ),
    );
    let first = outbox.enqueue("push", "device-a", NOTE).await;
    let mut relay = Relay::start(&outbox, &config);

    let deadline = Instant::now() + Duration::from_secs(20);
    while fake.fcm.len() == 0 {
        assert!(
            Instant::now() < deadline,
            "no request; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let throttled_at = fake.fcm.all()[0].at;
    // Another row for the same sink while it is paused.
    let second = outbox.enqueue("push", "device-b", NOTE).await;
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(throttled_at.elapsed())).await;
    assert_eq!(
        fake.fcm.len(),
        1,
        "a request reached FCM during the 2s pause; log:\n{}",
        relay.log()
    );
    let (status, attempts, error) = outbox.row(first).await;
    assert_eq!((status.as_str(), attempts), ("PENDING", 0), "{error:?}");
    assert!(error.unwrap_or_default().contains("429"));

    outbox
        .wait_status(&relay, first, "SUCCESS", Duration::from_secs(15))
        .await;
    outbox
        .wait_status(&relay, second, "SUCCESS", Duration::from_secs(15))
        .await;
    let seen = fake.fcm.all();
    for s in &seen[1..] {
        let gap = s.at - throttled_at;
        assert!(
            gap >= Duration::from_millis(1900),
            "sent {gap:?} into a 2s pause"
        );
    }
    assert_eq!(
        outbox.row(first).await.1,
        1,
        "the throttle counted no attempt"
    );

    // Rows that fail: a dead token (FCM answers), a bad message (never sent).
    let gone = outbox.enqueue("push", "gone", NOTE).await;
    let bad = outbox
        .enqueue("push", "device-c", r#"{"data":{"n":1}}"#)
        .await;
    outbox
        .wait_status(&relay, gone, "FAILED", Duration::from_secs(15))
        .await;
    outbox
        .wait_status(&relay, bad, "FAILED", Duration::from_secs(15))
        .await;
    assert!(outbox.row(gone).await.2.unwrap().contains("UNREGISTERED"));
    assert!(
        outbox
            .row(bad)
            .await
            .2
            .unwrap()
            .contains("must be a string")
    );
    relay.stop().await;

    let log = relay.log();
    assert!(log.contains("sink paused"), "{log}");
    assert!(log.contains("DEBUG"), "the log was not at debug level");
    let key_body: String = service_key()
        .private_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    relay.assert_log_free_of(&[&key_body, TOKEN_MARK]);
}
