//! What the table reports: the gauges' sample, and the `status` / `failed` views.

use super::*;

per_db!(the_gauge_sample_counts_delivered_rows_only_when_asked);
/// The table gauges' sample: every status with `count_success`; otherwise the waiting and
/// FAILED rows only (the SUCCESS rows, nearly the whole table, are counted rarely).
async fn the_gauge_sample_counts_delivered_rows_only_when_asked(db: Db) {
    let Some(td) = TestDb::open(db, "st_sample").await else {
        return;
    };
    let store = td.store.clone();
    for _ in 0..6 {
        td.enqueue("log", "{}", None).await;
    }
    let (req, rows) = claim(&*store, 5, LONG, "a", None).await;
    let id = ids(&rows);
    let later = Duration::from_secs(3600);
    let results = [
        completion(&req, id[0], Resolution::Delivered),
        completion(&req, id[1], Resolution::Delivered),
        completion(&req, id[2], Resolution::Delivered),
        completion(
            &req,
            id[3],
            Resolution::Retry {
                delay: later,
                error: "later".into(),
            },
        ),
        completion(&req, id[4], Resolution::Failed { error: "no".into() }),
    ];
    assert_eq!(complete(&*store, &results).await, 5);
    let counts = async |count_success: bool| {
        let mut by = bounded("sample", store.sample(count_success))
            .await
            .by_status;
        by.sort();
        by
    };
    let all = counts(true).await;
    assert_eq!(
        all,
        [
            ("FAILED".to_string(), 1),
            ("PENDING".to_string(), 1),
            ("RETRY".to_string(), 1),
            ("SUCCESS".to_string(), 3)
        ]
    );
    assert_eq!(counts(false).await, all[..3]);
    td.drop_table().await;
}

/// Claims the eight rows and writes what the views are to report: a[0], a[1] -> SUCCESS;
/// a[2] -> FAILED; b[0], b[1] -> FAILED; the rest released, due at once.
async fn finish_some(store: &SqlStore, a: &[i64], b: &[i64]) {
    let (req, rows) = claim(store, 8, LONG, "x", None).await;
    assert_eq!(rows.len(), 8);
    let fail = |id, e: &str| {
        completion(
            &req,
            id,
            Resolution::Failed {
                error: e.to_string(),
            },
        )
    };
    let release = |id| {
        completion(
            &req,
            id,
            Resolution::Release {
                delay: Duration::ZERO,
                error: None,
            },
        )
    };
    let done = [
        completion(&req, a[0], Resolution::Delivered),
        completion(&req, a[1], Resolution::Delivered),
        fail(a[2], "410 gone"),
        fail(b[0], "no such sink"),
        fail(b[1], "payload is not JSON"),
        release(a[3]),
        release(a[4]),
        release(b[2]),
    ];
    assert_eq!(complete(store, &done).await, 8);
}

/// The `failed` view: a's and b's FAILED rows newest first, with their errors; by channel;
/// limited.
async fn assert_failed_view(store: &SqlStore, a: &[i64], b: &[i64]) {
    let failed = bounded("failed", store.failed(10, None)).await;
    assert_eq!(
        failed.iter().map(|f| f.id).collect::<Vec<_>>(),
        vec![b[1], b[0], a[2]],
        "newest first"
    );
    assert_eq!(failed[0].channel, "b");
    assert_eq!(failed[0].attempts, 1);
    assert_eq!(failed[0].last_error.as_deref(), Some("payload is not JSON"));
    assert_eq!(failed[2].last_error.as_deref(), Some("410 gone"));
    assert!(
        failed[0]
            .updated_at
            .as_deref()
            .is_some_and(|u| u.len() >= 19 && u.starts_with("20")),
        "updated_at {:?}",
        failed[0].updated_at
    );
    let only_a = bounded("failed", store.failed(10, Some("a"))).await;
    assert_eq!(only_a.iter().map(|f| f.id).collect::<Vec<_>>(), vec![a[2]]);
    let limited = bounded("failed", store.failed(1, None)).await;
    assert_eq!(limited.len(), 1);
}

per_db!(status_and_failed_report_the_table);
async fn status_and_failed_report_the_table(db: Db) {
    let Some(td) = TestDb::open(db, "st_status").await else {
        return;
    };
    let store = td.store.clone();
    let lease = td.table.clone();
    let empty = bounded("status", store.status(&lease)).await;
    assert!(empty.counts.is_empty());
    assert!(empty.oldest_pending.is_none());
    assert!(empty.lease.is_none());

    let a = td.enqueue_n("a", r#"{"n":1}"#, 5).await;
    let b = td.enqueue_n("b", r#"{"n":1}"#, 3).await;
    // The oldest pending row was created an hour ago.
    td.exec(&format!(
        "UPDATE {{t}} SET created_at = {} WHERE id = {}",
        db_time(db, -3600),
        a[4]
    ))
    .await;
    // a[0], a[1] -> SUCCESS; a[2] -> FAILED; b[0], b[1] -> FAILED; a[3] claimed by "c1".
    finish_some(&store, &a, &b).await;
    let (_, live) = claim(&*store, 1, LONG, "c1", None).await;
    assert_eq!(ids(&live), vec![a[3]]);
    bounded(
        "lease_acquire",
        store.lease_acquire(&lease, "holder-x", Duration::from_secs(20)),
    )
    .await
    .expect("lease");

    let st = bounded("status", store.status(&lease)).await;
    let count = |status: &str, channel: &str| {
        st.counts
            .iter()
            .find(|(s, c, _)| s == status && c == channel)
            .map(|(_, _, n)| *n)
    };
    assert_eq!(count("SUCCESS", "a"), Some(2));
    assert_eq!(count("FAILED", "a"), Some(1));
    assert_eq!(count("PENDING", "a"), Some(2));
    assert_eq!(count("FAILED", "b"), Some(2));
    assert_eq!(count("PENDING", "b"), Some(1));
    assert_eq!(count("SUCCESS", "b"), None);
    assert_eq!(st.counts.iter().map(|(_, _, n)| n).sum::<i64>(), 8);
    let oldest = st.oldest_pending.expect("oldest pending");
    assert!(
        oldest > Duration::from_secs(3590) && oldest < Duration::from_secs(3700),
        "oldest pending {oldest:?}, expected about an hour"
    );
    let l = st.lease.expect("lease row");
    assert_eq!(l.holder.as_deref(), Some("holder-x"));
    assert_eq!(l.epoch, 1);
    let left = l.remaining_ms.expect("remaining");
    assert!(left > 10_000 && left <= 20_000, "lease remaining {left}ms");
    assert_eq!(st.claims, vec![("c1".to_string(), 1)]);

    assert_failed_view(&store, &a, &b).await;
    td.drop_table().await;
}
