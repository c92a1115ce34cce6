//! Tests of one database's own claim and write paths: how MySQL/MariaDB claims walk and lock
//! its indexes, PostgreSQL's plans and HOT updates, SQLite's single writer.

use super::*;

mod mysql;
mod postgres;
mod sqlite;

/// Finished rows before the due ones: half of the [`FINISHED`] rows have no ordering key, half
/// are under key `k`; then `due` rows without a key and one under `k`, and fresh statistics.
async fn finished_then_due(td: &TestDb, due: usize) {
    td.insert("hook", (0..FINISHED / 2).map(|_| (None, "{}".to_string())))
        .await;
    td.insert(
        "hook",
        (0..FINISHED / 2).map(|_| (Some("k".to_string()), "{}".to_string())),
    )
    .await;
    td.exec("UPDATE {t} SET status = 'SUCCESS'").await;
    td.insert("hook", (0..due).map(|_| (None, "{}".to_string())))
        .await;
    td.insert("hook", [(Some("k".to_string()), "{}".to_string())])
        .await;
    let analyze = match td.db {
        Db::MySql => "ANALYZE TABLE {t}",
        _ => "ANALYZE {t}",
    };
    td.exec(analyze).await;
}

/// See [`finished_then_due`].
const FINISHED: usize = 10_000;

/// A claim's read, in `pg_prepared_statements` (`LIKE`).
const READS: &str = "SELECT * FROM (SELECT CAST(0 AS BIGINT) AS part%";
/// A claim of chosen rows, in `pg_prepared_statements` (`LIKE`).
const CLAIMS: &str = "WITH chosen %SET claimed_by%";
