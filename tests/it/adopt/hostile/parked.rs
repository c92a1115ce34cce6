//! What the live check cannot see slips through: here a CHECK constraint that admits only the
//! application's own states, so the database refuses every result the relay writes, even the
//! generic FAILED one. Such a row is parked, never sent again: its claim runs a year under the
//! parked marker, the relay logs it and counts it (`rows_parked_total`), `status` and the
//! console's row page show it as `PARKED`, and `requeue --id` brings it back.

use std::time::Duration;

use outbox_relay::metric;

use super::*;
use crate::support::console::*;
use crate::support::receiver::Receiver;

const MAPPING: &str = r#"
[table]
channel_value = "hook"

[table.columns]
id = "id"
status = "st"
payload = "body"

[table.status]
pending = "NEW"
success = "SENT"
failed = "FAILED"
"#;

per_db!(a_row_whose_result_is_refused_is_parked_not_sent_again);
async fn a_row_whose_result_is_refused_is_parked_not_sent_again(db: Db) {
    let Some(td) = app_db(db, "hostile_parked").await else {
        return;
    };
    let columns = "body TEXT NULL, st VARCHAR(8) NOT NULL DEFAULT 'NEW' \
                   CHECK (st IN ('NEW', 'WAIT'))";
    create(&td, "id", columns).await;
    let rx = Receiver::start(None).await;
    let cfg = config(&rx.url(), MAPPING, 1);
    ok(&td, &cfg, &["migrate", "--adopt"]).await;
    ok(&td, &cfg, &["check-config"]).await;
    exec(
        &td,
        "INSERT INTO {T} (body) VALUES ('{\"n\":1}'), ('{\"n\":2}')",
    )
    .await;
    let mapped = |c: Config| c.sections(MAPPING);
    let (relay, base) = start_relay(&td, &rx, mapped).await;
    let parked = format!(
        "SELECT claimed_by FROM {{T}} WHERE claimed_until > {} ORDER BY id",
        db_time(db, 300 * 86_400)
    );
    let marker = "outbox-relay: parked, the database refused its result";
    wait_for(&td, &parked, &[Some(marker), Some(marker)], || {
        relay.log_text()
    })
    .await;
    assert_eq!(relay.metric(metric::ROWS_PARKED).await, 2.0);
    assert!(relay.log_text().contains("parking it"), "logged");
    // Two seconds in which a parked row must not be sent again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rx.len(), 2, "each row sent once, never again");

    let status = ok(&td, &cfg, &["status"]).await;
    assert!(status.contains("PARKED"), "{status}");
    assert!(!status.contains("live claims: outbox-relay"), "{status}");
    let mut c = ConsoleClient::new(&base);
    assert_eq!(c.login(TOKEN, "alice").await.status, 303);
    let page = c.get("/row/1").await;
    assert!(
        page.body.contains(r#"id="status">PARKED<"#),
        "{}",
        page.body
    );
    let overview = c.get("/").await;
    assert!(
        overview.body.contains(r#"id="stuck""#) && overview.body.contains("2 parked"),
        "the overview says a row is parked: {}",
        overview.body
    );

    // Requeued, the row is claimed and sent again (and parked again: the cause is still there).
    let out = ok(&td, &cfg, &["requeue", "--id", "1"]).await;
    assert!(out.contains("requeued 1"), "{out}");
    rx.expect_requests(3, Duration::from_secs(15), "the requeued row")
        .await;
    wait_for(&td, &parked, &[Some(marker), Some(marker)], || {
        relay.log_text()
    })
    .await;
}
