//! Claiming rows: what a claim picks (the same on every database), the `UPDATE ... RETURNING`
//! claim of PostgreSQL and SQLite (MySQL's is in `mysql.rs`), and the per-row decoding of what
//! claims return.
//!
//! Guarantees: a claim takes only due rows that are not under a live claim and are the head
//! of their ordering key, in id order, and (with a fence) only while the lease epoch is still
//! the claimer's; with [`Budgets`] it takes at most each channel's budget, so one channel's
//! backlog never fills the relay while another's rows wait; a row whose columns cannot be
//! decoded or whose payload is over the limit comes back [`ClaimedRow::undeliverable`] instead
//! of failing the claim of its neighbours; a payload over the limit is never loaded.

use std::time::Duration;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::builder::Sql;
use super::cursor::Floors;
use super::sql::SqlStore;
use super::{ClaimRequest, ClaimedRow, Dialect, Probe, Undeliverable};
use crate::sink::Delivery;

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

    /// The select list of a claim: one expression per [`Col`], in [`Col::ALL`] order, which
    /// is the order [`to_claimed`] reads them in. The payload is returned only when it is
    /// within the request's size limit (NULL otherwise), with its length beside it, so an
    /// oversized payload is never loaded.
    pub(super) fn returning_columns(&self, alias: &str, req: &ClaimRequest) -> String {
        let d = self.dialect;
        let cols = &self.cols;
        let c = |name: &str| format!("{alias}{name}");
        let payload = cols.payload(alias, d);
        let expr = |col: Col| match col {
            Col::Id => c(&cols.id),
            Col::Channel => d.claim_text(&cols.channel(alias)),
            Col::Recipient => d.claim_text(&cols.text_or_null(alias, &cols.recipient, d)),
            Col::OrderingKey => d.claim_text(&cols.text_or_null(alias, &cols.ordering_key, d)),
            Col::Payload => {
                let text = d.claim_text(&d.payload_text(&payload));
                match req.max_payload_bytes {
                    // An integer from the configuration, not user text: safe in the SQL.
                    Some(max) => format!(
                        "CASE WHEN {} <= {max} THEN {text} END",
                        d.byte_length(&payload)
                    ),
                    None => text,
                }
            }
            // Whatever an application stored there, only an integer is read as one.
            Col::Attempts if d == Dialect::Sqlite => format!(
                "CASE WHEN typeof({a}) = 'integer' THEN {a} END",
                a = c(&cols.attempts)
            ),
            Col::Attempts => c(&cols.attempts),
            Col::Age => match &cols.created_at {
                Some(at) => d.age_ms(&c(at)),
                None => d.null_int().to_string(),
            },
            Col::PayloadLen => d.byte_length(&payload),
            Col::Classes => {
                // The same expressions the claim reads (a mapped column is read as text).
                let typed = [
                    cols.channel(alias),
                    cols.text_or_null(alias, &cols.recipient, d),
                    payload.clone(),
                    cols.text_or_null(alias, &cols.ordering_key, d),
                    c(&cols.attempts),
                ];
                d.storage_classes(&typed, &[c(&cols.next_attempt_at)])
            }
        };
        Col::ALL
            .iter()
            .map(|col| expr(*col))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What a claim returns, in select-list order: [`SqlStore::returning_columns`] writes one
/// expression per variant and [`to_claimed`] reads each by [`Col::at`], so the two cannot
/// disagree about positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Id,
    Channel,
    Recipient,
    Payload,
    Attempts,
    /// `now - created_at` in milliseconds, on the database clock.
    Age,
    OrderingKey,
    /// The payload's length in bytes (the payload itself may be withheld).
    PayloadLen,
    /// SQLite: the storage class of each column in [`CLASS_CHECKS`] (NULL elsewhere).
    Classes,
}

/// How many columns a claim's select list has (see [`SqlStore::returning_columns`]): a claim
/// may add its own after them.
pub(super) const RETURNED_COLUMNS: usize = Col::ALL.len();

impl Col {
    const ALL: [Col; 9] = [
        Col::Id,
        Col::Channel,
        Col::Recipient,
        Col::Payload,
        Col::Attempts,
        Col::Age,
        Col::OrderingKey,
        Col::PayloadLen,
        Col::Classes,
    ];

    /// Its position in the select list.
    fn at(self) -> usize {
        self as usize
    }

    /// The table column it reads, for expressions and messages.
    fn name(self) -> &'static str {
        match self {
            Col::Id => "id",
            Col::Channel => "channel",
            Col::Recipient => "recipient",
            Col::Payload => "payload",
            Col::Attempts => "attempts",
            Col::Age => "created_at",
            Col::OrderingKey => "ordering_key",
            Col::PayloadLen => "payload",
            Col::Classes => "storage classes",
        }
    }
}

/// Whether a claimed row has an ordering key (a key that cannot be read counts as one: the
/// row is failed later by [`to_claimed`], and meanwhile it is treated with the most care).
pub(super) fn has_ordering_key(row: &AnyRow) -> bool {
    row.try_get::<Option<String>, _>(Col::OrderingKey.at())
        .map_or(true, |k| k.is_some())
}

