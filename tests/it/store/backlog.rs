//! A keyed backlog costs a claim no more than a short queue does (docs/design.md, "Bounded
//! reads"): with 100,000 rows queued behind the heads of 20 ordering keys, a claim reads about
//! as many index entries as with 1,000, both when it takes the heads and when it takes runs of
//! the freed keys. Counted by the server itself on the claims' own session: MariaDB's
//! `Handler_read_*`, PostgreSQL's index and table tuples read (`pg_stat_user_indexes`,
//! `pg_stat_user_tables`, flushed by `pg_stat_force_next_flush()`). SQLite keeps no such
//! counters: the plans of its claim statement, its read of the unserved channels and its gauges
//! are checked instead. On MariaDB a backlog written key by key also costs a claim no more
//! than one written a row of each key in turn.

use super::*;
use crate::support::plans::sqlite_plan;

/// Keys the backlog is spread over: one row of each in turn, or each key's rows one after
/// another ([`Order`]).
const KEYS: usize = 20;

/// What the server counts as read by `store`'s only session so far.
async fn rows_read(db: Db, store: &SqlStore, table: &str) -> i64 {
    match db {
        Db::MySql => {
            let rows = sqlx::query("SHOW SESSION STATUS LIKE 'Handler_read%'")
                .fetch_all(store.pool())
                .await
                .expect("status");
            if std::env::var("BACKLOG_DEBUG").is_ok() {
                for r in &rows {
                    let n: String = r.try_get(0).unwrap_or_default();
                    let v: String = r.try_get(1).unwrap_or_default();
                    println!("  {n} = {v}");
                }
            }
            rows.iter()
                .map(|r| {
                    r.try_get::<String, _>(1)
                        .ok()
                        .and_then(|v| v.parse::<i64>().ok())
                        .or_else(|| r.try_get::<i64, _>(1).ok())
                        .expect("a number")
                })
                .sum()
        }
        _ => {
            sqlx::query("SELECT pg_stat_force_next_flush()")
                .execute(store.pool())
                .await
                .expect("flush");
            sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(i.idx_tup_read), 0) + MAX(t.seq_tup_read) AS BIGINT)
                 FROM pg_stat_user_tables t
                 LEFT JOIN pg_stat_user_indexes i ON i.relid = t.relid
                 WHERE t.relname = $1",
            )
            .bind(table)
            .fetch_one(store.pool())
            .await
            .expect("statistics")
        }
    }
}

/// How the backlog's rows were written: a row of each key in turn, or each key's rows one
/// after another.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Order {
    Interleaved,
    KeyByKey,
}

/// Rows read by each of four claims (budget 64) over `per_key` rows of each of [`KEYS`] keys,
/// every claim's rows delivered before the next: the heads first, then runs of freed keys.
async fn claim_costs(db: Db, per_key: usize, order: Order) -> Option<Vec<i64>> {
    let td = TestDb::open(db, "st_backlog").await?;
    let key = move |i: usize| match order {
        Order::Interleaved => i % KEYS,
        Order::KeyByKey => i / per_key,
    };
    let rows = (0..KEYS * per_key).map(|i| (Some(format!("k{}", key(i))), "{}".to_string()));
    td.insert("hook", rows).await;
    let analyze = match db {
        Db::MySql => "ANALYZE TABLE {t}",
        _ => "ANALYZE {t}",
    };
    td.exec(analyze).await;
    let store = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("connect");
    blocked_keys_gauge_is_quick(&store).await;
    let mut costs = Vec::new();
    for round in 0..4 {
        let before = rows_read(db, &store, &td.table).await;
        let (req, got) = claim_round(&store, round, order).await;
        costs.push(rows_read(db, &store, &td.table).await - before);
        deliver(&store, &req, &got).await;
    }
    store.pool().close().await;
    td.drop_table().await;
    Some(costs)
}

/// Claim `round` of 64 rows over the backlog: the first takes each key's head, the next
/// ones the freed keys' runs, 64 rows each. Key by key, the first claim's windows pass
/// few keys' heads, and the next claims take those keys' runs and the heads further on.
async fn claim_round(
    store: &SqlStore,
    round: usize,
    order: Order,
) -> (ClaimRequest, Vec<ClaimedRow>) {
    let req = hook_request(64, "backlog");
    let got = bounded("claim", store.claim(&req)).await;
    let want = if round == 0 { KEYS } else { 64 };
    match order {
        Order::Interleaved => assert_eq!(got.len(), want, "round {round}: {:?}", ids(&got)),
        Order::KeyByKey => assert!(!got.is_empty(), "round {round}: nothing claimed"),
    }
    (req, got)
}

/// Records `got`, claimed by `req`, as delivered.
async fn deliver(store: &SqlStore, req: &ClaimRequest, got: &[ClaimedRow]) {
    let done: Vec<Completion> = (got.iter())
        .map(|r| completion(req, r.delivery.id, Resolution::Delivered))
        .collect();
    assert_eq!(complete(store, &done).await, got.len() as u64);
}

/// The `ordering_blocked_keys` gauge, sampled every 15 s, counts the [`KEYS`] keys in one pass
/// of the backlog. Looking up an earlier row of its key for each row, PostgreSQL compared each
/// row with every row of its key: 17 s over 100,000 rows of 20 keys, a core kept busy by a
/// gauge (21 ms grouped; MariaDB 190 against 20 ms). The bound is a hang guard, 200 times the
/// grouped figure.
async fn blocked_keys_gauge_is_quick(store: &SqlStore) {
    let sample = tokio::time::timeout(Duration::from_secs(5), store.sample(false)).await;
    let sample = sample.expect("the sample took over 5 s").expect("sample");
    assert_eq!(sample.ordering_blocked_keys, KEYS as i64);
}

