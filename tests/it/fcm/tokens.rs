//! The access token: minted once and reused, refreshed early and on expiry, renewed once
//! after a 401, and what a failing token endpoint does.

use super::*;

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
