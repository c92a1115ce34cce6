//! What a claim returns: its select list, written by [`select_list`], and
//! the decoding of each returned row into a [`ClaimedRow`] by [`to_claimed`]. Both follow
//! [`Col`], so they cannot disagree about positions.
//!
//! Guarantees: a row whose columns cannot be decoded, or whose payload is over the limit,
//! comes back [`ClaimedRow::undeliverable`] (naming the column) instead of failing the claim of
//! its neighbours; a payload over the limit is never loaded (the select list returns NULL in
//! its place, with its length beside it). The trace columns are in the list only when the
//! claim asks for them and the table has them ([`TRACE_COLUMNS`], after [`Col::ALL`]), and a
//! value in them that cannot be read or is no valid context is none: it never fails a row
//! (docs/tracing.md).

use std::time::Duration;

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::sink::{Delivery, TraceContext};
use crate::store::db::Db;
use crate::store::model::{ClaimRequest, ClaimedRow, Undeliverable};
use crate::store::sql::decode::{is_bytes, is_set};

/// The select list of a claim of rows `alias`: one expression per [`Col`], in [`Col::ALL`]
/// order, which is the order [`to_claimed`] reads them in. The payload is returned only when
/// it is within the request's size limit (NULL otherwise), with its length beside it, so an
/// oversized payload is never loaded.
pub fn select_list(db: &Db, alias: &str, req: &ClaimRequest) -> String {
    let d = db.syntax();
    let cols = db.cols();
    let c = |name: &str| format!("{alias}{name}");
    let payload = cols.payload(alias, d);
    let expr = |col: Col| match col {
        Col::Id => c(&cols.id),
        // A mapped channel column may be of any type (PostgreSQL's `character(n)` cannot even
        // be decoded as it is): read as text.
        Col::Channel => d.claim_text(&cols.channel_text(alias, d)),
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
        Col::Attempts => d.int_value(&c(&cols.attempts)),
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
    let mut list = Col::ALL.iter().map(|col| expr(*col)).collect::<Vec<_>>();
    if req.trace && (cols.traceparent.is_some() || cols.tracestate.is_some()) {
        list.push(d.claim_text(&cols.text_or_null(alias, &cols.traceparent, d)));
        list.push(d.claim_text(&cols.text_or_null(alias, &cols.tracestate, d)));
    }
    list.join(", ")
}

/// The trace columns a claim that asks for them returns after [`Col::ALL`]: `traceparent`,
/// `tracestate`.
pub const TRACE_COLUMNS: usize = 2;

/// What a claim returns, in select-list order: [`select_list`] writes one
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
pub fn has_ordering_key(row: &AnyRow) -> bool {
    is_set(row, Col::OrderingKey.at())
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
    let trace = trace_context(row);
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
            trace,
        },
        ordering_key,
        age_at_claim: Duration::from_millis(age_ms.max(0) as u64),
        undeliverable,
    })
}

/// The row's trace context, when the claim returned the trace columns: none when they are
/// NULL, unreadable or not a valid `traceparent` (a fresh trace, never a failed row).
fn trace_context(row: &AnyRow) -> Option<TraceContext> {
    let at = Col::ALL.len();
    if row.len() < at + TRACE_COLUMNS {
        return None;
    }
    let traceparent = text_value(row, at).ok().flatten()?;
    let tracestate = text_value(row, at + 1).ok().flatten();
    TraceContext::parse(&traceparent, tracestate.as_deref())
}

/// A text column of a claim (text on PostgreSQL, bytes elsewhere), as a checked `String`.
fn text_value(row: &AnyRow, i: usize) -> Result<Option<String>, String> {
    if !is_bytes(row, i) {
        return row
            .try_get::<Option<String>, _>(i)
            .map_err(|e| decode_error(&e));
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

/// The rows a claim returned, decoded ([`to_claimed`]).
pub fn claimed_rows(rows: &[AnyRow], req: &ClaimRequest) -> Vec<ClaimedRow> {
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        match to_claimed(row, req) {
            Ok(r) => claimed.push(r),
            // Cannot happen with a BIGINT primary key; if it does, the row's claim
            // expires and the others are still delivered.
            Err(e) => tracing::error!(error = %e, "a claimed row could not be read"),
        }
    }
    claimed
}

/// The ids of `rows` (the first column of a claim's select list).
pub fn ids_of(rows: &[AnyRow]) -> Vec<i64> {
    rows.iter()
        .filter_map(|r| r.try_get::<i64, _>(0).ok())
        .collect()
}
