//! [`SqlStore`]: the outbox over sqlx's `Any` driver. One code path for the three
//! databases; what differs is the SQL text ([`Dialect`]) and the shape of the claim:
//! PostgreSQL and SQLite claim with one `UPDATE ... RETURNING`, MySQL/MariaDB (no UPDATE
//! RETURNING) with `SELECT ... FOR UPDATE SKIP LOCKED` then `UPDATE` in one transaction.
//!
//! Timestamps never cross the wire as values (the `Any` driver cannot decode them): every
//! comparison uses the database clock, and ages come back as integer milliseconds.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::any::{AnyArguments, AnyPoolOptions};
use sqlx::query::Query;
use sqlx::{Any, AnyPool, Executor, Row};

use super::builder::Sql;
use super::cursor::Cursors;
use super::window::Windows;
use super::{
    ClaimRequest, ClaimedRow, Columns, Completion, Dialect, NewRow, Probe, Queue, migrate, mysql,
};
use crate::BoxFuture;

/// Longest a statement waits for a row or table lock before failing (and being retried).
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Longest a statement may run on the server (migrations of large tables included).
const STATEMENT_TIME: Duration = Duration::from_secs(300);

/// The outbox on a SQL database.
pub struct SqlStore {
    pub(super) pool: AnyPool,
    pub(super) dialect: Dialect,
    /// The outbox table's name (validated as an identifier).
    pub(super) table: String,
    /// The lease names whose row has been inserted (saves a statement per acquire). Per name:
    /// one store may serve several leases, and each needs its own row.
    pub(super) lease_rows_ready: Mutex<HashSet<String>>,
    /// SQL statements built and sent by this store (BEGIN/COMMIT not counted): what the
    /// benchmark divides by delivered rows.
    statements: AtomicU64,
    /// Where each channel's claims start (see `cursor.rs`).
    pub(super) cursors: Cursors,
    /// Which channels' oldest picks read only a window (see `window.rs`).
    pub(super) windows: Windows,
    /// The table's column names and status values (the relay's own unless `[table]` maps an
    /// existing table).
    pub(super) cols: Columns,
    /// SQLite only: taken around the relay's own writes (claims and results), so that they
    /// queue here instead of colliding on the database's single write lock, where the loser
    /// sleeps in SQLite's busy handler for 1 ms or more (docs/design.md, "SQLite writers").
    pub(super) sqlite_writer: Option<tokio::sync::Mutex<()>>,
    /// SQLite only: when an idle read last read the picks themselves, not only the index of
    /// due times (see `sqlite::anything_due`).
    pub(super) full_read_at: Mutex<Option<std::time::Instant>>,
}

pub(super) type AnyQuery<'q> = Query<'q, Any, AnyArguments>;

/// The longest the direct attempt that names why no connection opened may take.
const WHY_ATTEMPT: Duration = Duration::from_secs(1);
/// A pooled connection idle for longer than this is pinged before it is used.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);
/// Connections the relay opens side by side before its loop starts (at most
/// `database.max_connections`): the loop's claim, the result writer, the lease or fence
/// and a spare for health and metrics. See [`SqlStore::warm`].
pub const WARM_CONNECTIONS: u32 = 4;

fn query(sql: String) -> AnyQuery<'static> {
    sqlx::query(sqlx::AssertSqlSafe(sql))
}

/// Splits the relay's own `synchronous=normal|full|extra` parameter (which sqlx does not know)
/// off a SQLite URL, and returns the URL without it and the `PRAGMA synchronous` value
/// (`NORMAL` when absent). Other URLs are returned unchanged.
fn take_sqlite_synchronous(url: &str) -> anyhow::Result<(String, &'static str)> {
    let mut sync = "NORMAL";
    let Some((base, query)) = url.split_once('?').filter(|_| url.starts_with("sqlite:")) else {
        return Ok((url.to_string(), sync));
    };
    let mut kept = Vec::new();
    for param in query.split('&') {
        match param.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("synchronous") => {
                sync = match value.to_ascii_lowercase().as_str() {
                    "normal" => "NORMAL",
                    "full" => "FULL",
                    "extra" => "EXTRA",
                    _ => anyhow::bail!(
                        "database.url: synchronous must be normal, full or extra, not {value:?}"
                    ),
                };
            }
            _ => kept.push(param),
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, sync))
}

