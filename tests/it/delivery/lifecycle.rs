//! The relay's life around deliveries: a SIGTERM mid-batch loses nothing, and two relays on one
//! `database` lease never both deliver.

use super::*;

// ---------------------------------------------------------------------------------------------
// 6. SIGTERM mid-batch (G6): in-flight sends finish and are recorded, unsent rows are given
//    back at once, exit 0; a restart delivers the rest, every row exactly once overall.

async fn sigterm_mid_batch_loses_nothing(db: Db) {
    let Some(td) = open(db, "dl_term").await else {
        return;
    };
    const ROWS: usize = 200;
    let rx = Receiver::start(Some(SECRET)).await;
    rx.set_delay(Duration::from_millis(300));
    td.insert_hooks(ROWS).await;
    // claim_ttl is long (60s): a row left claimed would not come back within this test.
    let cfg = base(&rx).claim_ttl(Duration::from_secs(60));
    let mut first = RelayProc::start(&td, &cfg, "first");
    rx.expect_requests(20, Duration::from_secs(15), "deliveries before SIGTERM")
        .await;
    first.sigterm();
    let signalled = Instant::now();
    let status = first.wait_exit(Duration::from_secs(15)).await;
    let took = signalled.elapsed();
    assert!(
        status.success(),
        "exit after SIGTERM: {status:?}\n{}",
        first.log_text()
    );
    assert!(
        took < Duration::from_secs(10),
        "shutdown took {took:?}, over shutdown_timeout"
    );

    // Everything the receiver got was answered before the exit, and recorded as SUCCESS.
    let reqs = rx.requests();
    assert!(
        reqs.iter().all(|r| r.answered_at.is_some()),
        "the relay exited with requests still in flight"
    );
    let received: HashSet<i64> = rx.received_ids().into_iter().collect();
    assert_eq!(
        received.len(),
        reqs.len(),
        "a row was sent twice before SIGTERM"
    );
    let success = ids_with_status(&td, "SUCCESS").await;
    assert_eq!(
        success, received,
        "after SIGTERM, SUCCESS rows must be exactly the rows the receiver got"
    );
    assert!(
        !received.is_empty() && received.len() < ROWS,
        "SIGTERM was not mid-batch: {} of {ROWS} delivered",
        received.len()
    );
    // Unsent rows were given back: no claims left, no attempt counted.
    assert_eq!(
        td.scalar(
            "SELECT COUNT(*) FROM {t} WHERE claim_token IS NOT NULL OR claimed_until IS NOT NULL"
        )
        .await,
        0,
        "rows left claimed after a graceful shutdown"
    );
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE status <> 'SUCCESS' AND (status <> 'PENDING' OR attempts <> 0)")
            .await,
        0,
        "unsent rows must be PENDING with no attempt counted"
    );

    // A restart delivers the rest at once (not after the 60s claim_ttl).
    rx.set_delay(Duration::ZERO);
    let mut second = RelayProc::start(&td, &cfg, "second");
    let tdr = &td;
    until(
        "all rows SUCCESS after the restart",
        Duration::from_secs(15),
        || async move { tdr.counts().await[2] == ROWS as i64 },
    )
    .await;
    let counts = rx.count_by_id();
    assert_eq!(counts.len(), ROWS, "every row received");
    let dupes: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(dupes.is_empty(), "rows received twice: {dupes:?}");
    assert!(rx.requests().iter().all(|r| r.signature_ok == Some(true)));
    second.sigterm();
    assert!(second.wait_exit(Duration::from_secs(15)).await.success());
    td.drop_table().await;
}
per_db!(sigterm_mid_batch_loses_nothing);

// ---------------------------------------------------------------------------------------------
// 7. Two relays on one `database` lease: only the holder delivers; after its SIGTERM the
//    other takes over; every row exactly once (counted at the receiver).

async fn two_relays_one_lease_never_both_deliver(db: Db) {
    let Some(td) = open(db, "dl_two").await else {
        return;
    };
    const ROWS: usize = 500;
    let rx = Receiver::start(Some(SECRET)).await;
    rx.set_delay(Duration::from_millis(25));
    td.insert_hooks(ROWS).await;
    let cfg = |who: &str| base(&rx).hook(|s| s.concurrency(4).header("x-relay", who));
    let mut a = RelayProc::start(&td, &cfg("a"), "a");
    let mut b = RelayProc::start(&td, &cfg("b"), "b");

    rx.expect_requests(
        150,
        Duration::from_secs(20),
        "deliveries by the lease holder",
    )
    .await;
    let holder = rx.requests()[0]
        .header("x-relay")
        .expect("x-relay header")
        .to_string();
    // While both run, only the holder delivers.
    let before = rx.requests();
    let from_holder = before
        .iter()
        .filter(|r| r.header("x-relay") == Some(holder.as_str()))
        .count();
    assert_eq!(
        from_holder,
        before.len(),
        "both relays delivered while both were running"
    );
    assert!(a.running() && b.running(), "both relays must be running");
    let (leader, standby, standby_name) = if holder == "a" {
        (&mut a, &mut b, "b")
    } else {
        (&mut b, &mut a, "a")
    };
    leader.sigterm();
    let status = leader.wait_exit(Duration::from_secs(15)).await;
    assert!(status.success(), "leader exit: {status:?}");

    let tdr = &td;
    until(
        "the standby finished the table",
        Duration::from_secs(30),
        || async move { tdr.counts().await[2] == ROWS as i64 },
    )
    .await;
    assert!(standby.running(), "the standby exited");

    let reqs = rx.requests();
    let counts = rx.count_by_id();
    assert_eq!(counts.len(), ROWS, "every row received");
    let dupes: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(dupes.is_empty(), "rows received twice: {dupes:?}");
    let (by_leader, by_standby): (Vec<_>, Vec<_>) = reqs
        .iter()
        .partition(|r| r.header("x-relay") == Some(holder.as_str()));
    assert!(
        by_standby
            .iter()
            .all(|r| r.header("x-relay") == Some(standby_name)),
        "requests without a relay header"
    );
    assert!(
        !by_leader.is_empty() && !by_standby.is_empty(),
        "no hand-over happened"
    );
    // No overlap in time: the leader's last answer precedes the standby's first request.
    let leader_last = by_leader
        .iter()
        .map(|r| r.answered_at.expect("leader request answered"))
        .max()
        .expect("leader requests");
    let standby_first = by_standby
        .iter()
        .map(|r| r.at)
        .min()
        .expect("standby requests");
    assert!(
        leader_last <= standby_first,
        "the standby delivered while the leader still had requests in flight"
    );

    standby.sigterm();
    assert!(standby.wait_exit(Duration::from_secs(15)).await.success());
    td.drop_table().await;
}
per_db!(two_relays_one_lease_never_both_deliver);
