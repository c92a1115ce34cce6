//! The lock tables: `outbox_relay_lease` (the `database` lease backend's row, and the fencing
//! epoch of every backend; `lease_table.rs`) and ShedLock's table, shared with Spring
//! pollers (`shedlock.rs`). MySQL's `GET_LOCK` sessions are MySQL's own (`store/mysql/`).
//! What differs between databases is each one's [`LockSql`].

pub mod lease_table;
pub mod shedlock;

use std::time::Duration;

use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::sql::Sql;

/// The lease module's seam: the `outbox_relay_lease` row, which holds the `database`
/// backend's lease and every backend's fencing epoch.
pub trait LeaseTable: Send + Sync {
    /// `database` lease backend: takes the lease if it is free or expired (on the database
    /// clock), bumping the epoch. Returns the new epoch, or `None` if someone else holds it.
    fn lease_acquire<'a>(&'a self, name: &'a str, holder: &'a str, ttl: Duration) -> Epoch<'a>;
    /// Extends the lease if its holder still holds it at its epoch; false means it is lost.
    fn lease_renew<'a>(&'a self, hold: Hold<'a>, ttl: Duration) -> Answer<'a, bool>;
    /// Gives the lease up if still held.
    fn lease_release<'a>(&'a self, hold: Hold<'a>) -> Answer<'a, ()>;
    /// For leases held elsewhere (Redis): records `holder` and bumps the epoch, fencing off
    /// every earlier holder's claims. Returns the new epoch.
    fn advance_epoch<'a>(&'a self, name: &'a str, holder: &'a str) -> Answer<'a, i64>;
    /// A cheap round trip (the `database` backend's readiness).
    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>>;
}

/// What a lease-table statement answers, once it has run.
pub type Answer<'a, T> = BoxFuture<'a, anyhow::Result<T>>;

/// The lease's new epoch, if the statement changed its row.
pub type Epoch<'a> = Answer<'a, Option<i64>>;

/// One hold of the lease row `name`: who took it and the epoch that taking bumped to. Only
/// this hold renews or releases it; a later taker's epoch differs.
#[derive(Debug, Clone, Copy)]
pub struct Hold<'a> {
    pub name: &'a str,
    pub holder: &'a str,
    pub epoch: i64,
}

impl<'a> Hold<'a> {
    pub fn new(name: &'a str, holder: &'a str, epoch: i64) -> Hold<'a> {
        Hold {
            name,
            holder,
            epoch,
        }
    }
}

/// What the lock tables' statements are on one database.
pub trait LockSql: Send + Sync {
    /// `UPDATE outbox_relay_lease SET {set}, epoch = epoch + 1 WHERE {filter}` and the new
    /// epoch, in one statement (see `lease_table.rs`). By default with `RETURNING`.
    fn bump_epoch<'a>(&'a self, db: &'a Db, set: Sql, filter: Sql) -> Epoch<'a> {
        Box::pin(lease_table::bump_epoch_returning(db, set, filter))
    }

    /// How a row is inserted unless one with the same key exists: (the statement's start,
    /// its end after `VALUES (...)`).
    fn insert_if_absent(&self, key: &str) -> (&'static str, String) {
        ("INSERT INTO", format!(" ON CONFLICT ({key}) DO NOTHING"))
    }

    /// ShedLock's "now" on the database clock: UTC shifted by `offset_minutes`.
    fn shedlock_now(&self, offset_minutes: i32) -> String;

    /// Appends ShedLock's "now + `ms` milliseconds" (see [`LockSql::shedlock_now`]).
    fn shedlock_now_plus(&self, q: &mut Sql, offset_minutes: i32, ms: i64);

    /// The type of ShedLock's time columns, as ShedLock's documented schema has it.
    fn shedlock_time_type(&self) -> &'static str;

    /// Milliseconds from `now` to `lock_until` (an integer expression).
    fn shedlock_left(&self, now: &str) -> String;

    /// Statements to run on the connection before and after a ShedLock statement, where the
    /// session's settings must match the Java side's (a time zone): (enter, leave).
    fn shedlock_session(&self) -> Option<(&'static str, &'static str)> {
        None
    }
}
