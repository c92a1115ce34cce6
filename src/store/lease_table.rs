//! The `outbox_relay_lease` table: the `database` lease backend's row, and the fencing epoch
//! of every backend (docs/design.md, "Leases and fencing").
//!
//! Guarantees: the epoch only ever grows, by one per acquisition, in the same statement that
//! records the holder, so a claim fenced on an older epoch is refused by the database; an
//! acquire takes the row only when it is free or expired on the database clock; renew and
//! release change the row only for the holder and epoch that hold it.

use std::time::Duration;

use sqlx::Row;

use super::builder::Sql;
use super::sql::SqlStore;
use super::{Dialect, LeaseTable, mysql};
use crate::BoxFuture;

impl LeaseTable for SqlStore {
    fn lease_acquire<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, anyhow::Result<Option<i64>>> {
        Box::pin(async move {
            self.ensure_lease_row(name).await?;
            let mut set = Sql::new("holder = ");
            set.text(holder)
                .push(", lease_until = ")
                .now_plus(self.dialect, ttl);
            let mut filter = Sql::new("name = ");
            filter.text(name).push(&format!(
                " AND (holder IS NULL OR lease_until IS NULL OR lease_until < {})",
                self.dialect.now()
            ));
            self.bump_epoch(set, filter).await
        })
    }

    fn lease_renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        epoch: i64,
        ttl: Duration,
    ) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move {
            let mut q = Sql::new("UPDATE outbox_relay_lease SET lease_until = ");
            q.now_plus(self.dialect, ttl)
                .push(" WHERE name = ")
                .text(name)
                .push(" AND holder = ")
                .text(holder)
                .push(" AND epoch = ")
                .int(epoch);
            let n = q.query(self).execute(&self.pool).await?.rows_affected();
            Ok(n == 1)
        })
    }

    fn lease_release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        epoch: i64,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let mut q = Sql::new(
                "UPDATE outbox_relay_lease SET holder = NULL, lease_until = NULL WHERE name = ",
            );
            q.text(name)
                .push(" AND holder = ")
                .text(holder)
                .push(" AND epoch = ")
                .int(epoch);
            q.query(self).execute(&self.pool).await?;
            Ok(())
        })
    }

    fn advance_epoch<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<i64>> {
        Box::pin(async move {
            self.ensure_lease_row(name).await?;
            let mut set = Sql::new("holder = ");
            set.text(holder).push(", lease_until = NULL");
            let mut filter = Sql::new("name = ");
            filter.text(name);
            self.bump_epoch(set, filter)
                .await?
                .ok_or_else(|| anyhow::anyhow!("lease row {name} vanished"))
        })
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(SqlStore::ping(self))
    }
}

impl SqlStore {
    /// `UPDATE outbox_relay_lease SET {set}, epoch = epoch + 1 WHERE {filter}` and the new
    /// epoch, in ONE statement: a relay paused mid-transaction would otherwise hold the lease
    /// row's lock, and every fenced claim waits on that lock. PostgreSQL and SQLite return the
    /// epoch with RETURNING; MySQL reports it differently ([`mysql::bump_epoch`]).
    async fn bump_epoch(&self, set: Sql, filter: Sql) -> anyhow::Result<Option<i64>> {
        if let Dialect::MySql { .. } = self.dialect {
            return mysql::bump_epoch(self, set, filter).await;
        }
        let mut q = Sql::new("UPDATE outbox_relay_lease SET ");
        q.append(set)
            .push(", epoch = epoch + 1 WHERE ")
            .append(filter)
            .push(" RETURNING epoch");
        let row = q.query(self).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?)
    }

    /// Inserts the lease row `name` if it is missing (once per name and store).
    async fn ensure_lease_row(&self, name: &str) -> anyhow::Result<()> {
        if self.lease_rows_ready.lock().is_ok_and(|s| s.contains(name)) {
            return Ok(());
        }
        let (insert, conflict) = match self.dialect {
            Dialect::MySql { .. } => ("INSERT IGNORE INTO", ""),
            _ => ("INSERT INTO", " ON CONFLICT (name) DO NOTHING"),
        };
        let mut q = Sql::new(&format!(
            "{insert} outbox_relay_lease (name, epoch) VALUES ("
        ));
        q.text(name).push(", 0)").push(conflict);
        q.query(self).execute(&self.pool).await?;
        if let Ok(mut set) = self.lease_rows_ready.lock() {
            set.insert(name.to_string());
        }
        Ok(())
    }
}
