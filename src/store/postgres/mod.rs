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

    fn json_object(&self, pairs: &[String]) -> String {
        format!("json_build_object({})", pairs.join(", "))
    }

    fn payload_value(&self) -> (&'static str, &'static str) {
        ("", "::jsonb")
    }
}
