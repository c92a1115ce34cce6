//! Claims (G1, G2): due rows in id order, an expired claim taken over while the old token
//! writes nothing, fencing by the lease epoch, budgets per channel, excluded channels,
//! concurrent claimers, the newest share under a backlog, and rows due again below a floor.

use super::*;

per_db!(claim_takes_due_rows_in_id_order);
async fn claim_takes_due_rows_in_id_order(db: Db) {
    let Some(td) = TestDb::open(db, "st_claim").await else {
        return;
    };
    let store = td.store.clone();
    let all = td.enqueue_n("log", r#"{"n":1}"#, 7).await;
    // The last two rows are not due yet.
    let future = db_time(db, 3600);
    td.exec(&format!(
        "UPDATE {{t}} SET next_attempt_at = {future} WHERE id IN ({}, {})",
        all[5], all[6]
    ))
    .await;

    let (first_req, first) = claim(&*store, 3, LONG, "a", None).await;
    assert_eq!(
        ids(&first),
        all[..3].to_vec(),
        "the lowest ids, in id order"
    );
    let d = &first[0].delivery;
    assert_eq!(d.channel, "log");
    assert_eq!(d.recipient.as_deref(), Some("r"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&d.payload).unwrap(),
        serde_json::json!({"n": 1})
    );
    assert_eq!(d.attempts, 0);
    assert!(
        row_is(
            &td,
            all[0],
            "claimed_by = 'a' AND claimed_until IS NOT NULL"
        )
        .await
    );
    assert!(row_is(&td, all[0], &format!("claim_token = '{}'", first_req.token)).await);

    // A second claim while the first is live gets the other due rows, never the same one (G2).
    let (_, second) = claim(&*store, 10, LONG, "b", None).await;
    assert_eq!(ids(&second), all[3..5].to_vec());
    let (_, third) = claim(&*store, 10, LONG, "c", None).await;
    assert!(
        third.is_empty(),
        "rows under live claims or not yet due must not be claimed: {:?}",
        ids(&third)
    );

    // Once due, the future rows are claimable.
    td.exec(&format!(
        "UPDATE {{t}} SET next_attempt_at = {} WHERE id IN ({}, {})",
        db_time(db, -1),
        all[5],
        all[6]
    ))
    .await;
    let (_, fourth) = claim(&*store, 10, LONG, "c", None).await;
    assert_eq!(ids(&fourth), all[5..].to_vec());
    td.drop_table().await;
}

per_db!(expired_claim_is_taken_over_and_old_token_writes_nothing);
async fn expired_claim_is_taken_over_and_old_token_writes_nothing(db: Db) {
    let Some(td) = TestDb::open(db, "st_expire").await else {
        return;
    };
    let store = td.store.clone();
    let id = td.enqueue("log", r#"{"n":1}"#, None).await;
    let (a_req, a_rows) = claim(&*store, 10, Duration::from_millis(300), "a", None).await;
    assert_eq!(ids(&a_rows), vec![id]);
    let (_, none) = claim(&*store, 10, LONG, "b", None).await;
    assert!(none.is_empty(), "the claim is still live");

    tokio::time::sleep(Duration::from_millis(700)).await;
    // G1: the dead claimer's row is claimable again.
    let (b_req, b_rows) = claim(&*store, 10, LONG, "b", None).await;
    assert_eq!(
        ids(&b_rows),
        vec![id],
        "an expired claim must be claimable again"
    );
    assert!(row_is(&td, id, "claimed_by = 'b'").await);

    // G2: the first claimer's late result changes nothing, whatever it says.
    for res in [
        Resolution::Delivered,
        Resolution::Failed {
            error: "late".into(),
        },
        Resolution::Retry {
            delay: Duration::from_secs(1),
            error: "late".into(),
        },
        Resolution::Release {
            delay: Duration::ZERO,
            error: None,
        },
    ] {
        assert_eq!(
            complete(&*store, &[completion(&a_req, id, res.clone())]).await,
            0,
            "a stale token's {res:?} must change no row"
        );
    }
    assert!(
        row_is(
            &td,
            id,
            "status = 'PENDING' AND attempts = 0 AND claimed_by = 'b'"
        )
        .await
    );
    assert_eq!(
        complete(&*store, &[completion(&b_req, id, Resolution::Delivered)]).await,
        1
    );
    assert!(row_is(&td, id, "status = 'SUCCESS' AND attempts = 1").await);
    // Completed rows leave their claim: the same result again changes nothing.
    assert_eq!(
        complete(&*store, &[completion(&b_req, id, Resolution::Delivered)]).await,
        0
    );
    assert_eq!(attempts(&td, id).await, 1);
    td.drop_table().await;
}

per_db!(fencing_refuses_a_stale_epoch);
async fn fencing_refuses_a_stale_epoch(db: Db) {
    let Some(td) = TestDb::open(db, "st_fence").await else {
        return;
    };
    let store = td.store.clone();
    let lease = td.table.clone();
    for _ in 0..6 {
        td.enqueue("log", r#"{"n":1}"#, None).await;
    }
    let fence = |epoch| {
        Some(Fence {
            lease: lease.clone(),
            epoch,
        })
    };

    // No lease row at all: nothing may be claimed under a fence.
    let (_, rows) = claim(&*store, 2, LONG, "a", fence(1)).await;
    assert!(rows.is_empty(), "claimed under a lease that does not exist");

    let e = bounded(
        "lease_acquire",
        store.lease_acquire(&lease, "a", Duration::from_secs(30)),
    )
    .await
    .expect("free lease is acquired");
    let (_, rows) = claim(&*store, 2, LONG, "a", fence(e)).await;
    assert_eq!(rows.len(), 2, "the holder's epoch matches");
    let (_, rows) = claim(&*store, 2, LONG, "a", fence(e + 1)).await;
    assert!(rows.is_empty(), "a future epoch is not the stored one");

    // Another holder takes over (e.g. a Redis lease moved): A's epoch is stale.
    let e2 = bounded("advance_epoch", store.advance_epoch(&lease, "b")).await;
    assert_eq!(e2, e + 1);
    let (_, rows) = claim(&*store, 2, LONG, "a", fence(e)).await;
    assert!(
        rows.is_empty(),
        "G2: a stale epoch claimed rows {:?}",
        ids(&rows)
    );
    let (_, rows) = claim(&*store, 10, LONG, "b", fence(e2)).await;
    assert_eq!(rows.len(), 4, "the new holder claims the rest");
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE claimed_by = 'a'")
            .await,
        2
    );
    td.drop_table().await;
}

per_db!(budgets_cap_each_channel);
async fn budgets_cap_each_channel(db: Db) {
    let Some(td) = TestDb::open(db, "st_budget").await else {
        return;
    };
    let store = td.store.clone();
    let lease = td.table.clone();
    // Interleaved, so that an id-ordered claim would take a mix.
    for i in 0..30 {
        let channel = ["a", "b", "nobody"][i % 3];
        td.enqueue(channel, r#"{"n":1}"#, None).await;
    }
    // With a fence, so its placeholders are bound along with the budgets'.
    let epoch = bounded(
        "lease_acquire",
        store.lease_acquire(&lease, "a", Duration::from_secs(30)),
    )
    .await
    .expect("free lease is acquired");
    let mut req = request(100, LONG, "a", Some(Fence { lease, epoch }));
    req.newest = true;
    req.budgets = Some(Budgets {
        channels: vec![("a".into(), 2), ("b".into(), 5)],
        others: Some((vec!["a".into(), "b".into()], 1)),
        starts: None,
    });
    let rows = bounded("claim", store.claim(&req)).await;
    let count = |c: &str| rows.iter().filter(|r| r.delivery.channel == c).count();
    assert_eq!(
        (count("a"), count("b"), count("nobody")),
        (2, 5, 1),
        "{:?}",
        ids(&rows)
    );
    // Each channel's rows are its first ones in id order, but for one in eight (at least one)
    // taken from its newest end: channel a (ids min, min+3, ..., min+27) gets its first and
    // its last.
    let first_a: Vec<i64> = ids(&rows)
        .into_iter()
        .filter(|id| {
            rows.iter()
                .any(|r| r.delivery.id == *id && r.delivery.channel == "a")
        })
        .collect();
    let min = td.scalar("SELECT MIN(id) FROM {t}").await;
    assert_eq!(first_a, vec![min, min + 27]);
    // Claim mode (no fence; on MySQL its picks read candidates first): the same budgets take
    // the next rows, and a claim for the rows of unserved channels alone (every sink busy)
    // takes theirs.
    let mut free = request(100, LONG, "b", None);
    free.budgets = req.budgets.clone();
    let next = bounded("claim", store.claim(&free)).await;
    let count = |c: &str| next.iter().filter(|r| r.delivery.channel == c).count();
    assert_eq!((count("a"), count("b"), count("nobody")), (2, 5, 1));
    assert!(
        next.iter()
            .all(|r| !rows.iter().any(|o| o.delivery.id == r.delivery.id)),
        "claimed again: {:?} then {:?}",
        ids(&rows),
        ids(&next)
    );
    free.budgets = Some(Budgets {
        channels: Vec::new(),
        others: Some((vec!["a".into(), "b".into()], 3)),
        starts: None,
    });
    let strays = bounded("claim", store.claim(&free)).await;
    assert_eq!(strays.len(), 3, "{:?}", ids(&strays));
    assert!(strays.iter().all(|r| r.delivery.channel == "nobody"));
    // An empty budget claims nothing (and sends no statement).
    req.budgets = Some(Budgets::default());
    assert!(bounded("claim", store.claim(&req)).await.is_empty());
    td.drop_table().await;
}

per_db!(excluded_channels_are_not_claimed);
async fn excluded_channels_are_not_claimed(db: Db) {
    let Some(td) = TestDb::open(db, "st_excl").await else {
        return;
    };
    let store = td.store.clone();
    let lease = td.table.clone();
    let mut paused = Vec::new();
    for i in 0..6 {
        let channel = if i % 2 == 0 { "paused" } else { "open" };
        let id = td.enqueue(channel, r#"{"n":1}"#, None).await;
        if channel == "paused" {
            paused.push(id);
        }
    }
    // With a fence too, so the placeholders of both are bound in the right order.
    let epoch = bounded(
        "lease_acquire",
        store.lease_acquire(&lease, "a", Duration::from_secs(30)),
    )
    .await
    .expect("free lease is acquired");
    let mut req = request(
        10,
        LONG,
        "a",
        Some(Fence {
            lease: lease.clone(),
            epoch,
        }),
    );
    req.exclude_channels = vec!["paused".into(), "other".into()];
    let rows = bounded("claim", store.claim(&req)).await;
    assert_eq!(
        rows.len(),
        3,
        "only the open channel's rows: {:?}",
        ids(&rows)
    );
    assert!(rows.iter().all(|r| r.delivery.channel == "open"));
    let (_, rows) = claim(&*store, 10, LONG, "a", None).await;
    assert_eq!(ids(&rows), paused, "the excluded rows were left for later");
    td.drop_table().await;
}

per_db!(concurrent_claimers_never_share_a_row);
async fn concurrent_claimers_never_share_a_row(db: Db) {
    let Some(td) = TestDb::open(db, "st_conc").await else {
        return;
    };
    const ROWS: usize = 1000;
    td.insert("log", (0..ROWS).map(|_| (None, "{}".to_string())))
        .await;
    // Open the pool's connections first, so that no claimer starts late waiting for one.
    let mut warm = Vec::new();
    for _ in 0..6 {
        warm.push(td.store.pool().acquire().await.expect("connection"));
    }
    drop(warm);
    let seen: Arc<Mutex<Vec<i64>>> = Arc::default();
    let start = Arc::new(tokio::sync::Barrier::new(4));
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store = td.store.clone();
        let seen = seen.clone();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("worker{w}");
            start.wait().await;
            let mut batches = 0;
            loop {
                let req = request(50, LONG, &name, None);
                let rows = store.claim(&req).await.expect("claim");
                if rows.is_empty() {
                    // Every row is under a live claim or done: with 60s claims, none returns.
                    break;
                }
                batches += 1;
                seen.lock()
                    .unwrap()
                    .extend(rows.iter().map(|r| r.delivery.id));
                // "Sending": lets the other claimers run while this batch is held.
                tokio::time::sleep(Duration::from_millis(2)).await;
                let done: Vec<_> = rows
                    .iter()
                    .map(|r| Completion {
                        id: r.delivery.id,
                        token: req.token.clone(),
                        resolution: Resolution::Delivered,
                    })
                    .collect();
                let changed = store.complete(&done).await.expect("complete");
                assert_eq!(changed as usize, done.len(), "our own claims are live");
            }
            batches
        }));
    }
    let mut batches = Vec::new();
    for t in tasks {
        batches.push(
            tokio::time::timeout(Duration::from_secs(120), t)
                .await
                .expect("claimers did not finish within 120s")
                .expect("claimer panicked"),
        );
    }
    let seen = seen.lock().unwrap().clone();
    let unique: HashSet<i64> = seen.iter().copied().collect();
    eprintln!(
        "{db:?}: 4 claimers took {} rows in {batches:?} batches in {:?}",
        seen.len(),
        started.elapsed()
    );
    assert_eq!(unique.len(), seen.len(), "G2: a row was claimed twice");
    assert_eq!(unique.len(), ROWS, "G1: every row was claimed");
    assert_eq!(td.counts().await, [0, 0, ROWS as i64, 0]);
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE attempts <> 1")
            .await,
        0
    );
    td.drop_table().await;
}

