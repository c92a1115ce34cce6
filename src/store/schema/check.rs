//! The live check behind `check-config`, `run` and `migrate --adopt` on a table mapped by
//! `[table]`: the table and every mapped column exist as the database resolves their quoted
//! names, each column is of a type the relay can use, the status values fit the status column
//! (`values.rs`), and the bookkeeping columns and what claims need are there.
//!
//! Guarantees: the check names the configuration key of everything it refuses (a name that
//! resolves to nothing, with "did you mean" when only the case differs; a type the relay
//! cannot use; a status value the column cannot hold or cannot tell from another state's; a
//! payload object too wide for the database), and asks for `migrate --adopt` when only the
//! relay's own additions are missing ([`Problem::adopt`]).

pub use super::Problem;
use super::live::{self, Kind, LiveColumn, bookkeeping, did_you_mean, exists, find, kind};
use super::{SchemaSql, values};
use crate::store::db::Db;
use crate::store::sql::ident::bare;

/// The hint every missing-bookkeeping problem carries.
const RUN_ADOPT: &str =
    "run `outbox-relay migrate --adopt` (prints the statements first with --dry-run)";

/// Checks the mapping against the live table (nothing for the relay's own table, which
/// `migrate` creates). Empty: the relay can run on it.
pub async fn check_table(db: &Db, sql: &dyn SchemaSql) -> anyhow::Result<Vec<Problem>> {
    if !db.cols().mapped {
        return Ok(Vec::new());
    }
    let Some(live) = live::columns(db, sql).await? else {
        let names = live::table_names(db, sql).await?;
        let hint = did_you_mean(names.iter().map(String::as_str), db.table_name());
        return Ok(vec![Problem::at(
            "database.table",
            format!("table \"{}\" does not exist{hint}", db.table_name()),
        )]);
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
    if let Some(status) = find(sql, &live, &db.cols().status)
        && check
            .problems
            .iter()
            .all(|p| p.key != "table.columns.status")
    {
        check.problems.extend(values::check(db, sql, status).await?);
    }
    check.bookkeeping_columns();
    check.claim_support().await?;
    Ok(check.problems)
}

/// One check of the live table.
struct Check<'a> {
    db: &'a Db,
    sql: &'a dyn SchemaSql,
    live: &'a [LiveColumn],
    problems: Vec<Problem>,
}

