//! The console on an existing table mapped by `[table]` (docs/adopting-a-table.md), through
//! the relay binary on every database: the seed-002 Alimtalk table (its own column names,
//! string states, `retry_count`, `error_message`, a constant channel, the payload built from
//! columns) and a table with integer status codes and none of the optional columns.
//!
//! What is checked: the overview's counts are the table's, by the relay's state names; the
//! failed list and its filters read the mapped columns, and a filter on a column the table
//! does not have is refused naming its key; the row page shows the mapped values, the state
//! name and "not mapped" for absent columns; a requeue writes the table's own pending value
//! and the relay then delivers the row; purge goes by the mapped time column, and is refused
//! on a table without one.

use std::time::Duration;

use crate::adopt::shapes::{INTEGER_MAPPING, integer_table};
use crate::adopt::{
    SEED002_MAPPING, adopt, event, event_id, insert_events, seed002_table, text, verb,
};
use crate::support::config::Config;
use crate::support::console::*;
use crate::support::process::*;
use crate::support::receiver::Receiver;
use crate::support::*;

/// How long the receiver holds each answer while a requeued row is checked in the table: the
/// row stays in the table's pending value until the answer is written.
const HOLD: Duration = Duration::from_millis(1500);

/// The HTML of `<tr data-channel="CHANNEL">`'s cell `data-k="KEY"`.
fn cell_html<'a>(html: &'a str, channel: &str, key: &str) -> &'a str {
    let row = html
        .find(&format!(r#"<tr data-channel="{channel}">"#))
        .map_or("", |at| &html[at..]);
    let row = &row[..row.find("</tr>").unwrap_or(row.len())];
    let cell = row
        .find(&format!(r#"data-k="{key}""#))
        .map_or("", |at| &row[at..]);
    &cell[..cell.find("</td>").unwrap_or(cell.len())]
}

/// The seed-002 rows in every state: pending (left alone for an hour), RETRY, FAILED (one
/// two days old), SUCCESS (one delivered two hours ago).
async fn seed_states(td: &TestDb) {
    let db = td.db;
    insert_events(
        td,
        &[
            ("p1", "TPL_BOOKED", PHONE),
            ("p2", "TPL_BOOKED", PHONE),
            ("r1", "TPL_BOOKED", PHONE),
            ("f-old", "TPL_BOOKED", PHONE),
            ("f-boom-1", "TPL_BOOKED", PHONE),
            ("f-boom-2", "TPL_BOOKED", PHONE),
            ("f-timeout", "TPL_BOOKED", PHONE),
            ("s-1", "TPL_BOOKED", PHONE),
            ("s-2", "TPL_BOOKED", PHONE),
            ("s-old", "TPL_BOOKED", PHONE),
        ],
    )
    .await;
    let (later, hours_ago, days_ago) = (
        db_time(db, 3600),
        db_time(db, -2 * 3600),
        db_time(db, -2 * 86_400),
    );
    let failed = |tx: &str, error: &str| {
        format!(
            "UPDATE {{t}} SET status = 'FAILED', retry_count = 3, error_message = '{error}' \
             WHERE transaction_set_id = '{tx}'"
        )
    };
    for sql in [
        // Unfinished rows the relay leaves alone for an hour (the bookkeeping column
        // `migrate --adopt` added; NULL would be due now).
        format!(
            "UPDATE {{t}} SET next_attempt_at = {later} WHERE transaction_set_id IN ('p1', 'p2', 'r1')"
        ),
        "UPDATE {t} SET status = 'RETRY', retry_count = 1, error_message = 'HTTP 503' \
         WHERE transaction_set_id = 'r1'"
            .into(),
        failed("f-boom-1", "ApiPlex 500: boom 1"),
        failed("f-boom-2", "ApiPlex 500: BOOM 2"),
        failed("f-timeout", "timeout after 5s"),
        format!(
            "UPDATE {{t}} SET status = 'FAILED', retry_count = 3, error_message = 'ApiPlex 500: old', \
             created_at = {days_ago}, updated_at = {days_ago} WHERE transaction_set_id = 'f-old'"
        ),
        "UPDATE {t} SET status = 'SUCCESS', retry_count = 1 WHERE transaction_set_id LIKE 's-%'"
            .into(),
        format!("UPDATE {{t}} SET updated_at = {hours_ago} WHERE transaction_set_id = 's-old'"),
    ] {
        td.exec(&sql).await;
    }
}

/// The rows with `status`.
async fn count_status(td: &TestDb, status: &str) -> i64 {
    td.scalar(&format!(
        "SELECT COUNT(*) FROM {{t}} WHERE status = '{status}'"
    ))
    .await
}

/// The overview: the table's counts under the relay's state names, on the one channel;
/// delivered in the last hour and the oldest pending age by the mapped time columns.
async fn assert_seed002_overview(c: &ConsoleClient, td: &TestDb) {
    let page = c.get("/").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(r#"id="mapped""#), "{}", page.body);
    for (key, status, n) in [
        ("pending", "PENDING", 2),
        ("retry", "RETRY", 1),
        ("failed", "FAILED", 4),
    ] {
        assert_eq!(count_status(td, status).await, n, "the seeded table");
        assert_eq!(
            cell(&page.body, "hook", key),
            Some(n),
            "{key} in:\n{}",
            page.body
        );
    }
    // Delivered in the last hour: by the table's updated_at (s-old is two hours old).
    assert_eq!(
        cell(&page.body, "hook", "delivered"),
        Some(2),
        "{}",
        page.body
    );
    // created_at is mapped: the oldest pending row has an age.
    let oldest = cell_html(&page.body, "hook", "oldest");
    assert!(
        oldest.ends_with('s') && !oldest.contains("not mapped"),
        "{oldest}"
    );
}

/// The failed list: newest first (`[timeout, boom2, boom1, old]`), with the error text;
/// recipients are not in it; its filters.
async fn assert_failed_list(c: &ConsoleClient, [timeout, boom2, boom1, old]: [i64; 4]) {
    // The failed list: newest first, with the error text; recipients are not in it.
    let list = c.get("/failed").await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(failed_ids(&list.body), vec![timeout, boom2, boom1, old]);
    assert!(list.body.contains("ApiPlex 500: boom 1"), "{}", list.body);
    assert!(!list.body.contains(PHONE), "{}", list.body);
    assert!(
        list.body.contains(r#"id="f-error""#) && list.body.contains(r#"id="f-from""#),
        "both filters are offered: {}",
        list.body
    );
    // Filters: error text (case-insensitive), the constant channel, mapped created_at.
    let ids = |path: &'static str| async move {
        let a = c.get(path).await;
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        failed_ids(&a.body)
    };
    assert_eq!(ids("/failed?error=boom").await, vec![boom2, boom1]);
    assert_eq!(ids("/failed?error=timeout").await, vec![timeout]);
    assert_eq!(ids("/failed?channel=hook").await.len(), 4);
    assert!(ids("/failed?channel=other").await.is_empty());
    assert_eq!(ids("/failed?from=1d").await, vec![timeout, boom2, boom1]);
    assert_eq!(ids("/failed?to=1d").await, vec![old]);
}

/// The row page: mapped values, the state's name, the recipient masked, the payload as the
/// sink gets it (built from the columns), absent columns said so.
async fn assert_row_pages(c: &ConsoleClient, td: &TestDb, boom1: i64) {
    // The row page: mapped values, the state's name, the recipient masked, the payload as
    // the sink gets it (built from the columns), absent columns said so.
    let row = c.get(&format!("/row/{boom1}")).await;
    assert_eq!(row.status, 200, "{}", row.body);
    for want in [
        r#"id="status">FAILED<"#,
        r#"id="channel">hook<"#,
        r#"id="attempts">3<"#,
        r#"id="last-error" class="err">ApiPlex 500: boom 1<"#,
        r#"id="ordering-key"><span class="hint na">not mapped<"#,
        r#"id="created">20"#,
        r#"id="updated">20"#,
        "••••5678",
        "&quot;template_code&quot;: &quot;TPL_BOOKED&quot;",
        "&quot;data_key&quot;: &quot;key-f-boom-1&quot;",
        r#"id="requeue""#,
    ] {
        assert!(row.body.contains(want), "{want} not in:\n{}", row.body);
    }
    assert!(
        !row.body.contains(PHONE),
        "recipient unmasked: {}",
        row.body
    );
    for (tx, name) in [("r1", "RETRY"), ("p1", "PENDING"), ("s-1", "SUCCESS")] {
        let row = c.get(&format!("/row/{}", event_id(td, tx).await)).await;
        assert!(
            row.body.contains(&format!(r#"id="status">{name}<"#)),
            "{tx}: {}",
            row.body
        );
    }
    let done = c.get(&format!("/row/{}", event_id(td, "s-1").await)).await;
    assert!(done.body.contains("Only FAILED rows"), "{}", done.body);
}

async fn seed002_table_in_the_console(db: Db) {
    let Some(td) = seed002_table(db).await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let mapped = |c: Config| {
        c.sections(SEED002_MAPPING)
            .console_key("show_payloads", "true")
    };
    let config = mapped(Config::webhook(&rx.url()).console(TOKEN));
    adopt(&td, &config).await;
    // The console is accepted with [table], and said to be on.
    let out = verb(&td, &config, &["check-config"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("console: listen="), "{}", text(&out));

    seed_states(&td).await;
    let (old, boom1, boom2, timeout) = (
        event_id(&td, "f-old").await,
        event_id(&td, "f-boom-1").await,
        event_id(&td, "f-boom-2").await,
        event_id(&td, "f-timeout").await,
    );

    let (relay, base) = start_relay(&td, &rx, mapped).await;
    let mut c = ConsoleClient::new(&base);
    assert_eq!(c.login(TOKEN, "alice").await.status, 303);

    assert_seed002_overview(&c, &td).await;

    assert_failed_list(&c, [timeout, boom2, boom1, old]).await;

    assert_row_pages(&c, &td, boom1).await;

    // Requeue from the console: the table's own pending value with a fresh budget, then
    // delivered by the relay, which writes the table's success value.
    let csrf = c.csrf().await;
    rx.set_delay(HOLD);
    let a = c
        .post(&format!("/row/{boom1}/requeue"), &[("csrf", &csrf)])
        .await;
    assert!(a.body.contains("PENDING again"), "{}", a.body);
    let (status, tries, _) = event(&td, "f-boom-1").await;
    assert_eq!(
        (status.as_str(), tries),
        ("PENDING", 0),
        "right after the requeue"
    );
    assert!(
        rx.wait_until(
            |r| r.iter().any(|q| q.id == Some(boom1)),
            Duration::from_secs(10)
        )
        .await,
        "the requeued row was not delivered\n{}",
        relay.log_text()
    );
    until("row delivered", Duration::from_secs(10), || async {
        event(&td, "f-boom-1").await.0 == "SUCCESS"
    })
    .await;
    assert_eq!(event(&td, "f-boom-1").await, ("SUCCESS".into(), 1, None));
    assert_eq!(count_status(&td, "FAILED").await, 3);

    // Purge by the table's updated_at: only the FAILED row two days old.
    let confirm = c.get("/purge?older_than=1d").await;
    assert!(
        confirm.body.contains("Delete 1 FAILED row(s)") && confirm.body.contains("last updated"),
        "{}",
        confirm.body
    );
    let a = c
        .post("/purge", &[("csrf", &csrf), ("older_than", "1d")])
        .await;
    assert!(a.body.contains("Deleted 1 FAILED row(s)"), "{}", a.body);
    assert_eq!(status_of(&td, old).await, "MISSING");
    assert_eq!(count_status(&td, "FAILED").await, 2);
    assert_eq!(
        count_status(&td, "SUCCESS").await,
        4,
        "nothing delivered was purged"
    );
}
per_db!(seed002_table_in_the_console);

/// The `state` of row `id` of the integer table.
async fn state(td: &TestDb, id: i64) -> i64 {
    td.scalar(&format!("SELECT state FROM {{t}} WHERE event_no = {id}"))
        .await
}

/// The overview of the integer table: both pending codes count as pending; no created_at:
/// the oldest age is not known.
async fn assert_integer_overview(c: &ConsoleClient) {
    let page = c.get("/").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(
        cell(&page.body, "hook", "pending"),
        Some(2),
        "{}",
        page.body
    );
    assert_eq!(cell(&page.body, "hook", "failed"), Some(2), "{}", page.body);
    assert_eq!(
        cell(&page.body, "other", "failed"),
        Some(1),
        "{}",
        page.body
    );
    assert_eq!(
        cell(&page.body, "hook", "delivered"),
        Some(0),
        "{}",
        page.body
    );
    assert!(
        cell_html(&page.body, "hook", "oldest").contains("not mapped"),
        "{}",
        page.body
    );
}

/// The failed list of the integer table by the mapped channel column (filters on absent
/// columns are not offered, and refused naming the key when asked for anyway), and its row
/// pages: the second pending code is PENDING; absent columns are "not mapped", the NULL
/// ordering key "–", the payload hidden by default.
async fn assert_integer_list_and_rows(c: &ConsoleClient) {
    let list = c.get("/failed").await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(failed_ids(&list.body), vec![5, 4, 3]);
    assert!(
        !list.body.contains(r#"id="f-error""#) && !list.body.contains(r#"id="f-from""#),
        "{}",
        list.body
    );
    assert!(list.body.contains("not mapped"), "{}", list.body);
    assert_eq!(
        failed_ids(&c.get("/failed?channel=other").await.body),
        vec![5]
    );
    for (path, key) in [
        ("/failed?error=boom", "table.columns.last_error"),
        ("/failed?from=1h", "table.columns.created_at"),
        ("/requeue?to=2026-01-01", "table.columns.created_at"),
    ] {
        let a = c.get(path).await;
        assert_eq!(a.status, 400, "{path}: {}", a.body);
        assert!(a.body.contains(key), "{path} should name {key}: {}", a.body);
    }

    let row = c.get("/row/2").await;
    assert_eq!(row.status, 200, "{}", row.body);
    for want in [
        r#"id="status">PENDING<"#,
        r#"id="recipient"><span class="hint na">not mapped<"#,
        r#"id="last-error" class="err"><span class="hint na">not mapped<"#,
        r#"id="created"><span class="hint na">not mapped<"#,
        r#"id="ordering-key">–<"#,
        "Hidden (",
    ] {
        assert!(row.body.contains(want), "{want} not in:\n{}", row.body);
    }
    assert!(!row.body.contains("&quot;n&quot;"), "{}", row.body);
    let row = c.get("/row/3").await;
    assert!(
        row.body.contains(r#"id="status">FAILED<"#) && row.body.contains(r#"id="attempts">2<"#),
        "{}",
        row.body
    );
}

async fn integer_codes_and_absent_columns_in_the_console(db: Db) {
    let Some(td) = integer_table(db).await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let config = Config::webhook(&rx.url())
        .console(TOKEN)
        .sections(INTEGER_MAPPING);
    adopt(&td, &config).await;
    // pending = [0, 3], success = 1, failed = 2; rows 1 and 2 pending (one each value, not
    // due for an hour), 3 and 4 failed on hook, 5 failed on a channel without a sink, 6 sent
    // by the application (no sent_at).
    td.exec(
        "INSERT INTO {t} (target, body, state, tries) VALUES ('hook', '{\"n\":1}', 0, 0), \
         ('hook', '{\"n\":2}', 3, 0), ('hook', '{\"n\":3}', 2, 2), ('hook', '{\"n\":4}', 2, 2), \
         ('other', '{\"n\":5}', 2, 1), ('hook', '{\"n\":6}', 1, 1)",
    )
    .await;
    td.exec(&format!(
        "UPDATE {{t}} SET next_attempt_at = {} WHERE state IN (0, 3)",
        db_time(db, 3600)
    ))
    .await;
    let (relay, base) = start_relay(&td, &rx, |c| c.sections(INTEGER_MAPPING)).await;
    let mut c = ConsoleClient::new(&base);
    assert_eq!(c.login(TOKEN, "alice").await.status, 303);

    assert_integer_overview(&c).await;

    assert_integer_list_and_rows(&c).await;

    // A confirmed selection (the hook rows) is requeued to the first pending code, then
    // delivered; the row of the other channel is left FAILED.
    let confirm = c.get("/requeue?channel=hook").await;
    assert!(confirm.body.contains("2 row(s) match"), "{}", confirm.body);
    let max_id = field(&confirm.body, "max_id").expect("max_id");
    assert_eq!(max_id, "4");
    let csrf = c.csrf().await;
    rx.set_delay(HOLD);
    let a = c
        .post(
            "/requeue",
            &[
                ("csrf", &csrf),
                ("channel", "hook"),
                ("max_id", &max_id),
                ("expected", "2"),
            ],
        )
        .await;
    assert!(a.body.contains("Requeued 2 row(s)"), "{}", a.body);
    assert_eq!(
        (state(&td, 3).await, state(&td, 4).await),
        (0, 0),
        "the table's first pending code"
    );
    assert_eq!(
        td.scalar("SELECT tries FROM {t} WHERE event_no = 3").await,
        0
    );
    until(
        "rows 3 and 4 delivered",
        Duration::from_secs(15),
        || async { state(&td, 3).await == 1 && state(&td, 4).await == 1 },
    )
    .await;
    let mut sent = rx.received_ids();
    sent.sort();
    assert_eq!(sent, vec![3, 4], "{}", relay.log_text());
    assert_eq!(state(&td, 5).await, 2);
    // Delivered in the last hour, by the sent_at the relay wrote (row 6 has none).
    let page = c.get("/").await;
    assert_eq!(
        cell(&page.body, "hook", "delivered"),
        Some(2),
        "{}",
        page.body
    );

    // No updated_at or created_at: purge cannot tell a row's age, and says so.
    let p = c.get("/purge").await;
    assert!(
        p.body.contains("table.columns.updated_at") && !p.body.contains(r#"id="older-than""#),
        "{}",
        p.body
    );
    let a = c
        .post("/purge", &[("csrf", &csrf), ("older_than", "1d")])
        .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("table.columns.created_at"), "{}", a.body);
    assert_eq!(state(&td, 5).await, 2, "nothing purged");
}
per_db!(integer_codes_and_absent_columns_in_the_console);
