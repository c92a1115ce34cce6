//! Result writes guarded by the claim token (G2): each resolution, completions of two claims
//! in one write, and long errors truncated.

use super::*;

/// Row `id` is in `state` (SQL), with `tries` attempts and, where `error` is given, that
/// last_error.
async fn assert_row(td: &TestDb, id: i64, state: &str, tries: i64, error: Option<&str>) {
    assert!(row_is(td, id, state).await, "row {id} is not {state}");
    assert_eq!(attempts(td, id).await, tries, "row {id}'s attempts");
    if error.is_some() {
        assert_eq!(
            text_column(td, id, "last_error").await.as_deref(),
            error,
            "row {id}'s last_error"
        );
    }
}

/// A row no claim holds.
const UNCLAIMED: &str = "claimed_by IS NULL AND claim_token IS NULL AND claimed_until IS NULL";

/// One completion of each resolution, for `row[0..4]` under `req`: delivered, a retry and
/// a release with its delay of 900 ms, failed.
fn one_of_each(req: &ClaimRequest, row: &[i64]) -> [Completion; 4] {
    [
        completion(req, row[0], Resolution::Delivered),
        completion(
            req,
            row[1],
            Resolution::Retry {
                delay: Duration::from_millis(900),
                error: "503 from receiver".into(),
            },
        ),
        completion(
            req,
            row[2],
            Resolution::Failed {
                error: "400: bad payload".into(),
            },
        ),
        completion(
            req,
            row[3],
            Resolution::Release {
                delay: Duration::from_millis(900),
                error: Some("throttled".into()),
            },
        ),
    ]
}

/// Each row of [`one_of_each`] is in its resolution's state; a release is not an attempt.
async fn assert_each_resolution(td: &TestDb, row: &[i64]) {
    let now = now_sql(td);
    let unclaimed = UNCLAIMED;
    for (id, state, tries, error) in [
        (
            row[0],
            format!(
                "status = 'SUCCESS' AND sent_at IS NOT NULL AND last_error IS NULL AND {unclaimed}"
            ),
            1,
            None,
        ),
        (
            row[1],
            format!(
                "status = 'RETRY' AND next_attempt_at > {now} AND sent_at IS NULL AND {unclaimed}"
            ),
            1,
            Some("503 from receiver"),
        ),
        (
            row[2],
            format!("status = 'FAILED' AND {unclaimed}"),
            1,
            Some("400: bad payload"),
        ),
        (
            row[3],
            format!("status = 'PENDING' AND next_attempt_at > {now} AND {unclaimed}"),
            0,
            Some("throttled"),
        ),
    ] {
        assert_row(td, id, &state, tries, error).await;
    }
}

per_db!(complete_writes_each_resolution);
async fn complete_writes_each_resolution(db: Db) {
    let Some(td) = TestDb::open(db, "st_complete").await else {
        return;
    };
    let store = td.store.clone();
    let row = td.enqueue_n("log", r#"{"n":1}"#, 4).await;
    let (req, rows) = claim(&*store, 10, LONG, "a", None).await;
    assert_eq!(ids(&rows), row);
    assert_eq!(complete(&*store, &one_of_each(&req, &row)).await, 4);
    assert_each_resolution(&td, &row).await;

    // Neither the RETRY row nor the released one is claimable before its delay...
    let (_, early) = claim(&*store, 10, LONG, "b", None).await;
    assert!(early.is_empty(), "claimed before due: {:?}", ids(&early));
    // ...and both are after it.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (req2, later) = claim(&*store, 10, LONG, "b", None).await;
    assert_eq!(ids(&later), vec![row[1], row[3]]);
    assert_eq!(later[0].delivery.attempts, 1);
    assert_eq!(later[1].delivery.attempts, 0);

    // A release without an error keeps the previous one; RETRY stays RETRY.
    let done = [
        completion(
            &req2,
            row[1],
            Resolution::Release {
                delay: Duration::ZERO,
                error: None,
            },
        ),
        completion(&req2, row[3], Resolution::Delivered),
    ];
    assert_eq!(complete(&*store, &done).await, 2);
    let retry = format!("status = 'RETRY' AND {UNCLAIMED}");
    assert_row(&td, row[1], &retry, 1, Some("503 from receiver")).await;
    assert!(row_is(&td, row[3], "status = 'SUCCESS' AND last_error IS NULL").await);
    let (_, again) = claim(&*store, 10, LONG, "c", None).await;
    assert_eq!(
        ids(&again),
        vec![row[1]],
        "released with no delay: due at once"
    );
    td.drop_table().await;
}

per_db!(batched_completions_with_two_tokens);
async fn batched_completions_with_two_tokens(db: Db) {
    let Some(td) = TestDb::open(db, "st_batch").await else {
        return;
    };
    let store = td.store.clone();
    td.insert("log", (0..720).map(|_| (None, "{}".to_string())))
        .await;
    // More than one result chunk (500) under the first token.
    let (t1, first) = claim(&*store, 600, LONG, "a", None).await;
    let (t2, second) = claim(&*store, 120, LONG, "b", None).await;
    assert_eq!(first.len(), 600);
    assert_eq!(second.len(), 120);
    let mut done: Vec<Completion> = first
        .iter()
        .map(|r| completion(&t1, r.delivery.id, Resolution::Delivered))
        .collect();
    for (i, r) in second.iter().enumerate() {
        let res = match i % 4 {
            0 => Resolution::Delivered,
            1 => Resolution::Retry {
                delay: Duration::from_secs(60),
                error: format!("retry {i}"),
            },
            2 => Resolution::Failed {
                error: format!("failed {i}"),
            },
            _ => Resolution::Release {
                delay: Duration::from_secs(60),
                error: None,
            },
        };
        done.push(completion(&t2, r.delivery.id, res));
    }
    // Interleave the two tokens and kinds, and add a write under a wrong token.
    done.reverse();
    done.push(Completion {
        id: first[0].delivery.id,
        token: token(),
        resolution: Resolution::Failed {
            error: "stale".into(),
        },
    });
    assert_eq!(complete(&*store, &done).await, 720);
    let [pending, retry, success, failed] = td.counts().await;
    assert_eq!((pending, retry, success, failed), (30, 30, 630, 30));
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE claim_token IS NOT NULL")
            .await,
        0
    );
    // Each RETRY / FAILED row got its own error text.
    let r = second[1].delivery.id;
    assert_eq!(
        text_column(&td, r, "last_error").await.as_deref(),
        Some("retry 1")
    );
    let f = second[2].delivery.id;
    assert_eq!(
        text_column(&td, f, "last_error").await.as_deref(),
        Some("failed 2")
    );
    assert_eq!(complete(&*store, &[]).await, 0);
    td.drop_table().await;
}

