//! The operator's verbs, driven through the binary against real PostgreSQL, MariaDB and
//! SQLite: `failed`, `requeue` (by id, `--all-failed`, `--dry-run`), `status`; `purge` (never
//! PENDING or RETRY rows) and retention (`housekeeping::purge_all`, what `run` calls every
//! 60s) in `purge`; the real `/metrics` output checked by `promtool check metrics`, JSON logs
//! without secrets, alert rules and the dashboard (`observability`).

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::process::*;
use crate::support::*;
use outbox_relay::store::LeaseTable;

mod observability;
mod purge;

/// Runs the binary with `args` against the test's table; the lease name is the table name so
/// parallel tests never share a lease row. Runs in the test's temp dir, so no
/// `config/relay.toml` is picked up.
async fn cli(td: &TestDb, args: &[&str]) -> Output {
    cli_env(td, args, &[]).await
}

/// As [`cli`], with extra environment variables.
async fn cli_env(td: &TestDb, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = relay_on_table(td);
    cmd.envs(env.iter().copied()).args(args);
    run_to_end(
        format!("outbox-relay {args:?}"),
        &mut cmd,
        Duration::from_secs(60),
    )
    .await
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs a verb that must succeed and returns its stdout.
async fn ok(td: &TestDb, args: &[&str]) -> String {
    let o = cli(td, args).await;
    assert!(
        o.status.success(),
        "outbox-relay {args:?} exited {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(&o),
        String::from_utf8_lossy(&o.stderr)
    );
    stdout(&o)
}

/// Sets a row's status (and attempts / last error) directly, as a relay would have left it.
async fn set(td: &TestDb, id: i64, status: &str, attempts: i64, error: Option<&str>) {
    let error = error.map_or("NULL".to_string(), |e| format!("'{e}'"));
    td.exec(&format!(
        "UPDATE {{t}} SET status = '{status}', attempts = {attempts}, last_error = {error}
         WHERE id = {id}"
    ))
    .await;
}

async fn status_of(td: &TestDb, id: i64) -> Option<(String, i64)> {
    use sqlx::Row;
    let sql = format!("SELECT status, attempts FROM {} WHERE id = {id}", td.table);
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_optional(td.store.pool())
        .await
        .expect("select")
        .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1)))
}

/// The `failed` table's rows: (id, channel, attempts, last error).
fn failed_rows(out: &str) -> Vec<(i64, String, i64, String)> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let id = w.next()?.parse().ok()?;
            let channel = w.next()?.to_string();
            let attempts = w.next()?.parse().ok()?;
            let _date = w.next()?;
            let _time = w.next()?;
            Some((id, channel, attempts, w.collect::<Vec<_>>().join(" ")))
        })
        .collect()
}

