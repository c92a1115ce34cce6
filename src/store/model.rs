//! The values that cross the store's seams: what a claim asks for and returns, results, new
//! rows, and what the operator's queries report. No SQL here.

use std::sync::Arc;
use std::time::Duration;

use crate::sink::Delivery;

/// The statuses of the state machine (docs/design.md, "The table and its states").
pub const STATUSES: [&str; 4] = ["PENDING", "RETRY", "SUCCESS", "FAILED"];

/// The longest `last_error` stored; longer reasons are cut (at a character boundary).
pub const MAX_ERROR_LEN: usize = 1000;

/// Leader-mode fencing: claim only while `outbox_relay_lease.epoch` for `lease` is `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub lease: String,
    pub epoch: i64,
}

/// What to claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// Most rows to take.
    pub limit: u32,
    /// How long the claim lasts (`claimed_until = now + ttl` on the database clock).
    pub ttl: Duration,
    /// Written to `claimed_by`.
    pub claimer: String,
    /// The random token written to `claim_token`; result writes must present it.
    pub token: Arc<str>,
    /// Leader mode's epoch check; `None` in claim mode and with the `none` lease.
    pub fence: Option<Fence>,
    /// No other instance claims from this table: leader mode, where a fence or, with the
    /// `none` lease, the configuration ("a single instance") says so. On MySQL/MariaDB the
    /// picks are then one locking read that stops at its budget, as under a fence; `false`
    /// (claim mode) reads candidates first and locks only the rows it takes, so that claimers
    /// do not wait on rows another merely looked at (docs/design.md, "Claim-mode locks on
    /// MySQL").
    pub alone: bool,
    /// Channels not to claim now (their sink is paused, or its rate limit could not start
    /// more rows before their claims expire).
    pub exclude_channels: Vec<String>,
    /// Payloads longer than this (bytes, measured by the database) are not loaded: the row
    /// comes back [`ClaimedRow::undeliverable`] and is finished FAILED. Bounds the relay's
    /// memory whatever the table holds. `None`: no limit.
    pub max_payload_bytes: Option<u64>,
    /// Take one row in eight of each channel's budget from its newest end (see
    /// `claim.rs`, "picks"), so that under a backlog a row just committed is not left behind
    /// it. The relay asks for it a few times a second, not on every claim: the extra pick
    /// costs the database as much as a small claim.
    pub newest: bool,
    /// Per-channel caps. `None`: up to `limit` rows of any channel but the excluded ones.
    /// `Some`: at most each listed channel's budget (`limit` and `exclude_channels` are then
    /// ignored), so that the claim asks only for what each sink can start now.
    pub budgets: Option<Budgets>,
    /// The ordering keys whose rows this relay has in flight, each with the last of them
    /// (its *tail*): the claim may take a key's rows right behind its tail, which the relay
    /// sends only once every row of the key before them was delivered (docs/design.md,
    /// "Ordering keys: chains"). Empty: only heads and runs behind them.
    pub tails: Vec<Tail>,
    /// Also return each row's trace context (its `traceparent`/`tracestate` columns, where
    /// the table has them) into [`sink::Delivery::trace`](crate::sink::Delivery): asked
    /// for only with tracing on, so that otherwise a claim reads what it always read.
    pub trace: bool,
}

/// An ordering key with rows in flight at this relay, and the last of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail {
    /// The key as text.
    pub key: String,
    /// Its last row in flight here.
    pub row: i64,
    /// That row's channel: the rows behind it count against this channel's budget, so the
    /// channel's oldest window reads that many rows fewer.
    pub channel: String,
    /// The most rows of the key one claim may take behind it (at least the store's run, 16):
    /// more for a key whose receiver takes its rows quickly, so that it keeps sending while
    /// a claim takes its next rows (docs/design.md, "Ordering keys: a key's pace").
    pub run: u32,
}

impl ClaimRequest {
    /// No row may be taken (a zero limit, or budgets of zero): the store sends no statement
    /// (an empty set of picks is not valid SQL).
    pub fn asks_for_nothing(&self) -> bool {
        self.budgets.as_ref().is_some_and(|b| b.total() == 0) || self.limit == 0
    }
}

/// What an idle poll's read found ([`Queue::probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A row is claimable now.
    Claimable,
    /// Nothing is claimable now, and by the clock alone nothing will be for at least
    /// `quiet_for`: the earliest `next_attempt_at` of the unfinished rows is that far ahead
    /// ([`Duration::MAX`] when no row is unfinished). It is zero when a row is due but not
    /// claimable (under a live claim, behind its ordering key, of a channel not asked for),
    /// when more than a thousand rows are unfinished (the read looks at no more), and on
    /// MySQL/MariaDB and SQLite, which are not asked (only PostgreSQL's NOTIFY makes
    /// the relay wait longer than `poll_interval`; docs/design.md, "Idle cost"). Rows written
    /// meanwhile (an insert, a requeue, another instance's result) are not foreseen.
    Nothing { quiet_for: Duration },
}

