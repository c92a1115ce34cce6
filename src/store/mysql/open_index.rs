//! MySQL/MariaDB have no partial indexes. In their place the table has virtual columns that
//! hold the channel (`open_channel`) and ordering key (`open_key`) of unfinished rows only,
//! NULL once a row is SUCCESS or FAILED, and indexes on them (`<table>_open_idx`,
//! `<table>_open_key_idx`), so that finished rows leave those indexes; the FAILED rows are
//! found through `failed_flag` (1 for FAILED, NULL otherwise) and `<table>_failed_idx`. Every
//! statement that uses them is here; the DDL that makes them is in `schema.rs`.
//!
//! Why they matter: without them a claim walked every finished row of its channel (measured
//! on MariaDB 10.11 with 200,000 SUCCESS rows: 200,004 index reads per claim before, 4 after;
//! docs/design.md, "MySQL indexes").

use crate::store::db::Db;

/// The virtual column holding the channel of unfinished rows.
pub const OPEN_CHANNEL: &str = "open_channel";
/// The virtual column holding the ordering key of unfinished rows.
pub const OPEN_KEY: &str = "open_key";
/// The most characters of an ordering key `open_key` can hold: its index with the id must fit
/// InnoDB's 3,072 bytes at four bytes a character (utf8mb4).
pub const MAX_KEY_CHARS: i64 = 765;
/// `open_channel`'s width: every sink name fits, and a longer channel (cut to this) is no
/// sink's either, so its row is failed as unserved, naming the real value.
const CHANNEL_CHARS: i64 = 191;

/// The index `name` (`open_idx`, `open_key_idx`, `failed_idx`) of the table, as SQL names it.
pub fn index(db: &Db, name: &str) -> String {
    db.object(name).1
}

/// The relay's own table, read through `open_idx`, which holds `open_channel`, `id`,
/// `created_at` and `next_attempt_at` (schema versions 8 and 9): the table with its hint, the
/// condition, and the channel. A mapped table's `open_idx` holds only the channel and id.
pub fn unfinished_rows(db: &Db) -> Option<(String, String, String)> {
    if db.cols().mapped {
        return None;
    }
    let t = db.table();
    Some((
        format!("{t} FORCE INDEX ({})", index(db, "open_idx")),
        format!("{OPEN_CHANNEL} IS NOT NULL"),
        OPEN_CHANNEL.to_string(),
    ))
}

/// Whether any unfinished row of the relay's own table is due at all (claimed or not), read
/// from `open_idx` alone. The idle read asks this first: the picks walk a channel's
/// unfinished rows in id order and read each row to compare its `next_attempt_at` (MariaDB
/// checks nothing in an index on a virtual column before it reads the row), which over
/// 100,000 rows waiting for a retry an hour away took 74 ms of the server's time per read,
/// twice a second (docs/design.md, "Idle cost"). "No" is final: a row that is not due is not
/// claimable. "Yes" promises nothing (the due row may be claimed, or behind its key), so the
/// picks are read next.
pub async fn anything_due(db: &Db) -> anyhow::Result<bool> {
    let (t, now) = (db.table(), db.syntax().now());
    let sql = format!(
        "SELECT 1 FROM {t} FORCE INDEX ({}) \
         WHERE {OPEN_CHANNEL} IS NOT NULL AND next_attempt_at <= {now} LIMIT 1",
        index(db, "open_idx")
    );
    Ok(db.sql(&sql).fetch_optional(db.pool()).await?.is_some())
}

/// How many ordering keys are blocked (hold more than one unfinished row), in one pass of
/// `open_key_idx` grouped by key. On the plain key column the inner look-up had no index to
/// use and the gauge's cost grew with the square of the backlog (115 s on a keyed backlog of
/// 50,000 rows in the chaos run); a look-up per row for an earlier row of its key, through
/// the index, still cost 7x the grouping (docs/design.md, "Ordering keys: the blocked-keys
/// gauge").
pub fn blocked_keys(db: &Db) -> Option<String> {
    db.cols().ordering_key.as_ref()?;
    Some(format!(
        "SELECT COUNT(*) FROM (SELECT o.{OPEN_KEY} FROM {} o FORCE INDEX ({}) \
         WHERE o.{OPEN_KEY} IS NOT NULL GROUP BY o.{OPEN_KEY} HAVING COUNT(*) > 1) b",
        db.table(),
        index(db, "open_key_idx")
    ))
}

