//! Values inside SQL text and wide payloads: a payload object of 150 columns (PostgreSQL's
//! `json_build_object` takes 50 pairs) is delivered whole on every database, a NULL in any part
//! of it a JSON null; an object SQLite cannot build (over 500 keys) is refused by
//! `check-config`, naming the key. (Status values and keys with `?`, `$1` and quotes are
//! delivered in [`super::names`].)

use super::*;
use crate::support::process::*;
use crate::support::receiver::Receiver;

/// How many columns the wide payload has.
const WIDE: usize = 150;

/// A table of [`WIDE`] payload columns `c000`...
async fn wide_table(db: Db) -> Option<TestDb> {
    let td = app_db(db, "hostile_wide").await?;
    let cols: Vec<String> = (0..WIDE)
        .map(|i| format!("c{i:03} VARCHAR(8) NULL"))
        .collect();
    let columns = format!("st VARCHAR(8) NOT NULL DEFAULT 'NEW', {}", cols.join(", "));
    created(td, &columns).await
}

/// The mapping of `keys` payload keys `k000`..., key `i` reading column `c<i % WIDE>`.
fn wide_mapping(keys: usize) -> String {
    let pairs: Vec<String> = (0..keys)
        .map(|i| format!("k{i:03} = \"c{:03}\"", i % WIDE))
        .collect();
    format!(
        r#"
[table]
channel_value = "hook"

[table.columns]
id = "id"
status = "st"

[table.status]
pending = "NEW"
success = "SENT"
failed = "FAILED"

[table.payload_object]
{}
"#,
        pairs.join("\n")
    )
}

per_db!(a_payload_of_150_columns_is_delivered_whole);
async fn a_payload_of_150_columns_is_delivered_whole(db: Db) {
    let Some(td) = wide_table(db).await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let config = config(&rx.url(), &wide_mapping(WIDE), 2);
    ok(&td, &config, &["migrate", "--adopt"]).await;
    ok(&td, &config, &["check-config"]).await;
    let names: Vec<String> = (0..WIDE).map(|i| format!("c{i:03}")).collect();
    // Column 120 (in PostgreSQL's third object of 50) is NULL.
    let values: Vec<String> = (0..WIDE)
        .map(|i| match i {
            120 => "NULL".into(),
            i => format!("'v{i}'"),
        })
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    insert(&td, &names, &values).await;
    let relay = RelayProc::start(&td, &config, "wide");
    wait_for(&td, "SELECT st FROM {T}", &[Some("SENT")], || {
        relay.log_text()
    })
    .await;
    let body: serde_json::Value =
        serde_json::from_str(&rx.requests_for(1)[0].body).expect("JSON body");
    let obj = body.as_object().expect("an object");
    assert_eq!(obj.len(), WIDE, "{body}");
    for i in 0..WIDE {
        let want = match i {
            120 => serde_json::Value::Null,
            i => serde_json::Value::String(format!("v{i}")),
        };
        assert_eq!(obj[&format!("k{i:03}")], want, "key k{i:03}");
    }
}

/// SQLite builds an object of at most 500 keys: `check-config` says so before any claim
/// could fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_an_object_it_cannot_build() {
    let Some(td) = wide_table(Db::Sqlite).await else {
        return;
    };
    let config = config("http://127.0.0.1:1/hook", &wide_mapping(501), 2);
    let said = ["table.payload_object", "501 keys", "at most 500"];
    refused(&td, &config, &["check-config"], &said).await;
    refused(&td, &config, &["migrate", "--adopt"], &said).await;
    let fine = config_of(500);
    ok(&td, &fine, &["migrate", "--adopt"]).await;
    ok(&td, &fine, &["check-config"]).await;
}

fn config_of(keys: usize) -> crate::support::config::Config {
    config("http://127.0.0.1:1/hook", &wide_mapping(keys), 2)
}
