//! Versioned, idempotent schema migrations of the relay's own table, keyed by table name in
//! `outbox_relay_schema`.
//!
//! Several instances may start (and migrate) at once: each database's migration lock makes
//! them take turns ([`SchemaSql::lock`]). Every step is `IF NOT EXISTS` or checks the live
//! table, so a step interrupted half-way (where DDL is not transactional) is simply run again.

use sqlx::{Executor, Row};

use super::{Conn, SchemaSql};
use crate::store::db::Db;
use crate::store::sql::Sql;

/// The newest schema version this build knows.
pub const LATEST: i64 = 12;

/// Beside a mapped table (docs/adopting-a-table.md): only the lease table. The table itself
/// is the application's; `migrate --adopt` adds the relay's columns to it, on request.
pub async fn lease_only(db: &Db, sql: &dyn SchemaSql) -> anyhow::Result<()> {
    db.sql(&sql.lease_table()).execute(db.pool()).await?;
    Ok(())
}

/// Brings the table to [`LATEST`]. Returns the versions applied.
pub async fn run(db: &Db, sql: &dyn SchemaSql) -> anyhow::Result<Vec<i64>> {
    let mut conn = db.pool().acquire().await?;
    sql.lock(&mut conn).await?;
    let result = apply(db, sql, &mut conn).await;
    let unlocked = sql.unlock(&mut conn, result.is_ok()).await;
    let applied = result?;
    unlocked?;
    Ok(applied)
}

async fn apply(db: &Db, sql: &dyn SchemaSql, conn: &mut Conn) -> anyhow::Result<Vec<i64>> {
    let table = db.table();
    conn.execute(
        "CREATE TABLE IF NOT EXISTS outbox_relay_schema (
            target VARCHAR(191) NOT NULL PRIMARY KEY,
            version BIGINT NOT NULL
        )",
    )
    .await?;
    let current = recorded_version(db, sql, conn).await?;
    let mut applied = Vec::new();
    for version in (current + 1)..=LATEST {
        for step in sql.steps(table, version) {
            conn.execute(sqlx::AssertSqlSafe(step)).await?;
        }
        sql.code_step(conn, table, version).await?;
        let q = if current == 0 && version == 1 {
            let mut q = Sql::new("INSERT INTO outbox_relay_schema (target, version) VALUES (");
            q.text(table).push(", ").int(version).push(")");
            q
        } else {
            let mut q = Sql::new("UPDATE outbox_relay_schema SET version = ");
            q.int(version).push(" WHERE target = ").text(table);
            q
        };
        q.finalized(db.syntax()).execute(&mut **conn).await?;
        applied.push(version);
    }
    Ok(applied)
}

/// The table's recorded schema version (0: none, or a table dropped by hand).
async fn recorded_version(db: &Db, sql: &dyn SchemaSql, conn: &mut Conn) -> anyhow::Result<i64> {
    let table = db.table();
    let mut q = Sql::new("SELECT version FROM outbox_relay_schema WHERE target = ");
    q.text(table);
    let current: i64 = q
        .finalized(db.syntax())
        .fetch_optional(&mut **conn)
        .await?
        .map(|r| r.try_get::<i64, _>(0))
        .transpose()?
        .unwrap_or(0);
    if current == 0 {
        return Ok(0);
    }
    let exists: i64 = sql
        .table_exists(table)
        .finalized(db.syntax())
        .fetch_one(&mut **conn)
        .await?
        .try_get(0)?;
    if exists > 0 {
        return Ok(current);
    }
    // A table dropped by hand (a developer starting over) leaves its version behind, and
    // the relay would call a missing table up to date and fail every claim: build it again.
    tracing::warn!(
        table,
        recorded_version = current,
        "the table is missing although its schema version is recorded; creating it"
    );
    let mut q = Sql::new("DELETE FROM outbox_relay_schema WHERE target = ");
    q.text(table);
    q.finalized(db.syntax()).execute(&mut **conn).await?;
    Ok(0)
}
