//! MySQL/MariaDB's schema: the relay's own table and its migrations, the lease table, and
//! what `migrate --adopt` adds to a mapped table (the virtual columns of `open_index.rs` and
//! their indexes). MySQL has no `CREATE INDEX IF NOT EXISTS` and its DDL is not
//! transactional: migrations take a named lock, and each step that changes indexes or
//! columns looks at the live table first, so a step interrupted half-way is completed by the
//! next run.

use sqlx::{Executor, Row};

use super::MySql;
use super::open_index::{MAX_KEY_CHARS, OPEN_CHANNEL, OPEN_KEY, open_columns_ddl, open_indexes};
use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::schema;
use crate::store::schema::{ClaimSupport, ColumnTypes, Conn, Done, SchemaSql};
use crate::store::sql::Sql;

/// The named lock migrations take, and how long an instance waits for it.
const MIGRATE_LOCK: &str = "SELECT GET_LOCK('outbox_relay_migrate', 60)";

impl SchemaSql for MySql {
    fn lock<'a>(&'a self, conn: &'a mut Conn) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let got: i64 = sqlx::query_scalar(MIGRATE_LOCK)
                .fetch_one(&mut **conn)
                .await?;
            if got != 1 {
                anyhow::bail!("another instance held the migration lock for 60s");
            }
            Ok(())
        })
    }

    fn unlock<'a>(&'a self, conn: &'a mut Conn, _ok: bool) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let _ = conn
                .execute("SELECT RELEASE_LOCK('outbox_relay_migrate')")
                .await;
            Ok(())
        })
    }

    /// Version 1; every later version is done in code ([`SchemaSql::code_step`]), which
    /// looks at the live table first.
    fn steps(&self, t: &str, version: i64) -> Vec<String> {
        match version {
            1 => schema_v1(t),
            _ => Vec::new(),
        }
    }

    fn code_step<'a>(&'a self, conn: &'a mut Conn, table: &'a str, version: i64) -> Done<'a> {
        Box::pin(async move {
            match version {
                2 => add_index(conn, table, "channel_idx", "channel, id").await,
                3 => convert_timestamps(conn, table).await,
                5 => add_open_columns(conn, table).await,
                6 => add_index(conn, table, "failed_idx", "status, id").await,
                8 | 9 => slim_indexes(conn, table).await,
                12 => add_trace_columns(conn, table).await,
                _ => Ok(()),
            }
        })
    }

    fn lease_table(&self) -> String {
        schema::lease_table(
            "VARCHAR(191) NOT NULL",
            "VARCHAR(255)",
            "TIMESTAMP(6)",
            " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        )
    }

    fn table_exists(&self, table: &str) -> Sql {
        let mut q = Sql::new(
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = (",
        );
        q.text(table).push(")");
        q
    }

    /// A table's name is case-sensitive unless the server stores names in lower case
    /// (`lower_case_table_names`), as the server resolves it.
    fn live_columns(&self, table: &str) -> Sql {
        let mut q = Sql::new(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, \
             CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED), IS_NULLABLE, COLLATION_NAME, \
             CHARACTER_SET_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = \
             IF(@@lower_case_table_names = 0, ",
        );
        q.text(table)
            .push(", LOWER(")
            .text(table)
            .push(")) ORDER BY ORDINAL_POSITION");
        q
    }

    fn table_names(&self) -> Sql {
        Sql::new("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()")
    }

    fn object_exists(&self, table: &str, name: &str, _trigger: bool) -> Sql {
        let mut q = Sql::new(
            "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE \
             TABLE_SCHEMA = DATABASE() AND TABLE_NAME = IF(@@lower_case_table_names = 0, ",
        );
        q.text(table)
            .push(", LOWER(")
            .text(table)
            .push(")) AND INDEX_NAME = ")
            .text(name);
        q
    }

    /// The ordering key of unfinished rows is indexed in a virtual column (`open_index.rs`).
    fn max_key_chars(&self) -> Option<i64> {
        Some(MAX_KEY_CHARS)
    }

    /// DDL commits at once here: `migrate --adopt` undoes each step that ran.
    fn transactional_ddl(&self) -> bool {
        false
    }

    fn drop_index(&self, table: &str, index: &str) -> String {
        format!("DROP INDEX {index} ON {table}")
    }

    fn column_types(&self) -> ColumnTypes {
        ColumnTypes {
            claimer: "VARCHAR(255) NULL",
            token: "VARCHAR(64) NULL",
            time: "TIMESTAMP(6) NULL DEFAULT NULL",
            attempts: "INT NOT NULL DEFAULT 0",
        }
    }

    fn claim_support(&self, db: &Db) -> ClaimSupport {
        ClaimSupport {
            columns: open_columns_ddl(db),
            indexes: open_indexes(db),
        }
    }
}

/// Versions 2 and 6: the index `<table>_<name>` on `columns`, unless it exists (MariaDB has
/// `ADD INDEX IF NOT EXISTS`; MySQL 8 does not, so the live table is asked).
///
/// Version 2: claims take each channel's budget with its own pick, which walks this index
/// instead of every due row of every channel. Version 6: the console pages through FAILED
/// rows newest first by keyset on `id` through this index.
async fn add_index(conn: &mut Conn, table: &str, name: &str, columns: &str) -> anyhow::Result<()> {
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.STATISTICS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = ?",
    )
    .bind(table.to_string())
    .bind(format!("{table}_{name}"))
    .fetch_one(&mut **conn)
    .await?;
    if exists == 0 {
        conn.execute(sqlx::AssertSqlSafe(format!(
            "CREATE INDEX {table}_{name} ON {table} ({columns})"
        )))
        .await?;
    }
    Ok(())
}

