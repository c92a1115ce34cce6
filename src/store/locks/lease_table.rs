//! The `outbox_relay_lease` table: the `database` lease backend's row, and the fencing epoch
//! of every backend (docs/design.md, "Leases and fencing").
//!
//! Guarantees: the epoch only ever grows, by one per acquisition, in the same statement that
//! records the holder, so a claim fenced on an older epoch is refused by the database; an
//! acquire takes the row only when it is free or expired on the database clock; renew and
//! release change the row only for the holder and epoch that hold it.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use sqlx::Row;

use super::{Hold, LockSql};
use crate::store::db::Db;
use crate::store::model::LeaseRow;
use crate::store::sql::Sql;

/// One store's lease rows: the database's statements, and the names whose row is known to
/// exist (saves a statement per acquire; one store may serve several leases).
pub struct Leases {
    sql: &'static dyn LockSql,
    ready: Mutex<HashSet<String>>,
}

impl Leases {
    pub fn new(sql: &'static dyn LockSql) -> Leases {
        Leases {
            sql,
            ready: Mutex::new(HashSet::new()),
        }
    }

    /// Takes the lease `name` if it is free or expired (on the database clock), bumping the
    /// epoch: the new epoch, or `None` if someone else holds it.
    pub async fn acquire(
        &self,
        db: &Db,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> anyhow::Result<Option<i64>> {
        self.ensure_row(db, name).await?;
        let mut set = Sql::new("holder = ");
        set.text(holder)
            .push(", lease_until = ")
            .now_plus(db.syntax(), ttl);
        let mut filter = Sql::new("name = ");
        filter.text(name).push(&format!(
            " AND (holder IS NULL OR lease_until IS NULL OR lease_until < {})",
            db.syntax().now()
        ));
        self.sql.bump_epoch(db, set, filter).await
    }

    /// Extends the lease if its holder still holds it at its epoch; false means it is lost.
    pub async fn renew(&self, db: &Db, hold: Hold<'_>, ttl: Duration) -> anyhow::Result<bool> {
        let mut q = Sql::new("UPDATE outbox_relay_lease SET lease_until = ");
        q.now_plus(db.syntax(), ttl);
        hold.filter(&mut q);
        let n = db.query(q).execute(db.pool()).await?.rows_affected();
        Ok(n == 1)
    }

    /// Gives the lease up if still held.
    pub async fn release(&self, db: &Db, hold: Hold<'_>) -> anyhow::Result<()> {
        let mut q = Sql::new("UPDATE outbox_relay_lease SET holder = NULL, lease_until = NULL");
        hold.filter(&mut q);
        db.query(q).execute(db.pool()).await?;
        Ok(())
    }

    /// Records `holder` and bumps the epoch (a lease held elsewhere): the new epoch.
    pub async fn advance_epoch(&self, db: &Db, name: &str, holder: &str) -> anyhow::Result<i64> {
        self.ensure_row(db, name).await?;
        let mut set = Sql::new("holder = ");
        set.text(holder).push(", lease_until = NULL");
        let mut filter = Sql::new("name = ");
        filter.text(name);
        self.sql
            .bump_epoch(db, set, filter)
            .await?
            .ok_or_else(|| anyhow::anyhow!("lease row {name} vanished"))
    }

    /// Inserts the lease row `name` if it is missing (once per name and store).
    async fn ensure_row(&self, db: &Db, name: &str) -> anyhow::Result<()> {
        if self.ready.lock().is_ok_and(|s| s.contains(name)) {
            return Ok(());
        }
        let (insert, conflict) = self.sql.insert_if_absent("name");
        let mut q = Sql::new(&format!(
            "{insert} outbox_relay_lease (name, epoch) VALUES ("
        ));
        q.text(name).push(", 0)").push(&conflict);
        db.query(q).execute(db.pool()).await?;
        if let Ok(mut set) = self.ready.lock() {
            set.insert(name.to_string());
        }
        Ok(())
    }
}

/// `UPDATE outbox_relay_lease SET {set}, epoch = epoch + 1 WHERE {filter}` and the new
/// epoch, in ONE statement: a relay paused mid-transaction would otherwise hold the lease
/// row's lock, and every fenced claim waits on that lock. The epoch comes back with
/// `RETURNING` (a database without it reports the epoch its own way, see its `LockSql`).
pub async fn bump_epoch_returning(db: &Db, set: Sql, filter: Sql) -> anyhow::Result<Option<i64>> {
    let mut q = Sql::new("UPDATE outbox_relay_lease SET ");
    q.append(set)
        .push(", epoch = epoch + 1 WHERE ")
        .append(filter)
        .push(" RETURNING epoch");
    let row = db.query(q).fetch_optional(db.pool()).await?;
    Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?)
}

/// The lease row `name`: holder, epoch and time left (negative once expired).
pub async fn lease_row(db: &Db, name: &str) -> anyhow::Result<Option<LeaseRow>> {
    let mut q = Sql::new(&format!(
        "SELECT holder, epoch, -({}) FROM outbox_relay_lease WHERE name = ",
        db.syntax().age_ms("lease_until")
    ));
    q.text(name);
    db.query(q)
        .fetch_optional(db.pool())
        .await?
        .map(|r| -> anyhow::Result<LeaseRow> {
            Ok(LeaseRow {
                holder: r.try_get(0)?,
                epoch: r.try_get(1)?,
                remaining_ms: r.try_get(2)?,
            })
        })
        .transpose()
}

impl Hold<'_> {
    /// Appends ` WHERE` for this hold's row: the name, the holder and the epoch.
    fn filter(&self, q: &mut Sql) {
        q.push(" WHERE name = ")
            .text(self.name)
            .push(" AND holder = ")
            .text(self.holder)
            .push(" AND epoch = ")
            .int(self.epoch);
    }
}