/// The claims over a 100,000-row backlog read no more than twice what they read over a
/// 1,000-row one (plus a little for the indexes' depth), and each a few hundred rows at most.
async fn backlog_does_not_cost_the_claim(db: Db) {
    let (Some(short), Some(long)) = (
        claim_costs(db, 50, Order::Interleaved).await,
        claim_costs(db, 5_000, Order::Interleaved).await,
    ) else {
        return;
    };
    println!("{db:?}: rows read per claim, 1,000 queued {short:?}, 100,000 queued {long:?}");
    for (round, (s, l)) in short.iter().zip(&long).enumerate() {
        assert!(
            *l <= 2 * s + 100,
            "round {round}: {l} rows read behind 100,000 rows, {s} behind 1,000"
        );
        assert!(*l <= 2_000, "round {round}: {l} rows read for 64 rows");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_keyed_backlog_does_not_cost_the_claim() {
    backlog_does_not_cost_the_claim(Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_keyed_backlog_does_not_cost_the_claim() {
    backlog_does_not_cost_the_claim(Db::MySql).await;
}

/// A backlog written key by key (each key's rows one after another, 250 ids a key) costs
/// MariaDB's claims no more than one written a row of each key in turn. The check after the
/// lock reads the chosen keys' unfinished rows up to a bound shared by keys whose last chosen
/// rows lie near each other; key by key, that bound lay past the rest of every such key, and
/// each claim of four keys' runs read the 234 rows behind each run (docs/design.md, "Keyed
/// backlogs on MySQL/MariaDB").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keys_written_key_by_key_cost_the_claim_no_more() {
    let (Some(interleaved), Some(by_key)) = (
        claim_costs(Db::MySql, 250, Order::Interleaved).await,
        claim_costs(Db::MySql, 250, Order::KeyByKey).await,
    ) else {
        return;
    };
    println!("rows read per claim, interleaved {interleaved:?}, key by key {by_key:?}");
    for (round, (i, k)) in interleaved.iter().zip(&by_key).enumerate() {
        assert!(
            *k <= i + i / 2 + 50,
            "round {round}: {k} rows read key by key, {i} interleaved"
        );
    }
}

/// SQLite keeps no counters of rows read, so the plans are checked. The claim statement: the
/// chosen ids drive it, each row found by its id, whatever the backlog. Without statistics
/// SQLite's planner took the status index for the claim's `o.id IN (...) AND o.status IN
/// (...)` and walked every unfinished row for each claim, and for the read of the channels
/// no sink serves (every 2 s) it walked and sorted them all (docs/design.md, "Claims on
/// SQLite"); that read now seeks the index of unfinished rows by channel. Then the claims take
/// the heads and the freed keys' runs as on the other databases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claims_walk_no_backlog() {
    let Some(td) = TestDb::open(Db::Sqlite, "st_backlog_plan").await else {
        return;
    };
    let rows = (0..KEYS * 500).map(|i| (Some(format!("k{}", i % KEYS)), "{}".to_string()));
    td.insert("hook", rows).await;
    let store = &td.store;
    let mut req = hook_request(64, "backlog");
    req.tails = vec![Tail {
        key: "k0".into(),
        row: 1,
        channel: "hook".into(),
        run: 16,
    }];
    let [claim, unserved] = (store.sqlite_plans(&req, &[21, 22, 41], "zzz").await)
        .expect("plans")
        .expect("plans on SQLite");
    let by_id = "SEARCH o USING INTEGER PRIMARY KEY";
    assert!(claim.iter().any(|l| l.starts_with(by_id)), "{claim:?}");
    let by_channel = format!(
        "SEARCH o USING INDEX {}_channel_due_idx (channel<?)",
        td.table
    );
    assert!(unserved.iter().any(|l| l == &by_channel), "{unserved:?}");
    for (line, plan) in
        (claim.iter().map(|l| (l, &claim))).chain(unserved.iter().map(|l| (l, &unserved)))
    {
        assert!(!line.contains("status_idx"), "{line}: {plan:?}");
        assert!(!line.contains("TEMP B-TREE"), "{line}: {plan:?}");
        for table in ["o", "p", "h", td.table.as_str()] {
            assert!(
                !line.starts_with(&format!("SCAN {table}")),
                "{line}: {plan:?}"
            );
        }
    }
    // The gauges read the relay's indexes by name on SQLite: each walks its index (the
    // oldest row's age one end of it), neither the status index nor a sort; and they count.
    let gauges = store.gauge_statements();
    assert_eq!(gauges.len(), 2, "{gauges:?}");
    let t = &td.table;
    let walks = [
        format!("SEARCH {t} USING INDEX {t}_pending_age_idx"),
        format!("SEARCH o USING INDEX {t}_open_key_idx"),
    ];
    for (q, walk) in gauges.iter().zip(walks) {
        let plan = sqlite_plan(store, q).await;
        let walked = |l: &String| l.starts_with(&walk);
        assert!(plan.iter().any(walked), "{q}: {plan:?}");
        for line in &plan {
            assert!(!line.contains("status_idx"), "{q}: {plan:?}");
            assert!(!line.contains("TEMP B-TREE"), "{q}: {plan:?}");
        }
    }
    blocked_keys_gauge_is_quick(store).await;
    let sample = bounded("sample", store.sample(false)).await;
    assert!(sample.oldest_pending.is_some(), "{sample:?}");
    for round in 0..3 {
        let (req, got) = claim_round(store, round, Order::Interleaved).await;
        deliver(store, &req, &got).await;
    }
}
