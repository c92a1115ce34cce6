//! `migrate --adopt` on an existing table (docs/adopting-a-table.md): the statements that
//! add what the relay needs, planned from the live table, and running them all or none.
//!
//! Guarantees:
//! - it only adds the relay's bookkeeping columns that are missing (all NULLable or with a
//!   constant default, so existing rows and the application's INSERTs are unaffected), what
//!   claims need (indexes, and columns they index where the database has no partial
//!   indexes), the NOTIFY trigger when `table.notify_trigger` asks, and the lease table. It
//!   never drops, rewrites or changes an existing column or row;
//! - it is idempotent: the plan is computed from the live table, so a second run plans
//!   nothing;
//! - it checks first: a mapping the live check refuses (a missing column, a status value
//!   the column cannot hold) changes nothing, and the problems are listed;
//! - all or nothing: where DDL is transactional (PostgreSQL, SQLite) the plan runs in one
//!   transaction; elsewhere (MySQL/MariaDB) each step that ran is undone by its own statement
//!   when a later one fails. Either way the error names the statement that failed;
//! - planning changes nothing (`--dry-run` prints the plan and stops).

use sqlx::{Acquire, Executor};

use super::check::check_table;
use super::live::{self, bookkeeping, exists, find};
use super::{SchemaSql, migrate};
use crate::store::db::Db;

/// One statement of the plan, and the statement that undoes it where DDL is not
/// transactional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub sql: String,
    pub undo: Option<String>,
}

/// What `migrate --adopt` would run now, in order (then it creates the lease table).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
}

impl Plan {
    /// The statements, in order.
    pub fn statements(&self) -> impl Iterator<Item = &str> {
        self.steps.iter().map(|s| s.sql.as_str())
    }

    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// How many statements.
    pub fn len(&self) -> usize {
        self.steps.len()
    }
}

/// The plan for the table as it is now (empty: nothing to do). Refuses, changing nothing,
/// when the live check finds the mapping itself wrong.
pub async fn plan(db: &Db, sql: &dyn SchemaSql) -> anyhow::Result<Plan> {
    let t = db.table();
    anyhow::ensure!(
        db.cols().mapped,
        "`migrate --adopt` is for an existing table mapped by [table] \
         (docs/adopting-a-table.md); the relay's own table is created by plain `migrate`"
    );
    let wrong: Vec<String> = check_table(db, sql)
        .await?
        .into_iter()
        .filter(|p| !p.adopt)
        .map(|p| format!("  {p}"))
        .collect();
    if !wrong.is_empty() {
        anyhow::bail!(
            "table {} does not match the [table] mapping; nothing was changed:\n{}",
            db.table_name(),
            wrong.join("\n")
        );
    }
    let Some(live) = live::columns(db, sql).await? else {
        anyhow::bail!("table {} does not exist (database.table)", db.table_name());
    };
    let has = |name: &str| find(sql, &live, name).is_some();
    let support = sql.claim_support(db);
    let mut added: Vec<String> = Vec::new();
    let mut adds: Vec<String> = Vec::new();
    for (name, ty) in bookkeeping(db, sql) {
        if !has(&name) {
            adds.push(format!("ADD COLUMN {name} {ty}"));
            added.push(name);
        }
    }
    for (name, ddl) in support.columns {
        if !has(&name) {
            adds.push(ddl);
            added.push(name);
        }
    }
    let alters = sql.alter(t, &adds);
    let mut steps: Vec<Step> = match alters.len() {
        // One statement per column (SQLite) or one for all.
        n if n == added.len() => alters
            .into_iter()
            .zip(&added)
            .map(|(sql, c)| Step {
                sql,
                undo: Some(format!("ALTER TABLE {t} DROP COLUMN {c}")),
            })
            .collect(),
        _ => {
            let drops: Vec<String> = added.iter().map(|c| format!("DROP COLUMN {c}")).collect();
            alters
                .into_iter()
                .map(|sql| Step {
                    sql,
                    undo: Some(format!("ALTER TABLE {t} {}", drops.join(", "))),
                })
                .collect()
        }
    };
    for (name, index, ddl) in support.indexes {
        if !exists(db, sql, &name, false).await? {
            let undo = Some(sql.drop_index(t, &index));
            steps.push(Step { sql: ddl, undo });
        }
    }
    if db.cols().notify
        && let Some((name, trigger)) = sql.notify_trigger(db)
        && !exists(db, sql, &name, true).await?
    {
        steps.extend(trigger.into_iter().map(|sql| Step { sql, undo: None }));
    }
    Ok(Plan { steps })
}

/// Runs `plan` (from [`plan`]) and creates the lease table, all or nothing (see the module
/// doc).
pub async fn run(db: &Db, sql: &dyn SchemaSql, plan: &Plan) -> anyhow::Result<()> {
    if !sql.transactional_ddl() {
        return run_undoing(db, sql, plan).await;
    }
    let mut conn = db.pool().acquire().await?;
    let mut tx = conn.begin().await?;
    let lease_table = sql.lease_table();
    let statements = plan.statements().chain([lease_table.as_str()]);
    for statement in statements {
        db.count_statement();
        if let Err(e) = tx.execute(sqlx::AssertSqlSafe(statement.to_string())).await {
            let rolled_back = tx.rollback().await;
            let undone = match rolled_back {
                Ok(()) => "every change of this run was rolled back".to_string(),
                Err(r) => format!("the rollback failed too ({r})"),
            };
            anyhow::bail!(
                "migrate --adopt failed at `{}`: {e}; {undone}",
                one_line(statement)
            );
        }
    }
    tx.commit().await?;
    Ok(())
}

/// [`run`] where each DDL statement commits at once: a failed step undoes the steps before it,
/// newest first.
async fn run_undoing(db: &Db, sql: &dyn SchemaSql, plan: &Plan) -> anyhow::Result<()> {
    for (i, step) in plan.steps.iter().enumerate() {
        db.count_statement();
        if let Err(e) = db
            .pool()
            .execute(sqlx::AssertSqlSafe(step.sql.clone()))
            .await
        {
            let undone = undo(db, &plan.steps[..i]).await;
            anyhow::bail!(
                "migrate --adopt failed at `{}`: {e}; {undone}",
                one_line(&step.sql)
            );
        }
    }
    if let Err(e) = migrate::lease_only(db, sql).await {
        let undone = undo(db, &plan.steps).await;
        anyhow::bail!("migrate --adopt could not create the lease table: {e:#}; {undone}");
    }
    Ok(())
}

/// Undoes `done`, newest first; says what came of it.
async fn undo(db: &Db, done: &[Step]) -> String {
    if done.is_empty() {
        return "nothing had been changed".into();
    }
    let mut failed = Vec::new();
    for step in done.iter().rev() {
        let Some(undo) = &step.undo else { continue };
        db.count_statement();
        if let Err(e) = db.pool().execute(sqlx::AssertSqlSafe(undo.clone())).await {
            failed.push(format!("`{}` ({e})", one_line(undo)));
        }
    }
    match failed.is_empty() {
        true => format!(
            "the {} statement(s) run before it were undone: the table is as it was",
            done.len()
        ),
        false => format!(
            "undoing what ran before it failed, run by hand: {}",
            failed.join(", ")
        ),
    }
}

/// A statement on one line, for messages.
fn one_line(statement: &str) -> String {
    statement.split_whitespace().collect::<Vec<_>>().join(" ")
}
