//! Several instances share one table: each row once, the work spread, and `status` listing each
//! instance's live claims.

use super::*;

// ---------------------------------------------------------------------------------------------
// 1. Three instances, 5,000 rows: each received exactly once, every instance a share.

async fn three_instances_share_the_table(db: Db) {
    let Some(td) = TestDb::open(db, "cm_share").await else {
        return;
    };
    let rows = 5000;
    let rx = Receiver::start(None).await;
    td.insert_hooks(rows).await;
    let started = Instant::now();
    let names = ["a", "b", "c"];
    let mut relays: Vec<RelayProc> = names
        .iter()
        .map(|n| RelayProc::start(&td, &base(&rx, n), n))
        .collect();

    let tdr = &td;
    until(
        format!("{rows} rows SUCCESS"),
        Duration::from_secs(60),
        || async move { tdr.counts().await[2] == rows as i64 },
    )
    .await;
    let took = started.elapsed();
    for r in &mut relays {
        assert!(r.running(), "relay {} exited early", r.name);
    }
    assert_eq!(td.counts().await, [0, 0, rows as i64, 0]);

    // Each row received exactly once, none missing.
    let dupes = duplicates(&rx);
    assert!(
        dupes.is_empty(),
        "{} rows received more than once, e.g. {:?}",
        dupes.len(),
        dupes.iter().take(20).collect::<Vec<_>>()
    );
    let received: HashSet<i64> = rx.received_ids().into_iter().collect();
    let expected: HashSet<i64> = ids_and_keys(&td).await.into_iter().map(|r| r.0).collect();
    assert_eq!(received, expected, "received ids differ from the table's");
    assert_eq!(rx.len(), rows, "requests without a webhook-id arrived");
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE attempts <> 1 OR claim_token IS NOT NULL OR claimed_by IS NOT NULL OR sent_at IS NULL")
            .await,
        0,
        "delivered rows must have one attempt, sent_at and no claim"
    );

    // Every instance delivered a share.
    let reqs = rx.requests();
    let share = shares(&reqs);
    eprintln!(
        "{db:?}: {rows} rows by three claim-mode instances in {took:?} ({:.0} rows/s); shares {share:?}",
        rows as f64 / took.as_secs_f64()
    );
    for n in names {
        assert!(
            share.get(n).copied().unwrap_or(0) > 0,
            "instance {n} delivered nothing: {share:?}"
        );
    }
    assert_eq!(share.values().sum::<usize>(), rows, "unknown senders");

    // claimed_total agrees: every instance claimed at least what it delivered, and the claims
    // add up to the rows (a row is claimed again only after a give-back, which a fast receiver
    // never causes).
    let mut claimed_sum = 0.0;
    for r in &relays {
        let claimed = r.metric("outbox_relay_claimed_total").await;
        let claims = r.metric("outbox_relay_claim_duration_seconds_count").await;
        let delivered = share[r.name.as_str()] as f64;
        eprintln!(
            "{db:?}: instance {}: claimed_total {claimed}, claim statements {claims}, delivered {delivered}",
            r.name
        );
        assert!(
            claimed >= delivered,
            "instance {} delivered {delivered} rows but claimed only {claimed}",
            r.name
        );
        assert!(claims >= 1.0, "instance {} recorded no claim", r.name);
        claimed_sum += claimed;
    }
    assert!(
        claimed_sum >= rows as f64,
        "claimed_total over the instances is {claimed_sum}, under {rows}"
    );

    for r in &mut relays {
        r.sigterm();
    }
    for r in &mut relays {
        let status = r.wait_exit(Duration::from_secs(15)).await;
        assert!(status.success(), "relay {} exit: {status:?}", r.name);
    }
    td.drop_table().await;
}
per_db!(three_instances_share_the_table);

// ---------------------------------------------------------------------------------------------
// 4. `status` lists the live claims per instance while three instances hold claims.

async fn status_lists_live_claims_per_instance(db: Db) {
    let Some(td) = TestDb::open(db, "cm_status").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    // Slow answers keep every claim live while `status` runs.
    rx.set_delay(Duration::from_secs(5));
    td.insert_hooks(30).await;
    // Five rows per claim and five in flight: each instance's first claim takes five rows.
    let config = |n: &str| {
        base(&rx, n)
            .claim_ttl(Duration::from_secs(12))
            .in_flight(5)
            .hook(|s| s.timeout(Duration::from_secs(6)))
    };
    let names = ["a", "b", "c"];
    let _relays: Vec<RelayProc> = names
        .iter()
        .map(|n| RelayProc::start(&td, &config(n), n))
        .collect();
    rx.expect_requests(
        15,
        Duration::from_secs(20),
        "five requests from each instance",
    )
    .await;
    let share = shares(&rx.requests());
    assert_eq!(
        share.values().copied().collect::<Vec<_>>(),
        vec![5, 5, 5],
        "each instance has five rows in flight: {share:?}"
    );

    let cfg = config("status").write(td.dir.path(), "status.toml");
    let out = run_to_end(
        "outbox-relay status",
        relay_with_config(&td, &cfg).arg("status"),
        Duration::from_secs(15),
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "{db:?}: outbox-relay status:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "status exit: {:?}", out.status);
    let listed: BTreeMap<String, i64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("live claims: "))
        .filter_map(|rest| rest.rsplit_once(": "))
        .map(|(who, n)| (who.to_string(), n.trim().parse().expect("claim count")))
        .collect();
    let expected: BTreeMap<String, i64> = names.iter().map(|n| (n.to_string(), 5)).collect();
    assert_eq!(listed, expected, "live claims per instance in `status`");
    assert_eq!(
        claims_per_instance(&td).await,
        expected,
        "the table's live claims"
    );
    assert!(
        rx.requests().iter().all(|r| r.answered_at.is_none()),
        "a request was answered before `status` ran: the claims it saw were not all live"
    );
    td.drop_table().await;
}
per_db!(status_lists_live_claims_per_instance);

// ---------------------------------------------------------------------------------------------
// 5. Two instances against a slow receiver, with a long poll: the one a claim behind keeps
//    claiming the rows behind the other's instead of waiting a poll, so each sends about half
//    (docs/design.md, "When the loop claims").

async fn two_instances_behind_one_another_both_keep_claiming(db: Db) {
    let Some(td) = TestDb::open(db, "cm_behind").await else {
        return;
    };
    let rows = 2000;
    let rx = Receiver::start(None).await;
    // 16 sends at once answered after 20 ms: 800 rows/s an instance, so the table lasts about
    // 2.5 s for one and 1.25 s for two, against a 10 s poll.
    rx.set_delay(Duration::from_millis(20));
    td.insert_hooks(rows).await;
    let config = |n: &str| {
        base(&rx, n)
            .poll_interval(Duration::from_secs(10))
            .hook(|s| s.concurrency(16))
    };
    let mut relays: Vec<RelayProc> = ["a", "b"]
        .iter()
        .map(|n| RelayProc::start(&td, &config(n), n))
        .collect();
    rx.expect_requests(rows, Duration::from_secs(30), "every row")
        .await;
    let share = shares(&rx.requests());
    eprintln!("{db:?}: {rows} rows by two claim-mode instances behind a 20 ms receiver: {share:?}");
    for n in ["a", "b"] {
        assert!(
            share.get(n).copied().unwrap_or(0) >= rows / 4,
            "instance {n} sent under a quarter of the rows: {share:?}"
        );
    }
    for r in &mut relays {
        r.stop(Duration::from_secs(15)).await;
    }
    td.drop_table().await;
}
per_db!(two_instances_behind_one_another_both_keep_claiming);