/// The relay's own FAILED rows, through `failed_idx` on `failed_flag` (schema version 8),
/// which only a condition on that column lets the server use.
pub fn failed_rows(db: &Db) -> (String, &'static str) {
    let t = db.table();
    (
        format!("{t} FORCE INDEX ({})", index(db, "failed_idx")),
        "failed_flag = 1 AND ",
    )
}

/// The `ADD COLUMN` clauses of the virtual columns (channel, and key when the table has one),
/// computed from the mapped status values: (column, clause).
///
/// MariaDB refuses to index a virtual column whose value depends on `sql_mode`
/// (`PAD_CHAR_TO_FULL_LENGTH`), error 1901: any `IN (...)` over a `CHAR(n)` column, and a
/// `CHAR(n)` column as the value. So the unfinished condition is written as equalities joined
/// by `OR` (the same rows as `IN`), and a `CHAR(n)` value is read through `RTRIM`, which is
/// what the server reads from it anyway. A NULL channel becomes `''`, which no sink is named:
/// the row is claimed by the pick of unserved channels and failed naming the column, instead
/// of staying out of every index (docs/adopting-a-table.md, "NULLs").
///
/// Each column is wide enough for every value of its source: in strict mode a value too long
/// for an indexed virtual column fails the application's INSERT. The key's column is as wide
/// as the key column (the live check refuses one wider than [`MAX_KEY_CHARS`]); a channel is
/// cut to [`CHANNEL_CHARS`].
pub fn open_columns_ddl(db: &Db) -> Vec<(String, String)> {
    let c = db.cols();
    let open = c.open_by_equalities("");
    let value = |col: &str| match c.type_of(col) {
        "char" => format!("RTRIM({col})"),
        _ => col.to_string(),
    };
    let channel = match c.channel_column() {
        Some(ch) if c.max_len_of(ch).is_some_and(|n| n <= CHANNEL_CHARS) => {
            format!("COALESCE({}, '')", value(ch))
        }
        Some(ch) => format!("LEFT(COALESCE({}, ''), {CHANNEL_CHARS})", value(ch)),
        None => c.channel(""),
    };
    let mut out = vec![(
        OPEN_CHANNEL.to_string(),
        format!(
            "ADD COLUMN {OPEN_CHANNEL} VARCHAR({CHANNEL_CHARS}) AS (CASE WHEN {open} THEN \
             {channel} END) VIRTUAL"
        ),
    )];
    if let Some(k) = &c.ordering_key {
        // A number, a date, a time: its text is short.
        let width = c.max_len_of(k).unwrap_or(64).clamp(1, MAX_KEY_CHARS);
        out.push((
            OPEN_KEY.to_string(),
            format!(
                "ADD COLUMN {OPEN_KEY} VARCHAR({width}) AS (CASE WHEN {open} THEN {} END) VIRTUAL",
                value(k)
            ),
        ));
    }
    out
}

/// The indexes on the virtual columns: (name, SQL form, statement).
pub fn open_indexes(db: &Db) -> Vec<(String, String, String)> {
    let (t, c) = (db.table(), db.cols());
    let id = &c.id;
    let (name, sql) = db.object("open_idx");
    let mut out = vec![(
        name,
        sql.clone(),
        format!("CREATE INDEX {sql} ON {t} ({OPEN_CHANNEL}, {id})"),
    )];
    if c.ordering_key.is_some() {
        let (name, sql) = db.object("open_key_idx");
        out.push((
            name,
            sql.clone(),
            format!("CREATE INDEX {sql} ON {t} ({OPEN_KEY}, {id})"),
        ));
    }
    out
}
