//! Writing results back: one `UPDATE` per outcome kind, each row guarded by its claim token.
//!
//! Guarantees (G2; docs/design.md, "Results"): a result changes a row only while the claim it
//! was sent under is the row's claim (`claim_token` matches), and clears that claim; each
//! statement commits on its own and is idempotent, so a failure part-way says which results
//! were written ([`WriteError`]) and the rest can be retried.

use std::collections::BTreeMap;
use std::time::Duration;

use super::WriteError;
use crate::store::db::Db;
use crate::store::model::{Completion, MAX_AHEAD, PARKED_BY, Resolution, sanitize_text};
use crate::store::sql::{Sql, State, Syntax};

/// Most rows in one result statement (keeps statements and their parameter lists bounded).
const RESULT_CHUNK: usize = 500;

/// Result statements are grouped by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Delivered,
    Retry,
    Failed,
    Release,
    Park,
}

pub fn kind_of(r: &Resolution) -> Kind {
    match r {
        Resolution::Delivered => Kind::Delivered,
        Resolution::Retry { .. } => Kind::Retry,
        Resolution::Failed { .. } => Kind::Failed,
        Resolution::Release { .. } => Kind::Release,
        Resolution::Park => Kind::Park,
    }
}

/// When the row is next due, for kinds that set it.
fn delay_of(r: &Resolution) -> Duration {
    match r {
        Resolution::Retry { delay, .. } | Resolution::Release { delay, .. } => *delay,
        _ => Duration::ZERO,
    }
}

/// The `last_error` to store (sanitized), or NULL.
fn error_of(r: &Resolution) -> Option<String> {
    match r {
        Resolution::Retry { error, .. } | Resolution::Failed { error } => {
            Some(sanitize_text(error))
        }
        Resolution::Release { error, .. } => error.as_deref().map(sanitize_text),
        Resolution::Delivered | Resolution::Park => None,
    }
}

/// How one database selects the rows a result statement changes (after its `SET` clause).
pub trait ResultSql: Send + Sync {
    /// Appends the selection of `rows` (each guarded by its own claim token) to `q`, a result
    /// statement of `kind`. By default [`by_token`].
    fn select_rows(&self, db: &Db, _kind: Kind, rows: &[&Completion], q: &mut Sql) {
        q.push(" WHERE ");
        by_token(q, db.syntax(), &db.cols().id, rows);
    }
}

/// `(claim_token = ? AND id IN (...)) OR ...`: each row guarded by its own token, each token
/// named once. The rows of a write come from a few claims; `claim_token = CASE id WHEN ? THEN
/// ? ... END` named a token for every row and made the server run down the CASE for each
/// (docs/performance-log.md).
pub fn by_token(q: &mut Sql, s: &dyn Syntax, id: &str, rows: &[&Completion]) {
    for (i, (token, ids)) in tokens(rows).into_iter().enumerate() {
        if i > 0 {
            q.push(" OR ");
        }
        q.push("(claim_token = ")
            .text(token)
            .push(" AND ")
            .one_of_ids(s, id, &ids)
            .push(")");
    }
}

/// The claim tokens of `rows`, each with the ids claimed under it, in first-seen order.
pub fn tokens<'r>(rows: &[&'r Completion]) -> Vec<(&'r str, Vec<i64>)> {
    let mut by_token: Vec<(&str, Vec<i64>)> = Vec::new();
    for c in rows {
        match by_token.iter_mut().find(|(t, _)| *t == &*c.token) {
            Some((_, ids)) => ids.push(c.id),
            None => by_token.push((&c.token, vec![c.id])),
        }
    }
    by_token
}

/// Writes `done` (see `Queue::complete`): one statement per outcome kind, whatever claims
/// the rows came from (each row's own token guards it inside the statement). A row can appear
/// twice in one write only if it was given back and claimed again in between; such a repeat
/// goes to a later statement, so each statement names a row once.
pub async fn write(db: &Db, sql: &dyn ResultSql, done: &[Completion]) -> Result<u64, WriteError> {
    // Each statement commits on its own (no transaction around them): a relay paused
    // between statements (SIGSTOP, a stall) must not hold row locks that keep every other
    // instance from re-claiming those rows, and then commit stale results when it wakes.
    // The statements are independent and idempotent (guarded by the claim token, which
    // they clear). When one fails, the error says which completions were already written,
    // so the caller retries only the rest.
    let mut changed = 0;
    let mut handled = Vec::new();
    for (kind, rounds) in &groups(done) {
        for chunk in rounds.iter().flat_map(|r| r.chunks(RESULT_CHUNK)) {
            let refs: Vec<&Completion> = chunk.iter().map(|(_, c)| *c).collect();
            let q = statement(db, sql, *kind, &refs);
            match db.query(q).execute(db.pool()).await {
                Ok(r) => {
                    changed += r.rows_affected();
                    handled.extend(chunk.iter().map(|(i, _)| *i));
                }
                Err(e) => return Err(WriteError::after(handled, changed, e.into())),
            }
        }
    }
    Ok(changed)
}