/// How many rows of each channel a claim may take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budgets {
    /// (channel, most rows), for channels with a budget above zero.
    pub channels: Vec<(String, u32)>,
    /// Rows of channels that no sink serves (they are finished FAILED): (every channel a
    /// sink serves, most rows). `None`: do not look for such rows in this claim.
    pub others: Option<(Vec<String>, u32)>,
    /// Of `channels`, (channel, rows its sink can start now), the rest being rows queued
    /// ahead of its sends; a channel not listed can start none. In claim mode a claim takes
    /// no more heads of keys new to it than that (docs/design.md, "Ordering keys: keys among
    /// claimers"). `None`: no such bound.
    pub starts: Option<Vec<(String, u32)>>,
}

impl Budgets {
    /// The most rows a claim with these budgets can take.
    pub fn total(&self) -> u32 {
        self.channels.iter().map(|(_, n)| n).sum::<u32>() + self.others.as_ref().map_or(0, |o| o.1)
    }
}

/// A claimed row.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub delivery: Delivery,
    pub ordering_key: Option<String>,
    /// `now - created_at` on the database clock at claim time, for end-to-end latency without
    /// trusting the relay's wall clock.
    pub age_at_claim: Duration,
    /// Why this row can never be sent, if it cannot: such a row is finished FAILED at once,
    /// and the rows claimed with it are delivered as usual. The fields of `delivery` that
    /// could not be read are empty.
    pub undeliverable: Option<Undeliverable>,
}

/// Why a claimed row cannot be sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Undeliverable {
    /// A column could not be decoded (a wrong type, invalid UTF-8, NULL where a value is
    /// required); the text names the column.
    Unreadable(String),
    /// The payload is over [`ClaimRequest::max_payload_bytes`] and was not loaded.
    TooLarge { bytes: u64 },
}

/// The result of one row, to be written back under its claim token.
#[derive(Debug, Clone)]
pub struct Completion {
    pub id: i64,
    /// The claim token the row was claimed with.
    pub token: Arc<str>,
    pub resolution: Resolution,
}

/// How a row leaves its claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// SUCCESS; `attempts + 1`, `sent_at = now`.
    Delivered,
    /// RETRY after `delay`; `attempts + 1`.
    Retry { delay: Duration, error: String },
    /// FAILED; `attempts + 1`.
    Failed { error: String },
    /// Back to the queue untouched (status and attempts unchanged), due after `delay`: for
    /// throttles, paused sinks, and rows not sent because their claim or the lease ran out.
    Release {
        delay: Duration,
        error: Option<String>,
    },
    /// The database refused every result for the row, even the generic FAILED one: only the
    /// relay's own claim columns are written (`claimed_by` = [`PARKED_BY`], the claim running
    /// [`MAX_AHEAD`]), which no constraint of the table's columns can refuse, so the row is
    /// never claimed (nor sent) again; `status`, the row page and `requeue` know it.
    Park,
}

/// What `claimed_by` holds on a parked row ([`Resolution::Park`]).
pub const PARKED_BY: &str = "outbox-relay: parked, the database refused its result";

/// A row to insert (the `enqueue` verb, tests and benchmarks).
#[derive(Debug, Clone, Default)]
pub struct NewRow {
    pub channel: String,
    pub recipient: Option<String>,
    pub payload: String,
    pub ordering_key: Option<String>,
}

/// What `status` shows.
#[derive(Debug, Clone, Default)]
pub struct StatusReport {
    /// (status, channel, count), for every pair present.
    pub counts: Vec<(String, String, i64)>,
    /// Age of the oldest PENDING or RETRY row.
    pub oldest_pending: Option<Duration>,
    /// The lease row: holder, epoch, and time left (negative when expired).
    pub lease: Option<LeaseRow>,
    /// (claimed_by, live claims).
    pub claims: Vec<(String, i64)>,
}

/// A row of `outbox_relay_lease`.
#[derive(Debug, Clone)]
pub struct LeaseRow {
    pub holder: Option<String>,
    pub epoch: i64,
    pub remaining_ms: Option<i64>,
}

/// A FAILED row, as `failed` lists it.
#[derive(Debug, Clone)]
pub struct FailedRow {
    pub id: i64,
    pub channel: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    /// `None` when NULL, or on a mapped table without such a column.
    pub updated_at: Option<String>,
    pub created_at: Option<String>,
}

/// A finished status: the only ones `purge` and retention may delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    Success,
    Failed,
}

impl Finished {
    pub fn as_str(self) -> &'static str {
        match self {
            Finished::Success => "SUCCESS",
            Finished::Failed => "FAILED",
        }
    }
}

/// Which FAILED rows `requeue` puts back.
#[derive(Debug, Clone)]
pub enum Requeue {
    Ids(Vec<i64>),
    AllFailed {
        channel: Option<String>,
    },
    /// Every FAILED row the filter matches (the console's selections).
    Matching(FailedFilter),
}

