//! SQLite's claims and idle reads. The claim is one `UPDATE ... RETURNING` of the chosen
//! rows, found by their ids ([`claim_statement`]); the idle read asks an index of due times
//! first ([`SqliteClaims::anything_due`]). SQLite's planner takes the partial indexes of
//! unfinished rows by channel and by key for the reads' plain equalities, so the default
//! channel and key reads serve; where a statement has no such equality it has no statistics
//! to choose by, and names its index (the unserved channels' read).

use std::sync::Mutex;

use sqlx::Row;
use std::time::{Duration, Instant};

use super::Sqlite;
use crate::BoxFuture;
use crate::store::claim::plan::GapRead;
use crate::store::claim::read::{KeyRead, claimable};
use crate::store::claim::returned::select_list;
use crate::store::claim::{ClaimSql, Found, Rows, claimable_for, gap_rows, set_claimed};
use crate::store::db::Db;
use crate::store::model::ClaimRequest;
use crate::store::queue::results::ResultSql;
use crate::store::sql::Sql;

/// Result writes select their rows the default way.
impl ResultSql for Sqlite {}

/// One store's SQLite claims: when an idle read last read the windows themselves, not only
/// the index of due times.
#[derive(Default)]
pub struct SqliteClaims {
    full_read_at: Mutex<Option<Instant>>,
}

impl ClaimSql for SqliteClaims {
    /// The keys as one JSON value (the statement's text is the same for any number of keys),
    /// each read by the same walk of the index of unfinished rows by key as
    /// [`ClaimSql::key_rows`]'s, in a correlated subquery; SQLite takes no limit from an outer
    /// row, so each key reads as many rows as the longest part asks (the choice takes no more
    /// than its run).
    fn keys_at_once(&self, db: &Db, keys: &[KeyRead]) -> Option<Sql> {
        let (t, c) = (db.table(), db.cols());
        let (k, id) = (c.ordering_key.as_deref()?, &c.id);
        let parts: Vec<serde_json::Value> = keys
            .iter()
            .map(|r| serde_json::json!([r.part, r.key.key, r.after.unwrap_or(i64::MIN)]))
            .collect();
        let rows = keys.iter().map(|r| r.rows).max().unwrap_or(1);
        let mut q = Sql::new(
            " FROM (SELECT value ->> 0 AS part, value ->> 1 AS okey, value ->> 2 AS afterid \
             FROM json_each(",
        );
        q.text(&serde_json::Value::Array(parts).to_string())
            .push(&format!(
                ")) kp JOIN {t} o ON o.{id} IN (SELECT q.{id} FROM {t} q WHERE q.{k} = kp.okey \
                 AND q.{id} > kp.afterid AND {} ORDER BY q.{id} LIMIT ",
                c.open("q.")
            ))
            .int(i64::from(rows))
            .push(")");
        Some(q)
    }

    /// The keys as one JSON value: the statement's text stays the same for any number of
    /// them.
    fn one_of_keys(&self, q: &mut Sql, e: &str, keys: &[String]) {
        q.push(&format!("{e} IN (SELECT value FROM json_each("))
            .text(&serde_json::json!(keys).to_string())
            .push("))");
    }

    /// Ids as one JSON value: the statement's text stays the same for any set of them, so
    /// SQLite prepares it once.
    fn one_of(&self, q: &mut Sql, e: &str, ids: &[i64]) {
        q.push(&format!("{e} IN (SELECT value FROM json_each("))
            .text(&json_ids(ids))
            .push("))");
    }

    /// Through the index of unfinished rows by channel, named: SQLite's planner, with no
    /// statistics of the table, took the status index for the more selective, and walked and
    /// sorted every unfinished row each time the unserved channels were looked for
    /// (docs/design.md, "Claims on SQLite"). The index is the relay's: `migrate` creates it on
    /// its own table, `migrate --adopt` on a mapped one, and the relay does not start without
    /// it.
    fn unserved_rows(&self, db: &Db, gap: &GapRead, claimable: &str) -> Sql {
        let (_, index) = db.object("channel_due_idx");
        let from = format!("{} o INDEXED BY {index}", db.table());
        gap_rows(db, &from, &db.cols().channel("o."), gap, claimable)
    }

