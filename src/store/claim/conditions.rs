//! The claim's conditions, assignments and plain reads as SQL text, shared by the databases'
//! claim statements: what makes a row claimable (the rule of docs/design.md, "Claims", with
//! the ordering-key tests each database writes its own way through [`ClaimSql`]), what a
//! claim sets, and the default reads of a channel's rows and of the unserved channels'.

use super::ClaimSql;
use super::plan::{ChannelRead, GapRead};
use crate::store::db::Db;
use crate::store::model::ClaimRequest;
use crate::store::sql::Sql;

/// [`ClaimSql::channel_rows`] by a plain equality on the channel.
pub fn plain_channel_rows(db: &Db, w: &ChannelRead) -> Sql {
    let c = db.cols();
    let mut q = Sql::new(&format!(
        " FROM {} o WHERE {} = ",
        db.table(),
        c.channel("o.")
    ));
    q.text(w.channel).push(&format!(" AND {}", c.open("o.")));
    if let Some(from) = w.from {
        q.push(&format!(" AND o.{} > ", c.id)).int(from);
    }
    let desc = if w.newest { " DESC" } else { "" };
    q.push(&format!(" ORDER BY o.{}{desc} LIMIT {}", c.id, w.rows));
    q
}

/// [`ClaimSql::unserved_rows`] from `from` (the table as `o`, and how the database is to read
/// it), by `channel` (the expression that holds a row's channel there): the rows that meet
/// `claimable` in the gap between the served channels, by channel and id.
pub fn gap_rows(db: &Db, from: &str, channel: &str, gap: &GapRead, claimable: &str) -> Sql {
    let mut q = Sql::new(&format!(" FROM {from} WHERE {claimable}"));
    if let Some(above) = gap.above {
        q.push(&format!(" AND {channel} > ")).text(above);
    }
    if let Some(below) = gap.below {
        q.push(&format!(" AND {channel} < ")).text(below);
    }
    q.push(&format!(
        " ORDER BY {channel}, o.{} LIMIT {}",
        db.cols().id,
        gap.rows
    ));
    q
}

/// The condition that row `o` is claimable by a claim of `ids` (written with `in_ids`, the
/// database's test that an expression is one of them): unfinished, due, under no live claim,
/// and either the head of its ordering key or right behind a row of the same claim.
pub fn claimable_among(db: &Db, sql: &dyn ClaimSql, in_ids: &dyn Fn(&str) -> String) -> String {
    match keyed_rule(db, sql, in_ids) {
        Some(rule) => format!("{} AND ({rule})", free_and_open(db)),
        None => free_and_open(db),
    }
}

/// The ordering-key part of [`claimable_among`] (`None` where the table has no key): row `o`
/// has no key, is its key's head, or is right behind a row of the same claim.
fn keyed_rule(db: &Db, sql: &dyn ClaimSql, in_ids: &dyn Fn(&str) -> String) -> Option<String> {
    let k = db.cols().ordering_key.as_deref()?;
    Some(format!(
        "o.{k} IS NULL OR {} OR {}",
        sql.head(db, "o."),
        in_ids(&sql.earlier(db, "o."))
    ))
}

/// [`claimable_among`] for `req`, which may also take a keyed row right behind one of its
/// tails ([`ClaimRequest::tails`]) while this claimer holds that tail under a live claim: the
/// relay sends such a row only once its tail was delivered (docs/design.md, "Ordering keys:
/// chains").
pub fn claimable_for(
    db: &Db,
    sql: &dyn ClaimSql,
    in_ids: &dyn Fn(&str) -> String,
    req: &ClaimRequest,
) -> Sql {
    let (Some(rule), false) = (keyed_rule(db, sql, in_ids), req.tails.is_empty()) else {
        return Sql::new(&claimable_among(db, sql, in_ids));
    };
    let mut q = Sql::new(&format!("{} AND ({rule} OR ", free_and_open(db)));
    held_tail(db, sql, req, &sql.earlier(db, "o."), &mut q);
    q.push(")");
    q
}

/// [`claimable_for`] where `e`, an expression the statement computes once per row, is row
/// `o`'s nearest earlier unfinished row of its key ([`ClaimSql::earlier`]; NULL for a head or
/// a row without a key): one look-up of it per row instead of one per test that asks
/// (PostgreSQL computes it laterally).
pub fn claimable_given_earlier(
    db: &Db,
    sql: &dyn ClaimSql,
    in_ids: &dyn Fn(&str) -> String,
    req: &ClaimRequest,
    e: &str,
) -> Sql {
    let Some(k) = db.cols().ordering_key.as_deref() else {
        return Sql::new(&free_and_open(db));
    };
    let mut q = Sql::new(&format!(
        "{} AND (o.{k} IS NULL OR {e} IS NULL OR {}",
        free_and_open(db),
        in_ids(e)
    ));
    if !req.tails.is_empty() {
        q.push(" OR ");
        held_tail(db, sql, req, e, &mut q);
    }
    q.push(")");
    q
}

/// Appends the condition that row `e` is one of `req`'s tails, held by its claimer under a
/// live claim.
fn held_tail(db: &Db, sql: &dyn ClaimSql, req: &ClaimRequest, e: &str, q: &mut Sql) {
    let (t, id) = (db.table(), &db.cols().id);
    q.push(&format!("{e} IN (SELECT h.{id} FROM {t} h WHERE "));
    let tails: Vec<i64> = req.tails.iter().map(|t| t.row).collect();
    sql.one_of(q, &format!("h.{id}"), &tails);
    q.push(" AND h.claimed_by = ")
        .text(&req.claimer)
        .push(&format!(" AND h.claimed_until > {})", db.syntax().now()));
}

/// Appends a claim's assignments for `req`: `claimed_by`, `claim_token` and `claimed_until`
/// (its ttl from now on the database clock). Only these columns change, none of them
/// indexed: on PostgreSQL the claim can be a HOT update (docs/design.md, "HOT claims").
pub fn set_claimed<'q>(q: &'q mut Sql, db: &Db, req: &ClaimRequest) -> &'q mut Sql {
    q.push("claimed_by = ")
        .text(&req.claimer)
        .push(", claim_token = ")
        .text(&req.token)
        .push(", claimed_until = ")
        .now_plus(db.syntax(), req.ttl)
}

/// The condition that row `o` is unfinished, due and under no live claim (whatever its
/// ordering key).
pub fn free_and_open(db: &Db) -> String {
    let (s, c) = (db.syntax(), db.cols());
    format!(
        "{} AND {} AND (o.claimed_until IS NULL OR o.claimed_until < {})",
        c.open("o."),
        c.due("o.", s),
        s.now()
    )
}
