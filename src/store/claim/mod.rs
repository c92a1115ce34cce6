//! Claiming rows (docs/design.md, "Claims"). A claim is two statements:
//!
//! 1. a plain read of the plan's parts (`plan.rs`, `read.rs`): per channel a window of its
//!    oldest unfinished rows above the floor (and some claims one of its newest), per
//!    ordering key this store just freed the key's first unfinished rows, per key the relay
//!    has rows in flight the rows behind its tail, and the rows of channels no sink serves;
//!    each bounded, each through an index of unfinished rows;
//! 2. the claim of the rows chosen from it (`choose.rs`), by id, rechecked by the database
//!    (each database's [`ClaimSql::claim_ids`]).
//!
//! A leader's claim under a backlog may skip the read: it takes the rows the last claim's
//! window read beyond its budget (`windows.rs`); and the rows read ahead of keys in flight as
//! they were read, not again by id (`keys.rs`).
//!
//! Then the floors learn how far each window looked (`cursor.rs`), and a key's run that lost a
//! row between the two statements gives back the rows behind the gap.
//!
//! Guarantees (G1, G2): a claim takes only unfinished rows that are due and not under a live
//! claim, and a row of an ordering key only when every earlier unfinished row of its key is
//! taken by the same claim (a *run*: the head and the rows right behind it), in id order, or
//! the nearest one not taken is a tail the request offers and its claimer holds under a live
//! claim (a *chain*, docs/design.md "Ordering keys: chains");
//! with a fence, only while the lease epoch is still the claimer's; at most each channel's
//! budget. The database rechecks all of it in the claim statement, so what the read saw can
//! only make a claim take fewer rows, never a row it may not take. A claim's cost does not
//! grow with the rows queued behind ordering keys: no part reads more than a few times its
//! share of rows.

pub mod choose;
pub mod conditions;
pub mod cursor;
#[cfg(test)]
mod fixtures;
mod fx;
pub mod keys;
pub mod plan;
pub mod read;
pub mod returned;
pub mod rule;
pub mod windows;

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::any::AnyRow;

use self::choose::{Candidate, Choice, choose};
use self::cursor::{Cursors, Planned};
use self::fx::Fast;
use self::plan::{ChannelRead, GapRead, KeyRef, Part, budgets};

pub use self::conditions::{
    claimable_among, claimable_for, claimable_given_earlier, free_and_open, gap_rows,
    plain_channel_rows, set_claimed,
};
use self::returned::claimed_rows;
pub use self::returned::ids_of;
use self::windows::WindowsAhead;
use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::model::{ClaimRequest, ClaimedRow, Completion, Probe};
use crate::store::sql::Sql;

/// How many rows of an ordering key one claim takes at most (its run): the relay sends them
/// one after another, so a key moves as fast as its receiver accepts rows, not at one row
/// per claim and result write.
pub const RUN: u32 = 16;

/// The most rows of a key a claim takes behind a tail that asks for more than a [`RUN`]
/// (`Tail::run`, a key whose receiver goes quicker than claims): every read stays bounded
/// (docs/design.md, "Bounded reads").
pub const LONGEST_RUN: u32 = 64;

/// How many reads one claim makes at most: the first, and the next windows of channels whose
/// windows held no room-filling rows (see [`read_on`]).
const READS: usize = 4;

/// How many times one claim claims at most: again when rows it chose were taken by another
/// claim meanwhile (claimers that read at the same moment read the same rows), from the rest
/// of what it read.
const ROUNDS: usize = 3;

/// Nothing claimable now, and no promise about later.
pub const NOTHING: Probe = Probe::Nothing {
    quiet_for: Duration::ZERO,
};

/// The claimed rows' select list, as [`ClaimSql::claim_ids`] returns them.
pub type Rows<'a> = BoxFuture<'a, anyhow::Result<Vec<AnyRow>>>;

/// What a claim's read found: each part read, and its rows.
pub type Found = [(Part, Vec<Candidate>)];

