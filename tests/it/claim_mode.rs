//! Claim mode (issue 5) with real processes: several `outbox-relay run` instances in
//! `relay.mode = "claim"` on one table (PostgreSQL, MariaDB, SQLite), delivering to a loopback
//! webhook receiver. Every instance's sink sends an `x-relay` header naming it, so the receiver
//! knows who sent each request and when it arrived and was answered.
//!
//! 1. three instances deliver 5,000 rows (SQLite too: three processes on one WAL file), each
//!    received exactly once, every instance a share; `claimed_total` agrees;
//! 2. kill -9 one instance mid-run: the rows it had claimed are delivered by the others once
//!    their claims expire (not before), every row ends SUCCESS, and only rows whose request was
//!    already on the wire at the kill arrive twice (PostgreSQL, MariaDB);
//! 3. per-key ordering: 50 keys x 40 rows inserted interleaved, three instances, scripted 500s
//!    on about 10% of first attempts: each key's requests are one at a time, in id order, and
//!    never start before the previous row of the key was delivered; a key waiting for a retry
//!    holds back only itself;
//! 4. `outbox-relay status` while three instances hold claims lists the live claims per
//!    instance, matching the table.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::config::Config;
use crate::support::process::*;
use crate::support::receiver::{Received, Receiver, Reply, sender};
use crate::support::*;
use sqlx::Row;

/// The config every instance starts from: claim mode, and an `x-relay` header naming the
/// instance on its requests.
fn base(rx: &Receiver, instance: &str) -> Config {
    Config::webhook(&rx.url())
        .claim_mode()
        .shutdown_timeout(Duration::from_secs(5))
        .hook(|s| s.header("x-relay", instance))
}

/// Every row's id and ordering key, in id order.
async fn ids_and_keys(td: &TestDb) -> Vec<(i64, Option<String>)> {
    let sql = format!("SELECT id, ordering_key FROM {} ORDER BY id", td.table);
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("ids")
        .iter()
        .map(|r| (r.try_get(0).expect("id"), r.try_get(1).expect("key")))
        .collect()
}

