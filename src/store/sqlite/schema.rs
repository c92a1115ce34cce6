//! SQLite's schema: the relay's own table and its migrations, the lease table, and what
//! `migrate --adopt` adds to a mapped table. SQLite has one writer, so migrations need no
//! lock of their own.

use sqlx::Executor;

use super::Sqlite;
use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::schema;
use crate::store::schema::{
    ClaimSupport, ColumnTypes, Conn, Done, SchemaSql, channel_due_index, failed_index,
    partial_indexes,
};
use crate::store::sql::Sql;

impl SchemaSql for Sqlite {
    fn lock<'a>(&'a self, _conn: &'a mut Conn) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn unlock<'a>(&'a self, _conn: &'a mut Conn, _ok: bool) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn steps(&self, t: &str, version: i64) -> Vec<String> {
        match version {
            1 => schema_v1(t),
            2 => vec![channel_due_index(t)],
            6 => vec![failed_index(t)],
            // The unfinished rows by their next attempt, so that an idle read tells in one
            // seek whether any is due, instead of reading every waiting row.
            10 => vec![next_attempt_index(t)],
            // The unfinished keyed rows by key: a claim reads the first rows of a freed key,
            // and checks whether a row is the first of its key, without walking the key's
            // finished rows (version 1's index of keys holds them all).
            11 => vec![format!(
                "CREATE INDEX IF NOT EXISTS {t}_open_key_idx ON {t} (ordering_key, id)
                 WHERE ordering_key IS NOT NULL AND status IN ('PENDING', 'RETRY')"
            )],
            _ => Vec::new(),
        }
    }

    fn code_step<'a>(&'a self, conn: &'a mut Conn, table: &'a str, version: i64) -> Done<'a> {
        Box::pin(async move {
            match version {
                // The writer's W3C trace context (docs/tracing.md). SQLite has no `ADD COLUMN
                // IF NOT EXISTS`, and its migrations take no lock: a column another instance
                // (or an interrupted run) added is left as it is.
                12 => {
                    for column in ["traceparent", "tracestate"] {
                        let n: i64 = sqlx::query_scalar(
                            "SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?",
                        )
                        .bind(table.to_string())
                        .bind(column)
                        .fetch_one(&mut **conn)
                        .await?;
                        if n == 0 {
                            let add = format!("ALTER TABLE {table} ADD COLUMN {column} TEXT NULL");
                            conn.execute(sqlx::AssertSqlSafe(add)).await?;
                        }
                    }
                    Ok(())
                }
                _ => Ok(()),
            }
        })
    }

    fn lease_table(&self) -> String {
        schema::lease_table("TEXT", "TEXT", "TEXT", "")
    }

    /// SQLite's names are not case-sensitive.
    fn table_exists(&self, table: &str) -> Sql {
        let mut q =
            Sql::new("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = (");
        q.text(table).push(") COLLATE NOCASE");
        q
    }

    /// `pragma_table_xinfo` also lists generated columns. An `INTEGER PRIMARY KEY` is the
    /// rowid: never NULL, though not declared NOT NULL.
    fn live_columns(&self, table: &str) -> Sql {
        let mut q = Sql::new(
            "SELECT name, lower(type), type, NULL, \
             CASE WHEN \"notnull\" OR (pk > 0 AND lower(type) = 'integer') THEN 'NO' \
             ELSE 'YES' END, NULL, NULL FROM pragma_table_xinfo((",
        );
        q.text(table).push("))");
        q
    }

    fn table_names(&self) -> Sql {
        Sql::new("SELECT name FROM sqlite_master WHERE type = 'table'")
    }

    /// Names are not case-sensitive here (ASCII).
    fn object_exists(&self, table: &str, name: &str, trigger: bool) -> Sql {
        let mut q = Sql::new(match trigger {
            true => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND name = (",
            false => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = (",
        });
        q.text(name)
            .push(") COLLATE NOCASE AND tbl_name = (")
            .text(table)
            .push(") COLLATE NOCASE");
        q
    }

    fn typed_columns(&self) -> bool {
        false
    }

    fn column_types(&self) -> ColumnTypes {
        ColumnTypes {
            claimer: "TEXT NULL",
            token: "TEXT NULL",
            time: "TEXT NULL",
            attempts: "INTEGER NOT NULL DEFAULT 0",
        }
    }

    fn claim_support(&self, db: &Db) -> ClaimSupport {
        partial_indexes(db)
    }

    /// SQLite adds one column per statement.
    fn alter(&self, table: &str, adds: &[String]) -> Vec<String> {
        adds.iter()
            .map(|a| format!("ALTER TABLE {table} {a}"))
            .collect()
    }
}

/// Schema version 1. AUTOINCREMENT: ids are idempotency keys and must never be reused after
/// a purge.
fn schema_v1(t: &str) -> Vec<String> {
    let now = "(strftime('%Y-%m-%d %H:%M:%f','now'))";
    let id = "INTEGER PRIMARY KEY AUTOINCREMENT";
    let table = schema::table_v1(t, id, "TEXT", "INTEGER", "TEXT", now);
    std::iter::once(table)
        .chain(schema::indexes_v1(t, "WHERE ordering_key IS NOT NULL"))
        .chain([Sqlite.lease_table()])
        .collect()
}

/// Schema version 10: the unfinished rows by `next_attempt_at`, so that an idle read can tell
/// in one index seek whether any of them is due (see `claim.rs`).
fn next_attempt_index(t: &str) -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS {t}_next_attempt_idx ON {t} (next_attempt_at)
         WHERE status IN ('PENDING', 'RETRY')"
    )
}
