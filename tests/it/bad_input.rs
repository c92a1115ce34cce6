//! Bad input and poisoned results never block good rows (issue 9), through the real binary on
//! PostgreSQL, MariaDB and SQLite with a loopback webhook receiver:
//! - rows whose columns cannot be decoded (wrong storage class, invalid UTF-8, NULL) or whose
//!   payload is over every sink's limit end FAILED naming the column; their neighbours are
//!   delivered once;
//! - a result the database refuses (a trigger) is isolated: that row ends FAILED with a
//!   generic reason, every other result is written, nothing is sent twice;
//! - a failure reason with NUL and control characters is stored cleaned;
//! - while results cannot be written (a transient error), nothing new is claimed, and once
//!   they can, every row ends SUCCESS having been sent exactly once.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::config::{Config, Sink};
use crate::support::process::*;
use crate::support::receiver::{Receiver, Reply};
use crate::support::*;
use sqlx::Row;

/// The config every test starts from: one webhook sink `hook`, one attempt per row.
fn base(rx: &Receiver) -> Config {
    Config::webhook(&rx.url()).retry(Duration::from_secs(1), Duration::from_secs(1), 1)
}

/// (status, last_error) of every row, by id.
async fn rows(td: &TestDb) -> HashMap<i64, (String, Option<String>)> {
    let sql = format!("SELECT id, status, last_error FROM {}", td.table);
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r.try_get::<i64, _>(0).expect("id"),
                (
                    r.try_get(1).expect("status"),
                    r.try_get(2).expect("last_error"),
                ),
            )
        })
        .collect()
}

/// Waits until no row is PENDING or RETRY.
async fn until_finished(td: &TestDb, timeout: Duration) {
    until("every row finished", timeout, || async move {
        let c = td.counts().await;
        c[0] + c[1] == 0
    })
    .await;
}

/// A JSON payload literal for an INSERT on `db`.
fn json(db: Db, text: &str) -> String {
    match db {
        Db::Postgres => format!("'{text}'::jsonb"),
        _ => format!("'{text}'"),
    }
}

