//! The tables' schema: the versioned migrations of the relay's own table (`migrate.rs`), and
//! what runs on an existing table mapped by `[table]`: the live table as the catalog describes
//! it (`live.rs`), the live check (`check.rs`, with the status values' in `values.rs`) and
//! `migrate --adopt` (`adopt.rs`). Each database's DDL and catalog queries are its
//! [`SchemaSql`].

pub mod adopt;
pub mod check;
pub mod live;
pub mod migrate;
pub mod values;

use sqlx::Any;
use sqlx::pool::PoolConnection;

use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::sql::Sql;

/// A problem the live check found: the key at fault and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
    /// `migrate --adopt` fixes it (a bookkeeping column or the claims' index is missing);
    /// anything else is the mapping's, which `migrate --adopt` refuses to run with.
    pub adopt: bool,
}

impl Problem {
    /// A problem of the mapping, at `key`.
    pub fn at(key: &str, message: impl Into<String>) -> Problem {
        Problem {
            key: key.to_string(),
            message: message.into(),
            adopt: false,
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// One connection, for DDL.
pub type Conn = PoolConnection<Any>;

/// The types `migrate --adopt` gives the relay's bookkeeping columns on one database.
#[derive(Debug, Clone, Copy)]
pub struct ColumnTypes {
    /// `claimed_by`.
    pub claimer: &'static str,
    /// `claim_token`.
    pub token: &'static str,
    /// `claimed_until`, and `sent_at` / `next_attempt_at` when the table has none.
    pub time: &'static str,
    /// `attempts` when the table has none.
    pub attempts: &'static str,
}

/// A schema step run on a connection: done or failed.
pub type Done<'a> = BoxFuture<'a, anyhow::Result<()>>;

/// What the schema's statements are on one database.
pub trait SchemaSql: Send + Sync {
    /// Takes the migration lock on `conn` (instances starting at once migrate one at a time),
    /// in a transaction where the database's DDL is transactional.
    fn lock<'a>(&'a self, conn: &'a mut Conn) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Gives the migration lock back: commits (`ok`) or rolls back the transaction of
    /// [`SchemaSql::lock`].
    fn unlock<'a>(&'a self, conn: &'a mut Conn, ok: bool) -> BoxFuture<'a, anyhow::Result<()>>;

    /// The DDL of schema version `version` of `table` (empty: nothing on this database).
    fn steps(&self, table: &str, version: i64) -> Vec<String>;

    /// What version `version` does in code, after its [`SchemaSql::steps`] (conversions that
    /// depend on what the live table has).
    fn code_step<'a>(&'a self, _conn: &'a mut Conn, _table: &'a str, _version: i64) -> Done<'a> {
        Box::pin(async { Ok(()) })
    }

    /// The lease table's DDL (`outbox_relay_lease`, see [`lease_table`]): also created beside
    /// a mapped table.
    fn lease_table(&self) -> String;

    /// `SELECT COUNT(*)` of tables named `table` in the connection's schema or database.
    fn table_exists(&self, table: &str) -> Sql;

    /// The columns of `table` (no row: no such table), one row per column: name, lower-case
    /// data type, the full type (PostgreSQL's `udt_name`, MySQL's `COLUMN_TYPE`), the
    /// maximum length in characters, whether it takes NULL (`YES`/`NO`), collation and
    /// character set (NULL where the database has none to report).
    fn live_columns(&self, table: &str) -> Sql;

    /// The names of the tables of the connection's schema or database.
    fn table_names(&self) -> Sql;

    /// Whether `configured` names the live column `live`, as the database resolves a quoted
    /// name: by default ignoring ASCII case (MySQL's and SQLite's column names).
    fn resolves(&self, configured: &str, live: &str) -> bool {
        configured.eq_ignore_ascii_case(live)
    }

    /// The members of the enum type `udt` (PostgreSQL's enum types), in order; `None` where
    /// enum members are read from the column's type itself.
    fn enum_labels(&self, _udt: &str) -> Option<Sql> {
        None
    }

    /// `SELECT COUNT(*)` of indexes (or, `trigger`, triggers) named `name` on `table`.
    fn object_exists(&self, table: &str, name: &str, trigger: bool) -> Sql;

    /// The most characters of an ordering key claims can index here (`None`: any).
    fn max_key_chars(&self) -> Option<i64> {
        None
    }

    /// Whether DDL runs in a transaction here, so that `migrate --adopt` is undone by a
    /// rollback; elsewhere each step that ran is undone by its own statement.
    fn transactional_ddl(&self) -> bool {
        true
    }

    /// The statement that drops the index `index` (SQL form) of `table`.
    fn drop_index(&self, _table: &str, index: &str) -> String {
        format!("DROP INDEX {index}")
    }

    /// Whether the database checks a column's declared type (SQLite's columns take any
    /// value whatever their type).
    fn typed_columns(&self) -> bool {
        true
    }

    /// Whether a column embedded as JSON must be of a JSON type (a failed cast would fail the
    /// whole claim).
    fn embedded_json_typed(&self) -> bool {
        false
    }

    /// The types of the bookkeeping columns `migrate --adopt` adds.
    fn column_types(&self) -> ColumnTypes;

    /// What claims need on a mapped table besides the bookkeeping columns: (name, the
    /// `ADD COLUMN` clause) of columns to add, and (name, statement) of indexes.
    fn claim_support(&self, db: &Db) -> ClaimSupport;

    /// The statements that add `adds` (`ADD COLUMN ...` clauses) to `table`.
    fn alter(&self, table: &str, adds: &[String]) -> Vec<String> {
        match adds {
            [] => Vec::new(),
            adds => vec![format!("ALTER TABLE {table} {}", adds.join(", "))],
        }
    }

    /// The NOTIFY trigger of `db`'s table, where the database has one
    /// (`table.notify_trigger`): its name, and its statements.
    fn notify_trigger(&self, _db: &Db) -> Option<(String, Vec<String>)> {
        None
    }
}

/// What claims need on a mapped table (see [`SchemaSql::claim_support`]).
#[derive(Debug, Clone, Default)]
pub struct ClaimSupport {
    /// (column name, `ADD COLUMN ...` clause).
    pub columns: Vec<(String, String)>,
    /// (index name as the catalog lists it, its SQL form, the statement creating it).
    pub indexes: Vec<(String, String, String)>,
}

/// The lease table (`outbox_relay_lease`): one row per lease name, its holder, until when it
/// is held, and the fencing epoch; with each database's types for the name, the holder and
/// the time, and its table options.
pub fn lease_table(name: &str, holder: &str, time: &str, options: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS outbox_relay_lease (
            name {name} PRIMARY KEY,
            holder {holder} NULL,
            lease_until {time} NULL,
            epoch BIGINT NOT NULL DEFAULT 0
        ){options}"
    )
}

