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
//! MySQL/MariaDB: a `TIMESTAMP` column converts values through the session time zone. The
//! relay's sessions run at UTC, while a Java application's sessions normally run in the
//! server's global zone; so these statements run in the server's global zone, as the Java
//! side's would, and the connection is put back at UTC (or closed) afterwards.

use std::time::Duration;

use sqlx::any::AnyRow;
use sqlx::{Executor, Row};

use super::builder::Sql;
use super::sql::SqlStore;
use super::{Dialect, future_ms};

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

impl SqlStore {
    /// True when `table` exists in the outbox database.
    pub async fn shedlock_table_exists(&self, table: &str) -> anyhow::Result<bool> {
        // A probe that reads no row: it fails only when the table (or a column) is missing.
        let probe =
            format!("SELECT name, lock_until, locked_at, locked_by FROM {table} WHERE 1 = 0");
        match self.sql(&probe).fetch_optional(&self.pool).await {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates the ShedLock table with ShedLock's documented schema if it is missing (the
    /// `migrate` verb, and `run` with `database.migrate`); an existing table is never touched.
    /// Returns true when it was created.
    pub async fn create_shedlock_table(&self, table: &str) -> anyhow::Result<bool> {
        if self.shedlock_table_exists(table).await? {
            return Ok(false);
        }
        // ShedLock's README schema. MySQL: an explicit DEFAULT keeps a server with
        // `explicit_defaults_for_timestamp = OFF` from giving the first TIMESTAMP column an
        // `ON UPDATE CURRENT_TIMESTAMP` of its own.
        let time = match self.dialect {
            Dialect::Postgres => "TIMESTAMP NOT NULL",
            Dialect::MySql { .. } => "TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)",
            Dialect::Sqlite => "TEXT NOT NULL",
        };
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {table} (name VARCHAR(64) NOT NULL PRIMARY KEY, \
             lock_until {time}, locked_at {time}, locked_by VARCHAR(255) NOT NULL)"
        );
        self.sql(&ddl).execute(&self.pool).await?;
        Ok(true)
    }

    /// ShedLock's lock: inserts the row, or takes it over if its `lock_until` has passed.
    /// True when `locked_by` now holds `name` until now + `ttl`.
    pub async fn shedlock_acquire(
        &self,
        sl: &ShedLockTable,
        name: &str,
        locked_by: &str,
        ttl: Duration,
    ) -> anyhow::Result<bool> {
        let (insert, conflict) = match self.dialect {
            Dialect::MySql { .. } => ("INSERT IGNORE INTO", ""),
            _ => ("INSERT INTO", " ON CONFLICT (name) DO NOTHING"),
        };
        let mut q = Sql::new(&format!(
            "{insert} {} (name, lock_until, locked_at, locked_by) VALUES (",
            sl.table
        ));
        q.text(name).push(", ");
        self.now_plus(&mut q, sl, ttl);
        q.push(&format!(", {}, ", self.shed_now(sl)))
            .text(locked_by)
            .push(")")
            .push(conflict);
        if self.shed_execute(q).await? == 1 {
            return Ok(true);
        }
        let now = self.shed_now(sl);
        let mut q = Sql::new(&format!("UPDATE {} SET lock_until = ", sl.table));
        self.now_plus(&mut q, sl, ttl);
        q.push(&format!(", locked_at = {now}, locked_by = "))
            .text(locked_by)
            .push(" WHERE name = ")
            .text(name)
            .push(&format!(" AND lock_until <= {now}"));
        Ok(self.shed_execute(q).await? == 1)
    }

    /// ShedLock's extend (KeepAliveLockProvider): true when `locked_by` still held `name`
    /// (unexpired) and now holds it until now + `ttl`. Never revives an expired row.
    pub async fn shedlock_extend(
        &self,
        sl: &ShedLockTable,
        name: &str,
        locked_by: &str,
        ttl: Duration,
    ) -> anyhow::Result<bool> {
        let mut q = Sql::new(&format!("UPDATE {} SET lock_until = ", sl.table));
        self.now_plus(&mut q, sl, ttl);
        q.push(" WHERE name = ")
            .text(name)
            .push(" AND locked_by = ")
            .text(locked_by)
            .push(&format!(" AND lock_until > {}", self.shed_now(sl)));
        Ok(self.shed_execute(q).await? == 1)
    }

    /// ShedLock's unlock: `lock_until = now`, only for the row `locked_by` holds.
    pub async fn shedlock_release(
        &self,
        sl: &ShedLockTable,
        name: &str,
        locked_by: &str,
    ) -> anyhow::Result<()> {
        let mut q = Sql::new(&format!(
            "UPDATE {} SET lock_until = {} WHERE name = ",
            sl.table,
            self.shed_now(sl)
        ));
        q.text(name).push(" AND locked_by = ").text(locked_by);
        self.shed_execute(q).await?;
        Ok(())
    }

    /// ShedLock's "now" on the database clock: UTC, plus the table's offset.
    fn shed_now(&self, sl: &ShedLockTable) -> String {
        let off = sl.utc_offset_minutes;
        match (self.dialect, off) {
            (Dialect::Postgres, 0) => "timezone('utc', CURRENT_TIMESTAMP)".to_string(),
            (Dialect::Postgres, _) => {
                format!("(timezone('utc', CURRENT_TIMESTAMP) + interval '{off} minutes')")
            }
            (Dialect::MySql { .. }, 0) => "UTC_TIMESTAMP(3)".to_string(),
            (Dialect::MySql { .. }, _) => format!("TIMESTAMPADD(MINUTE, {off}, UTC_TIMESTAMP(3))"),
            (Dialect::Sqlite, _) => {
                format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '{off} minutes')")
            }
        }
    }

