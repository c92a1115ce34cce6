//! Throughput benchmark: the relay against a fast loopback webhook receiver, on PostgreSQL,
//! MariaDB/MySQL and SQLite, next to two references measured in the same run (the machine is
//! shared and noisy, so only ratios within one run mean much):
//!
//! - **naive**: the "select one due row, POST it, mark it SUCCESS" loop many hand-rolled
//!   pollers use, one row at a time, same HTTP client settings as the webhook sink;
//! - **ceiling**: the receiver alone, POSTed to from `max_in_flight` concurrent loops with no
//!   database at all.
//!
//! For the relay it reports rows/s (start until every row is SUCCESS in the database),
//! statements per delivered row (`SqlStore::statements`, BEGIN/COMMIT not counted) and, on
//! PostgreSQL, transactions per row from `pg_stat_database.xact_commit` (database-wide: other
//! sessions on the same database add noise). Each line also shows the rate over the first and
//! the second half of the rows (a falling second half means claims get costlier as delivered
//! rows pile up) and how busy the machine's CPUs were (this process vs the rest: the database
//! server, and anything else running).
//!
//! Variations show where the throughput comes from: `max_in_flight` and `batch_size`, the sink's
//! default `concurrency` (32), and the planner's statistics (`no-ANALYZE`: the table as a bulk
//! insert leaves it). PostgreSQL diagnostics pass settings to the relay's sessions through the
//! URL's `options` (never recommended settings, only to show what a cost is): `plan=due_idx`
//! (`enable_sort` and `enable_bitmapscan` off, which leaves the claim the partial index in id
//! order) and `sync_commit=off` (commits do not wait for the WAL flush).
//!
//! Run: `cargo bench --bench throughput`. Environment knobs:
//! - `OUTBOX_RELAY_BENCH_ROWS` rows for the main relay run (default 20000 on PostgreSQL,
//!   half that on the others; variations and the naive loop use fewer, stated in the output);
//! - `OUTBOX_RELAY_BENCH_DBS` comma-separated subset of `postgres,mysql,sqlite`;
//! - `OUTBOX_RELAY_TEST_POSTGRES_URL`, `OUTBOX_RELAY_TEST_MYSQL_URL` as for the tests.
//!
//! A database that cannot be reached is skipped with a message. Every run is bounded in time;
//! a run whose rows do not all finish is reported as an error (with the row counts by status)
//! and the bench exits non-zero at the end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use axum::http::StatusCode;
use outbox_relay::config::Settings;
use outbox_relay::relay::Relay;
use outbox_relay::sink::SinkRegistry;
use outbox_relay::store::{self, Dialect, OutboxStore, SqlStore};
use outbox_relay::telemetry::Health;
use sqlx::{Connection, Row};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Rows per multi-row INSERT when preparing a table.
const INSERT_CHUNK: usize = 1000;
/// The longest a relay run may take before it is declared stuck.
const RELAY_RUN_LIMIT: Duration = Duration::from_secs(60);
/// The longest the naive loop runs; it reports the rate over the rows it managed.
const NAIVE_RUN_LIMIT: Duration = Duration::from_secs(15);
/// The longest the ceiling run may take.
const CEILING_RUN_LIMIT: Duration = Duration::from_secs(30);
/// Sink timeout used by the relay and mirrored by the naive loop's client.
const SINK_TIMEOUT: Duration = Duration::from_secs(10);

fn main() {
    // One process-wide rustls provider, as the binary installs (reqwest uses rustls).
    outbox_relay::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ok = runtime.block_on(bench());
    if !ok {
        std::process::exit(1);
    }
}

/// Which database a section runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Db {
    Postgres,
    MySql,
    Sqlite,
}

impl Db {
    fn name(self) -> &'static str {
        match self {
            Db::Postgres => "postgres",
            Db::MySql => "mysql",
            Db::Sqlite => "sqlite",
        }
    }

    fn url(self, dir: &std::path::Path) -> String {
        match self {
            Db::Postgres => std::env::var("OUTBOX_RELAY_TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            Db::MySql => std::env::var("OUTBOX_RELAY_TEST_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
            Db::Sqlite => format!("sqlite://{}?mode=rwc", dir.join("bench.db").display()),
        }
    }
}