/// Schema version 1. MySQL has no `CREATE INDEX IF NOT EXISTS`, so indexes are inline.
fn schema_v1(t: &str) -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                channel VARCHAR(191) NOT NULL,
                recipient TEXT NULL,
                payload JSON NOT NULL,
                ordering_key VARCHAR(191) NULL,
                status VARCHAR(16) NOT NULL DEFAULT 'PENDING',
                attempts INT NOT NULL DEFAULT 0,
                next_attempt_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                claimed_by VARCHAR(255) NULL,
                claim_token VARCHAR(64) NULL,
                claimed_until TIMESTAMP(6) NULL DEFAULT NULL,
                last_error TEXT NULL,
                created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                sent_at TIMESTAMP(6) NULL DEFAULT NULL,
                KEY {t}_due_idx (status, next_attempt_at),
                KEY {t}_ordering_idx (ordering_key, id),
                KEY {t}_status_idx (status, updated_at),
                KEY {t}_age_idx (status, created_at),
                CONSTRAINT {t}_status_chk CHECK (status IN ('PENDING', 'RETRY', 'SUCCESS', 'FAILED'))
            ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        ),
        MySql.lease_table(),
    ]
}

/// Each time column's definition as `TIMESTAMP(6)`. Every one has an explicit NULL/NOT NULL
/// and DEFAULT, so the server's `explicit_defaults_for_timestamp` setting cannot add an
/// `ON UPDATE CURRENT_TIMESTAMP` behind our back.
const TIMESTAMP_COLUMNS: [(&str, &str); 5] = [
    (
        "next_attempt_at",
        "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
    ),
    ("claimed_until", "TIMESTAMP(6) NULL DEFAULT NULL"),
    (
        "created_at",
        "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
    ),
    (
        "updated_at",
        "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
    ),
    ("sent_at", "TIMESTAMP(6) NULL DEFAULT NULL"),
];

