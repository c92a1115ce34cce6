//! [`Stmt`]: a statement ready to run, either prepared with its values bound or, where the
//! dialect writes values as literals ([`Syntax::values_as_literals`]), plain text, which the
//! driver sends as one simple query (MySQL's text protocol) instead of a prepare and an
//! execute.
//!
//! Guarantee: the same rows and results either way; only text the builder could write as a
//! literal safely under every SQL mode goes out as text (`Sql::inlined`).

use sqlx::any::{AnyArguments, AnyQueryResult, AnyRow, AnyStatement};
use sqlx::error::BoxDynError;
use sqlx::query::Query;
use sqlx::{Any, AssertSqlSafe, Execute, Executor, SqlSafeStr, SqlStr};

/// A query ready to run, prepared, with every value bound.
pub type AnyQuery<'q> = Query<'q, Any, AnyArguments>;

/// A statement ready to run (see the module).
pub enum Stmt {
    /// Prepared (and cached by the driver), every value bound.
    Prepared(AnyQuery<'static>),
    /// Plain text, every value a literal in it.
    Text(String),
}

impl<'q> Execute<'q, Any> for Stmt {
    fn sql(self) -> SqlStr {
        match self {
            Stmt::Prepared(q) => q.sql(),
            Stmt::Text(text) => AssertSqlSafe(text).into_sql_str(),
        }
    }

    fn statement(&self) -> Option<&AnyStatement> {
        match self {
            Stmt::Prepared(q) => q.statement(),
            Stmt::Text(_) => None,
        }
    }

    fn take_arguments(&mut self) -> Result<Option<AnyArguments>, BoxDynError> {
        match self {
            Stmt::Prepared(q) => q.take_arguments(),
            Stmt::Text(_) => Ok(None),
        }
    }

    fn persistent(&self) -> bool {
        match self {
            Stmt::Prepared(q) => q.persistent(),
            Stmt::Text(_) => false,
        }
    }
}

impl Stmt {
    /// Runs it; how many rows it changed.
    pub async fn execute<'c, E>(self, e: E) -> Result<AnyQueryResult, sqlx::Error>
    where
        E: Executor<'c, Database = Any>,
    {
        e.execute(self).await
    }

    /// Every row it returns.
    pub async fn fetch_all<'c, E>(self, e: E) -> Result<Vec<AnyRow>, sqlx::Error>
    where
        E: Executor<'c, Database = Any>,
    {
        e.fetch_all(self).await
    }

    /// Its first row, if any.
    pub async fn fetch_optional<'c, E>(self, e: E) -> Result<Option<AnyRow>, sqlx::Error>
    where
        E: Executor<'c, Database = Any>,
    {
        e.fetch_optional(self).await
    }

    /// Its first row, or an error when it returns none.
    pub async fn fetch_one<'c, E>(self, e: E) -> Result<AnyRow, sqlx::Error>
    where
        E: Executor<'c, Database = Any>,
    {
        e.fetch_one(self).await
    }
}
