//! PostgreSQL's claims, idle reads and result writes.
//!
//! PostgreSQL has no index hints, and its planner, estimating from statistics that cannot
//! see how a queue's finished rows sit at the low end of the primary key, would walk the
//! primary key over them (docs/design.md, "Claims on PostgreSQL"). So every read is written
//! so that only the intended index can serve it: an order by `(channel, id)` or `(key, id)`
//! that no other index provides. The channel (or key) is bounded as a range of one value
//! (`c >= ? AND c <= ?`), not an equality: with an equality the planner takes the column for
//! a constant, and any index by id would give the order. A row comparison (`(c, id) > (?,
//! ?)`) would do as well, but PostgreSQL tests it at each step of the index walk at twice the
//! cost (docs/design.md, "Claims on PostgreSQL").
//!
//! - The claim is one `UPDATE ... RETURNING` of the chosen ids, rechecked in a subquery that
//!   locks the rows it takes with `FOR UPDATE OF o SKIP LOCKED` (claimers never wait on each
//!   other); in leader mode a `fence` CTE holds one shared lock on the lease row for the whole
//!   statement (a new holder's epoch bump waits for the claim, and later claims of the old
//!   holder see the bump). The ids travel as one text parameter, so the statement's text is
//!   the same for any number of rows and is planned once per connection.
//! - The idle read also says how long until the earliest unfinished row is due, so that an
//!   idle relay whose inserts are announced by NOTIFY can sleep until then.
//! - A delivered result for many rows is one statement whose text does not depend on their
//!   number; other results name each id once more outside the tokens' `OR`, for the primary
//!   key (docs/design.md, "No bitmap scans").

use super::Postgres;
use crate::store::claim::plan::{ChannelRead, KeyRef};
use crate::store::claim::read::KeyRead;
use crate::store::claim::returned::select_list;
use crate::store::claim::{
    ClaimSql, Found, Rows, claimable_given_earlier, plain_channel_rows, set_claimed,
};
use crate::store::db::Db;
use crate::store::model::{ClaimRequest, Completion};
use crate::store::queue::results::{Kind, ResultSql, by_token, tokens};
use crate::store::sql::Sql;

/// The condition on `q` (a key's rows above an id, which follows it) that only the index of
/// unfinished rows by `(key, id)` serves, with the key `kv` bounded as a range of one value
/// (the module's doc says why).
fn key_after(k: &str, id: &str, kv: &str) -> String {
    format!("q.{k} IS NOT NULL AND q.{k} >= {kv} AND q.{k} <= {kv} AND q.{id} > ")
}

/// Most unfinished rows an idle read looks at to say when the next one is due.
const QUIET_SCAN: u32 = 1000;

impl ClaimSql for Postgres {
    fn channel_rows(&self, db: &Db, w: &ChannelRead) -> Sql {
        let c = db.cols();
        // A mapped table: its channel may be a constant (the index of unfinished rows is by
        // id alone) or a column of another type than text (compared as text, which no index
        // of its serves); the plain equality.
        let (Some(ch), false) = (c.channel_column(), c.mapped) else {
            return plain_channel_rows(db, w);
        };
        let (t, id) = (db.table(), &c.id);
        let mut q = Sql::new(&format!(" FROM {t} o WHERE o.{ch} >= "));
        q.text(w.channel)
            .push(&format!(" AND o.{ch} <= "))
            .text(w.channel);
        if !w.newest {
            q.push(&format!(" AND o.{id} > "))
                .int(w.from.unwrap_or(i64::MIN));
        }
        let desc = if w.newest { " DESC" } else { "" };
        q.push(&format!(
            " AND {} ORDER BY o.{ch}{desc}, o.{id}{desc} LIMIT {}",
            c.open("o."),
            w.rows
        ));
        q
    }

    fn key_rows(&self, db: &Db, key: &KeyRef, after: Option<i64>, rows: u32) -> Sql {
        let (t, c) = (db.table(), db.cols());
        let (k, id) = (c.ordering_key.as_deref().unwrap_or("NULL"), &c.id);
        // The key is found through a row of it, so that it keeps the column's own type.
        let mut q = Sql::new(&format!(
            " FROM (SELECT x.{k} AS kv FROM {t} x WHERE x.{id} = "
        ));
        q.int(key.row)
            .push(&format!(
                ") kx CROSS JOIN LATERAL (SELECT q.* FROM {t} q WHERE "
            ))
            .push(&key_after(k, id, "kx.kv"))
            .int(after.unwrap_or(i64::MIN))
            .push(&format!(
                " AND {} ORDER BY q.{k}, q.{id} LIMIT {rows}) o",
                c.open("q.")
            ));
        q
    }

