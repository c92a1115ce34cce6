//! Fault tests of the `redlock` lease: three `redis-server` processes on free ports (stopped and
//! restarted at will), real `outbox-relay run` processes on their own PostgreSQL table and lease
//! name, and a loopback webhook receiver. Every relay's sink sends an `x-relay` header naming
//! its instance, so the receiver knows who sent each request and when.
//!
//! 1. two relays, exactly one delivers; kill -9 the holder: the other delivers within
//!    ttl + ttl/3 + slack (the measured failover is printed);
//! 2. one node of three down: the lease still works (quorum 2/3); two down: the holder stops by
//!    its deadline and nobody holds; both back: exactly one holds again;
//! 3. a foreign client's key on 2 of 3 nodes keeps the relays out until it expires, without
//!    busy retrying; the relay's key keeps a foreign client out;
//! 4. SIGTERM of the holder: the successor delivers within 300 ms of the old holder's exit;
//! 5. library level: an acquire that takes only a minority of nodes (foreign keys, or nodes
//!    down) fails and leaves no key behind; renew/release/ping need a quorum; a stalled node
//!    costs an acquire one node timeout, not the ttl.

use std::time::{Duration, Instant};

use crate::support::config::Config;
use crate::support::process::*;
use crate::support::receiver::{Received, Receiver, only_sender, sender, senders, timeline};
use crate::support::redis::RedisServer;
use crate::support::*;
use outbox_relay::lease::{Lease, RedlockLease};

/// The relays' lease ttl and renew timeout (node timeout: min(200/3, 100) = 66 ms).
const TTL: Duration = Duration::from_secs(1);
/// 300 ms gives each node min(renew_timeout / 3, ttl / 10) = 100 ms: with less, a loaded CI
/// machine can time out renewals to one live node until its key lapses there (a renewal
/// with 2 of 3 answers still counts), which a one-node-down test then sees as a lost quorum.
const RENEW_TIMEOUT: Duration = Duration::from_millis(300);

/// Starts instance `name` on `td`'s table with the redlock lease `lease` on `nodes`.
fn start_relay(
    td: &TestDb,
    ttl: Duration,
    rx: &Receiver,
    nodes: &[RedisServer],
    lease: &str,
    name: &str,
) -> RelayProc {
    let urls: Vec<String> = nodes.iter().map(|n| n.url()).collect();
    let config = Config::webhook(&rx.url())
        .claim_ttl(Duration::from_secs(7))
        .shutdown_timeout(Duration::from_secs(5))
        .in_flight(4)
        .retry(Duration::from_millis(200), Duration::from_secs(1), 20)
        .redlock_lease(&urls, ttl, RENEW_TIMEOUT)
        .lease_name(lease)
        .hook(|s| s.timeout(Duration::from_secs(2)).header("x-relay", name));
    RelayProc::start(td, &config, name)
}

/// Three redis-servers (`None`: skipped). `extra` goes to every server.
async fn three_nodes(extra: &[&str]) -> Option<Vec<RedisServer>> {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(RedisServer::start(extra).await?);
    }
    Some(nodes)
}

/// Three nodes, the test's PostgreSQL table and a receiver (`None`: skipped).
/// The relay-process tests of this file run one at a time: each starts three redis-servers and
/// two or three relays on a 1 s ttl, and several at once on a 2-core machine starve the 100 ms
/// per-node timeouts they measure. (A tokio mutex: no poisoning when a test fails.)
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn setup(prefix: &str) -> Option<(Vec<RedisServer>, TestDb, Receiver)> {
    let nodes = three_nodes(&[]).await?;
    let td = TestDb::open(Db::Postgres, prefix).await?;
    Some((nodes, td, Receiver::start(None).await))
}

/// The lease key on every running node (`None` for absent, or for a node that is down).
async fn keys(nodes: &mut [RedisServer], key: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for n in nodes.iter_mut() {
        out.push(if n.running() { n.get(key).await } else { None });
    }
    out
}

