//! Other table shapes (issue 12, part 1): integer status codes and absent optional columns,
//! a JSON column embedded in the payload and a table without retry state or counters, and
//! the seed-002 table delivered through the Alimtalk sink to the NHN fake.

use std::time::Duration;

use super::{
    SEED002_MAPPING, adopt, adopted_webhook, has_column, insert_events, seed002_table, text, verb,
    wait_events,
};
use crate::support::config::Config;
use crate::support::process::*;
use crate::support::receiver::Reply;
use crate::support::*;

/// A table with other names, integer status codes, a channel column, the payload in one JSON
/// text column, and none of the optional columns (no created_at, last_error, updated_at,
/// ordering key).
pub(crate) async fn integer_table(db: Db) -> Option<TestDb> {
    let td = TestDb::open(db, "adopt_int").await?;
    td.drop_table().await;
    let (id, key) = match db {
        Db::Postgres => ("event_no BIGSERIAL PRIMARY KEY", "\"key\""),
        Db::MySql => (
            "event_no BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
            "`key`",
        ),
        Db::Sqlite => ("event_no INTEGER PRIMARY KEY AUTOINCREMENT", "\"key\""),
    };
    // `key` is a reserved word: the relay must quote it.
    td.exec(&format!(
        "CREATE TABLE {{t}} (
            {id},
            target VARCHAR(32) NOT NULL,
            body TEXT NULL,
            {key} VARCHAR(32) NULL,
            state SMALLINT NOT NULL DEFAULT 0,
            tries INT NOT NULL DEFAULT 0
        )"
    ))
    .await;
    Some(td)
}

pub(crate) const INTEGER_MAPPING: &str = r#"
[table.columns]
id = "event_no"
channel = "target"
payload = "body"
status = "state"
attempts = "tries"
ordering_key = "key"

[table.status]
pending = [0, 3]
success = 1
failed = 2
"#;

per_db!(integer_status_codes_and_absent_optional_columns);
async fn integer_status_codes_and_absent_optional_columns(db: Db) {
    let Some(td) = integer_table(db).await else {
        return;
    };
    let (rx, config) = adopted_webhook(&td, INTEGER_MAPPING, 2).await;
    // 3 is a second pending value; a row of a channel no sink serves, and a row without a
    // payload, fail alone; rows 1 and 2 share an ordering key.
    td.exec(
        "INSERT INTO {t} (target, body, state) VALUES ('hook', '{\"n\":1}', 0), \
         ('hook', '{\"n\":2}', 3), ('nowhere', '{\"n\":3}', 0), ('hook', '{\"n\":4}', 0), \
         ('hook', NULL, 0)",
    )
    .await;
    let key = if db == Db::MySql { "`key`" } else { "\"key\"" };
    td.exec(&format!(
        "UPDATE {{t}} SET {key} = 'k1' WHERE event_no IN (1, 2)"
    ))
    .await;
    rx.script(4, vec![Reply::status(500); 2]);
    let relay = RelayProc::start(&td, &config, "ints");
    until_reads(
        Duration::from_secs(30),
        async || states(&td).await,
        |s| *s == [1, 1, 2, 2, 2],
        |s| format!("states {s:?}, want [1, 1, 2, 2, 2]\n{}", relay.log_text()),
    )
    .await;
    assert_eq!(
        td.scalar("SELECT tries FROM {t} WHERE event_no = 4").await,
        2
    );
    assert_eq!(
        td.scalar("SELECT tries FROM {t} WHERE event_no = 3").await,
        1
    );
    let mut ids = rx.received_ids();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids,
        vec![1, 2, 4],
        "the unserved and the unreadable rows are never sent"
    );
    let order = rx.received_ids();
    let pos = |id| order.iter().position(|x| *x == id);
    assert!(
        pos(1) < pos(2),
        "rows of one ordering key go in id order: {order:?}"
    );
    // `failed` lists the table's failed rows though it has no error or time column.
    let out = verb(&td, &config, &["failed"]).await;
    assert!(out.status.success(), "{}", text(&out));
}

