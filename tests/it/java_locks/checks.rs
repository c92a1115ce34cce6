//! The Java-compatible leases below the scenarios: the ShedLock statements on each database,
//! `migrate` creating a missing ShedLock table, and configuration validation (naming keys).

use std::time::Duration;

use super::{RENEW_TIMEOUT, TTL};
use crate::support::config::Config;
use crate::support::process::*;
use crate::support::*;
use outbox_relay::store::ShedLockTable;

/// One ShedLock operation by holder `by` and what it must answer.
enum Op {
    Acquire(&'static str, Duration, bool),
    Extend(&'static str, bool),
    Release(&'static str),
    Sleep(Duration),
}

/// Runs `ops` on row `name` of `sl`, asserting each answer.
async fn run_ops(td: &TestDb, sl: &ShedLockTable, name: &str, ops: &[Op]) {
    let t = Duration::from_secs(2);
    for (i, op) in ops.iter().enumerate() {
        let (got, want) = match op {
            Op::Acquire(by, ttl, want) => {
                (td.store.shedlock(sl).acquire(name, by, *ttl).await, *want)
            }
            Op::Extend(by, want) => (td.store.shedlock(sl).extend(name, by, t).await, *want),
            Op::Release(by) => {
                td.store
                    .shedlock(sl)
                    .release(name, by)
                    .await
                    .expect("release");
                continue;
            }
            Op::Sleep(d) => {
                tokio::time::sleep(*d).await;
                continue;
            }
        };
        let got = got.unwrap_or_else(|e| panic!("{:?} op {i} on {name}: {e}", td.db));
        assert_eq!(got, want, "{:?}: op {i} on row {name}", td.db);
    }
}

/// Runs `sql` as a Java application's session would: on MySQL in the server's global time
/// zone (the test pool's sessions run at UTC).
async fn java_exec(td: &TestDb, sql: &str) {
    use sqlx::Executor;
    let mut c = td.store.pool().acquire().await.expect("connection");
    if td.db == Db::MySql {
        c.execute("SET SESSION time_zone = @@GLOBAL.time_zone")
            .await
            .expect("zone");
    }
    c.execute(sqlx::AssertSqlSafe(sql.to_string()))
        .await
        .expect("java statement");
    // Never hand a session in another zone back to the pool.
    c.close().await.expect("close");
}

/// The relay creates a missing ShedLock table (as `migrate` does) and leaves an existing one
/// alone; ShedLock's conditions hold on every database: a live row is not taken, only its
/// holder extends or releases it, an expired row is taken over and never extended again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedlock_statements_on_every_database() {
    use Op::*;
    let t = Duration::from_secs(2);
    let short = Duration::from_millis(300);
    for db in [Db::Postgres, Db::MySql, Db::Sqlite] {
        let Some(td) = TestDb::open(db, "jl_mk").await else {
            continue;
        };
        let table = format!("sl_{}", td.table);
        let sl = ShedLockTable::new(&table, 0);
        assert!(!td.store.shedlock(&sl).table_exists().await.expect("probe"));
        assert!(td.store.shedlock(&sl).create_table().await.expect("create"));
        assert!(!td.store.shedlock(&sl).create_table().await.expect("again"));
        let ops = [
            Acquire("a", t, true),
            Acquire("b", t, false),
            Extend("a", true),
            Extend("b", false),
            Release("b"), // not b's: changes nothing
            Acquire("b", t, false),
            Release("a"),
            Acquire("b", t, true),
            Extend("a", false),
        ];
        run_ops(&td, &sl, "job", &ops).await;
        let ops = [
            Acquire("a", short, true),
            Acquire("b", short, false),
            Sleep(Duration::from_millis(450)),
            Extend("a", false),
            Acquire("b", t, true),
        ];
        run_ops(&td, &sl, "expiring", &ops).await;

        // A Java side writing its JVM's local time (Asia/Seoul, no usingDbTime()): its row
        // holds until KST now + 30 s. Read as UTC it would look free for nine more hours;
        // with the table's offset (+09:00) the relay sees it held, and free once it ends.
        let (now, kst_until) = match db {
            Db::Postgres => (
                "timezone('utc', CURRENT_TIMESTAMP) + interval '540 minutes'",
                "timezone('utc', CURRENT_TIMESTAMP) + interval '540 minutes' + interval '30 seconds'",
            ),
            Db::MySql => (
                "TIMESTAMPADD(MINUTE, 540, UTC_TIMESTAMP(3))",
                "TIMESTAMPADD(SECOND, 32430, UTC_TIMESTAMP(3))",
            ),
            Db::Sqlite => (
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '540 minutes')",
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '540 minutes', '30 seconds')",
            ),
        };
        java_exec(&td, &format!(
            "INSERT INTO {table} (name, lock_until, locked_at, locked_by) VALUES ('kst', {kst_until}, {now}, 'java')"
        ))
        .await;
        let kst = ShedLockTable::new(&table, 540);
        run_ops(&td, &kst, "kst", &[Acquire("relay", t, false)]).await;
        td.exec(&format!(
            "UPDATE {table} SET lock_until = {now} WHERE name = 'kst'"
        ))
        .await;
        run_ops(
            &td,
            &kst,
            "kst",
            &[Acquire("relay", t, true), Extend("relay", true)],
        )
        .await;
        td.exec(&format!("DROP TABLE {table}")).await;
    }
}