/// Per kind, rounds of (position, completion) in which each row appears once.
type Groups<'c> = BTreeMap<Kind, Vec<Vec<(usize, &'c Completion)>>>;

/// `done` grouped by kind, a repeated row in a later round.
fn groups(done: &[Completion]) -> Groups<'_> {
    let mut groups: Groups<'_> = BTreeMap::new();
    for (i, c) in done.iter().enumerate() {
        let rounds = groups.entry(kind_of(&c.resolution)).or_default();
        match rounds
            .iter_mut()
            .find(|r| r.iter().all(|(_, o)| o.id != c.id))
        {
            Some(round) => round.push((i, c)),
            None => rounds.push(vec![(i, c)]),
        }
    }
    groups
}

/// One result statement for rows of the same kind, each guarded by its own claim token.
fn statement(db: &Db, sql: &dyn ResultSql, kind: Kind, rows: &[&Completion]) -> Sql {
    let (s, c) = (db.syntax(), db.cols());
    let mut q = Sql::new(&format!("UPDATE {} SET ", db.table()));
    if kind == Kind::Park {
        // Only the relay's own columns, which nothing of the table's can refuse; the claim
        // token stays, so the row stays claimed (for a year) and no claim takes it.
        q.push("claimed_by = ")
            .text(PARKED_BY)
            .push(", claimed_until = ")
            .now_plus(s, MAX_AHEAD);
        sql.select_rows(db, kind, rows, &mut q);
        return q;
    }
    let attempts = c.count_attempt();
    match kind {
        Kind::Delivered => {
            q.push(&format!(
                "{}, {attempts}, {} = {}",
                c.set(State::Success),
                c.sent_at,
                s.now()
            ));
            if let Some(e) = &c.last_error {
                q.push(&format!(", {e} = NULL"));
            }
        }
        Kind::Retry => {
            q.push(&format!(
                "{}, {attempts}, {} = ",
                c.set(State::Retry),
                c.next_attempt_at
            ))
            .append(next_attempt(db, rows));
            set_error(db, &mut q, rows, false);
        }
        Kind::Failed => {
            q.push(&format!("{}, {attempts}", c.set(State::Failed)));
            set_error(db, &mut q, rows, false);
        }
        // Written above.
        Kind::Park => {}
        Kind::Release => {
            q.push(&format!("{} = ", c.next_attempt_at))
                .append(next_attempt(db, rows));
            set_error(db, &mut q, rows, true);
        }
    }
    q.push(&format!(
        ", claimed_by = NULL, claim_token = NULL, claimed_until = NULL{}",
        c.touch(s)
    ));
    sql.select_rows(db, kind, rows, &mut q);
    q
}

/// `CASE id WHEN ? THEN <value> ... END`: one value per row, in one statement.
fn case(db: &Db, rows: &[&Completion], value: &dyn Fn(&mut Sql, &Completion)) -> Sql {
    let mut s = Sql::new(&format!("CASE {}", db.cols().id));
    for c in rows {
        s.push(" WHEN ").int(c.id).push(" THEN ");
        value(&mut s, c);
    }
    s.push(" END");
    s
}

/// Each row's next attempt: now plus its delay.
fn next_attempt(db: &Db, rows: &[&Completion]) -> Sql {
    case(db, rows, &|s, c| {
        s.now_plus(db.syntax(), delay_of(&c.resolution));
    })
}

/// `, last_error = <each row's>` (`keep`: a row without one keeps its old one). A table
/// without a last_error column keeps no reason (the log and metrics do).
fn set_error(db: &Db, q: &mut Sql, rows: &[&Completion], keep: bool) {
    let Some(e) = &db.cols().last_error else {
        return;
    };
    let errors = case(db, rows, &|s, c| {
        s.opt_text(error_of(&c.resolution));
    });
    if keep {
        q.push(&format!(", {e} = COALESCE("))
            .append(errors)
            .push(&format!(", {e})"));
    } else {
        q.push(&format!(", {e} = ")).append(errors);
    }
}
