//! Running on an existing table (issue 12, part 1): a table shaped like the Alimtalk outbox of
//! shared/seeds/002 (snake_case columns, PENDING/RETRY/SUCCESS/FAILED strings, retry_count,
//! error_message, no channel column), and a table with integer status codes and other names,
//! each created and filled by plain SQL the way its application does, on every database.
//!
//! What is checked: `migrate --adopt --dry-run` prints and changes nothing; `migrate --adopt`
//! adds only the relay's bookkeeping, leaves every row as it was, and is idempotent; the relay
//! binary delivers the rows with the payload assembled from columns and writes the table's own
//! status values, retry count and error column; a row the sink refuses fails alone;
//! `check-config` and `run` name a missing column by its key. Other shapes (integer codes, a
//! JSON column, no retry state, the Alimtalk sink through the NHN fake) are in [`shapes`].

mod hostile;
pub(super) mod shapes;

use std::process::Output;
use std::time::{Duration, Instant};

use sqlx::Row;

use crate::support::config::Config;
use crate::support::process::*;
use crate::support::receiver::{Receiver, Reply};
use crate::support::*;

/// The columns of the seed-002 table, as the application writes them.
const APP_COLUMNS: &str = "transaction_set_id, data_key, template_code, receiver_mobile_no, \
                           category_code, template_type";

/// The seed-002 table on `db`: the relay's own table of [`TestDb::open`] is replaced by it.
pub(super) async fn seed002_table(db: Db) -> Option<TestDb> {
    let td = TestDb::open(db, "adopt").await?;
    td.drop_table().await;
    let (id, time, now) = match db {
        Db::Postgres => ("id BIGSERIAL PRIMARY KEY", "TIMESTAMP", "now()"),
        Db::MySql => (
            "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
            "DATETIME(6)",
            "CURRENT_TIMESTAMP(6)",
        ),
        Db::Sqlite => (
            "id INTEGER PRIMARY KEY AUTOINCREMENT",
            "TEXT",
            "CURRENT_TIMESTAMP",
        ),
    };
    td.exec(&format!(
        "CREATE TABLE {{t}} (
            {id},
            transaction_set_id VARCHAR(64) NOT NULL,
            data_key VARCHAR(64) NOT NULL,
            template_code VARCHAR(64) NOT NULL,
            receiver_mobile_no VARCHAR(20) NOT NULL,
            category_code VARCHAR(20) NULL,
            template_type VARCHAR(20) NOT NULL DEFAULT 'DEFAULT',
            status VARCHAR(16) NOT NULL DEFAULT 'PENDING',
            retry_count INT NOT NULL DEFAULT 0,
            error_message TEXT NULL,
            created_at {time} NOT NULL DEFAULT {now},
            updated_at {time} NOT NULL DEFAULT {now}
        )"
    ))
    .await;
    Some(td)
}

/// Inserts seed-002 rows with plain SQL, as the application's mapper does.
pub(super) async fn insert_events(td: &TestDb, rows: &[(&str, &str, &str)]) {
    for (tx, template, phone) in rows {
        td.exec(&format!(
            "INSERT INTO {{t}} ({APP_COLUMNS}, status) VALUES \
             ('{tx}', 'key-{tx}', '{template}', '{phone}', 'FLIGHT', 'DEFAULT', 'PENDING')"
        ))
        .await;
    }
}

/// The mapping of the seed-002 table to the webhook sink `hook`.
pub(super) const SEED002_MAPPING: &str = r#"
[table]
channel_value = "hook"

[table.columns]
id = "id"
status = "status"
recipient = "receiver_mobile_no"
attempts = "retry_count"
last_error = "error_message"
created_at = "created_at"
updated_at = "updated_at"

[table.status]
pending = "PENDING"
retry = "RETRY"
success = "SUCCESS"
failed = "FAILED"

[table.payload_object]
template_code = "template_code"

[table.payload_object.parameters]
transaction_set_id = "transaction_set_id"
data_key = "data_key"
category_code = "category_code"
template_type = "template_type"
"#;

