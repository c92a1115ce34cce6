//! The SQL store against real PostgreSQL, MariaDB and SQLite: migrations, claims (G1, G2),
//! fencing by the lease epoch (G2), result writes guarded by the claim token (G2), ordering
//! keys, concurrent claimers, and the `status` / `failed` views.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::process::until;
use crate::support::*;
use outbox_relay::store::{
    Budgets, ClaimRequest, ClaimedRow, Completion, Fence, LeaseTable, MAX_ERROR_LEN, NewRow, Probe,
    Queue, Resolution, SqlStore,
};
use sqlx::Row;

mod engines;
mod idle;
mod walks;

fn token() -> Arc<str> {
    outbox_relay::random_token().into()
}

fn request(limit: u32, ttl: Duration, claimer: &str, fence: Option<Fence>) -> ClaimRequest {
    ClaimRequest {
        limit,
        ttl,
        claimer: claimer.to_string(),
        token: token(),
        fence,
        exclude_channels: Vec::new(),
        max_payload_bytes: None,
        budgets: None,
        newest: false,
    }
}

/// Claims with a fresh token; returns the request (for its token) and the rows.
async fn claim(
    store: &dyn Queue,
    limit: u32,
    ttl: Duration,
    claimer: &str,
    fence: Option<Fence>,
) -> (ClaimRequest, Vec<ClaimedRow>) {
    let req = request(limit, ttl, claimer, fence);
    let rows = bounded("claim", store.claim(&req)).await;
    (req, rows)
}

/// A claim-mode request for up to `n` rows of channel `hook`.
fn hook_request(n: u32, claimer: &str) -> ClaimRequest {
    let mut req = request(n, LONG, claimer, None);
    req.budgets = Some(Budgets {
        channels: vec![("hook".into(), n)],
        others: None,
    });
    req
}

fn ids(rows: &[ClaimedRow]) -> Vec<i64> {
    rows.iter().map(|r| r.delivery.id).collect()
}

/// True when row `id` meets the SQL condition `cond`.
async fn row_is(td: &TestDb, id: i64, cond: &str) -> bool {
    td.scalar(&format!(
        "SELECT COUNT(*) FROM {{t}} WHERE id = {id} AND ({cond})"
    ))
    .await
        == 1
}

async fn attempts(td: &TestDb, id: i64) -> i64 {
    td.scalar(&format!("SELECT attempts FROM {{t}} WHERE id = {id}"))
        .await
}

async fn text_column(td: &TestDb, id: i64, col: &str) -> Option<String> {
    let sql = format!("SELECT {col} FROM {} WHERE id = {id}", td.table);
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(td.store.pool())
        .await
        .expect("select text column");
    row.try_get::<Option<String>, _>(0).expect("text")
}

fn now_sql(td: &TestDb) -> &'static str {
    td.store.dialect().now()
}

fn completion(req: &ClaimRequest, id: i64, resolution: Resolution) -> Completion {
    Completion {
        id,
        token: req.token.clone(),
        resolution,
    }
}

async fn complete(store: &dyn Queue, done: &[Completion]) -> u64 {
    bounded("complete", store.complete(done)).await
}

const LONG: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------

