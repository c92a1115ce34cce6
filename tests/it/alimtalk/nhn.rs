//! NHN Cloud: the request's fields, its result codes, the idempotency key, bad rows and an
//! unreachable vendor.

use super::*;

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