/// Under a backlog, a claim asking for the newest share takes a channel's budget mostly oldest
/// first but one row in eight newest first, so a row just committed is not left behind the
/// backlog; when the channel has fewer due rows than its budget, both ends meet and each row
/// is claimed once.
async fn newest_rows_are_not_starved_by_a_backlog(db: Db) {
    let Some(td) = TestDb::open(db, "st_newest").await else {
        return;
    };
    let store = td.store.clone();
    td.insert("hook", (0..50).map(|_| (None, "{}".to_string())))
        .await;
    let all: Vec<i64> = {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {} ORDER BY id",
            td.table
        )))
        .fetch_all(store.pool())
        .await
        .expect("ids");
        rows.iter()
            .map(|r| r.try_get::<i64, _>(0).expect("id"))
            .collect()
    };
    let budget = |n: u32| {
        let mut req = request(n, LONG, "a", None);
        req.newest = true;
        req.budgets = Some(Budgets {
            channels: vec![("hook".into(), n)],
            others: None,
            starts: None,
        });
        req
    };
    let rows = bounded("claim", store.claim(&budget(16))).await;
    let mut want: Vec<i64> = all[..14].to_vec();
    want.extend(&all[48..]);
    assert_eq!(ids(&rows), want, "14 oldest and the 2 newest");
    // 34 rows left, then 18: the last claim asks for more than there are.
    let rows = bounded("claim", store.claim(&budget(16))).await;
    assert_eq!(rows.len(), 16);
    let rows = bounded("claim", store.claim(&budget(40))).await;
    let got = ids(&rows);
    assert_eq!(got.len(), 18, "every row left, each once: {got:?}");
    let unique: HashSet<i64> = got.iter().copied().collect();
    assert_eq!(unique.len(), 18);
    td.drop_table().await;
}
per_db!(newest_rows_are_not_starved_by_a_backlog);