/// Schema version 3: converts the `DATETIME(6)` columns of a version-1 table (and of the lease
/// table) to `TIMESTAMP(6)`, leaving columns that already are TIMESTAMP alone.
///
/// Which zone were the stored wall-clock values written in? The relay wrote its own (claims,
/// retries, results) at `+00:00`; the application's DEFAULTs were written in its sessions'
/// zone, normally the server's. The conversion reads them in whichever of the two is further
/// east: a value is then never taken for later than it was meant, so no row waits longer than
/// it should (some retries and claims may come due early, which is safe: claims are fenced).
/// Values outside TIMESTAMP's range (after 2038-01-19) would fail the conversion; the relay
/// never writes such values.
async fn convert_timestamps(conn: &mut Conn, table: &str) -> anyhow::Result<()> {
    let kinds = sqlx::query(
        "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, 'outbox_relay_lease')",
    )
    .bind(table.to_string())
    .fetch_all(&mut **conn)
    .await?;
    let is_datetime = |t: &str, c: &str| {
        kinds.iter().any(|r| {
            r.try_get::<String, _>(0)
                .is_ok_and(|x| x.eq_ignore_ascii_case(t))
                && r.try_get::<String, _>(1)
                    .is_ok_and(|x| x.eq_ignore_ascii_case(c))
                && r.try_get::<String, _>(2)
                    .is_ok_and(|x| x.eq_ignore_ascii_case("datetime"))
        })
    };
    let mut changes: Vec<String> = TIMESTAMP_COLUMNS
        .iter()
        .filter(|(c, _)| is_datetime(table, c))
        .map(|(c, def)| format!("ALTER TABLE {table} MODIFY {c} {def}"))
        .collect();
    if is_datetime("outbox_relay_lease", "lease_until") {
        changes.push(
            "ALTER TABLE outbox_relay_lease MODIFY lease_until TIMESTAMP(6) NULL DEFAULT NULL"
                .to_string(),
        );
    }
    if changes.is_empty() {
        return Ok(());
    }
    // The server's offset from UTC now, in minutes (its global zone: what application
    // sessions use unless they set their own).
    let offset: i64 = sqlx::query(
        "SELECT CAST(TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(),
            CONVERT_TZ(UTC_TIMESTAMP(), '+00:00', @@global.time_zone)) AS SIGNED)",
    )
    .fetch_one(&mut **conn)
    .await?
    .try_get::<Option<i64>, _>(0)?
    .unwrap_or(0);
    let east = offset.max(0);
    let zone = format!("+{:02}:{:02}", east / 60, east % 60);
    tracing::info!(table, read_as = %zone, "converting DATETIME columns to TIMESTAMP");
    conn.execute(sqlx::AssertSqlSafe(format!(
        "SET SESSION time_zone = '{zone}'"
    )))
    .await?;
    let mut result = Ok(());
    for change in changes {
        if let Err(e) = conn.execute(sqlx::AssertSqlSafe(change)).await {
            result = Err(e.into());
            break;
        }
    }
    // The pool's sessions run at UTC; give the connection back as it was.
    conn.execute("SET SESSION time_zone = '+00:00'").await?;
    result
}

/// Schema version 5: the channel and ordering key of unfinished rows as virtual columns
/// (NULL once a row is SUCCESS or FAILED, so finished rows leave the index), and one index
/// `(open_channel, id)` and one `(open_key, id)`: MySQL has no partial indexes, and without
/// these a claim walked every finished row of its channel (measured on MariaDB 10.11 with
/// 200,000 SUCCESS rows: 200,004 index reads per claim before, 4 after). Virtual columns
/// take no storage and need no value from the application's INSERTs (those that name their
/// columns; an `INSERT ... VALUES` without a column list would now need to name them).
/// Building the indexes reads the table once.
async fn add_open_columns(conn: &mut Conn, table: &str) -> anyhow::Result<()> {
    let present: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.COLUMNS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME IN ('open_channel', 'open_key')",
    )
    .bind(table.to_string())
    .fetch_one(&mut **conn)
    .await?;
    if present < 2 {
        let open = "status IN ('PENDING', 'RETRY')";
        let mut adds = Vec::new();
        for (col, of) in [(OPEN_CHANNEL, "channel"), (OPEN_KEY, "ordering_key")] {
            if !column_exists(conn, table, col).await? {
                adds.push(format!(
                    "ADD COLUMN {col} VARCHAR(191) AS (CASE WHEN {open} THEN {of} END) VIRTUAL"
                ));
            }
        }
        conn.execute(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} {}",
            adds.join(", ")
        )))
        .await?;
    }
    for (index, col) in [("open_idx", "open_channel"), ("open_key_idx", "open_key")] {
        let exists: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.STATISTICS
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = ?",
        )
        .bind(table.to_string())
        .bind(format!("{table}_{index}"))
        .fetch_one(&mut **conn)
        .await?;
        if exists == 0 {
            conn.execute(sqlx::AssertSqlSafe(format!(
                "CREATE INDEX {table}_{index} ON {table} ({col}, id)"
            )))
            .await?;
        }
    }
    Ok(())
}

