//! The live check behind `check-config` and `run` on a table mapped by `[table]`: every
//! mapped column exists and is of a type the relay can use, the bookkeeping columns and what
//! claims need are there.
//!
//! Guarantee: the check names the configuration key of every mapped column that is missing or
//! of an unusable type, and asks for `migrate --adopt` when bookkeeping is missing.

use super::SchemaSql;
use super::adopt::{bookkeeping, exists, live_columns};
use crate::store::db::Db;
use crate::store::sql::ident::bare;

/// A problem the live check found: the key at fault and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// The kinds of column type the check tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Text,
    Time,
    Json,
    Other,
}

/// What a column's declared type is, by the server's name for it.
fn kind(t: &str) -> Kind {
    let t = t.to_ascii_lowercase();
    if t.contains("int") {
        Kind::Int
    } else if t.starts_with("json") {
        Kind::Json
    } else if t.contains("timestamp") || t.contains("datetime") {
        Kind::Time
    } else if t.contains("char") || t.contains("text") || t == "enum" || t == "user-defined" {
        Kind::Text
    } else {
        Kind::Other
    }
}

/// The hint every missing-bookkeeping problem carries.
const RUN_ADOPT: &str =
    "run `outbox-relay migrate --adopt` (prints the statements first with --dry-run)";

/// Checks the mapping against the live table (nothing for the relay's own table, which
/// `migrate` creates). Empty: the relay can run on it.
pub async fn check_table(db: &Db, sql: &dyn SchemaSql) -> anyhow::Result<Vec<Problem>> {
    if !db.cols().mapped {
        return Ok(Vec::new());
    }
    let Some(live) = live_columns(db, sql).await? else {
        return Ok(vec![Problem {
            key: "database.table".into(),
            message: format!("table {} does not exist", db.table()),
        }]);
    };
    let mut check = Check {
        db,
        sql,
        live: &live,
        problems: Vec::new(),
    };
    check.mapped_columns();
    check.payload_columns();
    check.owned_columns();
    check.bookkeeping_columns();
    check.claim_support().await?;
    Ok(check.problems)
}

/// One check of the live table.
struct Check<'a> {
    db: &'a Db,
    sql: &'a dyn SchemaSql,
    /// The table's columns: (lower-case name, type).
    live: &'a [(String, String)],
    problems: Vec<Problem>,
}

impl Check<'_> {
    /// The column mapped by `key` as `name` exists, and is of one of the kinds `ok` (`what`
    /// says which, for the message).
    fn want(&mut self, key: &str, name: &str, ok: &[Kind], what: &str) {
        let name = bare(name);
        let t = self.db.table();
        match self.live.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
            None => self.problems.push(Problem {
                key: key.to_string(),
                message: format!("column \"{name}\" does not exist in table {t}"),
            }),
            // Where columns take any value whatever their declared type, any will do.
            Some((_, ty)) if self.sql.typed_columns() && !ok.contains(&kind(ty)) => {
                self.problems.push(Problem {
                    key: key.to_string(),
                    message: format!(
                        "column \"{name}\" is of type {ty}; the relay needs {what} there"
                    ),
                })
            }
            Some(_) => {}
        }
    }

    /// The columns `[table.columns]` maps (the payload's and the bookkeeping's aside).
    fn mapped_columns(&mut self) {
        use Kind::*;
        let c = self.db.cols().clone();
        let any_text = [Text, Int, Json];
        self.want(
            "table.columns.id",
            &c.id,
            &[Int],
            "an integer (ids are compared and ordered)",
        );
        let (status_ok, what): (&[Kind], &str) = match c.status_kinds() {
            (true, false) => (&[Int], "an integer (table.status holds integers)"),
            (true, true) => (&[Int, Text], "an integer or text"),
            _ => (&[Text], "text (table.status holds strings)"),
        };
        self.want("table.columns.status", &c.status, status_ok, what);
        if let Some(ch) = c.channel_column() {
            self.want("table.columns.channel", ch, &any_text, "text");
        }
        for (key, col) in [
            ("table.columns.recipient", &c.recipient),
            ("table.columns.ordering_key", &c.ordering_key),
        ] {
            if let Some(col) = col {
                self.want(key, col, &any_text, "text");
            }
        }
        if let Some(e) = &c.last_error {
            self.want("table.columns.last_error", e, &[Text], "text");
        }
        for (key, col) in [
            ("table.columns.created_at", &c.created_at),
            ("table.columns.updated_at", &c.updated_at),
        ] {
            if let Some(col) = col {
                self.want(key, col, &[Time], "a timestamp");
            }
        }
    }

    /// The columns the table maps itself that would otherwise be bookkeeping.
    fn owned_columns(&mut self) {
        use Kind::*;
        let c = self.db.cols().clone();
        let owned = &c.owned;
        if !owned.attempts {
            self.want("table.columns.attempts", &c.attempts, &[Int], "an integer");
        }
        if !owned.next_attempt_at {
            let key = "table.columns.next_attempt_at";
            self.want(key, &c.next_attempt_at, &[Time], "a timestamp");
        }
        if !owned.sent_at {
            self.want("table.columns.sent_at", &c.sent_at, &[Time], "a timestamp");
        }
    }

    /// The payload column, or every column `table.payload_object` reads.
    fn payload_columns(&mut self) {
        use Kind::*;
        for (key, col, json) in self.db.cols().payload_columns() {
            if json && self.sql.embedded_json_typed() {
                self.want(
                    &key,
                    &col,
                    &[Json],
                    "json or jsonb (it is embedded as JSON)",
                );
            } else if json || key == "table.columns.payload" {
                self.want(&key, &col, &[Text, Json], "text or JSON");
            } else {
                self.want(&key, &col, &[Text, Int, Json, Time], "a scalar value");
            }
        }
    }

    /// The relay's bookkeeping columns.
    fn bookkeeping_columns(&mut self) {
        for (name, _) in bookkeeping(self.db, self.sql) {
            let name = bare(&name);
            if !self.live.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
                self.problems.push(Problem {
                    key: "table".into(),
                    message: format!(
                        "the relay's bookkeeping column \"{name}\" is missing: {RUN_ADOPT}"
                    ),
                });
            }
        }
    }

    /// What claims need (indexes, and the columns they index).
    async fn claim_support(&mut self) -> anyhow::Result<()> {
        let support = self.sql.claim_support(self.db);
        let mut missing = Vec::new();
        for (name, _) in support.indexes {
            if !exists(self.db, self.sql, &name, false).await? {
                missing.push(name);
            }
        }
        for (name, _) in support.columns {
            if !self.live.iter().any(|(n, _)| *n == name) {
                missing.push(name);
            }
        }
        if !missing.is_empty() {
            self.problems.push(Problem {
                key: "table".into(),
                message: format!(
                    "the index(es)/column(s) claims need are missing ({}): {RUN_ADOPT}",
                    missing.join(", ")
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_of_server_types() {
        for (t, k) in [
            ("bigint", Kind::Int),
            ("integer", Kind::Int),
            ("tinyint", Kind::Int),
            ("character varying", Kind::Text),
            ("varchar", Kind::Text),
            ("enum", Kind::Text),
            ("USER-DEFINED", Kind::Text),
            ("longtext", Kind::Text),
            ("jsonb", Kind::Json),
            ("timestamp with time zone", Kind::Time),
            ("datetime", Kind::Time),
            ("numeric", Kind::Other),
            ("bytea", Kind::Other),
        ] {
            assert_eq!(kind(t), k, "{t}");
        }
    }
}
