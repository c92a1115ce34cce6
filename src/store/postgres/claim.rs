//! PostgreSQL's claims, idle reads and result writes.
//!
//! - The claim is one `UPDATE ... RETURNING`: in leader mode a `fence` CTE takes one shared
//!   lock on the lease row for the whole statement (a new holder's epoch bump waits for the
//!   claim, and later claims of the old holder see the bump); each pick locks the rows it
//!   takes with `FOR UPDATE OF o SKIP LOCKED`, so claimers never wait on each other; the
//!   picked ids go to the `UPDATE` as one array, looked up in the primary key, the same plan
//!   whatever the picks' estimate (docs/design.md, "Generic plans").
//! - The idle read also says how long until the earliest unfinished row is due, so that an
//!   idle relay whose inserts are announced by NOTIFY can sleep until then (docs/design.md,
//!   "Idle cost").
//! - A delivered result for many rows is one statement whose text does not depend on their
//!   number; other results name each id once more outside the tokens' `OR`, for the primary
//!   key (docs/design.md, "No bitmap scans").

use std::time::Duration;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::Postgres;
use crate::BoxFuture;
use crate::store::claim::ClaimSql;
use crate::store::claim::cursor::Floors;
use crate::store::claim::picks::{PickFence, Picker};
use crate::store::claim::plan::plan;
use crate::store::claim::probe::any_row;
use crate::store::claim::returning::{self, ReturningForm};
use crate::store::db::Db;
use crate::store::model::{ClaimRequest, Completion, Fence, Probe};
use crate::store::queue::results::{Kind, ResultSql, by_token, tokens};
use crate::store::sql::Sql;

/// Most unfinished rows an idle read looks at to say when the next one is due.
const QUIET_SCAN: u32 = 1000;

impl ReturningForm for Postgres {
    fn fence(&self, q: &mut Sql, f: &Fence) -> PickFence {
        q.push("fence AS (SELECT 1 FROM outbox_relay_lease WHERE name = ")
            .text(&f.lease)
            .push(" AND epoch = ")
            .int(f.epoch)
            .push(" FOR SHARE), ");
        PickFence::Cte
    }

    fn lock(&self) -> &'static str {
        "FOR UPDATE OF o SKIP LOCKED"
    }

    fn target(&self) -> &'static str {
        "u"
    }

    /// The picked ids as one array, looked up in the primary key. (Joined to the picks
    /// instead, the generic plan, which assumes a `LIMIT $n` keeps a tenth of the rows,
    /// hashed the whole table.)
    fn picked(&self, id: &str, picked: &str) -> String {
        format!("{id} = ANY(ARRAY({picked}))")
    }
}

impl ClaimSql for Postgres {
    fn claim_rows<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        floors: &'a Floors,
    ) -> BoxFuture<'a, anyhow::Result<Vec<AnyRow>>> {
        Box::pin(async move {
            let picker = Picker::new(db, self.open_columns(db));
            returning::claim(db, &picker, self, req, floors).await
        })
    }

    /// The picks, and the earliest `next_attempt_at` of the unfinished rows, through the
    /// same partial index the picks walk (NULL when none is unfinished). Read over at most
    /// [`QUIET_SCAN`] rows, so that a table of many rows waiting far ahead (scheduled sends)
    /// does not make every idle read walk them all: with more, no promise (zero), and the
    /// relay reads every poll interval as it did.
    fn probe<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        floors: &'a Floors,
    ) -> BoxFuture<'a, anyhow::Result<Probe>> {
        Box::pin(async move {
            let picker = Picker::new(db, self.open_columns(db));
            let mut q = Sql::new("SELECT (");
            q.append(any_row(db, &picker, plan(req), req, floors));
            let c = db.cols();
            // A mapped table's NULL is due now.
            let next = match c.mapped {
                true => format!("COALESCE(o.{}, now())", c.next_attempt_at),
                false => format!("o.{}", c.next_attempt_at),
            };
            q.push(&format!(
                "), (SELECT CASE WHEN COUNT(*) < {QUIET_SCAN} \
                 THEN EXTRACT(EPOCH FROM MIN(w.next) - now())::float8 ELSE 0 END \
                 FROM (SELECT {next} AS next FROM {} o WHERE {} LIMIT {QUIET_SCAN}) w)",
                db.table(),
                c.open("o.")
            ));
            let row = db.query(q).fetch_one(db.pool()).await?;
            if row.try_get::<Option<i32>, _>(0)?.is_some() {
                return Ok(Probe::Claimable);
            }
            let quiet_for = match row.try_get::<Option<f64>, _>(1)? {
                None => Duration::MAX,
                // Past (due but not claimable), or not a number of seconds (an `infinity`
                // timestamp): no promise.
                Some(secs) => Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO),
            };
            Ok(Probe::Nothing { quiet_for })
        })
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
            by_token(q, id, rows);
            q.push(")");
        } else {
            by_token(q, id, rows);
        }
    }
}
