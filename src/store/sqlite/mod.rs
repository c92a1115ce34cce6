//! SQLite: its SQL text ([`Syntax`]), connection settings (`session.rs`), schema and
//! migrations (`schema.rs`), claims and idle reads (`claim.rs`), and the statements of the
//! operator's queries and lock tables that differ here (`admin.rs`).
//!
//! Timestamps are UTC text `YYYY-MM-DD HH:MM:SS.SSS`, which sorts like time. SQLite has one
//! writer at a time, so a claim (one `UPDATE ... RETURNING`) is atomic without row locks; the
//! database runs in WAL mode so `enqueue` and `status` do not block the relay. Its columns take
//! any value whatever their declared type, so claims check what each value is.

pub mod admin;
pub mod claim;
pub mod schema;
pub mod session;

use crate::store::sql::Syntax;

/// The clock expression every time of SQLite's is written with.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f','now')";

/// SQLite 3.35 or later (`RETURNING`), as bundled.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sqlite;

impl Syntax for Sqlite {
    fn integer_type(&self) -> &'static str {
        "INTEGER"
    }

    fn now(&self) -> &'static str {
        NOW
    }

    fn now_plus_ms(&self) -> (&'static str, &'static str) {
        (
            "strftime('%Y-%m-%d %H:%M:%f','now', (",
            " / 1000.0) || ' seconds')",
        )
    }

    fn unix_time(&self) -> (&'static str, &'static str) {
        ("strftime('%Y-%m-%d %H:%M:%f', ", ", 'unixepoch')")
    }

    fn age_ms(&self, col: &str) -> String {
        format!("CAST((julianday('now') - julianday({col})) * 86400000 AS INTEGER)")
    }

    fn time_text(&self, col: &str) -> String {
        format!("substr({col}, 1, 19)")
    }

    fn payload_text(&self, col: &str) -> String {
        col.to_string()
    }

    /// As bytes: the driver decodes every text value of a row eagerly, so a value that is
    /// not valid UTF-8 would fail the whole result set.
    fn claim_text(&self, col: &str) -> String {
        format!("CAST({col} AS BLOB)")
    }

    /// Each column's storage class, and whether each time column holds a time: a value
    /// stored with another class than the column's is refused by name, not coerced.
    fn storage_classes(&self, cols: &[String], times: &[String]) -> String {
        cols.iter()
            .map(|c| format!("typeof({c})"))
            .chain(times.iter().map(|c| {
                format!(
                    "CASE WHEN {c} IS NULL THEN 'null' WHEN julianday({c}) IS NULL \
                     THEN 'text that is not a time' ELSE 'time' END"
                )
            }))
            .collect::<Vec<_>>()
            .join(" || ',' || ")
    }

    fn int_value(&self, col: &str) -> String {
        format!("CASE WHEN typeof({col}) = 'integer' THEN {col} END")
    }

    /// A value that is not a time at all (an application's typo) counts as due, so that the
    /// row is claimed and failed naming the column instead of waiting for ever.
    fn due(&self, col: &str) -> String {
        format!("({col} <= {NOW} OR julianday({col}) IS NULL)")
    }

    /// Bytes of text or blob, read from the record header: the value is not loaded.
    fn byte_length(&self, col: &str) -> String {
        format!("octet_length({col})")
    }

    fn null_text(&self) -> &'static str {
        "NULL"
    }

    fn null_int(&self) -> &'static str {
        "NULL"
    }

    fn cast_text(&self, expr: &str) -> String {
        format!("CAST({expr} AS TEXT)")
    }

    /// Checked first: text that is not JSON becomes JSON null, which the sink refuses for
    /// that row alone.
    fn json_value(&self, col: &str) -> String {
        format!("json(CASE WHEN json_valid({col}) THEN {col} ELSE 'null' END)")
    }

    fn json_object(&self, pairs: &[String]) -> String {
        format!("json_object({})", pairs.join(", "))
    }

    /// SQLite takes at most 1,000 arguments to a function (`SQLITE_MAX_FUNCTION_ARG` of the
    /// bundled build), and its only ways to join objects (`json_patch`) drop keys whose value
    /// is null.
    fn max_object_pairs(&self) -> Option<usize> {
        Some(500)
    }

    /// A column holds whatever was stored in it, whatever its declared type: bytes as
    /// lower-case hex, anything else as SQLite writes it as text (times are text already).
    fn scalar_text(&self, expr: &str, _ty: &str) -> String {
        format!(
            "CASE WHEN typeof({expr}) = 'blob' THEN lower(hex({expr})) ELSE CAST({expr} AS TEXT) END"
        )
    }
}