/// SQLite: the columns whose storage class is checked, and the class each must hold, in the
/// order `Col::Classes` lists them.
const CLASS_CHECKS: [(&str, &str); 6] = [
    ("channel", "text"),
    ("recipient", "text"),
    ("payload", "text"),
    ("ordering_key", "text"),
    ("attempts", "integer"),
    ("next_attempt_at", "time"),
];

/// Decodes one claimed row, column by column: a column that cannot be read makes the row
/// [`ClaimedRow::undeliverable`] (naming the column) instead of failing the whole claim.
/// Only an unreadable id fails: without it the row cannot be addressed at all.
pub fn to_claimed(row: &AnyRow, req: &ClaimRequest) -> anyhow::Result<ClaimedRow> {
    let id: i64 = row
        .try_get(Col::Id.at())
        .map_err(|e| anyhow::anyhow!("a claimed row's id could not be read: {e}"))?;
    let mut defects: Vec<String> = Vec::new();
    // SQLite: a value stored with another storage class than the column's (BLOB, integer,
    // real where text is expected) is refused by name, not coerced into something else.
    if let Ok(Some(classes)) = row.try_get::<Option<String>, _>(Col::Classes.at()) {
        for ((name, want), got) in CLASS_CHECKS.iter().zip(classes.split(',')) {
            if got != *want && got != "null" {
                defects.push(format!(
                    "column {name} holds a value of type {got}; {want} expected"
                ));
            }
        }
    }
    let mut text = |col: Col| -> Option<String> {
        match text_value(row, col.at()) {
            Ok(v) => v,
            Err(e) => {
                defects.push(format!("column {} could not be read: {e}", col.name()));
                None
            }
        }
    };
    let channel = text(Col::Channel);
    let recipient = text(Col::Recipient);
    let payload = text(Col::Payload);
    let ordering_key = text(Col::OrderingKey);
    if channel.is_none() && defects.is_empty() {
        defects.push("column channel is NULL".into());
    }
    let attempts = match row.try_get::<Option<i64>, _>(Col::Attempts.at()) {
        Ok(a) => a.unwrap_or(0),
        Err(e) => {
            defects.push(format!(
                "column attempts could not be read: {}",
                decode_error(&e)
            ));
            0
        }
    };
    let age_ms = row
        .try_get::<Option<i64>, _>(Col::Age.at())
        .ok()
        .flatten()
        .unwrap_or(0);
    let payload_len = row
        .try_get::<Option<i64>, _>(Col::PayloadLen.at())
        .ok()
        .flatten();
    let mut too_large = None;
    let payload = match payload {
        Some(p) => p,
        None => {
            match (payload_len, req.max_payload_bytes) {
                (Some(len), Some(max)) if len > max as i64 => too_large = Some(len as u64),
                (None, _) => defects.push("column payload is NULL".into()),
                _ => {}
            }
            String::new()
        }
    };
    let undeliverable = if !defects.is_empty() {
        Some(Undeliverable::Unreadable(defects.join("; ")))
    } else {
        too_large.map(|bytes| Undeliverable::TooLarge { bytes })
    };
    Ok(ClaimedRow {
        delivery: Delivery {
            id,
            channel: channel.unwrap_or_default(),
            recipient,
            payload,
            attempts: attempts.clamp(0, u32::MAX as i64) as u32,
        },
        ordering_key,
        age_at_claim: Duration::from_millis(age_ms.max(0) as u64),
        undeliverable,
    })
}

/// A text column of a claim (text on PostgreSQL, bytes elsewhere), as a checked `String`.
fn text_value(row: &AnyRow, i: usize) -> Result<Option<String>, String> {
    if let Ok(v) = row.try_get::<Option<String>, _>(i) {
        return Ok(v);
    }
    match row.try_get::<Option<Vec<u8>>, _>(i) {
        Ok(None) => Ok(None),
        Ok(Some(bytes)) => String::from_utf8(bytes).map(Some).map_err(|e| {
            format!(
                "not valid UTF-8 (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            )
        }),
        Err(e) => Err(decode_error(&e)),
    }
}

/// A decode error without the driver's internals: "mismatched types; ..." or "invalid
/// UTF-8 ...", as one line.
fn decode_error(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::ColumnDecode { source, .. } => source.to_string(),
        other => other.to_string(),
    }
    .replace('\n', " ")
}

impl SqlStore {
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
                match (order, &filter) {
                    // The newest pick looks only at the channel's newest unfinished rows (a
                    // window a few times its size, read from the end of the index): when
                    // those are all waiting behind earlier rows of their ordering keys, it
                    // finds nothing at once instead of walking the whole backlog.
                    (Order::Newest, Filter::Channel(c)) => {
                        q.push(&format!(
                            "SELECT {cols} FROM {t} o WHERE o.{id} IN (SELECT w.{id} FROM \
                             (SELECT n.{id} FROM {t} n {hint} WHERE {} = ",
                            self.pick_channel("n.")
                        ))
                        .text(c)
                        .push(&format!(
                            " AND {open} ORDER BY n.{id} DESC LIMIT {}) w) \
                             AND {claimable}",
                            n.saturating_mul(NEWEST_WINDOW)
                        ));
                    }
                    _ => {
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
        if matches!(self.dialect, Dialect::MySql { .. }) {
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
