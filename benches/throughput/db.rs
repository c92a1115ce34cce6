//! The bench's tables: filled with a bulk insert, as a backlog builds up, and dropped after
//! each run; the row counts and PostgreSQL's commit counter.

use super::*;

pub(crate) fn payload(n: usize) -> String {
    format!(r#"{{"event":"order.created","order_id":{n},"amount":1250,"currency":"KRW"}}"#)
}

/// What the rows of a backlog look like.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rows {
    /// Distinct ordering keys, round-robin over the rows (0: no row has one).
    pub(crate) keys: usize,
    /// With `keys`: every other row has no key (row `k` odd), and the keyed rows between them
    /// take the keys round-robin: unkeyed rows mixed into a keyed backlog.
    pub(crate) mixed: bool,
    /// Payloads padded to this many bytes (0, or less than [`payload`]'s: as it is, about 75).
    /// Push messages and template parameters are a few hundred bytes to a few KiB.
    pub(crate) payload_bytes: usize,
    /// With `keys` (not `mixed`): each key's rows one after another (`n / keys` a key), as
    /// an application writes a key's events in one go, instead of round-robin.
    pub(crate) key_by_key: bool,
}

/// [`payload`] padded with a `note` of filler text to `bytes` (when longer).
fn payload_of(n: usize, bytes: usize) -> String {
    let short = payload(n);
    let pad = bytes.saturating_sub(short.len() + r#","note":"""#.len());
    if bytes <= short.len() || pad == 0 {
        return short;
    }
    let filler: String = "lorem ipsum ".chars().cycle().take(pad).collect();
    format!(r#"{},"note":"{filler}"}}"#, &short[..short.len() - 1])
}

/// Runs one statement of our own on `pool` (not counted by the store).
pub(crate) async fn exec(pool: &sqlx::AnyPool, sql: String) -> anyhow::Result<u64> {
    Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await?
        .rows_affected())
}

pub(crate) async fn scalar(pool: &sqlx::AnyPool, sql: String) -> anyhow::Result<i64> {
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// Creates (migrates) `table` and fills it with `n` PENDING webhook rows, in multi-row INSERTs;
/// with `keys` > 0, row k gets `ordering_key` `k{k % keys}` (round-robin, so consecutive rows
/// belong to different keys); with `analyze`, then refreshes the planner's statistics, as
/// autovacuum would soon do.
pub(crate) async fn prepare_table(
    url: &str,
    table: &str,
    n: usize,
    analyze: bool,
    rows: Rows,
) -> anyhow::Result<()> {
    let setup = SqlStore::connect(url, table, 2, Duration::from_secs(5)).await?;
    setup.migrate().await.context("migrate")?;
    fill(&setup, table, n, rows).await?;
    if analyze {
        let sql = match setup.dialect() {
            Dialect::MySql { .. } => format!("ANALYZE TABLE {table}"),
            _ => format!("ANALYZE {table}"),
        };
        // MySQL answers ANALYZE TABLE with a result set.
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(setup.pool())
            .await
            .context("analyze")?;
    }
    // Closing ends the server sessions, which flushes their statistics (PostgreSQL).
    setup.pool().close().await;
    Ok(())
}

/// Inserts `n` PENDING webhook rows shaped as `rows` into `table` in multi-row INSERTs.
pub(crate) async fn fill(
    store: &SqlStore,
    table: &str,
    n: usize,
    rows: Rows,
) -> anyhow::Result<()> {
    for sql in inserts(table, n, rows) {
        exec(store.pool(), sql).await.context("bulk insert")?;
    }
    Ok(())
}

/// Inserts `n` waiting rows like [`fill`] (no keys), in one transaction: they appear all at
/// once.
pub(crate) async fn fill_at_once(store: &SqlStore, table: &str, n: usize) -> anyhow::Result<()> {
    let mut tx = store.pool().begin().await.context("begin")?;
    for sql in inserts(table, n, Rows::default()) {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .context("bulk insert")?;
    }
    tx.commit().await.context("commit")?;
    Ok(())
}

/// The INSERT statements for `n` rows of channel `hook`, [`INSERT_CHUNK`] rows each; with
/// `rows.keys` above zero, row `k` has ordering key `k{k % keys}` (mixed: see [`Rows::mixed`];
/// key by key: [`Rows::key_by_key`]).
fn inserts(table: &str, n: usize, rows: Rows) -> Vec<String> {
    let Rows {
        keys,
        mixed,
        payload_bytes,
        key_by_key,
    } = rows;
    let per_key = n.div_ceil(keys.max(1));
    (0..n)
        .step_by(INSERT_CHUNK)
        .map(|i| {
            let values: Vec<String> = (i..(i + INSERT_CHUNK).min(n))
                .map(|k| {
                    let key = match (keys, mixed) {
                        (0, _) => "NULL".to_string(),
                        (_, true) if k % 2 == 1 => "NULL".to_string(),
                        (_, true) => format!("'k{}'", (k / 2) % keys),
                        (_, false) if key_by_key => format!("'k{}'", k / per_key),
                        (_, false) => format!("'k{}'", k % keys),
                    };
                    format!("('hook', '{}', {key})", payload_of(k, payload_bytes))
                })
                .collect();
            format!(
                "INSERT INTO {table} (channel, payload, ordering_key) VALUES {}",
                values.join(", ")
            )
        })
        .collect()
}

/// Runs `run` on a fresh table name (`prefix` and a unique suffix) and drops the table
/// afterwards, whatever `run` returned.
pub(crate) async fn on_own_table<T, F>(db: Db, url: &str, prefix: &str, run: F) -> anyhow::Result<T>
where
    F: AsyncFnOnce(&str) -> anyhow::Result<T>,
{
    let table = unique_table(prefix);
    let result = run(&table).await;
    drop_table(
        url,
        &table,
        (db == Db::Postgres).then_some(Dialect::Postgres),
    )
    .await;
    result
}

/// Drops a bench table and what `migrate` created with it (best effort).
pub(crate) async fn drop_table(url: &str, table: &str, dialect: Option<Dialect>) {
    let Ok(store) = SqlStore::connect(url, table, 1, Duration::from_secs(5)).await else {
        eprintln!("warning: could not connect to drop {table}");
        return;
    };
    let pool = store.pool();
    if exec(pool, format!("DROP TABLE IF EXISTS {table}"))
        .await
        .is_err()
    {
        eprintln!("warning: could not drop {table}");
    }
    if dialect == Some(Dialect::Postgres) {
        let _ = exec(pool, format!("DROP FUNCTION IF EXISTS {table}_notify()")).await;
    }
    let _ = exec(
        pool,
        format!("DELETE FROM outbox_relay_schema WHERE target = '{table}'"),
    )
    .await;
    pool.close().await;
}

/// `pg_stat_database.xact_commit` for the URL's database, read on a fresh session.
pub(crate) async fn pg_xact_commit(url: &str) -> Option<i64> {
    let mut conn = sqlx::PgConnection::connect(url).await.ok()?;
    let v: i64 = sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut conn)
    .await
    .ok()?;
    let _ = conn.close().await;
    Some(v)
}

/// Reads xact_commit after giving closed sessions a moment to exit and flush their stats.
pub(crate) async fn settled_xacts(db: Db, url: &str) -> Option<i64> {
    if db != Db::Postgres {
        return None;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    pg_xact_commit(url).await
}

/// Counts by status, for error messages.
pub(crate) async fn status_counts(pool: &sqlx::AnyPool, table: &str) -> String {
    match sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT status, COUNT(*) FROM {table} GROUP BY status ORDER BY status"
    )))
    .fetch_all(pool)
    .await
    {
        Ok(rows) => rows
            .iter()
            .map(|r| {
                format!(
                    "{}={}",
                    r.try_get::<String, _>(0).unwrap_or_default(),
                    r.try_get::<i64, _>(1).unwrap_or(-1)
                )
            })
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("(status query failed: {e})"),
    }
}