/// `outbox-relay migrate` with the `shedlock` backend creates the ShedLock table when it is
/// missing and leaves an existing one (and its rows) alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_a_missing_shedlock_table_only() {
    let Some(td) = TestDb::open(Db::Postgres, "jl_mig").await else {
        return;
    };
    let table = format!("sl_{}", td.table);
    let config = Config::webhook("http://127.0.0.1:9/")
        .lease_backend("shedlock", TTL, RENEW_TIMEOUT)
        .lease_key("shedlock_table", &table)
        .lease_name("poller")
        .write(td.dir.path(), "relay.toml");
    let migrate = |what: &'static str| {
        let mut cmd = relay_with_config(&td, &config);
        cmd.arg("migrate");
        async move { run_to_end(what, &mut cmd, Duration::from_secs(30)).await }
    };
    let out = migrate("migrate (no ShedLock table)").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        td.store
            .shedlock(&ShedLockTable::new(&table, 0))
            .table_exists()
            .await
            .expect("probe")
    );
    td.exec(&format!(
        "INSERT INTO {table} VALUES ('kept', timezone('utc', CURRENT_TIMESTAMP), timezone('utc', CURRENT_TIMESTAMP), 'java')"
    ))
    .await;
    let out = migrate("migrate (ShedLock table present)").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(td.scalar(&format!("SELECT COUNT(*) FROM {table}")).await, 1);
    td.exec(&format!("DROP TABLE {table}")).await;
}

/// The binary refuses `mysql-get-lock` on PostgreSQL with exit 2, naming `lease.backend`.
#[test]
fn check_config_refuses_get_lock_off_mysql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = relay_command(dir.path());
    cmd.env("OUTBOX_RELAY__DATABASE__URL", "postgres://u@127.0.0.1:9/db")
        .env("OUTBOX_RELAY__LEASE__BACKEND", "mysql-get-lock")
        .env("OUTBOX_RELAY__LEASE__NAME", "poller")
        .arg("check-config");
    let out = output_within("check-config", &mut cmd, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("lease.backend") && err.contains("MySQL"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Validation.

fn load(
    toml: &str,
    url: &str,
) -> Result<outbox_relay::config::Settings, outbox_relay::config::ConfigError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, toml).expect("write");
    let env = std::collections::BTreeMap::from([(
        "OUTBOX_RELAY__DATABASE__URL".to_string(),
        url.to_string(),
    )]);
    outbox_relay::config::Settings::load_with_env(Some(&path), Some(env))
}

