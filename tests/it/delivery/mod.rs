//! End-to-end delivery suite (issue 2): the real `outbox-relay` binary, run with `run` against
//! a real database (PostgreSQL, MariaDB, SQLite) and a real loopback webhook receiver.
//!
//! Each test writes its own TOML config into its temporary directory and points the binary at
//! its own table and lease name through `OUTBOX_RELAY__...` variables, so tests run in
//! parallel. Every process is killed when its guard drops (its log is printed if the test
//! failed), and every wait has a timeout.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::config::Config;
use crate::support::process::*;
use crate::support::receiver::{Receiver, Reply};
use crate::support::*;
use sqlx::Row;

mod lifecycle;
mod outcomes;
mod pickup;

/// The signing secret every test's sink uses (Standard Webhooks form).
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// The config every test starts from: a signed webhook, three attempts 1-2 s apart.
fn base(rx: &Receiver) -> Config {
    Config::webhook(&rx.url())
        .shutdown_timeout(Duration::from_secs(10))
        .retry(Duration::from_secs(1), Duration::from_secs(2), 3)
        .hook(|s| s.secret(SECRET))
}

/// What a row looks like in the table.
#[derive(Debug, Clone, PartialEq)]
struct RowState {
    status: String,
    attempts: i64,
    last_error: Option<String>,
    claim_token: Option<String>,
}

async fn row_state(td: &TestDb, id: i64) -> RowState {
    let sql = match td.db {
        Db::Postgres => format!(
            "SELECT status, attempts, last_error, claim_token FROM {} WHERE id = $1",
            td.table
        ),
        _ => format!(
            "SELECT status, attempts, last_error, claim_token FROM {} WHERE id = ?",
            td.table
        ),
    };
    let r = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_one(td.store.pool())
        .await
        .expect("row state");
    RowState {
        status: r.try_get(0).expect("status"),
        attempts: r.try_get(1).expect("attempts"),
        last_error: r.try_get(2).expect("last_error"),
        claim_token: r.try_get(3).expect("claim_token"),
    }
}

/// Every row's id and payload (parsed), as stored.
async fn payloads(td: &TestDb) -> HashMap<i64, serde_json::Value> {
    let payload = match td.db {
        Db::Postgres => "payload::text",
        Db::MySql => "CAST(payload AS CHAR)",
        Db::Sqlite => "payload",
    };
    td.fetch(&format!("SELECT id, {payload} FROM {{t}}"))
        .await
        .iter()
        .map(|r| {
            let id: i64 = r.try_get(0).expect("id");
            let text: String = r.try_get(1).expect("payload");
            (
                id,
                serde_json::from_str(&text).expect("stored payload is JSON"),
            )
        })
        .collect()
}

/// Ids of the rows with `status`.
async fn ids_with_status(td: &TestDb, status: &str) -> HashSet<i64> {
    td.fetch(&format!("SELECT id FROM {{t}} WHERE status = '{status}'"))
        .await
        .iter()
        .map(|r| r.try_get::<i64, _>(0).expect("id"))
        .collect()
}

async fn open(db: Db, prefix: &str) -> Option<TestDb> {
    TestDb::open(db, prefix).await
}
