//! Tests of one database's own claim and write paths: how MySQL/MariaDB claims walk and lock
//! its indexes, PostgreSQL's plans and HOT updates, SQLite's single writer.

use super::*;

/// Finished rows before the due ones: half of the [`FINISHED`] rows have no ordering key, half
/// are under key `k`; then `due` rows without a key and one under `k`, and fresh statistics.
async fn finished_then_due(td: &TestDb, due: usize) {
    td.insert("hook", (0..FINISHED / 2).map(|_| (None, "{}".to_string())))
        .await;
    td.insert(
        "hook",
        (0..FINISHED / 2).map(|_| (Some("k".to_string()), "{}".to_string())),
    )
    .await;
    td.exec("UPDATE {t} SET status = 'SUCCESS'").await;
    td.insert("hook", (0..due).map(|_| (None, "{}".to_string())))
        .await;
    td.insert("hook", [(Some("k".to_string()), "{}".to_string())])
        .await;
    let analyze = match td.db {
        Db::MySql => "ANALYZE TABLE {t}",
        _ => "ANALYZE {t}",
    };
    td.exec(analyze).await;
}

/// See [`finished_then_due`].
const FINISHED: usize = 10_000;

/// A claim's read, in `pg_prepared_statements` (`LIKE`).
const READS: &str = "SELECT * FROM (SELECT CAST(0 AS BIGINT) AS part%";
/// A claim of chosen rows, in `pg_prepared_statements` (`LIKE`).
const CLAIMS: &str = "WITH chosen %SET claimed_by%";

/// The server's `Handler_read_next` for the session of `store`'s only connection (MySQL/MariaDB):
/// index entries read in order so far.
async fn handler_read_next(store: &SqlStore) -> i64 {
    let row = sqlx::query("SHOW SESSION STATUS LIKE 'Handler_read_next'")
        .fetch_one(store.pool())
        .await
        .expect("status");
    row.try_get::<String, _>(1)
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .or_else(|| row.try_get::<i64, _>(1).ok())
        .expect("a number")
}

/// No claim walks finished rows (MySQL/MariaDB, which has no partial indexes): with thousands
/// of SUCCESS rows before the due ones, in the claimed channel and under the due rows'
/// ordering key, a claim reads about as many index entries as it returns rows. Counted with
/// the server's own `Handler_read_next` on the store's only connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claims_never_walk_finished_rows() {
    let Some(td) = TestDb::open(Db::MySql, "st_walk").await else {
        return;
    };
    finished_then_due(&td, 5).await;
    // One connection: the statistics read back are the claim's session's.
    let store = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("connect");
    let read_next = || handler_read_next(&store);
    let mut req = request(10, LONG, "a", None);
    req.budgets = Some(Budgets {
        channels: vec![("hook".into(), 10)],
        others: Some((vec!["hook".into()], 5)),
    });
    let before = read_next().await;
    let rows = bounded("claim", store.claim(&req)).await;
    let read = read_next().await - before;
    assert_eq!(rows.len(), 6, "the five due rows and the head of key k");
    assert!(
        read < 100,
        "the claim read {read} index entries past {FINISHED} finished rows"
    );
    td.drop_table().await;
}

/// MySQL/MariaDB: a claim reads one bounded window of its channel's unfinished rows (and
/// locks only the rows it takes), whether other instances claim (claim mode) or not (leader
/// mode; `ClaimRequest::alone`): the server's `Handler_read_next` on the store's only
/// connection stays within the window, with 200 rows waiting. (Leader mode's claims once read
/// every row waiting behind a key, every claim.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_claim_reads_one_window_in_either_mode() {
    let Some(td) = TestDb::open(Db::MySql, "st_alone").await else {
        return;
    };
    td.insert_hooks(200).await;
    td.exec("ANALYZE TABLE {t}").await;
    let store = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("connect");
    let read_next = || handler_read_next(&store);
    for alone in [false, true] {
        let mut req = hook_request(10, if alone { "leader" } else { "claimer" });
        req.alone = alone;
        let before = read_next().await;
        let rows = bounded("claim", store.claim(&req)).await;
        let read = read_next().await - before;
        assert_eq!(rows.len(), 10, "alone: {alone}");
        assert!(
            read <= 80,
            "alone: {alone}: {read} index entries read for a window of 64 rows"
        );
    }
    td.drop_table().await;
}