/// Runs a verb of the binary on `td`'s table with `config` to its end.
pub(super) async fn verb(td: &TestDb, config: &Config, args: &[&str]) -> Output {
    let path = config.write(td.dir.path(), "verb.toml");
    let mut cmd = relay_with_config(td, &path);
    cmd.args(args);
    run_to_end(args.join(" "), &mut cmd, Duration::from_secs(60)).await
}

/// A receiver, and a configuration delivering `td`'s table mapped by `mapping` to it with
/// `attempts` attempts 300 ms apart, after `migrate --adopt`.
pub(super) async fn adopted_webhook(
    td: &TestDb,
    mapping: &str,
    attempts: u32,
) -> (Receiver, Config) {
    let rx = Receiver::start(None).await;
    let backoff = Duration::from_millis(300);
    let config = Config::webhook(&rx.url())
        .retry(backoff, backoff, attempts)
        .sections(mapping);
    adopt(td, &config).await;
    (rx, config)
}

/// `migrate --adopt` on `td`'s table, which must succeed.
pub(super) async fn adopt(td: &TestDb, config: &Config) {
    let out = verb(td, config, &["migrate", "--adopt"]).await;
    assert!(out.status.success(), "{}", text(&out));
}

pub(super) fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every application column of every row, as text, in id order: what adoption must not change.
async fn snapshot(td: &TestDb) -> Vec<Vec<Option<String>>> {
    let cols = [
        "id",
        "transaction_set_id",
        "data_key",
        "template_code",
        "receiver_mobile_no",
        "category_code",
        "template_type",
        "status",
        "retry_count",
        "error_message",
        "created_at",
        "updated_at",
    ];
    let exprs: Vec<String> = cols
        .iter()
        .map(|c| match td.db {
            Db::Postgres => format!("{c}::text"),
            Db::MySql => format!("CAST({c} AS CHAR)"),
            Db::Sqlite => format!("CAST({c} AS TEXT)"),
        })
        .collect();
    td.fetch(&format!(
        "SELECT {} FROM {{t}} ORDER BY id",
        exprs.join(", ")
    ))
    .await
    .iter()
    .map(|r| {
        (0..cols.len())
            .map(|i| r.try_get::<Option<String>, _>(i).expect("text"))
            .collect()
    })
    .collect()
}

/// Whether the table has column `c` (a SELECT of it works).
pub(super) async fn has_column(td: &TestDb, c: &str) -> bool {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {c} FROM {} WHERE 1 = 0",
        td.table
    )))
    .fetch_all(td.store.pool())
    .await
    .is_ok()
}

/// (status, retry_count, error_message) of the row with `transaction_set_id = tx`.
pub(super) async fn event(td: &TestDb, tx: &str) -> (String, i64, Option<String>) {
    let sql = format!(
        "SELECT status, retry_count, error_message FROM {} WHERE transaction_set_id = '{tx}'",
        td.table
    );
    let r = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(td.store.pool())
        .await
        .expect("event row");
    (
        r.try_get(0).expect("status"),
        r.try_get(1).expect("retry_count"),
        r.try_get(2).expect("error_message"),
    )
}

/// The id of the row with `transaction_set_id = tx`.
pub(super) async fn event_id(td: &TestDb, tx: &str) -> i64 {
    td.scalar(&format!(
        "SELECT id FROM {{t}} WHERE transaction_set_id = '{tx}'"
    ))
    .await
}

/// (status, retry_count, error_message) of a row, as [`event`] reads it.
pub(super) type Event = (String, i64, Option<String>);

/// Waits (up to 30 s) until the rows with `transaction_set_id`s `txs` have the statuses
/// `want`, and returns their [`event`]s; `seen` sees every reading on the way.
pub(super) async fn wait_events<const N: usize>(
    td: &TestDb,
    relay: &RelayProc,
    txs: [&str; N],
    want: [&str; N],
    mut seen: impl FnMut(&[Event]),
) -> Vec<Event> {
    until_reads(
        Duration::from_secs(30),
        async || {
            let mut states = Vec::new();
            for tx in txs {
                states.push(event(td, tx).await);
            }
            seen(&states);
            states
        },
        |states| states.iter().map(|s| s.0.as_str()).eq(want),
        |states| format!("rows not finished: {states:?}\n{}", relay.log_text()),
    )
    .await
}

