//! The operator console, through the relay binary against real PostgreSQL, MariaDB and SQLite:
//! no page or action without the token, cross-site POSTs refused, the overview's numbers are
//! the table's, filters and paging, recipients masked and payloads hidden, markup escaped, and
//! actions with the CLI's semantics (a requeued row is then delivered by the relay; a purge
//! deletes only old FAILED rows). Its configuration is checked through `check-config`.
//! [`browser`] drives the same console in a real headless Chromium; [`mapped`] runs it on
//! existing tables mapped by `[table]`.

mod browser;
mod filter;
mod mapped;
mod throttle;

use std::time::Duration;

use crate::support::console::*;
use crate::support::process::*;
use crate::support::receiver::Receiver;
use crate::support::*;

async fn refuses_without_the_token_and_cross_site(db: Db) {
    let Some(td) = TestDb::open(db, "console_auth").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let rows = seed(&td).await;
    let (_relay, base) = start_relay(&td, &rx, |c| c).await;
    let mut c = ConsoleClient::new(&base);
    let row = rows.boom[0];
    let requeue = format!("/row/{row}/requeue");

    // No token: a browser is sent to the login page, anything else gets 401.
    let a = c.get("/failed").await;
    assert_eq!(a.status, 303, "{a:?}");
    assert!(
        a.location
            .as_deref()
            .is_some_and(|l| l.starts_with("/login")),
        "{a:?}"
    );
    for path in [
        "/",
        "/failed",
        &format!("/row/{row}"),
        "/live.json",
        "/requeue",
        "/purge",
    ] {
        let a = c.send("GET", path, None, &[]).await;
        assert_eq!(a.status, 401, "GET {path} without the token");
        assert!(
            !a.body.contains("boom"),
            "GET {path} without the token showed rows"
        );
    }
    let a = c.post(&requeue, &[]).await;
    assert_eq!(a.status, 401, "{a:?}");
    let wrong = c
        .send(
            "GET",
            "/",
            None,
            &[("authorization", "Bearer not-the-token-at-all")],
        )
        .await;
    assert_eq!(wrong.status, 401);
    // Actions are POST only.
    let bearer = format!("Bearer {TOKEN}");
    let a = c
        .send("GET", &requeue, None, &[("authorization", &bearer)])
        .await;
    assert_eq!(a.status, 405);

    // Cross-site POSTs are refused even with the token.
    for headers in [
        vec![
            ("origin", "http://evil.example"),
            ("authorization", bearer.as_str()),
        ],
        vec![
            ("sec-fetch-site", "cross-site"),
            ("authorization", bearer.as_str()),
        ],
        vec![("origin", "null"), ("authorization", bearer.as_str())],
    ] {
        let a = c.send("POST", &requeue, Some(""), &headers).await;
        assert_eq!(a.status, 403, "{headers:?}: {a:?}");
    }
    assert_eq!(status_of(&td, row).await, "FAILED");

    // Login: a wrong token is refused; the right one sets a cookie that is not the token.
    let a = c.login("wrong-token-wrong-token", "mallory").await;
    assert_eq!(a.status, 401);
    let a = c.login(TOKEN, "alice").await;
    assert_eq!(a.status, 303, "{a:?}");
    let cookie = a.set_cookie.expect("a session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!cookie.contains(TOKEN), "{cookie}");
    assert_eq!(c.get("/").await.status, 200);
    // A session's POST needs the form's CSRF token.
    let a = c.post(&requeue, &[]).await;
    assert_eq!(a.status, 403, "{a:?}");
    let a = c.post(&requeue, &[("csrf", "0000")]).await;
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(status_of(&td, row).await, "FAILED");
    // The login page never shows the token, nor does any page.
    assert!(!c.get("/").await.body.contains(TOKEN));
    td.drop_table().await;
}
per_db!(refuses_without_the_token_and_cross_site);

async fn pages_show_the_table_masked_and_escaped(db: Db) {
    let Some(td) = TestDb::open(db, "console_pages").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let rows = seed(&td).await;
    let (_relay, base) = start_relay(&td, &rx, |c| c).await;
    let mut c = ConsoleClient::new(&base);
    assert_eq!(c.login(TOKEN, "alice").await.status, 303);

    // The overview's numbers are the table's.
    let page = c.get("/").await;
    assert_eq!(page.status, 200);
    let count = |channel: &str, status: &str| {
        let sql = format!(
            "SELECT COUNT(*) FROM {{t}} WHERE channel = '{channel}' AND status = '{status}'"
        );
        let td = &td;
        async move { td.scalar(&sql).await }
    };
    for (channel, key, status) in [
        ("hook", "pending", "PENDING"),
        ("hook", "retry", "RETRY"),
        ("hook", "failed", "FAILED"),
        ("other", "failed", "FAILED"),
    ] {
        assert_eq!(
            cell(&page.body, channel, key),
            Some(count(channel, status).await),
            "{channel} {key} in:\n{}",
            page.body
        );
    }
    assert_eq!(cell(&page.body, "hook", "pending"), Some(2));
    assert!(
        page.body.contains("no sink of this name"),
        "channel other has no sink"
    );
    assert!(
        page.body.contains("relay-console"),
        "the lease holder or instance is shown"
    );

    // Filters: error text (case-insensitive), channel, created time range.
    let ids = failed_ids;
    let boom = c.get("/failed?error=boom").await;
    let mut want = rows.boom.clone();
    want.reverse();
    assert_eq!(ids(&boom.body), want, "newest first");
    assert_eq!(
        ids(&c.get("/failed?channel=other").await.body),
        vec![rows.old_other]
    );
    assert_eq!(
        ids(&c.get("/failed?channel=hook&error=timeout").await.body),
        vec![rows.timeout]
    );
    assert_eq!(ids(&c.get("/failed?from=1h").await.body).len(), 5);
    assert!(ids(&c.get("/failed?to=1h").await.body).is_empty());
    assert_eq!(
        ids(&c
            .get("/failed?from=2000-01-01&to=2100-01-01%2000:00")
            .await
            .body)
        .len(),
        5
    );
    assert!(ids(&c.get("/failed?from=2100-01-01").await.body).is_empty());
    let bad = c.get("/failed?from=soon").await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("created from"), "{}", bad.body);
    // Literal wildcards: `%` matches only a percent sign.
    assert!(ids(&c.get("/failed?error=%25").await.body).is_empty());

    // Markup from the table is escaped.
    let other = c.get("/failed?channel=other").await.body;
    assert!(!other.contains("<script>alert(1)"), "{other}");
    assert!(other.contains("&lt;script&gt;alert(1)"), "{other}");

    // The row page: recipient masked, payload hidden by default.
    let row = c.get(&format!("/row/{}", rows.boom[0])).await;
    assert_eq!(row.status, 200);
    assert!(
        !row.body.contains(PHONE),
        "recipient unmasked:\n{}",
        row.body
    );
    assert!(
        row.body.contains("5678"),
        "the last digits help tell rows apart"
    );
    assert!(
        !row.body.contains(SECRET_PAYLOAD),
        "payload shown:\n{}",
        row.body
    );
    assert!(row.body.contains("HTTP 500: boom 1"));
    assert_eq!(c.get("/row/999999999").await.status, 404);
    assert_eq!(c.get("/row/abc").await.status, 400);
    td.drop_table().await;
}
per_db!(pages_show_the_table_masked_and_escaped);

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
    let a = c
        .post(&format!("/row/{one}/requeue"), &[("csrf", &csrf)])
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.body.contains("PENDING again"), "{}", a.body);
    let delivered = rx
        .wait_until(
            |r| r.iter().any(|q| q.id == Some(one)),
            Duration::from_secs(10),
        )
        .await;
    assert!(delivered, "the requeued row was not delivered");
    until("row delivered", Duration::from_secs(10), || async {
        status_of(&td, one).await == "SUCCESS"
    })
    .await;
    // A row that is not FAILED is left alone.
    let a = c
        .post(&format!("/row/{one}/requeue"), &[("csrf", &csrf)])
        .await;
    assert!(a.body.contains("not FAILED"), "{}", a.body);

    // A selection: the confirmation counts, the POST requeues exactly those.
    let confirm = c.get("/requeue?error=boom").await;
    assert!(confirm.body.contains("2 row(s) match"), "{}", confirm.body);
    let max_id = field(&confirm.body, "max_id").expect("max_id");
    // A row failing after the confirmation is not swept in.
    td.exec(&format!(
        "INSERT INTO {{t}} (channel, payload, status, last_error) VALUES ('hook', '{{}}'{}, 'FAILED', 'late boom')",
        if db == Db::Postgres { "::jsonb" } else { "" }
    ))
    .await;
    let late = td.scalar("SELECT MAX(id) FROM {t}").await;
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
        assert!(
            rx.wait_until(
                |r| r.iter().any(|q| q.id == Some(id)),
                Duration::from_secs(10)
            )
            .await,
            "row {id} not delivered"
        );
        // Its result is written after the receiver answered.
        until(
            format!("row {id} SUCCESS"),
            Duration::from_secs(10),
            || async { status_of(&td, id).await == "SUCCESS" },
        )
        .await;
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
    // Every action was logged with who did it.
    let log = relay.log_text();
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
    td.drop_table().await;
}
per_db!(requeue_and_purge_with_the_cli_semantics);

