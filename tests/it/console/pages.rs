//! What the pages show: the table masked and escaped, payloads and recipients only when
//! configured, and the failed rows page by page along their index.

use super::*;

/// The overview's numbers are the table's; the channel without a sink and the lease holder
/// are shown.
async fn check_overview(c: &ConsoleClient, td: &TestDb) {
    let page = c.get("/").await;
    assert_eq!(page.status, 200);
    let count = |channel: &str, status: &str| {
        let sql = format!(
            "SELECT COUNT(*) FROM {{t}} WHERE channel = '{channel}' AND status = '{status}'"
        );
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
}

/// The row ids the failed page at `path` lists.
async fn ids_at(c: &ConsoleClient, path: &str) -> Vec<i64> {
    failed_ids(&c.get(path).await.body)
}

async fn pages_show_the_table_masked_and_escaped(db: Db) {
    let Some(td) = TestDb::open(db, "console_pages").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let rows = seed(&td).await;
    let (_relay, base) = start_relay(&td, &rx, |c| c).await;
    let mut c = ConsoleClient::new(&base);
    assert_eq!(c.login(TOKEN, "alice").await.status, 303);

    check_overview(&c, &td).await;

    // Filters: error text (case-insensitive), channel, created time range.
    let mut want = rows.boom.clone();
    want.reverse();
    assert_eq!(ids_at(&c, "/failed?error=boom").await, want, "newest first");
    assert_eq!(
        ids_at(&c, "/failed?channel=other").await,
        vec![rows.old_other]
    );
    assert_eq!(
        ids_at(&c, "/failed?channel=hook&error=timeout").await,
        vec![rows.timeout]
    );
    assert_eq!(ids_at(&c, "/failed?from=1h").await.len(), 5);
    assert!(ids_at(&c, "/failed?to=1h").await.is_empty());
    assert_eq!(
        ids_at(&c, "/failed?from=2000-01-01&to=2100-01-01%2000:00")
            .await
            .len(),
        5
    );
    assert!(ids_at(&c, "/failed?from=2100-01-01").await.is_empty());
    let bad = c.get("/failed?from=soon").await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("created from"), "{}", bad.body);
    // Literal wildcards: `%` matches only a percent sign.
    assert!(ids_at(&c, "/failed?error=%25").await.is_empty());

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

#[tokio::test]
async fn the_failed_page_walks_its_index() {
    // SQLite without statistics would sort every FAILED row (`USE TEMP B-TREE`); the page's
    // statement names the index, so its plan is a walk of that index whatever the stats.
    let Some(td) = TestDb::open(Db::Sqlite, "console_plan").await else {
        return;
    };
    let sql = format!(
        "SELECT id FROM {t} INDEXED BY {t}_failed_idx WHERE status = 'FAILED' \
         AND channel = 'x' AND id < 100 ORDER BY id DESC LIMIT 51",
        t = td.table
    );
    let plan = crate::support::plans::sqlite_plan(&td.store, &sql).await;
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