per_db!(failed_lists_reasons_and_attempts);
async fn failed_lists_reasons_and_attempts(db: Db) {
    let Some(td) = TestDb::open(db, "adm_failed").await else {
        return;
    };
    let a1 = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let a2 = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let b1 = td.enqueue("beta", r#"{"n":1}"#, None).await;
    let pending = td.enqueue("beta", r#"{"n":1}"#, None).await;
    let done = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    set(&td, a1, "FAILED", 3, Some("410 Gone: subscriber deleted")).await;
    set(&td, a2, "FAILED", 10, Some("503 after 10 attempts")).await;
    set(&td, b1, "FAILED", 1, Some("payload is not JSON")).await;
    set(&td, done, "SUCCESS", 1, None).await;

    let out = ok(&td, &["failed"]).await;
    let rows = failed_rows(&out);
    assert_eq!(
        rows,
        vec![
            (b1, "beta".into(), 1, "payload is not JSON".into()),
            (a2, "alpha".into(), 10, "503 after 10 attempts".into()),
            (a1, "alpha".into(), 3, "410 Gone: subscriber deleted".into()),
        ],
        "newest first, with attempts and reason:\n{out}"
    );
    assert!(!rows.iter().any(|r| r.0 == pending || r.0 == done));

    let out = ok(&td, &["failed", "--channel", "alpha"]).await;
    let ids: Vec<i64> = failed_rows(&out).iter().map(|r| r.0).collect();
    assert_eq!(ids, vec![a2, a1], "--channel alpha:\n{out}");

    let out = ok(&td, &["failed", "--limit", "1"]).await;
    let ids: Vec<i64> = failed_rows(&out).iter().map(|r| r.0).collect();
    assert_eq!(ids, vec![b1], "--limit 1:\n{out}");

    let out = ok(&td, &["failed", "--channel", "nosuch"]).await;
    assert!(out.contains("no FAILED rows"), "{out}");
    td.drop_table().await;
}

per_db!(requeue_by_id_touches_only_failed_rows);
async fn requeue_by_id_touches_only_failed_rows(db: Db) {
    let Some(td) = TestDb::open(db, "adm_rq_id").await else {
        return;
    };
    let pending = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let retry = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let success = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let f1 = td.enqueue("alpha", r#"{"n":1}"#, None).await;
    let f2 = td.enqueue("beta", r#"{"n":1}"#, None).await;
    let untouched = td.enqueue("beta", r#"{"n":1}"#, None).await;
    set(&td, retry, "RETRY", 2, Some("503")).await;
    set(&td, success, "SUCCESS", 1, None).await;
    set(&td, f1, "FAILED", 10, Some("503 after 10 attempts")).await;
    set(&td, f2, "FAILED", 1, Some("410 Gone")).await;
    set(&td, untouched, "FAILED", 4, Some("400")).await;
    let missing = untouched + 1000;

    // Ids that are not FAILED: nothing changes, and the output says so for each.
    let ids = format!("{pending},{retry},{success},{missing}");
    let out = ok(&td, &["requeue", "--id", &ids]).await;
    assert!(
        out.contains(&format!("row {pending} is PENDING, not FAILED")),
        "{out}"
    );
    assert!(
        out.contains(&format!("row {retry} is RETRY, not FAILED")),
        "{out}"
    );
    assert!(
        out.contains(&format!("row {success} is SUCCESS, not FAILED")),
        "{out}"
    );
    assert!(
        out.contains(&format!("row {missing} does not exist")),
        "{out}"
    );
    assert!(out.contains("requeued 0 FAILED row(s)"), "{out}");
    assert_eq!(status_of(&td, pending).await, Some(("PENDING".into(), 0)));
    assert_eq!(status_of(&td, retry).await, Some(("RETRY".into(), 2)));
    assert_eq!(status_of(&td, success).await, Some(("SUCCESS".into(), 1)));
    assert_eq!(td.counts().await, [1, 1, 1, 3]);

    // FAILED ids (comma-separated and repeated forms both work): back to PENDING with a
    // fresh attempt budget; a non-FAILED id in the same call stays as it was.
    let (a, b) = (f1.to_string(), f2.to_string());
    let out = ok(
        &td,
        &[
            "requeue",
            "--id",
            &a,
            "--id",
            &b,
            "--id",
            &success.to_string(),
        ],
    )
    .await;
    assert!(out.contains("requeued 2 FAILED row(s)"), "{out}");
    assert!(
        out.contains(&format!("row {success} is SUCCESS, not FAILED")),
        "{out}"
    );
    assert_eq!(status_of(&td, f1).await, Some(("PENDING".into(), 0)));
    assert_eq!(status_of(&td, f2).await, Some(("PENDING".into(), 0)));
    assert_eq!(status_of(&td, success).await, Some(("SUCCESS".into(), 1)));
    assert_eq!(status_of(&td, untouched).await, Some(("FAILED".into(), 4)));
    let unclaimed = td
        .scalar(&format!(
            "SELECT COUNT(*) FROM {{t}} WHERE id IN ({f1}, {f2}) AND claim_token IS NULL
             AND claimed_by IS NULL AND claimed_until IS NULL"
        ))
        .await;
    assert_eq!(unclaimed, 2, "requeued rows carry no claim");
    // Requeued rows are due now.
    let due = td
        .scalar(&format!(
            "SELECT COUNT(*) FROM {{t}} WHERE id IN ({f1}, {f2}) AND next_attempt_at <= {}",
            td.store.now_sql()
        ))
        .await;
    assert_eq!(due, 2, "requeued rows are due at once");

    // Requeueing them again: they are PENDING now, so nothing happens.
    let out = ok(&td, &["requeue", "--id", &a]).await;
    assert!(out.contains("requeued 0 FAILED row(s)"), "{out}");
    assert!(
        out.contains(&format!("row {f1} is PENDING, not FAILED")),
        "{out}"
    );
    td.drop_table().await;
}

per_db!(requeue_all_failed_with_channel_and_dry_run);
async fn requeue_all_failed_with_channel_and_dry_run(db: Db) {
    let Some(td) = TestDb::open(db, "adm_rq_all").await else {
        return;
    };
    let mut alpha = Vec::new();
    for _ in 0..3 {
        let id = td.enqueue("alpha", r#"{"n":1}"#, None).await;
        set(&td, id, "FAILED", 5, Some("503")).await;
        alpha.push(id);
    }
    let mut beta = Vec::new();
    for _ in 0..2 {
        let id = td.enqueue("beta", r#"{"n":1}"#, None).await;
        set(&td, id, "FAILED", 5, Some("503")).await;
        beta.push(id);
    }
    let pending = td.enqueue("alpha", r#"{"n":1}"#, None).await;

    let out = ok(
        &td,
        &["requeue", "--all-failed", "--channel", "alpha", "--dry-run"],
    )
    .await;
    assert!(out.contains("would requeue 3 FAILED row(s)"), "{out}");
    assert_eq!(td.counts().await, [1, 0, 0, 5], "--dry-run changed rows");
    for id in &alpha {
        assert_eq!(status_of(&td, *id).await, Some(("FAILED".into(), 5)));
    }

    let out = ok(&td, &["requeue", "--all-failed", "--dry-run"]).await;
    assert!(out.contains("would requeue 5 FAILED row(s)"), "{out}");
    assert_eq!(td.counts().await, [1, 0, 0, 5], "--dry-run changed rows");

    let out = ok(&td, &["requeue", "--all-failed", "--channel", "alpha"]).await;
    assert!(out.contains("requeued 3 FAILED row(s)"), "{out}");
    for id in &alpha {
        assert_eq!(status_of(&td, *id).await, Some(("PENDING".into(), 0)));
    }
    for id in &beta {
        assert_eq!(status_of(&td, *id).await, Some(("FAILED".into(), 5)));
    }
    assert_eq!(status_of(&td, pending).await, Some(("PENDING".into(), 0)));

    // Usage errors exit 2 and change nothing: --channel needs --all-failed; one of --id or
    // --all-failed is required.
    let o = cli(&td, &["requeue", "--channel", "beta"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let o = cli(&td, &["requeue"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert_eq!(td.counts().await, [4, 0, 0, 2]);
    td.drop_table().await;
}

/// Six rows on channels alpha and beta, in every status; the oldest unfinished one was
/// created an hour ago.
async fn seed_every_status(td: &TestDb) {
    let mut ids = Vec::new();
    for ch in ["alpha", "alpha", "alpha", "beta", "beta", "alpha"] {
        ids.push(td.enqueue(ch, r#"{"n":1}"#, None).await);
    }
    set(td, ids[1], "SUCCESS", 1, None).await;
    set(td, ids[2], "FAILED", 10, Some("503")).await;
    set(td, ids[3], "RETRY", 2, Some("503")).await;
    // The oldest unfinished row was created an hour ago.
    let hour_ago = match td.db {
        Db::Postgres => "(now() - interval '1 hour')",
        Db::MySql => "(NOW(6) - INTERVAL 1 HOUR)",
        Db::Sqlite => "strftime('%Y-%m-%d %H:%M:%f','now','-3600 seconds')",
    };
    td.exec(&format!(
        "UPDATE {{t}} SET created_at = {hour_ago} WHERE id = {}",
        ids[0]
    ))
    .await;
}

/// The `status` table's (status, channel, count) lines, sorted.
fn status_counts(out: &str) -> Vec<(String, String, i64)> {
    let mut counts = Vec::new();
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() == 3 && ["PENDING", "RETRY", "SUCCESS", "FAILED"].contains(&w[0]) {
            counts.push((
                w[0].to_string(),
                w[1].to_string(),
                w[2].parse::<i64>().unwrap(),
            ));
        }
    }
    counts.sort();
    counts
}

/// The age `status` gives the oldest pending row, in seconds.
fn oldest_pending_secs(out: &str) -> f64 {
    out.lines()
        .find_map(|l| l.strip_prefix("oldest pending: "))
        .and_then(|s| s.strip_suffix('s'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no oldest pending age in:\n{out}"))
}

/// Runs `status` configured for the Redis lease (at an address where nothing listens); it
/// must succeed. Returns its stdout.
async fn status_with_redis_lease(td: &TestDb) -> String {
    let o = cli_env(
        td,
        &["status"],
        &[
            ("OUTBOX_RELAY__LEASE__BACKEND", "redis"),
            ("OUTBOX_RELAY__LEASE__REDIS_URL", "redis://127.0.0.1:1"),
        ],
    )
    .await;
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    out
}

per_db!(status_shows_counts_oldest_pending_and_lease);
async fn status_shows_counts_oldest_pending_and_lease(db: Db) {
    let Some(td) = TestDb::open(db, "adm_status").await else {
        return;
    };
    let out = ok(&td, &["status"]).await;
    assert!(out.contains("no rows"), "{out}");
    assert!(out.contains("oldest pending: none"), "{out}");
    assert!(out.contains("never taken"), "{out}");

    seed_every_status(&td).await;
    let epoch = td
        .store
        .lease_acquire(&td.table, "relay-a:42", Duration::from_secs(60))
        .await
        .expect("lease_acquire")
        .expect("lease free");

    let out = ok(&td, &["status"]).await;
    let expected: Vec<(String, String, i64)> = [
        ("FAILED", "alpha", 1),
        ("PENDING", "alpha", 2),
        ("PENDING", "beta", 1),
        ("RETRY", "beta", 1),
        ("SUCCESS", "alpha", 1),
    ]
    .iter()
    .map(|(s, c, n)| (s.to_string(), c.to_string(), *n))
    .collect();
    assert_eq!(
        status_counts(&out),
        expected,
        "counts per status and channel:\n{out}"
    );

    let oldest = oldest_pending_secs(&out);
    assert!(
        (3590.0..3700.0).contains(&oldest),
        "oldest pending {oldest}s, expected about an hour:\n{out}"
    );
    assert!(
        out.contains(&format!(
            "lease {}: held by relay-a:42, epoch {epoch},",
            td.table
        )),
        "lease holder and epoch:\n{out}"
    );

    // Released: free, and the epoch stays.
    td.store
        .lease_release(outbox_relay::store::Hold::new(
            &td.table,
            "relay-a:42",
            epoch,
        ))
        .await
        .expect("release");
    let out = ok(&td, &["status"]).await;
    assert!(
        out.contains(&format!("lease {}: free (epoch {epoch})", td.table)),
        "{out}"
    );

    // A Redis-lease holder records itself and the new epoch in the database with no expiry:
    // status names it instead of calling the lease free.
    let redis_epoch = td
        .store
        .advance_epoch(&td.table, "relay-b:7")
        .await
        .expect("advance_epoch");
    assert_eq!(redis_epoch, epoch + 1);
    let out = status_with_redis_lease(&td).await;
    assert!(
        out.contains(&format!(
            "lease {}: epoch {redis_epoch} taken by relay-b:7 (the live lease is kept by the redis backend",
            td.table
        )),
        "{out}"
    );
    td.drop_table().await;
}

/// A `database.url` naming an SQLite file that does not exist: SQLite opens existing files
/// only unless told `mode=rwc`, and the error says so (and creates nothing); with `mode=rwc`
/// in a directory that does not exist, the error names the directory; with `mode=rwc` in one
/// that does, the same verb creates and migrates the file.
#[tokio::test]
async fn a_missing_sqlite_file_is_an_error_that_names_mode_rwc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("not-yet.db");
    let url = format!("sqlite://{}", path.display());
    let run = |url: String| {
        let mut cmd = Command::new(relay_bin());
        cmd.current_dir(dir.path())
            .env("OUTBOX_RELAY__DATABASE__URL", url)
            .arg("status");
        async move { run_to_end("outbox-relay status", &mut cmd, Duration::from_secs(60)).await }
    };
    let o = run(url.clone()).await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("?mode=rwc") && err.contains("database.url"),
        "{err}"
    );
    assert!(!path.exists(), "a failed open created {}", path.display());

    // With mode=rwc, in a directory that does not exist: SQLite creates files, not
    // directories.
    let o = run(format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("no-such-dir").join("x.db").display()
    ))
    .await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("directory"), "{err}");

    let o = run(format!("{url}?mode=rwc")).await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(path.exists());
}