/// Schema version 12: the writer's W3C trace context (docs/tracing.md), NULLable (an instant
/// change on MariaDB 10.3+ and MySQL 8.0.29+). As wide as W3C makes them: a version-00
/// `traceparent` is 55 characters, and 512 of `tracestate` are what W3C asks to propagate.
async fn add_trace_columns(conn: &mut Conn, table: &str) -> anyhow::Result<()> {
    let mut adds = Vec::new();
    for (column, ty) in [
        ("traceparent", "VARCHAR(55)"),
        ("tracestate", "VARCHAR(512)"),
    ] {
        if !column_exists(conn, table, column).await? {
            adds.push(format!("ADD COLUMN {column} {ty} NULL"));
        }
    }
    if !adds.is_empty() {
        let alter = format!("ALTER TABLE {table} {}", adds.join(", "));
        conn.execute(sqlx::AssertSqlSafe(alter)).await?;
    }
    Ok(())
}

/// Whether `table` has a column named `column`.
async fn column_exists(conn: &mut Conn, table: &str, column: &str) -> anyhow::Result<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.COLUMNS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
    )
    .bind(table.to_string())
    .bind(column.to_string())
    .fetch_one(&mut **conn)
    .await?;
    Ok(n > 0)
}

/// Schema version 8: fewer secondary indexes change when a row is delivered. On InnoDB each
/// one that does costs a delete-marked entry, a new entry and, later, a purge: with the five
/// of version 7 a delivered row's result took 19-29 µs of the server's time, with these
/// changes 13-16 µs (docs/design.md, "MySQL indexes").
///
/// - `due_idx (status, next_attempt_at)` goes: claims walk `open_idx` since version 5, and
///   every other status filter has `status_idx`.
/// - `age_idx (status, created_at)` goes: `open_idx` gains `created_at`, so the age of the
///   oldest unfinished row is read from that index alone (its entries change on delivery
///   anyway, so the extra column costs no extra write).
/// - `failed_idx` becomes `(failed_flag, id)`, on a virtual column that is 1 for FAILED rows
///   and NULL otherwise: a delivery leaves it NULL, so nothing is written to that index.
/// - Version 9 (the same function, run again): `open_idx` also gains `next_attempt_at`, so an
///   idle read finds out whether any unfinished row is due from that index alone
///   (`mysql_claim::anything_due`), instead of reading every waiting row to compare it. Only a
///   retry's result changes that column of a row still unfinished, so deliveries write
///   nothing more.
///
/// Whatever is still to do is done by one `ALTER TABLE` (InnoDB builds indexes online), so a
/// step interrupted half-way is completed by the next run.
async fn slim_indexes(conn: &mut Conn, table: &str) -> anyhow::Result<()> {
    let columns = sqlx::query(
        "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(table.to_string())
    .fetch_all(&mut **conn)
    .await?
    .iter()
    .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?)))
    .collect::<anyhow::Result<Vec<(String, String)>>>()?;
    let has = |index: &str, column: Option<&str>| {
        let name = format!("{table}_{index}");
        columns.iter().any(|(i, c)| {
            i.eq_ignore_ascii_case(&name) && column.is_none_or(|col| c.eq_ignore_ascii_case(col))
        })
    };
    let mut clauses = Vec::new();
    for gone in ["due_idx", "age_idx"] {
        if has(gone, None) {
            clauses.push(format!("DROP INDEX {table}_{gone}"));
        }
    }
    if !column_exists(conn, table, "failed_flag").await? {
        clauses.push(
            "ADD COLUMN failed_flag TINYINT AS (CASE WHEN status = 'FAILED' THEN 1 END) VIRTUAL"
                .to_string(),
        );
    }
    for (index, wanted, columns) in [
        ("failed_idx", "failed_flag", "failed_flag, id"),
        (
            "open_idx",
            "next_attempt_at",
            "open_channel, id, created_at, next_attempt_at",
        ),
    ] {
        if !has(index, Some(wanted)) {
            if has(index, None) {
                clauses.push(format!("DROP INDEX {table}_{index}"));
            }
            clauses.push(format!("ADD INDEX {table}_{index} ({columns})"));
        }
    }
    if clauses.is_empty() {
        return Ok(());
    }
    conn.execute(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {table} {}",
        clauses.join(", ")
    )))
    .await?;
    Ok(())
}