/// The loopback receiver: answers 204 at once and counts requests.
struct Receiver {
    url: String,
    count: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Receiver {
    async fn start() -> anyhow::Result<Receiver> {
        let count = Arc::new(AtomicU64::new(0));
        let counter = count.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |_body: axum::body::Bytes| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::Relaxed);
                    StatusCode::NO_CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await;
            if let Err(e) = served {
                eprintln!("receiver stopped: {e}");
            }
        });
        Ok(Receiver {
            url: format!("http://{addr}/hook"),
            count,
            stop,
        })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The HTTP client the webhook sink builds, for the references.
fn sink_like_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(SINK_TIMEOUT)
        .connect_timeout(SINK_TIMEOUT.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

/// One POST shaped like the webhook sink's (same headers, body as stored); true on 2xx.
async fn post_like_sink(client: &reqwest::Client, url: &str, id: i64, payload: String) -> bool {
    if serde_json::from_str::<serde::de::IgnoredAny>(&payload).is_err() {
        return false;
    }
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|t| t.as_secs())
        .unwrap_or(0);
    let id = id.to_string();
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("idempotency-key", format!("\"{id}\""))
        .body(payload)
        .send()
        .await;
    matches!(resp, Ok(r) if r.status().is_success())
}

fn payload(n: usize) -> String {
    format!(r#"{{"event":"order.created","order_id":{n},"amount":1250,"currency":"KRW"}}"#)
}

/// A unique table name for one run.
fn unique_table(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("bench_{tag}_{}_{}_{n}", std::process::id(), nanos % 100_000)
}

/// Runs one statement of our own on `pool` (not counted by the store).
async fn exec(pool: &sqlx::AnyPool, sql: String) -> anyhow::Result<u64> {
    Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await?
        .rows_affected())
}

