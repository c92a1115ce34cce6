//! The console in a real headless Chromium (Debian's `chromium` and `chromium-driver`), on
//! PostgreSQL: refused without the token, login with it, the overview's numbers against the
//! table, filtering failed rows, a requeue the relay then delivers, and a cross-site form POST
//! refused. With `OUTBOX_RELAY_SCREENSHOTS=1` it saves the three pages to `docs/console-*.png`.

use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum::response::Html;

use crate::support::console::*;
use crate::support::process::until;
use crate::support::receiver::Receiver;
use crate::support::webdriver::Browser;
use crate::support::*;

/// Where screenshots go when asked for.
fn screenshot_path(name: &str) -> Option<PathBuf> {
    std::env::var("OUTBOX_RELAY_SCREENSHOTS")
        .is_ok_and(|v| v == "1")
        .then(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("docs")
                .join(name)
        })
}

/// Saves the page to `docs/<name>` when screenshots are asked for.
async fn screenshot(browser: &Browser, name: &str) {
    if let Some(p) = screenshot_path(name) {
        browser.screenshot(&p).await;
    }
}

/// Serves, on another site (`localhost` rather than `127.0.0.1`), a page whose form posts to
/// the console by itself: what a malicious page would do. Returns its URL.
async fn attacker_page(target: &str) -> (String, tokio::task::JoinHandle<()>) {
    let page = format!(
        r#"<!doctype html><html><body><form id="f" method="post" action="{target}">
<input type="hidden" name="back" value="/failed"></form>
<script>document.getElementById("f").submit();</script></body></html>"#
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let app = Router::new().fallback(move || {
        let page = page.clone();
        async move { Html(page) }
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://localhost:{port}/"), task)
}

/// Without the token: sent to the login page, nothing of the table shown; a wrong token,
/// then the right one.
async fn log_in(browser: &Browser, base: &str) {
    browser.goto(&format!("{base}/failed")).await;
    assert!(
        browser.url().await.contains("/login"),
        "{}",
        browser.url().await
    );
    assert!(!browser.source().await.contains("boom"));
    let status = browser
        .script("return fetch('/live.json').then(r => r.status);")
        .await;
    assert_eq!(status, 401, "an API call without the token");

    // A wrong token, then the right one.
    browser.type_into("#token", "not-the-token-at-all").await;
    browser.click("#login").await;
    assert!(browser.text("#login-error").await.contains("Wrong token"));
    browser.type_into("#token", TOKEN).await;
    browser.type_into("#operator", "alice").await;
    browser.click("#login").await;
    browser
        .wait_for(
            "the failed list after login",
            "document.getElementById('failed')",
        )
        .await;
    assert!(
        browser.url().await.ends_with("/failed"),
        "{}",
        browser.url().await
    );
}

/// The overview's numbers are the table's, and its live view updates.
async fn check_overview(browser: &Browser, base: &str, td: &TestDb) {
    browser.goto(&format!("{base}/")).await;
    let cell =
        |channel: &str, key: &str| format!(r#"tr[data-channel="{channel}"] td[data-k="{key}"]"#);
    for (channel, key, sql) in [
        ("hook", "pending", "channel = 'hook' AND status = 'PENDING'"),
        ("hook", "retry", "channel = 'hook' AND status = 'RETRY'"),
        ("hook", "failed", "channel = 'hook' AND status = 'FAILED'"),
        ("other", "failed", "channel = 'other' AND status = 'FAILED'"),
        (
            "hook",
            "delivered",
            "channel = 'hook' AND status = 'SUCCESS'",
        ),
    ] {
        let shown = browser.text(&cell(channel, key)).await;
        let want = td
            .scalar(&format!("SELECT COUNT(*) FROM {{t}} WHERE {sql}"))
            .await;
        assert_eq!(shown, want.to_string(), "{channel} {key}");
    }
    browser
        .wait_for(
            "the live view",
            "document.getElementById('live-tick').textContent.includes('updated')",
        )
        .await;
    screenshot(browser, "console-overview.png").await;
}

/// Filtering failed rows by error text: the `boom` rows (given oldest first), newest first.
async fn check_failed_filter(browser: &Browser, base: &str, boom: &[i64]) {
    browser.goto(&format!("{base}/failed")).await;
    browser.type_into("#f-error", "boom").await;
    browser.click("#apply").await;
    browser
        .wait_for(
            "the filtered list",
            "location.search.includes('error=boom')",
        )
        .await;
    let shown = browser
        .script("return [...document.querySelectorAll('#failed tr[data-id]')].map(r => Number(r.dataset.id));")
        .await;
    let mut want = boom.to_vec();
    want.reverse();
    assert_eq!(shown, serde_json::json!(want));
    screenshot(browser, "console-failed.png").await;
}

/// A page of another site posting to the console, in the logged-in browser: refused, and row
/// `victim` stays FAILED.
async fn check_cross_site_post_refused(browser: &Browser, base: &str, td: &TestDb, victim: i64) {
    let (evil, server) = attacker_page(&format!("{base}/row/{victim}/requeue")).await;
    browser.goto(&evil).await;
    browser
        .wait_for("the console's answer", "location.href.includes('/requeue')")
        .await;
    let page = browser.source().await;
    assert!(page.contains("403") && page.contains("Refused"), "{page}");
    assert_eq!(status_of(td, victim).await, "FAILED");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_real_browser() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let Some(td) = TestDb::open(Db::Postgres, "console_browser").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let rows = seed(&td).await;
    td.insert_hooks(3).await;
    let (_relay, base) = start_relay(&td, &rx, |c| c).await;
    rx.expect_requests(3, Duration::from_secs(10), "the 3 due rows")
        .await;
    until(
        "the 3 due rows recorded",
        Duration::from_secs(10),
        || async {
            td.scalar("SELECT COUNT(*) FROM {t} WHERE status = 'SUCCESS'")
                .await
                == 3
        },
    )
    .await;
    browser.resize(1280, 900).await;

    log_in(&browser, &base).await;

    check_overview(&browser, &base, &td).await;

    check_failed_filter(&browser, &base, &rows.boom).await;

    // A one-click requeue in the list asks first; Cancel changes nothing.
    let third = rows.boom[2];
    browser.click(&format!("#requeue-{third}")).await;
    let asked = browser.dismiss_dialog().await;
    assert!(asked.contains(&format!("Requeue row {third}")), "{asked}");
    assert_eq!(status_of(&td, third).await, "FAILED");

    // The row page, masked; requeue it, and the relay delivers it.
    let one = rows.boom[0];
    browser.click(&format!(r#"a[href="/row/{one}"]"#)).await;
    browser
        .wait_for("the row page", "document.getElementById('recipient')")
        .await;
    let recipient = browser.text("#recipient").await;
    assert!(
        recipient.contains("5678") && !recipient.contains(PHONE),
        "{recipient}"
    );
    assert!(!browser.source().await.contains(SECRET_PAYLOAD));
    screenshot(&browser, "console-row.png").await;
    browser.click("#requeue").await;
    browser
        .wait_for("the result", "document.getElementById('result')")
        .await;
    assert!(browser.text("#result").await.contains("PENDING again"));
    assert!(
        rx.wait_until(
            |r| r.iter().any(|q| q.id == Some(one)),
            Duration::from_secs(10)
        )
        .await,
        "the requeued row was not delivered"
    );
    until(
        "the requeued row SUCCESS",
        Duration::from_secs(10),
        || async { status_of(&td, one).await == "SUCCESS" },
    )
    .await;

    check_cross_site_post_refused(&browser, &base, &td, rows.boom[1]).await;
    td.drop_table().await;
}