#[tokio::test]
async fn configuration_is_checked_and_the_token_never_shown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let check = |env: Vec<(&'static str, String)>| {
        let mut cmd = relay_command(dir.path());
        cmd.arg("check-config").envs(env);
        output_within("check-config", &mut cmd, Duration::from_secs(30))
    };
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    // Off by default.
    let o = check(vec![]);
    assert!(text(&o).contains("console: off"), "{}", text(&o));
    // On through the environment; the token is masked.
    let o = check(vec![("OUTBOX_RELAY__CONSOLE__TOKEN", TOKEN.into())]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("console: listen=127.0.0.1:9091 token=***"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains(TOKEN));
    // Refusals name the key.
    for (env, key) in [
        (
            vec![("OUTBOX_RELAY__CONSOLE__TOKEN", "short".to_string())],
            "console.token",
        ),
        (
            vec![("OUTBOX_RELAY__CONSOLE__ENABLED", "true".to_string())],
            "console.token",
        ),
        (
            vec![
                ("OUTBOX_RELAY__CONSOLE__TOKEN", TOKEN.to_string()),
                ("OUTBOX_RELAY__CONSOLE__LISTEN", "nowhere".to_string()),
            ],
            "console.listen",
        ),
        (
            vec![
                ("OUTBOX_RELAY__CONSOLE__TOKEN", TOKEN.to_string()),
                (
                    "OUTBOX_RELAY__CONSOLE__LISTEN",
                    "127.0.0.1:9090".to_string(),
                ),
            ],
            "console.listen",
        ),
        (
            vec![(
                "OUTBOX_RELAY__CONSOLE__TOKEN_FILE",
                "/nonexistent/token".to_string(),
            )],
            "console.token_file",
        ),
    ] {
        let o = check(env.clone());
        assert_eq!(o.status.code(), Some(2), "{env:?}: {}", text(&o));
        assert!(
            text(&o).contains(key),
            "{env:?} should name {key}: {}",
            text(&o)
        );
        assert!(!text(&o).contains(TOKEN));
    }
    // A token file (a mounted Secret), trailing newline ignored; `enabled = false` turns it off.
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).expect("write token");
    let o = check(vec![(
        "OUTBOX_RELAY__CONSOLE__TOKEN_FILE",
        file.display().to_string(),
    )]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("console: listen="));
    let o = check(vec![
        (
            "OUTBOX_RELAY__CONSOLE__TOKEN_FILE",
            file.display().to_string(),
        ),
        ("OUTBOX_RELAY__CONSOLE__ENABLED", "false".into()),
    ]);
    assert!(text(&o).contains("console: off"), "{}", text(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_and_recipients_shown_only_when_configured() {
    let Some(td) = TestDb::open(Db::Sqlite, "console_show").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let rows = seed(&td).await;
    let (_relay, base) = start_relay(&td, &rx, |c| {
        c.console_key("show_payloads", "true")
            .console_key("mask_recipients", "false")
    })
    .await;
    let c = ConsoleClient::new(&base);
    let bearer = format!("Bearer {TOKEN}");
    let row = c
        .send(
            "GET",
            &format!("/row/{}", rows.boom[0]),
            None,
            &[("authorization", &bearer)],
        )
        .await;
    assert_eq!(row.status, 200);
    assert!(row.body.contains(PHONE), "{}", row.body);
    assert!(row.body.contains(SECRET_PAYLOAD), "{}", row.body);
}

async fn pages_of_failed_rows_by_keyset(db: Db) {
    let Some(td) = TestDb::open(db, "console_paging").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    td.insert("gone", (1..=120).map(|i| (None, payload(i))))
        .await;
    td.exec("UPDATE {t} SET status = 'FAILED', last_error = 'no sink'")
        .await;
    let (_relay, base) = start_relay(&td, &rx, |c| c).await;
    let c = ConsoleClient::new(&base);
    let bearer = format!("Bearer {TOKEN}");
    let get = |path: String| {
        let (c, bearer) = (&c, bearer.clone());
        async move {
            c.send("GET", &path, None, &[("authorization", &bearer)])
                .await
                .body
        }
    };
    let ids = failed_ids;
    let max = td.scalar("SELECT MAX(id) FROM {t}").await;
    let mut seen = Vec::new();
    let mut path = "/failed?channel=gone".to_string();
    for expected in [50, 50, 20] {
        let page = get(path.clone()).await;
        let got = ids(&page);
        assert_eq!(got.len(), expected, "{path}");
        seen.extend(got);
        match field_href(&page, "older") {
            Some(next) => path = next,
            None => assert_eq!(expected, 20, "the last page has no older link"),
        }
    }
    let want: Vec<i64> = (max - 119..=max).rev().collect();
    assert_eq!(seen, want, "every row once, newest first");
}
per_db!(pages_of_failed_rows_by_keyset);

/// The `href` of the link with `id="ID"`, unescaped.
fn field_href(html: &str, id: &str) -> Option<String> {
    let at = html.find(&format!(r#"id="{id}""#))?;
    let start = html[..at].rfind("href=\"")? + 6;
    let end = start + html[start..].find('"')?;
    Some(html[start..end].replace("&amp;", "&"))
}

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
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let page = alice.get("/").await.body;
            if page.contains("paused") {
                break;
            }
            assert!(std::time::Instant::now() < until, "{page}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn the_failed_page_walks_its_index() {
    // SQLite without statistics would sort every FAILED row (`USE TEMP B-TREE`); the page's
    // statement names the index, so its plan is a walk of that index whatever the stats.
    let Some(td) = TestDb::open(Db::Sqlite, "console_plan").await else {
        return;
    };
    use sqlx::Row;
    let sql = format!(
        "EXPLAIN QUERY PLAN SELECT id FROM {t} INDEXED BY {t}_failed_idx WHERE status = 'FAILED' \
         AND channel = 'x' AND id < 100 ORDER BY id DESC LIMIT 51",
        t = td.table
    );
    let plan: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("plan")
        .iter()
        .map(|r| r.try_get::<String, _>(3).expect("detail"))
        .collect();
    let text = plan.join("\n");
    assert!(text.contains(&format!("{}_failed_idx", td.table)), "{text}");
    assert!(
        !text.contains("TEMP B-TREE"),
        "sorts instead of walking the index: {text}"
    );
    // And the store's page runs with it (the hinted statement works on a migrated table).
    let page = td
        .store
        .failed_page(&Default::default(), None, 50)
        .await
        .expect("page");
    assert!(page.is_empty());
}
