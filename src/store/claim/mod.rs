//! Claiming rows (docs/design.md, "Claims"): which picks a claim makes (`plan.rs`), what each
//! pick selects (`picks.rs`), where picks start (`cursor.rs`, "Floors") and how far they look
//! (`window.rs`), what a claim returns and how each row is decoded (`returned.rs`), the
//! `UPDATE ... RETURNING` claim (`returning.rs`) and the idle read (`probe.rs`). How a claim
//! is written on each database (its fence, its locks, a transaction where there is no
//! `UPDATE ... RETURNING`) is that database's [`ClaimSql`].
//!
//! Guarantees (G1, G2): a claim takes only due rows that are not under a live claim and are
//! the head of their ordering key, in id order, and (with a fence) only while the lease epoch
//! is still the claimer's; with budgets it takes at most each channel's budget, so one
//! channel's backlog never fills the relay while another's rows wait; a claimed row carries a
//! fresh claim token and a `claimed_until` on the database clock.

pub mod cursor;
pub mod picks;
pub mod plan;
pub mod probe;
pub mod returned;
pub mod returning;
pub mod window;

use std::time::{Duration, Instant};

use sqlx::any::AnyRow;

use self::cursor::{Cursors, Floors};
use self::picks::{OpenColumns, Picker};
use self::plan::newest_share;
use self::returned::to_claimed;
use self::window::Windows;
use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::model::{Budgets, ClaimRequest, ClaimedRow, Completion, Probe};

/// How claims are written on one database (one per store: it may keep state of its own).
pub trait ClaimSql: Send + Sync {
    /// One claim (a statement, or one short transaction) of `req`'s picks from `floors`: the
    /// claimed rows, as [`returned::select_list`] returns them, in no order.
    fn claim_rows<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        floors: &'a Floors,
    ) -> BoxFuture<'a, anyhow::Result<Vec<AnyRow>>>;

    /// The columns the picks filter on (see [`OpenColumns`]).
    fn open_columns(&self, _db: &Db) -> OpenColumns {
        OpenColumns::default()
    }

    /// Whether any unfinished row may be due at all, asked before the idle read reads the
    /// picks: an index-only check where reading the picks would read every waiting row.
    /// "No" must never hide a claimable row; "yes" promises nothing. By default "yes".
    fn maybe_due<'a>(&'a self, _db: &'a Db) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async { Ok(true) })
    }

    /// Whether the idle read takes the rows of other channels in any order (rather than by
    /// id): any row will do there.
    fn any_order(&self) -> bool {
        false
    }

    /// Whether anything is claimable for `req` from `floors` (the idle read). By default
    /// [`ClaimSql::maybe_due`], then one read of the picks that stops at the first row.
    fn probe<'a>(
        &'a self,
        db: &'a Db,
        req: &'a ClaimRequest,
        floors: &'a Floors,
    ) -> BoxFuture<'a, anyhow::Result<Probe>> {
        Box::pin(async move {
            if !self.maybe_due(db).await? {
                return Ok(probe::NOTHING);
            }
            let picker = Picker::new(db, self.open_columns(db));
            let picks = probe::picks(req, self.any_order());
            probe::run_any_row(db, probe::any_row(db, &picker, picks, req, floors)).await
        })
    }
}

/// One store's claims: the database's way of writing them, and the floors and windows that
/// say where its picks start and how far they look.
pub struct Claims {
    sql: Box<dyn ClaimSql>,
    cursors: Cursors,
    windows: Windows,
}

impl Claims {
    pub fn new(sql: Box<dyn ClaimSql>) -> Claims {
        Claims {
            sql,
            cursors: Cursors::default(),
            windows: Windows::default(),
        }
    }

    /// The claim (`Queue::claim`): the picks, windowed where [`Windows::plan`] says; a second
    /// statement for the channels whose window may have hidden rows; the rows decoded, in id
    /// order, and recorded in the floors.
    pub async fn claim(&self, db: &Db, req: &ClaimRequest) -> anyhow::Result<Vec<ClaimedRow>> {
        // No row may be taken: no statement (an empty set of picks is not valid SQL).
        if req.asks_for_nothing() {
            return Ok(Vec::new());
        }
        let mut floors = self.cursors.plan();
        let started = Instant::now();
        if let Some(b) = &req.budgets {
            let channels = b.channels.iter().map(|(c, _)| c);
            floors.windowed = self.windows.plan(channels, &floors, started);
        }
        if !floors.windowed.is_empty() {
            self.windows.count_windowed_claim();
        }
        let mut claimed = self.claim_rows(db, req, &floors).await?;
        if let Some(b) = &req.budgets {
            let more = self
                .past_windows(db, req, b, &floors, &claimed, started.elapsed())
                .await?;
            claimed.extend(more);
        }
        // RETURNING gives no order; delivery order within a batch is id order. A row two
        // picks found (oldest and newest first) is delivered once.
        claimed.sort_by_key(|r| r.delivery.id);
        claimed.dedup_by_key(|r| r.delivery.id);
        if let Some(b) = &req.budgets {
            let picked: Vec<(&str, u32, u32)> = b
                .channels
                .iter()
                .map(|(c, n)| (c.as_str(), *n, newest_share(*n, req.newest)))
                .collect();
            self.cursors.claimed(&picked, &claimed);
        }
        Ok(claimed)
    }

