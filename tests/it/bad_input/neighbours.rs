//! What one sink, table or verb does not do to the others: a slow sink delays no other, the
//! log sink fails non-JSON payloads alone, two tables get their own leases, and the admin
//! verbs race the relay without losing rows.

use super::*;

// ---------------------------------------------------------------------------------------------

/// A slow sink never delays another sink's rows: 20 rows for a sink that takes 1 s per send
/// with concurrency 4 (or a rate of 4/s) are claimed first, then 20 rows for a fast sink;
/// with 8 in-flight slots, the fast rows must not wait for the slow campaign.
async fn slow_sink_does_not_delay_others(db: Db, slow_limit: fn(Sink) -> Sink) {
    let Some(td) = TestDb::open(db, "bad_fair").await else {
        return;
    };
    let slow = Receiver::start(None).await;
    slow.set_delay(Duration::from_millis(1000));
    let fast = Receiver::start(None).await;
    for (channel, n) in [("slow", 20), ("fast", 20)] {
        for i in 0..n {
            let payload = json(db, &format!(r#"{{"n":{i}}}"#));
            td.exec(&format!(
                "INSERT INTO {{t}} (channel, payload) VALUES ('{channel}', {payload})"
            ))
            .await;
        }
    }
    let cfg = Config::webhook(&fast.url())
        .poll_interval(Duration::from_millis(200))
        .in_flight(8)
        .no_sinks()
        .with_sink(slow_limit(Sink::webhook("slow", &slow.url())).timeout(Duration::from_secs(5)))
        .with_sink(Sink::webhook("fast", &fast.url()).timeout(Duration::from_secs(5)));
    let _relay = RelayProc::start(&td, &cfg, "one");
    fast.expect_requests(20, Duration::from_secs(20), "fast rows")
        .await;
    slow.expect_requests(1, Duration::from_secs(5), "slow rows")
        .await;
    let first_slow = slow.requests()[0].at;
    let last_fast = fast
        .requests()
        .iter()
        .map(|r| r.at)
        .max()
        .expect("requests");
    let behind = last_fast.saturating_duration_since(first_slow);
    // The slow campaign takes about 5 s; one claim round trip is well under a second.
    assert!(
        behind < Duration::from_millis(1500),
        "the last fast row arrived {behind:?} after the slow campaign began\nfast: {}\nslow: {}",
        crate::support::receiver::timeline(&fast.requests(), first_slow),
        crate::support::receiver::timeline(&slow.requests(), first_slow)
    );
    until_finished(&td, Duration::from_secs(30)).await;
    assert_eq!(td.counts().await, [0, 0, 40, 0]);
    let mut seen = slow.count_by_id();
    seen.extend(fast.count_by_id());
    assert_eq!(seen.len(), 40, "every row sent");
    assert_eq!(slow.len() + fast.len(), 40, "every row sent once");
    td.drop_table().await;
}

async fn slow_sink_by_concurrency(db: Db) {
    slow_sink_does_not_delay_others(db, |s| s.concurrency(4)).await
}
per_db!(slow_sink_by_concurrency);

async fn slow_sink_by_rate(db: Db) {
    slow_sink_does_not_delay_others(db, |s| s.rate_per_sec(4.0)).await
}
per_db!(slow_sink_by_rate);

// ---------------------------------------------------------------------------------------------

/// The log sink fails a payload that is not JSON like every other sink (it used to log it
/// and mark it SUCCESS). SQLite stores any text in the payload column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_sink_fails_payloads_that_are_not_json() {
    let Some(td) = TestDb::open(Db::Sqlite, "bad_logsink").await else {
        return;
    };
    td.exec(r#"INSERT INTO {t} (channel, payload) VALUES ('log', '{"ok":1}')"#)
        .await;
    td.exec("INSERT INTO {t} (channel, payload) VALUES ('log', 'not json {')")
        .await;
    let cfg = Config::webhook("http://127.0.0.1:1/")
        .no_sinks()
        .with_sink(Sink::of_kind("log", "log"));
    let _relay = RelayProc::start(&td, &cfg, "one");
    until_finished(&td, Duration::from_secs(20)).await;
    let state = rows(&td).await;
    let mut by_status: Vec<(String, Option<String>)> = state.into_values().collect();
    by_status.sort();
    assert_eq!(by_status[0].0, "FAILED");
    assert!(
        by_status[0]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("not valid JSON")),
        "{by_status:?}"
    );
    assert_eq!(by_status[1].0, "SUCCESS");
}

// ---------------------------------------------------------------------------------------------

/// Two outbox tables in one database, relays with the default lease settings: each relay's
/// lease is named after its table, so both tables are served (with one shared default name,
/// one relay would stand by for ever).
async fn two_tables_default_lease_names(db: Db) {
    let Some(td) = TestDb::open(db, "bad_two_tables").await else {
        return;
    };
    let other = format!("{}_b", td.table);
    let store_b =
        outbox_relay::store::SqlStore::connect(&td.url, &other, 2, Duration::from_secs(5))
            .await
            .expect("connect");
    store_b.migrate().await.expect("migrate");
    let rx = Receiver::start(None).await;
    let cfg = base(&rx).write(td.dir.path(), "relay.toml");
    let mut relays = Vec::new();
    for (i, table) in [td.table.clone(), other.clone()].iter().enumerate() {
        let payload = json(db, r#"{"n":1}"#);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (channel, payload) VALUES ('hook', {payload})"
        )))
        .execute(td.store.pool())
        .await
        .expect("insert");
        let mut cmd = relay_command(td.dir.path());
        cmd.env("OUTBOX_RELAY__DATABASE__URL", &td.url)
            .env("OUTBOX_RELAY__DATABASE__TABLE", table)
            .env("OUTBOX_RELAY__HTTP__LISTEN", "127.0.0.1:0")
            .env("OUTBOX_RELAY__RELAY__INSTANCE_ID", format!("r{i}"))
            .arg("--config")
            .arg(&cfg)
            .arg("run");
        relays.push(RelayProc::spawn(
            &format!("r{i}"),
            &mut cmd,
            td.dir.path().join(format!("r{i}.log")),
        ));
    }
    rx.expect_requests(2, Duration::from_secs(20), "one row from each table")
        .await;
    for table in [&td.table, &other] {
        let pool = td.store.pool();
        until(
            format!("table {table} served"),
            Duration::from_secs(10),
            || async move {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT COUNT(*) FROM {table} WHERE status <> 'SUCCESS'"
                )))
                .fetch_one(pool)
                .await
                .expect("count")
                .try_get::<i64, _>(0)
                .expect("count")
                    == 0
            },
        )
        .await;
    }
    let names: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT name FROM outbox_relay_lease WHERE name IN ('outbox-relay:{}', 'outbox-relay:{other}')",
        td.table
    )))
    .fetch_all(td.store.pool())
    .await
    .expect("lease rows")
    .iter()
    .map(|r| r.try_get::<String, _>(0).expect("name"))
    .collect();
    assert_eq!(
        names.len(),
        2,
        "lease names derived from the tables: {names:?}"
    );
    drop(relays);
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {other}")))
        .execute(td.store.pool())
        .await;
    td.drop_table().await;
}
per_db!(two_tables_default_lease_names);

