//! NULLs in every mapped column: a NULL channel is claimed and failed with a reason naming the
//! column (never left pending for ever); a NULL status, or a value no state maps, is never
//! claimed and shows as a state of its own (`NULL`, `UNKNOWN(<value>)`) in every verb and the
//! console; NULL optional columns (recipient, key, attempts, error, times, payload parts) are
//! read as NULL everywhere, never as an error.

use std::time::Duration;

use super::*;
use crate::support::console::*;
use crate::support::receiver::Receiver;

/// A table where every mapped column but the id takes NULL.
async fn nullable_table(db: Db) -> Option<TestDb> {
    let td = app_db(db, "hostile_nulls").await?;
    let time = match db {
        Db::Postgres => "TIMESTAMPTZ",
        Db::MySql => "DATETIME(6)",
        Db::Sqlite => "TEXT",
    };
    let columns = format!(
        "ch VARCHAR(16) NULL, st VARCHAR(16) NULL, rcpt VARCHAR(20) NULL, k VARCHAR(16) NULL, \
         body VARCHAR(32) NULL, tries INT NULL, err TEXT NULL, created {time} NULL, \
         updated {time} NULL"
    );
    created(td, &columns).await
}

const MAPPING: &str = r#"
[table.columns]
id = "id"
channel = "ch"
status = "st"
recipient = "rcpt"
ordering_key = "k"
attempts = "tries"
last_error = "err"
created_at = "created"
updated_at = "updated"

[table.status]
pending = "NEW"
success = "SENT"
failed = "FAILED"

[table.payload_object]
b = "body"
r = "rcpt"
"#;

per_db!(nulls_in_every_mapped_column_are_shown_never_hidden_or_fatal);
async fn nulls_in_every_mapped_column_are_shown_never_hidden_or_fatal(db: Db) {
    let Some(td) = nullable_table(db).await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let cfg = config(&rx.url(), MAPPING, 1);
    ok(&td, &cfg, &["migrate", "--adopt"]).await;
    // 1: delivered with NULLs everywhere else; 2: NULL channel; 3: NULL status; 4: a value
    // no state maps; 5: NULL channel and status; 6: FAILED with NULL error, attempts, times.
    exec(
        &td,
        "INSERT INTO {T} (ch, st) VALUES ('hook', 'NEW'), (NULL, 'NEW'), ('hook', NULL), \
         ('hook', 'LEGACY'), (NULL, NULL), ('hook', 'FAILED')",
    )
    .await;
    // Before any relay ran: every verb reads the table.
    let status = ok(&td, &cfg, &["status"]).await;
    for want in ["NULL", "UNKNOWN(LEGACY)", "FAILED"] {
        assert!(status.contains(want), "status lacks {want}: {status}");
    }
    assert!(ok(&td, &cfg, &["failed"]).await.contains('6'));
    let kept = ok(
        &td,
        &cfg,
        &["requeue", "--id", "3", "--id", "4", "--dry-run"],
    )
    .await;
    assert!(
        kept.contains("row 3 is NULL") && kept.contains("row 4 is UNKNOWN(LEGACY)"),
        "{kept}"
    );
    ok(
        &td,
        &cfg,
        &["purge", "--older-than", "1s", "--status", "FAILED"],
    )
    .await;

    let mapped = |c: Config| c.sections(MAPPING);
    let (relay, base) = start_relay(&td, &rx, mapped).await;
    let states = "SELECT st FROM {T} ORDER BY id";
    let want = [
        Some("SENT"),
        Some("FAILED"),
        None,
        Some("LEGACY"),
        None,
        Some("FAILED"),
    ];
    wait_for(&td, states, &want, || relay.log_text()).await;
    let body: serde_json::Value = serde_json::from_str(&rx.requests_for(1)[0].body).expect("JSON");
    assert_eq!(body, serde_json::json!({"b": null, "r": null}));
    assert_eq!(rx.len(), 1, "only row 1 was sent");
    let errors = texts(&td, "SELECT err FROM {T} WHERE id = 2").await;
    assert!(
        errors[0].as_deref().is_some_and(|e| e.contains("channel")),
        "the NULL channel's row fails naming the column: {errors:?}"
    );

    // The console: every page answers, and shows the rows' states.
    let mut c = ConsoleClient::new(&base);
    assert_eq!(c.login(TOKEN, "alice").await.status, 303);
    for path in ["/", "/failed", "/failed?channel=hook"] {
        let page = c.get(path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
    }
    let overview = c.get("/").await;
    assert!(
        overview.body.contains(r#"id="stuck""#)
            && overview.body.contains("with a NULL or unknown status"),
        "the overview shows the rows no state maps: {}",
        overview.body
    );
    for (id, state) in [
        (2, "FAILED"),
        (3, "NULL"),
        (4, "UNKNOWN(LEGACY)"),
        (5, "NULL"),
    ] {
        let page = c.get(&format!("/row/{id}")).await;
        assert_eq!(page.status, 200, "row {id}: {}", page.body);
        assert!(
            page.body.contains(&format!(r#"id="status">{state}<"#)),
            "row {id} is {state}: {}",
            page.body
        );
    }
    // A requeue of the FAILED row with NULLs is delivered.
    ok(&td, &cfg, &["requeue", "--id", "6"]).await;
    rx.expect_requests(2, Duration::from_secs(15), "the requeued row")
        .await;
    let status = ok(&td, &cfg, &["status"]).await;
    assert!(status.contains("UNKNOWN(LEGACY)"), "{status}");
}

per_db!(an_id_that_may_be_null_is_refused);
/// A row without an id could be neither claimed nor written: `check-config` asks for a
/// NOT NULL id (a primary key) before any claim could stall on one.
async fn an_id_that_may_be_null_is_refused(db: Db) {
    let Some(td) = app_db(db, "hostile_null_id").await else {
        return;
    };
    exec(
        &td,
        "CREATE TABLE {T} (id BIGINT NULL, body TEXT NULL, st VARCHAR(8) NOT NULL)",
    )
    .await;
    let mapping = "[table]\nchannel_value = \"hook\"\n[table.columns]\nid = \"id\"\n\
                   status = \"st\"\npayload = \"body\"\n[table.status]\npending = \"NEW\"\n\
                   success = \"SENT\"\nfailed = \"FAILED\"\n";
    let cfg = config("http://127.0.0.1:1/hook", mapping, 1);
    let said = ["table.columns.id", "may be NULL"];
    refused(&td, &cfg, &["check-config"], &said).await;
    refused(&td, &cfg, &["migrate", "--adopt"], &said).await;
}
