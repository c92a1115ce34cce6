//! Claim mode (issue 5) with real processes: several `outbox-relay run` instances in
//! `relay.mode = "claim"` on one table (PostgreSQL, MariaDB, SQLite), delivering to a loopback
//! webhook receiver. Every instance's sink sends an `x-relay` header naming it, so the receiver
//! knows who sent each request and when it arrived and was answered.
//!
//! 1. three instances deliver 5,000 rows (SQLite too: three processes on one WAL file), each
//!    received exactly once, every instance a share; `claimed_total` agrees;
//! 2. kill -9 one instance mid-run: the rows it had claimed are delivered by the others once
//!    their claims expire (not before), every row ends SUCCESS, and only rows whose request was
//!    already on the wire at the kill arrive twice (PostgreSQL, MariaDB);
//! 3. per-key ordering: 50 keys x 40 rows inserted interleaved, three instances, scripted 500s
//!    on about 10% of first attempts: each key's requests are one at a time, in id order, and
//!    never start before the previous row of the key was delivered; a key waiting for a retry
//!    holds back only itself;
//! 4. `outbox-relay status` while three instances hold claims lists the live claims per
//!    instance, matching the table;
//! 5. two instances against a slow receiver with a long poll each send about half: the one a
//!    claim behind claims the rows behind the other's at once instead of waiting a poll.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::config::Config;
use crate::support::process::*;
use crate::support::receiver::{Received, Receiver, Reply, sender};
use crate::support::*;
use sqlx::Row;

mod crashes;
mod ordering;
mod sharing;

/// The config every instance starts from: claim mode, and an `x-relay` header naming the
/// instance on its requests.
fn base(rx: &Receiver, instance: &str) -> Config {
    Config::webhook(&rx.url())
        .claim_mode()
        .shutdown_timeout(Duration::from_secs(5))
        .hook(|s| s.header("x-relay", instance))
}

/// Every row's id and ordering key, in id order.
async fn ids_and_keys(td: &TestDb) -> Vec<(i64, Option<String>)> {
    let sql = format!("SELECT id, ordering_key FROM {} ORDER BY id", td.table);
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("ids")
        .iter()
        .map(|r| (r.try_get(0).expect("id"), r.try_get(1).expect("key")))
        .collect()
}

/// Rows under a live claim of `instance`, with the milliseconds their claim has left.
async fn live_claims_of(td: &TestDb, instance: &str) -> Vec<(i64, i64)> {
    let remaining = match td.db {
        Db::Postgres => "(EXTRACT(EPOCH FROM (claimed_until - now())) * 1000)::bigint",
        Db::MySql => "(TIMESTAMPDIFF(MICROSECOND, NOW(6), claimed_until) DIV 1000)",
        Db::Sqlite => "CAST((julianday(claimed_until) - julianday('now')) * 86400000 AS INTEGER)",
    };
    let sql = format!(
        "SELECT id, {remaining} FROM {} WHERE claimed_by = '{instance}'
         AND claim_token IS NOT NULL AND status IN ('PENDING', 'RETRY') ORDER BY id",
        td.table
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("live claims")
        .iter()
        .map(|r| (r.try_get(0).expect("id"), r.try_get(1).expect("remaining")))
        .collect()
}

/// Live claims per instance, as the table has them.
async fn claims_per_instance(td: &TestDb) -> BTreeMap<String, i64> {
    let sql = format!(
        "SELECT claimed_by, COUNT(*) FROM {} WHERE claim_token IS NOT NULL
         AND status IN ('PENDING', 'RETRY') GROUP BY claimed_by",
        td.table
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("claims")
        .iter()
        .map(|r| (r.try_get(0).expect("by"), r.try_get(1).expect("count")))
        .collect()
}

/// Requests per sending instance.
fn shares(reqs: &[Received]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in reqs {
        *out.entry(sender(r).to_string()).or_insert(0) += 1;
    }
    out
}

/// Ids received more than once, with their counts.
fn duplicates(rx: &Receiver) -> BTreeMap<i64, usize> {
    rx.count_by_id()
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect()
}