// ---------------------------------------------------------------------------------------------

/// `requeue --all-failed` racing `purge --status FAILED`, many rounds: every row is either
/// requeued (and then PENDING, never deleted) or deleted while still FAILED; nothing
/// PENDING/RETRY is ever deleted and no row is lost.
async fn admin_verbs_race_without_losing_rows(db: Db) {
    use outbox_relay::store::{Finished, Requeue};
    let Some(td) = TestDb::open(db, "bad_admin_race").await else {
        return;
    };
    let store = td.store.clone();
    let old = db_time(db, -3600);
    for round in 0..25 {
        // 40 FAILED rows, an hour old; the marker is the round.
        for i in 0..40 {
            let payload = json(db, &format!(r#"{{"round":{round},"i":{i}}}"#));
            td.exec(&format!(
                "INSERT INTO {{t}} (channel, payload, status, updated_at, ordering_key)
                 VALUES ('hook', {payload}, 'FAILED', {old}, 'r{round}')"
            ))
            .await;
        }
        let (requeued, deleted) = tokio::join!(
            async {
                store
                    .requeue(&Requeue::AllFailed { channel: None }, false)
                    .await
                    .expect("requeue")
                    .requeued
            },
            async {
                let mut n = 0;
                loop {
                    let d = store
                        .purge(Finished::Failed, Duration::from_secs(60), 7)
                        .await
                        .expect("purge");
                    n += d;
                    if d == 0 {
                        break n;
                    }
                }
            }
        );
        let left = td
            .scalar(&format!(
                "SELECT COUNT(*) FROM {{t}} WHERE ordering_key = 'r{round}'"
            ))
            .await;
        let pending = td
            .scalar(&format!(
                "SELECT COUNT(*) FROM {{t}} WHERE ordering_key = 'r{round}' AND status = 'PENDING'"
            ))
            .await;
        assert_eq!(
            requeued + deleted,
            40,
            "round {round}: requeued {requeued} + deleted {deleted}"
        );
        assert_eq!(
            pending as u64, requeued,
            "round {round}: a requeued row was deleted ({left} rows left)"
        );
        assert_eq!(left, pending, "round {round}: FAILED rows left behind");
        td.exec("UPDATE {t} SET status = 'SUCCESS'").await;
    }
    td.drop_table().await;
}
per_db!(admin_verbs_race_without_losing_rows);
