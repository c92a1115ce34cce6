//! Deleting finished rows: the `purge` verb (never PENDING or RETRY rows), and retention
//! (`housekeeping::purge_all`, what `run` calls every 60s).
//!
//! Retention inside `run` is not driven through the binary: its 60s cadence would make the
//! test slow. `run`'s retention loop only takes a short database lease and then calls
//! `purge_all`, which is tested here at library level with the rules retention builds.

use super::*;
use outbox_relay::housekeeping::{self, PURGE_BATCH};
use outbox_relay::store::Finished;
use tokio_util::sync::CancellationToken;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// A timestamp expression `days` days before the database's now.
fn days_ago(db: Db, days: u32) -> String {
    match db {
        Db::Postgres => format!("(now() - interval '{days} days')"),
        Db::MySql => format!("(NOW(6) - INTERVAL {days} DAY)"),
        Db::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f','now','-{days} days')"),
    }
}

/// Makes a row look last touched (and created) `days` days ago.
async fn age(td: &TestDb, id: i64, days: u32) {
    let t = days_ago(td.db, days);
    td.exec(&format!(
        "UPDATE {{t}} SET updated_at = {t}, created_at = {t} WHERE id = {id}"
    ))
    .await;
}

/// Whether row `id` is still in the table.
async fn exists(td: &TestDb, id: i64) -> bool {
    td.scalar(&format!("SELECT COUNT(*) FROM {{t}} WHERE id = {id}"))
        .await
        == 1
}

per_db!(purge_never_deletes_pending_or_retry_rows);
async fn purge_never_deletes_pending_or_retry_rows(db: Db) {
    let Some(td) = TestDb::open(db, "adm_purge").await else {
        return;
    };
    let old_pending = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let old_retry = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let old_success = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let new_success = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let old_failed = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let new_failed = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    set(&td, old_retry, "RETRY", 3, Some("503")).await;
    set(&td, old_success, "SUCCESS", 1, None).await;
    set(&td, new_success, "SUCCESS", 1, None).await;
    set(&td, old_failed, "FAILED", 10, Some("503")).await;
    set(&td, new_failed, "FAILED", 10, Some("503")).await;
    for id in [old_pending, old_retry, old_success, old_failed] {
        age(&td, id, 30).await;
    }

    // Default status SUCCESS: only the old SUCCESS row goes.
    let out = ok(&td, &["purge", "--older-than", "7d"]).await;
    assert!(out.contains("deleted 1 SUCCESS row(s)"), "{out}");
    assert!(!exists(&td, old_success).await);
    for id in [old_pending, old_retry, new_success, old_failed, new_failed] {
        assert!(exists(&td, id).await, "row {id} was deleted:\n{out}");
    }

    // FAILED rows only when asked for.
    let out = ok(&td, &["purge", "--older-than", "7d", "--status", "FAILED"]).await;
    assert!(out.contains("deleted 1 FAILED row(s)"), "{out}");
    assert!(!exists(&td, old_failed).await);
    for id in [old_pending, old_retry, new_success, new_failed] {
        assert!(exists(&td, id).await, "row {id} was deleted:\n{out}");
    }

    // Even a zero age never reaches unfinished rows.
    ok(&td, &["purge", "--older-than", "0s"]).await;
    ok(&td, &["purge", "--older-than", "0s", "--status", "FAILED"]).await;
    assert_eq!(td.counts().await, [1, 1, 0, 0]);
    assert!(exists(&td, old_pending).await && exists(&td, old_retry).await);

    // PENDING / RETRY cannot even be named; a bad duration is a usage error.
    for args in [
        &["purge", "--older-than", "7d", "--status", "PENDING"][..],
        &["purge", "--older-than", "7d", "--status", "RETRY"][..],
        &["purge", "--older-than", "soon"][..],
        &["purge"][..],
    ] {
        let o = cli(&td, args).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
    }
    assert_eq!(td.counts().await, [1, 1, 0, 0]);
    td.drop_table().await;
}

per_db!(retention_purge_all_deletes_only_old_finished_rows);
/// What retention inside `run` does on each pass (see the module comment).
async fn retention_purge_all_deletes_only_old_finished_rows(db: Db) {
    let Some(td) = TestDb::open(db, "adm_retention").await else {
        return;
    };
    // More old SUCCESS rows than one batch, so purge_all must loop.
    let n_old = PURGE_BATCH as usize * 2 + 37;
    let values = vec!["('alpha', '{}')"; n_old].join(", ");
    td.exec(&format!(
        "INSERT INTO {{t}} (channel, payload) VALUES {values}"
    ))
    .await;
    td.exec(&format!(
        "UPDATE {{t}} SET status = 'SUCCESS', updated_at = {}",
        days_ago(db, 10)
    ))
    .await;
    let fresh_success = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    set(&td, fresh_success, "SUCCESS", 1, None).await;
    let old_pending = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let old_retry = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    set(&td, old_retry, "RETRY", 3, Some("503")).await;
    let failed_10d = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    set(&td, failed_10d, "FAILED", 10, Some("503")).await;
    let failed_40d = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    set(&td, failed_40d, "FAILED", 10, Some("503")).await;
    for id in [old_pending, old_retry] {
        age(&td, id, 400).await;
    }
    age(&td, failed_10d, 10).await;
    age(&td, failed_40d, 40).await;

    let store = td.store.clone();
    // The rules retention builds from success_after = "7d", failed_after = "30d".
    let rules = [(Finished::Success, 7 * DAY), (Finished::Failed, 30 * DAY)];

    // Stopped before it starts: deletes nothing.
    let stopped = CancellationToken::new();
    stopped.cancel();
    let n = housekeeping::purge_all(store.as_ref(), &rules, &stopped, Duration::from_secs(60))
        .await
        .expect("purge_all");
    assert_eq!(n, 0);

    let n = housekeeping::purge_all(
        store.as_ref(),
        &rules,
        &CancellationToken::new(),
        Duration::from_secs(120),
    )
    .await
    .expect("purge_all");
    assert_eq!(
        n,
        n_old as u64 + 1,
        "old SUCCESS rows and the 40-day FAILED row"
    );
    assert_eq!(td.counts().await, [1, 1, 1, 1]);
    for id in [fresh_success, old_pending, old_retry, failed_10d] {
        assert!(exists(&td, id).await, "row {id} was deleted");
    }
    assert!(!exists(&td, failed_40d).await);

    // Idempotent: a second pass finds nothing.
    let n = housekeeping::purge_all(
        store.as_ref(),
        &rules,
        &CancellationToken::new(),
        Duration::from_secs(60),
    )
    .await
    .expect("purge_all");
    assert_eq!(n, 0);
    td.drop_table().await;
}
