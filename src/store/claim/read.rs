//! A claim's first statement: one plain read (no lock, no write) of every part of the
//! claim's plan, returning per row what the choice needs: its id, channel and key, whether it
//! is free (due, under no live claim) and whether it is the head of its ordering key. Each
//! part is one `SELECT` with a `LIMIT`, walking an index of unfinished rows (by channel, or by
//! key) that the database is made to use (see each database's `ClaimSql`), so the read's cost
//! follows the budget, not the table.

use std::collections::HashMap;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::ClaimSql;
use super::choose::Candidate;
use super::plan::{ChannelRead, GapRead, KeyRef, Part};
use crate::store::db::Db;
use crate::store::sql::Sql;
use crate::store::sql::decode::is_bytes;

/// The most ordering keys the windows of one read pass together (see [`statement`]).
const PASSED_KEYS: usize = 16_384;

/// The read of `parts`: one `UNION ALL` of a `SELECT` per part, each row tagged with its
/// part's index; where the database reads several keys at once
/// ([`ClaimSql::keys_at_once`]), the key parts are one member. A window that is not a full
/// walk's takes a row of one of the `busy` keys (this store's keys with rows in flight) as
/// behind an earlier row without looking that up: in a backlog of keys in flight most rows
/// a window passes are such rows, and the look-up was most of its cost (docs/design.md,
/// "Ordering keys: windows past keys in flight").
pub fn statement(db: &Db, sql: &dyn ClaimSql, parts: &[Part], busy: &[String], by_id: bool) -> Sql {
    // Each window that passes the busy keys binds the whole list: a few channels' windows of
    // thousands of keys would outgrow a prepared statement's values (MySQL takes 65,535). Any
    // of the keys will do (a row of a key left out is looked up).
    let passing = (parts.iter())
        .filter(|p| matches!(p, Part::Window { sweep: false, .. }))
        .count();
    let busy = &busy[..busy.len().min(PASSED_KEYS / passing.max(1))];
    let keys: Vec<KeyRead> = parts
        .iter()
        .enumerate()
        .filter_map(|(part, p)| match p {
            Part::Key { key, after, rows } => Some(KeyRead {
                part,
                key,
                after: *after,
                rows: *rows,
            }),
            _ => None,
        })
        .collect();
    let at_once = match keys.len() {
        0 | 1 => None,
        _ => sql.keys_at_once(db, &keys),
    };
    let mut members = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let at_once = at_once.is_some() && matches!(part, Part::Key { .. });
        if !at_once && !matches!(part, Part::Known { .. }) {
            members.push(sql.member(i, select(db, sql, i, part, busy)));
        }
    }
    if let Some(known) = known_member(db, sql, parts).filter(|_| by_id) {
        members.push(sql.member(parts.len() + 2, known));
    }
    if let Some(from) = at_once {
        let int = db.syntax().integer_type();
        let mut q = fields(
            db,
            &format!("CAST(kp.part AS {int})"),
            Sql::new(&format!("CAST(1 AS {int})")),
        );
        q.append(from);
        members.push(sql.member(parts.len() + 1, q));
    }
    let mut q = Sql::default();
    for (i, member) in members.into_iter().enumerate() {
        if i > 0 {
            q.push(" UNION ALL ");
        }
        q.append(member);
    }
    q
}

/// The member that reads the rows of every [`Part::Known`] by id, tagged as the first such
/// part ([`decode`] hands each row to its own part): one primary-key look-up per row, where
/// a member per key would cost the statement's planning a member each.
fn known_member(db: &Db, sql: &dyn ClaimSql, parts: &[Part]) -> Option<Sql> {
    let mut first = None;
    let mut ids = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if let Part::Known { ids: known, .. } = part {
            first.get_or_insert(i);
            ids.extend_from_slice(known);
        }
    }
    let int = db.syntax().integer_type();
    let mut q = fields(
        db,
        &format!("CAST({} AS {int})", first?),
        Sql::new(&format!("CAST(1 AS {int})")),
    );
    q.append(by_id(db, sql, &ids));
    Some(q)
}