async fn scalar(pool: &sqlx::AnyPool, sql: String) -> anyhow::Result<i64> {
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// Creates (migrates) `table` and fills it with `n` PENDING webhook rows, in multi-row INSERTs;
/// with `analyze`, then refreshes the planner's statistics, as autovacuum would soon do.
async fn prepare_table(url: &str, table: &str, n: usize, analyze: bool) -> anyhow::Result<()> {
    let setup = SqlStore::connect(url, table, 2, Duration::from_secs(5)).await?;
    setup.migrate().await.context("migrate")?;
    let mut i = 0;
    while i < n {
        let end = (i + INSERT_CHUNK).min(n);
        let values: Vec<String> = (i..end)
            .map(|k| format!("('hook', '{}')", payload(k)))
            .collect();
        exec(
            setup.pool(),
            format!(
                "INSERT INTO {table} (channel, payload) VALUES {}",
                values.join(", ")
            ),
        )
        .await
        .context("bulk insert")?;
        i = end;
    }
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

/// Drops a bench table and what `migrate` created with it (best effort).
async fn drop_table(url: &str, table: &str, dialect: Option<Dialect>) {
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
async fn pg_xact_commit(url: &str) -> Option<i64> {
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
async fn settled_xacts(db: Db, url: &str) -> Option<i64> {
    if db != Db::Postgres {
        return None;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    pg_xact_commit(url).await
}

/// Machine-wide and own CPU time (Linux `/proc`, in clock ticks summed over all cores), to
/// tell whether a run was CPU-bound on this small machine and who used the CPU.
#[derive(Debug, Clone, Copy)]
struct CpuSnap {
    total: u64,
    idle: u64,
    own: u64,
}

impl CpuSnap {
    fn take() -> Option<CpuSnap> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        if cpu.len() < 5 {
            return None;
        }
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let after_comm = own.rsplit_once(')')?.1;
        let fields: Vec<&str> = after_comm.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(CpuSnap {
            total: cpu.iter().sum(),
            idle: cpu[3] + cpu[4],
            own: utime + stime,
        })
    }

    /// (machine busy fraction, this process's fraction) of all cores since `self`.
    fn since(self, later: CpuSnap) -> Option<(f64, f64)> {
        let total = later.total.checked_sub(self.total)? as f64;
        if total <= 0.0 {
            return None;
        }
        let idle = later.idle.saturating_sub(self.idle) as f64;
        let own = later.own.saturating_sub(self.own) as f64;
        Some(((total - idle) / total, (own / total).min(1.0)))
    }
}

fn fmt_cpu(cpu: Option<(f64, f64)>) -> String {
    cpu.map(|(busy, own)| {
        format!(
            "  cpu {:.0}% busy (bench process {:.0}%, rest {:.0}%)",
            busy * 100.0,
            own * 100.0,
            (busy - own).max(0.0) * 100.0
        )
    })
    .unwrap_or_default()
}

/// Counts by status, for error messages.
async fn status_counts(pool: &sqlx::AnyPool, table: &str) -> String {
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

/// How one relay run is set up.
#[derive(Debug, Clone, Copy)]
struct RunConfig {
    batch_size: u32,
    max_in_flight: u32,
    /// The webhook sink's `concurrency` (None: left at its default, 32).
    sink_concurrency: Option<u32>,
    /// Whether the table's statistics are fresh (ANALYZE after the bulk insert) when the run
    /// starts, or as a just-filled table has them (none, or from before the rows arrived).
    analyze: bool,
    /// PostgreSQL only, diagnostic: settings for the relay's sessions, passed in the URL's
    /// `options` (`-c name=value ...`), with a short label. Used to show what the claim's
    /// query plan and the WAL flush at each commit cost; not recommended settings.
    pg_options: Option<(&'static str, &'static str)>,
}

impl RunConfig {
    fn new(batch_size: u32, max_in_flight: u32) -> RunConfig {
        RunConfig {
            batch_size,
            max_in_flight,
            sink_concurrency: Some(max_in_flight),
            analyze: true,
            pg_options: None,
        }
    }
}

/// What one relay run measured.
#[derive(Debug, Clone)]
struct RelayRun {
    rows: usize,
    config: RunConfig,
    rows_per_sec: f64,
    statements: u64,
    xacts: Option<i64>,
    received: u64,
    cpu: Option<(f64, f64)>,
    /// Rows/s over the first and the second half of the rows.
    halves: Option<(f64, f64)>,
}

impl RelayRun {
    fn statements_per_row(&self) -> f64 {
        self.statements as f64 / self.rows as f64
    }

    fn xacts_per_row(&self) -> Option<f64> {
        self.xacts.map(|x| x as f64 / self.rows as f64)
    }
}

/// Runs the relay in-process over `n` pre-inserted rows until all are SUCCESS.
async fn relay_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    n: usize,
    config: RunConfig,
) -> anyhow::Result<RelayRun> {
    let table = unique_table("relay");
    let result = relay_run_on(db, url, &table, receiver, n, config).await;
    let dialect = match db {
        Db::Postgres => Some(Dialect::Postgres),
        _ => None,
    };
    drop_table(url, &table, dialect).await;
    result
}

async fn relay_run_on(
    db: Db,
    url: &str,
    table: &str,
    receiver: &Receiver,
    n: usize,
    config: RunConfig,
) -> anyhow::Result<RelayRun> {
    let RunConfig {
        batch_size,
        max_in_flight,
        sink_concurrency,
        analyze,
        pg_options,
    } = config;
    prepare_table(url, table, n, analyze).await?;
    let bench_url = url;
    let url = &match pg_options {
        Some((_, options)) => {
            let sep = if url.contains('?') { '&' } else { '?' };
            let encoded = options.replace(' ', "%20").replace('=', "%3D");
            format!("{url}{sep}options={encoded}")
        }
        None => url.to_string(),
    };

    // An empty config file, so a config/relay.toml in the working directory cannot interfere.
    let dir = tempfile::tempdir()?;
    let config_file = dir.path().join("bench.toml");
    std::fs::write(&config_file, "")?;
    let env: BTreeMap<String, String> = [
        ("OUTBOX_RELAY__DATABASE__URL", url.to_string()),
        ("OUTBOX_RELAY__DATABASE__TABLE", table.to_string()),
        ("OUTBOX_RELAY__HTTP__LISTEN", String::new()),
        ("OUTBOX_RELAY__RELAY__INSTANCE_ID", "bench".to_string()),
        ("OUTBOX_RELAY__RELAY__MODE", "leader".to_string()),
        ("OUTBOX_RELAY__RELAY__BATCH_SIZE", batch_size.to_string()),
        (
            "OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT",
            max_in_flight.to_string(),
        ),
        ("OUTBOX_RELAY__LEASE__BACKEND", "none".to_string()),
        ("OUTBOX_RELAY__SINKS__HOOK__KIND", "webhook".to_string()),
        ("OUTBOX_RELAY__SINKS__HOOK__URL", receiver.url.clone()),
        ("OUTBOX_RELAY__SINKS__HOOK__TIMEOUT", "10s".to_string()),
    ]
    .into_iter()
    // Unset, the sink's own cap is its default (32), whatever max_in_flight says.
    .chain(sink_concurrency.map(|c| ("OUTBOX_RELAY__SINKS__HOOK__CONCURRENCY", c.to_string())))
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let settings = Settings::load_with_env(Some(&config_file), Some(env))
        .map_err(|e| anyhow::anyhow!("settings: {e}"))?;
    let sinks = Arc::new(SinkRegistry::build(&settings)?);
    let store = Arc::new(
        SqlStore::connect(
            url,
            table,
            settings.database.max_connections,
            settings.database.connect_timeout,
        )
        .await?,
    );
    if let Some((_, options)) = pg_options {
        // Check that the server took them (each `-c name=value`).
        for setting in options.split("-c").map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = setting.split_once('=').unwrap_or((setting, ""));
            let actual: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {name}")))
                .fetch_one(store.pool())
                .await?;
            if actual != value {
                bail!("{name} is {actual:?} on the relay's sessions, not {value:?}");
            }
        }
    }
    // The bench's own progress checks go through a separate one-connection pool.
    let probe = SqlStore::connect(bench_url, table, 1, Duration::from_secs(5)).await?;
    let mut probe_queries = 0i64;

    let xacts_before = settled_xacts(db, bench_url).await;
    let shutdown = CancellationToken::new();
    let wake = Arc::new(Notify::new());
    if db == Db::Postgres && settings.database.listen {
        // As `run` wires it (pre-inserted rows need no NOTIFY, but the session is realistic).
        tokio::spawn(store::listen(
            url.to_string(),
            table.to_string(),
            wake.clone(),
            shutdown.clone(),
        ));
    }
    let relay = Relay {
        store: store.clone() as Arc<dyn OutboxStore>,
        sinks,
        settings: settings.relay.clone(),
        lease: None,
        wake,
        health: Arc::new(Health::default()),
        shutdown: shutdown.clone(),
    };
    let received_before = receiver.count();
    let statements_before = store.statements();
    let cpu_before = CpuSnap::take();
    let started = Instant::now();
    let task = tokio::spawn(relay.run());

    // Watch the receiver (free), then confirm in the database (cheap, a few queries).
    let deadline = started + RELAY_RUN_LIMIT;
    // When the receiver saw half the rows: a second half much slower than the first points at
    // claims getting costlier as delivered rows pile up in the table.
    let mut half_at: Option<Duration> = None;
    let outcome: anyhow::Result<()> = loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if half_at.is_none() && receiver.count() - received_before >= n as u64 / 2 {
            half_at = Some(started.elapsed());
        }
        if Instant::now() > deadline {
            let counts = status_counts(probe.pool(), table).await;
            break Err(anyhow::anyhow!(
                "rows did not all reach SUCCESS within {RELAY_RUN_LIMIT:?}: received {} of {n}, table: {counts}",
                receiver.count() - received_before
            ));
        }
        if task.is_finished() {
            break Err(anyhow::anyhow!("the relay loop ended by itself"));
        }
        if receiver.count() - received_before < n as u64 {
            continue;
        }
        probe_queries += 1;
        let done = scalar(
            probe.pool(),
            format!("SELECT COUNT(*) FROM {table} WHERE status = 'SUCCESS'"),
        )
        .await?;
        if done >= n as i64 {
            break Ok(());
        }
    };
    let elapsed = started.elapsed();
    let statements = store.statements() - statements_before;
    let halves = half_at.map(|h| {
        let half = (n / 2) as f64;
        (
            half / h.as_secs_f64(),
            (n as f64 - half) / (elapsed - h).as_secs_f64().max(1e-6),
        )
    });
    let cpu = cpu_before
        .zip(CpuSnap::take())
        .and_then(|(a, b)| a.since(b));

    shutdown.cancel();
    if tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .is_err()
    {
        eprintln!("warning: relay did not stop within 30s of shutdown");
    }
    outcome?;
    let received = receiver.count() - received_before;
    store.pool().close().await;
    probe.pool().close().await;
    let xacts_after = settled_xacts(db, bench_url).await;
    let xacts = match (xacts_before, xacts_after) {
        // Our own sessions: the probe's queries and the stats read itself.
        (Some(a), Some(b)) => Some(b - a - probe_queries - 1),
        _ => None,
    };
    Ok(RelayRun {
        rows: n,
        config,
        rows_per_sec: n as f64 / elapsed.as_secs_f64(),
        statements,
        xacts,
        received,
        cpu,
        halves,
    })
}

/// What the naive loop measured.
#[derive(Debug, Clone)]
struct NaiveRun {
    rows: usize,
    rows_per_sec: f64,
    statements: u64,
    xacts: Option<i64>,
    cpu: Option<(f64, f64)>,
}

/// One loop: SELECT one due row, POST it, UPDATE it to SUCCESS; until `n` rows or the limit.
async fn naive_run(db: Db, url: &str, receiver: &Receiver, n: usize) -> anyhow::Result<NaiveRun> {
    let table = unique_table("naive");
    let result = naive_run_on(db, url, &table, receiver, n).await;
    let dialect = match db {
        Db::Postgres => Some(Dialect::Postgres),
        _ => None,
    };
    drop_table(url, &table, dialect).await;
    result
}

async fn naive_run_on(
    db: Db,
    url: &str,
    table: &str,
    receiver: &Receiver,
    n: usize,
) -> anyhow::Result<NaiveRun> {
    prepare_table(url, table, n, true).await?;
    let store = SqlStore::connect(url, table, 1, Duration::from_secs(5)).await?;
    let d = store.dialect();
    let select = d.finalize(&format!(
        "SELECT id, {} FROM {table} WHERE status IN ('PENDING', 'RETRY')
           AND next_attempt_at <= {now} ORDER BY id LIMIT 1",
        d.payload_text("payload"),
        now = d.now()
    ));
    let update = d.finalize(&format!(
        "UPDATE {table} SET status = 'SUCCESS', attempts = attempts + 1, sent_at = {now},
           updated_at = {now} WHERE id = ?",
        now = d.now()
    ));
    let client = sink_like_client()?;
    let pool = store.pool();
    // Warm the connection so connecting is not timed (the relay's pool is warm too).
    scalar(pool, "SELECT 1".to_string()).await?;

    let xacts_before = settled_xacts(db, url).await;
    let mut statements = 0u64;
    let mut done = 0usize;
    let cpu_before = CpuSnap::take();
    let started = Instant::now();
    while done < n && started.elapsed() < NAIVE_RUN_LIMIT {
        statements += 1;
        let Some(row) = sqlx::query(sqlx::AssertSqlSafe(select.clone()))
            .fetch_optional(pool)
            .await?
        else {
            break;
        };
        let id: i64 = row.try_get(0)?;
        let body: String = row.try_get(1)?;
        if !post_like_sink(&client, &receiver.url, id, body).await {
            bail!("naive loop: POST of row {id} failed");
        }
        statements += 1;
        sqlx::query(sqlx::AssertSqlSafe(update.clone()))
            .bind(id)
            .execute(pool)
            .await?;
        done += 1;
    }
    let elapsed = started.elapsed();
    let cpu = cpu_before
        .zip(CpuSnap::take())
        .and_then(|(a, b)| a.since(b));
    pool.close().await;
    let xacts_after = settled_xacts(db, url).await;
    if done == 0 {
        bail!("naive loop delivered no row");
    }
    Ok(NaiveRun {
        rows: done,
        rows_per_sec: done as f64 / elapsed.as_secs_f64(),
        statements,
        xacts: match (xacts_before, xacts_after) {
            (Some(a), Some(b)) => Some(b - a - 1),
            _ => None,
        },
        cpu,
    })
}

/// The receiver alone: `n` POSTs from `concurrency` loops, no database.
async fn ceiling_run(
    receiver: &Receiver,
    n: usize,
    concurrency: u32,
) -> anyhow::Result<(f64, Option<(f64, f64)>)> {
    let client = sink_like_client()?;
    let next = Arc::new(AtomicU64::new(0));
    let cpu_before = CpuSnap::take();
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next, url) = (client.clone(), next.clone(), receiver.url.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return true;
                }
                if !post_like_sink(&client, &url, i as i64, payload(i)).await {
                    return false;
                }
            }
        });
    }
    let all = tokio::time::timeout(CEILING_RUN_LIMIT, async {
        let mut ok = true;
        while let Some(r) = workers.join_next().await {
            ok &= r.unwrap_or(false);
        }
        ok
    })
    .await;
    match all {
        Ok(true) => Ok((
            n as f64 / started.elapsed().as_secs_f64(),
            cpu_before
                .zip(CpuSnap::take())
                .and_then(|(a, b)| a.since(b)),
        )),
        Ok(false) => bail!("ceiling: a POST failed"),
        Err(_) => bail!("ceiling: {n} POSTs did not finish within {CEILING_RUN_LIMIT:?}"),
    }
}