/// Rows under a live claim of `instance`, with the milliseconds their claim has left.
async fn live_claims_of(td: &TestDb, instance: &str) -> Vec<(i64, i64)> {
    let remaining = match td.db {
        Db::Postgres => "(EXTRACT(EPOCH FROM (claimed_until - now())) * 1000)::bigint",
        Db::MySql => "(TIMESTAMPDIFF(MICROSECOND, NOW(6), claimed_until) DIV 1000)",
        Db::Sqlite => "CAST((julianday(claimed_until) - julianday('now')) * 86400000 AS INTEGER)",
    };
    let sql = format!(
        "SELECT id, {remaining} FROM {} WHERE claimed_by = '{instance}'
         AND claim_token IS NOT NULL AND status IN ('PENDING', 'RETRY') ORDER BY id",
        td.table
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("live claims")
        .iter()
        .map(|r| (r.try_get(0).expect("id"), r.try_get(1).expect("remaining")))
        .collect()
}

/// Live claims per instance, as the table has them.
async fn claims_per_instance(td: &TestDb) -> BTreeMap<String, i64> {
    let sql = format!(
        "SELECT claimed_by, COUNT(*) FROM {} WHERE claim_token IS NOT NULL
         AND status IN ('PENDING', 'RETRY') GROUP BY claimed_by",
        td.table
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("claims")
        .iter()
        .map(|r| (r.try_get(0).expect("by"), r.try_get(1).expect("count")))
        .collect()
}

/// Requests per sending instance.
fn shares(reqs: &[Received]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in reqs {
        *out.entry(sender(r).to_string()).or_insert(0) += 1;
    }
    out
}

/// Ids received more than once, with their counts.
fn duplicates(rx: &Receiver) -> BTreeMap<i64, usize> {
    rx.count_by_id()
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect()
}

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
// 2. kill -9 one instance mid-run: its claims expire and the others deliver those rows; only
//    rows whose request was on the wire at the kill may arrive twice.

async fn kill9_claims_expire_and_others_deliver(db: Db) {
    let Some(td) = TestDb::open(db, "cm_kill").await else {
        return;
    };
    const ROWS: usize = 600;
    let rx = Receiver::start(None).await;
    // A slow receiver keeps requests in flight.
    rx.set_delay(Duration::from_millis(150));
    td.insert_hooks(ROWS).await;
    // Each instance claims up to 32 rows but sends only 8 at once: at the kill, the victim
    // holds claims on rows it has sent (in flight) and on rows it has not sent yet.
    let config = |n: &str| {
        base(&rx, n)
            .claim_ttl(Duration::from_secs(6))
            .in_flight(32)
            .hook(|s| s.timeout(Duration::from_secs(1)).concurrency(8))
    };
    let names = ["a", "b", "c"];
    let mut relays: Vec<RelayProc> = names
        .iter()
        .map(|n| RelayProc::start(&td, &config(n), n))
        .collect();

    // Let the victim get going, then kill it mid-run.
    let ok = rx
        .wait_until(
            |r| {
                r.iter()
                    .filter(|q| q.header("x-relay") == Some("b"))
                    .count()
                    >= 40
            },
            Duration::from_secs(20),
        )
        .await;
    assert!(
        ok,
        "instance b never got going: {:?}",
        shares(&rx.requests())
    );
    // Half a receiver delay later: the kill falls in the middle of a round of sends.
    tokio::time::sleep(Duration::from_millis(70)).await;
    let kill_at = Instant::now();
    relays[1].kill9();
    let reqs_at_kill = rx.requests();
    // A result statement the victim sent just before it died may still be running on the
    // server: let it finish before reading what the victim left behind. (Its claims are under
    // a second old at the kill and last 6s, so none expires meanwhile.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The victim's rows as it left them: claimed, unfinished, with their claims' time left.
    let queried_at = Instant::now();
    let orphans = live_claims_of(&td, "b").await;
    let delivered_at_kill = td.counts().await[2];
    assert!(
        (delivered_at_kill as usize) < ROWS - 100,
        "the kill was not mid-run: {delivered_at_kill} of {ROWS} already delivered"
    );
    assert!(!orphans.is_empty(), "instance b held no claims at the kill");
    let orphan_ids: HashSet<i64> = orphans.iter().map(|o| o.0).collect();
    // A claim expires at the database's `claimed_until`; measured from before the query, so
    // the expiry instants below are, if anything, early.
    let expiry: HashMap<i64, Instant> = orphans
        .iter()
        .map(|&(id, ms)| (id, queried_at + Duration::from_millis(ms.max(0) as u64)))
        .collect();

    // The victim's requests whose outcome it never recorded: rows it had sent (the receiver
    // has the request) that are still under its claim. Only these may arrive twice. Of them,
    // `unanswered` were literally on the wire at the kill; the others had been answered but
    // their result not yet written.
    let from_b: Vec<&Received> = reqs_at_kill.iter().filter(|r| sender(r) == "b").collect();
    let on_wire: HashSet<i64> = from_b
        .iter()
        .filter_map(|r| r.id)
        .filter(|id| orphan_ids.contains(id))
        .collect();
    let unanswered = from_b
        .iter()
        .filter(|r| r.answered_at.is_none_or(|t| t > kill_at))
        .count();
    // Answered so shortly before the kill that the result may not have been written yet (the
    // recorder flushes every 10ms; 500ms leaves room for a slow result statement).
    let just_answered = from_b
        .iter()
        .filter(|r| {
            r.answered_at
                .is_some_and(|t| t <= kill_at && t + Duration::from_millis(500) > kill_at)
        })
        .count();
    let unsent_orphans = orphan_ids.len() - on_wire.len();
    let sent_by_b = from_b.len();

    let tdr = &td;
    until(
        "every row SUCCESS after the kill",
        Duration::from_secs(40),
        || async move { tdr.counts().await[2] == ROWS as i64 },
    )
    .await;
    let recovered_after = kill_at.elapsed();
    assert_eq!(td.counts().await, [0, 0, ROWS as i64, 0]);
    for r in relays.iter_mut().filter(|r| r.name != "b") {
        assert!(r.running(), "relay {} exited", r.name);
    }

    let reqs = rx.requests();
    let counts = rx.count_by_id();
    assert_eq!(counts.len(), ROWS, "every row received");
    let dupes = duplicates(&rx);
    let late_from_b = reqs
        .iter()
        .filter(|r| sender(r) == "b" && r.at > kill_at + Duration::from_millis(100))
        .count();
    eprintln!(
        "{db:?}: kill -9 of b after it sent {sent_by_b} requests: it held {} claims: {} sent \
         with no result recorded ({unanswered} unanswered at the kill, {just_answered} answered in the 500ms before), {unsent_orphans} \
         not sent; {} rows arrived twice {:?}; all {ROWS} SUCCESS {:?} after the kill; shares {:?}",
        orphans.len(),
        on_wire.len(),
        dupes.len(),
        dupes.keys().collect::<Vec<_>>(),
        recovered_after,
        shares(&reqs)
    );
    assert_eq!(
        late_from_b, 0,
        "requests from the killed instance after its death"
    );

    // Only rows on the wire at the kill arrived twice (G3), and each at most twice: at most
    // the requests the victim had sent without a recorded result, which are at most those
    // unanswered at the kill (bounded by the sink's concurrency, 8) plus those answered in
    // the moment before it.
    assert!(
        dupes.len() <= on_wire.len(),
        "{} duplicates but only {} requests of the killed instance had no recorded result",
        dupes.len(),
        on_wire.len()
    );
    assert!(
        unanswered <= 8,
        "{unanswered} requests of b in flight, over its sink concurrency of 8"
    );
    assert!(
        on_wire.len() <= unanswered + just_answered,
        "{} of b's rows were sent without a recorded result, but only {unanswered} were \
         unanswered at the kill and {just_answered} answered just before it",
        on_wire.len()
    );
    for (id, n) in &dupes {
        assert_eq!(*n, 2, "row {id} arrived {n} times");
        assert!(
            on_wire.contains(id),
            "row {id} arrived twice but was not on the wire from the killed instance"
        );
        let first = &rx.requests_for(*id)[0];
        assert_eq!(sender(first), "b", "row {id}: first request not from b");
    }
    // The victim's claimed rows went to the others, and only after their claims expired (G1,
    // G2). 100ms allows for the database's clock granularity and the query's round trip.
    for id in &orphan_ids {
        let after: Vec<Received> = rx
            .requests_for(*id)
            .into_iter()
            .filter(|r| sender(r) != "b")
            .collect();
        assert_eq!(after.len(), 1, "row {id} claimed by b: {after:?}");
        let r = &after[0];
        assert!(
            ["a", "c"].contains(&sender(r)),
            "row {id} from {}",
            sender(r)
        );
        assert!(
            r.at + Duration::from_millis(100) >= expiry[id],
            "row {id} was re-sent {:?} before b's claim on it expired",
            expiry[id] - r.at
        );
    }
    // Every other row exactly once.
    for (id, n) in &counts {
        if !orphan_ids.contains(id) {
            assert_eq!(
                *n, 1,
                "row {id}, not claimed by b at the kill, arrived {n} times"
            );
        }
    }
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE claim_token IS NOT NULL")
            .await,
        0,
        "claims left behind"
    );
    td.drop_table().await;
}
per_db!(kill9_claims_expire_and_others_deliver);

// ---------------------------------------------------------------------------------------------
// 3. Per-key ordering across three instances with injected 500s.

async fn ordering_keys_in_id_order_across_instances(db: Db) {
    let Some(td) = TestDb::open(db, "cm_order").await else {
        return;
    };
    const KEYS: usize = 50;
    const PER_KEY: usize = 40;
    let rx = Receiver::start(None).await;
    // Interleaved: row i belongs to key i % 50 and is that key's (i / 50)-th row.
    let rows: Vec<(Option<String>, String)> = (0..KEYS * PER_KEY)
        .map(|i| {
            let (k, seq) = (i % KEYS, i / KEYS);
            (
                Some(format!("key-{k:02}")),
                format!(r#"{{"key":"key-{k:02}","seq":{seq}}}"#),
            )
        })
        .collect();
    td.insert("hook", rows.iter().cloned()).await;
    let table = ids_and_keys(&td).await;
    assert_eq!(table.len(), KEYS * PER_KEY);
    // id -> (key, seq), checked against the insertion order (ids increase with it).
    let mut row_of: HashMap<i64, (String, usize)> = HashMap::new();
    for (i, (id, key)) in table.iter().enumerate() {
        let key = key.clone().expect("ordering key");
        assert_eq!(key, format!("key-{:02}", i % KEYS), "row {id} out of order");
        row_of.insert(*id, (key, i / KEYS));
    }
    // About 10% of first attempts answer 500 (deterministic by id), a few of them twice.
    let mut scripted_500s: HashMap<i64, usize> = HashMap::new();
    for (id, _) in &table {
        let n = match id.rem_euclid(97) {
            x if x % 10 == 3 => 1,
            7 | 48 => 2,
            _ => 0,
        };
        if n > 0 {
            rx.script(*id, vec![Reply::status(500).body("injected"); n]);
            scripted_500s.insert(*id, n);
        }
    }
    eprintln!(
        "{db:?}: {} of {} rows answer 500 first ({} of them twice)",
        scripted_500s.len(),
        table.len(),
        scripted_500s.values().filter(|n| **n == 2).count()
    );

    let config =
        |n: &str| base(&rx, n).retry(Duration::from_millis(100), Duration::from_millis(300), 10);
    let started = Instant::now();
    let names = ["a", "b", "c"];
    let mut relays: Vec<RelayProc> = names
        .iter()
        .map(|n| RelayProc::start(&td, &config(n), n))
        .collect();
    let total = (KEYS * PER_KEY) as i64;
    let tdr = &td;
    until(
        "every keyed row SUCCESS",
        Duration::from_secs(60),
        || async move { tdr.counts().await[2] == total },
    )
    .await;
    let took = started.elapsed();
    for r in &mut relays {
        assert!(r.running(), "relay {} exited", r.name);
    }

    let reqs = rx.requests();
    let share = shares(&reqs);
    eprintln!(
        "{db:?}: {KEYS} keys x {PER_KEY} rows with ordering in {took:?}; {} requests; shares {share:?}",
        reqs.len()
    );
    for n in names {
        assert!(
            share.contains_key(n),
            "instance {n} sent nothing: {share:?}"
        );
    }
    // Every row: its scripted 500s, then exactly one success.
    let mut by_row: HashMap<i64, Vec<&Received>> = HashMap::new();
    for r in &reqs {
        by_row.entry(r.id.expect("webhook-id")).or_default().push(r);
    }
    for (id, (key, seq)) in &row_of {
        let got = by_row.get(id).map(Vec::as_slice).unwrap_or_default();
        let fails = scripted_500s.get(id).copied().unwrap_or(0);
        let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
        let mut want = vec![500; fails];
        want.push(200);
        assert_eq!(statuses, want, "row {id} ({key} #{seq}) attempts");
        let body: serde_json::Value = serde_json::from_str(&got[0].body).expect("JSON body");
        assert_eq!(body["key"], key.as_str());
        assert_eq!(body["seq"], *seq);
    }

    // Per key: requests one at a time (each arrives after the previous one was answered),
    // and successful deliveries strictly in id order, seq 0..40.
    let mut by_key: BTreeMap<&str, Vec<&Received>> = BTreeMap::new();
    for r in &reqs {
        let (key, _) = &row_of[&r.id.expect("id")];
        by_key.entry(key.as_str()).or_default().push(r);
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, list) in &by_key {
        for pair in list.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            let answered = prev.answered_at.expect("answered");
            assert!(
                next.at >= answered,
                "{key}: row {:?} was sent while row {:?} (status {}) was still in flight",
                next.id,
                prev.id,
                prev.status
            );
            let (_, prev_seq) = row_of[&prev.id.expect("id")];
            let (_, next_seq) = row_of[&next.id.expect("id")];
            // After a success comes the next row; after a 500, the same row again.
            let want = if prev.status == 200 {
                prev_seq + 1
            } else {
                prev_seq
            };
            assert_eq!(
                next_seq, want,
                "{key}: after row {:?} (#{prev_seq}, status {}) came row {:?} (#{next_seq})",
                prev.id, prev.status, next.id
            );
        }
        let delivered: Vec<i64> = list
            .iter()
            .filter(|r| r.status == 200)
            .map(|r| r.id.expect("id"))
            .collect();
        assert_eq!(delivered.len(), PER_KEY, "{key}");
        assert!(
            delivered.windows(2).all(|w| w[0] < w[1]),
            "{key}: deliveries out of id order: {delivered:?}"
        );
        assert_eq!(row_of[&delivered[0]].1, 0, "{key} started with a later row");
    }

    // A key whose head waits for a retry holds back only that key: during most retry waits,
    // other keys were delivered (near the end, few other keys may be left).
    let mut waits = 0;
    let mut others_moved = 0;
    for list in by_row.values() {
        for pair in list.windows(2) {
            let (from, to) = (pair[0].answered_at.expect("answered"), pair[1].at);
            waits += 1;
            if reqs
                .iter()
                .any(|r| r.status == 200 && r.at > from && r.at < to)
            {
                others_moved += 1;
            }
        }
    }
    eprintln!("{db:?}: other keys delivered during {others_moved} of {waits} retry waits");
    assert!(
        others_moved * 2 >= waits,
        "other keys were held back during retry waits: only {others_moved} of {waits} waits saw other deliveries"
    );
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE claim_token IS NOT NULL")
            .await,
        0
    );
    td.drop_table().await;
}
per_db!(ordering_keys_in_id_order_across_instances);

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
