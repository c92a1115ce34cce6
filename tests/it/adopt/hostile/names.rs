//! Identifiers: a table whose name is in mixed case and whose columns are keywords of the
//! database (PostgreSQL `full`, `order`, `user`; MariaDB `partition`, `key`, `desc`; SQLite
//! `group`, `order`, `select`) or were created quoted in mixed case (`receiverMobileNo`), with
//! status values and payload keys holding `?`, `$1` and a quote. The relay adopts it, delivers
//! it and writes its own values; a name spelled in another case than the database resolves is
//! refused by `check-config` and `run`, naming the key and the name it may have meant.

use std::time::Duration;

use super::*;
use crate::support::process::*;
use crate::support::receiver::{Receiver, Reply};

/// The table's column names on `db`: (id, channel, recipient, key, body, status, attempts,
/// error).
fn names(db: Db) -> [&'static str; 8] {
    match db {
        Db::Postgres => [
            "eventId",
            "full",
            "receiverMobileNo",
            "order",
            "user",
            "Status",
            "retryCount",
            "lastError",
        ],
        Db::MySql => [
            "eventId",
            "partition",
            "receiverMobileNo",
            "key",
            "desc",
            "Status",
            "retryCount",
            "lastError",
        ],
        Db::Sqlite => [
            "eventId",
            "group",
            "receiverMobileNo",
            "order",
            "select",
            "Status",
            "retryCount",
            "lastError",
        ],
    }
}

/// The application's table: a mixed-case name, keyword and mixed-case columns.
async fn hostile_table(db: Db) -> Option<TestDb> {
    let mut td = app_db(db, "hostile_names").await?;
    td.table = format!("Outbox_{}", td.table);
    let [id, ch, rcpt, key, body, st, tries, err] = names(db);
    let [ch, rcpt, key, body, st, tries, err] =
        [ch, rcpt, key, body, st, tries, err].map(|n| q(db, n));
    let columns = format!(
        "{ch} VARCHAR(16) NOT NULL, {rcpt} VARCHAR(20) NULL, {key} VARCHAR(16) NULL, \
         {body} VARCHAR(64) NULL, {st} VARCHAR(8) NOT NULL DEFAULT 'NEW?', \
         {tries} INT NOT NULL DEFAULT 0, {err} TEXT NULL"
    );
    create(&td, id, &columns).await;
    Some(td)
}

/// The mapping of [`hostile_table`]; `recipient` may be spelled otherwise.
fn mapping(db: Db, recipient: &str) -> String {
    let [id, ch, _, key, body, st, tries, err] = names(db);
    format!(
        r#"
[table.columns]
id = "{id}"
channel = "{ch}"
recipient = "{recipient}"
ordering_key = "{key}"
status = "{st}"
attempts = "{tries}"
last_error = "{err}"

[table.status]
pending = "NEW?"
retry = "RE?TRY"
success = "it's ok"
failed = "$1 ?"

[table.payload_object]
"vip?" = "{body}"
"it's" = "{recipient}"
"$1" = "{key}"
"#
    )
}

per_db!(keywords_and_mixed_case_names_are_used_as_they_are);
async fn keywords_and_mixed_case_names_are_used_as_they_are(db: Db) {
    let Some(td) = hostile_table(db).await else {
        return;
    };
    let [id, ch, rcpt, key, body, st, ..] = names(db).map(|n| q(db, n));
    let rx = Receiver::start(None).await;
    let config = config(&rx.url(), &mapping(db, names(db)[2]), 2);
    refused(&td, &config, &["check-config"], &["migrate --adopt"]).await;
    let plan = ok(&td, &config, &["migrate", "--adopt", "--dry-run"]).await;
    assert!(plan.contains(&q(db, &td.table)), "{plan}");
    ok(&td, &config, &["migrate", "--adopt"]).await;
    ok(&td, &config, &["check-config"]).await;
    exec(
        &td,
        &format!(
            "INSERT INTO {{T}} ({ch}, {rcpt}, {key}, {body}) VALUES \
             ('hook', '010', 'k1', 'first ?'), ('hook', '011', 'k1', 'second $1'), \
             ('hook', '012', NULL, 'broken')"
        ),
    )
    .await;
    rx.script(3, vec![Reply::status(500); 2]);
    let relay = RelayProc::start(&td, &config, "names");
    let states = format!("SELECT {st} FROM {{T}} ORDER BY {id}");
    let want = [Some("it's ok"), Some("it's ok"), Some("$1 ?")];
    wait_for(&td, &states, &want, || relay.log_text()).await;
    let first = rx.requests_for(1);
    let body: serde_json::Value = serde_json::from_str(&first[0].body).expect("JSON");
    assert_eq!(
        body,
        serde_json::json!({"vip?": "first ?", "it's": "010", "$1": "k1"})
    );
    let order = rx.received_ids();
    let at = |id| order.iter().position(|x| *x == id);
    assert!(at(1) < at(2), "one ordering key, in id order: {order:?}");
    let err = names(db)[7];
    let errors = texts(
        &td,
        &format!("SELECT {} FROM {{T}} ORDER BY {id}", q(db, err)),
    )
    .await;
    assert!(
        errors[2].as_deref().is_some_and(|e| e.contains("500")),
        "{errors:?}"
    );
    let status = ok(&td, &config, &["status"]).await;
    assert!(
        status.contains("SUCCESS") && status.contains("FAILED"),
        "{status}"
    );
    assert!(ok(&td, &config, &["failed"]).await.contains("500"));
    assert_eq!(rx.count_by_id().get(&1), Some(&1), "sent once");
}

per_db!(a_name_in_another_case_is_refused_naming_the_key);
/// The name a database resolves for a quoted identifier differs only in case from the one
/// configured: on PostgreSQL any name, on MySQL (with case-sensitive table names) the table's.
async fn a_name_in_another_case_is_refused_naming_the_key(db: Db) {
    let Some(td) = hostile_table(db).await else {
        return;
    };
    let good = config("http://127.0.0.1:1/hook", &mapping(db, names(db)[2]), 2);
    ok(&td, &good, &["migrate", "--adopt"]).await;
    let lower = config(
        "http://127.0.0.1:1/hook",
        &mapping(db, "receivermobileno"),
        2,
    );
    if db == Db::Postgres {
        let said = [
            "table.columns.recipient",
            "did you mean \"receiverMobileNo\"",
        ];
        refused(&td, &lower, &["check-config"], &said).await;
        let path = lower.write(td.dir.path(), "run.toml");
        let mut cmd = relay_with_config(&td, &path);
        cmd.arg("run");
        let out = run_to_end("run", &mut cmd, Duration::from_secs(30)).await;
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("did you mean"), "{}", text(&out));
        refused(
            &td,
            &lower,
            &["migrate", "--adopt"],
            &["table.columns.recipient"],
        )
        .await;
    } else {
        // MySQL and SQLite resolve column names ignoring case, as the relay does.
        ok(&td, &lower, &["check-config"]).await;
    }
    if db != Db::Sqlite {
        let table = td.table.clone();
        let mut other = td;
        other.table = table.to_lowercase();
        let said = ["database.table", &format!("did you mean \"{table}\"")];
        refused(&other, &good, &["check-config"], &said).await;
    }
}
