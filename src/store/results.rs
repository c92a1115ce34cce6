//! Writing results back: one `UPDATE` per outcome kind, each row guarded by its claim token.
//!
//! Guarantees (G2; docs/design.md, "Results"): a result changes a row only while the claim it
//! was sent under is the row's claim (`claim_token` matches), and clears that claim; each
//! statement commits on its own and is idempotent, so a failure part-way says which results
//! were written ([`Incomplete`]) and the rest can be retried.

use std::collections::BTreeMap;
use std::time::Duration;

use super::builder::Sql;
use super::sql::SqlStore;
use super::{Completion, Dialect, Incomplete, Resolution, State, sanitize_text};

/// Most rows in one result statement (keeps statements and their parameter lists bounded).
const RESULT_CHUNK: usize = 500;

/// Result statements are grouped by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Delivered,
    Retry,
    Failed,
    Release,
}

fn kind_of(r: &Resolution) -> Kind {
    match r {
        Resolution::Delivered => Kind::Delivered,
        Resolution::Retry { .. } => Kind::Retry,
        Resolution::Failed { .. } => Kind::Failed,
        Resolution::Release { .. } => Kind::Release,
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
        Resolution::Delivered => None,
    }
}

impl SqlStore {
    /// Writes `done` (see [`super::Queue::complete`]).
    pub(super) async fn write_results(&self, done: &[Completion]) -> anyhow::Result<u64> {
        // One statement per outcome kind, whatever claims the rows came from: each row's own
        // token guards it inside the statement. A row can appear twice in one write only if
        // it was given back and claimed again in between; such a repeat goes to a later
        // statement, so each statement names a row once.
        let mut groups: BTreeMap<Kind, Vec<Vec<(usize, &Completion)>>> = BTreeMap::new();
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
        // Each statement commits on its own (no transaction around them): a relay paused
        // between statements (SIGSTOP, a stall) must not hold row locks that keep every other
        // instance from re-claiming those rows, and then commit stale results when it wakes.
        // The statements are independent and idempotent (guarded by the claim token, which
        // they clear). When one fails, the error says which completions were already written
        // ([`Incomplete`]), so the caller retries only the rest.
        let mut changed = 0;
        let mut handled = Vec::new();
        for (kind, rounds) in &groups {
            for chunk in rounds.iter().flat_map(|r| r.chunks(RESULT_CHUNK)) {
                let refs: Vec<&Completion> = chunk.iter().map(|(_, c)| *c).collect();
                let q = self.result_statement(*kind, &refs);
                match q.query(self).execute(&self.pool).await {
                    Ok(r) => {
                        changed += r.rows_affected();
                        handled.extend(chunk.iter().map(|(i, _)| *i));
                    }
                    Err(e) if handled.is_empty() => return Err(e.into()),
                    Err(e) => {
                        return Err(Incomplete {
                            handled,
                            changed,
                            source: e.into(),
                        }
                        .into());
                    }
                }
            }
        }
        Ok(changed)
    }

