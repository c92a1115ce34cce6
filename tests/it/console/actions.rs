//! What the console does: requeue and purge with the CLI's semantics, and the sessions,
//! claims and paused sinks it shows.

use super::*;

/// Whether row `id` reaches the receiver within 10 s.
async fn arrives(rx: &Receiver, id: i64) -> bool {
    rx.wait_until(
        |r| r.iter().any(|q| q.id == Some(id)),
        Duration::from_secs(10),
    )
    .await
}

/// Waits up to 10 s (for `what`) until row `id` is SUCCESS.
async fn until_success(td: &TestDb, id: i64, what: impl std::fmt::Display) {
    until(what, Duration::from_secs(10), || async {
        status_of(td, id).await == "SUCCESS"
    })
    .await;
}

/// Clicks "requeue" on row `id`'s page.
async fn requeue_row(c: &ConsoleClient, csrf: &str, id: i64) -> Answer {
    c.post(&format!("/row/{id}/requeue"), &[("csrf", csrf)])
        .await
}

/// Adds a FAILED hook row (error "late boom"), as if it failed after a confirmation page was
/// shown; returns its id.
async fn fail_a_late_row(td: &TestDb) -> i64 {
    td.exec(&format!(
        "INSERT INTO {{t}} (channel, payload, status, last_error) VALUES ('hook', '{{}}'{}, 'FAILED', 'late boom')",
        if td.db == Db::Postgres { "::jsonb" } else { "" }
    ))
    .await;
    td.scalar("SELECT MAX(id) FROM {t}").await
}

/// Every action was logged with who did it, four in all, and the token never was.
fn assert_actions_logged(log: &str) {
    let actions: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("console action"))
        .collect();
    assert_eq!(actions.len(), 4, "{log}");
    assert!(
        actions
            .iter()
            .all(|l| l.contains("operator \\\"alice\\\"") || l.contains("alice")),
        "{actions:#?}"
    );
    assert!(!log.contains(TOKEN), "the token was logged");
}

async fn requeue_and_purge_with_the_cli_semantics(db: Db) {
    let Some(td) = TestDb::open(db, "console_act").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let rows = seed(&td).await;
    let (relay, base) = start_relay(&td, &rx, |c| c).await;
    let mut c = ConsoleClient::new(&base);
    assert_eq!(c.login(TOKEN, "alice").await.status, 303);
    let csrf = c.csrf().await;

    // One row: requeued, then delivered by the relay.
    let one = rows.boom[0];
    let a = requeue_row(&c, &csrf, one).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.body.contains("PENDING again"), "{}", a.body);
    assert!(
        arrives(&rx, one).await,
        "the requeued row was not delivered"
    );
    until_success(&td, one, "row delivered").await;
    // A row that is not FAILED is left alone.
    let a = requeue_row(&c, &csrf, one).await;
    assert!(a.body.contains("not FAILED"), "{}", a.body);

    // A selection: the confirmation counts, the POST requeues exactly those.
    let confirm = c.get("/requeue?error=boom").await;
    assert!(confirm.body.contains("2 row(s) match"), "{}", confirm.body);
    let max_id = field(&confirm.body, "max_id").expect("max_id");
    // A row failing after the confirmation is not swept in.
    let late = fail_a_late_row(&td).await;
    let a = c
        .post(
            "/requeue",
            &[
                ("csrf", &csrf),
                ("error", "boom"),
                ("max_id", &max_id),
                ("expected", "2"),
            ],
        )
        .await;
    assert!(a.body.contains("Requeued 2 row(s)"), "{}", a.body);
    for id in &rows.boom[1..] {
        let id = *id;
        assert!(arrives(&rx, id).await, "row {id} not delivered");
        // Its result is written after the receiver answered.
        until_success(&td, id, format!("row {id} SUCCESS")).await;
    }
    assert_eq!(status_of(&td, late).await, "FAILED");
    assert_eq!(status_of(&td, rows.timeout).await, "FAILED");
    // Without a confirmation (no max_id) a selection is refused.
    let a = c
        .post("/requeue", &[("csrf", &csrf), ("error", "late")])
        .await;
    assert_eq!(a.status, 400);

    // Purge: counts, then deletes only FAILED rows older than the age.
    let confirm = c.get("/purge?older_than=1d").await;
    assert!(
        confirm.body.contains("Delete 1 FAILED row(s)"),
        "{}",
        confirm.body
    );
    assert_eq!(c.get("/purge?older_than=10s").await.status, 400);
    let a = c
        .post("/purge", &[("csrf", &csrf), ("older_than", "1d")])
        .await;
    assert!(a.body.contains("Deleted 1 FAILED row(s)"), "{}", a.body);
    assert_eq!(status_of(&td, rows.old_other).await, "MISSING");
    assert_eq!(status_of(&td, rows.timeout).await, "FAILED");
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE status IN ('PENDING', 'RETRY')")
            .await,
        3
    );
    assert_actions_logged(&relay.log_text());
    td.drop_table().await;
}
per_db!(requeue_and_purge_with_the_cli_semantics);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_claims_and_paused_sinks() {
    let Some(td) = TestDb::open(Db::Sqlite, "console_misc").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let rows = seed(&td).await;
    let (_relay, base) = start_relay(&td, &rx, |c| c).await;

    // A row under a live claim is not requeued (as with the CLI).
    let claimed = rows.timeout;
    td.exec(&format!(
        "UPDATE {{t}} SET claimed_by = 'someone', claim_token = 'x', claimed_until = {} WHERE id = {claimed}",
        db_time(td.db, 600)
    ))
    .await;
    let mut alice = ConsoleClient::new(&base);
    alice.login(TOKEN, "alice").await;
    let csrf = alice.csrf().await;
    let a = alice
        .post(&format!("/row/{claimed}/requeue"), &[("csrf", &csrf)])
        .await;
    assert!(a.body.contains("live claim"), "{}", a.body);
    assert_eq!(status_of(&td, claimed).await, "FAILED");

    // A CSRF token is tied to its session.
    let mut bob = ConsoleClient::new(&base);
    bob.login(TOKEN, "bob").await;
    let row = rows.boom[0];
    let a = bob
        .post(&format!("/row/{row}/requeue"), &[("csrf", &csrf)])
        .await;
    assert_eq!(a.status, 403);
    // Logging out ends the session: its cookie no longer opens a page.
    let bob_csrf = bob.csrf().await;
    let a = bob.post("/logout", &[("csrf", &bob_csrf)]).await;
    assert_eq!(a.status, 303);
    assert_eq!(
        bob.get("/").await.status,
        303,
        "still logged in after logout"
    );
    assert_eq!(alice.get("/").await.status, 200);

    // A throttled sink shows as paused, with the reason.
    let id = td.enqueue("hook", r#"{"n":1}"#, None).await;
    rx.script(
        id,
        vec![crate::support::receiver::Reply::status(429).header("retry-after", "120")],
    );
    // The row may already be on its way: wait for the 429 (or, if it beat the script, skip).
    rx.wait_until(
        |r| r.iter().any(|q| q.id == Some(id)),
        Duration::from_secs(10),
    )
    .await;
    // The receiver notes the 429 as it answers; the relay pauses the sink once it has read
    // the answer, a moment later, so the page is read until it shows it.
    if rx.requests_for(id).first().is_some_and(|r| r.status == 429) {
        until_reads(
            Duration::from_secs(10),
            async || alice.get("/").await.body,
            |page| page.contains("paused"),
            |page| page,
        )
        .await;
    }
}