/// How claims are written on one database (one per store: it may keep state of its own).
pub trait ClaimSql: Send + Sync {
    /// The `FROM ... LIMIT` that reads up to `w.rows` unfinished rows `o` of `w.channel` in id
    /// order above `w.from` (or its newest, newest first), through the index of unfinished
    /// rows by channel. It may return rows of another channel after the channel's own (they
    /// are left out). By default a plain equality on the channel.
    fn channel_rows(&self, db: &Db, w: &ChannelRead) -> Sql {
        plain_channel_rows(db, w)
    }

    /// Part `i` of a read (its `select`, ordered and limited) as a member of the read's
    /// `UNION ALL`. By default a derived table of its own: a compound statement may not order
    /// or limit its members directly on every database.
    fn member(&self, i: usize, select: Sql) -> Sql {
        let mut q = Sql::new("SELECT * FROM (");
        q.append(select).push(&format!(") p{i}"));
        q
    }

    /// The `FROM ... LIMIT` that reads the first `rows` unfinished rows `o` of `key`'s
    /// ordering key (those above `after`, when given), in id order, through the index of
    /// unfinished rows by key. It may return rows of another key after the key's own (they
    /// are left out). By default a plain equality with the key's text.
    fn key_rows(&self, db: &Db, key: &KeyRef, after: Option<i64>, rows: u32) -> Sql {
        let c = db.cols();
        let k = c.ordering_key.as_deref().unwrap_or("NULL");
        let mut q = Sql::new(&format!(" FROM {} o WHERE o.{k} = ", db.table()));
        q.text(&key.key).push(&format!(" AND {}", c.open("o.")));
        if let Some(after) = after {
            q.push(&format!(" AND o.{} > ", c.id)).int(after);
        }
        q.push(&format!(" ORDER BY o.{} LIMIT {rows}", c.id));
        q
    }

    /// The `FROM` that reads the rows `o` of every key part of `keys` in one member of the
    /// read, `kp.part` naming each row's part; `None` (the default): a member per key part.
    /// A read of many keys (a backlog of many keys, each with rows in flight) is then one
    /// small statement whose text does not change with their number.
    fn keys_at_once(&self, _db: &Db, _keys: &[read::KeyRead]) -> Option<Sql> {
        None
    }

    /// Whether a freed key is read from the rows read ahead behind the row that freed it, by
    /// id, where a claim read them, rather than from its first unfinished row through its
    /// index (docs/design.md, "Ordering keys: rows read ahead"). By default not: where the
    /// keys are read at once ([`ClaimSql::keys_at_once`]) a key costs the read little, and
    /// its runs are whole; where each key is a member of its own, the rows by id of every key
    /// are one member.
    fn freed_keys_from_rows_ahead(&self) -> bool {
        false
    }

    /// Where claims read ahead: whether head `a` is also its key's last unfinished row, a
    /// condition costing an index step (a key read as empty behind it is then not read
    /// behind it while it is in flight: docs/design.md, "Ordering keys: keys read as empty").
    /// By default not asked.
    fn last_of_key(&self, _db: &Db, _a: &str) -> Option<String> {
        None
    }

    /// The `FROM ... LIMIT` that reads up to `gap.rows` rows `o` that meet `claimable`, of
    /// every channel strictly between `gap.above` and `gap.below` (unbounded where `None`),
    /// oldest first within a channel.
    fn unserved_rows(&self, db: &Db, gap: &GapRead, claimable: &str) -> Sql {
        let from = format!("{} o", db.table());
        gap_rows(db, &from, &db.cols().channel("o."), gap, claimable)
    }

    /// The `FROM ... LIMIT` that reads up to `rows` rows `o` that meet `claimable` and whose
    /// channel is NULL (a mapped channel column may hold NULL; no sink serves it), oldest
    /// first. Nothing where the channel cannot be NULL.
    fn null_channel_rows(&self, db: &Db, rows: u32, claimable: &str) -> Sql {
        let c = db.cols();
        match (c.mapped, c.channel_column()) {
            (true, Some(ch)) => Sql::new(&format!(
                " FROM {} o WHERE {claimable} AND o.{ch} IS NULL ORDER BY o.{} LIMIT {rows}",
                db.table(),
                c.id
            )),
            _ => Sql::new(&format!(" FROM {} o WHERE 1 = 0", db.table())),
        }
    }

