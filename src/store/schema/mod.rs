//! The tables' schema: the versioned migrations of the relay's own table (`migrate.rs`), and
//! what runs on an existing table mapped by `[table]`: the live check and `migrate --adopt`
//! (`adopt.rs`, `check.rs`). Each database's DDL is its [`SchemaSql`].

pub mod adopt;
pub mod check;
pub mod migrate;

use sqlx::Any;
use sqlx::pool::PoolConnection;

use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::sql::Sql;

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
    fn code_step<'a>(
        &'a self,
        _conn: &'a mut Conn,
        _table: &'a str,
        _version: i64,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// The lease table's DDL (`outbox_relay_lease`): also created beside a mapped table.
    fn lease_table(&self) -> &'static str;

    /// `SELECT COUNT(*)` of tables named `table` in the connection's schema or database.
    fn table_exists(&self, table: &str) -> Sql;

    /// `SELECT name, type` of the columns of `table` (no row: no such table).
    fn live_columns(&self, table: &str) -> Sql;

    /// `SELECT COUNT(*)` of indexes (or, `trigger`, triggers) named `name`.
    fn object_exists(&self, name: &str, trigger: bool) -> Sql;

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

    /// The NOTIFY trigger's statements, where the database has one (`table.notify_trigger`).
    fn notify_trigger(&self, _table: &str) -> Vec<String> {
        Vec::new()
    }
}

/// What claims need on a mapped table (see [`SchemaSql::claim_support`]).
#[derive(Debug, Clone, Default)]
pub struct ClaimSupport {
    /// (column name, `ADD COLUMN ...` clause).
    pub columns: Vec<(String, String)>,
    /// (index name, statement).
    pub indexes: Vec<(String, String)>,
}

/// The partial indexes of unfinished rows that claims walk on a mapped table: by channel
/// (and id), and by ordering key (and id), for databases that have partial indexes.
pub fn partial_indexes(db: &Db) -> ClaimSupport {
    let (t, c) = (db.table(), db.cols());
    let id = &c.id;
    let open = c.open("");
    let lead = c
        .channel_column()
        .map_or(String::new(), |ch| format!("{ch}, "));
    let mut indexes = vec![(
        format!("{t}_channel_due_idx"),
        format!(
            "CREATE INDEX IF NOT EXISTS {t}_channel_due_idx ON {t} ({lead}{id}) \
             WHERE {open}"
        ),
    )];
    if let Some(k) = &c.ordering_key {
        indexes.push((
            format!("{t}_ordering_idx"),
            format!(
                "CREATE INDEX IF NOT EXISTS {t}_ordering_idx ON {t} ({k}, {id}) \
                 WHERE {k} IS NOT NULL AND {open}"
            ),
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
