//! PostgreSQL: how claims are planned, and that they are HOT updates.

use super::*;

/// A store with one connection, so every statement below runs on the claims' own session.
async fn one_session(url: &str, table: &str) -> SqlStore {
    SqlStore::connect(url, table, 1, Duration::from_secs(5))
        .await
        .expect("connect")
}

/// The session's `plan_cache_mode`.
async fn plan_cache_mode(store: &SqlStore) -> String {
    sqlx::query_scalar("SHOW plan_cache_mode")
        .fetch_one(store.pool())
        .await
        .expect("show")
}

/// PostgreSQL: the plan each statement prepared on `store`'s session whose text is `LIKE` the
/// pattern runs, as `EXPLAIN EXECUTE` shows it: (statement name, plan).
async fn prepared_plans(store: &SqlStore, like: &str) -> Vec<(String, String)> {
    let statements: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, parameter_types::text FROM pg_prepared_statements WHERE statement LIKE $1",
    )
    .bind(like)
    .fetch_all(store.pool())
    .await
    .expect("prepared statements");
    let mut plans = Vec::new();
    for (name, types) in statements {
        // Any value of each type: a generic plan does not depend on them.
        let values: Vec<&str> = types
            .trim_matches(|c| c == '{' || c == '}')
            .split(',')
            .map(|t| match t.trim_matches('"') {
                "text" => "'x'",
                "bigint" | "integer" | "smallint" | "double precision" => "1",
                _ => "NULL",
            })
            .collect();
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN EXECUTE {name}({})",
            values.join(", ")
        )))
        .fetch_all(store.pool())
        .await
        .expect("explain");
        plans.push((name, plan.join("\n")));
    }
    plans
}

/// PostgreSQL: the relay's sessions plan no bitmap scans (docs/design.md, "No bitmap scans").
/// On a table filled and never analyzed since (as a new table with a first backlog), the
/// generic plan of a claim with a newest pick read the channel's whole backlog through a
/// bitmap and sorted it, to keep 64 rows; and a result write for the rows of two claims finds them by
/// primary key (its `OR` of one condition per claim token would otherwise be a bitmap, or
/// without bitmaps a scan of the table). A setting of the URL's own is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_plan_no_bitmap_scans() {
    let Some(td) = TestDb::open(Db::Postgres, "st_bitmap").await else {
        return;
    };
    // A plan's choice follows the table's size: at 5,000 rows it was still the index's.
    td.exec(
        "INSERT INTO {t} (channel, payload) SELECT 'hook', '{}' FROM generate_series(1, 60000)",
    )
    .await;
    let store = one_session(&td.url, &td.table).await;
    let show = async |store: &SqlStore| -> String {
        sqlx::query_scalar("SHOW enable_bitmapscan")
            .fetch_one(store.pool())
            .await
            .expect("show")
    };
    assert_eq!(show(&store).await, "off");
    let mut claims = Vec::new();
    for claimer in ["a", "b"] {
        let mut req = hook_request(4, claimer);
        req.newest = true;
        let rows = bounded("claim", store.claim(&req)).await;
        assert_eq!(rows.len(), 4);
        claims.push((req, rows[0].delivery.id));
    }
    let retry = || Resolution::Retry {
        delay: LONG,
        error: "503".into(),
    };
    let done: Vec<Completion> = claims
        .iter()
        .map(|(req, id)| completion(req, *id, retry()))
        .collect();
    assert_eq!(complete(&store, &done).await, 2);
    let mut plans = prepared_plans(&store, CLAIMS).await;
    assert!(!plans.is_empty(), "no claim prepared");
    plans.extend(prepared_plans(&store, READS).await);
    let writes = prepared_plans(&store, "UPDATE % OR %").await;
    assert_eq!(writes.len(), 1, "the result write of two claims");
    plans.extend(writes);
    for (name, plan) in plans {
        assert!(!plan.contains("Bitmap"), "{name}:\n{plan}");
        assert!(
            !plan.contains(&format!("Seq Scan on {}", td.table)),
            "{name}:\n{plan}"
        );
    }

    let sep = if td.url.contains('?') { '&' } else { '?' };
    let own = format!("{}{sep}options=-c%20enable_bitmapscan%3Don", td.url);
    assert_eq!(show(&one_session(&own, &td.table).await).await, "on");
    td.drop_table().await;
}

