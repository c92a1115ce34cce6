//! The ShedLock table (`shedlock(name, lock_until, locked_at, locked_by)`), used by the
//! `shedlock` lease so that the relay and a Spring poller guarded by ShedLock's
//! `JdbcTemplateLockProvider` exclude each other.
//!
//! The statements are ShedLock's own, in their `usingDbTime()` form (checked against
//! lukas-krecan/ShedLock, `SqlStatementsSource`, `PostgresSqlServerTimeStatementsSource` and
//! `MySqlServerTimeStatementsSource`, the file versions at commits 014b89c and 00a7b3f; the
//! release they belong to was not pinned down, and the conditions are the same in both):
//! - lock: `INSERT` a row if there is none (a duplicate name = not acquired), otherwise
//!   `UPDATE ... SET lock_until = now+ttl, locked_at = now, locked_by = ? WHERE name = ? AND
//!   lock_until <= now`;
//! - extend (ShedLock's `KeepAliveLockProvider`): `UPDATE ... SET lock_until = now+ttl WHERE
//!   name = ? AND locked_by = ? AND lock_until > now`;
//! - unlock: `UPDATE ... SET lock_until = now WHERE name = ? AND locked_by = ?` (ShedLock
//!   writes `max(now, locked_at + lockAtLeastFor)`; the relay has no lockAtLeastFor).
//!
//! Guarantees: every time is the database's own clock, never the relay's: in UTC as ShedLock's
//! `usingDbTime()` writes it (PostgreSQL `timezone('utc', CURRENT_TIMESTAMP)`, MySQL
//! `UTC_TIMESTAMP(3)`, SQLite `strftime(.., 'now')`), shifted by a fixed offset when the Java
//! side writes its JVM's local time instead ([`ShedLockTable::utc_offset_minutes`]); a row is
//! only ever taken when it is free or expired, and only extended or released by the
//! `locked_by` that holds it.
//!
//! Where the database converts times through the session's time zone (MySQL/MariaDB), these
//! statements run in the session settings the Java side's would have
//! ([`LockSql::shedlock_session`]), and the connection is put back as it was (or closed).

use std::time::Duration;

use anyhow::Result;

use sqlx::any::AnyRow;
use sqlx::{Executor, Row};

use super::LockSql;
use crate::store::db::Db;
use crate::store::model::future_ms;
use crate::store::sql::Sql;

/// What a ShedLock statement does, for errors.
const WHAT: &str = "lease.shedlock_table";

/// A ShedLock table and the wall clock its times are written in.
#[derive(Debug, Clone)]
pub struct ShedLockTable {
    /// The table (a validated identifier, or schema.table).
    pub table: String,
    /// The offset from UTC of the times in the table: 0 when the Java side uses
    /// `usingDbTime()` or `withTimeZone(UTC)`; its JVM's zone offset (e.g. 540 for
    /// Asia/Seoul) when it writes the JVM's local time.
    pub utc_offset_minutes: i32,
}

impl ShedLockTable {
    pub fn new(table: &str, utc_offset_minutes: i32) -> ShedLockTable {
        ShedLockTable {
            table: table.to_string(),
            utc_offset_minutes,
        }
    }
}

/// ShedLock's statements on one table of one database.
pub struct ShedLock<'a> {
    pub db: &'a Db,
    pub sql: &'a dyn LockSql,
    pub table: &'a ShedLockTable,
}