fn refused(toml: &str, url: &str, key: &str, needle: &str) {
    match load(toml, url) {
        Ok(_) => panic!("{toml:?} on {url} must be refused"),
        Err(e) => {
            assert_eq!(e.key, key, "{e}");
            assert!(e.to_string().contains(needle), "{e} should say {needle:?}");
        }
    }
}

#[test]
fn java_lock_configs_are_validated_naming_the_key() {
    let pg = "postgres://u@h/db";
    let my = "mysql://u@h/db";
    let lite = "sqlite://x.db";
    for backend in ["redisson", "shedlock", "mysql-get-lock"] {
        let t = format!("[lease]\nbackend = \"{backend}\"\nredis_url = \"redis://h:6379\"\n");
        refused(&t, my, "lease.name", "Java poller");
    }
    let get_lock = "[lease]\nbackend = \"mysql-get-lock\"\nname = \"outbox-poller\"\n";
    refused(get_lock, pg, "lease.backend", "MySQL or MariaDB");
    refused(get_lock, lite, "lease.backend", "MySQL or MariaDB");
    assert!(load(get_lock, my).is_ok());
    assert!(load(get_lock, "mariadb://u@h/db").is_ok());
    let long = "x".repeat(65);
    for backend in ["mysql-get-lock", "shedlock"] {
        let t = format!("[lease]\nbackend = \"{backend}\"\nname = \"{long}\"\n");
        refused(&t, my, "lease.name", "at most 64");
        let t = format!("[lease]\nbackend = \"{backend}\"\nname = \" padded\"\n");
        refused(&t, my, "lease.name", "spaces");
        let t = format!(
            "[lease]\nbackend = \"{backend}\"\nname = \"{}\"\n",
            "y".repeat(64)
        );
        assert!(load(&t, my).is_ok(), "64 characters are allowed");
    }
    let t =
        "[lease]\nbackend = \"shedlock\"\nname = \"job\"\nshedlock_table = \"shed lock; DROP\"\n";
    refused(t, pg, "lease.shedlock_table", "identifier");
    for zone in ["Asia/Seoul", "+9", "+09", "09:00", "+15:00", "+09:60"] {
        let t = format!(
            "[lease]\nbackend = \"shedlock\"\nname = \"job\"\nshedlock_time_zone = \"{zone}\"\n"
        );
        refused(&t, pg, "lease.shedlock_time_zone", "fixed offset");
    }
    for (zone, minutes) in [("UTC", 0), ("Z", 0), ("+09:00", 540), ("-05:30", -330)] {
        let t = format!(
            "[lease]\nbackend = \"shedlock\"\nname = \"job\"\nshedlock_time_zone = \"{zone}\"\n"
        );
        let s = load(&t, pg).expect("a zone that parses");
        assert_eq!(
            s.lease.shedlock_utc_offset_minutes(),
            Some(minutes),
            "{zone}"
        );
    }
    let t = "[lease]\nbackend = \"shedlock\"\nname = \"job\"\nshedlock_table = \"app.shedlock\"\n";
    assert!(load(t, pg).is_ok(), "schema.table is allowed");
    refused(
        "[lease]\nbackend = \"redisson\"\nname = \"job\"\n",
        pg,
        "lease.redis_url",
        "redisson",
    );
    let s = load(
        "[lease]\nbackend = \"redisson\"\nredis_url = \"redis://h:6379\"\nname = \"lock:outbox\"\n",
        pg,
    )
    .expect("redisson loads");
    assert_eq!(s.lease.name, "lock:outbox");
    assert_eq!(
        load("[lease]\nbackend = \"shedlock\"\nname = \"job\"\n", pg)
            .expect("defaults")
            .lease
            .shedlock_table,
        "shedlock"
    );
}