/// Inserts good rows `{"n": i}` for each i in `ns`.
async fn insert_good(td: &TestDb, ns: impl IntoIterator<Item = usize>) {
    td.insert(
        "hook",
        ns.into_iter().map(|i| (None, format!(r#"{{"n":{i}}}"#))),
    )
    .await;
}

/// Asserts that every row but `bad` is SUCCESS and was received exactly once, and that no
/// request was made for a row in `bad`.
fn assert_good_delivered_once(
    rx: &Receiver,
    state: &HashMap<i64, (String, Option<String>)>,
    bad: &[i64],
) {
    let counts = rx.count_by_id();
    for (id, (status, err)) in state {
        if bad.contains(id) {
            continue;
        }
        assert_eq!(status, "SUCCESS", "row {id}: {err:?}");
        assert_eq!(counts.get(id), Some(&1), "row {id} deliveries");
    }
}

// ---------------------------------------------------------------------------------------------

async fn undecodable_rows_fail_alone(db: Db) {
    let Some(td) = TestDb::open(db, "bad_decode").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    insert_good(&td, 1..=3).await;
    // Over every sink's limit (max_body_bytes = 2000 below): never loaded.
    let big = json(db, &format!(r#"{{"pad":"{}"}}"#, "x".repeat(5000)));
    td.exec(&format!(
        "INSERT INTO {{t}} (channel, payload) VALUES ('hook', {big})"
    ))
    .await;
    let big_id = td.scalar("SELECT MAX(id) FROM {t}").await;
    // (row, what its reason must say)
    let mut bad_rows = vec![(
        big_id,
        "exceeds sinks.hook.max_body_bytes (2000)".to_string(),
    )];
    if db == Db::Sqlite {
        // What applications write into SQLite's untyped columns: a BLOB payload (Python's
        // sqlite3 for `bytes`), text that is not UTF-8, a BLOB recipient, a text attempts
        // count, a BLOB channel, a next_attempt_at that is not a time (it would never be due).
        for (col, value) in [
            ("payload", "X'7B226E223A317D'"),
            ("payload", "CAST(X'7B226E223AFF7D' AS TEXT)"),
            ("recipient", "X'3031303132333435'"),
            ("attempts", "'many'"),
            ("channel", "X'686F6F6B'"),
            ("next_attempt_at", "'tomorrow'"),
        ] {
            let (channel, payload) = match col {
                "payload" => ("'hook'".to_string(), value.to_string()),
                "channel" => (value.to_string(), r#"'{"n":0}'"#.to_string()),
                _ => ("'hook'".to_string(), r#"'{"n":0}'"#.to_string()),
            };
            let extra = match col {
                "recipient" | "attempts" | "next_attempt_at" => format!(", {col}"),
                _ => String::new(),
            };
            let extra_value = match col {
                "recipient" | "attempts" | "next_attempt_at" => format!(", {value}"),
                _ => String::new(),
            };
            td.exec(&format!(
                "INSERT INTO {{t}} (channel, payload{extra}) VALUES ({channel}, {payload}{extra_value})"
            ))
            .await;
            let id = td.scalar("SELECT MAX(id) FROM {t}").await;
            bad_rows.push((id, format!("column {col}")));
        }
    }
    insert_good(&td, 100..=102).await;

    let cfg = base(&rx).batch_size(20).hook(|s| s.max_body_bytes(2000));
    let _relay = RelayProc::start(&td, &cfg, "one");
    until_finished(&td, Duration::from_secs(20)).await;

    let state = rows(&td).await;
    let bad: Vec<i64> = bad_rows.iter().map(|(id, _)| *id).collect();
    assert_good_delivered_once(&rx, &state, &bad);
    for (id, expected) in &bad_rows {
        let (status, err) = &state[id];
        let err = err.as_deref().unwrap_or_default();
        assert_eq!(status, "FAILED", "row {id} ({expected}): {err}");
        assert!(
            err.contains(expected.as_str()),
            "row {id}: the reason should say {expected:?}: {err}"
        );
        assert!(rx.requests_for(*id).is_empty(), "row {id} must not be sent");
    }
    td.drop_table().await;
}
per_db!(undecodable_rows_fail_alone);

// ---------------------------------------------------------------------------------------------

/// Makes the database refuse to mark row `id` SUCCESS (the way a constraint or an audit
/// trigger of the application's might), whatever the relay writes for it.
async fn refuse_success_of(td: &TestDb, id: i64) {
    match td.db {
        Db::Postgres => {
            td.exec(&format!(
                "CREATE FUNCTION {{t}}_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN IF NEW.status = 'SUCCESS' AND NEW.id = {id} THEN
                 RAISE EXCEPTION 'row {id} may not succeed'; END IF; RETURN NEW; END $$"
            ))
            .await;
            td.exec(
                "CREATE TRIGGER {t}_refuse BEFORE UPDATE ON {t} FOR EACH ROW
                 EXECUTE FUNCTION {t}_refuse()",
            )
            .await;
        }
        Db::MySql => {
            td.exec(&format!(
                "CREATE TRIGGER {{t}}_refuse BEFORE UPDATE ON {{t}} FOR EACH ROW
                 BEGIN IF NEW.status = 'SUCCESS' AND NEW.id = {id} THEN
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'may not succeed'; END IF; END"
            ))
            .await;
        }
        Db::Sqlite => {
            td.exec(&format!(
                "CREATE TRIGGER {{t}}_refuse BEFORE UPDATE ON {{t}} FOR EACH ROW
                 WHEN NEW.status = 'SUCCESS' AND NEW.id = {id}
                 BEGIN SELECT RAISE(ABORT, 'may not succeed'); END"
            ))
            .await;
        }
    }
}

async fn refused_result_is_isolated(db: Db) {
    let Some(td) = TestDb::open(db, "bad_refused").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    insert_good(&td, 1..=30).await;
    let poisoned = td.scalar("SELECT MIN(id) FROM {t}").await + 7;
    refuse_success_of(&td, poisoned).await;
    let _relay = RelayProc::start(&td, &base(&rx), "one");
    until_finished(&td, Duration::from_secs(20)).await;
    // Long enough for a stuck result to show up as a re-send.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let state = rows(&td).await;
    assert_good_delivered_once(&rx, &state, &[poisoned]);
    let (status, err) = &state[&poisoned];
    assert_eq!(status, "FAILED");
    let err = err.as_deref().unwrap_or_default();
    assert!(
        err.contains("could not be stored") && err.contains("delivered"),
        "generic reason expected: {err}"
    );
    assert_eq!(
        rx.requests_for(poisoned).len(),
        1,
        "the poisoned row is sent once, not in a loop"
    );
    td.drop_table().await;
}
per_db!(refused_result_is_isolated);

// ---------------------------------------------------------------------------------------------

async fn control_characters_in_reasons_are_stored_clean(db: Db) {
    let Some(td) = TestDb::open(db, "bad_nul").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    insert_good(&td, 1..=10).await;
    let first = td.scalar("SELECT MIN(id) FROM {t}").await;
    let victim = first + 4;
    rx.script(
        victim,
        vec![Reply::status(400).body("bad\u{0}token\u{1b}[0m \u{7f}end")],
    );
    let _relay = RelayProc::start(&td, &base(&rx), "one");
    until_finished(&td, Duration::from_secs(20)).await;

    let state = rows(&td).await;
    assert_good_delivered_once(&rx, &state, &[victim]);
    let (status, err) = &state[&victim];
    assert_eq!(status, "FAILED");
    let err = err.as_deref().unwrap_or_default();
    assert!(err.contains("400") && err.contains("bad"), "{err}");
    assert!(
        !err.chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t'),
        "control characters stored: {err:?}"
    );
    td.drop_table().await;
}
per_db!(control_characters_in_reasons_are_stored_clean);

// ---------------------------------------------------------------------------------------------

/// Makes every result write fail with a transient error (serialization failure, SQLSTATE
/// 40001) while `{t}_block` has a row; claims (which do not change the status) still work.
async fn block_results(td: &TestDb) {
    td.exec("CREATE TABLE {t}_block (x INT)").await;
    td.exec("INSERT INTO {t}_block VALUES (1)").await;
    match td.db {
        Db::Postgres => {
            td.exec(
                "CREATE FUNCTION {t}_blockf() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN IF NEW.status <> OLD.status AND EXISTS (SELECT 1 FROM {t}_block) THEN
                 RAISE EXCEPTION 'results blocked' USING ERRCODE = '40001'; END IF;
                 RETURN NEW; END $$",
            )
            .await;
            td.exec(
                "CREATE TRIGGER {t}_blockt BEFORE UPDATE ON {t} FOR EACH ROW
                 EXECUTE FUNCTION {t}_blockf()",
            )
            .await;
        }
        Db::MySql => {
            td.exec(
                "CREATE TRIGGER {t}_blockt BEFORE UPDATE ON {t} FOR EACH ROW
                 BEGIN IF NEW.status <> OLD.status AND EXISTS (SELECT 1 FROM {t}_block) THEN
                 SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'results blocked'; END IF; END",
            )
            .await;
        }
        Db::Sqlite => unreachable!("SQLite triggers can only abort"),
    }
}

async fn unwritable_results_stop_new_claims(db: Db) {
    let Some(td) = TestDb::open(db, "bad_backpressure").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    insert_good(&td, 1..=40).await;
    block_results(&td).await;
    let cfg = base(&rx).in_flight(4).claim_ttl(Duration::from_secs(40));
    let mut relay = RelayProc::start(&td, &cfg, "one");
    rx.expect_requests(1, Duration::from_secs(15), "the first batch")
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sent = rx.len();
    assert!(
        sent <= 4,
        "while no result can be written, no more than max_in_flight (4) rows may be sent: {sent}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rx.len(),
        sent,
        "sends went on while no result could be written"
    );
    assert_eq!(td.counts().await[2], 0, "nothing can be SUCCESS yet");
    td.exec("DELETE FROM {t}_block").await;

    until_finished(&td, Duration::from_secs(30)).await;
    let state = rows(&td).await;
    assert_good_delivered_once(&rx, &state, &[]);
    assert_eq!(rx.len(), 40);
    assert!(relay.running());
    td.exec("DROP TABLE {t}_block").await;
    td.drop_table().await;
}

mod unwritable_results_stop_new_claims {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::unwritable_results_stop_new_claims(Db::Postgres).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        super::unwritable_results_stop_new_claims(Db::MySql).await
    }
}

/// SQLite: the database locked by another writer for a few seconds (results and claims
/// wait, time out as SQLITE_BUSY and are retried); nothing is lost or sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_locked_for_a_while_loses_nothing() {
    let Some(td) = TestDb::open(Db::Sqlite, "bad_locked").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    rx.set_delay(Duration::from_millis(300));
    insert_good(&td, 1..=60).await;
    let _relay = RelayProc::start(&td, &base(&rx).in_flight(8), "one");
    rx.expect_requests(8, Duration::from_secs(15), "the first batch")
        .await;
    {
        let mut conn = td.store.pool().acquire().await.expect("connection");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .expect("lock");
        tokio::time::sleep(Duration::from_secs(7)).await;
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("unlock");
    }
    until_finished(&td, Duration::from_secs(40)).await;
    let state = rows(&td).await;
    assert_good_delivered_once(&rx, &state, &[]);
    assert_eq!(rx.len(), 60);
    td.drop_table().await;
}

// ---------------------------------------------------------------------------------------------

/// Holds an exclusive lock on the outbox table from another session until dropped.
async fn lock_table(td: &TestDb) -> sqlx::pool::PoolConnection<sqlx::Any> {
    let mut conn = td.store.pool().acquire().await.expect("connection");
    let statements: Vec<String> = match td.db {
        Db::Postgres => vec![
            "BEGIN".into(),
            format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", td.table),
        ],
        Db::MySql => vec![format!("LOCK TABLES {} WRITE", td.table)],
        Db::Sqlite => vec!["BEGIN EXCLUSIVE".into()],
    };
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await
            .expect("lock");
    }
    conn
}

async fn shutdown_is_bounded_on_a_locked_table(db: Db) {
    let Some(td) = TestDb::open(db, "bad_locked_exit").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let cfg = base(&rx).shutdown_timeout(Duration::from_secs(3));
    let mut relay = RelayProc::start(&td, &cfg, "one");
    insert_good(&td, 1..=3).await;
    rx.expect_requests(3, Duration::from_secs(15), "rows before the lock")
        .await;
    let conn = lock_table(&td).await;
    // Let the relay's next claims run into the lock.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let signalled = std::time::Instant::now();
    relay.sigterm();
    let (status, exited) = relay.wait_exit_at(Duration::from_secs(15)).await;
    let took = exited.duration_since(signalled);
    drop(conn);
    assert!(status.success(), "exit status {status:?}");
    assert!(
        took < Duration::from_millis(3_000 + 1_000),
        "exit took {took:?} with shutdown_timeout 3s"
    );
    td.drop_table().await;
}
per_db!(shutdown_is_bounded_on_a_locked_table);

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
