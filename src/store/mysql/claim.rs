//! The MySQL/MariaDB claim. The reads go through the index of unfinished rows
//! (`open_index.rs`), named with `FORCE INDEX`; the claim of the chosen rows is one short
//! transaction: the fence, a locking read of the chosen rows by primary key, a recheck of
//! their keys, then an `UPDATE` (MySQL has no `UPDATE ... RETURNING`).
//!
//! Guarantees, beyond those of every claim (`store/claim/`):
//! - in leader mode the lease epoch is checked inside the transaction, under a shared lock
//!   held until it commits (see [`fence_holds`]);
//! - a claim locks only the rows it takes, through the primary key, so claimers never wait
//!   on rows another one merely read (docs/design.md, "Claims on MySQL/MariaDB");
//! - a keyed row is claimed only if every earlier unfinished row of its key is still taken by
//!   the same claim when the rows are locked (see `key_check.rs`).

use sqlx::any::AnyRow;

use super::batch::TextTx;
use super::open_index::{self, OPEN_CHANNEL, OPEN_KEY, index};
use super::{MySql, key_check};
use crate::BoxFuture;
use crate::store::claim::plan::{ChannelRead, GapRead, KeyRef};
use crate::store::claim::returned::select_list;
use crate::store::claim::{ClaimSql, Found, Rows, free_and_open, gap_rows, ids_of, set_claimed};
use crate::store::db::Db;
use crate::store::model::{ClaimRequest, Fence};
use crate::store::queue::results::ResultSql;
use crate::store::sql::{Sql, Stmt};

impl ClaimSql for MySql {
    fn channel_rows(&self, db: &Db, w: &ChannelRead) -> Sql {
        let (t, id) = (db.table(), &db.cols().id);
        let mut q = Sql::new(&format!(
            " FROM {t} o FORCE INDEX ({}) WHERE o.{OPEN_CHANNEL} = ",
            index(db, "open_idx")
        ));
        q.text(w.channel);
        if let Some(from) = w.from {
            q.push(&format!(" AND o.{id} > ")).int(from);
        }
        let desc = if w.newest { " DESC" } else { "" };
        q.push(&format!(" ORDER BY o.{id}{desc} LIMIT {}", w.rows));
        q
    }

    /// `open_key` is a string column whatever the key column's type, so the key's text
    /// compares with it as it is.
    /// A parenthesized member: MariaDB plans a `UNION ALL` of derived tables in time that grows
    /// faster than their number (129 parts: 64 ms on an empty table, against 4 ms
    /// parenthesized; docs/design.md, "Keyed backlogs on MySQL/MariaDB").
    fn member(&self, _i: usize, select: Sql) -> Sql {
        let mut q = Sql::new("(");
        q.append(select).push(")");
        q
    }

    /// Runs of consecutive ids as ranges (docs/design.md, "Id sets as ranges on
    /// MySQL/MariaDB").
    fn one_of(&self, q: &mut Sql, e: &str, ids: &[i64]) {
        q.one_of_ids(self, e, ids);
    }

    /// Each key's read is a member of the read's own; the rows read ahead of every freed key
    /// are one member by id (docs/design.md, "Ordering keys: rows read ahead").
    fn freed_keys_from_rows_ahead(&self) -> bool {
        true
    }

    fn key_rows(&self, db: &Db, key: &KeyRef, after: Option<i64>, rows: u32) -> Sql {
        let (t, id) = (db.table(), &db.cols().id);
        let mut q = Sql::new(&format!(
            " FROM {t} o FORCE INDEX ({}) WHERE o.{OPEN_KEY} = ",
            index(db, "open_key_idx")
        ));
        q.text(&key.key);
        if let Some(after) = after {
            q.push(&format!(" AND o.{id} > ")).int(after);
        }
        q.push(&format!(" ORDER BY o.{id} LIMIT {rows}"));
        q
    }

    fn unserved_rows(&self, db: &Db, gap: &GapRead, claimable: &str) -> Sql {
        let from = format!("{} o FORCE INDEX ({})", db.table(), index(db, "open_idx"));
        let claimable = format!("{claimable} AND o.{OPEN_CHANNEL} IS NOT NULL");
        gap_rows(db, &from, &format!("o.{OPEN_CHANNEL}"), gap, &claimable)
    }

    /// A NULL channel is `''` in `open_channel`: the first gap between served channels reads
    /// it.
    fn null_channel_rows(&self, db: &Db, _rows: u32, _claimable: &str) -> Sql {
        Sql::new(&format!(" FROM {} o WHERE 1 = 0", db.table()))
    }

    /// The key's first entry in the index of unfinished keys is `a` itself: one index step.
    /// (An earlier row looked for with `a`'s id as a bound reads every entry of the key on
    /// one side of `a`: MariaDB does not bound an index range by a correlated value.)
    fn head(&self, db: &Db, a: &str) -> String {
        let (t, id) = (db.table(), &db.cols().id);
        format!(
            "(SELECT p.{id} FROM {t} p FORCE INDEX ({}) \
             WHERE p.{OPEN_KEY} = {a}{OPEN_KEY} ORDER BY p.{id} LIMIT 1) = {a}{id}",
            index(db, "open_key_idx")
        )
    }