per_db!(rows_due_again_below_the_floor_are_claimed_within_a_full_walk);
/// Claims start each channel's oldest pick above a floor (the rows below were claimed or not
/// claimable when a claim last looked), so they do not walk finished rows. A row that comes
/// due again below the floor (a retry with no backoff) is still claimed, by the full walk
/// made at least every `FULL_WALK_EVERY`; a row given back is claimed by the very next claim.
async fn rows_due_again_below_the_floor_are_claimed_within_a_full_walk(db: Db) {
    let Some(td) = TestDb::open(db, "st_floor").await else {
        return;
    };
    let store = td.store.clone();
    td.insert("hook", (0..12).map(|_| (None, "{}".to_string())))
        .await;
    let budget = |n: u32| hook_request(n, "a");
    let first = budget(4);
    let rows = bounded("claim", store.claim(&first)).await;
    assert_eq!(rows.len(), 4);
    let (retried, given_back) = (rows[1].delivery.id, rows[2].delivery.id);
    let retry = Resolution::Retry {
        delay: Duration::ZERO,
        error: "try again".into(),
    };
    complete(&*store, &[completion(&first, retried, retry)]).await;
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    while !seen.contains(&retried) {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "row {retried}, due again below the floor, was not claimed: {seen:?}"
        );
        let req = budget(2);
        let rows = bounded("claim", store.claim(&req)).await;
        seen.extend(ids(&rows));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let release = Resolution::Release {
        delay: Duration::ZERO,
        error: None,
    };
    complete(&*store, &[completion(&first, given_back, release)]).await;
    let rows = bounded("claim", store.claim(&budget(2))).await;
    assert!(
        ids(&rows).contains(&given_back),
        "a row given back is claimed by the next claim: {:?}",
        ids(&rows)
    );
    td.drop_table().await;
}

