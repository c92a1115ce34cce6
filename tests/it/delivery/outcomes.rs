//! What each answer of the receiver does to a row: delivered exactly once, retried after a
//! 5xx, failed on a 4xx, paused by a 429, and bad rows failing alone.

use super::*;

// ---------------------------------------------------------------------------------------------
// 1. 1,000 rows, each delivered exactly once, signed, with webhook-id = row id.

async fn thousand_rows_delivered_once(db: Db) {
    let Some(td) = open(db, "dl_1k").await else {
        return;
    };
    let rx = Receiver::start(Some(SECRET)).await;
    td.insert_hooks(1000).await;
    let mut relay = RelayProc::start(&td, &base(&rx), "one");

    let tdr = &td;
    until(
        "1000 rows SUCCESS",
        Duration::from_secs(30),
        || async move { tdr.counts().await[2] == 1000 },
    )
    .await;
    assert!(relay.running(), "relay exited early");
    assert_eq!(td.counts().await, [0, 0, 1000, 0]);

    // Every row reached the receiver exactly once: no duplicates, none missing.
    let stored = payloads(&td).await;
    let counts = rx.count_by_id();
    let dupes: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(dupes.is_empty(), "ids received more than once: {dupes:?}");
    let received: HashSet<i64> = counts.keys().copied().collect();
    let expected: HashSet<i64> = stored.keys().copied().collect();
    assert_eq!(
        received, expected,
        "received ids differ from the table's ids"
    );
    assert_eq!(rx.len(), 1000, "requests without a webhook-id arrived");

    for r in rx.requests() {
        let id = r.id.expect("webhook-id");
        assert_eq!(r.path, "/hook");
        assert_eq!(r.signature_ok, Some(true), "bad signature on row {id}");
        assert_eq!(
            r.header("idempotency-key"),
            Some(format!("\"{id}\"").as_str())
        );
        assert_eq!(r.header("content-type"), Some("application/json"));
        let body: serde_json::Value = serde_json::from_str(&r.body).expect("body is JSON");
        assert_eq!(
            &body, &stored[&id],
            "row {id}'s body differs from its payload"
        );
    }
    let sent_unset = td
        .scalar("SELECT COUNT(*) FROM {t} WHERE sent_at IS NULL OR attempts <> 1 OR claim_token IS NOT NULL")
        .await;
    assert_eq!(
        sent_unset, 0,
        "delivered rows must have sent_at, attempts = 1, no claim"
    );

    relay.sigterm();
    assert!(relay.wait_exit(Duration::from_secs(15)).await.success());
    td.drop_table().await;
}
per_db!(thousand_rows_delivered_once);

// ---------------------------------------------------------------------------------------------
// 2. 500 then 200: RETRY (attempts 1, reason stored), then SUCCESS after the backoff.