    /// The keys as arrays (one text value each: the statement's text is the same for any
    /// number of keys), each read by the same index walk as [`ClaimSql::key_rows`], laterally.
    fn keys_at_once(&self, db: &Db, keys: &[KeyRead]) -> Option<Sql> {
        let (t, c) = (db.table(), db.cols());
        let (k, id) = (c.ordering_key.as_deref()?, &c.id);
        let mut q = Sql::new(" FROM unnest(");
        id_array(&mut q, keys.iter().map(|r| r.part as i64)).push(", ");
        id_array(&mut q, keys.iter().map(|r| r.key.row)).push(", ");
        id_array(&mut q, keys.iter().map(|r| r.after.unwrap_or(i64::MIN))).push(", ");
        id_array(&mut q, keys.iter().map(|r| i64::from(r.rows)));
        q.push(&format!(
            ") AS kp(part, krow, afterid, lim) \
             CROSS JOIN LATERAL (SELECT x.{k} AS kv FROM {t} x WHERE x.{id} = kp.krow) kx \
             CROSS JOIN LATERAL (SELECT q.* FROM {t} q WHERE {}kp.afterid \
             AND {} ORDER BY q.{k}, q.{id} LIMIT kp.lim) o",
            key_after(k, id, "kx.kv"),
            c.open("q.")
        ));
        Some(q)
    }

    /// The nearest earlier unfinished row of `a`'s key: the row just before `a` in the index of
    /// unfinished keyed rows by `(key, id)`, one step back from where the walk starts.
    fn earlier(&self, db: &Db, a: &str) -> String {
        let (t, c) = (db.table(), db.cols());
        let (k, id) = (c.ordering_key.as_deref().unwrap_or("NULL"), &c.id);
        format!(
            "(SELECT p.{id} FROM {t} p WHERE p.{k} >= {a}{k} AND p.{k} <= {a}{k} \
             AND p.{id} < {a}{id} AND p.{k} IS NOT NULL AND {} \
             ORDER BY p.{k} DESC, p.{id} DESC LIMIT 1)",
            c.open("p.")
        )
    }

    /// The ids as one text value: the statement's text stays the same for any number of them.
    fn one_of(&self, q: &mut Sql, e: &str, ids: &[i64]) {
        q.push(&format!("{e} = ANY("));
        id_array(q, ids.iter().copied()).push(")");
    }

    /// The keys as one JSON value, as a hashed subplan: the text stays the same for any
    /// number of them, and each row's test is a hash probe.
    fn one_of_keys(&self, q: &mut Sql, e: &str, keys: &[String]) {
        q.push(&format!("{e} IN (SELECT jsonb_array_elements_text(CAST("))
            .text(&serde_json::json!(keys).to_string())
            .push(" AS jsonb)))");
    }

