//! PostgreSQL: its SQL text ([`Syntax`]), session settings (`session.rs`), schema and
//! migrations (`schema.rs`), claims, idle reads and result writes (`claim.rs`), the NOTIFY
//! wake-ups (`notify.rs`), and the statements of the operator's queries and lock tables that
//! differ here (`admin.rs`).

pub mod admin;
pub mod claim;
pub mod notify;
pub mod schema;
pub mod session;

use crate::store::sql::Syntax;

/// The most `key, value` pairs one `json_build_object` call takes (100 arguments).
const PAIRS_PER_CALL: usize = 50;

/// PostgreSQL 12 or later.
#[derive(Debug, Clone, Copy, Default)]
pub struct Postgres;

impl Syntax for Postgres {
    fn numbered_placeholders(&self) -> bool {
        true
    }

    fn now(&self) -> &'static str {
        "now()"
    }

    fn now_plus_ms(&self) -> (&'static str, &'static str) {
        ("(now() + make_interval(secs => ", "::float8 / 1000))")
    }

    fn unix_time(&self) -> (&'static str, &'static str) {
        ("to_timestamp(", "::float8)")
    }

    fn age_ms(&self, col: &str) -> String {
        format!("(EXTRACT(EPOCH FROM (now() - {col})) * 1000)::bigint")
    }

    fn time_text(&self, col: &str) -> String {
        format!("to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')")
    }

    fn payload_text(&self, col: &str) -> String {
        format!("{col}::text")
    }

    fn byte_length(&self, col: &str) -> String {
        format!("octet_length({col}::text)")
    }

    fn null_text(&self) -> &'static str {
        "NULL::text"
    }

    fn null_int(&self) -> &'static str {
        "NULL::bigint"
    }

    fn cast_text(&self, expr: &str) -> String {
        format!("({expr})::text")
    }

    /// The column must be `json`/`jsonb` (checked by `check-config`), since a failed cast
    /// would fail the whole claim.
    fn json_value(&self, col: &str) -> String {
        format!("{col}::jsonb")
    }

    /// A function takes at most 100 arguments here (`FUNC_MAX_ARGS`): an object of more than
    /// [`PAIRS_PER_CALL`] pairs is joined from `jsonb` objects of that many with `||`, which
    /// keeps every value (a JSON null too) and every key.
    fn json_object(&self, pairs: &[String]) -> String {
        if pairs.len() <= PAIRS_PER_CALL {
            return format!("json_build_object({})", pairs.join(", "));
        }
        let parts: Vec<String> = pairs
            .chunks(PAIRS_PER_CALL)
            .map(|c| format!("jsonb_build_object({})", c.join(", ")))
            .collect();
        format!("({})", parts.join(" || "))
    }

    fn compares_with_text(&self, ty: &str) -> bool {
        matches!(ty, "" | "text" | "character varying" | "character" | "name")
    }

    /// Times in ISO 8601 whatever the session's `DateStyle` (a time with a zone in UTC, with
    /// a `Z`), fractions of a second without trailing zeros; bytes as lower-case hex; every
    /// other type as PostgreSQL writes it as text.
    fn scalar_text(&self, expr: &str, ty: &str) -> String {
        let iso =
            |e: &str, f: &str, z: &str| format!("(rtrim(rtrim(to_char({e}, '{f}'), '0'), '.'){z})");
        match ty {
            "timestamp with time zone" => iso(
                &format!("({expr}) AT TIME ZONE 'UTC'"),
                "YYYY-MM-DD\"T\"HH24:MI:SS.US",
                " || 'Z'",
            ),
            "timestamp without time zone" => iso(expr, "YYYY-MM-DD\"T\"HH24:MI:SS.US", ""),
            "date" => format!("to_char({expr}, 'YYYY-MM-DD')"),
            "bytea" => format!("encode({expr}, 'hex')"),
            _ => self.cast_text(expr),
        }
    }

    fn payload_value(&self) -> (&'static str, &'static str) {
        ("", "::jsonb")
    }
}