// A claim that reads only rows another claimer holds, up to its bound on reads, takes nothing
// and says so (`Queue::more_behind`): its floors moved past them, and the next claim reads
// on. Without it the relay took the empty claim for a table run dry and waited a poll, while
// the other claimer went on alone (docs/design.md, "When the loop claims").
per_db!(a_claim_that_reads_only_rows_another_claimer_holds_asks_to_come_again_at_once);
async fn a_claim_that_reads_only_rows_another_claimer_holds_asks_to_come_again_at_once(db: Db) {
    let Some(td) = TestDb::open(db, "st_behind").await else {
        return;
    };
    let store = td.store.clone();
    td.insert_hooks(1000).await;
    let other = SqlStore::connect(&td.url, &td.table, 2, Duration::from_secs(5))
        .await
        .expect("connect");
    let held = bounded("the other claim", other.claim(&hook_request(600, "b"))).await;
    assert_eq!(held.len(), 600);
    let last_held = held.iter().map(|r| r.delivery.id).max().expect("held rows");
    // Budgets of 32: windows of 64 rows, four reads a claim, so the 600 held rows take a few
    // claims to pass, each of which must ask to be made again at once.
    let mut empty = 0;
    let got = loop {
        let got = bounded("claim", store.claim(&hook_request(32, "a"))).await;
        if !got.is_empty() {
            break got;
        }
        assert!(
            store.more_behind(),
            "an empty claim among held rows asks for the next one at once"
        );
        empty += 1;
        assert!(empty < 10, "the claims did not pass the held rows");
    };
    assert!(empty >= 1, "the first claim read held rows only");
    assert!(
        got.iter().all(|r| r.delivery.id > last_held) && got.len() == 32,
        "then the free rows behind the held ones"
    );
    // Drained, a claim that finds nothing says there is nothing behind.
    let mut rest = got.len();
    loop {
        let got = bounded("claim", store.claim(&hook_request(100, "a"))).await;
        if got.is_empty() {
            break;
        }
        rest += got.len();
    }
    assert_eq!(rest, 400, "every free row, once");
    assert!(!store.more_behind(), "nothing left to read on to");
    td.drop_table().await;
}
