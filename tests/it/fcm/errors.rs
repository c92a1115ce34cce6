//! FCM's error classes, and messages refused before any request.

use super::*;

/// The fake FCM's answer for each error class, chosen by the message's token; any other
/// token is sent.
fn answer_by_token(seen: &Seen) -> ResponseTemplate {
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
}

/// `o` is a permanent failure whose reason contains `what`.
fn assert_permanent(o: &Outcome, what: &str) {
    assert!(
        matches!(o, Outcome::Permanent { reason } if reason.contains(what)),
        "{what}: {o:?}"
    )
}

/// `o` is a configuration error whose reason contains `what`.
fn assert_config_error(o: &Outcome, what: &str) {
    assert!(
        matches!(o, Outcome::ConfigError { reason } if reason.contains(what)),
        "{what}: {o:?}"
    )
}

/// A loopback port nothing listens on (bound, then let go).
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn every_fcm_error_class() {
    let fake = Fake::start(Arc::new(|seen, _| answer_by_token(seen))).await;
    let sink = fake.sink("");
    assert_permanent(&deliver(&sink, "unregistered", NOTE).await, "UNREGISTERED");
    assert_permanent(&deliver(&sink, "invalid", NOTE).await, "INVALID_ARGUMENT");
    assert_permanent(
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
    assert_config_error(
        &deliver(&sink, "apns", NOTE).await,
        "THIRD_PARTY_AUTH_ERROR",
    );
    assert_config_error(&deliver(&sink, "denied", NOTE).await, "PERMISSION_DENIED");
    assert_config_error(&deliver(&sink, "notfound", NOTE).await, "project_id");
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
    let port = dead_port();
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