impl Check<'_> {
    /// The column mapped by `key` as `name` (its SQL form), if it resolves; else a problem.
    fn column(&mut self, key: &str, name: &str) -> Option<&LiveColumn> {
        let found = find(self.sql, self.live, name);
        if found.is_none() {
            let hint = did_you_mean(self.live.iter().map(|c| c.name.as_str()), name);
            self.problems.push(Problem::at(
                key,
                format!(
                    "column \"{}\" does not exist in table {}{hint}",
                    bare(name),
                    self.db.table_name()
                ),
            ));
        }
        found
    }

    /// The column mapped by `key` as `name` exists, and is of one of the kinds `ok` (`what`
    /// says which, for the message).
    fn want(&mut self, key: &str, name: &str, ok: &[Kind], what: &str) {
        let typed = self.sql.typed_columns();
        let Some(col) = self.column(key, name) else {
            return;
        };
        // Where columns take any value whatever their declared type, any will do.
        if typed && !ok.contains(&kind(&col.ty)) {
            let message = format!(
                "column \"{}\" is of type {}; the relay needs {what} there",
                col.name, col.ty
            );
            self.problems.push(Problem::at(key, message));
        }
    }

    /// The columns `[table.columns]` maps (the payload's and the bookkeeping's aside).
    fn mapped_columns(&mut self) {
        use Kind::*;
        let c = self.db.cols().clone();
        let any_text = [Text, Int, Json, Time, Other];
        let id_what = "an integer (ids are compared and ordered)";
        self.want("table.columns.id", &c.id, &[Int], id_what);
        if let Some(id) = find(self.sql, self.live, &c.id)
            && id.nullable
        {
            self.problems.push(Problem::at(
                "table.columns.id",
                format!(
                    "column \"{}\" may be NULL; the relay needs a NOT NULL id (a primary key): \
                     a row without one could be neither claimed nor written",
                    id.name
                ),
            ));
        }
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
                self.want(key, col, &any_text, "a scalar value");
            }
        }
        if let (Some(k), Some(max)) = (&c.ordering_key, self.sql.max_key_chars())
            && let Some(col) = find(self.sql, self.live, k)
            && col.max_len.is_some_and(|n| n > max)
        {
            self.problems.push(Problem::at(
                "table.columns.ordering_key",
                format!(
                    "column \"{}\" ({}) holds values of up to {} characters; claims index the \
                     ordering key of unfinished rows, at most {max} characters here: map a \
                     column of VARCHAR({max}) or shorter",
                    col.name,
                    col.full,
                    col.max_len.unwrap_or_default()
                ),
            ));
        }
        if let Some(e) = &c.last_error {
            self.want("table.columns.last_error", e, &[Text], "text");
        }
        // The writer's trace context (docs/tracing.md): read as text, so any text column.
        for (key, col) in [
            ("table.columns.traceparent", &c.traceparent),
            ("table.columns.tracestate", &c.tracestate),
        ] {
            if let Some(col) = col {
                self.want(key, col, &[Text], "text (a W3C trace context)");
            }
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

    /// The payload column, or every column `table.payload_object` reads (any scalar type:
    /// each becomes text in its documented format), and the object's width.
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
                self.column(&key, &col);
            }
        }
        let widest = self.db.cols().widest_object();
        if let (Some((key, n)), Some(max)) = (widest, self.db.syntax().max_object_pairs())
            && n > max
        {
            self.problems.push(Problem::at(
                &key,
                format!(
                    "an object of {n} keys; {} builds objects of at most {max} keys: nest some \
                     of them in an object of their own",
                    self.db.dialect().name()
                ),
            ));
        }
    }

    /// A problem `migrate --adopt` fixes.
    fn needs_adopt(&mut self, message: String) {
        self.problems.push(Problem {
            key: "table".into(),
            message,
            adopt: true,
        });
    }

    /// The relay's bookkeeping columns: present, and (a column of the table's own of that
    /// name, not mapped, is taken for it) of the kind the relay writes there.
    fn bookkeeping_columns(&mut self) {
        for (name, ddl) in bookkeeping(self.db, self.sql) {
            match find(self.sql, self.live, &name) {
                None => self.needs_adopt(format!(
                    "the relay's bookkeeping column \"{}\" is missing: {RUN_ADOPT}",
                    bare(&name)
                )),
                Some(col) if self.sql.typed_columns() && kind(&col.ty) != kind(ddl) => {
                    let message = format!(
                        "the table's column \"{}\" ({}) is where the relay keeps its own \
                         \"{}\" ({ddl}); map the relay's column to another name, or rename this \
                         one",
                        col.name,
                        col.full,
                        bare(&name)
                    );
                    self.problems.push(Problem::at("table", message));
                }
                Some(_) => {}
            }
        }
    }

    /// What claims need (indexes, and the columns they index).
    async fn claim_support(&mut self) -> anyhow::Result<()> {
        let support = self.sql.claim_support(self.db);
        let mut missing = Vec::new();
        for (name, _, _) in support.indexes {
            if !exists(self.db, self.sql, &name, false).await? {
                missing.push(name);
            }
        }
        for (name, _) in support.columns {
            if find(self.sql, self.live, &name).is_none() {
                missing.push(name);
            }
        }
        if !missing.is_empty() {
            self.needs_adopt(format!(
                "the index(es)/column(s) claims need are missing ({}): {RUN_ADOPT}",
                missing.join(", ")
            ));
        }
        Ok(())
    }
}
