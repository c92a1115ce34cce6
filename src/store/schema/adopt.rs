//! `migrate --adopt` on an existing table (docs/adopting-a-table.md): the statements that
//! add what the relay needs, planned from the live table.
//!
//! Guarantees: `migrate --adopt` only adds the relay's bookkeeping columns that are missing
//! (all NULLable or with a constant default, so existing rows and the application's INSERTs
//! are unaffected), what claims need (indexes, and columns they index where the database has
//! no partial indexes), and the NOTIFY trigger when `table.notify_trigger` asks. It never
//! drops, rewrites or changes an existing column or row. It is idempotent: the plan is
//! computed from the live table, so a second run plans nothing.

use sqlx::{Executor, Row};

use super::SchemaSql;
use crate::store::db::Db;
use crate::store::sql::ident::bare;

/// A bookkeeping column `migrate --adopt` adds: (name, type).
pub type Bookkeeping = (String, &'static str);

/// The table's columns as (lower-case name, type), or `None` when there is no such table.
pub async fn live_columns(
    db: &Db,
    sql: &dyn SchemaSql,
) -> anyhow::Result<Option<Vec<(String, String)>>> {
    let rows = db
        .query(sql.live_columns(db.table()))
        .fetch_all(db.pool())
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let name: String = r.try_get(0)?;
        let ty: String = r.try_get::<Option<String>, _>(1)?.unwrap_or_default();
        out.push((name.to_ascii_lowercase(), ty));
    }
    Ok(Some(out))
}

/// Whether an index (or, `trigger`, a trigger) of this name exists.
pub async fn exists(
    db: &Db,
    sql: &dyn SchemaSql,
    name: &str,
    trigger: bool,
) -> anyhow::Result<bool> {
    let n: i64 = db
        .query(sql.object_exists(name, trigger))
        .fetch_one(db.pool())
        .await?
        .try_get(0)?;
    Ok(n > 0)
}

/// The bookkeeping columns the relay needs on this table.
pub fn bookkeeping(db: &Db, sql: &dyn SchemaSql) -> Vec<Bookkeeping> {
    let c = db.cols();
    let ty = sql.column_types();
    let mut out: Vec<Bookkeeping> = vec![
        ("claimed_by".into(), ty.claimer),
        ("claim_token".into(), ty.token),
        ("claimed_until".into(), ty.time),
    ];
    let t = &c.owned;
    if t.sent_at {
        out.push((c.sent_at.clone(), ty.time));
    }
    if t.attempts {
        out.push((c.attempts.clone(), ty.attempts));
    }
    if t.next_attempt_at {
        out.push((c.next_attempt_at.clone(), ty.time));
    }
    out
}

/// The statements `migrate --adopt` would run now, in order (empty: nothing to do).
pub async fn plan(db: &Db, sql: &dyn SchemaSql) -> anyhow::Result<Vec<String>> {
    let t = db.table();
    anyhow::ensure!(
        db.cols().mapped,
        "`migrate --adopt` is for an existing table mapped by [table] \
         (docs/adopting-a-table.md); the relay's own table is created by plain `migrate`"
    );
    let Some(live) = live_columns(db, sql).await? else {
        anyhow::bail!("table {t} does not exist (database.table)");
    };
    let has = |name: &str| live.iter().any(|(n, _)| n.eq_ignore_ascii_case(bare(name)));
    let support = sql.claim_support(db);
    let mut adds: Vec<String> = bookkeeping(db, sql)
        .into_iter()
        .filter(|(name, _)| !has(name))
        .map(|(name, ty)| format!("ADD COLUMN {name} {ty}"))
        .collect();
    adds.extend(
        support
            .columns
            .into_iter()
            .filter(|(name, _)| !has(name))
            .map(|(_, ddl)| ddl),
    );
    let mut plan = sql.alter(t, &adds);
    for (name, ddl) in support.indexes {
        if !exists(db, sql, &name, false).await? {
            plan.push(ddl);
        }
    }
    let trigger = sql.notify_trigger(t);
    if db.cols().notify
        && !trigger.is_empty()
        && !exists(db, sql, &format!("{t}_notify"), true).await?
    {
        plan.extend(trigger);
    }
    Ok(plan)
}

/// Runs `plan` (from [`plan`]), then creates the lease table.
pub async fn run(db: &Db, sql: &dyn SchemaSql, plan: &[String]) -> anyhow::Result<()> {
    for statement in plan {
        db.count_statement();
        db.pool()
            .execute(sqlx::AssertSqlSafe(statement.clone()))
            .await
            .map_err(|e| anyhow::anyhow!("{statement}: {e}"))?;
    }
    super::migrate::lease_only(db, sql).await
}