async fn server_error_retries_after_backoff(db: Db) {
    let Some(td) = open(db, "dl_500").await else {
        return;
    };
    let rx = Receiver::start(Some(SECRET)).await;
    let id = td.enqueue("hook", r#"{"order": 42}"#, None).await;
    rx.script(id, vec![Reply::status(500).body("temporary glitch")]);
    let _relay = RelayProc::start(&td, &base(&rx), "one");

    rx.expect_requests(1, Duration::from_secs(15), "first attempt")
        .await;
    let tdr = &td;
    until(
        "row in RETRY after the 500",
        Duration::from_secs(5),
        || async move {
            let s = row_state(tdr, id).await;
            s.status == "RETRY" && s.attempts == 1 && s.claim_token.is_none()
        },
    )
    .await;
    let s = row_state(&td, id).await;
    let err = s.last_error.expect("last_error after a 500");
    assert!(
        err.contains("500") && err.contains("temporary glitch"),
        "last_error: {err}"
    );

    rx.expect_requests(2, Duration::from_secs(10), "the retry")
        .await;
    until(
        "row SUCCESS after the retry",
        Duration::from_secs(5),
        || async move { row_state(tdr, id).await.status == "SUCCESS" },
    )
    .await;
    let s = row_state(&td, id).await;
    assert_eq!(s.attempts, 2);
    assert_eq!(s.last_error, None, "a delivered row keeps no error");

    let reqs = rx.requests_for(id);
    assert_eq!(reqs.len(), 2, "exactly one retry");
    let gap = reqs[1].at - reqs[0].at;
    assert!(
        gap >= Duration::from_millis(950),
        "retry came {gap:?} after the first attempt; initial_backoff is 1s"
    );
    assert!(gap < Duration::from_secs(5), "retry took {gap:?}");
    // The idempotency key is the same on every attempt (G3), and each attempt is signed.
    for r in &reqs {
        assert_eq!(r.header("webhook-id"), Some(id.to_string().as_str()));
        assert_eq!(
            r.header("idempotency-key"),
            Some(format!("\"{id}\"").as_str())
        );
        assert_eq!(r.signature_ok, Some(true));
    }
    td.drop_table().await;
}
per_db!(server_error_retries_after_backoff);

// ---------------------------------------------------------------------------------------------
// 3. 400: FAILED at once with the receiver's reason; never sent again; the next row goes on.

async fn client_error_fails_permanently(db: Db) {
    let Some(td) = open(db, "dl_400").await else {
        return;
    };
    let rx = Receiver::start(Some(SECRET)).await;
    let bad = td.enqueue("hook", r#"{"amount": -5}"#, None).await;
    let good = td.enqueue("hook", r#"{"amount": 5}"#, None).await;
    rx.script(
        bad,
        vec![Reply::status(400).body("amount must be positive")],
    );
    let _relay = RelayProc::start(&td, &base(&rx), "one");

    let tdr = &td;
    until(
        "the 400 row FAILED and the other SUCCESS",
        Duration::from_secs(15),
        || async move {
            row_state(tdr, bad).await.status == "FAILED"
                && row_state(tdr, good).await.status == "SUCCESS"
        },
    )
    .await;
    let s = row_state(&td, bad).await;
    assert_eq!(s.attempts, 1);
    assert_eq!(s.claim_token, None);
    assert_eq!(
        s.last_error.as_deref(),
        Some("HTTP 400: amount must be positive")
    );

    // Longer than the retry backoff and many poll intervals: a FAILED row is never re-sent.
    let resent = rx
        .wait_until(
            |r| r.iter().filter(|q| q.id == Some(bad)).count() > 1,
            Duration::from_millis(1500),
        )
        .await;
    assert!(!resent, "a FAILED row was sent again");
    assert_eq!(rx.count_by_id().get(&good), Some(&1));
    assert_eq!(row_state(&td, bad).await.status, "FAILED");
    td.drop_table().await;
}
per_db!(client_error_fails_permanently);

// ---------------------------------------------------------------------------------------------
// 4. 429 with Retry-After: the sink pauses, the attempt is not counted, delivery resumes after.

async fn throttle_delays_without_counting(db: Db) {
    let Some(td) = open(db, "dl_429").await else {
        return;
    };
    let rx = Receiver::start(Some(SECRET)).await;
    let id = td.enqueue("hook", r#"{"burst": 1}"#, None).await;
    rx.script(
        id,
        vec![
            Reply::status(429)
                .header("retry-after", "2")
                .body("slow down"),
        ],
    );
    let _relay = RelayProc::start(&td, &base(&rx), "one");

    rx.expect_requests(1, Duration::from_secs(15), "first attempt")
        .await;
    let first_at = rx.requests()[0].at;
    let tdr = &td;
    until(
        "the throttled row given back",
        Duration::from_secs(3),
        || async move {
            let s = row_state(tdr, id).await;
            s.claim_token.is_none() && s.last_error.is_some()
        },
    )
    .await;
    let s = row_state(&td, id).await;
    assert_eq!(s.status, "PENDING", "a throttle is not a failed attempt");
    assert_eq!(s.attempts, 0, "a throttle must not count an attempt");
    let err = s.last_error.unwrap_or_default();
    assert!(err.contains("429"), "last_error: {err}");

    // The whole sink is paused: a row enqueued now waits for the pause too.
    let other = td.enqueue("hook", r#"{"burst": 2}"#, None).await;
    let early = rx
        .wait_until(
            |r| r.len() > 1,
            Duration::from_millis(1500).saturating_sub(first_at.elapsed()),
        )
        .await;
    assert!(!early, "a request was sent during the 2s Retry-After pause");

    until(
        "both rows SUCCESS",
        Duration::from_secs(10),
        || async move {
            row_state(tdr, id).await.status == "SUCCESS"
                && row_state(tdr, other).await.status == "SUCCESS"
        },
    )
    .await;
    assert_eq!(row_state(&td, id).await.attempts, 1);
    assert_eq!(row_state(&td, other).await.attempts, 1);
    let again = rx.requests_for(id);
    assert_eq!(again.len(), 2);
    let gap = again[1].at - first_at;
    assert!(
        gap >= Duration::from_millis(1900),
        "resent after {gap:?}, Retry-After was 2s"
    );
    let other_reqs = rx.requests_for(other);
    assert_eq!(other_reqs.len(), 1);
    let wait = other_reqs[0].at - first_at;
    assert!(
        wait >= Duration::from_millis(1900),
        "another row was sent {wait:?} into the sink's 2s pause"
    );
    td.drop_table().await;
}
per_db!(throttle_delays_without_counting);

/// A row claimed beside a throttled one and held back by the sink's pause goes back with the
/// pause's reason in `last_error` (no attempt counted), so a row waiting with no attempt says
/// why; it is delivered once the pause ends.
async fn rows_held_back_by_a_pause_say_why(db: Db) {
    let Some(td) = open(db, "dl_held").await else {
        return;
    };
    let rx = Receiver::start(Some(SECRET)).await;
    let rows = [
        td.enqueue("hook", r#"{"n": 1}"#, None).await,
        td.enqueue("hook", r#"{"n": 2}"#, None).await,
    ];
    // Whichever is sent first is throttled; the other, claimed with it, waits for the one
    // slot and finds the sink paused.
    for id in rows {
        rx.script(
            id,
            vec![Reply::status(429).header("retry-after", "2").body("slow")],
        );
    }
    let _relay = RelayProc::start(&td, &base(&rx).hook(|s| s.concurrency(1)), "one");
    let tdr = &td;
    let held_back = |s: &RowState| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("not sent") && e.contains("paused"))
    };
    until(
        "a row given back with the pause's reason",
        Duration::from_secs(10),
        || async move {
            for id in rows {
                if held_back(&row_state(tdr, id).await) {
                    return true;
                }
            }
            false
        },
    )
    .await;
    let mut held = Vec::new();
    for id in rows {
        let s = row_state(&td, id).await;
        if held_back(&s) {
            held.push(id);
            assert_eq!(s.attempts, 0, "held back, not attempted: {s:?}");
            let err = s.last_error.unwrap_or_default();
            assert!(
                err.contains("hook") && err.contains("429"),
                "last_error: {err}"
            );
        }
    }
    assert_eq!(held.len(), 1, "one row throttled, one held back");
    until(
        "both rows SUCCESS",
        Duration::from_secs(15),
        || async move {
            row_state(tdr, rows[0]).await.status == "SUCCESS"
                && row_state(tdr, rows[1]).await.status == "SUCCESS"
        },
    )
    .await;
    td.drop_table().await;
}
per_db!(rows_held_back_by_a_pause_say_why);

// ---------------------------------------------------------------------------------------------
// 5. Bad rows fail alone (G5): unknown channel, oversized payload, not JSON (SQLite only).

async fn malformed_rows_fail_alone(db: Db) {
    let Some(td) = open(db, "dl_bad").await else {
        return;
    };
    let rx = Receiver::start(Some(SECRET)).await;
    let mut good = Vec::new();
    let mut bad: Vec<(i64, &str)> = Vec::new();
    for i in 0..5 {
        good.push(
            td.enqueue("hook", &format!(r#"{{"good": {i}}}"#), None)
                .await,
        );
    }
    bad.push((
        td.enqueue("nope", r#"{"x": 1}"#, None).await,
        "no sink is configured for channel \"nope\"",
    ));
    for i in 5..10 {
        good.push(
            td.enqueue("hook", &format!(r#"{{"good": {i}}}"#), None)
                .await,
        );
    }
    let big = format!(r#"{{"pad": "{}"}}"#, "x".repeat(200));
    bad.push((
        td.enqueue("hook", &big, None).await,
        "exceeds sinks.hook.max_body_bytes (100)",
    ));
    for i in 10..15 {
        good.push(
            td.enqueue("hook", &format!(r#"{{"good": {i}}}"#), None)
                .await,
        );
    }
    if db == Db::Sqlite {
        bad.push((
            td.enqueue("hook", "this is {not json", None).await,
            "payload is not valid JSON",
        ));
    }
    for i in 15..20 {
        good.push(
            td.enqueue("hook", &format!(r#"{{"good": {i}}}"#), None)
                .await,
        );
    }
    let _relay = RelayProc::start(&td, &base(&rx).hook(|s| s.max_body_bytes(100)), "one");

    let tdr = &td;
    let total = (good.len() + bad.len()) as i64;
    until("every row final", Duration::from_secs(15), || async move {
        let c = tdr.counts().await;
        c[2] + c[3] == total
    })
    .await;
    for &id in &good {
        assert_eq!(row_state(&td, id).await.status, "SUCCESS", "good row {id}");
    }
    let counts = rx.count_by_id();
    for &id in &good {
        assert_eq!(counts.get(&id), Some(&1), "good row {id} delivered once");
    }
    for (id, reason) in &bad {
        let s = row_state(&td, *id).await;
        assert_eq!(s.status, "FAILED", "bad row {id}");
        assert_eq!(s.attempts, 1, "bad row {id}");
        let err = s.last_error.unwrap_or_default();
        assert!(
            err.contains(reason),
            "bad row {id}: last_error {err:?} lacks {reason:?}"
        );
        assert!(
            !counts.contains_key(id),
            "bad row {id} was sent to the receiver"
        );
    }
    assert_eq!(rx.len(), good.len());
    td.drop_table().await;
}
per_db!(malformed_rows_fail_alone);