    /// After a claim that took `took`: records each channel's walk, and reads past the window
    /// of each channel whose windowed pick may have hidden rows (from the same floors: the rows
    /// the first statement took are under this claim now, and are not taken twice).
    async fn past_windows(
        &self,
        db: &Db,
        req: &ClaimRequest,
        b: &Budgets,
        floors: &Floors,
        claimed: &[ClaimedRow],
        took: Duration,
    ) -> anyhow::Result<Vec<ClaimedRow>> {
        // Per channel walked again: (channel, budget left, rows its oldest pick wanted).
        let mut again: Vec<(String, u32, usize)> = Vec::new();
        for (channel, budget) in &b.channels {
            let wanted = budget.saturating_sub(newest_share(*budget, req.newest)) as usize;
            let found = of_channel(claimed, channel);
            if !floors.windowed.contains(channel) {
                self.windows.walked(channel, found, wanted, took);
            } else if self.windows.walk_again(channel, found, wanted) {
                let left = budget.saturating_sub(u32::try_from(found).unwrap_or(u32::MAX));
                again.push((channel.clone(), left, wanted));
            }
        }
        if again.is_empty() {
            return Ok(Vec::new());
        }
        let wide = ClaimRequest {
            budgets: Some(Budgets {
                channels: again
                    .iter()
                    .map(|(c, left, _)| (c.clone(), *left))
                    .collect(),
                others: None,
            }),
            newest: false,
            ..req.clone()
        };
        let mut whole = floors.clone();
        whole.windowed.clear();
        let started = Instant::now();
        let more = self.claim_rows(db, &wide, &whole).await?;
        let took = started.elapsed();
        for (channel, _, wanted) in &again {
            let found = of_channel(claimed, channel) + of_channel(&more, channel);
            self.windows.walked(channel, found, *wanted, took);
        }
        Ok(more)
    }

    /// One claim statement (or transaction) for `req` from `floors`, its rows decoded.
    async fn claim_rows(
        &self,
        db: &Db,
        req: &ClaimRequest,
        floors: &Floors,
    ) -> anyhow::Result<Vec<ClaimedRow>> {
        let rows: Vec<AnyRow> = {
            let _writing = db.writing().await;
            self.sql.claim_rows(db, req, floors).await?
        };
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            match to_claimed(row, req) {
                Ok(r) => claimed.push(r),
                // Cannot happen with a BIGINT primary key; if it does, the row's claim
                // expires and the others are still delivered.
                Err(e) => tracing::error!(error = %e, "a claimed row could not be read"),
            }
        }
        Ok(claimed)
    }

    /// The idle read (`Queue::probe`). It starts from the floors but leaves a full walk that
    /// is due to the claim after it (see [`Cursors::peek`]).
    pub async fn probe(&self, db: &Db, req: &ClaimRequest) -> anyhow::Result<Probe> {
        if req.asks_for_nothing() {
            return Ok(probe::NOTHING);
        }
        let (floors, full_walk) = self.cursors.peek();
        let found = self.sql.probe(db, req, &floors).await?;
        if let (Some(at), Probe::Nothing { .. }) = (full_walk, &found) {
            self.cursors.read_nothing(at);
        }
        Ok(found)
    }

    /// Results were written: floors may drop (see [`Cursors::completed`]).
    pub fn completed(&self, done: &[Completion]) {
        self.cursors.completed(done);
    }

    /// For tests: see `SqlStore::hold_full_walks`.
    pub fn hold_full_walks(&self, period: Duration) {
        self.cursors.hold_walks(period);
    }

    /// For tests: see [`Windows::every_short_walk`].
    pub fn window_every_short_walk(&self) {
        self.windows.every_short_walk();
    }

    /// For tests: how many claims had a windowed pick.
    pub fn windowed_claims(&self) -> u64 {
        self.windows.windowed_claims()
    }
}

/// How many of `rows` are of `channel`.
fn of_channel(rows: &[ClaimedRow], channel: &str) -> usize {
    rows.iter()
        .filter(|r| r.delivery.channel == channel)
        .count()
}
