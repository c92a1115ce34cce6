//! An idle relay's read over rows that wait for a later time (docs/design.md, "Idle cost").

use super::*;

/// As an idle relay polls (`Queue::probe`): the statements it took and whether it found
/// anything claimable.
async fn probe(store: &SqlStore) -> (u64, bool) {
    let before = store.statements();
    let found = match bounded("probe", store.probe(&request(8, LONG, "a", None))).await {
        Probe::Claimable => true,
        Probe::Nothing { .. } => false,
    };
    (store.statements() - before, found)
}

/// SQLite, schema version 10: over rows waiting for a retry an hour away, an idle read after
/// the first is one seek of `next_attempt_idx` (the plan searches the index, it scans
/// nothing), not a walk of every waiting row. A `next_attempt_at` that is not a time, which
/// the claim counts as due, is still found: at once when it sorts above the times (text
/// starting with a letter), and by the read of the picks that the first idle read (and one
/// a minute) makes otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_idle_reads_seek_an_index_of_due_times() {
    let Some(td) = TestDb::open(Db::Sqlite, "st_idle").await else {
        return;
    };
    td.exec(
        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 2000) \
         INSERT INTO {t} (channel, payload, status, next_attempt_at) \
         SELECT 'hook', '{}', 'RETRY', strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 hour') FROM s",
    )
    .await;
    // As `sqlite::anything_due` asks it.
    let seek = |range: &str| {
        format!(
            "SELECT 1 FROM (SELECT 1 FROM {t} INDEXED BY {t}_next_attempt_idx \
             WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at {range} LIMIT 1)",
            t = td.table
        )
    };
    let plan: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(format!(
        "EXPLAIN QUERY PLAN {} UNION ALL {} LIMIT 1",
        seek("<= strftime('%Y-%m-%d %H:%M:%f','now')"),
        seek(">= '9999'")
    )))
    .fetch_all(td.store.pool())
    .await
    .expect("query plan")
    .iter()
    .map(|r| r.try_get::<String, _>(3).unwrap_or_default())
    .collect();
    // Both ranges are seeks of the index; nothing of the table is scanned (only each
    // subquery's one row at most).
    let seeks = plan
        .iter()
        .filter(|s| s.starts_with("SEARCH") && s.contains("next_attempt_idx (next_attempt_at"))
        .count();
    assert_eq!(seeks, 2, "{plan:?}");
    assert!(
        !plan
            .iter()
            .any(|s| s.starts_with(&format!("SCAN {}", td.table))),
        "{plan:?}"
    );

    let store = &td.store;
    assert_eq!(probe(store).await, (1, false), "the first read: the picks");
    assert_eq!(probe(store).await, (1, false), "then: the index alone");
    let due = td.enqueue("hook", "{}", None).await;
    assert_eq!(
        probe(store).await,
        (2, true),
        "a due row: the index, then the picks"
    );
    td.exec(&format!("DELETE FROM {{t}} WHERE id = {due}"))
        .await;
    assert_eq!(probe(store).await, (1, false));

    // Not a time, above the times: the seek finds it.
    td.exec("UPDATE {t} SET next_attempt_at = 'soon' WHERE id = (SELECT MIN(id) FROM {t})")
        .await;
    assert_eq!(probe(store).await, (2, true));
    // Not a time, among the times: the seek cannot see it, the read of the picks can (a
    // fresh store's first idle read makes one), and the claim takes it.
    td.exec("UPDATE {t} SET next_attempt_at = '2099-13-45' WHERE next_attempt_at = 'soon'")
        .await;
    let fresh = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("second store");
    assert_eq!(probe(&fresh).await, (1, true));
    let (_, rows) = claim(&fresh, 8, LONG, "a", None).await;
    assert_eq!(rows.len(), 1);
    td.drop_table().await;
}