    /// One result statement for rows of the same kind, each guarded by its own claim token.
    fn result_statement(&self, kind: Kind, rows: &[&Completion]) -> Sql {
        let d = self.dialect;
        let now = d.now();
        let c = &self.cols;
        let id = &c.id;
        // `CASE id WHEN ? THEN <value> ... END`: one value per row, in one statement.
        let case = |value: &dyn Fn(&mut Sql, &Completion)| {
            let mut s = Sql::new(&format!("CASE {id}"));
            for c in rows {
                s.push(" WHEN ").int(c.id).push(" THEN ");
                value(&mut s, c);
            }
            s.push(" END");
            s
        };
        let next_attempt = || {
            case(&|s, c| {
                s.now_plus(d, delay_of(&c.resolution));
            })
        };
        let last_error = || {
            case(&|s, c| {
                s.opt_text(error_of(&c.resolution));
            })
        };
        // A table without a last_error column keeps no reason (the log and metrics do).
        let set_error = |q: &mut Sql, keep: bool| {
            if let Some(e) = &c.last_error {
                if keep {
                    q.push(&format!(", {e} = COALESCE("))
                        .append(last_error())
                        .push(&format!(", {e})"));
                } else {
                    q.push(&format!(", {e} = ")).append(last_error());
                }
            }
        };
        let attempts = c.count_attempt();
        let mut q = Sql::new(&format!("UPDATE {} SET ", self.table));
        match kind {
            Kind::Delivered => {
                q.push(&format!(
                    "{}, {attempts}, {} = {now}",
                    c.set(State::Success),
                    c.sent_at
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
                .append(next_attempt());
                set_error(&mut q, false);
            }
            Kind::Failed => {
                q.push(&format!("{}, {attempts}", c.set(State::Failed)));
                set_error(&mut q, false);
            }
            Kind::Release => {
                q.push(&format!("{} = ", c.next_attempt_at))
                    .append(next_attempt());
                set_error(&mut q, true);
            }
        }
        q.push(&format!(
            ", claimed_by = NULL, claim_token = NULL, claimed_until = NULL{}",
            c.touch(d)
        ));
        if d == Dialect::Postgres && kind == Kind::Delivered {
            // The common result has no per-row values but its id and token: on PostgreSQL
            // they go as two lists in two parameters, so the statement's text is the same
            // for any number of rows. The server parses and plans it once per connection
            // instead of once per write (planning the relay's statements was a tenth of its
            // CPU in a profile), and a row meets its token in a join, not in a CASE of every
            // token. Measured alternately, four runs each: the server's CPU per delivered row
            // 51 µs against 56 µs, rows/s 1.03x (within the noise).
            // Ids are integers and tokens hex (`random_token`), so neither holds a comma; the
            // list's columns have names no mapped table's columns can be mistaken for.
            let ids: Vec<String> = rows.iter().map(|c| c.id.to_string()).collect();
            let tokens: Vec<&str> = rows.iter().map(|c| &*c.token).collect();
            q.push(" FROM unnest(string_to_array(")
                .text(&ids.join(","))
                .push(", ',')::bigint[], string_to_array(")
                .text(&tokens.join(","))
                .push(&format!(
                    ", ',')) AS outbox_relay_done(outbox_relay_id, outbox_relay_token) \
                     WHERE {id} = outbox_relay_done.outbox_relay_id \
                     AND claim_token = outbox_relay_done.outbox_relay_token"
                ));
            return q;
        }
        // Each row guarded by its own token, as one condition per token: the rows of a write
        // come from a few claims, so `(claim_token = ? AND id IN (...)) OR ...` names each
        // token once, where `claim_token = CASE id WHEN ? THEN ? ... END` named it for every
        // row and made the server run down the CASE for each. On MariaDB, 20,000 results in
        // writes of 137 rows, three alternate runs each: 0.29-0.42 s against 0.38-0.56 s.
        let mut by_token: Vec<(&str, Vec<i64>)> = Vec::new();
        for c in rows {
            match by_token.iter_mut().find(|(t, _)| *t == &*c.token) {
                Some((_, ids)) => ids.push(c.id),
                None => by_token.push((&c.token, vec![c.id])),
            }
        }
        q.push(" WHERE ");
        // PostgreSQL: every id once more, outside the `OR`, for the primary key to find the
        // rows by. An `OR` of conditions is found through indexes only by a bitmap scan, and
        // the relay's sessions plan none there ("No bitmap scans").
        let pg_ids = d == Dialect::Postgres && by_token.len() > 1;
        if pg_ids {
            q.push(&format!("{id} IN ("))
                .ints(rows.iter().map(|c| c.id))
                .push(") AND (");
        }
        for (i, (token, ids)) in by_token.into_iter().enumerate() {
            if i > 0 {
                q.push(" OR ");
            }
            q.push("(claim_token = ")
                .text(token)
                .push(&format!(" AND {id} IN ("))
                .ints(ids)
                .push("))");
        }
        if pg_ids {
            q.push(")");
        }
        q
    }
}
