//! The claim as one `UPDATE ... RETURNING` (databases that have it): the picks as CTEs, the
//! picked rows marked claimed, and the select list returned. Each database gives its own
//! form ([`ReturningForm`]): how the lease epoch is fenced, how each pick locks, how the
//! picked ids are looked up.

use sqlx::any::AnyRow;

use super::cursor::Floors;
use super::picks::{PickFence, Picker};
use super::plan::plan;
use super::returned::select_list;
use crate::store::db::Db;
use crate::store::model::{ClaimRequest, Fence};
use crate::store::sql::Sql;

/// What differs in the `UPDATE ... RETURNING` claim between databases.
pub trait ReturningForm: Sync {
    /// Fences the claim on `f`: writes what the statement needs before the picks (after
    /// `WITH`, ending in `, `) and says how each pick checks it.
    fn fence(&self, q: &mut Sql, f: &Fence) -> PickFence;

    /// Appended to each pick (a row lock), or empty.
    fn lock(&self) -> &'static str {
        ""
    }

    /// The alias of the updated table (`UPDATE t <alias>`), or empty.
    fn target(&self) -> &'static str {
        ""
    }

    /// The condition that the updated row's `id` is among `picked` (a `SELECT` of ids).
    fn picked(&self, id: &str, picked: &str) -> String {
        format!("{id} IN ({picked})")
    }
}

/// Claims `req`'s picks from `floors` in one statement; the rows come back in no order.
pub async fn claim(
    db: &Db,
    picker: &Picker<'_>,
    form: &dyn ReturningForm,
    req: &ClaimRequest,
    floors: &Floors,
) -> anyhow::Result<Vec<AnyRow>> {
    let mut q = Sql::new("WITH ");
    let fence = match &req.fence {
        Some(f) => form.fence(&mut q, f),
        None => PickFence::None,
    };
    let id = &db.cols().id;
    let picks = picker.picks(
        plan(req),
        req,
        floors,
        &format!("o.{id}"),
        form.lock(),
        fence,
    );
    let mut names = Vec::with_capacity(picks.len());
    for (i, p) in picks.into_iter().enumerate() {
        if i > 0 {
            q.push(", ");
        }
        q.push(&format!("p{i} AS (")).append(p).push(")");
        names.push(format!("SELECT {id} FROM p{i}"));
    }
    let target = form.target();
    let (table, alias) = match target {
        "" => (db.table().to_string(), String::new()),
        t => (format!("{} {t}", db.table()), format!("{t}.")),
    };
    q.push(&format!(" UPDATE {table} SET claimed_by = "))
        .text(&req.claimer)
        .push(", claim_token = ")
        .text(&req.token)
        .push(", claimed_until = ");
    // Only the claim columns change, none of them indexed: the claim changes no index entry
    // where the database can avoid it (docs/design.md, "HOT claims"). `updated_at` records
    // changes of status, which a claim is not.
    q.now_plus(db.syntax(), req.ttl).push(&format!(
        " WHERE {} RETURNING {}",
        form.picked(&format!("{alias}{id}"), &names.join(" UNION ")),
        select_list(db, &alias, req)
    ));
    Ok(db.query(q).fetch_all(db.pool()).await?)
}