/// Asserts that a majority of nodes, the fencing row and the metrics agree `holder` holds.
async fn assert_holder(
    nodes: &mut [RedisServer],
    td: &TestDb,
    lease: &str,
    relays: &[RelayProc],
    holder: &str,
) {
    let ks = keys(nodes, lease).await;
    let (token, _) = assert_fenced_holder(td, lease, relays, holder).await;
    let on = ks.iter().filter(|k| k.as_deref() == Some(&token)).count();
    assert!(
        on >= 2,
        "the holder's token {token:?} must be on a majority of nodes, keys: {ks:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Crash of the holder: failover within ttl + one renewal interval.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_of_holder_fails_over_within_ttl_plus_renewal() {
    let _serial = SERIAL.lock().await;
    let Some((mut nodes, td, rx)) = setup("rk_crash").await else {
        return;
    };
    let lease = td.table.clone();
    let t0 = Instant::now();
    let mut relays: Vec<RelayProc> = ["a", "b"]
        .iter()
        .map(|n| start_relay(&td, TTL, &rx, &nodes, &lease, n))
        .collect();
    let feeder = Feeder::start(td.store.clone(), Duration::from_millis(10));

    rx.expect_requests(1, Duration::from_secs(15), "first delivery")
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let h = only_sender(&rx.requests(), t0, "two relays running");
    assert_holder(&mut nodes, &td, &lease, &relays, &h).await;
    let (_, epoch1) = td.lease_row(&lease).await.expect("row");

    // kill -9 the holder; rows keep arriving.
    let (t_kill, s) = kill_holder_and_check_failover(&mut relays, &rx, &h, TTL, t0).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Requests of the killed relay already on the wire at the kill (arriving within the 50 ms
    // the failover check allows) are not deliveries after the crash.
    let after: Vec<Received> = rx
        .requests()
        .into_iter()
        .filter(|r| r.at > t_kill)
        .filter(|r| !(sender(r) == h && r.at <= t_kill + Duration::from_millis(50)))
        .collect();
    assert_eq!(only_sender(&after, t0, "after the crash"), s);
    let survivors: Vec<RelayProc> = relays.drain(..).filter(|r| r.name != h).collect();
    assert_holder(&mut nodes, &td, &lease, &survivors, &s).await;
    let (_, epoch2) = td.lease_row(&lease).await.expect("row");
    assert_eq!(epoch2, epoch1 + 1, "one takeover bumps the epoch once");
    feeder.stop().await;
    td.wait_all_success(Duration::from_secs(15)).await;
}

// ---------------------------------------------------------------------------------------------
// 2. Node outages: one of three down is tolerated; two down stop the holder by its deadline
//    and nobody holds; both back: exactly one holds again.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_is_tolerated_two_down_stop_the_holder() {
    let _serial = SERIAL.lock().await;
    let Some((mut nodes, td, rx)) = setup("rk_nodes").await else {
        return;
    };
    let lease = td.table.clone();
    let t0 = Instant::now();
    let relays: Vec<RelayProc> = ["a", "b"]
        .iter()
        .map(|n| start_relay(&td, TTL, &rx, &nodes, &lease, n))
        .collect();
    let feeder = Feeder::start(td.store.clone(), Duration::from_millis(20));
    rx.expect_requests(1, Duration::from_secs(15), "first delivery")
        .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let h = only_sender(&rx.requests(), t0, "all nodes up");
    let (_, epoch1) = td.lease_row(&lease).await.expect("row");

    // A quorum is two of three, so the lease may have been taken while one node's connection
    // was still being set up: its key is then on two nodes only, and a renewal never writes
    // it on the third (it may not be ours there). Losing either of those two is a quorum
    // loss, not what this step is about; the node taken down first is one whose loss leaves
    // the holder's key on two nodes.
    let (token, _) = assert_fenced_holder(&td, &lease, &relays, &h).await;
    let ks = keys(&mut nodes, &lease).await;
    let first = (0..nodes.len())
        .find(|&i| ks[i].as_deref() != Some(token.as_str()))
        .unwrap_or(0);
    let second = (0..nodes.len()).find(|&i| i != first).expect("three nodes");

    // One node down: the holder keeps renewing on the other two, for several ttls.
    let t_one = Instant::now();
    nodes[first].kill();
    tokio::time::sleep(TTL * 3).await;
    let during: Vec<Received> = rx.requests().into_iter().filter(|r| r.at > t_one).collect();
    assert_eq!(
        only_sender(&during, t0, "one node down"),
        h,
        "the holder must keep the lease with 2 of 3 nodes"
    );
    let last = during.iter().map(|r| r.at).max().expect("deliveries");
    assert!(
        Instant::now() - last < Duration::from_millis(500),
        "deliveries stalled with one node down\n{}",
        timeline(&during, t0)
    );
    assert_eq!(
        td.lease_row(&lease).await.expect("row").1,
        epoch1,
        "no re-acquisition with one node down"
    );
    assert_holder(&mut nodes, &td, &lease, &relays, &h).await;
    for r in &relays {
        let (code, body) = r.readyz().await;
        assert_eq!(
            code, 200,
            "relay {} not ready with 2 of 3 nodes: {body}",
            r.name
        );
    }

    // Two down: no quorum. The holder stops by its deadline; nobody holds.
    let t_two = Instant::now();
    nodes[second].kill();
    tokio::time::sleep(TTL + Duration::from_millis(1000)).await;
    let reqs = rx.requests();
    let during: Vec<&Received> = reqs.iter().filter(|r| r.at > t_two).collect();
    let last = during.iter().map(|r| r.at).max();
    println!(
        "MEASURED redlock quorum loss: the holder's last request {} after the second node went \
         down (ttl {TTL:?})",
        last.map(|t| format!("{:.0} ms", delta_ms(t_two, t)))
            .unwrap_or_else(|| "never".into())
    );
    let late: Vec<String> = during
        .iter()
        .filter(|r| r.at > t_two + TTL + Duration::from_millis(150))
        .map(|r| format!("{} at +{:.0}ms", sender(r), delta_ms(t_two, r.at)))
        .collect();
    assert!(
        late.is_empty(),
        "requests after the holder's deadline: {late:?}"
    );
    assert!(
        senders(during.iter().copied()).iter().all(|s| *s == h),
        "only the old holder may send once the quorum is gone"
    );
    for r in &relays {
        assert_eq!(
            r.metric("outbox_relay_lease_held").await,
            0.0,
            "relay {} holds without a quorum",
            r.name
        );
        let (code, body) = r.readyz().await;
        assert_ne!(code, 200, "relay {} ready without a quorum: {body}", r.name);
    }
    assert!(
        relays[relays.iter().position(|r| r.name == h).expect("h")]
            .log_text()
            .contains("lease lost"),
        "the holder must log the loss"
    );

    // Both back (empty): exactly one holds again.
    let t_up = Instant::now();
    nodes[first].restart().await;
    nodes[second].restart().await;
    let resumed = rx
        .wait_until(
            |reqs| reqs.iter().any(|r| r.at > t_up),
            Duration::from_secs(12),
        )
        .await;
    assert!(resumed, "no delivery within 12s of the nodes coming back");
    let first = rx
        .requests()
        .into_iter()
        .find(|r| r.at > t_up)
        .expect("first delivery after the restart");
    println!(
        "MEASURED redlock recovery: delivery resumed {:.0} ms after the nodes came back",
        delta_ms(t_up, first.at)
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after: Vec<Received> = rx.requests().into_iter().filter(|r| r.at > t_up).collect();
    let n = only_sender(&after, t0, "after the nodes came back");
    assert_holder(&mut nodes, &td, &lease, &relays, &n).await;
    feeder.stop().await;
    td.wait_all_success(Duration::from_secs(15)).await;
}

// ---------------------------------------------------------------------------------------------
// 3. A foreign client's key on 2 of 3 nodes keeps the relays out until it expires.

/// `INFO commandstats` calls of `cmd` on a node (0 when never called).
async fn calls(node: &RedisServer, cmd: &str) -> u64 {
    let info = node.cmd(&["INFO", "commandstats"]).await.expect("INFO");
    let text = info.text().unwrap_or_default().to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_key_on_a_majority_keeps_relays_out_until_it_expires() {
    let _serial = SERIAL.lock().await;
    let Some((mut nodes, td, rx)) = setup("rk_foreign").await else {
        return;
    };
    let lease = td.table.clone();
    let t0 = Instant::now();
    for n in &nodes[..2] {
        let r = n
            .cmd(&["SET", &lease, "other", "NX", "PX", "3000"])
            .await
            .expect("SET");
        assert_eq!(r.text(), Some("OK"), "foreign SET NX: {r:?}");
    }
    let t_set = Instant::now();
    td.insert_hooks(20).await;
    let relays: Vec<RelayProc> = ["a", "b"]
        .iter()
        .map(|n| start_relay(&td, TTL, &rx, &nodes, &lease, n))
        .collect();

    tokio::time::sleep_until((t0 + Duration::from_millis(2500)).into()).await;
    assert_eq!(rx.len(), 0, "a relay delivered while the foreign key lives");
    assert!(
        td.lease_row(&lease)
            .await
            .is_none_or(|(_, epoch)| epoch == 0),
        "no relay may have acquired while a foreign client holds 2 of 3 nodes"
    );
    for r in &relays {
        assert!(
            r.log_text().contains("relay started"),
            "relay {} is not up yet, the test would prove nothing",
            r.name
        );
    }
    // Standbys wait for the keys' PTTL: a few attempts each, not a busy loop.
    let attempts = calls(&nodes[2], "set").await;
    println!("foreign key: {attempts} SET attempts on the free node while it was held");
    assert!(
        (1..=12).contains(&attempts),
        "standbys made {attempts} acquire attempts in 2.5s (expected a few, by PTTL)"
    );

    let got = rx
        .wait_until(|reqs| !reqs.is_empty(), Duration::from_secs(4))
        .await;
    assert!(got, "no delivery after the foreign key expired");
    let first = rx.requests()[0].clone();
    let expiry = t0 + Duration::from_millis(3000);
    println!(
        "MEASURED foreign key: first delivery {:.1} ms after the earlier foreign key expired",
        delta_ms(expiry, first.at)
    );
    assert!(
        first.at >= expiry,
        "a relay delivered before the foreign key expired"
    );
    assert!(
        first.at <= t_set + Duration::from_millis(3000) + TTL,
        "the relays took too long to notice the foreign key expired"
    );
    td.wait_all_success(Duration::from_secs(10)).await;
    let h = only_sender(&rx.requests(), t0, "after the foreign key expired");
    assert_holder(&mut nodes, &td, &lease, &relays, &h).await;

    // The relay's key keeps a foreign Redlock client out: its SET NX fails on a majority.
    // (Not necessarily on every node: when the standbys raced for the lease, the winner may
    // have found a node still holding a loser's key, and a grant needs only a quorum.)
    let mut refused = 0;
    for n in &nodes {
        let r = n
            .cmd(&["SET", &lease, "other", "NX", "PX", "3000"])
            .await
            .expect("SET");
        refused += usize::from(r.is_nil());
    }
    assert!(
        refused > nodes.len() / 2,
        "a foreign SET NX must fail on a majority while the relay holds: refused on {refused} of {}",
        nodes.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 4. SIGTERM of the holder: fast hand-off.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_over_within_300ms() {
    let _serial = SERIAL.lock().await;
    let Some((mut nodes, td, rx)) = setup("rk_term").await else {
        return;
    };
    // ttl 2s: a successor that missed the release messages would wait out a PTTL of at least
    // 2/3 of the ttl, far beyond the 300 ms allowed.
    let ttl = Duration::from_secs(2);
    let lease = td.table.clone();
    td.insert_hooks(200).await;
    rx.set_delay(Duration::from_millis(50));
    let t0 = Instant::now();
    let mut relays: Vec<RelayProc> = ["a", "b"]
        .iter()
        .map(|n| start_relay(&td, ttl, &rx, &nodes, &lease, n))
        .collect();
    rx.expect_requests(1, Duration::from_secs(15), "first delivery")
        .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let h = only_sender(&rx.requests(), t0, "two relays running");
    assert_holder(&mut nodes, &td, &lease, &relays, &h).await;
    let hi = relays.iter().position(|r| r.name == h).expect("holder");

    let t_term = Instant::now();
    relays[hi].sigterm();
    let (status, t_exit) = relays[hi].wait_exit_at(Duration::from_secs(10)).await;
    assert!(status.success(), "SIGTERM must exit 0, got {status:?}");
    assert!(
        relays[hi].log_text().contains("lease released"),
        "the old holder must release the lease on every node"
    );
    let moved = rx
        .wait_until(
            |reqs| reqs.iter().any(|r| r.at > t_term && sender(r) != h),
            Duration::from_secs(5),
        )
        .await;
    let reqs = rx.requests();
    assert!(moved, "no successor within 5s\n{}", timeline(&reqs, t0));
    let first = reqs
        .iter()
        .find(|r| r.at > t_term && sender(r) != h)
        .expect("successor's first delivery");
    let handoff = delta_ms(t_exit, first.at);
    println!(
        "MEASURED redlock graceful hand-off: {}'s first delivery {handoff:.1} ms after the old \
         holder's exit ({:.1} ms after SIGTERM)",
        sender(first),
        delta_ms(t_term, first.at)
    );
    assert!(
        handoff <= 300.0,
        "hand-off took {handoff:.1} ms (limit 300 ms)\n{}",
        timeline(&reqs, t0)
    );
    assert!(
        reqs.iter().all(|r| sender(r) != h || r.at <= t_exit),
        "the old holder sent after its exit"
    );
    td.wait_all_success(Duration::from_secs(20)).await;
    let counts = rx.count_by_id();
    assert_eq!(counts.len(), 200, "every row delivered");
    assert!(
        counts.values().all(|n| *n == 1),
        "a graceful hand-off delivers every row exactly once"
    );
}

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
    let deadline = Instant::now() + Duration::from_secs(10);
    while lease.ping().await.is_err() {
        assert!(Instant::now() < deadline, "no quorum answers PING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    lease
}

/// Acquires, retrying errors (nodes reconnecting) for up to 10 s.
async fn acquire(lease: &RedlockLease) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lease.try_acquire().await {
            Ok(g) => return g.is_some(),
            Err(e) if Instant::now() < deadline => {
                eprintln!("acquire: {e:#}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("acquire kept failing: {e:#}"),
        }
    }
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
    assert!(!acquire(&lease).await, "a minority must not be a grant");
    assert!(calls(&nodes[2], "set").await >= 1, "node 2 saw no SET");
    assert_eq!(
        keys(&mut nodes, &name).await,
        vec![Some("other".into()), Some("other".into()), None],
        "a failed acquire must leave no key of ours behind (the foreign ones untouched)"
    );

    // (b) Nodes 0 and 1 down: node 2 is taken, then given back; the attempt fails in bounded time.
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
        nodes[2].get(&name).await,
        None,
        "the minority key was left behind"
    );
    assert!(
        lease.ping().await.is_err(),
        "ping with 1 of 3 nodes must fail"
    );

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
    let stalled = nodes[2].port();
    let sleeper = tokio::spawn(async move {
        let _ = crate::support::redis::command(stalled, None, &["DEBUG", "SLEEP", "1.5"]).await;
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
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

    // (e) The key gone on 2 of 3 nodes (expired, or another's): lost; never re-created; our
    //     leftover on the third is tidied.
    for n in &nodes[..2] {
        n.cmd(&["DEL", &name]).await.expect("DEL");
    }
    assert!(!lease.renew().await.expect("renew"), "2 refusals: lost");
    let deadline = Instant::now() + Duration::from_secs(2);
    while nodes[2].get(&name).await.is_some() {
        assert!(
            Instant::now() < deadline,
            "the leftover on node 2 was not removed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
