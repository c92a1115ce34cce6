//! Versioned, idempotent schema migrations, keyed by table name in `outbox_relay_schema`.
//!
//! Several instances may start (and migrate) at once: PostgreSQL serialises them with an
//! advisory lock inside one transaction (its DDL is transactional), MySQL with `GET_LOCK` on
//! one connection; SQLite has a single writer. Every step is `IF NOT EXISTS`, so a step
//! interrupted half-way (MySQL DDL is not transactional) is simply run again.

use sqlx::{Any, AnyPool, Executor, Row};

use super::builder::Sql;
use super::{Dialect, mysql, postgres, sqlite};

/// The newest schema version this build knows.
pub const LATEST: i64 = 10;

fn steps(dialect: Dialect, table: &str, version: i64) -> Vec<String> {
    match (dialect, version) {
        (Dialect::Postgres, 1) => postgres::schema_v1(table),
        (Dialect::MySql { .. }, 1) => mysql::schema_v1(table),
        (Dialect::Sqlite, 1) => sqlite::schema_v1(table),
        (_, 2) => vec![channel_index(dialect, table)],
        // Version 4 (PostgreSQL): leave room in each page, so that claims (which change no
        // indexed column) are HOT updates that write no index entries. Applies to pages
        // written from now on; nothing is rewritten.
        (Dialect::Postgres, 4) => vec![format!("ALTER TABLE {table} SET (fillfactor = 85)")],
        (_, 6) => vec![failed_index(dialect, table)],
        // Version 7 (PostgreSQL): room for a claimed copy of every row of a page. A claim
        // takes rows in id order, so it updates most rows of a page in one statement, and a
        // HOT update needs room for the new version on the same page: at 85% only the first
        // few rows of each page fit (10-20% of claims were HOT, measured with the bench), and
        // every other claimed row wrote an entry into each of the table's five indexes. A
        // claimed copy is the row plus about 60 bytes of claim columns, so 40% leaves room
        // for all of them for payloads from about 80 bytes up (docs/design.md, "HOT claims").
        // Pages written from now on; nothing is rewritten.
        (Dialect::Postgres, 7) => vec![format!("ALTER TABLE {table} SET (fillfactor = 40)")],
        // Version 10 (SQLite): the unfinished rows by their next attempt, so that an idle
        // read tells in one seek whether any is due, instead of reading every waiting row
        // (see `sqlite::anything_due`).
        (Dialect::Sqlite, 10) => vec![sqlite::next_attempt_index(table)],
        _ => Vec::new(),
    }
}

/// Version 3 (MySQL/MariaDB only, in code): time columns become TIMESTAMP, see
/// `mysql::convert_timestamps`. Version 8 (MySQL/MariaDB only, in code): fewer indexes change
/// when a row is delivered, see `mysql::slim_indexes`. Version 9 (MySQL/MariaDB only, in
/// code): `open_idx` gains `next_attempt_at`, so an idle read tells from that index alone
/// whether any unfinished row is due (see `mysql::slim_indexes`).
///
/// Version 2: claims take each channel's budget with its own pick (see store/claim.rs), which
/// walks this index instead of every due row of every channel.
fn channel_index(dialect: Dialect, t: &str) -> String {
    match dialect {
        Dialect::MySql { mariadb: true, .. } => {
            format!("ALTER TABLE {t} ADD INDEX IF NOT EXISTS {t}_channel_idx (channel, id)")
        }
        Dialect::MySql { .. } => format!("CREATE INDEX {t}_channel_idx ON {t} (channel, id)"),
        _ => format!(
            "CREATE INDEX IF NOT EXISTS {t}_channel_due_idx ON {t} (channel, id)
             WHERE status IN ('PENDING', 'RETRY')"
        ),
    }
}

/// Version 6: the console pages through FAILED rows newest first by keyset on `id`; this index
/// makes each page a walk of 50 entries whatever the size of the table (otherwise the page
/// sorts every FAILED row, or walks the primary key through every delivered one). On
/// PostgreSQL and SQLite it is partial, so rows that never fail cost it nothing.
fn failed_index(dialect: Dialect, t: &str) -> String {
    match dialect {
        Dialect::MySql { mariadb: true, .. } => {
            format!("ALTER TABLE {t} ADD INDEX IF NOT EXISTS {t}_failed_idx (status, id)")
        }
        Dialect::MySql { .. } => format!("CREATE INDEX {t}_failed_idx ON {t} (status, id)"),
        _ => {
            format!("CREATE INDEX IF NOT EXISTS {t}_failed_idx ON {t} (id) WHERE status = 'FAILED'")
        }
    }
}