impl SqlStore {
    /// Connects (without migrating), opening one connection. `table` must already be a
    /// validated identifier.
    pub async fn connect(
        url: &str,
        table: &str,
        max_connections: u32,
        connect_timeout: Duration,
    ) -> anyhow::Result<SqlStore> {
        SqlStore::connect_opening(url, table, max_connections, connect_timeout, 1).await
    }

    /// Connects (without migrating), opening up to `open` connections side by side before
    /// anything else (see [`SqlStore::warm`]; at least one must open). The relay opens
    /// [`WARM_CONNECTIONS`] here, before its migration runs, so that opening them costs one
    /// connection's time before the first claim, not two (docs/design.md, "Connections").
    pub async fn connect_opening(
        url: &str,
        table: &str,
        max_connections: u32,
        connect_timeout: Duration,
        open: u32,
    ) -> anyhow::Result<SqlStore> {
        sqlx::any::install_default_drivers();
        let (url, sqlite_sync) = take_sqlite_synchronous(url)?;
        let url = url.as_str();
        let mut dialect = Dialect::from_url(url)
            .ok_or_else(|| anyhow::anyhow!("unsupported database URL scheme"))?;
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        // A pooled connection is pinged before use only when it sat idle for a while: a ping
        // on every acquire was a round trip per statement (4% of the relay's CPU at full
        // speed). A connection that died in use fails its statement, which is retried as
        // transient (docs/design.md, "Failure model"); one idle across a database restart is
        // still caught by the ping.
        let options = AnyPoolOptions::new()
            .max_connections(if in_memory { 1 } else { max_connections })
            .acquire_timeout(connect_timeout)
            // A connection, once open, stays open (until it fails or reaches the pool's
            // maximum lifetime): opening one costs a TLS handshake and the server's session
            // start (see [`SqlStore::warm`]), which must not land on a claim after a quiet
            // spell.
            .idle_timeout(None)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for < PING_AFTER_IDLE {
                        return Ok(true);
                    }
                    Ok(sqlx::Connection::ping(conn).await.is_ok())
                })
            });
        // An in-memory SQLite database lives and dies with its one connection.
        let options = if in_memory {
            options.idle_timeout(None).max_lifetime(None)
        } else {
            options
        };
        // A relay paused inside a transaction (SIGSTOP, a stall) must not keep its locks for
        // as long as it is stopped: the server ends such a session after IDLE_TX_TIMEOUT.
        // (MySQL 8 has no such setting; only its claim and migrations use transactions.)
        // Every statement waits at most LOCK_WAIT for a lock and runs at most STATEMENT_TIME
        // on the server: a table locked by another session (a migration, a long transaction
        // of the application's) makes a claim fail and retry instead of hanging, so readiness
        // tells the truth and shutdown is never held up by the database.
        let options = match dialect {
            Dialect::MySql { .. } => options.after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    conn.execute(sqlx::AssertSqlSafe(format!(
                        "SET SESSION innodb_lock_wait_timeout = {lock}, lock_wait_timeout = {lock}",
                        lock = LOCK_WAIT.as_secs()
                    )))
                    .await?;
                    // MariaDB only; MySQL refuses the unknown variables, which is harmless
                    // (there, max_execution_time bounds SELECTs only).
                    let _ = conn
                        .execute("SET SESSION idle_transaction_timeout = 5")
                        .await;
                    let _ = conn
                        .execute(sqlx::AssertSqlSafe(format!(
                            "SET SESSION max_statement_time = {}",
                            STATEMENT_TIME.as_secs()
                        )))
                        .await;
                    Ok(())
                })
            }),
            Dialect::Postgres => options.after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(sqlx::AssertSqlSafe(format!(
                        "SET idle_in_transaction_session_timeout = '5s'; SET lock_timeout = '{}ms'; SET statement_timeout = '{}ms'",
                        LOCK_WAIT.as_millis(),
                        STATEMENT_TIME.as_millis()
                    )))
                    .await?;
                    // The relay's statements are short and run thousands of times; when the
                    // planner's estimate for one passes `jit_above_cost`, compiling it with LLVM
                    // costs far more than running it (10% of the machine's CPU in a profile of
                    // a 100,000-row drain, and 15% fewer rows/s). PostgreSQL before 11 has no
                    // JIT and refuses the setting, which is harmless.
                    let _ = conn.execute("SET jit = off").await;
                    // Prepared statements run their generic plan, planned once per connection
                    // (docs/design.md, "Generic plans"): left to choose, PostgreSQL planned
                    // the claim again at every execution, a quarter of its time on the
                    // server. Only when the session is at the default (`auto`): a
                    // `plan_cache_mode` set in the URL's `options`, or for the role or the
                    // database, is kept. PostgreSQL before 12 has no such setting and refuses
                    // the statement, which is harmless.
                    let _ = conn
                        .execute(
                            "SELECT set_config('plan_cache_mode', 'force_generic_plan', false) \
                             WHERE current_setting('plan_cache_mode') = 'auto'",
                        )
                        .await;
                    // No bitmap scans (docs/design.md, "No bitmap scans"): every read of the
                    // relay's is an ordered walk of an index with a `LIMIT`, or a lookup by
                    // key, and a bitmap scan reads every match before it returns the first.
                    // Planned on statistics older than a backlog (a table filled since its
                    // last ANALYZE), the newest pick read its channel's whole backlog that
                    // way at every claim. Only where the setting is at its default.
                    let _ = conn
                        .execute(
                            "SELECT set_config('enable_bitmapscan', 'off', false) \
                             FROM pg_settings WHERE name = 'enable_bitmapscan' \
                             AND source = 'default'",
                        )
                        .await;
                    Ok(())
                })
            }),
            // The relay's own commits (claims, results) wait for the WAL to reach the disk
            // only at checkpoints (docs/design.md, "SQLite durability"): 1.2x the rows/s.
            // A process crash loses nothing; a power loss or OS crash can roll back its last
            // commits, which only makes rows claimable or deliverable again (a duplicate,
            // never a loss). `?synchronous=full` in the URL waits on every commit.
            Dialect::Sqlite => {
                let pragma = format!("PRAGMA synchronous = {sqlite_sync}");
                options.after_connect(move |conn, _| {
                    let pragma = pragma.clone();
                    Box::pin(async move {
                        conn.execute(sqlx::AssertSqlSafe(pragma)).await?;
                        Ok(())
                    })
                })
            }
        };
        let pool = options.connect_lazy(url)?;
        open_side_by_side(&pool, open.max(1))
            .await
            .map_err(|e| match dialect {
                Dialect::Sqlite => sqlite_open_hint(e, url),
                _ => e,
            })?;
        match dialect {
            Dialect::MySql { .. } => {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&pool)
                    .await?;
                let (mariadb, skip_locked) = mysql::capabilities(&version);
                if !skip_locked {
                    tracing::warn!(
                        %version,
                        "server has no FOR UPDATE SKIP LOCKED; claims will wait on each other"
                    );
                }
                dialect = Dialect::MySql {
                    mariadb,
                    skip_locked,
                };
            }
            Dialect::Sqlite if !in_memory => {
                pool.execute("PRAGMA journal_mode=WAL").await?;
            }
            _ => {}
        }
        Ok(SqlStore {
            pool,
            dialect,
            table: table.to_string(),
            lease_rows_ready: Mutex::new(HashSet::new()),
            cursors: Cursors::default(),
            windows: Windows::default(),
            statements: AtomicU64::new(0),
            cols: Columns::default(),
            sqlite_writer: (dialect == Dialect::Sqlite).then(|| tokio::sync::Mutex::new(())),
            full_read_at: Mutex::new(None),
        })
    }

    /// Opens up to `n` connections side by side (at most the pool's maximum) and leaves
    /// them idle in the pool, so that the relay's first claims and result writes do
    /// not each wait for a connection of their own to be opened.
    ///
    /// Why it matters: a connection opened on demand puts its opening (a TLS handshake, the
    /// server's session start; docs/design.md, "Connections") on the claim or result write
    /// that asked for it.
    pub async fn warm(&self, n: u32) -> anyhow::Result<()> {
        open_side_by_side(&self.pool, n).await
    }

    /// The same store on a table mapped by `[table]` (see `columns.rs`).
    pub fn with_columns(mut self, cols: Columns) -> SqlStore {
        self.cols = cols.quoted_for(self.dialect);
        self
    }

    /// The table's mapping.
    pub fn columns(&self) -> &Columns {
        &self.cols
    }

    /// The pool, for tests and benchmarks that inspect the table directly.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// For tests: makes the next periodic full walk of the floors `period` away, as after a
    /// walk that took a twentieth of it (a walk past many rows waiting for later). Walks
    /// planned for this store's own retries still happen when they come due.
    #[doc(hidden)]
    pub fn hold_full_walks(&self, period: Duration) {
        self.cursors.hold_walks(period);
    }

    /// Statements sent so far (see the field).
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// A statement without values (those with values are built with [`Sql`]).
    pub(super) fn sql(&self, text: &str) -> AnyQuery<'static> {
        self.count_statement();
        query(self.dialect.finalize(text))
    }

    /// Waits for this store's turn to write (SQLite; see the field), or at once elsewhere.
    pub(super) async fn writing(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.sqlite_writer {
            Some(m) => Some(m.lock().await),
            None => None,
        }
    }

    pub(super) fn count_statement(&self) {
        self.statements.fetch_add(1, Ordering::Relaxed);
    }
}

