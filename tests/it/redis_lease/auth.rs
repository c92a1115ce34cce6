//! The `redis` lease with AUTH: the right password (and an ACL user) acquires, a wrong one
//! does not, and neither is ever logged.

use super::*;

const GOOD: &str = "s3cret-pass-7d1e";
const BAD: &str = "wrong-pw-91c3";
const ACL_PW: &str = "acl-pw-4b2f";

/// The relay with the wrong password (`bad`) after its tries: running, not delivering, not
/// holding, not ready, saying why, and never showing the password.
async fn assert_kept_out_without_a_word(
    bad: &mut RelayProc,
    redis: &RedisServer,
    td: &TestDb,
    rx: &Receiver,
) {
    let lease = &td.table;
    assert!(
        bad.running(),
        "a wrong Redis password must not crash the relay"
    );
    assert_eq!(rx.len(), 0, "a relay with a wrong password delivered");
    assert_eq!(redis.get(lease).await, None, "the lease key must not exist");
    assert!(
        td.lease_row(lease).await.is_none_or(|(_, e)| e == 0),
        "no epoch bump without the lease"
    );
    let log = bad.log_text();
    let lower = log.to_lowercase();
    assert!(
        lower.contains("wrongpass") || lower.contains("auth") || lower.contains("password"),
        "the relay must log why it cannot use Redis:\n{log}"
    );
    assert!(
        !log.contains(BAD),
        "the relay logged the Redis password:\n{log}"
    );
    let (code, body) = bad.readyz().await;
    assert_ne!(
        code, 200,
        "a relay that cannot use Redis must not be ready: {body}"
    );
    assert!(
        !body.contains(BAD),
        "/readyz shows the Redis password: {body}"
    );
}

/// An ACL user `relay` with its own password.
async fn acl_user(redis: &RedisServer) {
    let reply = redis
        .cmd(&[
            "ACL",
            "SETUSER",
            "relay",
            "on",
            &format!(">{ACL_PW}"),
            "~*",
            "&*",
            "+@all",
        ])
        .await
        .expect("ACL SETUSER");
    assert_eq!(reply.text(), Some("OK"), "ACL SETUSER: {reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_password_is_used_and_never_logged() {
    let Some((redis, td, rx)) = setup("rl_auth", &["--requirepass", GOOD]).await else {
        return;
    };
    let knobs = Knobs::fast();
    let lease = td.table.clone();
    let port = redis.port();
    td.insert_hooks(10).await;
    let t0 = Instant::now();

    // Wrong password alone: never acquires.
    let bad_url = format!("redis://:{BAD}@127.0.0.1:{port}");
    let mut bad = start_relay(&td, &knobs, &rx, &bad_url, &lease, "bad");
    // 2.5 s of its tries (a wrong password is refused each time), in which it must neither
    // crash nor deliver.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_kept_out_without_a_word(&mut bad, &redis, &td, &rx).await;

    // The right password: acquires and delivers.
    let good_url = format!("redis://:{GOOD}@127.0.0.1:{port}");
    let mut good = start_relay(&td, &knobs, &rx, &good_url, &lease, "good");
    td.wait_all_success(Duration::from_secs(15)).await;
    let h = only_sender(&rx.requests(), t0, "with AUTH");
    assert_eq!(h, "good");
    let token = redis.get(&lease).await.expect("lease key");
    assert!(token.starts_with("good#"), "key holds {token:?}");
    assert_eq!(td.lease_row(&lease).await.and_then(|(h, _)| h), Some(token));
    assert_eq!(
        good.readyz().await.0,
        200,
        "the relay with the right password is ready"
    );
    // Its subscriber authenticated too: it listens for releases (the other one cannot).
    let numsub = redis
        .cmd(&["PUBSUB", "NUMSUB", &format!("{lease}:released")])
        .await
        .expect("PUBSUB NUMSUB");
    assert!(
        matches!(&numsub, crate::support::redis::Resp::Array(Some(v)) if v.get(1).and_then(|x| x.int()) == Some(1)),
        "exactly the authenticated relay subscribes to the release channel: {numsub:?}"
    );

    // An ACL user with its own password.
    acl_user(&redis).await;
    good.signal("TERM");
    let status = good.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success());
    let acl_url = format!("redis://relay:{ACL_PW}@127.0.0.1:{port}");
    let acl = start_relay(&td, &knobs, &rx, &acl_url, &lease, "acl");
    td.insert_hooks(5).await;
    td.wait_all_success(Duration::from_secs(15)).await;
    let token = redis.get(&lease).await.expect("lease key");
    assert!(
        token.starts_with("acl#"),
        "the ACL user's relay must hold the lease, key holds {token:?}"
    );
    let late: Vec<String> = rx
        .requests()
        .iter()
        .filter(|r| sender(r) == "bad")
        .map(|r| format!("{r:?}"))
        .collect();
    assert!(
        late.is_empty(),
        "the relay with a wrong password delivered: {late:?}"
    );

    for (r, secret) in [(&bad, BAD), (&good, GOOD), (&acl, ACL_PW)] {
        assert!(
            !r.log_text().contains(secret),
            "relay {} logged its Redis password:\n{}",
            r.name,
            r.log_text()
        );
    }
    assert!(
        bad.running(),
        "the relay with a wrong password keeps retrying"
    );
}