    /// The id of the nearest earlier unfinished row of row `a`'s ordering key, NULL when it
    /// has none (it is the head): an expression. Only asked where the table has a key.
    fn earlier(&self, db: &Db, a: &str) -> String {
        let (t, c) = (db.table(), db.cols());
        let (k, id) = (c.ordering_key.as_deref().unwrap_or("NULL"), &c.id);
        format!(
            "(SELECT MAX(p.{id}) FROM {t} p WHERE p.{k} = {a}{k} AND {} AND p.{id} < {a}{id})",
            c.open("p.")
        )
    }

    /// Whether row `a`, unfinished and keyed, is the first unfinished row of its ordering key
    /// (the head): a condition. Asked for every row a read looks at, so it must cost an index
    /// step or two whatever is queued behind the key. By default: no earlier row.
    fn head(&self, db: &Db, a: &str) -> String {
        format!("{} IS NULL", self.earlier(db, a))
    }

    /// Appends the condition that text `e` is one of `keys` (ordering keys as text). By
    /// default an `IN` list of placeholders.
    fn one_of_keys(&self, q: &mut Sql, e: &str, keys: &[String]) {
        q.push(&format!("{e} IN ("));
        q.texts(keys).push(")");
    }

    /// Appends the condition that `e` is one of `ids` (integers of the relay's own). By
    /// default the list inline.
    fn one_of(&self, q: &mut Sql, e: &str, ids: &[i64]) {
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        q.push(&format!("{e} IN ({})", list.join(", ")));
    }

    /// Claims those of `ids` that are still claimable for `req` ([`claimable_for`]; with a
    /// fence, only while it holds), returning the claimed rows' select list
    /// ([`returned::select_list`]), in no order. `found` is what the read found, the chosen
    /// rows among it.
    fn claim_ids<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        ids: &'a [i64],
        found: &'a Found,
    ) -> Rows<'a>;

    /// Whether any unfinished row may be due at all, asked before an idle read: an
    /// index-only check where reading the windows would read every waiting row. "No" must
    /// never hide a claimable row; "yes" promises nothing. By default "yes".
    fn maybe_due<'a>(&'a self, _db: &'a Db) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async { Ok(true) })
    }

    /// For tests, where the database plans statements without statistics (SQLite): the plans
    /// (`EXPLAIN QUERY PLAN`'s details) of the claim of `ids` for `req` and of a read of the
    /// unserved channels below `below`. By default none.
    fn plans<'a>(
        &'a self,
        _db: &'a Db,
        _req: &'a ClaimRequest,
        _ids: &'a [i64],
        _below: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<[Vec<String>; 2]>>> {
        Box::pin(async { Ok(None) })
    }

    /// Milliseconds until the earliest unfinished row is due (NULL when none is unfinished),
    /// an expression the idle read adds on a database whose inserts are announced, so that an
    /// idle relay can sleep until then (see `Probe::Nothing`). By default none: no promise.
    fn quiet_ms(&self, _db: &Db) -> Option<String> {
        None
    }
}

/// One store's claims: the database's way of writing them, and the floors and keys that say
/// where its reads start.
pub struct Claims {
    sql: Box<dyn ClaimSql>,
    cursors: Cursors,
    windows: WindowsAhead,
    /// The last claim came back short with rows likely behind what it read (see
    /// [`Claims::more_behind`]).
    more_behind: AtomicBool,
    /// Heads of keys new to this claimer that its claims left for another claimer
    /// (`plan::Budget::fresh`), each with when it was first left.
    left_heads: Mutex<Fast<i64, Instant>>,
}

/// How long a head left for another claimer waits before this claimer takes it whatever its
/// bound: under load another instance claims every few milliseconds, so a head still free
/// after this is one no other claimer took (this claimer is alone, or the others are full).
const LEFT_FOR: Duration = Duration::from_millis(200);