/// The `FROM` that reads the unfinished rows `o` among `ids`.
fn by_id(db: &Db, sql: &dyn ClaimSql, ids: &[i64]) -> Sql {
    let mut q = Sql::new(&format!(" FROM {} o WHERE ", db.table()));
    sql.one_of(&mut q, &format!("o.{}", db.cols().id), ids);
    q.push(&format!(" AND {}", db.cols().open("o.")));
    q
}

/// One key part of a read, for [`ClaimSql::keys_at_once`].
pub struct KeyRead<'a> {
    /// The part's index.
    pub part: usize,
    pub key: &'a KeyRef,
    pub after: Option<i64>,
    pub rows: u32,
}

/// One part's `SELECT`.
fn select(db: &Db, sql: &dyn ClaimSql, i: usize, part: &Part, busy: &[String]) -> Sql {
    let (s, c) = (db.syntax(), db.cols());
    let int = s.integer_type();
    let mut head = Sql::default();
    match (part, &c.ordering_key) {
        // A key part's first row is its key's first unfinished row.
        (Part::Key { .. } | Part::Known { .. }, _) | (_, None) => {
            head.push(&format!("CAST(1 AS {int})"));
        }
        (_, Some(k)) => {
            head.push(&format!("CAST(CASE WHEN o.{k} IS NULL THEN 1 "));
            if !busy.is_empty() && matches!(part, Part::Window { sweep: false, .. }) {
                head.push("WHEN ");
                sql.one_of_keys(&mut head, &c.text_or_null("o.", &c.ordering_key, s), busy);
                head.push(" THEN 0 ");
            }
            // 2: a head that is also its key's last unfinished row (where asked).
            let head_is = match sql.last_of_key(db, "o.") {
                Some(last) => format!("CASE WHEN {last} THEN 2 ELSE 1 END"),
                None => "1".to_string(),
            };
            head.push(&format!(
                "WHEN {} THEN {head_is} ELSE 0 END AS {int})",
                sql.head(db, "o.")
            ));
        }
    };
    let mut q = fields(db, &format!("CAST({i} AS {int})"), head);
    q.append(match part {
        Part::Window {
            channel,
            from,
            rows,
            newest,
            ..
        } => {
            let (from, rows, newest) = (*from, *rows, *newest);
            sql.channel_rows(
                db,
                &ChannelRead {
                    channel,
                    from,
                    rows,
                    newest,
                },
            )
        }
        Part::Key { key, after, rows } => sql.key_rows(db, key, *after, *rows),
        Part::Known { ids, .. } => by_id(db, sql, ids),
        Part::Others {
            above,
            below,
            rows,
            nulls: false,
        } => {
            let (above, below, rows) = (above.as_deref(), below.as_deref(), *rows);
            let gap = GapRead { above, below, rows };
            sql.unserved_rows(db, &gap, &claimable(db, sql))
        }
        Part::Others {
            rows, nulls: true, ..
        } => sql.null_channel_rows(db, *rows, &claimable(db, sql)),
    });
    q
}

/// A read's select list for rows `o`: the part (`part`), id, channel and key as text, whether
/// the row is free (due, under no live claim), and whether it is its key's head (`head`: 1, or
/// 2 where it is also known to be its key's last unfinished row).
fn fields(db: &Db, part: &str, head: Sql) -> Sql {
    let (s, c) = (db.syntax(), db.cols());
    let channel = s.claim_text(&s.cast_text(&c.channel("o.")));
    let key = s.claim_text(&c.text_or_null("o.", &c.ordering_key, s));
    let int = s.integer_type();
    let free = format!(
        "CAST(CASE WHEN {} AND (o.claimed_until IS NULL OR o.claimed_until < {}) THEN 1 ELSE 0 \
         END AS {int})",
        c.due("o.", s),
        s.now()
    );
    let mut q = Sql::new(&format!(
        "SELECT {part} AS part, CAST(o.{id} AS {int}) AS id, {channel} AS channel, \
         {key} AS okey, {free} AS free, ",
        id = c.id
    ));
    q.append(head).push(" AS head");
    q
}

