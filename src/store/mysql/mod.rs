//! MySQL 8 / MariaDB 10.6+: its SQL text ([`Syntax`]), session settings and server
//! capabilities (`session.rs`), schema and migrations (`schema.rs`), the columns and index
//! of unfinished rows that stand in for partial indexes (`open_index.rs`), claims and idle
//! reads (`claim.rs`) and their transactions in text (`batch.rs`), the statements of the operator's queries and lock tables that differ
//! here (`admin.rs`), and `GET_LOCK` sessions (`get_lock.rs`).
//!
//! Timestamps are `TIMESTAMP(6)`: stored as instants (UTC) and converted to and from each
//! session's time zone, so a row the application inserts with the DEFAULT timestamps from a
//! session in any zone is due at once for the relay, whose sessions run at `+00:00`, and its
//! age is right (see `schema.rs`, version 3). Sessions run at READ COMMITTED so that the
//! claim's locking read takes no gap locks that would block the application's inserts.

pub mod admin;
mod batch;
pub mod claim;
pub mod get_lock;
mod key_check;
pub mod open_index;
pub mod schema;
pub mod session;

use crate::store::sql::Syntax;

/// MySQL 8 or MariaDB 10.6+ (older servers work without `SKIP LOCKED`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MySql;

impl Syntax for MySql {
    /// Most of the relay's statements differ in text from one run to the next (lists of ids
    /// and keys), and a prepare is a round trip of its own; as text they can also share one
    /// (docs/design.md, "Statements as text on MySQL/MariaDB").
    fn values_as_literals(&self) -> bool {
        true
    }

    /// A claim's and a result write's ids are mostly runs of consecutive ids: as ranges the
    /// server parses and plans a few items instead of hundreds (docs/design.md, "Id sets as
    /// ranges on MySQL/MariaDB").
    fn ids_as_ranges(&self) -> bool {
        true
    }

    fn quote_ident(&self, name: &str) -> String {
        format!("`{}`", name.replace('`', "``"))
    }

    fn integer_type(&self) -> &'static str {
        "SIGNED"
    }

    fn now(&self) -> &'static str {
        "NOW(6)"
    }

    fn now_plus_ms(&self) -> (&'static str, &'static str) {
        ("DATE_ADD(NOW(6), INTERVAL (", " * 1000) MICROSECOND)")
    }

    fn unix_time(&self) -> (&'static str, &'static str) {
        ("FROM_UNIXTIME(", ")")
    }

    /// MySQL's TIMESTAMP (and FROM_UNIXTIME) end in 2038: a later bound means "any time"
    /// here, and FROM_UNIXTIME would give NULL (no row) instead.
    fn unix_secs(&self, secs: i64) -> i64 {
        secs.clamp(0, i64::from(i32::MAX))
    }

    fn age_ms(&self, col: &str) -> String {
        format!("(TIMESTAMPDIFF(MICROSECOND, {col}, NOW(6)) DIV 1000)")
    }

    fn time_text(&self, col: &str) -> String {
        format!("DATE_FORMAT({col}, '%Y-%m-%d %H:%i:%s')")
    }

    fn payload_text(&self, col: &str) -> String {
        format!("CAST({col} AS CHAR)")
    }

    /// As bytes: the driver decodes every text value of a row eagerly, so a value that is
    /// not valid UTF-8 would fail the whole result set.
    fn claim_text(&self, col: &str) -> String {
        format!("CAST({col} AS BINARY)")
    }

    fn byte_length(&self, col: &str) -> String {
        format!("LENGTH({col})")
    }

    fn null_text(&self) -> &'static str {
        "CAST(NULL AS CHAR)"
    }

    fn null_int(&self) -> &'static str {
        "CAST(NULL AS SIGNED)"
    }

    fn cast_text(&self, expr: &str) -> String {
        format!("CAST({expr} AS CHAR)")
    }

    /// Checked first: text that is not JSON becomes JSON null, which the sink refuses for
    /// that row alone.
    fn json_value(&self, col: &str) -> String {
        format!("JSON_EXTRACT(IF(JSON_VALID({col}), {col}, 'null'), '$')")
    }

    fn json_object(&self, pairs: &[String]) -> String {
        format!("JSON_OBJECT({})", pairs.join(", "))
    }

    /// Times in ISO 8601 (a `TIMESTAMP` in UTC, with a `Z`: the relay's sessions run at
    /// `+00:00`), fractions of a second without trailing zeros; `BIT` as its number; bytes as
    /// lower-case hex; spatial values as WKT; every other type as `CAST(... AS CHAR)` writes
    /// it (`DECIMAL` with its exact digits, `TINYINT(1)` as `0`/`1`).
    fn scalar_text(&self, expr: &str, ty: &str) -> String {
        // The format always has a fraction, so trimming its zeros stops at the dot.
        let iso = |e: String, z: &str| {
            format!("CONCAT(TRIM(TRAILING '.' FROM TRIM(TRAILING '0' FROM {e})){z})")
        };
        match ty {
            "datetime" => iso(format!("DATE_FORMAT({expr}, '%Y-%m-%dT%H:%i:%s.%f')"), ""),
            "timestamp" => iso(
                format!("DATE_FORMAT({expr}, '%Y-%m-%dT%H:%i:%s.%f')"),
                ", 'Z'",
            ),
            "time" => iso(format!("TIME_FORMAT({expr}, '%H:%i:%s.%f')"), ""),
            "bit" => format!("CAST(({expr}) + 0 AS CHAR)"),
            "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
                format!("LOWER(HEX({expr}))")
            }
            "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
            | "multipolygon" | "geometrycollection" => {
                format!("ST_AsText({expr})")
            }
            _ => self.cast_text(expr),
        }
    }
}

/// Whether a server (by `SELECT VERSION()`) is MariaDB, and whether it has
/// `FOR UPDATE SKIP LOCKED` (MariaDB 10.6+, MySQL 8.0.1+).
pub fn capabilities(version: &str) -> (bool, bool) {
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let mut nums = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().unwrap_or(0));
    let major = nums.next().unwrap_or(0);
    let minor = nums.next().unwrap_or(0);
    let skip_locked = if mariadb {
        (major, minor) >= (10, 6)
    } else {
        major >= 8
    };
    (mariadb, skip_locked)
}

#[cfg(test)]
mod tests {
    use super::capabilities;

    #[test]
    fn detects_skip_locked_support() {
        assert_eq!(capabilities("10.11.19-MariaDB-0+deb12u1"), (true, true));
        assert_eq!(capabilities("10.5.2-MariaDB"), (true, false));
        assert_eq!(capabilities("8.0.36"), (false, true));
        assert_eq!(capabilities("5.7.44-log"), (false, false));
    }
}
