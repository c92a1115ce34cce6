//! The SQL store against real PostgreSQL, MariaDB and SQLite: migrations, claims (G1, G2),
//! fencing by the lease epoch (G2), result writes guarded by the claim token (G2), ordering
//! keys, concurrent claimers, and the `status` / `failed` views; one module each, over the
//! helpers here.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::wait::*;
use crate::support::*;
use outbox_relay::store::{
    Budgets, ClaimRequest, ClaimedRow, Completion, Fence, LeaseTable, MAX_ERROR_LEN, NewRow, Probe,
    Queue, Resolution, SqlStore, Tail,
};
use sqlx::Row;

mod backlog;
mod chains;
mod claims;
mod engines;
mod idle;
mod keys;
mod migrate;
mod results;
mod views;
mod walks;
mod windows;

fn token() -> Arc<str> {
    outbox_relay::random_token().into()
}

fn request(limit: u32, ttl: Duration, claimer: &str, fence: Option<Fence>) -> ClaimRequest {
    ClaimRequest {
        tails: Vec::new(),
        trace: false,
        limit,
        ttl,
        claimer: claimer.to_string(),
        token: token(),
        fence,
        alone: false,
        exclude_channels: Vec::new(),
        max_payload_bytes: None,
        budgets: None,
        newest: false,
    }
}

/// Claims with a fresh token; returns the request (for its token) and the rows.
async fn claim(
    store: &dyn Queue,
    limit: u32,
    ttl: Duration,
    claimer: &str,
    fence: Option<Fence>,
) -> (ClaimRequest, Vec<ClaimedRow>) {
    let req = request(limit, ttl, claimer, fence);
    let rows = bounded("claim", store.claim(&req)).await;
    (req, rows)
}

/// A claim-mode request for up to `n` rows of channel `hook`.
fn hook_request(n: u32, claimer: &str) -> ClaimRequest {
    let mut req = request(n, LONG, claimer, None);
    req.budgets = Some(Budgets {
        channels: vec![("hook".into(), n)],
        others: None,
        starts: None,
    });
    req
}

fn ids(rows: &[ClaimedRow]) -> Vec<i64> {
    rows.iter().map(|r| r.delivery.id).collect()
}

/// True when row `id` meets the SQL condition `cond`.
async fn row_is(td: &TestDb, id: i64, cond: &str) -> bool {
    td.scalar(&format!(
        "SELECT COUNT(*) FROM {{t}} WHERE id = {id} AND ({cond})"
    ))
    .await
        == 1
}

async fn attempts(td: &TestDb, id: i64) -> i64 {
    td.scalar(&format!("SELECT attempts FROM {{t}} WHERE id = {id}"))
        .await
}

async fn text_column(td: &TestDb, id: i64, col: &str) -> Option<String> {
    let sql = format!("SELECT {col} FROM {} WHERE id = {id}", td.table);
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(td.store.pool())
        .await
        .expect("select text column");
    row.try_get::<Option<String>, _>(0).expect("text")
}

fn now_sql(td: &TestDb) -> &'static str {
    td.store.now_sql()
}

fn completion(req: &ClaimRequest, id: i64, resolution: Resolution) -> Completion {
    Completion {
        id,
        token: req.token.clone(),
        resolution,
    }
}

async fn complete(store: &dyn Queue, done: &[Completion]) -> u64 {
    bounded("complete", async { Ok(store.complete(done).await?) }).await
}

const LONG: Duration = Duration::from_secs(60);