/// Makes a claim by `claimer` slow (MySQL/MariaDB): a trigger sleeps 0.1 s for each row its
/// `UPDATE` marks, so the claim's transaction holds its locks that long per row.
async fn slow_claims_by(td: &TestDb, claimer: &str) {
    let sql = format!(
        "CREATE TRIGGER {t}_slow BEFORE UPDATE ON {t} FOR EACH ROW \
         BEGIN IF NEW.claimed_by = '{claimer}' THEN DO SLEEP(0.1), '{t}'; END IF; END",
        t = td.table
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(td.store.pool())
        .await
        .expect("create trigger");
}

/// Whether a claim is marking its rows (in the trigger's sleep of [`slow_claims_by`], which
/// names the table): its picks are done. (Probing its rows' locks before would race with the picks: a row a probe
/// holds for a moment is skipped by them.)
async fn marking(td: &TestDb) -> bool {
    td.scalar(&format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE INFO LIKE 'DO SLEEP%' AND INFO LIKE '%{}%'",
        td.table
    ))
    .await
        > 0
}

/// Whether another session can lock row `id` now (`FOR UPDATE NOWAIT`).
async fn lockable(td: &TestDb, id: i64) -> bool {
    let mut tx = td.store.pool().begin().await.expect("begin");
    let sql = format!(
        "SELECT id FROM {} WHERE id = {id} FOR UPDATE NOWAIT",
        td.table
    );
    let free = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_optional(&mut *tx)
        .await
        .is_ok();
    tx.rollback().await.expect("rollback");
    free
}

/// MySQL/MariaDB, claim mode: a claim locks only the rows it returns. Its picks walk past
/// retries not yet due, rows under another instance's live claim and a row behind an earlier
/// one of its ordering key; while the claim's transaction is open (slowed by a trigger),
/// another session can lock every one of those, and none of the rows claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claim_mode_locks_only_the_rows_it_returns() {
    let Some(td) = TestDb::open(Db::MySql, "st_locks").await else {
        return;
    };
    td.insert_hooks(20).await;
    td.exec(
        "UPDATE {t} SET status = 'RETRY', attempts = 1, \
         next_attempt_at = NOW(6) + INTERVAL 1 HOUR",
    )
    .await;
    let not_due = td.scalar("SELECT MAX(id) FROM {t}").await;
    td.insert_hooks(20).await;
    td.exec(&format!(
        "UPDATE {{t}} SET claimed_by = 'other', claim_token = 'x', \
         claimed_until = NOW(6) + INTERVAL 1 HOUR WHERE id > {not_due}"
    ))
    .await;
    let walked_past = td.scalar("SELECT MAX(id) FROM {t}").await;
    td.insert(
        "hook",
        (0..2).map(|_| (Some("k".to_string()), "{}".to_string())),
    )
    .await;
    let behind_its_key = td.scalar("SELECT MAX(id) FROM {t}").await;
    td.insert_hooks(9).await;
    slow_claims_by(&td, "slow").await;

    let store = td.store.clone();
    let claim = tokio::spawn(async move { store.claim(&hook_request(20, "slow")).await });
    // The claim is inside its UPDATE for 1 s of trigger sleeps.
    let first = behind_its_key - 1;
    until(
        "the claim to mark its rows",
        Duration::from_secs(5),
        || async { claim.is_finished() || marking(&td).await },
    )
    .await;
    assert!(
        !claim.is_finished(),
        "the claim returned early: {:?}",
        claim.await.map(|r| r.map(|r| ids(&r)))
    );
    let mut locked = Vec::new();
    for id in (1..=walked_past).chain([behind_its_key]) {
        if !lockable(&td, id).await {
            locked.push(id);
        }
    }
    let still_open = !lockable(&td, first).await;
    let rows = bounded("claim", async { Ok(claim.await) })
        .await
        .expect("join")
        .expect("claim");
    assert!(still_open, "the claim committed before the probes ended");
    assert_eq!(
        locked,
        Vec::<i64>::new(),
        "rows the claim walked past stayed locked"
    );
    assert_eq!(
        ids(&rows),
        (behind_its_key - 1..=behind_its_key + 9)
            .filter(|i| *i != behind_its_key)
            .collect::<Vec<_>>()
    );
    td.drop_table().await;
}

