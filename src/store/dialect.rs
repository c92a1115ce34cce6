//! The SQL that differs between databases: clock expressions, casts, locking clauses and
//! placeholders. Statements are written once with `?` placeholders and [`Dialect::finalize`]d.

/// A supported database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    /// MySQL 8 or MariaDB; `skip_locked` when the server has `FOR UPDATE SKIP LOCKED`
    /// (MySQL 8.0.1+, MariaDB 10.6+).
    MySql {
        mariadb: bool,
        skip_locked: bool,
    },
    Sqlite,
}

impl Dialect {
    /// The dialect a URL's scheme names (MySQL's flavour is refined after connecting).
    pub fn from_url(url: &str) -> Option<Dialect> {
        let scheme = url.split("://").next()?;
        match scheme {
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "mysql" | "mariadb" => Some(Dialect::MySql {
                mariadb: false,
                skip_locked: true,
            }),
            "sqlite" => Some(Dialect::Sqlite),
            _ => None,
        }
    }

    /// A short name for logs and `status`.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql { mariadb: true, .. } => "mariadb",
            Dialect::MySql { .. } => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }

    /// The database's current time, in the type of the timestamp columns.
    pub fn now(self) -> &'static str {
        match self {
            Dialect::Postgres => "now()",
            Dialect::MySql { .. } => "NOW(6)",
            Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f','now')",
        }
    }

    /// Now plus a bound number of milliseconds (one `?` placeholder, bound as i64).
    pub fn now_plus_ms(self) -> &'static str {
        match self {
            Dialect::Postgres => "(now() + make_interval(secs => ?::float8 / 1000))",
            Dialect::MySql { .. } => "DATE_ADD(NOW(6), INTERVAL (? * 1000) MICROSECOND)",
            Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f','now', (? / 1000.0) || ' seconds')",
        }
    }

    /// The instant a bound number of Unix seconds names, in the type of the timestamp
    /// columns (one `?` placeholder, bound as i64). On MySQL the value and the columns are
    /// both shown in the session's zone, so the comparison holds whatever that zone is.
    pub fn from_unix_secs(self) -> &'static str {
        match self {
            Dialect::Postgres => "to_timestamp(?::float8)",
            Dialect::MySql { .. } => "FROM_UNIXTIME(?)",
            Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', ?, 'unixepoch')",
        }
    }

    /// Milliseconds from `col` to now (an integer expression).
    pub fn age_ms(self, col: &str) -> String {
        match self {
            Dialect::Postgres => format!("(EXTRACT(EPOCH FROM (now() - {col})) * 1000)::bigint"),
            Dialect::MySql { .. } => {
                format!("(TIMESTAMPDIFF(MICROSECOND, {col}, NOW(6)) DIV 1000)")
            }
            Dialect::Sqlite => {
                format!("CAST((julianday('now') - julianday({col})) * 86400000 AS INTEGER)")
            }
        }
    }

    /// A timestamp column as text (for display).
    pub fn time_text(self, col: &str) -> String {
        match self {
            Dialect::Postgres => {
                format!("to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')")
            }
            Dialect::MySql { .. } => format!("DATE_FORMAT({col}, '%Y-%m-%d %H:%i:%s')"),
            Dialect::Sqlite => format!("substr({col}, 1, 19)"),
        }
    }

    /// The payload column as text.
    pub fn payload_text(self, col: &str) -> String {
        match self {
            Dialect::Postgres => format!("{col}::text"),
            Dialect::MySql { .. } => format!("CAST({col} AS CHAR)"),
            Dialect::Sqlite => col.to_string(),
        }
    }

    /// A text column as the claim reads it. Read as bytes on MySQL and SQLite, so that a value
    /// that is not valid UTF-8 fails only its own row (decoded in Rust) instead of the whole
    /// result set (the `Any` driver decodes every text value of a row eagerly). PostgreSQL
    /// text is valid UTF-8 by construction.
    pub fn claim_text(self, col: &str) -> String {
        match self {
            Dialect::Postgres => col.to_string(),
            Dialect::MySql { .. } => format!("CAST({col} AS BINARY)"),
            Dialect::Sqlite => format!("CAST({col} AS BLOB)"),
        }
    }

    /// SQLite's storage classes of the given columns, then whether each of `times` holds a
    /// time, comma-separated (`text,null,...,time`): its columns take any type whatever the
    /// schema says (an application may store a BLOB or an integer in a TEXT column). NULL on
    /// the other databases, whose columns are typed.
    pub fn storage_classes(self, cols: &[String], times: &[String]) -> String {
        match self {
            Dialect::Sqlite => cols
                .iter()
                .map(|c| format!("typeof({c})"))
                .chain(times.iter().map(|c| {
                    format!("CASE WHEN {c} IS NULL THEN 'null' WHEN julianday({c}) IS NULL THEN 'text that is not a time' ELSE 'time' END")
                }))
                .collect::<Vec<_>>()
                .join(" || ',' || "),
            _ => "NULL".to_string(),
        }
    }

    /// The condition that the time in `col` has come. On SQLite a value that is not a time
    /// at all (an application's typo) counts as due, so that the row is claimed and failed
    /// naming the column instead of waiting for ever.
    pub fn due(self, col: &str) -> String {
        match self {
            Dialect::Sqlite => format!(
                "({col} <= {now} OR julianday({col}) IS NULL)",
                now = self.now()
            ),
            _ => format!("{col} <= {}", self.now()),
        }
    }

    /// The length of `col` in bytes, as the database stores it as text.
    pub fn byte_length(self, col: &str) -> String {
        match self {
            Dialect::Postgres => format!("octet_length({col}::text)"),
            Dialect::MySql { .. } => format!("LENGTH({col})"),
            // Bytes of text or blob, read from the record header: the value is not loaded.
            Dialect::Sqlite => format!("octet_length({col})"),
        }
    }

    /// A NULL of a text type (a column a mapped table does not have).
    pub fn null_text(self) -> &'static str {
        match self {
            Dialect::Postgres => "NULL::text",
            Dialect::MySql { .. } => "CAST(NULL AS CHAR)",
            Dialect::Sqlite => "NULL",
        }
    }

    /// A NULL of an integer type.
    pub fn null_int(self) -> &'static str {
        match self {
            Dialect::Postgres => "NULL::bigint",
            Dialect::MySql { .. } => "CAST(NULL AS SIGNED)",
            Dialect::Sqlite => "NULL",
        }
    }

    /// Any value as text.
    pub fn cast_text(self, expr: &str) -> String {
        match self {
            Dialect::Postgres => format!("({expr})::text"),
            Dialect::MySql { .. } => format!("CAST({expr} AS CHAR)"),
            Dialect::Sqlite => format!("CAST({expr} AS TEXT)"),
        }
    }

    /// A column holding JSON, as a JSON value inside a built object. MySQL and SQLite check
    /// it first (text that is not JSON becomes JSON null, which the sink refuses for that row
    /// alone); on PostgreSQL the column must be `json`/`jsonb` (checked by `check-config`),
    /// since a failed cast would fail the whole claim.
    pub fn json_value(self, col: &str) -> String {
        match self {
            Dialect::Postgres => format!("{col}::jsonb"),
            Dialect::MySql { .. } => {
                format!("JSON_EXTRACT(IF(JSON_VALID({col}), {col}, 'null'), '$')")
            }
            Dialect::Sqlite => {
                format!("json(CASE WHEN json_valid({col}) THEN {col} ELSE 'null' END)")
            }
        }
    }

    /// A bound payload as a value of the payload column's type.
    pub fn payload_param(self) -> &'static str {
        match self {
            Dialect::Postgres => "?::jsonb",
            _ => "?",
        }
    }

    /// Rewrites `?` placeholders into the dialect's form (`$1, $2, ...` on PostgreSQL).
    /// Statements are ours and contain no `?` inside literals.
    pub fn finalize(self, sql: &str) -> String {
        if self != Dialect::Postgres {
            return sql.to_string();
        }
        let mut out = String::with_capacity(sql.len() + 16);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_placeholders_for_postgres_only() {
        assert_eq!(
            Dialect::Postgres.finalize("a = ? AND b IN (?, ?)"),
            "a = $1 AND b IN ($2, $3)"
        );
        assert_eq!(Dialect::Sqlite.finalize("a = ?"), "a = ?");
    }
}