/// PostgreSQL: the relay's sessions run generic plans (docs/design.md, "Generic plans"), so a
/// claim is planned once per connection, not at every execution; the generic plans of its
/// statements find the rows through indexes, never by scanning the table, with thousands of
/// finished rows before the due ones; and a `plan_cache_mode` given in the URL is kept. Read
/// on the claims' own session (one connection): `pg_prepared_statements`, and `EXPLAIN
/// EXECUTE` of each claim statement, which shows the plan an execution uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_are_planned_once_and_never_scan_the_table() {
    let Some(td) = TestDb::open(Db::Postgres, "st_plan").await else {
        return;
    };
    finished_then_due(&td, 9).await;
    // And a backlog of another channel: the plans are made for a table with many waiting rows
    // (joined to the picks instead of looked up by id, the UPDATE then hashed the table).
    td.insert("other", (0..5000).map(|_| (None, "{}".to_string())))
        .await;
    td.exec("ANALYZE {t}").await;
    let store = one_session(&td.url, &td.table).await;
    assert_eq!(plan_cache_mode(&store).await, "force_generic_plan");
    let mut claimed = 0;
    for newest in [false, true, false, true, false, false, false, false] {
        let mut req = request(2, LONG, "a", None);
        req.budgets = Some(Budgets {
            channels: vec![("hook".into(), 2)],
            others: None,
            starts: None,
        });
        req.newest = newest;
        claimed += bounded("claim", store.claim(&req)).await.len();
    }
    assert_eq!(claimed, 10, "the nine due rows and the head of key k");
    // A claim is a read (its text follows the parts it reads: with and without a newest
    // window) and the claim of the chosen ids (one text for any number of rows).
    let mut key_walks = 0;
    for (like, shapes, runs) in [(READS, 2, 8), (CLAIMS, 1, 5)] {
        let statements: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT name, parameter_types::text, generic_plans, custom_plans \
             FROM pg_prepared_statements WHERE statement LIKE $1",
        )
        .bind(like)
        .fetch_all(store.pool())
        .await
        .expect("prepared statements");
        assert!(statements.len() >= shapes, "{like}: {statements:?}");
        assert!(
            statements.iter().all(|s| s.3 == 0),
            "planned at execution: {statements:?}"
        );
        assert!(
            statements.iter().map(|s| s.2).sum::<i64>() >= runs,
            "{like}: {statements:?}"
        );
        for (name, plan) in prepared_plans(&store, like).await {
            assert!(
                !plan.contains(&format!("Seq Scan on {}", td.table)),
                "a claim ({name}) scans the table past {FINISHED} finished rows:\n{plan}"
            );
            assert!(plan.contains("Index Scan"), "{plan}");
            // The head test (`p`) and a key's read (`q`) walk the index of unfinished rows by
            // key, never the primary key or the index by id, whose walk would pass every
            // finished row of the table (docs/design.md, "Claims on PostgreSQL").
            for line in plan.lines() {
                for alias in ["p", "q"] {
                    if line.contains("Scan") && line.contains(&format!("on {} {alias} ", td.table))
                    {
                        assert!(
                            line.contains("ordering_idx"),
                            "{name}: a key's walk by another index:\n{plan}"
                        );
                        key_walks += 1;
                    }
                }
            }
        }
    }

    assert!(key_walks > 0, "no head test seen in the plans");

    // A setting of the URL's own is kept.
    let sep = if td.url.contains('?') { '&' } else { '?' };
    let custom = format!(
        "{}{sep}options=-c%20plan_cache_mode%3Dforce_custom_plan",
        td.url
    );
    let store = one_session(&custom, &td.table).await;
    assert_eq!(plan_cache_mode(&store).await, "force_custom_plan");
    td.drop_table().await;
}

/// PostgreSQL: a claim changes no indexed column, so it is a HOT update (no index entry
/// written) as long as the page has room for the claimed copy of the row. A claim takes rows
/// in id order, most of a page at once, so this holds only because the table leaves room for
/// a copy of every row (schema version 7). Counted with the server's own statistics, read
/// once the claiming session has ended (which publishes them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_are_hot_updates() {
    let Some(td) = TestDb::open(Db::Postgres, "st_hot").await else {
        return;
    };
    td.insert_hooks(1000).await;
    let store = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("connect");
    let (_, rows) = claim(&store, 400, LONG, "a", None).await;
    assert_eq!(rows.len(), 400);
    store.pool().close().await;
    let stats = format!(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = '{}'",
        td.table
    );
    let read = async || {
        let row = sqlx::query(sqlx::AssertSqlSafe(stats.clone()))
            .fetch_one(td.store.pool())
            .await
            .expect("pg_stat_user_tables");
        let counts: (i64, i64) = (row.get(0), row.get(1));
        counts
    };
    // The statistics are published a moment after the commit; the assertion below says so
    // if they never are.
    let (updated, hot) = match poll_every(POLL, Duration::from_secs(15), async || {
        Some(read().await).filter(|(updated, _)| *updated >= 400)
    })
    .await
    {
        Some(counts) => counts,
        None => read().await,
    };
    assert_eq!(
        updated, 400,
        "the claim's updates were not published in time"
    );
    assert!(
        hot >= 390,
        "{hot} of {updated} claimed rows were HOT updates; the rest wrote index entries"
    );
    td.drop_table().await;
}