/// MySQL/MariaDB, claim mode: claims made while another claim holds the oldest rows (its
/// transaction slowed by a trigger) read past them and take a full budget each, instead of
/// coming back empty: the second one reads past the held rows once, the third past those and
/// the second's (claimed by then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claims_read_past_rows_another_claim_holds() {
    let Some(td) = TestDb::open(Db::MySql, "st_past").await else {
        return;
    };
    td.insert_hooks(40).await;
    slow_claims_by(&td, "slow").await;
    let first = td.scalar("SELECT MIN(id) FROM {t}").await;
    let store = td.store.clone();
    let slow = tokio::spawn(async move { store.claim(&hook_request(10, "slow")).await });
    until(
        "the slow claim to mark its rows",
        Duration::from_secs(5),
        || async { slow.is_finished() || marking(&td).await },
    )
    .await;
    assert!(
        !slow.is_finished(),
        "the slow claim returned early: {:?}",
        slow.await.map(|r| r.map(|r| ids(&r)))
    );
    let mut newest = hook_request(10, "b");
    newest.newest = true;
    let b = bounded("claim b", td.store.claim(&newest)).await;
    let c = bounded("claim c", td.store.claim(&hook_request(10, "c"))).await;
    let held = !lockable(&td, first).await;
    let slow = bounded("claim", async { Ok(slow.await) })
        .await
        .expect("join")
        .expect("claim");
    assert!(held, "the slow claim committed before the others ended");
    assert_eq!(ids(&slow), (first..first + 10).collect::<Vec<_>>());
    // b's newest share is the channel's newest row; the rest of its budget the oldest after
    // the held rows.
    let mut want_b: Vec<i64> = (first + 10..first + 19).collect();
    want_b.push(first + 39);
    assert_eq!(ids(&b), want_b, "b read past the held rows");
    assert_eq!(
        ids(&c),
        (first + 19..first + 29).collect::<Vec<_>>(),
        "c read past the held rows and b's"
    );
    td.drop_table().await;
}

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
        });
        req.newest = newest;
        claimed += bounded("claim", store.claim(&req)).await.len();
    }
    assert_eq!(claimed, 10, "the nine due rows and the head of key k");
    // A claim is a read (its text follows the parts it reads: with and without a newest
    // window) and the claim of the chosen ids (one text for any number of rows).
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
        }
    }

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

