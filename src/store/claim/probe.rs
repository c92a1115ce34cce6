//! The idle read (`Queue::probe`): whether anything is claimable now, read as the claim's
//! picks would find it, with no lock, no fence, no write and no transaction, stopping at the
//! first row (docs/design.md, "Idle cost"). A database may first ask an index whether any
//! unfinished row is due at all, or read more in the same statement; see each database's
//! `ClaimSql::probe`.

use std::time::Duration;

use super::cursor::Floors;
use super::picks::{PickFence, Picker};
use super::plan::{Filter, Order, Pick, plan};
use crate::store::db::Db;
use crate::store::model::{ClaimRequest, Probe};
use crate::store::sql::Sql;

/// The picks of the idle read: the claim's, with the rows of other channels in any order
/// when `any_order` (see `ClaimSql::any_order`).
pub fn picks(req: &ClaimRequest, any_order: bool) -> Vec<Pick<'_>> {
    let mut picks = plan(req);
    if any_order {
        for (filter, _, order) in &mut picks {
            if matches!(filter, Filter::NotIn(_)) {
                *order = Order::Any;
            }
        }
    }
    picks
}

/// `SELECT 1 FROM (<pick>) p0 UNION ALL ... LIMIT 1`: one row when any pick finds one.
pub fn any_row(
    db: &Db,
    picker: &Picker<'_>,
    picks: Vec<Pick<'_>>,
    req: &ClaimRequest,
    floors: &Floors,
) -> Sql {
    let id = &db.cols().id;
    let picks = picker.picks(picks, req, floors, &format!("o.{id}"), "", PickFence::None);
    let mut q = Sql::default();
    for (i, p) in picks.into_iter().enumerate() {
        if i > 0 {
            q.push(" UNION ALL ");
        }
        q.push("SELECT 1 FROM (").append(p).push(&format!(") p{i}"));
    }
    q.push(" LIMIT 1");
    q
}

/// Runs [`any_row`]'s statement: claimable, or nothing with no promise for later.
pub async fn run_any_row(db: &Db, q: Sql) -> anyhow::Result<Probe> {
    let found = db.query(q).fetch_optional(db.pool()).await?.is_some();
    Ok(match found {
        true => Probe::Claimable,
        false => NOTHING,
    })
}

/// Nothing claimable now, and no promise about later.
pub const NOTHING: Probe = Probe::Nothing {
    quiet_for: Duration::ZERO,
};
