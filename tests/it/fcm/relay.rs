//! Through the relay binary: configuration errors name the key, and a 429 pauses the sink
//! with no secret in the log.

use super::*;

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

/// The relay's config: a 50 ms poll, no lease, retries 1 to 2 s apart (3 attempts), and the
/// sink `push` on `fake` with the key file `key_file`.
fn relay_toml(fake: &Fake, key_file: &std::path::Path) -> String {
    format!(
        "[relay]\npoll_interval = \"50ms\"\n\n[lease]\nbackend = \"none\"\n\n\
         [retry]\ninitial_backoff = \"1s\"\nmax_backoff = \"2s\"\nmax_attempts = 3\n\n\
         [sinks.push]\nkind = \"fcm\"\ncredentials_file = \"{}\"\nendpoint = \"{}\"\n\
         timeout = \"5s\"\n",
        key_file.display(),
        fake.server.uri()
    )
}

/// Rows that fail: a dead token (FCM answers), a bad message (never sent).
async fn bad_rows_fail_alone(outbox: &Outbox, relay: &Relay) {
    let gone = outbox.enqueue("push", "gone", NOTE).await;
    let bad = outbox
        .enqueue("push", "device-c", r#"{"data":{"n":1}}"#)
        .await;
    outbox
        .wait_status(relay, gone, "FAILED", Duration::from_secs(15))
        .await;
    outbox
        .wait_status(relay, bad, "FAILED", Duration::from_secs(15))
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
}

/// The service key's private PEM without its armour lines: what a leaked key would show.
fn private_key_body() -> String {
    service_key()
        .private_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect()
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
    let config = outbox.write("relay.toml", &relay_toml(&fake, &key_file));
    let first = outbox.enqueue("push", "device-a", NOTE).await;
    let mut relay = Relay::start(&outbox, &config);

    until_or(
        Duration::from_secs(20),
        async || fake.fcm.len() != 0,
        || format!("no request; log:\n{}", relay.log()),
    )
    .await;
    let throttled_at = fake.fcm.all()[0].at;
    // Another row for the same sink while it is paused.
    let second = outbox.enqueue("push", "device-b", NOTE).await;
    // Watch 1.5 s of the 2 s pause: no request may reach FCM in it.
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

    bad_rows_fail_alone(&outbox, &relay).await;
    relay.stop().await;

    let log = relay.log();
    assert!(log.contains("sink paused"), "{log}");
    assert!(log.contains("DEBUG"), "the log was not at debug level");
    relay.assert_log_free_of(&[&private_key_body(), TOKEN_MARK]);
}