/// Schema version 1's table where only the column types differ (PostgreSQL, SQLite): `id`'s
/// definition, the payload's type, the integer type, and the time type with its default.
pub fn table_v1(t: &str, id: &str, json: &str, int: &str, time: &str, now: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (
            id {id},
            channel TEXT NOT NULL,
            recipient TEXT NULL,
            payload {json} NOT NULL,
            ordering_key TEXT NULL,
            status TEXT NOT NULL DEFAULT 'PENDING'
                CHECK (status IN ('PENDING', 'RETRY', 'SUCCESS', 'FAILED')),
            attempts {int} NOT NULL DEFAULT 0,
            next_attempt_at {time} NOT NULL DEFAULT {now},
            claimed_by TEXT NULL,
            claim_token TEXT NULL,
            claimed_until {time} NULL,
            last_error TEXT NULL,
            created_at {time} NOT NULL DEFAULT {now},
            updated_at {time} NOT NULL DEFAULT {now},
            sent_at {time} NULL
        )"
    )
}

/// Schema version 1's indexes where the database has partial indexes: unfinished rows in id
/// order (the claim's walk), the keyed ones by key (`keyed` filters them), rows by status and
/// age, and unfinished rows by age (`oldest_pending_seconds`, `status`).
pub fn indexes_v1(t: &str, keyed: &str) -> [String; 4] {
    let open = "WHERE status IN ('PENDING', 'RETRY')";
    [
        format!("CREATE INDEX IF NOT EXISTS {t}_due_idx ON {t} (id, next_attempt_at) {open}"),
        format!("CREATE INDEX IF NOT EXISTS {t}_ordering_idx ON {t} (ordering_key, id) {keyed}"),
        format!("CREATE INDEX IF NOT EXISTS {t}_status_idx ON {t} (status, updated_at)"),
        format!("CREATE INDEX IF NOT EXISTS {t}_pending_age_idx ON {t} (created_at) {open}"),
    ]
}

/// The partial indexes of unfinished rows that claims walk on a mapped table: by channel
/// (and id), and by ordering key (and id), for databases that have partial indexes.
///
/// No `IF NOT EXISTS`: the plan creates only what the catalog lacks, and an object of the
/// same name that is not this index (a table, another table's index) must fail the plan, not
/// be taken for the index.
pub fn partial_indexes(db: &Db) -> ClaimSupport {
    let (t, c) = (db.table(), db.cols());
    let id = &c.id;
    let open = c.open("");
    let lead = c
        .channel_column()
        .map_or(String::new(), |ch| format!("{ch}, "));
    let (name, sql) = db.object("channel_due_idx");
    let mut indexes = vec![(
        name,
        sql.clone(),
        format!("CREATE INDEX {sql} ON {t} ({lead}{id}) WHERE {open}"),
    )];
    if let Some(k) = &c.ordering_key {
        let (name, sql) = db.object("ordering_idx");
        indexes.push((
            name,
            sql.clone(),
            format!("CREATE INDEX {sql} ON {t} ({k}, {id}) WHERE {k} IS NOT NULL AND {open}"),
        ));
    }
    ClaimSupport {
        columns: Vec::new(),
        indexes,
    }
}

/// Schema version 2 where the database has partial indexes: claims take each channel's
/// budget with its own pick, which walks this index of unfinished rows by channel instead of
/// every due row of every channel.
pub fn channel_due_index(t: &str) -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS {t}_channel_due_idx ON {t} (channel, id)
         WHERE status IN ('PENDING', 'RETRY')"
    )
}

/// Schema version 6 where the database has partial indexes: the console pages through FAILED
/// rows newest first by keyset on `id`, a walk of this index whatever the size of the table.
pub fn failed_index(t: &str) -> String {
    format!("CREATE INDEX IF NOT EXISTS {t}_failed_idx ON {t} (id) WHERE status = 'FAILED'")
}
