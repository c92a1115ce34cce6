//! Claiming rows: what a claim picks (the same on every database) and the
//! `UPDATE ... RETURNING` claim of PostgreSQL and SQLite (MySQL's is in `mysql_claim.rs`;
//! what every claim returns, and how each row is decoded, is in `returned.rs`).
//!
//! Guarantees: a claim takes only due rows that are not under a live claim and are the head
//! of their ordering key, in id order, and (with a fence) only while the lease epoch is still
//! the claimer's; with [`Budgets`] it takes at most each channel's budget, so one channel's
//! backlog never fills the relay while another's rows wait.

use std::time::Duration;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::builder::Sql;
use super::cursor::Floors;
use super::sql::SqlStore;
use super::window::WINDOW_PER_ROW;
use super::{ClaimRequest, Dialect, Probe};

/// Most unfinished rows an idle read on PostgreSQL looks at to say when the next one is due
/// (see `probe_picks`).
const QUIET_SCAN: u32 = 1000;

impl SqlStore {
    /// The condition a row `o` must meet to be claimed: due, not under a live claim, and the
    /// head of its ordering key (no placeholders).
    pub(super) fn claimable(&self) -> String {
        let c = &self.cols;
        let now = self.dialect.now();
        let due = c.due("o.", self.dialect);
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
    pub(super) fn behind_an_earlier_row(&self) -> Option<String> {
        let (t, c) = (&self.table, &self.cols);
        let (k, open_key) = (c.ordering_key.as_ref()?, self.open_columns().1?);
        let id = &c.id;
        Some(format!(
            "EXISTS (SELECT 1 FROM {t} p WHERE p.{open_key} = o.{k} AND p.{id} < o.{id} AND {})",
            c.open("p.")
        ))
    }

    /// The columns the picks filter channels and ordering keys on, and the index hint that
    /// makes the picks walk unfinished rows only. PostgreSQL and SQLite have partial indexes
    /// of unfinished rows; MySQL has none, so there the virtual columns `open_channel` and
    /// `open_key` (the channel and key of unfinished rows, NULL once finished; schema version
    /// 5) are indexed instead, and the hint keeps the optimizer from walking the primary key
    /// over every finished row for the sake of `ORDER BY id`.
    fn open_columns(&self) -> (&'static str, Option<String>, String) {
        let c = &self.cols;
        match self.dialect {
            Dialect::MySql { .. } => (
                "open_channel",
                c.ordering_key.as_ref().map(|_| "open_key".into()),
                format!("FORCE INDEX ({}_open_idx)", self.table),
            ),
            _ => ("", c.ordering_key.clone(), String::new()),
        }
    }

    /// The channel of row `a` as the picks filter it: MySQL's indexed virtual column, else
    /// the mapped column (or the constant, which the planner folds away).
    fn pick_channel(&self, a: &str) -> String {
        match self.open_columns().0 {
            "" => self.cols.channel(a),
            open => format!("{a}{open}"),
        }
    }
    /// One pick per budget: the ids (or `cols`) of up to `n` claimable rows of one channel,
    /// or of every channel but some, in id order (see [`plan`]; `{pick}` in `cols` is the
    /// pick's index there). `lock` is appended to each pick
    /// (PostgreSQL: `FOR UPDATE OF o SKIP LOCKED`), `fence` adds its condition to each. A
    /// request without budgets is one pick of `limit` rows of any channel not excluded.
    pub(super) fn picks(
        &self,
        req: &ClaimRequest,
        floors: &Floors,
        cols: &str,
        lock: &str,
        fence: &PickFence,
    ) -> Vec<Sql> {
        self.picks_of(plan(req), req, floors, cols, lock, fence)
    }

    /// [`SqlStore::picks`] of a given [`plan`] (MySQL's claim-mode claim reads each pick's
    /// candidates with more rows than it takes).
    pub(super) fn picks_of(
        &self,
        filters: Vec<(Filter<'_>, u32, Order)>,
        req: &ClaimRequest,
        floors: &Floors,
        cols: &str,
        lock: &str,
        fence: &PickFence,
    ) -> Vec<Sql> {
        let t = &self.table;
        let claimable = self.claimable();
        let (_, _, hint) = self.open_columns();
        let (id, mysql) = (&self.cols.id, matches!(self.dialect, Dialect::MySql { .. }));
        let open = self.cols.open("n.");
        filters
            .into_iter()
            .enumerate()
            .map(|(i, (filter, n, order))| {
                let cols = cols.replace("{pick}", &i.to_string());
                let mut q = Sql::default();
                // A window: the newest pick looks only at the channel's newest unfinished
                // rows (a few times its size, read from the end of the index), so that when
                // those all wait behind earlier rows of their ordering keys it finds nothing
                // at once instead of walking the whole backlog; a windowed oldest pick
                // (`window.rs`) only at the first rows above the floor, where the heads of
                // keys that came free are.
                let window = match (order, &filter) {
                    (Order::Newest, Filter::Channel(c)) => Some((c, " DESC", NEWEST_WINDOW, None)),
                    (Order::Oldest, Filter::Channel(c)) if floors.windowed.contains(*c) => {
                        Some((c, "", WINDOW_PER_ROW, floors.get(c)))
                    }
                    _ => None,
                };
                match window {
                    Some((c, desc, per_row, floor)) => {
                        q.push(&format!(
                            "SELECT {cols} FROM {t} o WHERE o.{id} IN (SELECT w.{id} FROM \
                             (SELECT n.{id} FROM {t} n {hint} WHERE {} = ",
                            self.pick_channel("n.")
                        ))
                        .text(c)
                        .push(&format!(" AND {open}"));
                        if let Some(floor) = floor {
                            q.push(&format!(" AND n.{id} > ")).int(*floor);
                        }
                        q.push(&format!(
                            " ORDER BY n.{id}{desc} LIMIT {}) w) AND {claimable}",
                            n.saturating_mul(per_row)
                        ));
                    }
                    None => {
                        q.push(&format!(
                            "SELECT {cols} FROM {t} o {hint} WHERE {claimable}"
                        ));
                    }
                }
                match filter {
                    Filter::Channel(_) if matches!(order, Order::Newest) => {}
                    Filter::Channel(c) => {
                        q.push(&format!(" AND {} = ", self.pick_channel("o.")))
                            .text(c);
                        // See cursor.rs: the rows below the floor were not claimable, or
                        // are ours, when a claim last looked.
                        if let Some(floor) = floors.get(c) {
                            q.push(&format!(" AND o.{id} > ")).int(*floor);
                        }
                    }
                    Filter::NotIn([]) if mysql => {
                        q.push(&format!(" AND {} IS NOT NULL", self.pick_channel("o.")));
                    }
                    Filter::NotIn([]) => {}
                    Filter::NotIn(cs) => {
                        q.push(&format!(" AND {} NOT IN (", self.pick_channel("o.")))
                            .texts(cs)
                            .push(")");
                    }
                }
                fence.add(&mut q, req);
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

    /// Whether any row is claimable now for `req`'s picks: one plain read of the picks (no
    /// lock, no fence, no write, no transaction), stopping at the first row ([`Queue::probe`]).
    /// On PostgreSQL the same statement also reads how long until the earliest unfinished row
    /// is due, so that an idle relay whose inserts are announced by NOTIFY can sleep until
    /// then (docs/design.md, "Idle cost").
    ///
    /// [`Queue::probe`]: super::Queue::probe
    pub(super) async fn probe_picks(
        &self,
        req: &ClaimRequest,
        floors: &Floors,
    ) -> anyhow::Result<Probe> {
        let id = &self.cols.id;
        let mut q = Sql::default();
        let mut plan = plan(req);
        let pg = self.dialect == Dialect::Postgres;
        let mysql = matches!(self.dialect, Dialect::MySql { .. });
        // MySQL and SQLite, on the relay's own table: an index alone says first whether any
        // unfinished row may be due at all (a mapped table has no such index).
        let maybe_due = match self.dialect {
            _ if self.cols.mapped => true,
            Dialect::MySql { .. } => super::mysql_claim::anything_due(self).await?,
            Dialect::Sqlite => super::sqlite::anything_due(self).await,
            Dialect::Postgres => true,
        };
        if !maybe_due {
            return Ok(Probe::Nothing {
                quiet_for: Duration::ZERO,
            });
        }
        if mysql {
            // Any row will do, so no sort: MariaDB 10.11 answered this plain read of the
            // picks of every channel but some, sorted by id, with no rows while due rows were
            // there (under load, with rows changed moments before; docs/design.md,
            // "Claim-mode locks on MySQL"). Unsorted it found them. (PostgreSQL and SQLite
            // keep the order: without it their planners may scan the table for one row.)
            for (filter, _, order) in &mut plan {
                if matches!(filter, Filter::NotIn(_)) {
                    *order = Order::Any;
                }
            }
        }
        let picks = self.picks_of(plan, req, floors, &format!("o.{id}"), "", &PickFence::None);
        if pg {
            q.push("SELECT (");
        }
        for (i, p) in picks.into_iter().enumerate() {
            if i > 0 {
                q.push(" UNION ALL ");
            }
            q.push("SELECT 1 FROM (").append(p).push(&format!(") p{i}"));
        }
        q.push(" LIMIT 1");
        if !pg {
            let found = q.query(self).fetch_optional(&self.pool).await?.is_some();
            return Ok(match found {
                true => Probe::Claimable,
                false => Probe::Nothing {
                    quiet_for: Duration::ZERO,
                },
            });
        }
        // The earliest next_attempt_at of the unfinished rows, through the same partial index
        // the picks walk (NULL when none is unfinished). A mapped table's NULL is due now.
        // Read over at most QUIET_SCAN rows, so that a table of many rows waiting far ahead
        // (scheduled sends) does not make every idle read walk them all: with more, no
        // promise (zero), and the relay reads every poll interval as it did.
        let c = &self.cols;
        let next = match c.mapped {
            true => format!("COALESCE(o.{}, now())", c.next_attempt_at),
            false => format!("o.{}", c.next_attempt_at),
        };
        q.push(&format!(
            "), (SELECT CASE WHEN COUNT(*) < {QUIET_SCAN} \
             THEN EXTRACT(EPOCH FROM MIN(w.next) - now())::float8 ELSE 0 END \
             FROM (SELECT {next} AS next FROM {} o WHERE {} LIMIT {QUIET_SCAN}) w)",
            self.table,
            c.open("o.")
        ));
        let row = q.query(self).fetch_one(&self.pool).await?;
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
    }

    /// PostgreSQL and SQLite: the picks as CTEs, and one `UPDATE ... RETURNING` (MySQL:
    /// [`super::mysql_claim::claim`]).
    pub(super) async fn claim_returning(
        &self,
        req: &ClaimRequest,
        floors: &Floors,
    ) -> anyhow::Result<Vec<AnyRow>> {
        let t = &self.table;
        let d = self.dialect;
        let pg = d == Dialect::Postgres;
        let mut q = Sql::default();
        q.push("WITH ");
        let fence = if pg {
            if let Some(f) = &req.fence {
                // One shared lock on the lease row for the whole statement (see claim()).
                q.push("fence AS (SELECT 1 FROM outbox_relay_lease WHERE name = ")
                    .text(&f.lease)
                    .push(" AND epoch = ")
                    .int(f.epoch)
                    .push(" FOR SHARE), ");
                PickFence::Cte
            } else {
                PickFence::None
            }
        } else if req.fence.is_some() {
            PickFence::Inline
        } else {
            PickFence::None
        };
        let lock = if pg {
            "FOR UPDATE OF o SKIP LOCKED"
        } else {
            ""
        };
        let id = &self.cols.id;
        let picks = self.picks(req, floors, &format!("o.{id}"), lock, &fence);
        let names: Vec<String> = (0..picks.len()).map(|i| format!("p{i}")).collect();
        for (i, p) in picks.into_iter().enumerate() {
            if i > 0 {
                q.push(", ");
            }
            q.push(&format!("p{i} AS (")).append(p).push(")");
        }
        let union = names
            .iter()
            .map(|n| format!("SELECT {id} FROM {n}"))
            .collect::<Vec<_>>()
            .join(" UNION ");
        q.push(&format!(" UPDATE {t} "));
        if pg {
            q.push("u ");
        }
        q.push("SET claimed_by = ")
            .text(&req.claimer)
            .push(", claim_token = ")
            .text(&req.token)
            .push(", claimed_until = ");
        // Only the claim columns change, none of them indexed: on PostgreSQL the claim can be
        // a HOT update (no index entries written; see schema version 4), and MySQL touches no
        // secondary index. `updated_at` records changes of status, which a claim is not.
        q.now_plus(d, req.ttl).push(" ");
        if pg {
            // The picked ids as one array, looked up in the primary key: the same plan
            // whatever the picks' estimate. (Joined to the picks instead, the generic plan,
            // which assumes a `LIMIT $n` keeps a tenth of the rows, hashed the whole table;
            // see sql.rs, plan_cache_mode.)
            q.push(&format!(
                "WHERE u.{id} = ANY(ARRAY({union})) RETURNING {}",
                self.returning_columns("u.", req)
            ));
        } else {
            q.push(&format!(
                "WHERE {id} IN ({union}) RETURNING {}",
                self.returning_columns("", req)
            ));
        }
        Ok(q.query(self).fetch_all(&self.pool).await?)
    }
}

/// The share of a channel's budget taken newest first (one in eight, at least one row).
const NEWEST_SHARE: u32 = 8;

/// How many of a channel's `budget` rows its newest pick takes.
pub(super) fn newest_share(budget: u32, newest: bool) -> u32 {
    if newest && budget >= 2 {
        (budget / NEWEST_SHARE).max(1)
    } else {
        0
    }
}

/// The picks of a claim, in the order [`SqlStore::picks`] makes them: which channels each
/// takes, how many rows, from which end.
pub(super) fn plan(req: &ClaimRequest) -> Vec<(Filter<'_>, u32, Order)> {
    // Each channel's budget is taken oldest first, but for a share taken newest first:
    // under a backlog, a row just committed is sent within one claim instead of after
    // the whole backlog (the order of a channel's rows is not a promise; an ordering
    // key's is, and only the head of a key is ever claimable). The two picks can meet
    // when the channel has fewer rows due than its budget; the claim takes such a row once.
    match &req.budgets {
        Some(b) => b
            .channels
            .iter()
            .flat_map(|(c, n)| {
                let newest = newest_share(*n, req.newest);
                [
                    (Filter::Channel(c), n - newest, Order::Oldest),
                    (Filter::Channel(c), newest, Order::Newest),
                ]
            })
            .filter(|(_, n, _)| *n > 0)
            .chain(
                b.others
                    .iter()
                    .map(|(known, n)| (Filter::NotIn(known), *n, Order::Oldest)),
            )
            .collect(),
        None => vec![(
            Filter::NotIn(&req.exclude_channels),
            req.limit,
            Order::Oldest,
        )],
    }
}

/// How many of a channel's newest unfinished rows the newest pick looks at, per row it takes.
const NEWEST_WINDOW: u32 = 4;

/// Which end of a channel's due rows a pick starts from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    Oldest,
    Newest,
    /// Whichever rows the index gives first: for a read that only asks whether any row is
    /// claimable.
    Any,
}

/// Which channels one pick takes.
#[derive(Clone, Copy)]
pub(super) enum Filter<'a> {
    Channel(&'a str),
    /// Every channel but these (none: every channel).
    NotIn(&'a [String]),
}

/// How a pick is fenced on the lease epoch.
pub(super) enum PickFence {
    None,
    /// PostgreSQL: the statement's `fence` CTE holds a shared lock on the lease row.
    Cte,
    /// SQLite: each pick checks the epoch itself (the statement runs under the database's
    /// single write lock, so the checks cannot disagree).
    Inline,
}

impl PickFence {
    fn add(&self, q: &mut Sql, req: &ClaimRequest) {
        match (self, &req.fence) {
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
}