    /// One `UPDATE ... RETURNING` of the chosen rows still claimable ([`claim_statement`]).
    fn claim_ids<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        ids: &'a [i64],
        _found: &'a Found,
    ) -> Rows<'a> {
        Box::pin(async move {
            let q = claim_statement(self, db, req, ids);
            Ok(db.query(q).fetch_all(db.pool()).await?)
        })
    }

    /// The plans of the claim and of the unserved channels' read, for the test that neither
    /// walks the backlog (`store::backlog`).
    fn plans<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        ids: &'a [i64],
        below: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<[Vec<String>; 2]>>> {
        Box::pin(async move {
            let mut claim = Sql::new("EXPLAIN QUERY PLAN ");
            claim.append(claim_statement(self, db, req, ids));
            let gap = GapRead {
                above: None,
                below: Some(below),
                rows: 32,
            };
            let mut unserved = Sql::new(&format!("EXPLAIN QUERY PLAN SELECT o.{}", db.cols().id));
            unserved.append(self.unserved_rows(db, &gap, &claimable(db, self)));
            let mut plans = [Vec::new(), Vec::new()];
            for (plan, q) in plans.iter_mut().zip([claim, unserved]) {
                let rows = db.query(q).fetch_all(db.pool()).await?;
                *plan = (rows.iter())
                    .map(|r| r.try_get::<String, _>(3).unwrap_or_default())
                    .collect();
            }
            Ok(Some(plans))
        })
    }

    /// On the relay's own table the index of due times says whether any unfinished row may
    /// be due (a mapped table has no such index).
    fn maybe_due<'a>(&'a self, db: &'a Db) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move { Ok(db.cols().mapped || self.anything_due(db).await) })
    }
}

impl SqliteClaims {
    /// SQLite, on the relay's own table: whether any unfinished row may be due, from
    /// `next_attempt_idx` alone (schema version 10). The idle read asks this first. The picks
    /// walk a channel's unfinished rows in id order and read each row's `next_attempt_at`: over
    /// 100,000 rows waiting for a retry an hour away each idle read took about 20 ms, twice a
    /// second (docs/design.md, "Idle cost").
    ///
    /// "No" must never hide a claimable row. The claim counts a row as due when its time has
    /// come or when its `next_attempt_at` is not a time at all (an application's typo, which the
    /// claim takes so that it can be failed; `Syntax::due`). The seek finds times that have
    /// come, anything stored as a number (numbers sort before text), and text from `'9999'` up
    /// (which covers text starting with a letter, and blobs). Text starting with a digit that is
    /// still not a time and sorts after now (`'2099-13-45'`) is not found by the seek; for it the
    /// picks are read anyway at least every [`FULL_READ_EVERY`] (and on the first idle read),
    /// so such a row waits at most that long on an idle relay, and not at all on a busy one,
    /// whose claims do not ask. "Yes" promises nothing (the due row may be claimed, or behind
    /// its key), so the picks are read next.
    pub async fn anything_due(&self, db: &Db) -> bool {
        let now = Instant::now();
        let read_anyway = match self.full_read_at.lock() {
            Ok(at) => full_read_due(*at, now),
            Err(_) => true,
        };
        let due = read_anyway || seek_due(db).await;
        if due && let Ok(mut at) = self.full_read_at.lock() {
            *at = Some(now);
        }
        due
    }
}

