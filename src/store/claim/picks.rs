//! What a claim picks, the same on every database: the claimable condition (due, under no
//! live claim, the head of its ordering key) and one `SELECT` per pick of the [`plan`],
//! walking the unfinished rows of its channel in id order from the channel's floor.

use super::cursor::Floors;
use super::plan::{Filter, NEWEST_WINDOW, Order, Pick};
use super::window::WINDOW_PER_ROW;
use crate::store::db::Db;
use crate::store::model::ClaimRequest;
use crate::store::sql::Sql;

/// The columns the picks filter channels and ordering keys on, and the index hint that makes
/// them walk unfinished rows only. Where the database has partial indexes of unfinished rows
/// the defaults serve; where it has none, it indexes columns that hold the channel and key of
/// unfinished rows only (NULL once finished) and names them here.
#[derive(Clone, Debug, Default)]
pub struct OpenColumns {
    /// The channel of unfinished rows; `None`: the channel column itself.
    pub channel: Option<String>,
    /// The ordering key of unfinished rows; `None`: the key column itself.
    pub key: Option<String>,
    /// Written after the table in the picks' `FROM` (an index hint), or empty.
    pub hint: String,
}

/// How a pick is fenced on the lease epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickFence {
    None,
    /// The statement has a `fence` CTE holding a shared lock on the lease row.
    Cte,
    /// Each pick checks the epoch itself (for a statement that runs under the database's
    /// single write lock, so the checks cannot disagree).
    Inline,
}

/// Builds the picks of one table.
pub struct Picker<'a> {
    db: &'a Db,
    open: OpenColumns,
}

