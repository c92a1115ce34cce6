//! Rows and results that cannot be handled: undecodable rows fail alone, a refused result is
//! isolated, and control characters in reasons are stored clean.

use super::*;

// ---------------------------------------------------------------------------------------------

async fn undecodable_rows_fail_alone(db: Db) {
    let Some(td) = TestDb::open(db, "bad_decode").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    insert_good(&td, 1..=3).await;
    // Over every sink's limit (max_body_bytes = 2000 below): never loaded.
    let big = json(db, &format!(r#"{{"pad":"{}"}}"#, "x".repeat(5000)));
    td.exec(&format!(
        "INSERT INTO {{t}} (channel, payload) VALUES ('hook', {big})"
    ))
    .await;
    let big_id = td.scalar("SELECT MAX(id) FROM {t}").await;
    // (row, what its reason must say)
    let mut bad_rows = vec![(
        big_id,
        "exceeds sinks.hook.max_body_bytes (2000)".to_string(),
    )];
    if db == Db::Sqlite {
        // What applications write into SQLite's untyped columns: a BLOB payload (Python's
        // sqlite3 for `bytes`), text that is not UTF-8, a BLOB recipient, a text attempts
        // count, a BLOB channel, a next_attempt_at that is not a time (it would never be due).
        for (col, value) in [
            ("payload", "X'7B226E223A317D'"),
            ("payload", "CAST(X'7B226E223AFF7D' AS TEXT)"),
            ("recipient", "X'3031303132333435'"),
            ("attempts", "'many'"),
            ("channel", "X'686F6F6B'"),
            ("next_attempt_at", "'tomorrow'"),
        ] {
            let (channel, payload) = match col {
                "payload" => ("'hook'".to_string(), value.to_string()),
                "channel" => (value.to_string(), r#"'{"n":0}'"#.to_string()),
                _ => ("'hook'".to_string(), r#"'{"n":0}'"#.to_string()),
            };
            let extra = match col {
                "recipient" | "attempts" | "next_attempt_at" => format!(", {col}"),
                _ => String::new(),
            };
            let extra_value = match col {
                "recipient" | "attempts" | "next_attempt_at" => format!(", {value}"),
                _ => String::new(),
            };
            td.exec(&format!(
                "INSERT INTO {{t}} (channel, payload{extra}) VALUES ({channel}, {payload}{extra_value})"
            ))
            .await;
            let id = td.scalar("SELECT MAX(id) FROM {t}").await;
            bad_rows.push((id, format!("column {col}")));
        }
    }
    insert_good(&td, 100..=102).await;

    let cfg = base(&rx).batch_size(20).hook(|s| s.max_body_bytes(2000));
    let _relay = RelayProc::start(&td, &cfg, "one");
    until_finished(&td, Duration::from_secs(20)).await;

    let state = rows(&td).await;
    let bad: Vec<i64> = bad_rows.iter().map(|(id, _)| *id).collect();
    assert_good_delivered_once(&rx, &state, &bad);
    for (id, expected) in &bad_rows {
        let (status, err) = &state[id];
        let err = err.as_deref().unwrap_or_default();
        assert_eq!(status, "FAILED", "row {id} ({expected}): {err}");
        assert!(
            err.contains(expected.as_str()),
            "row {id}: the reason should say {expected:?}: {err}"
        );
        assert!(rx.requests_for(*id).is_empty(), "row {id} must not be sent");
    }
    td.drop_table().await;
}
per_db!(undecodable_rows_fail_alone);

// ---------------------------------------------------------------------------------------------

/// Makes the database refuse to mark row `id` SUCCESS (the way a constraint or an audit
/// trigger of the application's might), whatever the relay writes for it.
async fn refuse_success_of(td: &TestDb, id: i64) {
    let refused = format!("IF NEW.status = 'SUCCESS' AND NEW.id = {id} THEN");
    match td.db {
        Db::Postgres => {
            let raise = format!("RAISE EXCEPTION 'row {id} may not succeed'; END IF;");
            before_update(td, "refuse", &format!("{refused} {raise}")).await;
        }
        Db::MySql => {
            let signal = "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'may not succeed'; END IF;";
            before_update(td, "refuse", &format!("{refused} {signal}")).await;
        }
        Db::Sqlite => {
            td.exec(&format!(
                "CREATE TRIGGER {{t}}_refuse BEFORE UPDATE ON {{t}} FOR EACH ROW
                 WHEN NEW.status = 'SUCCESS' AND NEW.id = {id}
                 BEGIN SELECT RAISE(ABORT, 'may not succeed'); END"
            ))
            .await;
        }
    }
}

async fn refused_result_is_isolated(db: Db) {
    let Some(td) = TestDb::open(db, "bad_refused").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    insert_good(&td, 1..=30).await;
    let poisoned = td.scalar("SELECT MIN(id) FROM {t}").await + 7;
    refuse_success_of(&td, poisoned).await;
    let _relay = RelayProc::start(&td, &base(&rx), "one");
    until_finished(&td, Duration::from_secs(20)).await;
    // Long enough for a stuck result to show up as a re-send.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let state = rows(&td).await;
    assert_good_delivered_once(&rx, &state, &[poisoned]);
    let (status, err) = &state[&poisoned];
    assert_eq!(status, "FAILED");
    let err = err.as_deref().unwrap_or_default();
    assert!(
        err.contains("could not be stored") && err.contains("delivered"),
        "generic reason expected: {err}"
    );
    assert_eq!(
        rx.requests_for(poisoned).len(),
        1,
        "the poisoned row is sent once, not in a loop"
    );
    td.drop_table().await;
}
per_db!(refused_result_is_isolated);

// ---------------------------------------------------------------------------------------------

async fn control_characters_in_reasons_are_stored_clean(db: Db) {
    let Some(td) = TestDb::open(db, "bad_nul").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    insert_good(&td, 1..=10).await;
    let first = td.scalar("SELECT MIN(id) FROM {t}").await;
    let victim = first + 4;
    rx.script(
        victim,
        vec![Reply::status(400).body("bad\u{0}token\u{1b}[0m \u{7f}end")],
    );
    let _relay = RelayProc::start(&td, &base(&rx), "one");
    until_finished(&td, Duration::from_secs(20)).await;

    let state = rows(&td).await;
    assert_good_delivered_once(&rx, &state, &[victim]);
    let (status, err) = &state[&victim];
    assert_eq!(status, "FAILED");
    let err = err.as_deref().unwrap_or_default();
    assert!(err.contains("400") && err.contains("bad"), "{err}");
    assert!(
        !err.chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t'),
        "control characters stored: {err:?}"
    );
    td.drop_table().await;
}
per_db!(control_characters_in_reasons_are_stored_clean);