/// The admin and housekeeping queries (the CLI's verbs, retention, the table gauges, readiness)
/// are plain methods: each has one caller, and none is a seam anything else implements.
impl SqlStore {
    /// Which database this is.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Creates or upgrades the tables (idempotent, safe to run from several instances).
    pub async fn migrate(&self) -> anyhow::Result<()> {
        if self.cols.mapped {
            return migrate::lease_only(&self.pool, self.dialect).await;
        }
        let applied = migrate::run(&self.pool, self.dialect, &self.table).await?;
        if applied.is_empty() {
            tracing::info!(table = %self.table, "schema is up to date");
        } else {
            tracing::info!(table = %self.table, ?applied, "schema migrated");
        }
        Ok(())
    }

    /// A cheap round trip (readiness).
    pub async fn ping(&self) -> anyhow::Result<()> {
        self.pool.execute("SELECT 1").await?;
        Ok(())
    }

    /// Inserts a row and returns its id (the `enqueue` verb, tests and benchmarks).
    pub async fn enqueue(&self, row: &NewRow) -> anyhow::Result<i64> {
        anyhow::ensure!(
            !self.cols.mapped,
            "enqueue writes the relay's own table; a table mapped by [table] is written by its \
             application"
        );
        let mut q = Sql::new(&format!(
            "INSERT INTO {} (channel, recipient, payload, ordering_key) VALUES (",
            self.table
        ));
        let payload = self.dialect.payload_param();
        let (before, after) = payload.split_once('?').unwrap_or(("", ""));
        q.text(&row.channel)
            .push(", ")
            .opt_text(row.recipient.clone())
            .push(", ")
            .push(before)
            .text(&row.payload)
            .push(after)
            .push(", ")
            .opt_text(row.ordering_key.clone())
            .push(")");
        if let Dialect::MySql { .. } = self.dialect {
            return mysql::insert(self, q).await;
        }
        q.push(" RETURNING id");
        let r = q.query(self).fetch_one(&self.pool).await?;
        Ok(r.try_get::<i64, _>(0)?)
    }
}