/// The claim of `ids` for `req`: one `UPDATE ... RETURNING` of those still claimable. In
/// leader mode the statement checks the lease epoch itself (it runs under the database's
/// single write lock, so the check and the claim cannot disagree).
///
/// The chosen ids drive the statement: they are one JSON value read as a table joined first
/// (`CROSS JOIN` fixes the order), each row then found by its id. Written as
/// `o.id IN (...) AND o.status IN (...)`, SQLite's planner, which has no statistics of the
/// table, took the status index for the more selective and walked every unfinished row for
/// each claim: a claim's cost grew with the backlog (docs/design.md, "Claims on SQLite").
fn claim_statement(sql: &SqliteClaims, db: &Db, req: &ClaimRequest, ids: &[i64]) -> Sql {
    let (t, id) = (db.table(), &db.cols().id);
    let in_chosen = |e: &str| format!("{e} IN (SELECT c.id FROM {CHOSEN} c)");
    let claimable = claimable_for(db, sql, &in_chosen, req);
    let mut q = Sql::new(&format!(
        "WITH {CHOSEN}(id) AS (SELECT value FROM json_each("
    ));
    q.text(&json_ids(ids)).push(&format!(")) UPDATE {t} SET "));
    set_claimed(&mut q, db, req)
        .push(&format!(
            " WHERE {id} IN (SELECT o.{id} FROM {CHOSEN} l CROSS JOIN {t} o ON o.{id} = l.id \
             WHERE "
        ))
        .append(claimable);
    if let Some(f) = &req.fence {
        q.push(" AND EXISTS (SELECT 1 FROM outbox_relay_lease WHERE name = ")
            .text(&f.lease)
            .push(" AND epoch = ")
            .int(f.epoch)
            .push(")");
    }
    q.push(&format!(") RETURNING {}", select_list(db, "", req)));
    q
}

/// The claim's table of its chosen ids (a name no table of the relay's or of an
/// application's is expected to take: a table of that name would be hidden in the claim).
const CHOSEN: &str = "outbox_relay_chosen";

/// `ids` as a JSON array, `[1,2,3]`.
fn json_ids(ids: &[i64]) -> String {
    let list: Vec<String> = ids.iter().map(i64::to_string).collect();
    format!("[{}]", list.join(","))
}

/// The longest an idle relay goes without reading the picks themselves, whatever
/// [`SqliteClaims::anything_due`]'s index says (see there).
const FULL_READ_EVERY: Duration = Duration::from_secs(60);

/// The two seeks of [`SqliteClaims::anything_due`]: whether `next_attempt_idx` holds a time
/// that has come, or a value from `'9999'` up.
async fn seek_due(db: &Db) -> bool {
    let (t, now) = (db.table(), db.syntax().now());
    // Each seek is one range: with the two ranges in one OR, SQLite scanned the whole index.
    let seek = |range: &str| {
        format!(
            "SELECT 1 FROM (SELECT 1 FROM {t} INDEXED BY {t}_next_attempt_idx \
             WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at {range} LIMIT 1)"
        )
    };
    let sql = format!(
        "{} UNION ALL {} LIMIT 1",
        seek(&format!("<= {now}")),
        seek(">= '9999'")
    );
    match db.sql(&sql).fetch_optional(db.pool()).await {
        Ok(row) => row.is_some(),
        // No answer is no "no": the picks are read, and say what is wrong if anything is (a
        // table below version 10, with `database.migrate = false`, lacks the index).
        Err(e) => {
            tracing::debug!(error = %e, "the index of due times could not be read; reading the picks");
            true
        }
    }
}

/// Whether the picks are to be read whatever the index says: never read yet, or not for
/// [`FULL_READ_EVERY`].
fn full_read_due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= FULL_READ_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_picks_are_read_first_and_then_at_least_every_minute() {
        let t0 = Instant::now();
        assert!(full_read_due(None, t0));
        assert!(!full_read_due(Some(t0), t0));
        assert!(!full_read_due(Some(t0), t0 + FULL_READ_EVERY / 2));
        assert!(full_read_due(Some(t0), t0 + FULL_READ_EVERY));
        // A clock read before the last read (another task's) is not a minute later.
        assert!(!full_read_due(Some(t0 + FULL_READ_EVERY), t0));
    }
}