/// One database's figures, for the final table.
struct Section {
    db: Db,
    main: Option<RelayRun>,
    naive: Option<NaiveRun>,
    ceiling: Option<f64>,
    variations: Vec<RelayRun>,
    errors: Vec<String>,
    skipped: Option<String>,
}

fn relay_config(r: &RelayRun) -> String {
    let c = r.config;
    let sink = match c.sink_concurrency {
        Some(n) => format!("sink conc {n:>4}"),
        None => "sink conc  32*".to_string(),
    };
    let stats = if c.analyze { "" } else { " no-ANALYZE" };
    let options = c
        .pg_options
        .map(|(label, _)| format!(" {label}"))
        .unwrap_or_default();
    format!(
        "batch {:>4} in_flight {:>4} {sink}{stats}{options}",
        c.batch_size, c.max_in_flight
    )
}

fn print_relay(db: Db, label: &str, r: &RelayRun) {
    let xacts = r
        .xacts_per_row()
        .map(|x| format!("  xacts/row {x:.4}"))
        .unwrap_or_default();
    println!(
        "  {:<8} {label:<9} {} rows {:>6}: {:>6.0} rows/s{}  statements/row {:.4} ({} stmts){xacts}  received {}{}",
        db.name(),
        relay_config(r),
        r.rows,
        r.rows_per_sec,
        r.halves
            .map(|(a, b)| format!(" (halves {a:.0}/{b:.0})"))
            .unwrap_or_default(),
        r.statements_per_row(),
        r.statements,
        r.received,
        fmt_cpu(r.cpu),
    );
}

