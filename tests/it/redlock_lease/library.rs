//! The `RedlockLease` itself, at library level: an acquire that gets only a minority fails and
//! leaves no key behind, renew, release and ping need a quorum, a stalled node costs one node
//! timeout; and the relay's checks of a redlock configuration.

use super::*;

// ---------------------------------------------------------------------------------------------
// 5. Library level.

/// A `RedlockLease` on `nodes` (ttl 10 s, renew_timeout 1 s: node timeout 333 ms), once a
/// quorum answers PING.
async fn library_lease(nodes: &[RedisServer], name: &str, id: &str) -> RedlockLease {
    let urls: Vec<String> = nodes.iter().map(|n| n.url()).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let lease = RedlockLease::connect(
        &urls,
        name,
        id,
        Duration::from_secs(10),
        Duration::from_secs(1),
    )
    .expect("connect");
    until_or(
        Duration::from_secs(10),
        async || lease.ping().await.is_ok(),
        || "no quorum answers PING".into(),
    )
    .await;
    lease
}

/// Acquires, retrying errors (nodes reconnecting) for up to 10 s.
async fn acquire(lease: &RedlockLease) -> bool {
    let acquired = until_reads(
        Duration::from_secs(10),
        async || {
            let got = lease.try_acquire().await;
            if let Err(e) = &got {
                eprintln!("acquire: {e:#}; retrying");
            }
            got
        },
        Result::is_ok,
        |got| format!("acquire kept failing: {:#}", got.expect_err("an error")),
    )
    .await;
    acquired.expect("acquired").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_acquire_leaves_no_key_and_operations_need_a_quorum() {
    let Some(mut nodes) = three_nodes(&["--enable-debug-command", "yes"]).await else {
        return;
    };
    let name = unique_table("rk_lib");

    // (a) A foreign key on nodes 0 and 1: the attempt gets node 2 only, fails, and gives it back.
    for n in &nodes[..2] {
        n.cmd(&["SET", &name, "other", "PX", "10000"])
            .await
            .expect("SET");
    }
    let lease = library_lease(&nodes, &name, "lib").await;
    // The quorum answers PING before node 2's connection may be open (an attempt's SET to it
    // then fails at the client, or reaches it only later): attempt until node 2 saw one, every
    // attempt refused.
    until_or(
        Duration::from_secs(10),
        async || {
            assert!(!acquire(&lease).await, "a minority must not be a grant");
            calls(&nodes[2], "set").await >= 1
        },
        || "node 2 saw no SET".into(),
    )
    .await;
    assert_eq!(
        keys(&mut nodes, &name).await,
        vec![Some("other".into()), Some("other".into()), None],
        "a failed acquire must leave no key of ours behind (the foreign ones untouched)"
    );

    // (b) Nodes 0 and 1 down: node 2 is taken, then given back; the attempt fails in bounded time.
    two_nodes_down_refuse_acquire(&mut nodes, &lease, &name).await;

    // (c) Back up (empty): acquired with one token, on every node that answered in time (a
    //     grant needs a majority; on a loaded machine one node's SET can miss its timeout, and
    //     that node then holds nothing, never another value); renewed.
    for n in &mut nodes[..2] {
        n.restart().await;
    }
    let lease = library_lease(&nodes, &name, "lib").await;
    assert!(acquire(&lease).await, "all nodes free: acquired");
    let token = lease.holder();
    assert!(token.starts_with("lib#"), "holder token {token:?}");
    let held = keys(&mut nodes, &name).await;
    assert!(
        held.iter()
            .filter(|k| k.as_deref() == Some(token.as_str()))
            .count()
            >= 2
            && held
                .iter()
                .all(|k| k.is_none() || k.as_deref() == Some(token.as_str())),
        "the token must be on a majority and nothing else anywhere: {held:?}"
    );
    assert!(
        lease.renew().await.expect("renew"),
        "renewal with all nodes"
    );

    // (d) A stalled node costs one node timeout, not the ttl.
    stalled_node_costs_one_node_timeout(&nodes, &lease).await;

    // (e) The key gone on 2 of 3 nodes (expired, or another's): lost; never re-created; our
    //     leftover on the third is tidied.
    for n in &nodes[..2] {
        n.cmd(&["DEL", &name]).await.expect("DEL");
    }
    assert!(!lease.renew().await.expect("renew"), "2 refusals: lost");
    until_or(
        Duration::from_secs(2),
        async || nodes[2].get(&name).await.is_none(),
        || "the leftover on node 2 was not removed".into(),
    )
    .await;
    assert_eq!(
        keys(&mut nodes, &name).await,
        vec![None, None, None],
        "re-created"
    );

    // (f) One node down: acquire, renew, ping work; two down: renew is unknown (Err), ping fails.
    assert!(acquire(&lease).await);
    nodes[0].kill();
    assert!(lease.renew().await.expect("renew with 2 of 3"));
    assert!(lease.ping().await.is_ok(), "ping with 2 of 3");
    nodes[1].kill();
    let r = lease.renew().await;
    assert!(r.is_err(), "renew with 1 of 3 must be unknown, got {r:?}");
    // Release still deletes what it can reach (and reports the rest).
    let r = lease.release().await;
    assert!(r.is_err(), "an incomplete release is reported: {r:?}");
    assert_eq!(
        nodes[2].get(&name).await,
        None,
        "release on the reachable node"
    );
}

/// (b) Nodes 0 and 1 down: node 2 is taken, then given back; the attempt fails in bounded time.
async fn two_nodes_down_refuse_acquire(
    nodes: &mut [RedisServer],
    lease: &RedlockLease,
    name: &str,
) {
    for n in &mut nodes[..2] {
        n.kill();
    }
    let before = calls(&nodes[2], "set").await;
    let t = Instant::now();
    let r = lease.try_acquire().await;
    let took = t.elapsed();
    let shown = match &r {
        Ok(g) => format!("{g:?}"),
        Err(e) => format!("Err({e:#})"),
    };
    println!("MEASURED redlock acquire with 2 of 3 nodes down: {shown} after {took:?}");
    assert!(
        r.is_err(),
        "no quorum must be an error (unknown), got {shown}"
    );
    assert!(took < Duration::from_secs(1), "the attempt took {took:?}");
    assert_eq!(
        calls(&nodes[2], "set").await,
        before + 1,
        "node 2 got the SET"
    );
    assert_eq!(
        nodes[2].get(name).await,
        None,
        "the minority key was left behind"
    );
    assert!(
        lease.ping().await.is_err(),
        "ping with 1 of 3 nodes must fail"
    );
}

/// (d) A stalled node costs one node timeout, not the ttl.
async fn stalled_node_costs_one_node_timeout(nodes: &[RedisServer], lease: &RedlockLease) {
    let stalled = nodes[2].port();
    let sleeper = tokio::spawn(async move {
        let _ = crate::support::redis::command(stalled, None, &["DEBUG", "SLEEP", "1.5"]).await;
    });
    until("node 3 stalled", Duration::from_secs(1), async || {
        tokio::time::timeout(Duration::from_millis(50), nodes[2].cmd(&["PING"]))
            .await
            .is_err()
    })
    .await;
    let t = Instant::now();
    let renewed = lease.renew().await;
    println!(
        "MEASURED redlock renewal with one node stalled: {renewed:?} after {:?}",
        t.elapsed()
    );
    assert!(matches!(renewed, Ok(true)), "2 of 3 renew: {renewed:?}");
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "renewal waited for the stalled node"
    );
    sleeper.await.expect("sleeper");
}