/// Beside a mapped table (docs/adopting-a-table.md): only the lease table. The table itself
/// is the application's; `migrate --adopt` adds the relay's columns to it, on request.
pub async fn lease_only(pool: &AnyPool, dialect: Dialect) -> anyhow::Result<()> {
    let ddl = match dialect {
        Dialect::Postgres => postgres::lease_table(),
        Dialect::MySql { .. } => mysql::lease_table(),
        Dialect::Sqlite => sqlite::lease_table(),
    };
    pool.execute(sqlx::AssertSqlSafe(ddl)).await?;
    Ok(())
}

/// Brings `table` to [`LATEST`]. Returns the versions applied.
pub async fn run(pool: &AnyPool, dialect: Dialect, table: &str) -> anyhow::Result<Vec<i64>> {
    let mut conn = pool.acquire().await?;
    match dialect {
        Dialect::Postgres => {
            conn.execute("BEGIN").await?;
            let result = async {
                conn.execute("SELECT pg_advisory_xact_lock(7424319)")
                    .await?;
                apply(&mut conn, dialect, table).await
            }
            .await;
            match result {
                Ok(v) => {
                    conn.execute("COMMIT").await?;
                    Ok(v)
                }
                Err(e) => {
                    let _ = conn.execute("ROLLBACK").await;
                    Err(e)
                }
            }
        }
        Dialect::MySql { .. } => {
            let got: i64 = sqlx::query_scalar("SELECT GET_LOCK('outbox_relay_migrate', 60)")
                .fetch_one(&mut *conn)
                .await?;
            if got != 1 {
                anyhow::bail!("another instance held the migration lock for 60s");
            }
            let result = apply(&mut conn, dialect, table).await;
            let _ = conn
                .execute("SELECT RELEASE_LOCK('outbox_relay_migrate')")
                .await;
            result
        }
        Dialect::Sqlite => apply(&mut conn, dialect, table).await,
    }
}

async fn apply(
    conn: &mut sqlx::pool::PoolConnection<Any>,
    dialect: Dialect,
    table: &str,
) -> anyhow::Result<Vec<i64>> {
    conn.execute(
        "CREATE TABLE IF NOT EXISTS outbox_relay_schema (
            target VARCHAR(191) NOT NULL PRIMARY KEY,
            version BIGINT NOT NULL
        )",
    )
    .await?;
    let mut q = Sql::new("SELECT version FROM outbox_relay_schema WHERE target = ");
    q.text(table);
    let current: i64 = q
        .finalized(dialect)
        .fetch_optional(&mut **conn)
        .await?
        .map(|r| r.try_get::<i64, _>(0))
        .transpose()?
        .unwrap_or(0);
    // A table dropped by hand (a developer starting over) leaves its version behind, and
    // the relay would call a missing table up to date and fail every claim: build it again.
    let current = if current > 0 && !table_exists(conn, dialect, table).await? {
        tracing::warn!(
            table,
            recorded_version = current,
            "the table is missing although its schema version is recorded; creating it"
        );
        let mut q = Sql::new("DELETE FROM outbox_relay_schema WHERE target = ");
        q.text(table);
        q.finalized(dialect).execute(&mut **conn).await?;
        0
    } else {
        current
    };
    let mut applied = Vec::new();
    for version in (current + 1)..=LATEST {
        for step in steps(dialect, table, version) {
            conn.execute(sqlx::AssertSqlSafe(step)).await?;
        }
        match (dialect, version) {
            (Dialect::MySql { .. }, 3) => mysql::convert_timestamps(conn, table).await?,
            (Dialect::MySql { .. }, 5) => mysql::add_open_columns(conn, table).await?,
            (Dialect::MySql { .. }, 8 | 9) => mysql::slim_indexes(conn, table).await?,
            _ => {}
        }
        let q = if current == 0 && version == 1 {
            let mut q = Sql::new("INSERT INTO outbox_relay_schema (target, version) VALUES (");
            q.text(table).push(", ").int(version).push(")");
            q
        } else {
            let mut q = Sql::new("UPDATE outbox_relay_schema SET version = ");
            q.int(version).push(" WHERE target = ").text(table);
            q
        };
        q.finalized(dialect).execute(&mut **conn).await?;
        applied.push(version);
    }
    Ok(applied)
}

/// Whether `table` exists (in the connection's schema or database).
async fn table_exists(
    conn: &mut sqlx::pool::PoolConnection<Any>,
    dialect: Dialect,
    table: &str,
) -> anyhow::Result<bool> {
    let mut q = Sql::new(match dialect {
        Dialect::Postgres => "SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass(",
        Dialect::MySql { .. } => {
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ("
        }
        Dialect::Sqlite => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = (",
    });
    q.text(table).push(")");
    if dialect == Dialect::Sqlite {
        // SQLite's names are not case-sensitive.
        q.push(" COLLATE NOCASE");
    }
    let n: i64 = q
        .finalized(dialect)
        .fetch_one(&mut **conn)
        .await?
        .try_get(0)?;
    Ok(n > 0)
}