per_db!(adopt_adds_only_bookkeeping_and_leaves_the_rows_alone);
async fn adopt_adds_only_bookkeeping_and_leaves_the_rows_alone(db: Db) {
    let Some(td) = seed002_table(db).await else {
        return;
    };
    insert_events(
        &td,
        &[
            ("tx-1", "TPL_BOOKED", "010-1234-5678"),
            ("tx-2", "TPL_CANCELLED", "01098765432"),
        ],
    )
    .await;
    td.exec("UPDATE {t} SET status = 'FAILED', retry_count = 4, error_message = 'ApiPlex timeout' WHERE transaction_set_id = 'tx-2'").await;
    let before = snapshot(&td).await;
    let config = Config::webhook("http://127.0.0.1:1/hook").sections(SEED002_MAPPING);

    // check-config before adoption: the bookkeeping is missing, and it says what to run.
    let out = verb(&td, &config, &["check-config"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("claimed_by"), "{}", text(&out));
    assert!(text(&out).contains("migrate --adopt"), "{}", text(&out));

    let out = verb(&td, &config, &["migrate", "--adopt", "--dry-run"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(printed.contains("ALTER TABLE"), "{printed}");
    assert!(printed.contains("claim_token"), "{printed}");
    assert!(printed.contains("dry run"), "{printed}");
    assert!(
        !printed.contains("DROP") && !printed.contains("MODIFY"),
        "{printed}"
    );
    assert!(
        !has_column(&td, "claimed_by").await,
        "dry run changed the table"
    );
    assert_eq!(snapshot(&td).await, before);

    let out = verb(&td, &config, &["migrate", "--adopt"]).await;
    assert!(out.status.success(), "{}", text(&out));
    for c in [
        "claimed_by",
        "claim_token",
        "claimed_until",
        "sent_at",
        "next_attempt_at",
    ] {
        assert!(
            has_column(&td, c).await,
            "{c} was not added\n{}",
            text(&out)
        );
    }
    assert_eq!(snapshot(&td).await, before, "adoption changed the rows");

    // Idempotent: nothing left to do, and the check passes.
    let out = verb(&td, &config, &["migrate", "--adopt"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("nothing to change"), "{}", text(&out));
    let out = verb(&td, &config, &["check-config"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("present and usable"), "{}", text(&out));

    // Plain migrate never creates the relay's own table over a mapped one.
    let out = verb(&td, &config, &["migrate"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(!has_column(&td, "payload").await && !has_column(&td, "channel").await);
    assert_eq!(snapshot(&td).await, before);
}

per_db!(the_relay_delivers_a_seed002_table_and_writes_its_own_values);
async fn the_relay_delivers_a_seed002_table_and_writes_its_own_values(db: Db) {
    let Some(td) = seed002_table(db).await else {
        return;
    };
    let (rx, config) = adopted_webhook(&td, SEED002_MAPPING, 3).await;
    insert_events(
        &td,
        &[
            ("ok", "TPL_BOOKED", "010-1234-5678"),
            ("flaky", "TPL_BOOKED", "010-2222-3333"),
            ("broken", "TPL_BOOKED", "010-4444-5555"),
        ],
    )
    .await;
    let (flaky, broken) = (event_id(&td, "flaky").await, event_id(&td, "broken").await);
    rx.script(flaky, vec![Reply::status(503)]);
    rx.script(broken, vec![Reply::status(500); 3]);
    let relay = RelayProc::start(&td, &config, "adopter");

    let mut saw_retry = false;
    wait_events(
        &td,
        &relay,
        ["ok", "flaky", "broken"],
        ["SUCCESS", "SUCCESS", "FAILED"],
        |states| saw_retry |= states[2].0 == "RETRY",
    )
    .await;
    assert!(
        saw_retry,
        "the failing row was never RETRY in the table's own column"
    );
    assert_eq!(event(&td, "ok").await, ("SUCCESS".into(), 1, None));
    assert_eq!(event(&td, "flaky").await, ("SUCCESS".into(), 2, None));
    let (_, count, error) = event(&td, "broken").await;
    assert_eq!(count, 3);
    assert!(
        error.is_some_and(|e| e.contains("500")),
        "error_message is written"
    );

    // The payload is the object the database built from the row's columns.
    let first = rx.requests_for(event_id(&td, "ok").await);
    let body: serde_json::Value = serde_json::from_str(&first[0].body).expect("JSON body");
    assert_eq!(
        body,
        serde_json::json!({
            "template_code": "TPL_BOOKED",
            "parameters": {
                "transaction_set_id": "ok",
                "data_key": "key-ok",
                "category_code": "FLIGHT",
                "template_type": "DEFAULT",
            }
        })
    );
    assert_eq!(rx.count_by_id().len(), 3);
    // `status` reads the table's values as the relay's states.
    let out = verb(&td, &config, &["status"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("SUCCESS"), "{}", text(&out));
}

per_db!(check_config_and_run_name_a_missing_column);
async fn check_config_and_run_name_a_missing_column(db: Db) {
    let Some(td) = seed002_table(db).await else {
        return;
    };
    let good = Config::webhook("http://127.0.0.1:1/hook").sections(SEED002_MAPPING);
    adopt(&td, &good).await;
    let bad = Config::webhook("http://127.0.0.1:1/hook")
        .sections(&SEED002_MAPPING.replace("\"receiver_mobile_no\"", "\"receiver_phone\""));
    let out = verb(&td, &bad, &["check-config"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("table.columns.recipient") && said.contains("receiver_phone"),
        "{said}"
    );
    let path = bad.write(td.dir.path(), "run.toml");
    let mut cmd = relay_with_config(&td, &path);
    cmd.env("OUTBOX_RELAY__LEASE__NAME", &td.table).arg("run");
    let out = run_to_end("run", &mut cmd, Duration::from_secs(30)).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("table.columns.recipient"),
        "{}",
        text(&out)
    );
    // A key that is not an identifier is refused before anything connects.
    let typo = Config::webhook("http://127.0.0.1:1/hook")
        .sections(&SEED002_MAPPING.replace("\"retry_count\"", "\"retry count\""));
    let out = verb(&td, &typo, &["check-config"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("table.columns.attempts"),
        "{}",
        text(&out)
    );
}

/// PostgreSQL: `table.notify_trigger = true` makes `migrate --adopt` install the insert
/// trigger (and only then), and the relay wakes on its NOTIFY: with a 10 s poll, a row is
/// still delivered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notify_trigger_only_when_asked() {
    let Some(td) = seed002_table(Db::Postgres).await else {
        return;
    };
    let triggers = format!(
        "SELECT COUNT(*) FROM pg_trigger WHERE NOT tgisinternal AND tgname::text = '{}_notify'",
        td.table
    );
    let quiet = Config::webhook("http://127.0.0.1:1/hook").sections(SEED002_MAPPING);
    adopt(&td, &quiet).await;
    assert_eq!(td.scalar(&triggers).await, 0, "no trigger unless asked");
    let rx = Receiver::start(None).await;
    let config = Config::webhook(&rx.url())
        .poll_interval(Duration::from_secs(10))
        .sections(&SEED002_MAPPING.replace("[table]\n", "[table]\nnotify_trigger = true\n"));
    let out = verb(&td, &config, &["migrate", "--adopt", "--dry-run"]).await;
    assert!(text(&out).contains("CREATE TRIGGER"), "{}", text(&out));
    adopt(&td, &config).await;
    assert_eq!(td.scalar(&triggers).await, 1);
    let relay = RelayProc::start(&td, &config, "notified");
    // The relay listens (its listener's LISTEN is the last statement of a session) before the
    // insert.
    let listening = format!(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %{}_new%'",
        td.table
    );
    until("the relay's LISTEN", Duration::from_secs(10), async || {
        td.scalar(&listening).await > 0
    })
    .await;
    let t0 = Instant::now();
    insert_events(&td, &[("now", "TPL_BOOKED", "010-1234-5678")]).await;
    rx.expect_requests(1, Duration::from_secs(5), "the notified row")
        .await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "woken by NOTIFY, not the 10 s poll\n{}",
        relay.log_text()
    );
}
