//! The `redis` lease when Redis or the holder fails: Redis killed while a relay holds, and
//! restarted; the holder paused (SIGSTOP) past its lease and its claims; the connection
//! re-established under a holder, which confirms its hold before claiming again.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_stops_the_holder_and_one_holds_after_restart() {
    let Some((mut redis, td, rx)) = setup("rl_outage", &[]).await else {
        return;
    };
    let knobs = Knobs {
        ttl: Duration::from_secs(2),
        ..Knobs::fast()
    };
    let lease = td.table.clone();
    let t0 = Instant::now();
    let mut relays = start_relays(&td, &knobs, &rx, &redis, &lease, &["a", "b"]);
    let feeder = Feeder::start(td.store.clone(), Duration::from_millis(20));

    rx.expect_requests(1, Duration::from_secs(15), "first delivery")
        .await;
    let h = rx
        .only_sender_for(t0, Duration::from_millis(1000), "before the outage")
        .await;
    assert_holder(&redis, &td, &lease, &relays, &h).await;

    // Outage.
    let t_down = Instant::now();
    redis.kill();
    let window = knobs.ttl + Duration::from_millis(1000);
    let down = (t_down, knobs.ttl, window);
    assert_holder_stops(&rx, &relays, &h, down, "while Redis is down").await;

    // Redis back, empty, on the same port.
    let t_up = Instant::now();
    redis.restart().await;
    let first = rx
        .first_where(
            |r| r.at > t_up,
            Duration::from_secs(12),
            "no delivery within 12s of Redis coming back",
        )
        .await;
    println!(
        "redis outage: delivery resumed {:.0} ms after Redis came back",
        delta_ms(t_up, first.at)
    );
    let n = rx
        .only_sender_for(t_up, Duration::from_millis(1000), "after Redis returns")
        .await;
    assert_holder(&redis, &td, &lease, &relays, &n).await;

    // Both relays re-subscribed to the release channel after the reconnect, so a graceful
    // release is still seen at once (not after the key's PTTL, >= 2/3 of the 2s ttl).
    let channel = format!("{lease}:released");
    until("both relays re-subscribed", Duration::from_secs(8), || async {
        let r = redis
            .cmd(&["PUBSUB", "NUMSUB", &channel])
            .await
            .expect("PUBSUB NUMSUB");
        matches!(&r, crate::support::redis::Resp::Array(Some(v)) if v.get(1).and_then(|x| x.int()) == Some(2))
    })
    .await;
    let ni = index_of(&relays, &n);
    let t_term = Instant::now();
    relays[ni].signal("TERM");
    let (status, t_exit) = relays[ni].wait_exit_at(Duration::from_secs(10)).await;
    assert!(status.success());
    let first = &successor_after(
        &rx,
        &n,
        t_term,
        Duration::from_secs(5),
        "no hand-off after SIGTERM following the outage",
    )
    .await;
    let handoff = delta_ms(t_exit, first.at);
    println!("redis outage: hand-off after the restart {handoff:.1} ms after the holder's exit");
    assert!(
        handoff <= 500.0,
        "hand-off after the Redis restart took {handoff:.1} ms: the standby missed the release \
         message (not re-subscribed?)"
    );

    feeder.stop().await;
    td.wait_all_success(Duration::from_secs(15)).await;
    let counts = rx.count_by_id();
    for id in all_ids(&td).await {
        assert!(
            counts.contains_key(&id),
            "row {id} SUCCESS but never received"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 4. SIGSTOP the holder past the lease ttl and its claims' ttl, then SIGCONT.

/// The first holder's (relay `a`'s) result writes are slow (a stalled database: 200 ms per
/// row), so a SIGSTOP lands while its result statement runs. That statement may complete on
/// the server, but it must not leave rows locked while the process is stopped (nobody could
/// re-claim them: G1) nor be committed when it wakes.
async fn slow_results_of_a(td: &TestDb) {
    td.exec(
        "CREATE FUNCTION {t}_slow() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.2); RETURN NEW; END $$",
    )
    .await;
    td.exec(
        "CREATE TRIGGER {t}_slow BEFORE UPDATE ON {t} FOR EACH ROW \
         WHEN (OLD.claimed_by = 'a' AND NEW.status = 'SUCCESS') EXECUTE FUNCTION {t}_slow()",
    )
    .await;
}

/// Duplicates: only rows whose request was in flight when the process stopped (in
/// `sent_before_stop`), each twice at most; and every row received. Returns the duplicates.
async fn assert_only_sent_rows_twice(
    rx: &Receiver,
    td: &TestDb,
    sent_before_stop: &HashSet<i64>,
) -> BTreeSet<i64> {
    let counts = rx.count_by_id();
    let dups: BTreeSet<i64> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect();
    for id in &dups {
        assert!(
            sent_before_stop.contains(id),
            "row {id} received {} times but the paused relay had not sent it before SIGSTOP",
            counts[id]
        );
        assert_eq!(counts[id], 2, "row {id} received more than twice");
    }
    for id in all_ids(td).await {
        assert!(
            counts.contains_key(&id),
            "row {id} SUCCESS but never received"
        );
    }
    dups
}

/// Starts relay `a` and, once it holds the lease, relay `b` (the standby).
async fn start_a_then_b(
    td: &TestDb,
    knobs: &Knobs,
    rx: &Receiver,
    redis: &RedisServer,
    lease: &str,
) -> Vec<RelayProc> {
    let mut relays = vec![start_relay(td, knobs, rx, &redis.url(), lease, "a")];
    until(
        "relay a holds the lease",
        Duration::from_secs(15),
        || async { redis.get(lease).await.is_some_and(|v| v.starts_with("a#")) },
    )
    .await;
    relays.push(start_relay(td, knobs, rx, &redis.url(), lease, "b"));
    relays
}

/// The rows relay `h` had put on the wire by `wire` (the duplicate window, G3: sent but
/// maybe not recorded), and how many of those requests were unanswered at `t_stop_sent`.
fn sent_by_the_stop(
    rx: &Receiver,
    h: &str,
    wire: Instant,
    t_stop_sent: Instant,
) -> (HashSet<i64>, usize) {
    let reqs = rx.requests();
    let before: Vec<&Received> = reqs
        .iter()
        .filter(|r| sender(r) == h && r.at <= wire)
        .collect();
    let sent: HashSet<i64> = before.iter().filter_map(|r| r.id).collect();
    let unanswered = before
        .iter()
        .filter(|r| r.answered_at.is_none_or(|a| a > t_stop_sent))
        .count();
    (sent, unanswered)
}

/// Relay `h` sent no request after `wire` (stopped at `t_stop`, woken at `t_cont`).
fn assert_sent_nothing_after(
    rx: &Receiver,
    h: &str,
    wire: Instant,
    t_stop: Instant,
    t_cont: Instant,
) {
    let reqs = rx.requests();
    let after_wake: Vec<String> = reqs
        .iter()
        .filter(|r| sender(r) == h && r.at > wire)
        .map(|r| {
            format!(
                "row {:?} at +{:.0}ms after SIGSTOP (SIGCONT at +{:.0}ms)",
                r.id,
                delta_ms(t_stop, r.at),
                delta_ms(t_stop, t_cont)
            )
        })
        .collect();
    assert!(
        after_wake.is_empty(),
        "the paused relay sent requests it had not put on the wire before SIGSTOP: {after_wake:?}"
    );
}

/// Every row is as in `settled`: the woken relay's writes changed none.
async fn assert_rows_unchanged(td: &TestDb, settled: &BTreeMap<i64, String>) {
    let woken = snapshot(td).await;
    let changed: Vec<String> = settled
        .iter()
        .filter(|(id, v)| woken.get(id) != Some(v))
        .map(|(id, v)| format!("row {id}: {v} -> {:?}", woken.get(id)))
        .collect();
    assert!(
        changed.is_empty(),
        "the woken relay's writes changed rows: {changed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_sends_nothing_and_writes_nothing_after_wake() {
    let Some((redis, td, rx)) = setup("rl_pause", &[]).await else {
        return;
    };
    let knobs = Knobs {
        sink_timeout: Duration::from_secs(1),
        claim_ttl: Duration::from_secs(6),
        // Four sends in flight and four claimed rows waiting for a sink slot at the pause:
        // the waiting ones must be dropped, not sent, when the process wakes.
        in_flight: 8,
        sink_concurrency: Some(4),
        ..Knobs::fast()
    };
    let lease = td.table.clone();
    td.insert_hooks(40).await;
    slow_results_of_a(&td).await;
    rx.set_delay(Duration::from_millis(400));
    let t0 = Instant::now();
    let mut relays = start_a_then_b(&td, &knobs, &rx, &redis, &lease).await;

    // Pause a while its first four results are being written (and four more rows are on the
    // wire, four claimed rows wait for a sink slot).
    let answered = rx
        .wait_until(
            |reqs| reqs.iter().filter(|r| r.answered_at.is_some()).count() >= 4,
            Duration::from_secs(15),
        )
        .await;
    assert!(answered, "relay a delivered nothing");
    let h = rx
        .only_sender_for(t0, Duration::from_millis(150), "before the pause")
        .await;
    assert_eq!(h, "a");
    let hi = index_of(&relays, &h);
    let t_stop_sent = Instant::now();
    relays[hi].signal("STOP");
    let t_stop = Instant::now();
    // Bytes already on the wire still arrive; nothing may be sent after this.
    let wire = t_stop + Duration::from_millis(100);
    let (_, epoch_h) = td.lease_row(&lease).await.expect("fencing row");

    // The other relay takes over; the paused one's claims expire and are re-delivered.
    td.wait_all_success(knobs.claim_ttl + Duration::from_secs(10))
        .await;
    let settled = snapshot(&td).await;
    let (holder_now, epoch_now) = td.lease_row(&lease).await.expect("fencing row");
    assert!(epoch_now > epoch_h, "the takeover must bump the epoch");
    // The duplicate window (G3): rows the paused relay had sent but not yet recorded.
    let (sent_before_stop, unanswered_at_stop) = sent_by_the_stop(&rx, &h, wire, t_stop_sent);

    // Wake it (claims long expired, rows re-delivered and recorded by the other relay).
    let t_cont = Instant::now();
    relays[hi].signal("CONT");
    // 2.5 s of the woken relay's doings: it must send and write nothing in them.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        relays[hi].running(),
        "the woken relay must keep running (as a standby)"
    );
    let log = relays[hi].log_text();
    assert!(
        log.contains("lease lost"),
        "the woken relay must notice its lease is gone:\n{log}"
    );
    assert_sent_nothing_after(&rx, &h, wire, t_stop, t_cont);
    assert_rows_unchanged(&td, &settled).await;
    assert_eq!(
        td.lease_row(&lease).await.expect("fencing row"),
        (holder_now.clone(), epoch_now),
        "the woken relay must not take the lease back"
    );
    let key = redis.get(&lease).await;
    assert_eq!(key, holder_now, "the Redis key still names the successor");

    let dups = assert_only_sent_rows_twice(&rx, &td, &sent_before_stop).await;
    td.exec("DROP FUNCTION IF EXISTS {t}_slow() CASCADE").await;
    println!(
        "pause test: {} requests sent before SIGSTOP ({unanswered_at_stop} still unanswered), \
         {} rows received twice (sent, not recorded: the allowed duplicate window); the woken \
         relay sent nothing and changed no row",
        sent_before_stop.len(),
        dups.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 5. A foreign client's key keeps every relay out until it expires (and the relay's key keeps
//    a foreign client out).

/// Redis restarted under a holder, its key kept (append-only file): after the reconnection
/// the holder claims nothing new until a renewal confirms the hold, then goes on under the
/// same token and epoch (no needless failover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_confirms_the_hold_before_claiming_again() {
    let Some((mut redis, td, rx)) = setup(
        "rl_reconnect",
        &["--appendonly", "yes", "--appendfsync", "always"],
    )
    .await
    else {
        return;
    };
    let knobs = Knobs {
        ttl: Duration::from_secs(6),
        renew_timeout: Duration::from_millis(500),
        claim_ttl: Duration::from_secs(12),
        ..Knobs::fast()
    };
    let lease = td.table.clone();
    let relays = start_relays(&td, &knobs, &rx, &redis, &lease, &["a"]);
    let feeder = Feeder::start(td.store.clone(), Duration::from_millis(20));
    rx.expect_requests(5, Duration::from_secs(15), "deliveries before the restart")
        .await;
    let (token, epoch) = assert_holder(&redis, &td, &lease, &relays, "a").await;
    const CONFIRMING: &str = "confirming the hold before claiming again";
    let before = relays[0].log_text().matches(CONFIRMING).count();

    redis.restart().await;
    let t_up = Instant::now();
    let relay = &relays[0];
    until(
        "the holder confirms its hold",
        Duration::from_secs(10),
        || async move { relay.log_text().matches(CONFIRMING).count() > before },
    )
    .await;
    let resumed = rx
        .wait_until(
            |reqs| reqs.iter().filter(|r| r.at > t_up).count() >= 5,
            Duration::from_secs(10),
        )
        .await;
    assert!(resumed, "deliveries did not resume after the reconnection");
    let (token_after, epoch_after) = assert_holder(&redis, &td, &lease, &relays, "a").await;
    assert_eq!(token_after, token, "the hold was confirmed, not re-taken");
    assert_eq!(epoch_after, epoch, "no new epoch: the hold survived");
    feeder.stop().await;
}