/// A selection of FAILED rows (the console's filters). Every condition is evaluated by the
/// database, and by the statement that changes rows too, not only by the one that counted them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailedFilter {
    pub channel: Option<String>,
    /// `last_error` contains this text (case-insensitive; `%` and `_` are literal).
    pub error_contains: Option<String>,
    /// `created_at` at or after this time.
    pub created_from: Option<TimeBound>,
    /// `created_at` before this time.
    pub created_to: Option<TimeBound>,
    /// Only rows up to this id: a selection confirmed by an operator does not grow to rows
    /// that failed after they saw its count.
    pub max_id: Option<i64>,
}

/// A point in time for a filter, always turned into a time by the database itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBound {
    /// This long before the database's now.
    Ago(Duration),
    /// Seconds since the Unix epoch (UTC).
    Unix(i64),
}

/// One channel's line of the console's overview.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelCounts {
    pub channel: String,
    pub pending: i64,
    pub retry: i64,
    pub failed: i64,
    /// SUCCESS rows whose result was written in the last hour.
    pub delivered_last_hour: i64,
    /// Age of the channel's oldest PENDING or RETRY row.
    pub oldest_pending: Option<Duration>,
    /// Rows the relay parked: the database refused every result for them, so no claim takes
    /// them again until requeued (not counted as pending).
    pub parked: i64,
    /// Rows of a mapped table whose status is NULL or a value no state maps: never claimed.
    pub unknown: i64,
}

/// Every stored column of one row, times as UTC text, for the console's row page. The status
/// is the relay's state name (`PENDING`, ...) whatever the table stores; an optional column a
/// mapped table does not have reads as `None`, as does a NULL (the application's rows have
/// no `next_attempt_at`, and may have no payload).
#[derive(Debug, Clone, Default)]
pub struct RowDetail {
    pub id: i64,
    pub channel: String,
    pub status: String,
    pub attempts: i64,
    pub recipient: Option<String>,
    pub payload: Option<String>,
    pub ordering_key: Option<String>,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<String>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
    pub sent_at: Option<String>,
    pub claimed_by: Option<String>,
    /// Time left on a live claim (`None`: no claim, or it ran out).
    pub claim_left_ms: Option<i64>,
}

/// What `requeue` did (or, dry-run, would do).
#[derive(Debug, Clone, Default)]
pub struct RequeueReport {
    /// FAILED rows set back to PENDING with a fresh attempt budget.
    pub requeued: u64,
    /// Ids that exist but are not FAILED (left unchanged), with their status.
    pub not_failed: Vec<(i64, String)>,
    /// Ids that do not exist.
    pub missing: Vec<i64>,
}

/// The periodic sample behind the table gauges.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Rows per status.
    pub by_status: Vec<(String, i64)>,
    pub oldest_pending: Option<Duration>,
    /// Ordering keys with rows held back behind an unfinished earlier row.
    pub ordering_blocked_keys: i64,
}

/// Makes text safe to store in any of the three databases, whatever a receiver or vendor sent:
/// NUL (PostgreSQL refuses it in text) and other control characters except tab and newline
/// become U+FFFD, and the result is cut to [`MAX_ERROR_LEN`] bytes at a character boundary
/// (with "..." appended when cut). Rust strings are valid UTF-8 already; bytes from the wire
/// are decoded lossily before they get here.
pub fn sanitize_text(e: &str) -> String {
    let mut out = String::with_capacity(e.len().min(MAX_ERROR_LEN + 3));
    for c in e.chars() {
        let c = if c.is_control() && c != '\n' && c != '\t' {
            char::REPLACEMENT_CHARACTER
        } else {
            c
        };
        if out.len() + c.len_utf8() > MAX_ERROR_LEN {
            out.push_str("...");
            return out;
        }
        out.push(c);
    }
    out
}

/// How far ahead of now any time the relay writes may lie: a year. Retry delays, claims and
/// leases are far shorter in practice; the cap keeps a misconfigured one inside every
/// database's range (MySQL's TIMESTAMP ends in January 2038).
pub const MAX_AHEAD: Duration = Duration::from_secs(365 * 86_400);

/// `d` in milliseconds, capped at [`MAX_AHEAD`], for binding into `now + ?` expressions.
pub(crate) fn future_ms(d: Duration) -> i64 {
    d.min(MAX_AHEAD).as_millis() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_removes_nul_and_controls_and_cuts_at_a_char_boundary() {
        assert_eq!(
            sanitize_text("a\u{0}b\u{1b}[31mc\n\td"),
            "a\u{FFFD}b\u{FFFD}[31mc\n\td"
        );
        assert_eq!(sanitize_text("\u{85}"), "\u{FFFD}");
        let long = "한".repeat(MAX_ERROR_LEN); // 3 bytes each
        let cut = sanitize_text(&long);
        assert!(cut.len() <= MAX_ERROR_LEN + 3);
        assert!(cut.ends_with("..."));
        assert!(cut.len() >= MAX_ERROR_LEN - 3);
        assert_eq!(sanitize_text("short"), "short");
        let exact = "x".repeat(MAX_ERROR_LEN);
        assert_eq!(sanitize_text(&exact), exact);
    }
}