impl ShedLock<'_> {
    /// True when the table exists in the outbox database.
    pub async fn table_exists(&self) -> anyhow::Result<bool> {
        // A probe that reads no row: it fails only when the table (or a column) is missing.
        let probe = format!(
            "SELECT name, lock_until, locked_at, locked_by FROM {} WHERE 1 = 0",
            self.table.table
        );
        match self.db.sql(&probe).fetch_optional(self.db.pool()).await {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates the ShedLock table with ShedLock's documented schema if it is missing (the
    /// `migrate` verb, and `run` with `database.migrate`); an existing table is never touched.
    /// Returns true when it was created.
    pub async fn create_table(&self) -> anyhow::Result<bool> {
        if self.table_exists().await? {
            return Ok(false);
        }
        let (table, time) = (&self.table.table, self.sql.shedlock_time_type());
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {table} (name VARCHAR(64) NOT NULL PRIMARY KEY, \
             lock_until {time}, locked_at {time}, locked_by VARCHAR(255) NOT NULL)"
        );
        self.db.sql(&ddl).execute(self.db.pool()).await?;
        Ok(true)
    }

    /// ShedLock's lock: inserts the row, or takes it over if its `lock_until` has passed.
    /// True when `locked_by` now holds `name` until now + `ttl`.
    pub async fn acquire(&self, name: &str, locked_by: &str, ttl: Duration) -> Result<bool> {
        let (insert, conflict) = self.sql.insert_if_absent("name");
        let mut q = Sql::new(&format!(
            "{insert} {} (name, lock_until, locked_at, locked_by) VALUES (",
            self.table.table
        ));
        q.text(name).push(", ");
        self.now_plus(&mut q, ttl);
        q.push(&format!(", {}, ", self.now()))
            .text(locked_by)
            .push(")")
            .push(&conflict);
        if self.execute(q).await? == 1 {
            return Ok(true);
        }
        let now = self.now();
        let mut q = Sql::new(&format!("UPDATE {} SET lock_until = ", self.table.table));
        self.now_plus(&mut q, ttl);
        q.push(&format!(", locked_at = {now}, locked_by = "))
            .text(locked_by)
            .push(" WHERE name = ")
            .text(name)
            .push(&format!(" AND lock_until <= {now}"));
        Ok(self.execute(q).await? == 1)
    }

    /// ShedLock's extend (KeepAliveLockProvider): true when `locked_by` still held `name`
    /// (unexpired) and now holds it until now + `ttl`. Never revives an expired row.
    pub async fn extend(&self, name: &str, locked_by: &str, ttl: Duration) -> Result<bool> {
        let mut q = Sql::new(&format!("UPDATE {} SET lock_until = ", self.table.table));
        self.now_plus(&mut q, ttl);
        q.push(" WHERE name = ")
            .text(name)
            .push(" AND locked_by = ")
            .text(locked_by)
            .push(&format!(" AND lock_until > {}", self.now()));
        Ok(self.execute(q).await? == 1)
    }

    /// ShedLock's unlock: `lock_until = now`, only for the row `locked_by` holds.
    pub async fn release(&self, name: &str, locked_by: &str) -> Result<()> {
        let mut q = Sql::new(&format!(
            "UPDATE {} SET lock_until = {} WHERE name = ",
            self.table.table,
            self.now()
        ));
        q.text(name).push(" AND locked_by = ").text(locked_by);
        self.execute(q).await?;
        Ok(())
    }

    /// Who holds row `name` (for `status`): its `locked_by` and the milliseconds left until
    /// its `lock_until` (zero or less: free); `None` when there is no such row.
    pub async fn holder(&self, name: &str) -> Result<Option<(String, i64)>> {
        let left = self.sql.shedlock_left(&self.now());
        let mut q = Sql::new(&format!(
            "SELECT locked_by, {left} FROM {} WHERE name = ",
            self.table.table
        ));
        q.text(name);
        let Some(row) = self.run(q, true).await?.1 else {
            return Ok(None);
        };
        Ok(Some((row.try_get(0)?, row.try_get(1)?)))
    }

    /// ShedLock's "now" on the database clock: UTC, plus the table's offset.
    fn now(&self) -> String {
        self.sql.shedlock_now(self.table.utc_offset_minutes)
    }

    /// Appends ShedLock's "now + ttl" (ttl capped like every time the relay writes).
    fn now_plus(&self, q: &mut Sql, ttl: Duration) {
        let offset = self.table.utc_offset_minutes;
        self.sql.shedlock_now_plus(q, offset, future_ms(ttl));
    }

    /// Runs one ShedLock statement; returns the rows it changed.
    async fn execute(&self, q: Sql) -> anyhow::Result<u64> {
        Ok(self.run(q, false).await?.0)
    }

    /// Runs one ShedLock statement: with `fetch`, returns its first row; otherwise the rows
    /// it changed. Inside the database's ShedLock session settings (see the module docs), on
    /// a connection that goes back to the pool as it was, or is closed if that cannot be
    /// ensured.
    async fn run(&self, q: Sql, fetch: bool) -> anyhow::Result<(u64, Option<AnyRow>)> {
        let err = |e: sqlx::Error| anyhow::anyhow!("{WHAT}: {e}");
        let mut conn = self.db.pool().acquire().await?;
        let session = self.sql.shedlock_session();
        let result = async {
            if let Some((enter, _)) = session {
                conn.execute(enter).await?;
            }
            let query = self.db.query(q);
            let out = if fetch {
                (0, query.fetch_optional(&mut *conn).await?)
            } else {
                (query.execute(&mut *conn).await?.rows_affected(), None)
            };
            if let Some((_, leave)) = session {
                conn.execute(leave).await?;
            }
            Ok::<_, sqlx::Error>(out)
        }
        .await;
        match result {
            Ok(out) => Ok(out),
            Err(e) => {
                if session.is_some() {
                    // The session may be left in other settings: never give it back to the
                    // pool.
                    let _ = conn.close().await;
                }
                Err(err(e))
            }
        }
    }
}
