//! Both vendors through the relay binary: configuration errors name the key, every outcome
//! reaches the table, and no secret reaches the log.

use super::*;

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
    let (status, attempts, _) = until_reads(
        wait,
        async || outbox.row(sol_denied).await,
        |(_, _, error)| error.as_deref().unwrap_or("").contains("InvalidAPIKey"),
        |_| format!("no config error; log:\n{}", relay.log()),
    )
    .await;
    assert_eq!((status.as_str(), attempts), ("PENDING", 0));
    relay.stop().await;
    assert_eq!(nhn.problems(), Vec::<String>::new());
    assert_eq!(sol.problems(), Vec::<String>::new());
    let log = relay.log();
    assert!(log.contains("sink configuration error"), "{log}");
    assert!(log.contains("outcome unknown"), "{log}");
    relay.assert_log_free_of(&[SECRET_KEY, API_SECRET]);
}
