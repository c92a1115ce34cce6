//! Solapi: every request signed afresh, and its status codes.

use super::*;

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