async fn run_section(db: Db, receiver: &Receiver, main_rows: usize) -> Section {
    let mut s = Section {
        db,
        main: None,
        naive: None,
        ceiling: None,
        variations: Vec::new(),
        errors: Vec::new(),
        skipped: None,
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            s.errors.push(format!("tempdir: {e}"));
            return s;
        }
    };
    let url = db.url(dir.path());
    // Reachable at all?
    match SqlStore::connect(&url, "bench_probe", 1, Duration::from_secs(3)).await {
        Ok(store) => store.pool().close().await,
        Err(e) => {
            let msg = format!("{} at {url} unreachable: {e}", db.name());
            println!("SKIPPED: {msg}");
            s.skipped = Some(msg);
            return s;
        }
    }
    let (batch, in_flight) = (100u32, 64u32);
    println!(
        "== {}: main relay run of {main_rows} rows (batch {batch}, max_in_flight {in_flight})",
        db.name()
    );

    match ceiling_run(receiver, main_rows, in_flight).await {
        Ok((r, cpu)) => {
            println!(
                "  {:<8} ceiling   concurrency {in_flight} POSTs {main_rows}: {r:.0} req/s{}",
                db.name(),
                fmt_cpu(cpu)
            );
            s.ceiling = Some(r);
        }
        Err(e) => s.errors.push(format!("ceiling: {e:#}")),
    }

    match relay_run(
        db,
        &url,
        receiver,
        main_rows,
        RunConfig::new(batch, in_flight),
    )
    .await
    {
        Ok(r) => {
            print_relay(db, "relay", &r);
            s.main = Some(r);
        }
        Err(e) => {
            println!("  {:<8} relay     ERROR: {e:#}", db.name());
            s.errors.push(format!("relay: {e:#}"));
        }
    }

    let naive_rows = (main_rows / 4).max(500);
    match naive_run(db, &url, receiver, naive_rows).await {
        Ok(r) => {
            let xacts = r
                .xacts
                .map(|x| format!("  xacts/row {:.3}", x as f64 / r.rows as f64))
                .unwrap_or_default();
            println!(
                "  {:<8} naive     one row at a time, rows {:>6}: {:>7.0} rows/s  statements/row {:.3}{xacts}{}",
                db.name(),
                r.rows,
                r.rows_per_sec,
                r.statements as f64 / r.rows as f64,
                fmt_cpu(r.cpu)
            );
            s.naive = Some(r);
        }
        Err(e) => {
            println!("  {:<8} naive     ERROR: {e:#}", db.name());
            s.errors.push(format!("naive: {e:#}"));
        }
    }

    // Where the throughput comes from: concurrency, batch size, and the sink's default cap.
    let var_rows = (main_rows / 2).max(1000);
    let variations = [
        (RunConfig::new(100, 1), (var_rows / 10).max(300)),
        (RunConfig::new(100, 16), var_rows),
        (RunConfig::new(10, 64), var_rows),
        (
            RunConfig {
                sink_concurrency: None,
                ..RunConfig::new(batch, in_flight)
            },
            var_rows,
        ),
        (RunConfig::new(500, 256), var_rows),
        // The main run on a table whose statistics predate the rows (no ANALYZE yet).
        (
            RunConfig {
                analyze: false,
                ..RunConfig::new(batch, in_flight)
            },
            main_rows,
        ),
    ];
    // PostgreSQL diagnostics on the main configuration: the claim held to the plan it was
    // written for (the partial index in id order; see the report), and commits that do not
    // wait for the WAL flush.
    let plan = "-c enable_sort=off -c enable_bitmapscan=off";
    let diagnostics = [
        ("plan=due_idx", plan),
        (
            "plan=due_idx sync_commit=off",
            "-c enable_sort=off -c enable_bitmapscan=off -c synchronous_commit=off",
        ),
    ]
    .into_iter()
    .filter(|_| db == Db::Postgres)
    .map(|options| {
        (
            RunConfig {
                pg_options: Some(options),
                // Without fresh statistics the planner prefers the partial index over the
                // primary key; with them (all rows pending) it walks the primary key.
                analyze: false,
                ..RunConfig::new(batch, in_flight)
            },
            main_rows,
        )
    });
    for (config, rows) in variations.into_iter().chain(diagnostics) {
        let (b, f) = (config.batch_size, config.max_in_flight);
        match relay_run(db, &url, receiver, rows, config).await {
            Ok(r) => {
                print_relay(db, "variation", &r);
                s.variations.push(r);
            }
            Err(e) => {
                println!(
                    "  {:<8} variation batch {b} in_flight {f} ERROR: {e:#}",
                    db.name()
                );
                s.errors
                    .push(format!("variation batch {b} in_flight {f}: {e:#}"));
            }
        }
    }
    s
}