    fn claim_ids<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        ids: &'a [i64],
        _found: &'a Found,
    ) -> Rows<'a> {
        Box::pin(async move {
            let (t, id) = (db.table(), &db.cols().id);
            let mut q = Sql::new("WITH chosen AS (SELECT ");
            id_array(&mut q, ids.iter().copied()).push(" AS ids)");
            let fenced = match &req.fence {
                Some(f) => {
                    q.push(", fence AS (SELECT 1 FROM outbox_relay_lease WHERE name = ")
                        .text(&f.lease)
                        .push(" AND epoch = ")
                        .int(f.epoch)
                        .push(" FOR SHARE)");
                    " AND EXISTS (SELECT 1 FROM fence)"
                }
                None => "",
            };
            let chosen = "ANY(CAST((SELECT ids FROM chosen) AS bigint[]))";
            // Each keyed row's earlier row, looked up once: the claim rule's tests ask for it
            // up to three times. `OFFSET 0` keeps the planner from pulling the subquery up,
            // which puts its expression back in each test (docs/design.md, "Claims on
            // PostgreSQL").
            let earlier = match db.cols().ordering_key.as_deref() {
                Some(k) => format!(
                    " CROSS JOIN LATERAL (SELECT CASE WHEN o.{k} IS NOT NULL THEN {} END AS e \
                     OFFSET 0) x",
                    self.earlier(db, "o.")
                ),
                None => String::new(),
            };
            let in_chosen = |e: &str| format!("{e} = {chosen}");
            let claimable = claimable_given_earlier(db, self, &in_chosen, req, "x.e");
            q.push(&format!(" UPDATE {t} u SET "));
            set_claimed(&mut q, db, req)
                .push(&format!(
                    " WHERE u.{id} = ANY(ARRAY(SELECT o.{id} FROM {t} o{earlier} \
                     WHERE o.{id} = {chosen} AND "
                ))
                .append(claimable)
                .push(&format!(
                    "{fenced} FOR UPDATE OF o SKIP LOCKED)) RETURNING {}",
                    select_list(db, "u.", req)
                ));
            Ok(db.query(q).fetch_all(db.pool()).await?)
        })
    }

    /// The earliest `next_attempt_at` of the unfinished rows, through the same partial index
    /// the windows walk, read over at most [`QUIET_SCAN`] rows, so that a table of many rows
    /// waiting far ahead (scheduled sends) does not make every idle read walk them all: with
    /// more, no promise (zero), and the relay reads every poll interval.
    fn quiet_ms(&self, db: &Db) -> Option<String> {
        let c = db.cols();
        // A mapped table's NULL is due now.
        let next = match c.mapped {
            true => format!("COALESCE(o.{}, now())", c.next_attempt_at),
            false => format!("o.{}", c.next_attempt_at),
        };
        Some(format!(
            "(SELECT CASE WHEN COUNT(*) < {QUIET_SCAN} \
             THEN EXTRACT(EPOCH FROM MIN(w.next) - now()) * 1000 ELSE 0 END \
             FROM (SELECT {next} AS next FROM {} o WHERE {} LIMIT {QUIET_SCAN}) w)",
            db.table(),
            c.open("o.")
        ))
    }
}

impl ResultSql for Postgres {
    fn select_rows(&self, db: &Db, kind: Kind, rows: &[&Completion], q: &mut Sql) {
        let id = &db.cols().id;
        if kind == Kind::Delivered {
            // The common result has no per-row values but its id and token: they go as two
            // lists in two parameters, so the statement's text is the same for any number of
            // rows, parsed and planned once per connection instead of once per write
            // (docs/performance-log.md), and a row meets its token in a join. Ids are
            // integers and tokens hex, so neither holds a comma; the list's columns have
            // names no mapped table's columns can be mistaken for.
            let tokens: Vec<&str> = rows.iter().map(|c| &*c.token).collect();
            q.push(" FROM unnest(");
            id_array(q, rows.iter().map(|c| c.id))
                .push(", string_to_array(")
                .text(&tokens.join(","))
                .push(&format!(
                    ", ',')) AS outbox_relay_done(outbox_relay_id, outbox_relay_token) \
                     WHERE {id} = outbox_relay_done.outbox_relay_id \
                     AND claim_token = outbox_relay_done.outbox_relay_token"
                ));
            return;
        }
        q.push(" WHERE ");
        // Every id once more, outside the `OR`, for the primary key to find the rows by: an
        // `OR` of conditions is found through indexes only by a bitmap scan, and the relay's
        // sessions plan none ("No bitmap scans").
        if tokens(rows).len() > 1 {
            q.push(&format!("{id} IN ("))
                .ints(rows.iter().map(|c| c.id))
                .push(") AND (");
            by_token(q, db.syntax(), id, rows);
            q.push(")");
        } else {
            by_token(q, db.syntax(), id, rows);
        }
    }
}

/// Appends `ids` as one `bigint[]` value bound as one text parameter: the statement's text is
/// the same for any number of them, so it is parsed and planned once per connection.
fn id_array(q: &mut Sql, ids: impl Iterator<Item = i64>) -> &mut Sql {
    let list: Vec<String> = ids.map(|id| id.to_string()).collect();
    q.push("string_to_array(")
        .text(&list.join(","))
        .push(", ',')::bigint[]")
}