per_db!(alimtalk_through_nhn_from_a_seed002_table);
/// The seed-002 table delivered through the Alimtalk sink to the NHN fake: the payload is
/// the template code and parameters from the row's columns, the recipient its mobile number;
/// a row with a number that is not one, and a row whose parameter is NULL, fail alone
/// without a (paid) request.
async fn alimtalk_through_nhn_from_a_seed002_table(db: Db) {
    use crate::alimtalk::{APP_KEY, Fake, NHN, NHN_PATH, SECRET_KEY, SENDER_KEY, nhn_script};
    let Some(td) = seed002_table(db).await else {
        return;
    };
    let nhn = Fake::start(NHN_PATH, NHN, nhn_script()).await;
    let mapping = SEED002_MAPPING.replace("channel_value = \"hook\"", "channel_value = \"kakao\"");
    let config = Config::webhook("http://127.0.0.1:1/hook")
        .sections(&mapping)
        .sections(&format!(
            "[sinks.kakao]\nkind = \"alimtalk\"\nprovider = \"nhn\"\nendpoint = \"{}\"\n\
             app_key = \"{APP_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\n\
             sender_key = \"{SENDER_KEY}\"\ntimeout = \"2s\"\n",
            nhn.server.uri()
        ));
    adopt(&td, &config).await;
    insert_events(
        &td,
        &[
            ("good", "TPL_BOOKED", "010-1234-5678"),
            ("bad-phone", "TPL_BOOKED", "call me"),
            ("no-category", "TPL_BOOKED", "01099998888"),
        ],
    )
    .await;
    td.exec("UPDATE {t} SET category_code = NULL WHERE transaction_set_id = 'no-category'")
        .await;
    let relay = RelayProc::start(&td, &config, "kakao");
    let states = wait_events(
        &td,
        &relay,
        ["good", "bad-phone", "no-category"],
        ["SUCCESS", "FAILED", "FAILED"],
        |_| {},
    )
    .await;
    assert!(
        states[1]
            .2
            .as_deref()
            .is_some_and(|e| e.contains("phone") || e.contains("digits")),
        "{states:?}"
    );
    assert!(
        states[2]
            .2
            .as_deref()
            .is_some_and(|e| e.contains("category_code")),
        "{states:?}"
    );
    let sent = nhn.seen.all();
    assert_eq!(sent.len(), 1, "only the good row reaches the vendor");
    let body = sent[0].json();
    assert_eq!(body["templateCode"], "TPL_BOOKED");
    let to = &body["recipientList"][0];
    assert_eq!(to["recipientNo"], "01012345678");
    assert_eq!(to["templateParameter"]["transaction_set_id"], "good");
    assert_eq!(to["templateParameter"]["data_key"], "key-good");
    assert_eq!(nhn.problems(), Vec::<String>::new());
}

const JSON_MAPPING: &str = r#"
[table]
channel_value = "hook"
[table.columns]
id = "id"
status = "state"
[table.status]
pending = "READY"
success = "SENT"
failed = "ERROR"
[table.payload_object]
template_code = "tpl"
parameters = { json = "params" }
"#;

per_db!(a_json_column_and_a_table_without_retry_state_or_counters);
/// `parameters = { json = "params" }` embeds a JSON column as JSON; a table with only
/// READY/SENT/ERROR and no attempts or retry columns: `migrate --adopt` adds `attempts` and
/// `next_attempt_at`, and a retried row goes back to READY until it is sent.
async fn a_json_column_and_a_table_without_retry_state_or_counters(db: Db) {
    let Some(td) = TestDb::open(db, "adopt_json").await else {
        return;
    };
    td.drop_table().await;
    let (id, json) = match db {
        Db::Postgres => ("id BIGSERIAL PRIMARY KEY", "JSONB"),
        Db::MySql => ("id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY", "JSON"),
        Db::Sqlite => ("id INTEGER PRIMARY KEY AUTOINCREMENT", "TEXT"),
    };
    td.exec(&format!(
        "CREATE TABLE {{t}} ({id}, tpl VARCHAR(32) NOT NULL, params {json} NOT NULL, \
         state VARCHAR(8) NOT NULL DEFAULT 'READY')"
    ))
    .await;
    let (rx, config) = adopted_webhook(&td, JSON_MAPPING, 3).await;
    assert!(has_column(&td, "attempts").await && has_column(&td, "next_attempt_at").await);
    td.exec(
        "INSERT INTO {t} (tpl, params) VALUES ('T1', '{\"name\": \"홍길동\", \"n\": \"1\"}'), \
         ('T2', '{\"name\": \"x\"}')",
    )
    .await;
    rx.script(2, vec![Reply::status(503)]);
    let relay = RelayProc::start(&td, &config, "json");
    until_or(
        Duration::from_secs(30),
        async || {
            td.scalar("SELECT COUNT(*) FROM {t} WHERE state = 'SENT'")
                .await
                == 2
        },
        || format!("not sent\n{}", relay.log_text()),
    )
    .await;
    assert_eq!(td.scalar("SELECT attempts FROM {t} WHERE id = 2").await, 2);
    let body: serde_json::Value =
        serde_json::from_str(&rx.requests_for(1)[0].body).expect("JSON body");
    assert_eq!(
        body,
        serde_json::json!({"template_code": "T1", "parameters": {"name": "홍길동", "n": "1"}})
    );
}

/// The `state` of rows 1 to 5 of the integer table.
async fn states(td: &TestDb) -> Vec<i64> {
    let mut out = Vec::new();
    for id in 1..=5 {
        out.push(
            td.scalar(&format!("SELECT state FROM {{t}} WHERE event_no = {id}"))
                .await,
        );
    }
    out
}
