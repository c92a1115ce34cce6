//! MySQL/MariaDB named locks (`GET_LOCK`) on a dedicated session, for the `mysql-get-lock`
//! lease: the lock a Java poller takes with `SELECT GET_LOCK('name', 0)` belongs to its
//! connection, so the relay's must be held by one connection of its own, outside the pool
//! (a pooled connection would be handed to claims and could be recycled, silently dropping
//! the lock).
//!
//! Guarantees: the lock lives exactly as long as the session: the server releases it when
//! the connection closes or dies; [`LockSession::holds`] asks the server whether this very
//! session still holds it (`IS_USED_LOCK(name) = CONNECTION_ID()`), so a connection that was
//! lost, killed or replaced never passes for a hold.

use sqlx::{AnyConnection, Connection, Row};

use crate::store::db::Db;
use crate::store::sql::{Dialect, Sql, Syntax};

/// One dedicated connection that may hold the named lock `name`.
pub struct LockSession {
    conn: AnyConnection,
    syntax: &'static dyn Syntax,
    name: String,
}

impl LockSession {
    /// A connection of its own (taken out of the pool, which opens another in its place),
    /// with the pool's session settings, for the lock `name`. MySQL/MariaDB only.
    pub async fn open(db: &Db, name: &str) -> anyhow::Result<LockSession> {
        if !matches!(db.dialect(), Dialect::MySql { .. }) {
            anyhow::bail!("lease.backend: GET_LOCK needs MySQL or MariaDB");
        }
        let conn = db.pool().acquire().await?.detach();
        Ok(LockSession {
            conn,
            syntax: db.syntax(),
            name: name.to_string(),
        })
    }

    /// The connection id holding the named lock `name`, if any (for `status`).
    pub async fn holder(db: &Db, name: &str) -> anyhow::Result<Option<i64>> {
        let mut q = Sql::new("SELECT CAST(IS_USED_LOCK(");
        q.text(name).push(") AS SIGNED)");
        let row = db.query(q).fetch_one(db.pool()).await?;
        Ok(row.try_get::<Option<i64>, _>(0)?)
    }

    /// `SELECT GET_LOCK(name, 0)`: true when this session now holds the lock, false when
    /// another session does. NULL (an error on the server, e.g. a killed query) is an error.
    pub async fn try_lock(&mut self) -> anyhow::Result<bool> {
        let mut q = Sql::new("SELECT CAST(GET_LOCK(");
        q.text(&self.name).push(", 0) AS SIGNED)");
        match self.one(q).await? {
            Some(1) => Ok(true),
            Some(_) => Ok(false),
            None => anyhow::bail!("GET_LOCK returned NULL"),
        }
    }

    /// True when this session still holds the lock on the server.
    pub async fn holds(&mut self) -> anyhow::Result<bool> {
        let mut q = Sql::new("SELECT CAST(COALESCE(IS_USED_LOCK(");
        q.text(&self.name)
            .push(") = CONNECTION_ID(), 0) AS SIGNED)");
        Ok(self.one(q).await? == Some(1))
    }

    /// `RELEASE_LOCK(name)`, then closes the session (which would release it anyway).
    pub async fn release(mut self) -> anyhow::Result<()> {
        let mut q = Sql::new("SELECT CAST(RELEASE_LOCK(");
        q.text(&self.name).push(") AS SIGNED)");
        let released = self.one(q).await;
        let _ = self.conn.close().await;
        released.map(|_| ())
    }

    /// Runs a one-value query on this session.
    async fn one(&mut self, q: Sql) -> anyhow::Result<Option<i64>> {
        let row = q.finalized(self.syntax).fetch_one(&mut self.conn).await?;
        Ok(row.try_get::<Option<i64>, _>(0)?)
    }
}