per_db!(long_errors_are_truncated);
async fn long_errors_are_truncated(db: Db) {
    let Some(td) = TestDb::open(db, "st_trunc").await else {
        return;
    };
    let store = td.store.clone();
    let a = td.enqueue("log", r#"{"n":1}"#, None).await;
    let b = td.enqueue("log", r#"{"n":1}"#, None).await;
    // 'é' is 2 bytes and the leading 'x' puts byte 1000 in the middle of one; '😀' is 4 bytes.
    let long_a = format!("x{}", "é".repeat(1500));
    let long_b = format!("ab{}", "😀".repeat(400));
    let (req, rows) = claim(&*store, 10, LONG, "a", None).await;
    assert_eq!(rows.len(), 2);
    let done = [
        completion(
            &req,
            a,
            Resolution::Failed {
                error: long_a.clone(),
            },
        ),
        completion(
            &req,
            b,
            Resolution::Retry {
                delay: Duration::from_secs(60),
                error: long_b.clone(),
            },
        ),
    ];
    assert_eq!(complete(&*store, &done).await, 2);
    for (id, original) in [(a, &long_a), (b, &long_b)] {
        let stored = text_column(&td, id, "last_error")
            .await
            .expect("last_error");
        assert!(
            stored.len() <= MAX_ERROR_LEN + 3,
            "{} bytes stored",
            stored.len()
        );
        assert!(stored.len() >= MAX_ERROR_LEN - 4, "cut too short");
        let body = stored.strip_suffix("...").unwrap_or(&stored);
        assert!(original.starts_with(body), "the stored error is a prefix");
    }
    td.drop_table().await;
}

per_db!(errors_are_stored_as_written_whatever_their_text);
/// An error with quotes, backslashes, control characters and placeholders' marks is stored as
/// written, whether the statement carries it as a literal or bound (MySQL/MariaDB write values
/// as literals where they can: docs/design.md, "Statements as text on MySQL/MariaDB").
async fn errors_are_stored_as_written_whatever_their_text(db: Db) {
    let Some(td) = TestDb::open(db, "st_errtext").await else {
        return;
    };
    let store = td.store.clone();
    let errors = [
        "it's 'quoted' ? $1 %s",
        r#"C:\path\to "file" \' \\"#,
        "line\nnext\ttab",
        "é 😀 -- /* not a comment */ ;",
    ];
    let mut ids = Vec::new();
    for _ in errors {
        ids.push(td.enqueue("log", r#"{"n":1}"#, None).await);
    }
    let (req, rows) = claim(&*store, 10, LONG, "a", None).await;
    assert_eq!(rows.len(), errors.len());
    let done: Vec<_> = (ids.iter().zip(errors))
        .map(|(&id, error)| {
            let error = error.to_string();
            completion(&req, id, Resolution::Failed { error })
        })
        .collect();
    assert_eq!(complete(&*store, &done).await, errors.len() as u64);
    for (&id, error) in ids.iter().zip(errors) {
        let stored = text_column(&td, id, "last_error").await;
        assert_eq!(stored.as_deref(), Some(error), "row {id}");
    }
    td.drop_table().await;
}