/// The condition that row `o` is claimable on its own: unfinished, due, under no live claim,
/// and the head of its ordering key.
pub fn claimable(db: &Db, sql: &dyn ClaimSql) -> String {
    super::claimable_among(db, sql, &|_| "1 = 0".to_string())
}

/// Adds to a read one row that carries a value (`expr`, an integer or NULL) in its id
/// column, tagged as part `part` (past the read's own parts).
pub fn add_value(db: &Db, q: &mut Sql, part: usize, expr: &str) {
    let int = db.syntax().integer_type();
    q.push(&format!(
        " UNION ALL SELECT CAST({part} AS {int}), CAST({expr} AS {int}), NULL, NULL, \
         CAST(0 AS {int}), CAST(0 AS {int})"
    ));
}

/// The value [`add_value`] added as part `part` (`None`: NULL, or no such row).
pub fn value(rows: &[AnyRow], part: usize) -> Option<i64> {
    rows.iter()
        .find(|r| r.try_get::<i64, _>(0).ok() == i64::try_from(part).ok())
        .and_then(|r| r.try_get::<Option<i64>, _>(1).ok().flatten())
}

/// The rows of a read, per part, in the part's order (ascending ids; descending for a newest
/// window): a compound statement promises no order of its own.
pub fn decode(rows: &[AnyRow], parts: &[Part]) -> Vec<(Part, Vec<Candidate>)> {
    let mut out: Vec<(Part, Vec<Candidate>)> =
        parts.iter().map(|p| (p.clone(), Vec::new())).collect();
    // The rows read by id, by id: the known member tags them all as the first known part.
    let known: HashMap<i64, usize> = parts
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            Part::Known { ids, .. } => Some(ids.iter().map(move |id| (*id, i))),
            _ => None,
        })
        .flatten()
        .collect();
    for row in rows {
        let Some((mut part, candidate)) = candidate(row) else {
            continue;
        };
        if matches!(parts.get(part), Some(Part::Known { .. })) {
            match known.get(&candidate.id) {
                Some(&own) => part = own,
                None => continue,
            }
        }
        if let Some((_, list)) = out.get_mut(part) {
            list.push(candidate);
        }
    }
    for (part, list) in out.iter_mut() {
        match part {
            Part::Window { newest: true, .. } => list.sort_by_key(|c| std::cmp::Reverse(c.id)),
            _ => list.sort_by_key(|c| c.id),
        }
    }
    out
}

/// One row of a read, or `None` if its part or id cannot be read (it is left out; the next
/// read will see it again).
fn candidate(row: &AnyRow) -> Option<(usize, Candidate)> {
    let part = usize::try_from(row.try_get::<i64, _>(0).ok()?).ok()?;
    let flag = |i: usize| row.try_get::<i64, _>(i).unwrap_or(0);
    let key = text(row, 3);
    Some((
        part,
        Candidate {
            id: row.try_get::<i64, _>(1).ok()?,
            channel: text(row, 2),
            last: flag(5) == 2 && key.is_some(),
            key,
            free: flag(4) == 1,
            head: flag(5) >= 1,
        },
    ))
}

/// A text column (text, or bytes where the database returns text as bytes); `None` when
/// NULL. Bytes that are not UTF-8 are decoded with replacement characters: the read only
/// compares them, and the claim decodes the row strictly (and fails it if it must).
fn text(row: &AnyRow, i: usize) -> Option<String> {
    if !is_bytes(row, i) {
        return row.try_get::<Option<String>, _>(i).ok().flatten();
    }
    row.try_get::<Option<Vec<u8>>, _>(i)
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}