    /// The key's last entry in the index of unfinished keys is `a` itself: one index step
    /// from the key's end.
    fn last_of_key(&self, db: &Db, a: &str) -> Option<String> {
        let (t, id) = (db.table(), &db.cols().id);
        Some(format!(
            "(SELECT p.{id} FROM {t} p FORCE INDEX ({}) \
             WHERE p.{OPEN_KEY} = {a}{OPEN_KEY} ORDER BY p.{id} DESC LIMIT 1) = {a}{id}",
            index(db, "open_key_idx")
        ))
    }

    fn claim_ids<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        ids: &'a [i64],
        found: &'a Found,
    ) -> Rows<'a> {
        Box::pin(claim(db, req, ids, found))
    }

    /// On the relay's own table the index of unfinished rows says whether any is due (a
    /// mapped table's index has no `next_attempt_at`).
    fn maybe_due<'a>(&'a self, db: &'a Db) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move {
            match db.cols().mapped {
                true => Ok(true),
                false => open_index::anything_due(db).await,
            }
        })
    }
}

/// Result writes select their rows the default way.
impl ResultSql for MySql {}

/// The claim of `ids`: the fence, a locking read of those still claimable (`SKIP LOCKED`
/// where the server has it), the recheck of their keys, the `UPDATE`, in one transaction of
/// two round trips: the fence, the lock and the check of the keys the read gave the rows
/// (`key_check::early_check`) are sent with its `START TRANSACTION`, the `UPDATE` with its `COMMIT`
/// (docs/design.md, "Statements as text on MySQL/MariaDB").
async fn claim(
    db: &Db,
    req: &ClaimRequest,
    ids: &[i64],
    found: &Found,
) -> anyhow::Result<Vec<AnyRow>> {
    let lock = if db.dialect().skip_locked() {
        "FOR UPDATE SKIP LOCKED"
    } else {
        "FOR UPDATE"
    };
    // The ordering keys are checked by the key check (sent with the lock, or after it), not
    // here: a constant range per key.
    let claimable = free_and_open(db);
    // With a key, its `open_key` too: the check after the lock reads each key's range by it.
    let key = match db.cols().ordering_key {
        Some(_) => format!(", o.{OPEN_KEY}"),
        None => String::new(),
    };
    let mut q = Sql::new(&format!(
        "SELECT {}{key} FROM {} o WHERE ",
        select_list(db, "o.", req),
        db.table(),
    ));
    q.one_of_ids(db.syntax(), &format!("o.{}", db.cols().id), ids)
        .push(&format!(" AND {claimable} {lock}"));
    let mut first: Vec<Stmt> = req.fence.iter().map(|f| db.query(fence(f))).collect();
    first.push(db.query(q));
    let early = key_check::early_check(db, req, ids, found).map(|(early, check)| {
        first.push(db.query(check));
        early
    });
    let (mut tx, mut read) = TextTx::begin(db, first).await?;
    let checked = early.map(|e| (e, read.pop().unwrap_or_default()));
    let mut rows = read.pop().unwrap_or_default();
    // The fence's row, where there is a fence: the lease epoch is still the claimer's.
    if req.fence.is_some() && read.pop().is_none_or(|fence| fence.is_empty()) {
        tx.rollback().await?;
        return Ok(Vec::new());
    }
    if !rows.is_empty() {
        key_check::leave_rows_behind_their_key(db, req, &mut rows, tx.conn(), checked).await?;
    }
    let last = match rows.is_empty() {
        true => Vec::new(),
        false => vec![db.query(mark_claimed(db, req, &rows))],
    };
    tx.commit(last).await?;
    Ok(rows)
}

/// Marks `rows` claimed by `req`'s claimer and token until `now + ttl`.
fn mark_claimed(db: &Db, req: &ClaimRequest, rows: &[AnyRow]) -> Sql {
    let mut u = Sql::new(&format!("UPDATE {} SET ", db.table()));
    set_claimed(&mut u, db, req).push(" WHERE ").one_of_ids(
        db.syntax(),
        &db.cols().id,
        &ids_of(rows),
    );
    u
}

/// Inside the claim's transaction: the lease's row if its epoch is still the claimer's,
/// holding a shared lock on it until the claim commits (a new holder's epoch bump waits for
/// it, and later claims of the old holder see the bump).
fn fence(f: &Fence) -> Sql {
    let mut q = Sql::new("SELECT epoch FROM outbox_relay_lease WHERE name = ");
    q.text(&f.lease)
        .push(" AND epoch = ")
        .int(f.epoch)
        .push(" LOCK IN SHARE MODE");
    q
}