per_db!(migrate_is_idempotent);
async fn migrate_is_idempotent(db: Db) {
    let Some(td) = TestDb::open(db, "st_migrate").await else {
        return;
    };
    let id = td.enqueue("log", r#"{"n":1}"#, None).await;
    bounded("migrate again", td.store.migrate()).await;
    bounded("migrate a third time", td.store.migrate()).await;
    // A second instance starting on the same table migrates too.
    let other = SqlStore::connect(&td.url, &td.table, 2, Duration::from_secs(5))
        .await
        .expect("second store");
    bounded("migrate from a second store", other.migrate()).await;
    assert_eq!(td.scalar("SELECT COUNT(*) FROM {t}").await, 1);
    assert!(row_is(&td, id, "status = 'PENDING'").await);
    assert_eq!(
        td.scalar(&format!(
            "SELECT COUNT(*) FROM outbox_relay_schema WHERE target = '{}'",
            td.table
        ))
        .await,
        1,
        "one schema-version row per table"
    );
    // The table still works after re-migration.
    let id2 = bounded(
        "enqueue",
        other.enqueue(&NewRow {
            channel: "log".into(),
            payload: "{}".into(),
            ..NewRow::default()
        }),
    )
    .await;
    assert!(id2 > id);
    td.drop_table().await;
}

per_db!(migrate_rebuilds_a_table_dropped_by_hand);
/// A table dropped by hand leaves its schema version behind; migrating again builds the
/// table (with every version's indexes) instead of calling it up to date.
async fn migrate_rebuilds_a_table_dropped_by_hand(db: Db) {
    let Some(td) = TestDb::open(db, "st_redrop").await else {
        return;
    };
    let version_sql = format!(
        "SELECT version FROM outbox_relay_schema WHERE target = '{}'",
        td.table
    );
    let version = td.scalar(&version_sql).await;
    let before = index_count(&td, db).await;
    assert!(
        before > 1,
        "{}: {before} indexes after the first migration",
        db.name()
    );
    td.drop_table().await;
    bounded("migrate after the drop", td.store.migrate()).await;
    assert_eq!(index_count(&td, db).await, before, "{}", db.name());
    let id = td.enqueue("log", r#"{"n":1}"#, None).await;
    assert!(row_is(&td, id, "status = 'PENDING'").await);
    assert_eq!(td.scalar(&version_sql).await, version, "{}", db.name());
    td.drop_table().await;
}

/// How many indexes `td`'s table has.
async fn index_count(td: &TestDb, db: Db) -> i64 {
    let t = &td.table;
    td.scalar(&match db {
        Db::Postgres => format!("SELECT COUNT(*) FROM pg_indexes WHERE tablename = '{t}'"),
        Db::MySql => format!(
            "SELECT COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{t}'"
        ),
        Db::Sqlite => {
            format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = '{t}'")
        }
    })
    .await
}

per_db!(claim_takes_due_rows_in_id_order);
async fn claim_takes_due_rows_in_id_order(db: Db) {
    let Some(td) = TestDb::open(db, "st_claim").await else {
        return;
    };
    let store = td.store.clone();
    let mut all = Vec::new();
    for _ in 0..7 {
        all.push(td.enqueue("log", r#"{"n":1}"#, None).await);
    }
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

per_db!(an_idle_poll_reads_before_it_claims);
/// `Queue::probe` (an idle relay's poll, which claims only when it says so): one plain read
/// when nothing is claimable, whatever the table holds that is not (a retry not yet due, a
/// live claim, a finished row); the claim after it fenced as ever. On PostgreSQL the read
/// also says how long until a waiting row comes due.
async fn an_idle_poll_reads_before_it_claims(db: Db) {
    let Some(td) = TestDb::open(db, "st_probe").await else {
        return;
    };
    let store = td.store.clone();
    let lease = td.table.clone();
    let epoch = bounded(
        "lease_acquire",
        store.lease_acquire(&lease, "a", Duration::from_secs(30)),
    )
    .await
    .expect("free lease is acquired");
    // As the relay asks: per-channel budgets with a newest share, and the other channels.
    let poll = |epoch: i64| ClaimRequest {
        budgets: Some(Budgets {
            channels: vec![("hook".into(), 8), ("log".into(), 8)],
            others: Some((vec!["hook".into(), "log".into()], 2)),
        }),
        newest: true,
        ..request(
            18,
            LONG,
            "a",
            Some(Fence {
                lease: lease.clone(),
                epoch,
            }),
        )
    };
    // As the relay polls: the read, and the claim only if the read found something.
    let statements_of = async |req: &ClaimRequest| {
        let before = store.statements();
        let probe = bounded("probe", store.probe(req)).await;
        let rows = match probe {
            Probe::Claimable => bounded("claim", store.claim(req)).await,
            Probe::Nothing { .. } => Vec::new(),
        };
        (store.statements() - before, rows)
    };
    // How long until a waiting row comes due, as the read says: PostgreSQL only.
    let quiet = async |req: &ClaimRequest| match bounded("probe", store.probe(req)).await {
        Probe::Nothing { quiet_for } => quiet_for,
        Probe::Claimable => panic!("nothing is claimable"),
    };

    // On PostgreSQL a claim's fence takes a shared lock on the lease row (its xmax becomes
    // the claim's transaction id); the read takes none.
    let lease_xmax = async || {
        td.scalar(&format!(
            "SELECT xmax::text::bigint FROM outbox_relay_lease WHERE name = '{lease}'"
        ))
        .await
    };
    let xmax = if db == Db::Postgres {
        Some(lease_xmax().await)
    } else {
        None
    };
    let (n, rows) = statements_of(&poll(epoch)).await;
    assert!(rows.is_empty());
    assert_eq!(n, 1, "an empty table costs one read");
    let nothing_waits = match db {
        Db::Postgres => Duration::MAX,
        _ => Duration::ZERO,
    };
    assert_eq!(quiet(&poll(epoch)).await, nothing_waits);

    // Rows that are not claimable: finished, retrying later, under another live claim.
    let done = td.enqueue("log", "{}", None).await;
    let later = td.enqueue("hook", "{}", None).await;
    let held = td.enqueue("other", "{}", None).await;
    let (req, rows) = claim(&*store, 3, LONG, "b", None).await;
    assert_eq!(ids(&rows), [done, later, held]);
    let results = [
        completion(&req, done, Resolution::Delivered),
        completion(
            &req,
            later,
            Resolution::Retry {
                delay: Duration::from_secs(3600),
                error: "later".into(),
            },
        ),
    ];
    assert_eq!(complete(&*store, &results).await, 2);
    let (n, rows) = statements_of(&poll(epoch)).await;
    assert!(rows.is_empty(), "claimed {:?}", ids(&rows));
    // On MySQL and SQLite the read first asks an index whether any row is due at all (after
    // SQLite's first idle read, which reads the picks); the row due under a live claim says
    // "maybe", so the picks are read too.
    let reads = if db == Db::Postgres { 1 } else { 2 };
    assert_eq!(n, reads, "nothing claimable: the reads");
    if let Some(xmax) = xmax {
        assert_eq!(
            lease_xmax().await,
            xmax,
            "an idle poll locked the lease row"
        );
    }
    assert!(row_is(&td, later, "claim_token IS NULL").await);
    // A row due but under a live claim: no promise. Given back for two hours, the retry in
    // one hour is the next row due.
    assert_eq!(quiet(&poll(epoch)).await, Duration::ZERO);
    let back = Resolution::Release {
        delay: Duration::from_secs(7200),
        error: None,
    };
    assert_eq!(complete(&*store, &[completion(&req, held, back)]).await, 1);
    let left = quiet(&poll(epoch)).await;
    if db == Db::Postgres {
        assert!(
            (Duration::from_secs(3590)..=Duration::from_secs(3600)).contains(&left),
            "{left:?}"
        );
        // A thousand rows waiting (scheduled sends): the read looks at no more than that
        // many to say when the next is due, and with more makes no promise.
        td.exec(
            "INSERT INTO {t} (channel, payload, status, next_attempt_at) \
             SELECT 'hook', '{}', 'RETRY', now() + interval '1 day' FROM generate_series(1, 1000)",
        )
        .await;
        assert_eq!(quiet(&poll(epoch)).await, Duration::ZERO);
        td.exec("DELETE FROM {t} WHERE next_attempt_at > now() + interval '2 hours'")
            .await;
    } else {
        assert_eq!(left, Duration::ZERO);
    }
    // Only rows waiting for a later time: one read (on MySQL and SQLite, of an index alone,
    // where the picks would read every waiting row; see `store::engines`, `store::idle`).
    let (n, rows) = statements_of(&poll(epoch)).await;
    assert!(rows.is_empty(), "claimed {:?}", ids(&rows));
    assert_eq!(n, 1, "rows waiting for later cost one read");

    // Something claimable in each pick: the claim goes on as without the read.
    let due = td.enqueue("hook", "{}", None).await;
    let stray = td.enqueue("unknown", "{}", None).await;
    let req = poll(epoch);
    let (n, rows) = statements_of(&req).await;
    assert_eq!(ids(&rows), [due, stray]);
    assert!(n >= 2, "the read, then the claim");
    if let Some(xmax) = xmax {
        let polled = lease_xmax().await;
        assert_ne!(polled, xmax, "the claim's fence locked the lease row");
    }
    let token = req.token.to_string();
    assert!(row_is(&td, due, &format!("claim_token = '{token}'")).await);

    // The read is not fenced, the claim is: a stale epoch still claims nothing.
    let fresh = td.enqueue("log", "{}", None).await;
    let next = bounded("advance_epoch", store.advance_epoch(&lease, "c")).await;
    assert_eq!(next, epoch + 1);
    let (_, rows) = statements_of(&poll(epoch)).await;
    assert!(
        rows.is_empty(),
        "G2: a stale epoch claimed {:?}",
        ids(&rows)
    );
    assert!(row_is(&td, fresh, "claim_token IS NULL").await);
    td.drop_table().await;
}

per_db!(an_idle_read_that_finds_an_expired_claim_below_the_floor_leads_to_claiming_it);
/// A claim of an instance that died expires below this store's floor (the rows lie under
/// its picks' starting point): only a read that walks from the start finds them, at the
/// next full walk (at most `FULL_WALK_LONGEST`, 5 s, away; 500 ms here, where walks are
/// cheap). The idle read before it must leave that walk to the claim: when the
/// read took it, it said "claim", the claim with the floors found nothing, and so on at
/// every poll (a relay holding the lease and delivering nothing, in a chaos run).
async fn an_idle_read_that_finds_an_expired_claim_below_the_floor_leads_to_claiming_it(db: Db) {
    let Some(td) = TestDb::open(db, "st_probe_floor").await else {
        return;
    };
    let store = td.store.clone();
    let mut rows = Vec::new();
    for _ in 0..3 {
        rows.push(td.enqueue("hook", "{}", None).await);
    }
    let poll = || ClaimRequest {
        budgets: Some(Budgets {
            channels: vec![("hook".into(), 10)],
            others: None,
        }),
        ..request(10, Duration::from_secs(1), "a", None)
    };
    // Claimed, and never finished (the instance died): the claim runs out at 1 s, and this
    // store's floor, learnt from the claim, is past them once the commit grace is over.
    let taken = bounded("claim", store.claim(&poll())).await;
    assert_eq!(ids(&taken), rows);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let req = poll();
    let started = std::time::Instant::now();
    while bounded("probe", store.probe(&req)).await != Probe::Claimable {
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "the idle reads never found the expired claims"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = bounded("claim", store.claim(&req)).await;
    assert_eq!(
        ids(&again),
        rows,
        "the read found the rows and the claim after it did not"
    );
    td.drop_table().await;
}

per_db!(the_gauge_sample_counts_delivered_rows_only_when_asked);
/// The table gauges' sample: every status with `count_success`; otherwise the waiting and
/// FAILED rows only (the SUCCESS rows, nearly the whole table, are counted rarely).
async fn the_gauge_sample_counts_delivered_rows_only_when_asked(db: Db) {
    let Some(td) = TestDb::open(db, "st_sample").await else {
        return;
    };
    let store = td.store.clone();
    for _ in 0..6 {
        td.enqueue("log", "{}", None).await;
    }
    let (req, rows) = claim(&*store, 5, LONG, "a", None).await;
    let id = ids(&rows);
    let later = Duration::from_secs(3600);
    let results = [
        completion(&req, id[0], Resolution::Delivered),
        completion(&req, id[1], Resolution::Delivered),
        completion(&req, id[2], Resolution::Delivered),
        completion(
            &req,
            id[3],
            Resolution::Retry {
                delay: later,
                error: "later".into(),
            },
        ),
        completion(&req, id[4], Resolution::Failed { error: "no".into() }),
    ];
    assert_eq!(complete(&*store, &results).await, 5);
    let counts = async |count_success: bool| {
        let mut by = bounded("sample", store.sample(count_success))
            .await
            .by_status;
        by.sort();
        by
    };
    let all = counts(true).await;
    assert_eq!(
        all,
        [
            ("FAILED".to_string(), 1),
            ("PENDING".to_string(), 1),
            ("RETRY".to_string(), 1),
            ("SUCCESS".to_string(), 3)
        ]
    );
    assert_eq!(counts(false).await, all[..3]);
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

per_db!(complete_writes_each_resolution);
async fn complete_writes_each_resolution(db: Db) {
    let Some(td) = TestDb::open(db, "st_complete").await else {
        return;
    };
    let store = td.store.clone();
    let mut row = Vec::new();
    for _ in 0..4 {
        row.push(td.enqueue("log", r#"{"n":1}"#, None).await);
    }
    let (req, rows) = claim(&*store, 10, LONG, "a", None).await;
    assert_eq!(ids(&rows), row);
    let done = [
        completion(&req, row[0], Resolution::Delivered),
        completion(
            &req,
            row[1],
            Resolution::Retry {
                delay: Duration::from_millis(900),
                error: "503 from receiver".into(),
            },
        ),
        completion(
            &req,
            row[2],
            Resolution::Failed {
                error: "400: bad payload".into(),
            },
        ),
        completion(
            &req,
            row[3],
            Resolution::Release {
                delay: Duration::from_millis(900),
                error: Some("throttled".into()),
            },
        ),
    ];
    assert_eq!(complete(&*store, &done).await, 4);
    let now = now_sql(&td);
    let unclaimed = "claimed_by IS NULL AND claim_token IS NULL AND claimed_until IS NULL";

    assert!(
        row_is(
            &td,
            row[0],
            &format!(
                "status = 'SUCCESS' AND sent_at IS NOT NULL AND last_error IS NULL AND {unclaimed}"
            )
        )
        .await
    );
    assert_eq!(attempts(&td, row[0]).await, 1);

    assert!(
        row_is(
            &td,
            row[1],
            &format!(
                "status = 'RETRY' AND next_attempt_at > {now} AND sent_at IS NULL AND {unclaimed}"
            )
        )
        .await
    );
    assert_eq!(attempts(&td, row[1]).await, 1);
    assert_eq!(
        text_column(&td, row[1], "last_error").await.as_deref(),
        Some("503 from receiver")
    );

    assert!(row_is(&td, row[2], &format!("status = 'FAILED' AND {unclaimed}")).await);
    assert_eq!(attempts(&td, row[2]).await, 1);
    assert_eq!(
        text_column(&td, row[2], "last_error").await.as_deref(),
        Some("400: bad payload")
    );

    assert!(
        row_is(
            &td,
            row[3],
            &format!("status = 'PENDING' AND next_attempt_at > {now} AND {unclaimed}")
        )
        .await
    );
    assert_eq!(
        attempts(&td, row[3]).await,
        0,
        "a release is not an attempt"
    );
    assert_eq!(
        text_column(&td, row[3], "last_error").await.as_deref(),
        Some("throttled")
    );

    // Neither the RETRY row nor the released one is claimable before its delay...
    let (_, early) = claim(&*store, 10, LONG, "b", None).await;
    assert!(early.is_empty(), "claimed before due: {:?}", ids(&early));
    // ...and both are after it.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (req2, later) = claim(&*store, 10, LONG, "b", None).await;
    assert_eq!(ids(&later), vec![row[1], row[3]]);
    assert_eq!(later[0].delivery.attempts, 1);
    assert_eq!(later[1].delivery.attempts, 0);

    // A release without an error keeps the previous one; RETRY stays RETRY.
    let done = [
        completion(
            &req2,
            row[1],
            Resolution::Release {
                delay: Duration::ZERO,
                error: None,
            },
        ),
        completion(&req2, row[3], Resolution::Delivered),
    ];
    assert_eq!(complete(&*store, &done).await, 2);
    assert!(row_is(&td, row[1], &format!("status = 'RETRY' AND {unclaimed}")).await);
    assert_eq!(attempts(&td, row[1]).await, 1);
    assert_eq!(
        text_column(&td, row[1], "last_error").await.as_deref(),
        Some("503 from receiver")
    );
    assert!(row_is(&td, row[3], "status = 'SUCCESS' AND last_error IS NULL").await);
    let (_, again) = claim(&*store, 10, LONG, "c", None).await;
    assert_eq!(
        ids(&again),
        vec![row[1]],
        "released with no delay: due at once"
    );
    td.drop_table().await;
}

per_db!(batched_completions_with_two_tokens);
async fn batched_completions_with_two_tokens(db: Db) {
    let Some(td) = TestDb::open(db, "st_batch").await else {
        return;
    };
    let store = td.store.clone();
    td.insert("log", (0..720).map(|_| (None, "{}".to_string())))
        .await;
    // More than one result chunk (500) under the first token.
    let (t1, first) = claim(&*store, 600, LONG, "a", None).await;
    let (t2, second) = claim(&*store, 120, LONG, "b", None).await;
    assert_eq!(first.len(), 600);
    assert_eq!(second.len(), 120);
    let mut done: Vec<Completion> = first
        .iter()
        .map(|r| completion(&t1, r.delivery.id, Resolution::Delivered))
        .collect();
    for (i, r) in second.iter().enumerate() {
        let res = match i % 4 {
            0 => Resolution::Delivered,
            1 => Resolution::Retry {
                delay: Duration::from_secs(60),
                error: format!("retry {i}"),
            },
            2 => Resolution::Failed {
                error: format!("failed {i}"),
            },
            _ => Resolution::Release {
                delay: Duration::from_secs(60),
                error: None,
            },
        };
        done.push(completion(&t2, r.delivery.id, res));
    }
    // Interleave the two tokens and kinds, and add a write under a wrong token.
    done.reverse();
    done.push(Completion {
        id: first[0].delivery.id,
        token: token(),
        resolution: Resolution::Failed {
            error: "stale".into(),
        },
    });
    assert_eq!(complete(&*store, &done).await, 720);
    let [pending, retry, success, failed] = td.counts().await;
    assert_eq!((pending, retry, success, failed), (30, 30, 630, 30));
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE claim_token IS NOT NULL")
            .await,
        0
    );
    // Each RETRY / FAILED row got its own error text.
    let r = second[1].delivery.id;
    assert_eq!(
        text_column(&td, r, "last_error").await.as_deref(),
        Some("retry 1")
    );
    let f = second[2].delivery.id;
    assert_eq!(
        text_column(&td, f, "last_error").await.as_deref(),
        Some("failed 2")
    );
    assert_eq!(complete(&*store, &[]).await, 0);
    td.drop_table().await;
}

per_db!(long_errors_are_truncated);
async fn long_errors_are_truncated(db: Db) {
    let Some(td) = TestDb::open(db, "st_trunc").await else {
        return;
    };
    let store = td.store.clone();
    let a = td.enqueue("log", r#"{"n":1}"#, None).await;
    let b = td.enqueue("log", r#"{"n":1}"#, None).await;
    // 'é' is 2 bytes and the leading 'x' puts byte 1000 in the middle of one; '😀' is 4 bytes.
    let long_a = format!("x{}", "é".repeat(1500));
    let long_b = format!("ab{}", "😀".repeat(400));
    let (req, rows) = claim(&*store, 10, LONG, "a", None).await;
    assert_eq!(rows.len(), 2);
    let done = [
        completion(
            &req,
            a,
            Resolution::Failed {
                error: long_a.clone(),
            },
        ),
        completion(
            &req,
            b,
            Resolution::Retry {
                delay: Duration::from_secs(60),
                error: long_b.clone(),
            },
        ),
    ];
    assert_eq!(complete(&*store, &done).await, 2);
    for (id, original) in [(a, &long_a), (b, &long_b)] {
        let stored = text_column(&td, id, "last_error")
            .await
            .expect("last_error");
        assert!(
            stored.len() <= MAX_ERROR_LEN + 3,
            "{} bytes stored",
            stored.len()
        );
        assert!(stored.len() >= MAX_ERROR_LEN - 4, "cut too short");
        let body = stored.strip_suffix("...").unwrap_or(&stored);
        assert!(original.starts_with(body), "the stored error is a prefix");
    }
    td.drop_table().await;
}

per_db!(ordering_keys_deliver_one_at_a_time);
async fn ordering_keys_deliver_one_at_a_time(db: Db) {
    let Some(td) = TestDb::open(db, "st_order").await else {
        return;
    };
    let store = td.store.clone();
    let a1 = td.enqueue("log", r#"{"n":1}"#, Some("A")).await;
    let k1 = td.enqueue("log", r#"{"n":1}"#, None).await;
    let b1 = td.enqueue("log", r#"{"n":1}"#, Some("B")).await;
    let a2 = td.enqueue("log", r#"{"n":1}"#, Some("A")).await;
    let k2 = td.enqueue("log", r#"{"n":1}"#, None).await;
    let b2 = td.enqueue("log", r#"{"n":1}"#, Some("B")).await;
    let a3 = td.enqueue("log", r#"{"n":1}"#, Some("A")).await;

    let (r1, heads) = claim(&*store, 100, LONG, "a", None).await;
    assert_eq!(
        ids(&heads),
        vec![a1, k1, b1, k2],
        "only the heads of each key plus keyless rows"
    );
    assert_eq!(heads[0].ordering_key.as_deref(), Some("A"));
    assert_eq!(heads[1].ordering_key, None);

    // While A1 is claimed (still PENDING), A2 waits; so does B2 behind B1.
    let (_, none) = claim(&*store, 100, LONG, "b", None).await;
    assert!(none.is_empty(), "claimed behind a head: {:?}", ids(&none));

    // A1 released (throttled): still the head, A2 still waits.
    assert_eq!(
        complete(
            &*store,
            &[completion(
                &r1,
                a1,
                Resolution::Release {
                    delay: Duration::ZERO,
                    error: None,
                },
            )],
        )
        .await,
        1
    );
    let (r2, again) = claim(&*store, 100, LONG, "b", None).await;
    assert_eq!(
        ids(&again),
        vec![a1],
        "a released head is the next of its key"
    );

    // A1 delivered, B1 to RETRY later, keyless ones delivered.
    let done = [
        completion(&r2, a1, Resolution::Delivered),
        completion(
            &r1,
            b1,
            Resolution::Retry {
                delay: Duration::from_secs(3600),
                error: "later".into(),
            },
        ),
        completion(&r1, k1, Resolution::Delivered),
        completion(&r1, k2, Resolution::Delivered),
    ];
    assert_eq!(complete(&*store, &done).await, 4);
    // A2 is next for A; the RETRY head B1 holds back B2 only. Claimed as an idle poll does,
    // reading first whether anything is claimable: on MariaDB that read (plain, through the
    // index of unfinished rows of every channel) once found nothing here, under load with
    // the rows just changed (docs/design.md, "Claim-mode locks on MySQL").
    let r3 = request(100, LONG, "c", None);
    assert_eq!(
        bounded("probe", store.probe(&r3)).await,
        Probe::Claimable,
        "the idle poll's read missed a2"
    );
    let next = bounded("claim", store.claim(&r3)).await;
    assert_eq!(ids(&next), vec![a2], "the idle poll's read missed a2");
    assert_eq!(
        complete(
            &*store,
            &[completion(
                &r3,
                a2,
                Resolution::Failed {
                    error: "bad".into()
                }
            )],
        )
        .await,
        1
    );
    // A FAILED head no longer holds its key back.
    let (r4, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![a3]);
    assert_eq!(
        complete(&*store, &[completion(&r4, a3, Resolution::Delivered)]).await,
        1
    );
    // B1 becomes due and is delivered: then B2.
    td.exec(&format!(
        "UPDATE {{t}} SET next_attempt_at = {} WHERE id = {b1}",
        db_time(db, -1)
    ))
    .await;
    let (r5, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![b1]);
    assert_eq!(
        complete(&*store, &[completion(&r5, b1, Resolution::Delivered)]).await,
        1
    );
    let (_, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![b2]);
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

per_db!(status_and_failed_report_the_table);
async fn status_and_failed_report_the_table(db: Db) {
    let Some(td) = TestDb::open(db, "st_status").await else {
        return;
    };
    let store = td.store.clone();
    let lease = td.table.clone();
    let empty = bounded("status", store.status(&lease)).await;
    assert!(empty.counts.is_empty());
    assert!(empty.oldest_pending.is_none());
    assert!(empty.lease.is_none());

    let mut a = Vec::new();
    for _ in 0..5 {
        a.push(td.enqueue("a", r#"{"n":1}"#, None).await);
    }
    let mut b = Vec::new();
    for _ in 0..3 {
        b.push(td.enqueue("b", r#"{"n":1}"#, None).await);
    }
    // The oldest pending row was created an hour ago.
    td.exec(&format!(
        "UPDATE {{t}} SET created_at = {} WHERE id = {}",
        db_time(db, -3600),
        a[4]
    ))
    .await;
    // a[0], a[1] -> SUCCESS; a[2] -> FAILED; b[0], b[1] -> FAILED; a[3] claimed by "c1".
    let (req, rows) = claim(&*store, 8, LONG, "x", None).await;
    assert_eq!(rows.len(), 8);
    let fail = |id, e: &str| {
        completion(
            &req,
            id,
            Resolution::Failed {
                error: e.to_string(),
            },
        )
    };
    let release = |id| {
        completion(
            &req,
            id,
            Resolution::Release {
                delay: Duration::ZERO,
                error: None,
            },
        )
    };
    let done = [
        completion(&req, a[0], Resolution::Delivered),
        completion(&req, a[1], Resolution::Delivered),
        fail(a[2], "410 gone"),
        fail(b[0], "no such sink"),
        fail(b[1], "payload is not JSON"),
        release(a[3]),
        release(a[4]),
        release(b[2]),
    ];
    assert_eq!(complete(&*store, &done).await, 8);
    let (_, live) = claim(&*store, 1, LONG, "c1", None).await;
    assert_eq!(ids(&live), vec![a[3]]);
    bounded(
        "lease_acquire",
        store.lease_acquire(&lease, "holder-x", Duration::from_secs(20)),
    )
    .await
    .expect("lease");

    let st = bounded("status", store.status(&lease)).await;
    let count = |status: &str, channel: &str| {
        st.counts
            .iter()
            .find(|(s, c, _)| s == status && c == channel)
            .map(|(_, _, n)| *n)
    };
    assert_eq!(count("SUCCESS", "a"), Some(2));
    assert_eq!(count("FAILED", "a"), Some(1));
    assert_eq!(count("PENDING", "a"), Some(2));
    assert_eq!(count("FAILED", "b"), Some(2));
    assert_eq!(count("PENDING", "b"), Some(1));
    assert_eq!(count("SUCCESS", "b"), None);
    assert_eq!(st.counts.iter().map(|(_, _, n)| n).sum::<i64>(), 8);
    let oldest = st.oldest_pending.expect("oldest pending");
    assert!(
        oldest > Duration::from_secs(3590) && oldest < Duration::from_secs(3700),
        "oldest pending {oldest:?}, expected about an hour"
    );
    let l = st.lease.expect("lease row");
    assert_eq!(l.holder.as_deref(), Some("holder-x"));
    assert_eq!(l.epoch, 1);
    let left = l.remaining_ms.expect("remaining");
    assert!(left > 10_000 && left <= 20_000, "lease remaining {left}ms");
    assert_eq!(st.claims, vec![("c1".to_string(), 1)]);

    let failed = bounded("failed", store.failed(10, None)).await;
    assert_eq!(
        failed.iter().map(|f| f.id).collect::<Vec<_>>(),
        vec![b[1], b[0], a[2]],
        "newest first"
    );
    assert_eq!(failed[0].channel, "b");
    assert_eq!(failed[0].attempts, 1);
    assert_eq!(failed[0].last_error.as_deref(), Some("payload is not JSON"));
    assert_eq!(failed[2].last_error.as_deref(), Some("410 gone"));
    assert!(
        failed[0]
            .updated_at
            .as_deref()
            .is_some_and(|u| u.len() >= 19 && u.starts_with("20")),
        "updated_at {:?}",
        failed[0].updated_at
    );
    let only_a = bounded("failed", store.failed(10, Some("a"))).await;
    assert_eq!(only_a.iter().map(|f| f.id).collect::<Vec<_>>(), vec![a[2]]);
    let limited = bounded("failed", store.failed(1, None)).await;
    assert_eq!(limited.len(), 1);
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

per_db!(blocked_keys_gauge_counts_keys_waiting_behind_an_unfinished_row);
/// `ordering_blocked_keys`: keys with an unfinished row behind an earlier unfinished row of the
/// same key. (On MySQL/MariaDB it reads the indexed `open_key` column, which holds the key of
/// unfinished rows only: a finished head no longer blocks.)
async fn blocked_keys_gauge_counts_keys_waiting_behind_an_unfinished_row(db: Db) {
    let Some(td) = TestDb::open(db, "st_blocked").await else {
        return;
    };
    let store = td.store.clone();
    let k1 = td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("j")).await;
    let j2 = td.enqueue("hook", "{}", Some("j")).await;
    td.enqueue("hook", "{}", Some("alone")).await;
    td.enqueue("hook", "{}", None).await;
    let blocked = || async {
        store
            .sample(false)
            .await
            .expect("sample")
            .ordering_blocked_keys
    };
    assert_eq!(blocked().await, 2, "k and j wait behind their heads");
    td.exec(&format!(
        "UPDATE {} SET status = 'SUCCESS' WHERE id = {k1}",
        td.table
    ))
    .await;
    td.exec(&format!("DELETE FROM {} WHERE id = {j2}", td.table))
        .await;
    assert_eq!(
        blocked().await,
        1,
        "k's next row still waits behind the one after its head"
    );
    td.drop_table().await;
}
