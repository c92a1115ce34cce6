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
//!   the same claim when the rows are locked (see [`leave_rows_behind_their_key`]).

use std::collections::{BTreeSet, HashMap, HashSet};

use sqlx::Row;
use sqlx::any::AnyRow;

use super::MySql;
use super::open_index::{self, OPEN_CHANNEL, OPEN_KEY, index};
use crate::BoxFuture;
use crate::store::claim::plan::{ChannelRead, GapRead, KeyRef};
use crate::store::claim::returned::{has_ordering_key, select_list};
use crate::store::claim::{ClaimSql, Rows, free_and_open, ids_of};
use crate::store::db::Db;
use crate::store::model::ClaimRequest;
use crate::store::queue::results::ResultSql;
use crate::store::sql::Sql;

/// The transaction a claim runs in.
type Tx<'t> = sqlx::Transaction<'t, sqlx::Any>;

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

    /// A member per key costs the read's planning 60-90 µs (no `LATERAL` to read them all
    /// in one): keys in flight are read a run at a time and the rest by id
    /// (docs/design.md, "Ordering keys: rows read ahead").
    fn reads_ahead(&self) -> bool {
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
        let (t, id) = (db.table(), &db.cols().id);
        let mut q = Sql::new(&format!(
            " FROM {t} o FORCE INDEX ({}) WHERE {claimable} AND o.{OPEN_CHANNEL} IS NOT NULL",
            index(db, "open_idx")
        ));
        if let Some(above) = gap.above {
            q.push(&format!(" AND o.{OPEN_CHANNEL} > ")).text(above);
        }
        if let Some(below) = gap.below {
            q.push(&format!(" AND o.{OPEN_CHANNEL} < ")).text(below);
        }
        q.push(&format!(
            " ORDER BY o.{OPEN_CHANNEL}, o.{id} LIMIT {}",
            gap.rows
        ));
        q
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

    fn claim_ids<'a>(&'a self, db: &'a Db, req: &'a ClaimRequest, ids: &'a [i64]) -> Rows<'a> {
        Box::pin(claim(db, req, ids))
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
/// where the server has it), the recheck of their keys, the `UPDATE`.
async fn claim(db: &Db, req: &ClaimRequest, ids: &[i64]) -> anyhow::Result<Vec<AnyRow>> {
    let lock = if db.dialect().skip_locked() {
        "FOR UPDATE SKIP LOCKED"
    } else {
        "FOR UPDATE"
    };
    let mut tx = db.pool().begin().await?;
    if !fence_holds(db, req, &mut tx).await? {
        tx.rollback().await?;
        return Ok(Vec::new());
    }
    // Integers from this claim's own choice, not user text: safe in the SQL.
    let list = ids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    // The ordering keys are checked after the lock (below), a constant range per key.
    let claimable = free_and_open(db);
    // With a key, its `open_key` too: the check after the lock reads each key's range by it.
    let key = match db.cols().ordering_key {
        Some(_) => format!(", o.{OPEN_KEY}"),
        None => String::new(),
    };
    let q = Sql::new(&format!(
        "SELECT {}{key} FROM {} o WHERE o.{} IN ({list}) AND {claimable} {lock}",
        select_list(db, "o.", req),
        db.table(),
        db.cols().id
    ));
    let mut rows = db.query(q).fetch_all(&mut *tx).await?;
    if !rows.is_empty() {
        leave_rows_behind_their_key(db, req, &mut rows, &mut tx).await?;
    }
    if !rows.is_empty() {
        mark_claimed(db, req, &rows, &mut tx).await?;
    }
    tx.commit().await?;
    Ok(rows)
}

/// Leaves out of `rows` each keyed row whose nearest earlier unfinished row of its key is
/// neither in `rows` (and claimed with it) nor one of `req`'s tails held by its claimer under
/// a live claim (docs/design.md, "Ordering keys: chains"). A row behind a row left out is
/// left out too.
///
/// The ordering keys are checked here, after the lock, not in the locking read: a plain
/// look for an earlier row of the same key inside the locking read reads the snapshot taken
/// when it first ran, while the lock reads the newest committed rows. Two rows of one key
/// written in one transaction (an application recording two events of an order at once) and
/// committed meanwhile were both claimed and sent at once (found by the chaos run;
/// PostgreSQL reads both sides from one snapshot, SQLite has one writer). Sessions run at
/// READ COMMITTED, so this statement sees what is committed when it runs; the earlier rows and
/// the tails held are read by this one statement ([`earlier_rows`]), so a tail whose result
/// is written meanwhile is seen either held or finished, never both. Rows left out are not
/// claimed, their locks released at commit. See docs/design.md, "Claims on MySQL/MariaDB".
async fn leave_rows_behind_their_key(
    db: &Db,
    req: &ClaimRequest,
    rows: &mut Vec<AnyRow>,
    tx: &mut Tx<'_>,
) -> anyhow::Result<()> {
    if db.cols().ordering_key.is_none() {
        return Ok(());
    }
    // Each key's chosen rows, by the key as `open_key` holds it (read by the locking read).
    let mut chosen: HashMap<String, BTreeSet<i64>> = HashMap::new();
    for r in rows.iter().filter(|r| has_ordering_key(r)) {
        let key = r.try_get::<Option<String>, _>(OPEN_KEY).ok().flatten();
        if let (Ok(id), Some(key)) = (r.try_get::<i64, _>(0), key) {
            chosen.entry(key).or_default().insert(id);
        }
    }
    // Keys in statements of at most KEYS_PER_CHECK ranges (`batch_size` goes to 10,000): past
    // `range_optimizer_max_mem_size` the server would scan the whole index instead.
    let mut blocked = HashSet::new();
    let keys: Vec<(String, BTreeSet<i64>)> = chosen.into_iter().collect();
    for part in keys.chunks(KEYS_PER_CHECK) {
        let part: HashMap<String, BTreeSet<i64>> = part.iter().cloned().collect();
        let earlier = earlier_rows(db, req, &part, tx).await?;
        blocked.extend(behind_their_key(&part, &earlier));
    }
    if !blocked.is_empty() {
        tracing::debug!(
            ?blocked,
            "chosen rows behind an earlier row of their key left alone"
        );
        rows.retain(|r| {
            r.try_get::<i64, _>(0)
                .map_or(true, |id| !blocked.contains(&id))
        });
    }
    Ok(())
}

/// Most keys one check statement reads (a range each).
const KEYS_PER_CHECK: usize = 500;

/// What [`earlier_rows`] read: each chosen key's unfinished rows before its last chosen row,
/// and the offered tails held by the claimer under a live claim.
#[derive(Debug, Default)]
struct Earlier {
    open: HashMap<String, BTreeSet<i64>>,
    held_tails: HashSet<i64>,
}

/// Reads, in one statement, the unfinished rows of each key of `chosen` before its last
/// chosen row, and which of `req`'s tails the claimer holds under a live claim. The rows are
/// one range scan of `open_key_idx` with a constant range per key ([`check_groups`]; a
/// correlated bound, as in a subquery per row, reads every entry of the key behind the row:
/// MariaDB does not bound an index range by a correlated value). A chosen row is a head or
/// follows the claimer's own rows in flight, so the ranges hold little more than those
/// (docs/design.md, "Keyed backlogs on MySQL/MariaDB").
async fn earlier_rows(
    db: &Db,
    req: &ClaimRequest,
    chosen: &HashMap<String, BTreeSet<i64>>,
    tx: &mut Tx<'_>,
) -> anyhow::Result<Earlier> {
    let (t, id) = (db.table(), &db.cols().id);
    let mut q = Sql::new(&format!(
        "SELECT o.{id}, o.{OPEN_KEY} FROM {t} o FORCE INDEX ({}) WHERE ",
        index(db, "open_key_idx")
    ));
    for (i, (keys, below)) in check_groups(chosen).into_iter().enumerate() {
        q.push(if i > 0 { " OR (" } else { "(" });
        q.push(&format!("o.{OPEN_KEY} IN (")).texts(&keys);
        q.push(&format!(") AND o.{id} < ")).int(below).push(")");
    }
    if !req.tails.is_empty() {
        // The tails this claimer holds under a live claim, as rows with no key.
        q.push(&format!(
            " UNION ALL SELECT h.{id}, NULL FROM {t} h WHERE h.{id} IN ("
        ));
        q.ints(req.tails.iter().map(|t| t.row))
            .push(") AND h.claimed_by = ")
            .text(&req.claimer)
            .push(&format!(" AND h.claimed_until > {}", db.syntax().now()));
    }
    let mut earlier = Earlier::default();
    for r in db.query(q).fetch_all(&mut **tx).await? {
        let row = r.try_get::<i64, _>(0)?;
        match r.try_get::<Option<String>, _>(1)? {
            Some(key) => earlier.open.entry(key).or_default().insert(row),
            None => earlier.held_tails.insert(row),
        };
    }
    Ok(earlier)
}

/// Widest span of last chosen ids one group of [`check_groups`] covers: past its keys' last
/// chosen rows, a group's range reads at most this many ids' entries, whatever the keys.
const CHECK_SPAN: i64 = 2048;

/// The chosen keys in groups of keys whose last chosen rows lie within [`CHECK_SPAN`] ids of
/// each other, each with one bound above them all: the check reads, per group, `open_key IN
/// (...) AND id < bound`. One bound for many keys is what makes the check cheap: MariaDB
/// tests each row read against the statement's whole condition, and an `OR` of a term per
/// key costs it a comparison per term and row, where an `IN` list is one binary search (a
/// check of 200 keys: 2.1 ms against 3.7 on a quiet server). Rows of a key above its last
/// chosen row are read too, and left alone by [`behind_their_key`]: the span bounds them.
fn check_groups(chosen: &HashMap<String, BTreeSet<i64>>) -> Vec<(Vec<String>, i64)> {
    let mut lasts: Vec<(i64, &String)> = (chosen.iter())
        .filter_map(|(key, ids)| Some((*ids.last()?, key)))
        .collect();
    lasts.sort_unstable();
    let mut groups: Vec<(Vec<String>, i64)> = Vec::new();
    let mut first = i64::MIN;
    for (last, key) in lasts {
        match groups.last_mut() {
            Some((keys, below)) if last.saturating_sub(first) <= CHECK_SPAN => {
                keys.push(key.clone());
                *below = last;
            }
            _ => {
                first = last;
                groups.push((vec![key.clone()], last));
            }
        }
    }
    groups
}

/// The chosen rows to leave out: walking each key's chosen rows in id order, a row whose
/// nearest earlier unfinished row is neither a chosen row kept nor a held tail, and so every
/// chosen row of its key after it.
fn behind_their_key(chosen: &HashMap<String, BTreeSet<i64>>, earlier: &Earlier) -> HashSet<i64> {
    let mut blocked = HashSet::new();
    let none = BTreeSet::new();
    for (key, ids) in chosen {
        let open = earlier.open.get(key).unwrap_or(&none);
        let mut kept_before = true;
        for &row in ids {
            let before = open.range(..row).next_back().copied();
            let chosen_before = ids.range(..row).next_back().copied();
            let ok = match before.max(chosen_before) {
                None => true,
                Some(p) if Some(p) == chosen_before => kept_before,
                Some(p) => earlier.held_tails.contains(&p),
            };
            if !ok {
                blocked.insert(row);
            }
            kept_before = ok;
        }
    }
    blocked
}

/// Marks `rows` claimed by `req`'s claimer and token until `now + ttl`.
async fn mark_claimed(
    db: &Db,
    req: &ClaimRequest,
    rows: &[AnyRow],
    tx: &mut Tx<'_>,
) -> anyhow::Result<()> {
    let mut u = Sql::new(&format!("UPDATE {} SET claimed_by = ", db.table()));
    u.text(&req.claimer)
        .push(", claim_token = ")
        .text(&req.token)
        .push(", claimed_until = ")
        .now_plus(db.syntax(), req.ttl)
        .push(&format!(" WHERE {} IN (", db.cols().id))
        .ints(ids_of(rows))
        .push(")");
    db.query(u).execute(&mut **tx).await?;
    Ok(())
}

/// Inside the claim's transaction: whether the lease epoch is still the claimer's, holding a
/// shared lock on the lease row until the claim commits (a new holder's epoch bump waits for
/// it, and later claims of the old holder see the bump).
async fn fence_holds(db: &Db, req: &ClaimRequest, tx: &mut Tx<'_>) -> anyhow::Result<bool> {
    let Some(f) = &req.fence else {
        return Ok(true);
    };
    let mut q = Sql::new("SELECT epoch FROM outbox_relay_lease WHERE name = ");
    q.text(&f.lease)
        .push(" AND epoch = ")
        .int(f.epoch)
        .push(" LOCK IN SHARE MODE");
    Ok(db.query(q).fetch_optional(&mut **tx).await?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(keys: &[(&str, &[i64])]) -> HashMap<String, BTreeSet<i64>> {
        let set = |ids: &[i64]| ids.iter().copied().collect();
        keys.iter()
            .map(|(k, ids)| (k.to_string(), set(ids)))
            .collect()
    }

    fn earlier(open: &[(&str, &[i64])], held_tails: &[i64]) -> Earlier {
        Earlier {
            open: chosen(open),
            held_tails: held_tails.iter().copied().collect(),
        }
    }

    fn sorted(set: HashSet<i64>) -> Vec<i64> {
        let mut v: Vec<i64> = set.into_iter().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn heads_and_rows_behind_chosen_rows_or_held_tails_are_kept() {
        let c = chosen(&[("a", &[10, 12]), ("b", &[11]), ("c", &[13])]);
        // a: 10 is the head, 12 follows it; b: 11 follows the held tail 7; c: no earlier row.
        let e = earlier(&[("a", &[10]), ("b", &[3, 7])], &[7]);
        assert!(behind_their_key(&c, &e).is_empty());
    }

    #[test]
    fn a_row_behind_a_row_left_out_is_left_out_too() {
        // 5 committed after 10 and 12 were read: 10 is behind it, and 12 behind 10.
        let c = chosen(&[("a", &[10, 12, 14]), ("b", &[11])]);
        let e = earlier(&[("a", &[5, 10, 12])], &[]);
        assert_eq!(sorted(behind_their_key(&c, &e)), vec![10, 12, 14]);
    }

    #[test]
    fn check_groups_bound_keys_whose_last_rows_are_near_each_other() {
        let c = chosen(&[
            ("a", &[10, 12]),
            ("b", &[11]),
            ("c", &[10 + CHECK_SPAN]),
            ("d", &[11 + CHECK_SPAN, 20 + CHECK_SPAN]),
            ("e", &[5_000_000]),
        ]);
        let groups = check_groups(&c);
        let keys = |g: &(Vec<String>, i64)| g.0.join(",");
        assert_eq!(groups.len(), 3, "{groups:?}");
        // Sorted by last chosen row: b (11), a (12), c; d's last row is past the span.
        assert_eq!(
            (keys(&groups[0]), groups[0].1),
            ("b,a,c".into(), 10 + CHECK_SPAN)
        );
        assert_eq!(
            (keys(&groups[1]), groups[1].1),
            ("d".into(), 20 + CHECK_SPAN)
        );
        assert_eq!((keys(&groups[2]), groups[2].1), ("e".into(), 5_000_000));
        // Every key's rows below its last chosen row are inside its group's bound.
        for (key, ids) in &c {
            let g = groups.iter().find(|g| g.0.contains(key)).unwrap();
            assert!(*ids.last().unwrap() <= g.1);
        }
    }

    #[test]
    fn a_tail_not_held_blocks_its_key() {
        // 7 is a tail no longer held (its claim ran out): 11 waits, and so does 15.
        let c = chosen(&[("b", &[11, 15])]);
        let e = earlier(&[("b", &[7, 11])], &[]);
        assert_eq!(sorted(behind_their_key(&c, &e)), vec![11, 15]);
        // An unfinished row between two chosen rows that the claim does not hold.
        let c = chosen(&[("b", &[11, 15])]);
        let e = earlier(&[("b", &[11, 13])], &[]);
        assert_eq!(sorted(behind_their_key(&c, &e)), vec![15]);
    }
}