/// SQLite's "unable to open database file" (`SQLITE_CANTOPEN`, 14), said so that a user can
/// act on it: for a URL without a `mode`, SQLite opens an existing file only, unless told
/// `mode=rwc` (the embedded default's URL is); with one, the likely cause is a directory
/// that does not exist, which SQLite never creates.
fn sqlite_open_hint(e: anyhow::Error, url: &str) -> anyhow::Error {
    let cannot_open = e
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|d| d.code())
        .is_some_and(|code| code == "14");
    match (cannot_open, url.contains("mode=")) {
        (true, false) => e.context(
            "unable to open the SQLite database file: if it does not exist yet, add \
             `?mode=rwc` to database.url to have it created; otherwise check the path and its \
             permissions",
        ),
        // SQLite creates the file, never its directory.
        (true, true) => e.context(
            "unable to open the SQLite database file: check that the directory in \
             database.url exists and is writable",
        ),
        (false, _) => e,
    }
}

/// Opens up to `n` connections of `pool` side by side and leaves them idle in it (see
/// [`SqlStore::warm`]). Fails only when none could be opened.
async fn open_side_by_side(pool: &AnyPool, n: u32) -> anyhow::Result<()> {
    // More openers than the pool allows would wait for one another until the acquire
    // timeout.
    let n = n.min(pool.options().get_max_connections());
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..n {
        let pool = pool.clone();
        opening.spawn(async move { pool.acquire().await });
    }
    // Each connection is held until all are open, so that none is handed to another
    // opener and each opener opens its own.
    let mut open = Vec::with_capacity(n as usize);
    let mut failed = None;
    while let Some(joined) = opening.join_next().await {
        match joined {
            Ok(Ok(conn)) => open.push(conn),
            Ok(Err(e)) => failed = Some(anyhow::Error::from(e)),
            Err(e) => failed = Some(anyhow::Error::from(e)),
        }
    }
    // Dropped connections go back to the pool from tasks of their own: wait (briefly) until
    // they are idle. A statement that asks the pool for a connection before they are back,
    // after some of the openings failed, was seen to wait its whole acquire timeout.
    let opened = open.len();
    drop(open);
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    while pool.num_idle() < opened && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Fewer than asked (a server near its connection limit) is not a reason to refuse to
    // run: the pool opens more when they are needed, as it would without the warm-up.
    match failed {
        Some(e) if opened == 0 => Err(why_none_opened(pool, e).await),
        Some(e) => {
            tracing::warn!(
                opened,
                asked = n,
                error = %format!("{e:#}"),
                "could not open every database connection at start; going on with fewer"
            );
            Ok(())
        }
        None => Ok(()),
    }
}

