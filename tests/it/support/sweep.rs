//! Clears what earlier runs of the suite left on the shared servers.
//!
//! Every test makes its own tables ([`super::unique_table`]: `{prefix}_{pid}_{nanos}_{n}`), and
//! many leave them behind (a test that fails never reaches its clean-up, and some keep them to
//! be read after a failure). On a long-lived CI machine they piled up to over a thousand tables
//! per database, enough to slow the catalogue and the lease tests' timings. So the first test of
//! a run to open PostgreSQL or MariaDB drops every table, function, enum type and role whose
//! name carries the process id of a suite run that has ended. A run still going (another
//! checkout's suite on the same servers) keeps its tables: its process is alive.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::{AnyPool, Row};

use super::Db;

/// What a name of one earlier test holds, with the statement that drops it.
const POSTGRES: &[(&str, &str)] = &[
    (
        "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()",
        "DROP TABLE IF EXISTS \"{}\" CASCADE",
    ),
    (
        "SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = current_schema()",
        "DROP FUNCTION IF EXISTS \"{}\" CASCADE",
    ),
    (
        "SELECT t.typname::text FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace \
         WHERE n.nspname = current_schema() AND t.typtype = 'e'",
        "DROP TYPE IF EXISTS \"{}\" CASCADE",
    ),
    (
        "SELECT rolname::text FROM pg_roles",
        "DROP ROLE IF EXISTS \"{}\"",
    ),
];

const MYSQL: &[(&str, &str)] = &[(
    "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
     WHERE table_schema = DATABASE()",
    "DROP TABLE IF EXISTS `{}`",
)];

/// Sweeps `db`'s server once per run (the first caller does it; the rest go on at once).
pub async fn once(db: Db, pool: &AnyPool) {
    static DONE: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    let (done, kinds) = match db {
        Db::Postgres => (&DONE[0], POSTGRES),
        Db::MySql => (&DONE[1], MYSQL),
        Db::Sqlite => return,
    };
    if done.swap(true, Ordering::SeqCst) || !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let Ok(mut conn) = pool.acquire().await else {
        return;
    };
    if db == Db::MySql {
        let _ = sqlx::query("SET FOREIGN_KEY_CHECKS = 0")
            .execute(&mut *conn)
            .await;
    }
    let mut dropped = 0;
    for (list, drop) in kinds {
        let names: Vec<String> = match sqlx::query(*list).fetch_all(&mut *conn).await {
            Ok(rows) => rows.iter().filter_map(|r| r.try_get(0).ok()).collect(),
            Err(_) => continue,
        };
        for name in names.iter().filter(|n| of_ended_run(n)) {
            let sql = drop.replace("{}", name);
            if sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut *conn)
                .await
                .is_ok()
            {
                dropped += 1;
            }
        }
    }
    if db == Db::MySql {
        let _ = sqlx::query("SET FOREIGN_KEY_CHECKS = 1")
            .execute(&mut *conn)
            .await;
    }
    if dropped > 0 {
        eprintln!(
            "{}: dropped {dropped} objects left by ended suite runs",
            db.name()
        );
    }
}

/// True when `name` was made by [`super::unique_table`] in a process that has ended: the last
/// three all-digit `_` parts are pid, nanoseconds and counter, and `/proc/<pid>` is gone.
fn of_ended_run(name: &str) -> bool {
    let parts: Vec<&str> = name.split('_').collect();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(end) = (2..parts.len())
        .rev()
        .find(|&i| digits(parts[i]) && digits(parts[i - 1]) && digits(parts[i - 2]))
    else {
        return false;
    };
    match parts[end - 2].parse::<u32>() {
        Ok(pid) if pid > 1 => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        _ => false,
    }
}

#[test]
fn names_of_ended_and_running_suites() {
    let own = super::unique_table("lease_x");
    assert!(!of_ended_run(&own), "{own}: this run is alive");
    assert!(!of_ended_run(&format!("sl_{own}_hold")));
    // pid_max is at most 4,194,304: this pid is never a process.
    assert!(of_ended_run("lease_x_4194305_123_0"));
    assert!(of_ended_run("sl_claim_4194305_99999_12_state"));
    assert!(!of_ended_run("outbox"));
    assert!(!of_ended_run("outbox_relay_lease"));
    assert!(!of_ended_run("orders_2024_01"));
}
