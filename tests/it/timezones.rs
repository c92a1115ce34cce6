//! MySQL/MariaDB time zones (issue 9): rows the application inserts with the DEFAULT
//! timestamps are due at once and report their real age, whatever the zone of the
//! application's sessions (+09:00, -05:00) and of the server (a private MariaDB started by the
//! test with its global zone at +09:00, the zone of the Alimtalk users); a table of the old
//! DATETIME schema is converted without making any row wait.

use std::time::Duration;

use crate::support::mariadb::PrivateMariaDb;
use crate::support::process::*;
use crate::support::receiver::Receiver;
use crate::support::*;
use outbox_relay::store::{ClaimRequest, Queue, SqlStore};
use sqlx::{Connection, Executor};

/// Inserts a row the way an application does: its own session, in `zone` (`None`: the
/// server's), DEFAULT timestamps, or `NOW()` written explicitly by the application.
async fn app_insert(url: &str, table: &str, zone: Option<&str>, explicit_now: bool) {
    let mut c = sqlx::mysql::MySqlConnection::connect(url)
        .await
        .expect("app connection");
    // sqlx sets +00:00 on connect; an application's driver leaves the server's zone.
    let set = match zone {
        Some(z) => format!("SET time_zone = '{z}'"),
        None => "SET time_zone = @@global.time_zone".to_string(),
    };
    c.execute(sqlx::AssertSqlSafe(set)).await.expect("zone");
    let sql = if explicit_now {
        format!(
            r#"INSERT INTO {table} (channel, payload, next_attempt_at, created_at)
               VALUES ('hook', '{{"a":1}}', NOW(6), NOW(6))"#
        )
    } else {
        format!(r#"INSERT INTO {table} (channel, payload) VALUES ('hook', '{{"a":1}}')"#)
    };
    c.execute(sqlx::AssertSqlSafe(sql)).await.expect("insert");
}

fn claim_all() -> ClaimRequest {
    ClaimRequest {
        tails: Vec::new(),
        trace: false,
        limit: 100,
        ttl: Duration::from_secs(30),
        claimer: "tz".into(),
        token: "tz-token".into(),
        fence: None,
        alone: false,
        exclude_channels: Vec::new(),
        max_payload_bytes: None,
        budgets: None,
        newest: false,
    }
}

/// How long the rows age between their insert and the checks: what the oldest pending age
/// must then show.
const AGED: Duration = Duration::from_millis(1500);

/// Lets the rows just inserted age [`AGED`]: the age, read back in another zone, is the
/// subject of these tests.
async fn let_rows_age() {
    tokio::time::sleep(AGED).await;
}

/// Rows inserted `waited` ago from sessions in several zones: the oldest pending age is real
/// (not 0 s, not hours) and every row is claimable now.
async fn check_due_and_aged(store: &SqlStore, inserted: usize, waited: Duration) {
    let sample = store.sample(false).await.expect("sample");
    let age = sample.oldest_pending.expect("an oldest pending row");
    assert!(
        age >= waited && age < waited + Duration::from_secs(60),
        "oldest pending age {age:?}, expected about {waited:?}"
    );
    let claimed = store.claim(&claim_all()).await.expect("claim");
    assert_eq!(claimed.len(), inserted, "rows not due at once");
    for r in &claimed {
        assert!(
            r.age_at_claim < Duration::from_secs(60),
            "row {} is {:?} old at claim",
            r.delivery.id,
            r.age_at_claim
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_sessions_in_any_zone() {
    let Some(td) = TestDb::open(Db::MySql, "tz_sessions").await else {
        return;
    };
    for zone in ["+09:00", "-05:00", "+13:00", "-12:00"] {
        app_insert(&td.url, &td.table, Some(zone), false).await;
        app_insert(&td.url, &td.table, Some(zone), true).await;
    }
    let_rows_age().await;
    check_due_and_aged(&td.store, 8, AGED).await;
    td.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_in_kst_delivers_at_once() {
    let Some(server) = PrivateMariaDb::start("+09:00").await else {
        return;
    };
    let url = server.url();
    let table = unique_table("tz_kst");
    let store = SqlStore::connect(&url, &table, 4, Duration::from_secs(5))
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    app_insert(&url, &table, None, false).await;
    app_insert(&url, &table, Some("-05:00"), false).await;
    let_rows_age().await;
    check_due_and_aged(&store, 2, AGED).await;

    // End to end: the real relay on this server delivers a row the application just wrote.
    let rx = Receiver::start(None).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        "relay.toml",
        &format!(
            "[relay]\npoll_interval = \"100ms\"\nclaim_ttl = \"10s\"\n\n[sinks.hook]\nkind = \"webhook\"\nurl = \"{}\"\ntimeout = \"3s\"\n",
            rx.url()
        ),
    );
    let mut cmd = relay_command(dir.path());
    cmd.env("OUTBOX_RELAY__DATABASE__URL", &url)
        .env("OUTBOX_RELAY__DATABASE__TABLE", &table)
        .env("OUTBOX_RELAY__HTTP__LISTEN", "127.0.0.1:0")
        .arg("--config")
        .arg(&cfg)
        .arg("run");
    let _relay = RelayProc::spawn("kst", &mut cmd, dir.path().join("kst.log"));
    app_insert(&url, &table, None, false).await;
    // The two rows claimed above come back when their claim expires (10 s); the new one
    // is due at once.
    rx.expect_requests(1, Duration::from_secs(5), "the row written in KST")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datetime_tables_are_converted_without_delaying_rows() {
    let Some(server) = PrivateMariaDb::start("+09:00").await else {
        return;
    };
    let url = server.url();
    let table = unique_table("tz_old");
    let mut c = sqlx::mysql::MySqlConnection::connect(&url)
        .await
        .expect("connect");
    // The table as schema version 1 created it, and the application's rows in it.
    c.execute(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (
            id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            channel VARCHAR(191) NOT NULL, recipient TEXT NULL, payload JSON NOT NULL,
            ordering_key VARCHAR(191) NULL, status VARCHAR(16) NOT NULL DEFAULT 'PENDING',
            attempts INT NOT NULL DEFAULT 0,
            next_attempt_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            claimed_by VARCHAR(255) NULL, claim_token VARCHAR(64) NULL,
            claimed_until DATETIME(6) NULL, last_error TEXT NULL,
            created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            sent_at DATETIME(6) NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
    )))
    .await
    .expect("old table");
    c.execute(
        "CREATE TABLE outbox_relay_schema (target VARCHAR(191) NOT NULL PRIMARY KEY,
         version BIGINT NOT NULL)",
    )
    .await
    .expect("schema table");
    c.execute(sqlx::AssertSqlSafe(format!(
        "INSERT INTO outbox_relay_schema VALUES ('{table}', 1)"
    )))
    .await
    .expect("version 1");
    app_insert(&url, &table, None, false).await;
    app_insert(&url, &table, None, false).await;
    let_rows_age().await;

    let store = SqlStore::connect(&url, &table, 4, Duration::from_secs(5))
        .await
        .expect("connect");
    store.migrate().await.expect("migrate converts");
    let types: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 't'
         AND TABLE_NAME = '{table}' AND COLUMN_NAME LIKE '%_at'"
    )))
    .fetch_all(&mut c)
    .await
    .expect("types");
    assert!(
        types.iter().all(|t| t.eq_ignore_ascii_case("timestamp")),
        "{types:?}"
    );
    check_due_and_aged(&store, 2, AGED).await;
    // Migrating again changes nothing.
    store.migrate().await.expect("migrate again");
}