// ---------------------------------------------------------------------------------------------
// 6. Configuration: redlock needs at least 3 distinct redis:// or rediss:// URLs.

#[test]
fn redlock_configuration_is_validated() {
    use outbox_relay::config::Settings;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, "").expect("write config");
    let load = |urls: &str| {
        let env = [
            ("OUTBOX_RELAY__LEASE__BACKEND", "redlock"),
            ("OUTBOX_RELAY__LEASE__REDLOCK_URLS", urls),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Settings::load_with_env(Some(&path), Some(env))
    };
    let good = "redis://r1:6379,rediss://:pw@r2:6380,redis://r3:6379";
    let s = load(good).unwrap_or_else(|e| panic!("3 nodes must load: {e}"));
    assert_eq!(s.lease.redlock_urls.len(), 3);
    for (urls, want) in [
        ("", "needs at least 3"),
        ("redis://r1:6379,redis://r2:6379", "needs at least 3"),
        (
            "redis://r1:6379,http://r2:6379,redis://r3:6379",
            "entry 1 must start",
        ),
        (
            "redis://:secret@r1:6379,redis://r2:6379,redis://:secret@r1:6379",
            "entries 0 and 2 are the same URL",
        ),
    ] {
        let e = match load(urls) {
            Ok(_) => panic!("{urls:?} must be refused"),
            Err(e) => e,
        };
        assert_eq!(e.key, "lease.redlock_urls", "{urls:?}: {e}");
        assert!(e.problem.contains(want), "{urls:?}: {e}");
        assert!(!e.to_string().contains("secret"), "a password leaked: {e}");
    }
}
