//! The MySQL/MariaDB claim's check of ordering keys after the lock: which chosen rows follow
//! an earlier unfinished row of their key that the claim does not hold.
//!
//! Guarantee: a keyed row is claimed only if its nearest earlier unfinished row of its key,
//! as committed when the check runs, is a chosen row kept or one of the claim's offered tails
//! held by its claimer under a live claim; a row behind a row left out is left out too
//! (docs/design.md, "Keyed backlogs on MySQL/MariaDB").

use std::collections::{BTreeSet, HashMap, HashSet};

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::open_index::{OPEN_KEY, index};
use crate::store::claim::Found;
use crate::store::claim::returned::has_ordering_key;
use crate::store::db::Db;
use crate::store::model::ClaimRequest;
use crate::store::sql::Sql;

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
/// the tails held are read by one statement ([`earlier_rows`]), so a tail whose result is
/// written meanwhile is seen either held or finished, never both (the second read, of keys
/// whose tail it saw finished, only adds unfinished rows below that tail, which can only hold
/// rows back). Rows left out are not claimed, their locks released at commit. See
/// docs/design.md, "Claims on MySQL/MariaDB".
///
/// `early` is the check sent in the lock's round trip ([`early_check`]) and what it read: it
/// stands for this statement only when it was built of the very rows and keys the lock kept.
pub async fn leave_rows_behind_their_key(
    db: &Db,
    req: &ClaimRequest,
    rows: &mut Vec<AnyRow>,
    conn: &mut AnyConnection,
    early: Option<(EarlyCheck, Vec<AnyRow>)>,
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
    let from = tails_below(req, &chosen);
    let mut blocked = HashSet::new();
    // The check sent with the lock read what this one would: use what it read.
    if let Some((_, read)) = early.filter(|(e, _)| e.chosen == chosen) {
        let earlier = Earlier::of(read)?;
        blocked.extend(check_part(db, &chosen, &from, earlier, conn).await?);
        chosen.clear();
    }
    // Keys in statements of at most KEYS_PER_CHECK ranges (`batch_size` goes to 10,000): past
    // `range_optimizer_max_mem_size` the server would scan the whole index instead.
    let keys: Vec<(String, BTreeSet<i64>)> = chosen.into_iter().collect();
    for part in keys.chunks(KEYS_PER_CHECK) {
        let part: HashMap<String, BTreeSet<i64>> = part.iter().cloned().collect();
        let sql = check_statement(db, req, &part, &from);
        let earlier = Earlier::of(db.query(sql).fetch_all(&mut *conn).await?)?;
        blocked.extend(check_part(db, &part, &from, earlier, conn).await?);
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

/// The check built before the lock, from the keys the read gave the chosen rows: sent in
/// the lock's round trip, right after it. Its rows stand for the check only if the lock kept
/// every chosen row and `open_key` holds each one's key as the read gave it (the statement
/// is then the one the check would send); otherwise the check runs after the lock as ever.
pub struct EarlyCheck {
    chosen: HashMap<String, BTreeSet<i64>>,
}

/// The check of `ids` before the lock, from the keys `found` gives them, with its statement;
/// `None` where it could not stand for the check (no key, a mapped table, whose key column
/// `open_key` holds as its own text, or more keys than one statement reads).
pub fn early_check(
    db: &Db,
    req: &ClaimRequest,
    ids: &[i64],
    found: &Found,
) -> Option<(EarlyCheck, Sql)> {
    if db.cols().ordering_key.is_none() || db.cols().mapped {
        return None;
    }
    let ids: HashSet<i64> = ids.iter().copied().collect();
    let mut chosen: HashMap<String, BTreeSet<i64>> = HashMap::new();
    for c in found.iter().flat_map(|(_, rows)| rows) {
        if let (true, Some(key)) = (ids.contains(&c.id), &c.key) {
            chosen.entry(key.clone()).or_default().insert(c.id);
        }
    }
    if chosen.is_empty() || chosen.len() > KEYS_PER_CHECK {
        return None;
    }
    let sql = check_statement(db, req, &chosen, &tails_below(req, &chosen));
    Some((EarlyCheck { chosen }, sql))
}

/// The check's statement for the chosen rows `part` (by key) and the tails they are read
/// from: one function for the check sent with the lock and the one after it, so that the
/// first stands for the second whenever they are built of the same rows.
fn check_statement(
    db: &Db,
    req: &ClaimRequest,
    part: &HashMap<String, BTreeSet<i64>>,
    from: &HashMap<String, i64>,
) -> Sql {
    let skip: Vec<i64> = part.values().flatten().copied().collect();
    earlier_rows(db, Some(req), &check_groups(part, from), &skip)
}

/// The rows of `part` behind an earlier unfinished row of their key, from what the check read
/// (`earlier`), reading again from their first rows the keys whose tails finished meanwhile.
async fn check_part(
    db: &Db,
    part: &HashMap<String, BTreeSet<i64>>,
    from: &HashMap<String, i64>,
    mut earlier: Earlier,
    conn: &mut AnyConnection,
) -> anyhow::Result<HashSet<i64>> {
    // A key read from its tail that showed no unfinished row before its first chosen row:
    // the tail finished meanwhile, and the nearest earlier row may lie below it.
    let unsettled: HashMap<String, BTreeSet<i64>> = (part.iter())
        .filter(|(key, ids)| from.contains_key(*key) && !earlier.settles(key, ids))
        .map(|(key, ids)| (key.clone(), ids.clone()))
        .collect();
    if !unsettled.is_empty() {
        let skip: Vec<i64> = part.values().flatten().copied().collect();
        let groups = check_groups(&unsettled, &HashMap::new());
        let sql = earlier_rows(db, None, &groups, &skip);
        let below = Earlier::of(db.query(sql).fetch_all(&mut *conn).await?)?;
        for (key, rows) in below.open {
            earlier.open.entry(key).or_default().extend(rows);
        }
    }
    Ok(behind_their_key(part, &earlier))
}

/// Each chosen key's offered tail, where it lies below the key's first chosen row: the check
/// reads such a key from its tail, not from its first unfinished row, passing the key's rows
/// in flight before the tail (up to two runs of 16 a key under a keyed backlog).
fn tails_below(
    req: &ClaimRequest,
    chosen: &HashMap<String, BTreeSet<i64>>,
) -> HashMap<String, i64> {
    let mut from = HashMap::new();
    for t in &req.tails {
        if let Some((key, ids)) = chosen.get_key_value(&t.key)
            && ids.first().is_some_and(|&first| t.row < first)
        {
            from.insert(key.clone(), t.row);
        }
    }
    from
}

/// What [`earlier_rows`] read: unfinished rows of the chosen keys (each key's from its group's
/// lower bound, if any, to below its last chosen row), and the offered tails held by the
/// claimer under a live claim.
#[derive(Debug, Default)]
struct Earlier {
    open: HashMap<String, BTreeSet<i64>>,
    held_tails: HashSet<i64>,
}

impl Earlier {
    /// What the check's statement returned: keyed rows are unfinished rows of their keys,
    /// rows without a key the tails held.
    fn of(rows: Vec<AnyRow>) -> anyhow::Result<Earlier> {
        let mut earlier = Earlier::default();
        for r in rows {
            let row = r.try_get::<i64, _>(0)?;
            match r.try_get::<Option<String>, _>(1)? {
                Some(key) => earlier.open.entry(key).or_default().insert(row),
                None => earlier.held_tails.insert(row),
            };
        }
        Ok(earlier)
    }

    /// Whether the rows read of `key` settle its chosen rows `ids`: some unfinished row before
    /// the first of them was read. Every row of a group's range was read, so the nearest
    /// earlier row of the first chosen row is then the last such row; if none was read, it
    /// may lie below the range.
    fn settles(&self, key: &str, ids: &BTreeSet<i64>) -> bool {
        let (Some(open), Some(&first)) = (self.open.get(key), ids.first()) else {
            return false;
        };
        open.range(..first).next().is_some()
    }
}

/// One range of the check: the unfinished rows of `keys` with ids from `from` (all of them
/// when `None`) up to below `below`.
#[derive(Debug, PartialEq)]
struct Group {
    keys: Vec<String>,
    from: Option<i64>,
    below: i64,
}

/// The statement that reads the unfinished rows of each group's keys in its range but the
/// chosen rows `skip`, and, given `req`, which of its tails the claimer holds under a live
/// claim. The rows are one range scan of `open_key_idx` with a constant range per key
/// ([`check_groups`]; a correlated bound, as in a subquery per row, reads every entry of the
/// key behind the row: MariaDB does not bound an index range by a correlated value). A chosen
/// row is a head or follows the claimer's own rows in flight, and a key with a tail is read
/// from it, so the ranges hold little more than the chosen rows (docs/design.md, "Keyed
/// backlogs on MySQL/MariaDB").
///
/// The chosen rows are most of what the ranges hold, and [`behind_their_key`] knows them
/// already: left out, a check of 200 keys returns about 270 rows instead of about 600 (the
/// tails, and rows of keys past their last chosen row, up to their group's bound).
/// They are left out by an expression of `id` (`id + 0`), which the range optimizer does
/// not turn into ranges: a list of a few hundred ids on the index's own `id` part would
/// split each key's range at every one of them.
fn earlier_rows(db: &Db, req: Option<&ClaimRequest>, groups: &[Group], skip: &[i64]) -> Sql {
    let (t, id) = (db.table(), &db.cols().id);
    let mut q = Sql::new(&format!(
        "SELECT o.{id}, o.{OPEN_KEY} FROM {t} o FORCE INDEX ({}) WHERE (",
        index(db, "open_key_idx")
    ));
    for (i, g) in groups.iter().enumerate() {
        q.push(if i > 0 { " OR (" } else { "(" });
        q.push(&format!("o.{OPEN_KEY} IN ("))
            .texts(&g.keys)
            .push(")");
        if let Some(from) = g.from {
            q.push(&format!(" AND o.{id} >= ")).int(from);
        }
        q.push(&format!(" AND o.{id} < ")).int(g.below).push(")");
    }
    q.push(")");
    if !skip.is_empty() {
        q.push(&format!(" AND o.{id} + 0 NOT IN ("))
            .ints(skip.iter().copied())
            .push(")");
    }
    if let Some(req) = req.filter(|r| !r.tails.is_empty()) {
        // The tails this claimer holds under a live claim, as rows with no key.
        q.push(&format!(
            " UNION ALL SELECT h.{id}, NULL FROM {t} h WHERE h.{id} IN ("
        ));
        q.ints(req.tails.iter().map(|t| t.row))
            .push(") AND h.claimed_by = ")
            .text(&req.claimer)
            .push(&format!(" AND h.claimed_until > {}", db.syntax().now()));
    }
    q
}

/// Widest span of ids one group of [`check_groups`] covers, between its keys' last chosen
/// rows and between their tails: past its keys' last chosen rows (and before a key's tail),
/// a group's range reads at most this many ids' entries, whatever the keys.
const CHECK_SPAN: i64 = 2048;

/// Most rows of its keys past their last chosen rows that a group of [`check_groups`] is
/// expected to read beyond [`EXTRA_PER_KEY`] a key (an estimate: see [`Density`]).
const EXTRA_ROWS: f64 = 16.0;

/// Rows past its last chosen row a group may be expected to read for each of its keys.
const EXTRA_PER_KEY: f64 = 2.0;

/// The chosen keys in groups of keys whose last chosen rows lie within [`CHECK_SPAN`] ids of
/// each other, and whose tails in `from` (keys without one are grouped apart) do too, each
/// with one bound above them all and, for keys with tails, one below: the check reads, per
/// group, `open_key IN (...) AND id >= from AND id < below`. One bound for many keys is what
/// makes the check cheap: MariaDB tests each row read against the statement's whole
/// condition, and an `OR` of a term per key costs it a comparison per term and row, where an
/// `IN` list is one binary search (a check of 200 keys: 2.1 ms against 3.7 on a quiet
/// server). Rows of a key above its last chosen row, or below its tail, are read too, and
/// left alone by [`behind_their_key`]: the span bounds them, and so does what a key's chosen
/// rows tell of how densely its rows lie ([`Density`]): a key whose rows follow each other
/// (a backlog written key by key) would have the rest of its rows up to the bound read, so a
/// group takes no key that would make it read more than [`EXTRA_PER_KEY`] rows a key (and
/// [`EXTRA_ROWS`]) past their last chosen rows.
fn check_groups(
    chosen: &HashMap<String, BTreeSet<i64>>,
    from: &HashMap<String, i64>,
) -> Vec<Group> {
    let mut lasts: Vec<(bool, i64, Option<i64>, &String, Density)> = (chosen.iter())
        .filter_map(|(key, ids)| {
            let tail = from.get(key).copied();
            let density = Density::of(ids, tail);
            Some((tail.is_some(), *ids.last()?, tail, key, density))
        })
        .collect();
    lasts.sort_unstable_by(|a, b| (a.0, a.1, a.3).cmp(&(b.0, b.1, b.3)));
    let mut groups: Vec<Group> = Vec::new();
    // The current group's first last row, its highest tail (its lowest is its `from`), and
    // its keys' densities summed, plain and weighted by how far past `first` their last
    // chosen rows lie (offsets within the span, so no precision is lost on large ids).
    let (mut first, mut high) = (i64::MIN, i64::MIN);
    let (mut dense, mut weighted) = (0.0, 0.0);
    for (_, last, tail, key, density) in lasts {
        let fits = |g: &Group| {
            let tails_near = match (tail, g.from) {
                (Some(t), Some(low)) => t.max(high).saturating_sub(t.min(low)) <= CHECK_SPAN,
                _ => true,
            };
            // Rows the group's keys are expected to hold between their last chosen rows and
            // `last`, the bound this key would raise it to.
            let extra = last.saturating_sub(first) as f64 * dense - weighted;
            let allowed = EXTRA_ROWS + EXTRA_PER_KEY * (g.keys.len() + 1) as f64;
            g.from.is_some() == tail.is_some()
                && last.saturating_sub(first) <= CHECK_SPAN
                && tails_near
                && extra <= allowed
        };
        match groups.last_mut() {
            Some(g) if fits(g) => {
                g.keys.push(key.clone());
                g.below = last;
                g.from = g.from.min(tail);
            }
            _ => {
                first = last;
                high = i64::MIN;
                (dense, weighted) = (0.0, 0.0);
                groups.push(Group {
                    keys: vec![key.clone()],
                    from: tail,
                    below: last,
                });
            }
        }
        if let Some(t) = tail {
            high = high.max(t);
        }
        dense += density.0;
        weighted += density.0 * last.saturating_sub(first) as f64;
    }
    groups
}

/// How densely a chosen key's rows lie, as unfinished rows per id: its chosen rows and its
/// tail, over the ids from the first of them to the last. A key with one chosen row and no
/// tail tells nothing, and counts as 0 (a key per row, or heads of many keys, would
/// otherwise each be a group of their own).
#[derive(Clone, Copy, Debug)]
struct Density(f64);

impl Density {
    fn of(ids: &BTreeSet<i64>, tail: Option<i64>) -> Density {
        let (Some(&first), Some(&last)) = (ids.first(), ids.last()) else {
            return Density(0.0);
        };
        let low = tail.map_or(first, |t| t.min(first));
        let points = ids.len() + usize::from(tail.is_some());
        if points < 2 || last <= low {
            return Density(0.0);
        }
        Density(((points - 1) as f64 / (last - low) as f64).min(1.0))
    }
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

#[cfg(test)]
mod tests;