async fn bench() -> bool {
    let base_rows: usize = std::env::var("OUTBOX_RELAY_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let wanted =
        std::env::var("OUTBOX_RELAY_BENCH_DBS").unwrap_or_else(|_| "postgres,mysql,sqlite".into());
    let dbs: Vec<Db> = [Db::Postgres, Db::MySql, Db::Sqlite]
        .into_iter()
        .filter(|d| wanted.split(',').any(|w| w.trim() == d.name()))
        .collect();

    let receiver = match Receiver::start().await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the loopback receiver: {e:#}");
            return false;
        }
    };
    println!(
        "outbox-relay throughput bench: receiver {} (204, no work); {} worker threads; tracing and metrics recorder not installed",
        receiver.url,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "?".into())
    };
    let load_at_start = load();
    let bench_started = Instant::now();
    let mut sections = Vec::new();
    for db in dbs {
        let rows = if db == Db::Postgres {
            base_rows
        } else {
            (base_rows / 2).max(1000)
        };
        sections.push(run_section(db, &receiver, rows).await);
    }
    receiver.stop.cancel();

    println!();
    println!(
        "load average at start {load_at_start}, at end {} (other work on this machine skews absolute figures; compare ratios)",
        load()
    );
    println!(
        "== summary (total {:.0}s; relay = rows/s until all SUCCESS in the database; naive = select-one/POST/update-one loop on the same database over fewer rows; ceiling = POSTs alone at the same concurrency)",
        bench_started.elapsed().as_secs_f64()
    );
    let mut ok = true;
    for s in &sections {
        if let Some(why) = &s.skipped {
            println!("{:<9} skipped: {why}", s.db.name());
            continue;
        }
        let relay = s.main.as_ref().map(|r| r.rows_per_sec);
        let fmt_rate = |r: Option<f64>| r.map(|v| format!("{v:.0}")).unwrap_or("-".into());
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
            _ => "-".into(),
        };
        let naive = s.naive.as_ref().map(|r| r.rows_per_sec);
        let stmts = s
            .main
            .as_ref()
            .map(|r| format!("{:.4}", r.statements_per_row()))
            .unwrap_or("-".into());
        let xacts = s
            .main
            .as_ref()
            .and_then(|r| r.xacts_per_row())
            .map(|x| format!("  xacts/row {x:.4}"))
            .unwrap_or_default();
        println!(
            "{:<9} relay {} rows/s  naive {} rows/s  relay/naive {}  ceiling {} rows/s  relay/ceiling {}  statements/row {stmts}{xacts}",
            s.db.name(),
            fmt_rate(relay),
            fmt_rate(naive),
            ratio(relay, naive),
            fmt_rate(s.ceiling),
            ratio(relay, s.ceiling),
        );
        for v in &s.variations {
            let xacts = v
                .xacts_per_row()
                .map(|x| format!("  xacts/row {x:.4}"))
                .unwrap_or_default();
            println!(
                "{:<9}   {}: {:>6.0} rows/s  statements/row {:.4}{xacts}",
                "",
                relay_config(v),
                v.rows_per_sec,
                v.statements_per_row()
            );
        }
        for r in s.main.iter().chain(&s.variations) {
            if r.received != r.rows as u64 {
                println!(
                    "{:<9}   NOTE: receiver counted {} requests for {} rows ({})",
                    "",
                    r.received,
                    r.rows,
                    relay_config(r)
                );
            }
        }
        for e in &s.errors {
            println!("{:<9}   ERROR {e}", s.db.name());
            ok = false;
        }
    }
    println!(
        "* sink concurrency left at its default (32), which then caps max_in_flight; elsewhere it is set to max_in_flight."
    );
    if sections
        .iter()
        .any(|s| s.db == Db::Postgres && s.main.is_some())
    {
        println!(
            "note: xacts/row comes from pg_stat_database for the whole database; other sessions running at the same time add to it."
        );
    }
    ok
}