/// MySQL/MariaDB, schema versions 8 and 9: a table migrated by an older build (version 7's
/// indexes) is brought to the slimmer set, in which a delivery changes only `open_idx` and
/// `status_idx`; and the reads the dropped indexes served still come from an index: the
/// oldest unfinished row's age from `open_idx` alone, the FAILED page from `failed_idx`. An
/// idle read's question "is any unfinished row due?" is answered from `open_idx` alone too
/// (version 9), without reading the rows that wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_deliveries_change_two_secondary_indexes() {
    let Some(td) = TestDb::open(Db::MySql, "st_slim").await else {
        return;
    };
    // Version 7's shape.
    td.exec(
        "ALTER TABLE {t} DROP INDEX {t}_failed_idx, DROP INDEX {t}_open_idx, \
         DROP COLUMN failed_flag, ADD INDEX {t}_failed_idx (status, id), \
         ADD INDEX {t}_open_idx (open_channel, id), \
         ADD INDEX {t}_due_idx (status, next_attempt_at), \
         ADD INDEX {t}_age_idx (status, created_at)",
    )
    .await;
    td.exec("UPDATE outbox_relay_schema SET version = 7 WHERE target = '{t}'")
        .await;
    bounded("migrate to version 9", td.store.migrate()).await;
    bounded("migrate again", td.store.migrate()).await;
    let index = |name: &str| {
        let (td, name) = (&td, format!("{}_{name}", td.table));
        async move {
            let cols: Vec<String> = sqlx::query_scalar(
                "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = \
                 DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = ? ORDER BY SEQ_IN_INDEX",
            )
            .bind(&td.table)
            .bind(&name)
            .fetch_all(td.store.pool())
            .await
            .expect("index columns");
            cols.join(",")
        }
    };
    assert_eq!(index("due_idx").await, "");
    assert_eq!(index("age_idx").await, "");
    assert_eq!(index("failed_idx").await, "failed_flag,id");
    assert_eq!(
        index("open_idx").await,
        "open_channel,id,created_at,next_attempt_at"
    );
    assert_eq!(index("status_idx").await, "status,updated_at");

    // A delivered row leaves failed_flag NULL (no entry of failed_idx changes); a FAILED one
    // sets it.
    let ids = [
        td.enqueue("hook", "{}", None).await,
        td.enqueue("hook", "{}", None).await,
        td.enqueue("hook", "{}", None).await,
    ];
    td.exec(&format!(
        "UPDATE {{t}} SET status = 'SUCCESS' WHERE id = {}",
        ids[0]
    ))
    .await;
    td.exec(&format!(
        "UPDATE {{t}} SET status = 'FAILED', created_at = NOW(6) - INTERVAL 2 HOUR \
         WHERE id = {}",
        ids[1]
    ))
    .await;
    td.exec(&format!(
        "UPDATE {{t}} SET created_at = NOW(6) - INTERVAL 1 HOUR WHERE id = {}",
        ids[2]
    ))
    .await;
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE failed_flag = 1")
            .await,
        1
    );
    let explain = |sql: &str| {
        let sql = format!("EXPLAIN {}", sql.replace("{t}", &td.table));
        let pool = td.store.pool().clone();
        async move {
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .expect("explain");
            let text = |i: usize| {
                row.try_get::<Option<String>, _>(i)
                    .ok()
                    .flatten()
                    .or_else(|| {
                        row.try_get::<Option<Vec<u8>>, _>(i)
                            .ok()
                            .flatten()
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                    })
                    .unwrap_or_default()
            };
            // id, select_type, table, type, possible_keys, key, key_len, ref, rows, Extra
            (text(5), text(9))
        }
    };
    let (key, extra) = explain(
        "SELECT MIN(created_at) FROM {t} FORCE INDEX ({t}_open_idx) \
         WHERE open_channel IS NOT NULL",
    )
    .await;
    assert_eq!(key, format!("{}_open_idx", td.table));
    assert!(
        extra.contains("Using index"),
        "reads the table too: {extra}"
    );
    // As `mysql_claim::anything_due` asks it.
    let (key, extra) = explain(
        "SELECT 1 FROM {t} FORCE INDEX ({t}_open_idx) \
         WHERE open_channel IS NOT NULL AND next_attempt_at <= NOW(6) LIMIT 1",
    )
    .await;
    assert_eq!(key, format!("{}_open_idx", td.table));
    assert!(
        extra.contains("Using index"),
        "the due check reads the table too: {extra}"
    );
    let (key, _) = explain(
        "SELECT id FROM {t} FORCE INDEX ({t}_failed_idx) WHERE failed_flag = 1 \
         AND status = 'FAILED' AND id < 1000000 ORDER BY id DESC LIMIT 51",
    )
    .await;
    assert_eq!(key, format!("{}_failed_idx", td.table));
    // The store's own reads: the oldest unfinished row is the one an hour old (the FAILED
    // one, older, is finished), and the FAILED page holds the FAILED row.
    let status = bounded("status", td.store.status(&td.table)).await;
    let oldest = status.oldest_pending.expect("an unfinished row").as_secs();
    assert!((3590..3700).contains(&oldest), "oldest {oldest} s");
    let failed = bounded("failed page", td.store.failed(50, None)).await;
    assert_eq!(failed.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[1]]);
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
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let (updated, hot) = loop {
        let row = sqlx::query(sqlx::AssertSqlSafe(stats.clone()))
            .fetch_one(td.store.pool())
            .await
            .expect("pg_stat_user_tables");
        let (updated, hot): (i64, i64) = (row.get(0), row.get(1));
        if updated >= 400 || std::time::Instant::now() > deadline {
            break (updated, hot);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
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

/// SQLite has one writer: a store's claims and result writes wait for one another inside the
/// process instead of colliding on the database's write lock (where the loser sleeps in
/// SQLite's busy handler). With every connection's busy timeout at zero a collision would be
/// an error at once; four workers claiming and completing side by side on two connections
/// meet none, and every row ends SUCCESS once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claims_and_results_of_one_store_never_collide() {
    let Some(td) = TestDb::open(Db::Sqlite, "st_writer").await else {
        return;
    };
    const ROWS: i64 = 2000;
    td.insert_hooks(ROWS as usize).await;
    let store = Arc::new(
        SqlStore::connect(&td.url, &td.table, 2, Duration::from_secs(5))
            .await
            .expect("connect"),
    );
    let mut conns = Vec::new();
    for _ in 0..2 {
        let mut c = store.pool().acquire().await.expect("acquire");
        sqlx::query("PRAGMA busy_timeout = 0")
            .execute(&mut *c)
            .await
            .expect("busy_timeout");
        conns.push(c);
    }
    drop(conns);
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let store = store.clone();
        workers.spawn(async move {
            let mut done = 0u64;
            loop {
                let (req, rows) = claim(&*store, 50, LONG, &format!("w{w}"), None).await;
                if rows.is_empty() {
                    return done;
                }
                let results: Vec<Completion> = rows
                    .iter()
                    .map(|r| completion(&req, r.delivery.id, Resolution::Delivered))
                    .collect();
                done += complete(&*store, &results).await;
            }
        });
    }
    let mut written = 0;
    while let Some(w) = workers.join_next().await {
        written += w.expect("worker");
    }
    assert_eq!(written, ROWS as u64, "each row's result written once");
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE status = 'SUCCESS'")
            .await,
        ROWS
    );
    td.drop_table().await;
}

/// The bundled SQLite is built without its memory counters (`.cargo/config.toml`; docs/design.md,
/// "SQLite's memory counters"): SQLite lists the options it was compiled with, and a build
/// that lost the setting (the config file removed, or `LIBSQLITE3_FLAGS` overridden without
/// it) fails here instead of quietly taking a mutex at every allocation again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_is_built_without_its_memory_counters() {
    let Some(td) = TestDb::open(Db::Sqlite, "st_memstat").await else {
        return;
    };
    let options: Vec<String> = sqlx::query_scalar("PRAGMA compile_options")
        .fetch_all(td.store.pool())
        .await
        .expect("compile_options");
    assert!(
        options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
        "SQLite's compile options lack DEFAULT_MEMSTATUS=0: {options:?}"
    );
    td.drop_table().await;
}