    /// Appends ShedLock's "now + ttl" (ttl capped like every time the relay writes).
    fn now_plus(&self, q: &mut Sql, sl: &ShedLockTable, ttl: Duration) {
        let ms = future_ms(ttl);
        let now = self.shed_now(sl);
        match self.dialect {
            Dialect::Postgres => {
                q.push(&format!("{now} + cast("))
                    .text(&format!("{ms} milliseconds"))
                    .push(" as interval)");
            }
            Dialect::MySql { .. } => {
                q.push("TIMESTAMPADD(MICROSECOND, ")
                    .int(ms * 1000)
                    .push(&format!(", {now})"));
            }
            Dialect::Sqlite => {
                q.push(&format!(
                    "strftime('%Y-%m-%d %H:%M:%f', 'now', '{} minutes', (",
                    sl.utc_offset_minutes
                ))
                .int(ms)
                .push(" / 1000.0) || ' seconds')");
            }
        }
    }

    /// Runs one ShedLock statement; returns the rows it changed.
    async fn shed_execute(&self, q: Sql) -> anyhow::Result<u64> {
        Ok(self.shed_run(q, false).await?.0)
    }

    /// Runs one ShedLock statement: with `fetch`, returns its first row; otherwise the rows
    /// it changed. On MySQL it runs in the server's global time zone (see the module docs) on
    /// a connection that goes back to the pool at UTC, or is closed if that cannot be ensured.
    async fn shed_run(&self, q: Sql, fetch: bool) -> anyhow::Result<(u64, Option<AnyRow>)> {
        let err = |e: sqlx::Error| anyhow::anyhow!("{WHAT}: {e}");
        let mut conn = self.pool.acquire().await?;
        let mysql = matches!(self.dialect, Dialect::MySql { .. });
        let result = async {
            if mysql {
                conn.execute("SET SESSION time_zone = @@GLOBAL.time_zone")
                    .await?;
            }
            let out = if fetch {
                (0, q.query(self).fetch_optional(&mut *conn).await?)
            } else {
                (
                    q.query(self).execute(&mut *conn).await?.rows_affected(),
                    None,
                )
            };
            if mysql {
                conn.execute("SET SESSION time_zone = '+00:00'").await?;
            }
            Ok::<_, sqlx::Error>(out)
        }
        .await;
        match result {
            Ok(out) => Ok(out),
            Err(e) => {
                if mysql {
                    // The session may be left in another zone: never give it back to the pool.
                    let _ = conn.close().await;
                }
                Err(err(e))
            }
        }
    }

    /// Who holds row `name` (for `status`): its `locked_by` and the milliseconds left until
    /// its `lock_until` (zero or less: free); `None` when there is no such row.
    pub async fn shedlock_holder(
        &self,
        sl: &ShedLockTable,
        name: &str,
    ) -> anyhow::Result<Option<(String, i64)>> {
        let now = self.shed_now(sl);
        let left = match self.dialect {
            Dialect::Postgres => {
                format!("CAST(EXTRACT(EPOCH FROM (lock_until - {now})) * 1000 AS BIGINT)")
            }
            Dialect::MySql { .. } => {
                format!("CAST(TIMESTAMPDIFF(MICROSECOND, {now}, lock_until) DIV 1000 AS SIGNED)")
            }
            Dialect::Sqlite => {
                format!("CAST((julianday(lock_until) - julianday({now})) * 86400000 AS INTEGER)")
            }
        };
        let mut q = Sql::new(&format!(
            "SELECT locked_by, {left} FROM {} WHERE name = ",
            sl.table
        ));
        q.text(name);
        let Some(row) = self.shed_run(q, true).await?.1 else {
            return Ok(None);
        };
        Ok(Some((row.try_get(0)?, row.try_get(1)?)))
    }
}