/// How long a head left for another claimer is remembered, and how many at most: a head
/// remembered that another claimer took since is not claimable, so remembering it costs
/// nothing but room.
const LEFT_KEPT: (Duration, usize) = (Duration::from_secs(10), 4096);

impl Claims {
    pub fn new(sql: Box<dyn ClaimSql>) -> Claims {
        Claims {
            cursors: Cursors::reading_ahead(sql.freed_keys_from_rows_ahead()),
            sql,
            windows: WindowsAhead::default(),
            more_behind: AtomicBool::new(false),
            left_heads: Mutex::new(Fast::default()),
        }
    }

    /// The heads left for another claimer at least [`LEFT_FOR`] ago.
    fn waited_heads(&self) -> Vec<i64> {
        let left = self.left_heads.lock().unwrap_or_else(|p| p.into_inner());
        (left.iter())
            .filter(|(_, since)| since.elapsed() >= LEFT_FOR)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Remembers the heads `choice` left for another claimer, since when each was first left
    /// (a claim that did not read them, its budget taken before its windows, forgets none),
    /// and forgets those `claimed` took.
    fn remember_left(&self, choice: &Choice, claimed: &[ClaimedRow]) {
        let mut left = self.left_heads.lock().unwrap_or_else(|p| p.into_inner());
        for row in claimed {
            left.remove(&row.delivery.id);
        }
        let now = Instant::now();
        for id in &choice.left_heads {
            left.entry(*id).or_insert(now);
        }
        let (longest, most) = LEFT_KEPT;
        left.retain(|_, since| since.elapsed() < longest);
        if left.len() > most {
            left.clear();
        }
    }

    /// Whether the last claim came back short for a reason that says nothing of the table
    /// running dry, so that the next claim should come at once, not after a poll
    /// (`Queue::more_behind`): it stopped at its bound on reads ([`READS`]) while windows still
    /// had room and rows beyond them (every row they read was settled: taken, behind a key,
    /// held by another claimer; the floors moved past them, and the next claim reads on from
    /// there), or another claimer took rows it chose (claimers that read the same rows: the
    /// rows behind them are likely free).
    pub fn more_behind(&self) -> bool {
        self.more_behind.load(Ordering::Relaxed)
    }

    /// The claim (`Queue::claim`): the read, the choice, the claim of the chosen rows, in id
    /// order, recorded in the floors.
    pub async fn claim(&self, db: &Db, req: &ClaimRequest) -> anyhow::Result<Vec<ClaimedRow>> {
        self.more_behind.store(false, Ordering::Relaxed);
        // No row may be taken: no statement (an empty set of parts is not valid SQL).
        if req.asks_for_nothing() {
            return Ok(Vec::new());
        }
        let planned = self.cursors.plan(req);
        let _writing = db.writing().await;
        let mut left = budgets(req);
        let waited = self.waited_heads();
        for b in &mut left {
            b.waited.clone_from(&waited);
        }
        let run = keys::longest_run(req);
        let (mut found, mut more_behind) = match self.windows.instead_of(&planned, req, &left) {
            Some(kept) => (kept, false),
            None => self.read_all(db, &planned, &left, req.alone, run).await?,
        };
        self.cursors.saw(&found);
        let mut claimed: Vec<ClaimedRow> = Vec::new();
        let mut choice = Choice::default();
        let mut chose_any = false;
        let mut whole_at_once = false;
        for round in 0..ROUNDS {
            choice = choose(&found, &left, run);
            if choice.ids.is_empty() {
                break;
            }
            chose_any = true;
            let mut got = claimed_rows(
                &self.sql.claim_ids(db, req, &choice.ids, &found).await?,
                req,
            );
            give_back_gaps(db, req, &choice, &mut got).await?;
            let complete = got.len() == choice.ids.len();
            more_behind |= !complete;
            // Rows chosen and not got were taken by another claim meanwhile (or stopped being
            // claimable): the next round chooses from the rest of what was read.
            forget(&mut found, &choice.ids);
            spend(&mut left, &got, &choice.newest);
            claimed.extend(got);
            if complete {
                whole_at_once = round == 0;
                break;
            }
        }
        self.more_behind.store(more_behind, Ordering::Relaxed);
        self.remember_left(&choice, &claimed);
        claimed.sort_by_key(|r| r.delivery.id);
        claimed.dedup_by_key(|r| r.delivery.id);
        // A claim that chose rows and got none (a lost fence) says nothing about where the
        // next one should look.
        let looked = !(claimed.is_empty() && chose_any);
        self.cursors.claimed(&choice, &claimed, looked);
        if whole_at_once {
            self.windows.learn(found, &choice);
        }
        Ok(claimed)
    }

    /// The first read of `parts`, and the reads on past windows that held no room-filling
    /// rows (see [`read_on`]), at most [`READS`] in all; `run` rows of a key at most. Also
    /// whether it stopped at [`READS`] with windows still to read on.
    async fn read_all(
        &self,
        db: &Db,
        planned: &Planned,
        budgets: &[plan::Budget],
        alone: bool,
        run: u32,
    ) -> anyhow::Result<(Vec<(Part, Vec<Candidate>)>, bool)> {
        // A leader's rows read ahead are taken as read, not read again by id.
        let mut as_read = alone
            .then(|| self.cursors.as_read(&planned.parts))
            .flatten();
        let mut found = Vec::new();
        let mut parts = planned.parts.clone();
        for _ in 0..READS {
            found.extend(
                self.read(db, &parts, &planned.busy, as_read.is_none())
                    .await?,
            );
            for (part, rows) in as_read.take().into_iter().flatten() {
                if let Some((_, read)) = found.get_mut(part) {
                    *read = rows;
                }
            }
            parts = read_on(&choose(&found, budgets, run));
            if parts.is_empty() {
                break;
            }
        }
        Ok((found, !parts.is_empty()))
    }

    /// The read of `parts`, per part, passing rows of the `busy` keys (see [`read::statement`]);
    /// the [`Part::Known`] rows only `by_id` (else they come back empty).
    async fn read(
        &self,
        db: &Db,
        parts: &[Part],
        busy: &[String],
        by_id: bool,
    ) -> anyhow::Result<Vec<(Part, Vec<Candidate>)>> {
        let known = |p: &Part| matches!(p, Part::Known { .. });
        if parts.is_empty() || (!by_id && parts.iter().all(known)) {
            return Ok(read::decode(&[], parts));
        }
        let q = read::statement(db, &*self.sql, parts, busy, by_id);
        let rows = db.query(q).fetch_all(db.pool()).await?;
        Ok(read::decode(&rows, parts))
    }

    /// The idle read (`Queue::probe`): the claim's read, without its claim. It starts from
    /// the floors but leaves a full walk that is due to the claim after it (see
    /// [`Cursors::peek`]).
    pub async fn probe(&self, db: &Db, req: &ClaimRequest) -> anyhow::Result<Probe> {
        if req.asks_for_nothing() || !self.sql.maybe_due(db).await? {
            return Ok(NOTHING);
        }
        let planned = self.cursors.peek(req);
        let parts = &planned.parts;
        let quiet = self.sql.quiet_ms(db);
        let mut q = read::statement(db, &*self.sql, parts, &planned.busy, true);
        if let Some(expr) = &quiet {
            read::add_value(db, &mut q, parts.len(), expr);
        }
        let rows = db.query(q).fetch_all(db.pool()).await?;
        let choice = choose(&read::decode(&rows, parts), &budgets(req), 1);
        if !choice.ids.is_empty() {
            return Ok(Probe::Claimable);
        }
        if let Some(at) = planned.full_walk {
            self.cursors.read_nothing(at, &choice);
        }
        let quiet_for = match quiet {
            None => Duration::ZERO,
            Some(_) => match read::value(&rows, parts.len()) {
                // Nothing unfinished at all.
                None => Duration::MAX,
                // Past (due but not claimable): no promise.
                Some(ms) => Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
            },
        };
        Ok(Probe::Nothing { quiet_for })
    }

    /// Results were written: keys and floors learn what became claimable (see
    /// [`Cursors::completed`]).
    pub fn completed(&self, done: &[Completion]) {
        self.cursors.completed(done);
    }

    /// For tests: see `SqlStore::hold_full_walks`.
    pub fn hold_full_walks(&self, period: Duration) {
        self.cursors.hold_walks(period);
    }

    /// For tests: see `SqlStore::sqlite_plans`.
    pub async fn plans(
        &self,
        db: &Db,
        req: &ClaimRequest,
        ids: &[i64],
        below: &str,
    ) -> anyhow::Result<Option<[Vec<String>; 2]>> {
        self.sql.plans(db, req, ids, below).await
    }
}

/// The windows that read all their rows without filling their channel's budget (every row
/// behind a key, waiting, or taken elsewhere): the next windows of those channels, from where
/// they stopped, for the same claim. A backlog of rows that wait behind their keys is passed
/// a window at a time, each read bounded.
fn read_on(choice: &Choice) -> Vec<Part> {
    let mut seen: Vec<&choose::Seen> = choice.seen.iter().filter(|s| s.wants_more).collect();
    // A channel read on more than once: only from the last window's end.
    seen.sort_by_key(|s| (s.channel.clone(), std::cmp::Reverse(s.settled)));
    seen.dedup_by_key(|s| s.channel.clone());
    seen.into_iter()
        .filter(|s| {
            !choice
                .seen
                .iter()
                .any(|o| o.channel == s.channel && o.from == s.settled)
        })
        .map(|s| Part::Window {
            channel: s.channel.clone(),
            from: s.settled,
            // Twice the room left, as a first window for that budget would read: a first
            // window made small by the keys in flight it counted on (their rows behind the
            // tails were not there) is not read on past in as many small reads.
            rows: s.asked.max(plan::oldest_window(s.room)),
            newest: false,
            sweep: false,
        })
        .collect()
}

/// Leaves `ids` out of what was read.
fn forget(found: &mut [(Part, Vec<Candidate>)], ids: &[i64]) {
    let ids: HashSet<i64> = ids.iter().copied().collect();
    for (_, rows) in found.iter_mut() {
        rows.retain(|r| !ids.contains(&r.id));
    }
}

/// Takes the rows `got` off their channels' budgets (and those of them taken from a newest
/// window off its share).
fn spend(budgets: &mut [plan::Budget], got: &[ClaimedRow], newest: &[i64]) {
    for row in got {
        if let Some(b) = budgets
            .iter_mut()
            .find(|b| b.channel == row.delivery.channel)
        {
            b.total = b.total.saturating_sub(1);
            if newest.contains(&row.delivery.id) {
                b.newest = b.newest.saturating_sub(1);
            }
            b.newest = b.newest.min(b.total);
        }
    }
}

/// A run that lost a row between the read and the claim (another claim took it, it stopped
/// being due) must not keep the rows behind the gap: they would be sent before it. They are
/// given back at once (their claim cleared under this claim's token) and left out of
/// `claimed`.
async fn give_back_gaps(
    db: &Db,
    req: &ClaimRequest,
    choice: &Choice,
    claimed: &mut Vec<ClaimedRow>,
) -> anyhow::Result<()> {
    let got: HashSet<i64> = claimed.iter().map(|r| r.delivery.id).collect();
    let mut behind = Vec::new();
    for run in &choice.runs {
        if let Some(gap) = run.iter().position(|id| !got.contains(id)) {
            behind.extend(run[gap..].iter().filter(|id| got.contains(id)));
        }
    }
    if behind.is_empty() {
        return Ok(());
    }
    tracing::debug!(
        ?behind,
        "rows behind a row another claim took are given back"
    );
    let mut q = Sql::new(&format!(
        "UPDATE {} SET claimed_by = NULL, claim_token = NULL, claimed_until = NULL WHERE {} IN (",
        db.table(),
        db.cols().id
    ));
    q.ints(behind.iter().copied())
        .push(") AND claim_token = ")
        .text(&req.token);
    db.query(q).execute(db.pool()).await?;
    claimed.retain(|r| !behind.contains(&r.delivery.id));
    Ok(())
}
