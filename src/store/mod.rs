//! The outbox table and the lease table, on PostgreSQL, MySQL 8 / MariaDB 10.6+ and SQLite.
//!
//! Laid out by database and by caller (docs/design.md, "Code layout"):
//! - the shared part: `model.rs` (the values that cross the seams), `fault.rs` (which errors
//!   pass), `sql/` (the dialect and its syntax, the statement builder, identifiers, the
//!   table's columns) and `db/` (the handle every statement goes through, and opening it);
//! - the callers, each defining what it needs from a database: `claim/` (claims and the idle
//!   read), `queue/` (the relay's seam [`Queue`], results, arrivals, the database thread),
//!   `schema/` (migrations, the live check, `migrate --adopt`), `locks/` (the lease table and
//!   ShedLock's, the lease module's seam [`LeaseTable`]), `admin/` (the operator's queries);
//! - one folder per database, implementing those: `postgres/`, `mysql/`, `sqlite/`;
//! - `engine.rs`, which picks the folder for a dialect, and [`SqlStore`] (`sql_store.rs`),
//!   which the rest of the relay holds.
//!
//! Guarantees (G1, G2; docs/design.md, "Claims" and "Results"):
//! - a claim takes only rows that are due, unclaimed or whose claim expired, and (with a
//!   [`Fence`]) only while the stored lease epoch is still the claimer's: the database itself
//!   refuses a stale holder (G2);
//! - a claim carries a fresh `claim_token` and a `claimed_until` on the database clock; every
//!   result write is guarded by that token, so a write from a holder whose claim expired and was
//!   taken by someone else changes no row (G2);
//! - rows with the same `ordering_key` are claimable one at a time, in id order;
//! - claims and result writes are batched: one claim statement per batch, one result statement
//!   per outcome kind (each row under its own claim token), never one statement per row on
//!   the happy path.

mod admin;
mod claim;
mod db;
mod engine;
mod fault;
mod locks;
mod model;
mod mysql;
mod postgres;
mod queue;
mod schema;
mod sql;
mod sql_store;
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

pub use admin::NO_AGE;
pub use admin::console::MAX_PAGE;
pub use db::WARM_CONNECTIONS;
pub use fault::is_transient;
pub use locks::shedlock::{ShedLock, ShedLockTable};
pub use locks::{Answer, Epoch, Hold, LeaseTable};
pub use model::*;
pub use mysql::get_lock::LockSession;
pub use postgres::notify::listen;
pub use queue::arrivals::{Arrivals, NEW_ROWS_CHECK, watch_new_rows};
pub use queue::db_thread::{OnDbThread, on_db_thread};
pub use queue::{Failure, Queue, WriteError};
pub use schema::adopt::Plan as AdoptPlan;
pub use schema::check::Problem;
pub use sql::ident::bare;
pub use sql::{Columns, Dialect, Owned, State};
pub use sql_store::SqlStore;

/// The per-row decoding of a claim, for the fuzz targets only (`fuzzing`).
#[doc(hidden)]
pub use claim::returned::to_claimed;
/// The condition that `e` is one of `ids` as `dialect`'s statements write a set of the
/// relay's ids (a claim's rows, a result write's), values inline: for the tests that run it
/// on a real server.
#[doc(hidden)]
pub fn ids_condition(dialect: Dialect, e: &str, ids: &[i64]) -> Option<String> {
    let mut q = sql::Sql::new("");
    q.one_of_ids(engine::engine(dialect), e, ids);
    q.inlined()
}

pub use claim::plan::newest_share;
pub use claim::rule;
/// The claim rule over rows in memory: the model the tests share (see its module doc).
pub use claim::{LONGEST_RUN, RUN};

/// Opens the store for `url` with `table`, without migrating.
pub async fn connect(
    url: &str,
    table: &str,
    max_connections: u32,
    connect_timeout: Duration,
) -> anyhow::Result<Arc<SqlStore>> {
    Ok(Arc::new(
        SqlStore::connect(url, table, max_connections, connect_timeout).await?,
    ))
}

/// Opens the store for `url` on `table`, mapped by `[table]` (the relay's own table when it
/// sets nothing), without migrating, with up to `open` connections opened side by side.
pub async fn connect_mapped(
    url: &str,
    table: &str,
    mapping: &crate::config::TableSettings,
    max_connections: u32,
    connect_timeout: Duration,
    open: u32,
) -> anyhow::Result<Arc<SqlStore>> {
    let store =
        SqlStore::connect_opening(url, table, max_connections, connect_timeout, open).await?;
    let store = store
        .with_columns(Columns::from_settings(mapping))
        .read_live_types()
        .await;
    Ok(Arc::new(store))
}