/// sqlx reports a connection it could not open within the acquire timeout as "pool timed
/// out", without the cause (it retries refused connections until then). One direct attempt
/// names it: refused, unknown host, a failed authentication. Those fail at once; the attempt
/// gets at most [`WHY_ATTEMPT`], so a server that does not answer at all delays the error (and
/// the start-up retry) by that much, not by another acquire timeout.
async fn why_none_opened(pool: &AnyPool, e: anyhow::Error) -> anyhow::Error {
    if !matches!(
        e.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::PoolTimedOut)
    ) {
        return e;
    }
    let options = pool.connect_options();
    let attempt = sqlx::ConnectOptions::connect(&*options);
    let limit = pool.options().get_acquire_timeout().min(WHY_ATTEMPT);
    match tokio::time::timeout(limit, attempt).await {
        // The cause itself: callers print errors with `{e}`, which would drop a context's cause.
        Ok(Err(cause)) => anyhow::Error::from(cause),
        Ok(Ok(_)) | Err(_) => e,
    }
}

impl Queue for SqlStore {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, anyhow::Result<Vec<ClaimedRow>>> {
        Box::pin(async move {
            if req.asks_for_nothing() {
                return Ok(Vec::new());
            }
            self.claim_planned(req).await
        })
    }

    fn complete<'a>(&'a self, done: &'a [Completion]) -> BoxFuture<'a, anyhow::Result<u64>> {
        Box::pin(async move {
            if done.is_empty() {
                return Ok(0);
            }
            let written = {
                let _writing = self.writing().await;
                self.write_results(done).await
            };
            self.cursors.completed(done);
            written
        })
    }

    fn probe<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, anyhow::Result<Probe>> {
        Box::pin(async move {
            if req.asks_for_nothing() {
                return Ok(Probe::Nothing {
                    quiet_for: Duration::ZERO,
                });
            }
            let (floors, full_walk) = self.cursors.peek();
            let probe = self.probe_picks(req, &floors).await?;
            if let (Some(at), Probe::Nothing { .. }) = (full_walk, &probe) {
                self.cursors.read_nothing(at);
            }
            Ok(probe)
        })
    }
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("dialect", &self.dialect)
            .field("table", &self.table)
            .finish()
    }
}
