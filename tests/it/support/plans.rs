//! Query plans, for the tests that check how a statement reads the table.

use outbox_relay::store::SqlStore;
use sqlx::Row;

/// SQLite's plan of `q` on `store`'s pool: `EXPLAIN QUERY PLAN`'s details, one a line.
pub async fn sqlite_plan(store: &SqlStore, q: &str) -> Vec<String> {
    sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {q}")))
        .fetch_all(store.pool())
        .await
        .expect("query plan")
        .iter()
        .map(|r| r.try_get::<String, _>(3).unwrap_or_default())
        .collect()
}