impl<'a> Picker<'a> {
    pub fn new(db: &'a Db, open: OpenColumns) -> Picker<'a> {
        Picker { db, open }
    }

    /// The condition a row `o` must meet to be claimed: due, not under a live claim, and the
    /// head of its ordering key (no placeholders).
    pub fn claimable(&self) -> String {
        let (c, s) = (self.db.cols(), self.db.syntax());
        let now = s.now();
        let due = c.due("o.", s);
        let open = c.open("o.");
        let keyed = match (&c.ordering_key, self.behind_an_earlier_row()) {
            (Some(k), Some(behind)) => format!(" AND (o.{k} IS NULL OR NOT {behind})"),
            _ => String::new(),
        };
        format!(
            "{open} AND {due}
             AND (o.claimed_until IS NULL OR o.claimed_until < {now}){keyed}"
        )
    }

    /// `EXISTS` an unfinished row of row `o`'s ordering key with a lower id: `o` is not the
    /// head of its key. `None` when the table has no ordering key.
    pub fn behind_an_earlier_row(&self) -> Option<String> {
        let (t, c) = (self.db.table(), self.db.cols());
        let k = c.ordering_key.as_ref()?;
        let open_key = self.open.key.as_ref().unwrap_or(k);
        let id = &c.id;
        Some(format!(
            "EXISTS (SELECT 1 FROM {t} p WHERE p.{open_key} = o.{k} AND p.{id} < o.{id} AND {})",
            c.open("p.")
        ))
    }

    /// The channel of row `a` as the picks filter it: the open channel column, else the
    /// mapped column (or the constant, which the planner folds away).
    fn channel(&self, a: &str) -> String {
        match &self.open.channel {
            Some(open) => format!("{a}{open}"),
            None => self.db.cols().channel(a),
        }
    }

    /// One pick per entry of `picks` (a claim's plan, or one that reads candidates with
    /// more rows than it takes): the ids (or `cols`) of up to `n` claimable rows of one
    /// channel, or of every channel but some, in id order (`{pick}` in `cols` is the pick's
    /// index there). `lock` is appended to each pick, `fence` adds its condition to each.
    pub fn picks(
        &self,
        picks: Vec<Pick<'_>>,
        req: &ClaimRequest,
        floors: &Floors,
        cols: &str,
        lock: &str,
        fence: PickFence,
    ) -> Vec<Sql> {
        let claimable = self.claimable();
        picks
            .into_iter()
            .enumerate()
            .map(|(i, (filter, n, order))| {
                let cols = cols.replace("{pick}", &i.to_string());
                let mut q = self.from(&cols, filter, n, order, floors, &claimable);
                self.filter(&mut q, filter, order, floors);
                fence_pick(&mut q, fence, req);
                let id = &self.db.cols().id;
                match order {
                    Order::Oldest => q.push(&format!(" ORDER BY o.{id} LIMIT ")),
                    Order::Newest => q.push(&format!(" ORDER BY o.{id} DESC LIMIT ")),
                    Order::Any => q.push(" LIMIT "),
                }
                .int(n as i64)
                .push(" ")
                .push(lock);
                q
            })
            .collect()
    }

    /// `SELECT {cols} FROM` the table `WHERE` claimable: the whole table, or a window.
    ///
    /// A window: the newest pick looks only at the channel's newest unfinished rows (a few
    /// times its size, read from the end of the index), so that when those all wait behind
    /// earlier rows of their ordering keys it finds nothing at once instead of walking the
    /// whole backlog; a windowed oldest pick (`window.rs`) only at the first rows above the
    /// floor, where the heads of keys that came free are.
    fn from(
        &self,
        cols: &str,
        filter: Filter<'_>,
        n: u32,
        order: Order,
        floors: &Floors,
        claimable: &str,
    ) -> Sql {
        let (t, id, hint) = (self.db.table(), &self.db.cols().id, &self.open.hint);
        let window = match (order, &filter) {
            (Order::Newest, Filter::Channel(c)) => Some((*c, " DESC", NEWEST_WINDOW, None)),
            (Order::Oldest, Filter::Channel(c)) if floors.windowed.contains(*c) => {
                Some((*c, "", WINDOW_PER_ROW, floors.get(c)))
            }
            _ => None,
        };
        let Some((c, desc, per_row, floor)) = window else {
            return Sql::new(&format!(
                "SELECT {cols} FROM {t} o {hint} WHERE {claimable}"
            ));
        };
        let mut q = Sql::new(&format!(
            "SELECT {cols} FROM {t} o WHERE o.{id} IN (SELECT w.{id} FROM \
             (SELECT n.{id} FROM {t} n {hint} WHERE {} = ",
            self.channel("n.")
        ));
        q.text(c)
            .push(&format!(" AND {}", self.db.cols().open("n.")));
        if let Some(floor) = floor {
            q.push(&format!(" AND n.{id} > ")).int(*floor);
        }
        q.push(&format!(
            " ORDER BY n.{id}{desc} LIMIT {}) w) AND {claimable}",
            n.saturating_mul(per_row)
        ));
        q
    }

    /// The pick's channel condition, and its floor.
    fn filter(&self, q: &mut Sql, filter: Filter<'_>, order: Order, floors: &Floors) {
        let id = &self.db.cols().id;
        match filter {
            // The window already holds the channel's rows only.
            Filter::Channel(_) if order == Order::Newest => {}
            Filter::Channel(c) => {
                q.push(&format!(" AND {} = ", self.channel("o."))).text(c);
                // See cursor.rs: the rows below the floor were not claimable, or are ours,
                // when a claim last looked.
                if let Some(floor) = floors.get(c) {
                    q.push(&format!(" AND o.{id} > ")).int(*floor);
                }
            }
            // An open channel column is NULL for finished rows, which its index leaves out.
            Filter::NotIn([]) if self.open.channel.is_some() => {
                q.push(&format!(" AND {} IS NOT NULL", self.channel("o.")));
            }
            Filter::NotIn([]) => {}
            // A mapped channel column may hold NULL, which no sink serves: such a row is
            // claimed here and failed naming the column, not left unclaimed for ever.
            Filter::NotIn(cs) if self.db.cols().mapped => {
                let ch = self.channel("o.");
                q.push(&format!(" AND ({ch} IS NULL OR {ch} NOT IN ("))
                    .texts(cs)
                    .push("))");
            }
            Filter::NotIn(cs) => {
                q.push(&format!(" AND {} NOT IN (", self.channel("o.")))
                    .texts(cs)
                    .push(")");
            }
        }
    }
}

/// Adds `fence`'s condition to a pick.
fn fence_pick(q: &mut Sql, fence: PickFence, req: &ClaimRequest) {
    match (fence, &req.fence) {
        (PickFence::Cte, _) => {
            q.push(" AND EXISTS (SELECT 1 FROM fence)");
        }
        (PickFence::Inline, Some(f)) => {
            q.push(" AND EXISTS (SELECT 1 FROM outbox_relay_lease WHERE name = ")
                .text(&f.lease)
                .push(" AND epoch = ")
                .int(f.epoch)
                .push(")");
        }
        _ => {}
    }
}

/// The picks as one statement: each in parentheses, joined by `UNION ALL`.
pub fn union_all(picks: Vec<Sql>) -> Sql {
    let mut select = Sql::default();
    for (i, p) in picks.into_iter().enumerate() {
        if i > 0 {
            select.push(" UNION ALL ");
        }
        select.push("(").append(p).push(")");
    }
    select
}
