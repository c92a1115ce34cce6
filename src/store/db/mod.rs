//! [`Db`]: the handle every statement goes through. It holds the pool, the dialect and its
//! syntax, the outbox table and its columns, and counts the statements sent; opening it is
//! in `connect.rs`.

mod connect;

use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::AnyPool;

pub use connect::{
    Connect, LOCK_WAIT, Opening, Options, Refined, STATEMENT_TIME, WARM_CONNECTIONS,
    open_side_by_side,
};

use crate::store::sql::ident::derived;
use crate::store::sql::payload::LiveType;
use crate::store::sql::{AnyQuery, Columns, Dialect, Sql, Stmt, Syntax};

/// One outbox table on one database.
pub struct Db {
    pool: AnyPool,
    dialect: Dialect,
    syntax: &'static dyn Syntax,
    /// The outbox table as SQL names it: quoted on a mapped table, bare on the relay's own.
    table: String,
    /// The outbox table's name as configured (validated as an identifier).
    name: String,
    /// The table's column names and status values (the relay's own unless `[table]` maps an
    /// existing table).
    cols: Columns,
    /// Statements built and sent (BEGIN/COMMIT not counted): what the benchmark divides by
    /// delivered rows.
    statements: AtomicU64,
    /// Where the database has one writer at a time (SQLite): taken around the relay's own
    /// writes (claims and results), so that they queue here instead of colliding on the
    /// database's write lock, where the loser sleeps in its busy handler for 1 ms or more
    /// (docs/design.md, "SQLite writers").
    writer: Option<tokio::sync::Mutex<()>>,
}

impl Db {
    /// The pool.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Which database this is.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The SQL that differs on this database.
    pub fn syntax(&self) -> &'static dyn Syntax {
        self.syntax
    }

    /// The outbox table, as SQL names it (quoted on a mapped table, docs/design.md "9a.
    /// Mapped tables").
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The outbox table's name as configured, for the catalog's look-ups and messages.
    pub fn table_name(&self) -> &str {
        &self.name
    }

    /// An object the relay creates for the table (an index, a trigger), `<table>_<suffix>`:
    /// (its name, as the catalog lists it; its name as SQL writes it). On a mapped table the
    /// name is kept within the databases' length limits and quoted (`ident::derived`); on
    /// the relay's own it is what it always was.
    pub fn object(&self, suffix: &str) -> (String, String) {
        if !self.cols.mapped {
            let name = format!("{}_{suffix}", self.name);
            return (name.clone(), name);
        }
        let name = derived(&self.name, suffix);
        let sql = self.syntax.quote_ident(&name);
        (name, sql)
    }

    /// The table's columns and status values.
    pub fn cols(&self) -> &Columns {
        &self.cols
    }

    /// The same handle on a table mapped by `[table]`, its names quoted for this database.
    pub fn with_columns(mut self, cols: Columns) -> Db {
        self.table = match cols.mapped {
            true => self.syntax.quote_ident(&self.name),
            false => self.name.clone(),
        };
        self.cols = cols.quoted_for(self.syntax);
        self
    }

    /// The same handle knowing the server's types of the mapped columns (see
    /// [`Columns::with_types`]).
    pub fn with_types(mut self, types: std::collections::BTreeMap<String, LiveType>) -> Db {
        self.cols = self.cols.with_types(types, self.syntax);
        self
    }

    /// `q` ready to run here, every value bound (and counted in [`Db::statements`]).
    pub fn query(&self, q: Sql) -> Stmt {
        self.count_statement();
        q.finalized(self.syntax)
    }

    /// A statement without values (those with values are built with [`Sql`]).
    pub fn sql(&self, text: &str) -> AnyQuery<'static> {
        self.count_statement();
        sqlx::query(sqlx::AssertSqlSafe(text.to_string()))
    }

    /// Counts a statement sent some other way (DDL).
    pub fn count_statement(&self) {
        self.statements.fetch_add(1, Ordering::Relaxed);
    }

    /// Statements sent so far (see the field).
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Waits for this process's turn to write (a database with one writer, see the field), or
    /// returns at once.
    pub async fn writing(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.writer {
            Some(m) => Some(m.lock().await),
            None => None,
        }
    }
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("dialect", &self.dialect)
            .field("table", &self.table)
            .finish()
    }
}
