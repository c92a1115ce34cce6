//! Opening a [`Db`]: the pool's options (what every database shares, then the database's own
//! session settings through [`Connect`]), the connections opened side by side before the
//! relay's loop starts, and errors that say why none opened.
//!
//! Guarantees: every session waits at most a bounded time for a lock and runs a statement for
//! a bounded time (each database's session settings), so a locked table makes a claim fail and
//! retry instead of hanging; a pooled connection idle for a while is pinged before use.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

use super::Db;
use crate::BoxFuture;
use crate::store::sql::{Columns, Dialect, Syntax};

/// The longest the direct attempt that names why no connection opened may take.
const WHY_ATTEMPT: Duration = Duration::from_secs(1);
/// A pooled connection idle for longer than this is pinged before it is used.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);
/// Longest a statement waits for a row or table lock before failing (and being retried):
/// each database's session settings apply it.
pub const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Longest a statement may run on the server (migrations of large tables included).
pub const STATEMENT_TIME: Duration = Duration::from_secs(300);

/// Connections the relay opens side by side before its loop starts (at most
/// `database.max_connections`): the loop's claim, the result writer, the lease or fence
/// and a spare for health and metrics. See [`open_side_by_side`].
pub const WARM_CONNECTIONS: u32 = 4;

/// The URL as the driver takes it, and the pool's options (see [`Connect::options`]).
pub type Options = anyhow::Result<(String, AnyPoolOptions)>;

/// The dialect as the server refines it (see [`Connect::opened`]).
pub type Refined<'a> = BoxFuture<'a, anyhow::Result<Dialect>>;

/// What a database does when its connections open. Each database's folder implements it.
pub trait Connect: Send + Sync {
    /// The URL as the driver takes it (a parameter of the relay's own removed), and `options`
    /// with the database's session settings (run on every new connection).
    fn options(&self, url: &str, options: AnyPoolOptions) -> Options;

    /// Once connections to `url` are open: the dialect refined from the server (MySQL or
    /// MariaDB, and what it supports), after any one-time setting the database needs. By
    /// default `dialect` as it is.
    fn opened<'a>(&'a self, _pool: &'a AnyPool, _url: &'a str, dialect: Dialect) -> Refined<'a> {
        Box::pin(async move { Ok(dialect) })
    }

    /// Whether the whole database lives in one connection (an in-memory SQLite database).
    fn one_connection(&self, _url: &str) -> bool {
        false
    }

    /// An error that kept every connection from opening, made actionable.
    fn open_error(&self, e: anyhow::Error, _url: &str) -> anyhow::Error {
        e
    }

    /// The database takes one writer at a time (see [`Db::writing`]).
    fn single_writer(&self) -> bool {
        false
    }
}

/// What opening a [`Db`] needs.
pub struct Opening<'a> {
    pub url: &'a str,
    pub dialect: Dialect,
    pub table: &'a str,
    pub syntax: &'static dyn Syntax,
    pub connect: &'static dyn Connect,
    pub max_connections: u32,
    pub connect_timeout: Duration,
    /// Connections to open side by side before returning (at least one must open).
    pub open: u32,
}

impl Db {
    /// Opens the pool for `o` (without migrating) and up to `o.open` connections.
    pub async fn open(o: Opening<'_>) -> anyhow::Result<Db> {
        sqlx::any::install_default_drivers();
        let one = o.connect.one_connection(o.url);
        let (url, options) = o.connect.options(o.url, pool_options(&o, one))?;
        let pool = options.connect_lazy(&url)?;
        open_side_by_side(&pool, o.open.max(1))
            .await
            .map_err(|e| o.connect.open_error(e, &url))?;
        let dialect = o.connect.opened(&pool, &url, o.dialect).await?;
        Ok(Db {
            pool,
            dialect,
            syntax: o.syntax,
            table: o.table.to_string(),
            name: o.table.to_string(),
            cols: Columns::default(),
            statements: AtomicU64::new(0),
            writer: o
                .connect
                .single_writer()
                .then(|| tokio::sync::Mutex::new(())),
        })
    }
}

/// The options every database's pool shares.
fn pool_options(o: &Opening<'_>, one_connection: bool) -> AnyPoolOptions {
    // A pooled connection is pinged before use only when it sat idle for a while: a ping
    // on every acquire was a round trip per statement (docs/performance-log.md). A connection
    // that died in use fails its statement, which is retried as transient (docs/design.md,
    // "Failure model"); one idle across a database restart is still caught by the ping.
    let options = AnyPoolOptions::new()
        .max_connections(if one_connection { 1 } else { o.max_connections })
        .acquire_timeout(o.connect_timeout)
        // A connection, once open, stays open (until it fails or reaches the pool's
        // maximum lifetime): opening one costs a TLS handshake and the server's session
        // start, which must not land on a claim after a quiet spell.
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
    // A database that lives in its one connection dies with it.
    if one_connection {
        options.max_lifetime(None)
    } else {
        options
    }
}

/// Opens up to `n` connections of `pool` side by side and leaves them idle in it, so that the
/// relay's first claims and result writes do not each wait for a connection of their own to
/// be opened (a TLS handshake, the server's session start; docs/design.md, "Connections").
/// Fails only when none could be opened.
pub async fn open_side_by_side(pool: &AnyPool, n: u32) -> anyhow::Result<()> {
    // More openers than the pool allows would wait for one another until the acquire
    // timeout.
    let n = n.min(pool.options().get_max_connections());
    let (opened, failed) = open_all(pool, n).await;
    // Dropped connections go back to the pool from tasks of their own: wait (briefly) until
    // they are idle. A statement that asks the pool for a connection before they are back,
    // after some of the openings failed, was seen to wait its whole acquire timeout.
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

/// Opens `n` connections at once, each held until all are open (so that none is handed to
/// another opener and each opener opens its own), then gives them back: how many opened, and
/// the last error.
async fn open_all(pool: &AnyPool, n: u32) -> (usize, Option<anyhow::Error>) {
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..n {
        let pool = pool.clone();
        opening.spawn(async move { pool.acquire().await });
    }
    let mut open = Vec::with_capacity(n as usize);
    let mut failed = None;
    while let Some(joined) = opening.join_next().await {
        match joined {
            Ok(Ok(conn)) => open.push(conn),
            Ok(Err(e)) => failed = Some(anyhow::Error::from(e)),
            Err(e) => failed = Some(anyhow::Error::from(e)),
        }
    }
    (open.len(), failed)
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
