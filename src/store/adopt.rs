//! Running on an existing table (docs/adopting-a-table.md): what `migrate --adopt` adds, and
//! the live check behind `check-config` and `run`.
//!
//! Guarantees:
//! - `migrate --adopt` only adds: the relay's bookkeeping columns that are missing (all
//!   NULLable or with a constant default, so existing rows and the application's INSERTs
//!   are unaffected), the indexes claims need, on MySQL the virtual `open_*` columns they
//!   index, and on PostgreSQL the NOTIFY trigger when `table.notify_trigger` asks. It never
//!   drops, rewrites or changes an existing column or row;
//! - it is idempotent: the plan is computed from the live table, so a second run plans nothing;
//! - the check names the configuration key of every mapped column that is missing or of an
//!   unusable type, and asks for `migrate --adopt` when bookkeeping is missing.

use sqlx::Row;

use super::Dialect;
use super::builder::Sql;
use super::ident::bare;
use super::sql::SqlStore;

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

/// A bookkeeping column `migrate --adopt` adds: (name, PostgreSQL, MySQL, SQLite types).
type Bookkeeping = (String, &'static str, &'static str, &'static str);

impl SqlStore {
    /// The table's columns as (lower-case name, type), or `None` when there is no such table.
    async fn live_columns(&self) -> anyhow::Result<Option<Vec<(String, String)>>> {
        let mut q = match self.dialect {
            Dialect::Postgres => Sql::new(
                "SELECT column_name::text, data_type::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = lower(",
            ),
            Dialect::MySql { .. } => Sql::new(
                "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = (",
            ),
            Dialect::Sqlite => Sql::new("SELECT name, type FROM pragma_table_info(("),
        };
        q.text(&self.table).push(")");
        if self.dialect == Dialect::Sqlite {
            q.push(")");
        }
        let rows = q.query(self).fetch_all(&self.pool).await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let name: String = r.try_get(0)?;
            let ty: String = r.try_get::<Option<String>, _>(1)?.unwrap_or_default();
            out.push((name.to_ascii_lowercase(), ty));
        }
        Ok(Some(out))
    }

    /// Whether an index (or, `trigger`, a PostgreSQL trigger) of this name exists.
    async fn exists(&self, name: &str, trigger: bool) -> anyhow::Result<bool> {
        let mut q = Sql::new(match (self.dialect, trigger) {
            (Dialect::Postgres, true) => {
                "SELECT COUNT(*) FROM pg_trigger WHERE NOT tgisinternal AND tgname::text = lower("
            }
            (Dialect::Postgres, false) => {
                "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() \
                 AND indexname::text = lower("
            }
            (Dialect::MySql { .. }, _) => {
                "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE \
                 TABLE_SCHEMA = DATABASE() AND INDEX_NAME = ("
            }
            (Dialect::Sqlite, _) => "SELECT COUNT(*) FROM sqlite_master WHERE name = (",
        });
        q.text(name).push(")");
        let n: i64 = q.query(self).fetch_one(&self.pool).await?.try_get(0)?;
        Ok(n > 0)
    }

    /// The bookkeeping columns the relay needs on this table.
    fn bookkeeping(&self) -> Vec<Bookkeeping> {
        let c = &self.cols;
        let time = (
            "TIMESTAMPTZ NULL",
            "TIMESTAMP(6) NULL DEFAULT NULL",
            "TEXT NULL",
        );
        let mut out: Vec<Bookkeeping> = vec![
            (
                "claimed_by".into(),
                "TEXT NULL",
                "VARCHAR(255) NULL",
                "TEXT NULL",
            ),
            (
                "claim_token".into(),
                "TEXT NULL",
                "VARCHAR(64) NULL",
                "TEXT NULL",
            ),
            ("claimed_until".into(), time.0, time.1, time.2),
        ];
        let t = &c.owned;
        if t.sent_at {
            out.push((c.sent_at.clone(), time.0, time.1, time.2));
        }
        if t.attempts {
            out.push((
                c.attempts.clone(),
                "INT NOT NULL DEFAULT 0",
                "INT NOT NULL DEFAULT 0",
                "INTEGER NOT NULL DEFAULT 0",
            ));
        }
        if t.next_attempt_at {
            out.push((c.next_attempt_at.clone(), time.0, time.1, time.2));
        }
        out
    }

    /// The indexes claims need: (name, statement), and on MySQL the virtual columns first.
    fn claim_indexes(&self) -> Vec<(String, String)> {
        let (t, c) = (&self.table, &self.cols);
        let id = &c.id;
        match self.dialect {
            Dialect::MySql { .. } => {
                let mut out = vec![(
                    format!("{t}_open_idx"),
                    format!("CREATE INDEX {t}_open_idx ON {t} (open_channel, {id})"),
                )];
                if c.ordering_key.is_some() {
                    out.push((
                        format!("{t}_open_key_idx"),
                        format!("CREATE INDEX {t}_open_key_idx ON {t} (open_key, {id})"),
                    ));
                }
                out
            }
            _ => {
                let open = c.open("");
                let lead = c
                    .channel_column()
                    .map_or(String::new(), |ch| format!("{ch}, "));
                let mut out = vec![(
                    format!("{t}_channel_due_idx"),
                    format!(
                        "CREATE INDEX IF NOT EXISTS {t}_channel_due_idx ON {t} ({lead}{id}) \
                         WHERE {open}"
                    ),
                )];
                if let Some(k) = &c.ordering_key {
                    out.push((
                        format!("{t}_ordering_idx"),
                        format!(
                            "CREATE INDEX IF NOT EXISTS {t}_ordering_idx ON {t} ({k}, {id}) \
                             WHERE {k} IS NOT NULL AND {open}"
                        ),
                    ));
                }
                out
            }
        }
    }

    /// MySQL: the virtual columns the claim indexes read (the channel and ordering key of
    /// unfinished rows only, NULL once finished; see `mysql::add_open_columns`).
    fn open_columns_ddl(&self) -> Vec<(&'static str, String)> {
        let c = &self.cols;
        let open = c.open("");
        let mut out = vec![(
            "open_channel",
            format!(
                "ADD COLUMN open_channel VARCHAR(191) AS (CASE WHEN {open} THEN {} END) VIRTUAL",
                c.channel("")
            ),
        )];
        if let Some(k) = &c.ordering_key {
            out.push((
                "open_key",
                format!(
                    "ADD COLUMN open_key VARCHAR(191) AS (CASE WHEN {open} THEN {k} END) VIRTUAL"
                ),
            ));
        }
        out
    }

    /// The statements `migrate --adopt` would run now, in order (empty: nothing to do).
    pub async fn adopt_plan(&self) -> anyhow::Result<Vec<String>> {
        let t = &self.table;
        anyhow::ensure!(
            self.cols.mapped,
            "`migrate --adopt` is for an existing table mapped by [table] \
             (docs/adopting-a-table.md); the relay's own table is created by plain `migrate`"
        );
        let Some(live) = self.live_columns().await? else {
            anyhow::bail!("table {t} does not exist (database.table)");
        };
        let has = |name: &str| live.iter().any(|(n, _)| n.eq_ignore_ascii_case(bare(name)));
        let mut adds: Vec<String> = Vec::new();
        for (name, pg, my, lite) in self.bookkeeping() {
            if has(&name) {
                continue;
            }
            let ty = match self.dialect {
                Dialect::Postgres => pg,
                Dialect::MySql { .. } => my,
                Dialect::Sqlite => lite,
            };
            adds.push(format!("ADD COLUMN {name} {ty}"));
        }
        if let Dialect::MySql { .. } = self.dialect {
            for (name, ddl) in self.open_columns_ddl() {
                if !has(name) {
                    adds.push(ddl);
                }
            }
        }
        let mut plan = Vec::new();
        match self.dialect {
            // SQLite adds one column per statement.
            Dialect::Sqlite => {
                plan.extend(adds.iter().map(|a| format!("ALTER TABLE {t} {a}")));
            }
            _ if !adds.is_empty() => plan.push(format!("ALTER TABLE {t} {}", adds.join(", "))),
            _ => {}
        }
        for (name, ddl) in self.claim_indexes() {
            if !self.exists(&name, false).await? {
                plan.push(ddl);
            }
        }
        if self.dialect == Dialect::Postgres
            && self.cols.notify
            && !self.exists(&format!("{t}_notify"), true).await?
        {
            plan.extend(super::postgres::notify_trigger(t));
        }
        Ok(plan)
    }

    /// Runs `plan` (from [`SqlStore::adopt_plan`]) and creates the lease table.
    pub async fn adopt(&self, plan: &[String]) -> anyhow::Result<()> {
        use sqlx::Executor;
        for statement in plan {
            self.count_statement();
            self.pool
                .execute(sqlx::AssertSqlSafe(statement.clone()))
                .await
                .map_err(|e| anyhow::anyhow!("{statement}: {e}"))?;
        }
        self.migrate().await
    }

    /// Checks the mapping against the live table (nothing for the relay's own table, which
    /// `migrate` creates). Empty: the relay can run on it.
    pub async fn check_table(&self) -> anyhow::Result<Vec<Problem>> {
        let c = &self.cols;
        if !c.mapped {
            return Ok(Vec::new());
        }
        let t = &self.table;
        let Some(live) = self.live_columns().await? else {
            return Ok(vec![Problem {
                key: "database.table".into(),
                message: format!("table {t} does not exist"),
            }]);
        };
        let sqlite = self.dialect == Dialect::Sqlite;
        let mut problems = Vec::new();
        let mut want = |key: String, name: &str, ok: &[Kind], what: &str| {
            let name = bare(name);
            match live.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
                None => problems.push(Problem {
                    key,
                    message: format!("column \"{name}\" does not exist in table {t}"),
                }),
                // SQLite columns take any value whatever their declared type.
                Some((_, ty)) if !sqlite && !ok.contains(&kind(ty)) => problems.push(Problem {
                    key,
                    message: format!(
                        "column \"{name}\" is of type {ty}; the relay needs {what} there"
                    ),
                }),
                Some(_) => {}
            }
        };
        use Kind::*;
        let any_text = [Text, Int, Json];
        want(
            "table.columns.id".into(),
            &c.id,
            &[Int],
            "an integer (ids are compared and ordered)",
        );
        let status_ok: &[Kind] = match c.status_kinds() {
            (true, false) => &[Int],
            (true, true) => &[Int, Text],
            _ => &[Text],
        };
        let what = match c.status_kinds() {
            (true, false) => "an integer (table.status holds integers)",
            (true, true) => "an integer or text",
            _ => "text (table.status holds strings)",
        };
        want("table.columns.status".into(), &c.status, status_ok, what);
        if let Some(ch) = c.channel_column() {
            want("table.columns.channel".into(), ch, &any_text, "text");
        }
        for (key, col) in [
            ("recipient", &c.recipient),
            ("ordering_key", &c.ordering_key),
        ] {
            if let Some(col) = col {
                want(format!("table.columns.{key}"), col, &any_text, "text");
            }
        }
        if let Some(e) = &c.last_error {
            want("table.columns.last_error".into(), e, &[Text], "text");
        }
        for (key, col) in [("created_at", &c.created_at), ("updated_at", &c.updated_at)] {
            if let Some(col) = col {
                want(format!("table.columns.{key}"), col, &[Time], "a timestamp");
            }
        }
        for (key, col, json) in c.payload_columns() {
            if json && self.dialect == Dialect::Postgres {
                want(key, &col, &[Json], "json or jsonb (it is embedded as JSON)");
            } else if json || key == "table.columns.payload" {
                want(key, &col, &[Text, Json], "text or JSON");
            } else {
                want(key, &col, &[Text, Int, Json, Time], "a scalar value");
            }
        }
        // Columns the table maps itself (else they are bookkeeping, checked below).
        let owned = &c.owned;
        if !owned.attempts {
            want(
                "table.columns.attempts".into(),
                &c.attempts,
                &[Int],
                "an integer",
            );
        }
        if !owned.next_attempt_at {
            let key = "table.columns.next_attempt_at".into();
            want(key, &c.next_attempt_at, &[Time], "a timestamp");
        }
        if !owned.sent_at {
            want(
                "table.columns.sent_at".into(),
                &c.sent_at,
                &[Time],
                "a timestamp",
            );
        }
        for (name, ..) in self.bookkeeping() {
            let name = bare(&name);
            if !live.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
                problems.push(Problem {
                    key: "table".into(),
                    message: format!(
                        "the relay's bookkeeping column \"{name}\" is missing: {RUN_ADOPT}"
                    ),
                });
            }
        }
        let mut missing_index = Vec::new();
        for (name, _) in self.claim_indexes() {
            if !self.exists(&name, false).await? {
                missing_index.push(name);
            }
        }
        if let Dialect::MySql { .. } = self.dialect {
            for (name, _) in self.open_columns_ddl() {
                if !live.iter().any(|(n, _)| n == name) {
                    missing_index.push(name.to_string());
                }
            }
        }
        if !missing_index.is_empty() {
            problems.push(Problem {
                key: "table".into(),
                message: format!(
                    "the index(es)/column(s) claims need are missing ({}): {RUN_ADOPT}",
                    missing_index.join(", ")
                ),
            });
        }
        Ok(problems)
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
