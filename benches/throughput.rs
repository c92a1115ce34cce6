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
//! That is the **leader** section (one relay, `relay.mode = "leader"` without a lease). The
//! **claim** section (PostgreSQL and MariaDB/MySQL only) runs 1, 2 and 3 relays in
//! `relay.mode = "claim"` at once in this process, each with its own pool, sinks, instance id
//! and receiver path (`/hook/a`, `/hook/b`, `/hook/c`), on one pre-filled table, and reports
//! rows/s, the ratio to one instance, each instance's share of the requests, and whether any
//! row arrived twice (by `webhook-id`). It then measures the cost of ordering: the same runs
//! (1 and 3 instances) on rows with 200 ordering keys round-robin, and a diagnostic keyed run
//! with a 20ms `poll_interval` (a claim that comes back short, as when most keys' heads are in
//! flight, makes the loop sleep `poll_interval`). The instances share the machine's CPUs with
//! each other and the database server, so the ratios show how the SQL claim path scales under
//! contention, not what more machines would give.
//!
//! Run: `cargo bench --bench throughput`. Environment knobs:
//! - `OUTBOX_RELAY_BENCH_ROWS` rows for the main relay run (default 20000 on PostgreSQL,
//!   half that on the others; variations and the naive loop use fewer, stated in the output);
//! - `OUTBOX_RELAY_BENCH_DBS` comma-separated subset of `postgres,mysql,sqlite`;
//! - `OUTBOX_RELAY_BENCH_SECTIONS` comma-separated subset of `leader,claim` (default both);
//! - `OUTBOX_RELAY_BENCH_CLAIM_ROWS` rows per claim-section run (default 10000);
//! - `OUTBOX_RELAY_TEST_POSTGRES_URL`, `OUTBOX_RELAY_TEST_MYSQL_URL` as for the tests.
//!
//! A database that cannot be reached is skipped with a message. Every run is bounded in time;
//! a run whose rows do not all finish is reported as an error (with the row counts by status)
//! and the bench exits non-zero at the end.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use axum::http::StatusCode;
use outbox_relay::config::Settings;
use outbox_relay::relay::Relay;
use outbox_relay::sink::SinkRegistry;
use outbox_relay::store::{self, Dialect, SqlStore};
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

/// The loopback receiver: answers 204 at once and counts requests. `/hook` serves the leader
/// section and the references; the claim section gives each instance its own path
/// (`/hook/a`, `/hook/b`, `/hook/c`), counted apart, and notes `webhook-id`s seen twice there.
struct Receiver {
    url: String,
    count: Arc<AtomicU64>,
    /// Requests per instance path, in [`INSTANCE_PATHS`] order.
    per_instance: Arc<Vec<AtomicU64>>,
    /// `webhook-id`s seen on the instance paths since the last [`Receiver::reset_seen`], and
    /// how many arrived again.
    seen: Arc<Mutex<HashSet<String>>>,
    repeats: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Receiver {
    async fn start() -> anyhow::Result<Receiver> {
        let count = Arc::new(AtomicU64::new(0));
        let counter = count.clone();
        let mut app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |_body: axum::body::Bytes| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::Relaxed);
                    StatusCode::NO_CONTENT
                }
            }),
        );
        let per_instance: Arc<Vec<AtomicU64>> =
            Arc::new(INSTANCE_PATHS.iter().map(|_| AtomicU64::new(0)).collect());
        let seen = Arc::new(Mutex::new(HashSet::new()));
        let repeats = Arc::new(AtomicU64::new(0));
        for (i, path) in INSTANCE_PATHS.iter().enumerate() {
            let (counter, per_instance) = (count.clone(), per_instance.clone());
            let (seen, repeats) = (seen.clone(), repeats.clone());
            app = app.route(
                &format!("/hook/{path}"),
                axum::routing::post(
                    move |headers: axum::http::HeaderMap, _body: axum::body::Bytes| {
                        let (counter, per_instance) = (counter.clone(), per_instance.clone());
                        let (seen, repeats) = (seen.clone(), repeats.clone());
                        async move {
                            counter.fetch_add(1, Ordering::Relaxed);
                            per_instance[i].fetch_add(1, Ordering::Relaxed);
                            let id = headers
                                .get("webhook-id")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_string();
                            let fresh = seen.lock().map(|mut s| s.insert(id)).unwrap_or(true);
                            if !fresh {
                                repeats.fetch_add(1, Ordering::Relaxed);
                            }
                            StatusCode::NO_CONTENT
                        }
                    },
                ),
            );
        }
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
            per_instance,
            seen,
            repeats,
            stop,
        })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The sink URL of claim-section instance `i`.
    fn instance_url(&self, i: usize) -> String {
        format!("{}/{}", self.url, INSTANCE_PATHS[i])
    }

    fn instance_counts(&self) -> Vec<u64> {
        self.per_instance
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Forgets the ids seen (each run's table numbers its rows from 1) and returns the repeat
    /// counter's value, to subtract.
    fn reset_seen(&self) -> u64 {
        if let Ok(mut s) = self.seen.lock() {
            s.clear();
        }
        self.repeats.load(Ordering::Relaxed)
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
/// with `keys` > 0, row k gets `ordering_key` `k{k % keys}` (round-robin, so consecutive rows
/// belong to different keys); with `analyze`, then refreshes the planner's statistics, as
/// autovacuum would soon do.
async fn prepare_table(
    url: &str,
    table: &str,
    n: usize,
    analyze: bool,
    keys: usize,
) -> anyhow::Result<()> {
    let setup = SqlStore::connect(url, table, 2, Duration::from_secs(5)).await?;
    setup.migrate().await.context("migrate")?;
    let mut i = 0;
    while i < n {
        let end = (i + INSERT_CHUNK).min(n);
        let values: Vec<String> = (i..end)
            .map(|k| {
                let key = if keys > 0 {
                    format!("'k{}'", k % keys)
                } else {
                    "NULL".to_string()
                };
                format!("('hook', '{}', {key})", payload(k))
            })
            .collect();
        exec(
            setup.pool(),
            format!(
                "INSERT INTO {table} (channel, payload, ordering_key) VALUES {}",
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
    prepare_table(url, table, n, analyze, 0).await?;
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
        store: store.clone() as Arc<SqlStore>,
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
    prepare_table(url, table, n, true, 0).await?;
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

/// The claim section's instances, by their sink path on the receiver (so at most three).
const INSTANCE_PATHS: [&str; 3] = ["a", "b", "c"];
/// The longest one claim-mode run may take.
const CLAIM_RUN_LIMIT: Duration = Duration::from_secs(40);
/// Distinct ordering keys in the keyed claim runs (assigned round-robin).
const ORDERING_KEYS: usize = 200;
/// The short `relay.poll_interval` of the keyed diagnostic run (the default is 500ms).
const KEYED_DIAGNOSTIC_POLL: Duration = Duration::from_millis(20);
/// Each claim-mode instance's `batch_size` and `max_in_flight` (as the leader section's main
/// run; the sink's concurrency is set to `max_in_flight`).
const CLAIM_BATCH: u32 = 100;
const CLAIM_IN_FLIGHT: u32 = 64;

/// What one claim-mode run measured.
#[derive(Debug, Clone)]
struct ClaimRun {
    rows: usize,
    instances: usize,
    /// Distinct ordering keys (0: no row has one).
    keys: usize,
    /// `relay.poll_interval` when set for the run (diagnostic); else the default (500ms).
    poll_interval: Option<Duration>,
    rows_per_sec: f64,
    halves: Option<(f64, f64)>,
    /// Requests each instance's sink made (from its receiver path), in instance order.
    shares: Vec<u64>,
    received: u64,
    /// Requests whose `webhook-id` the receiver had already seen in this run.
    repeats: u64,
    /// Statements of all instances' stores together.
    statements: u64,
    /// Times an instance's readiness was seen going false (a failed claim: the loop then
    /// backs off for at least 500ms), sampled every few milliseconds.
    claim_failures: u64,
    cpu: Option<(f64, f64)>,
}

impl ClaimRun {
    fn label(&self) -> String {
        let keys = if self.keys == 0 {
            "unkeyed".to_string()
        } else {
            format!("{} keys", self.keys)
        };
        let poll = self
            .poll_interval
            .map(|p| format!(" poll {}ms", p.as_millis()))
            .unwrap_or_default();
        format!("{} inst {keys}{poll}", self.instances)
    }

    fn shares(&self) -> String {
        let counts: Vec<String> = self.shares.iter().map(|c| c.to_string()).collect();
        let total: u64 = self.shares.iter().sum::<u64>().max(1);
        let pct: Vec<String> = self
            .shares
            .iter()
            .map(|c| format!("{:.0}%", *c as f64 * 100.0 / total as f64))
            .collect();
        format!("{} ({})", counts.join("/"), pct.join("/"))
    }
}

/// How one claim-mode run is set up.
#[derive(Debug, Clone, Copy)]
struct ClaimSetup {
    instances: usize,
    /// Distinct ordering keys, round-robin (0: none).
    keys: usize,
    /// Diagnostic: `relay.poll_interval` for every instance (None: the default).
    poll_interval: Option<Duration>,
}

impl ClaimSetup {
    fn new(instances: usize, keys: usize) -> ClaimSetup {
        ClaimSetup {
            instances,
            keys,
            poll_interval: None,
        }
    }
}

/// Runs `instances` claim-mode relays in this process, each with its own pool, sinks and
/// instance id, over one table of `n` pre-inserted rows, until all are SUCCESS.
async fn claim_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    n: usize,
    setup: ClaimSetup,
) -> anyhow::Result<ClaimRun> {
    let table = unique_table("claim");
    let result = claim_run_on(db, url, &table, receiver, n, setup).await;
    let dialect = (db == Db::Postgres).then_some(Dialect::Postgres);
    drop_table(url, &table, dialect).await;
    result
}

async fn claim_run_on(
    db: Db,
    url: &str,
    table: &str,
    receiver: &Receiver,
    n: usize,
    setup: ClaimSetup,
) -> anyhow::Result<ClaimRun> {
    let ClaimSetup {
        instances,
        keys,
        poll_interval,
    } = setup;
    if instances == 0 || instances > INSTANCE_PATHS.len() {
        bail!("instances must be 1..={}", INSTANCE_PATHS.len());
    }
    prepare_table(url, table, n, true, keys).await?;
    let dir = tempfile::tempdir()?;
    let config_file = dir.path().join("bench.toml");
    std::fs::write(&config_file, "")?;

    let shutdown = CancellationToken::new();
    // Whatever way this function returns, the instances and their LISTEN sessions stop.
    let _stop_all = shutdown.clone().drop_guard();
    let mut relays = Vec::with_capacity(instances);
    let mut stores = Vec::with_capacity(instances);
    let mut healths = Vec::with_capacity(instances);
    for (i, path) in INSTANCE_PATHS.iter().enumerate().take(instances) {
        let env: BTreeMap<String, String> = [
            ("OUTBOX_RELAY__DATABASE__URL", url.to_string()),
            ("OUTBOX_RELAY__DATABASE__TABLE", table.to_string()),
            ("OUTBOX_RELAY__HTTP__LISTEN", String::new()),
            ("OUTBOX_RELAY__RELAY__INSTANCE_ID", format!("bench-{path}")),
            ("OUTBOX_RELAY__RELAY__MODE", "claim".to_string()),
            ("OUTBOX_RELAY__RELAY__BATCH_SIZE", CLAIM_BATCH.to_string()),
            (
                "OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT",
                CLAIM_IN_FLIGHT.to_string(),
            ),
            ("OUTBOX_RELAY__LEASE__BACKEND", "none".to_string()),
            ("OUTBOX_RELAY__SINKS__HOOK__KIND", "webhook".to_string()),
            ("OUTBOX_RELAY__SINKS__HOOK__URL", receiver.instance_url(i)),
            ("OUTBOX_RELAY__SINKS__HOOK__TIMEOUT", "10s".to_string()),
            (
                "OUTBOX_RELAY__SINKS__HOOK__CONCURRENCY",
                CLAIM_IN_FLIGHT.to_string(),
            ),
        ]
        .into_iter()
        .chain(poll_interval.map(|p| {
            (
                "OUTBOX_RELAY__RELAY__POLL_INTERVAL",
                format!("{}ms", p.as_millis()),
            )
        }))
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
        let wake = Arc::new(Notify::new());
        if db == Db::Postgres && settings.database.listen {
            tokio::spawn(store::listen(
                url.to_string(),
                table.to_string(),
                wake.clone(),
                shutdown.clone(),
            ));
        }
        let health = Arc::new(Health::default());
        health.set_database(true);
        relays.push(Relay {
            store: store.clone() as Arc<SqlStore>,
            sinks,
            settings: settings.relay.clone(),
            lease: None,
            wake,
            health: health.clone(),
            shutdown: shutdown.clone(),
        });
        healths.push(health);
        stores.push(store);
    }
    let probe = SqlStore::connect(url, table, 1, Duration::from_secs(5)).await?;

    let received_before = receiver.count();
    let shares_before = receiver.instance_counts();
    let repeats_before = receiver.reset_seen();
    let statements_before: u64 = stores.iter().map(|s| s.statements()).sum();
    let cpu_before = CpuSnap::take();
    let started = Instant::now();
    let tasks: Vec<_> = relays
        .into_iter()
        .map(|relay| tokio::spawn(relay.run()))
        .collect();

    let deadline = started + CLAIM_RUN_LIMIT;
    let mut half_at: Option<Duration> = None;
    let mut was_ok = vec![true; instances];
    let mut claim_failures = 0u64;
    let outcome: anyhow::Result<()> = loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        for (ok, health) in was_ok.iter_mut().zip(&healths) {
            let now_ok = health.database_ok();
            if *ok && !now_ok {
                claim_failures += 1;
            }
            *ok = now_ok;
        }
        let received = receiver.count() - received_before;
        if half_at.is_none() && received >= n as u64 / 2 {
            half_at = Some(started.elapsed());
        }
        if Instant::now() > deadline {
            let counts = status_counts(probe.pool(), table).await;
            break Err(anyhow::anyhow!(
                "rows did not all reach SUCCESS within {CLAIM_RUN_LIMIT:?}: received {received} of {n}, table: {counts}"
            ));
        }
        if tasks.iter().any(|t| t.is_finished()) {
            break Err(anyhow::anyhow!("a relay loop ended by itself"));
        }
        if received < n as u64 {
            continue;
        }
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
    let statements = stores.iter().map(|s| s.statements()).sum::<u64>() - statements_before;
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
    let stop_by = tokio::time::Instant::now() + Duration::from_secs(30);
    for task in tasks {
        if tokio::time::timeout_at(stop_by, task).await.is_err() {
            eprintln!("warning: a claim-mode relay did not stop within 30s of shutdown");
            break;
        }
    }
    let received = receiver.count() - received_before;
    let shares = receiver
        .instance_counts()
        .iter()
        .zip(&shares_before)
        .take(instances)
        .map(|(after, before)| after - before)
        .collect();
    let repeats = receiver.reset_seen() - repeats_before;
    for store in &stores {
        store.pool().close().await;
    }
    probe.pool().close().await;
    outcome?;
    Ok(ClaimRun {
        rows: n,
        instances,
        keys,
        poll_interval,
        rows_per_sec: n as f64 / elapsed.as_secs_f64(),
        halves,
        shares,
        received,
        repeats,
        statements,
        claim_failures,
        cpu,
    })
}

/// One database's claim-mode figures, for the final table.
struct ClaimSection {
    db: Db,
    /// Unkeyed runs by instance count (1, 2, 3; a failed run is missing).
    scaling: Vec<ClaimRun>,
    /// The same on rows with ordering keys (1 and 3 instances).
    keyed: Vec<ClaimRun>,
    errors: Vec<String>,
    skipped: Option<String>,
}

impl ClaimSection {
    fn unkeyed(&self, instances: usize) -> Option<&ClaimRun> {
        self.scaling.iter().find(|r| r.instances == instances)
    }
}

fn print_claim(db: Db, r: &ClaimRun, base: Option<&ClaimRun>) {
    let failures = if r.claim_failures > 0 {
        format!("  FAILED CLAIMS {}", r.claim_failures)
    } else {
        String::new()
    };
    let ratio = base
        .filter(|b| b.rows_per_sec > 0.0)
        .map(|b| {
            let of = if r.keys == 0 {
                "of 1 inst".to_string()
            } else {
                format!("of {} inst unkeyed", b.instances)
            };
            format!("  {:.2}x {of}", r.rows_per_sec / b.rows_per_sec)
        })
        .unwrap_or_default();
    println!(
        "  {:<8} claim     {:<16} rows {:>6}: {:>6.0} rows/s{}{ratio}  shares {}  statements/row {:.4} ({} stmts)  received {}{failures}{}",
        db.name(),
        r.label(),
        r.rows,
        r.rows_per_sec,
        r.halves
            .map(|(a, b)| format!(" (halves {a:.0}/{b:.0})"))
            .unwrap_or_default(),
        r.shares(),
        r.statements as f64 / r.rows as f64,
        r.statements,
        r.received,
        fmt_cpu(r.cpu),
    );
}

/// Claim mode on one database: 1, 2 and 3 instances on unkeyed rows, then 1 and 3 instances
/// on rows with ordering keys.
async fn run_claim_section(db: Db, receiver: &Receiver, rows: usize) -> ClaimSection {
    let mut s = ClaimSection {
        db,
        scaling: Vec::new(),
        keyed: Vec::new(),
        errors: Vec::new(),
        skipped: None,
    };
    // Only PostgreSQL and MySQL/MariaDB run here; the path is for SQLite's file.
    let url = db.url(&std::env::temp_dir());
    match SqlStore::connect(&url, "bench_probe", 1, Duration::from_secs(3)).await {
        Ok(store) => store.pool().close().await,
        Err(e) => {
            let msg = format!("{} at {url} unreachable: {e}", db.name());
            println!("SKIPPED: {msg}");
            s.skipped = Some(msg);
            return s;
        }
    }
    println!(
        "== {}: claim mode, {rows} rows per run, each instance batch {CLAIM_BATCH} max_in_flight {CLAIM_IN_FLIGHT}, own pool and receiver path",
        db.name()
    );
    for instances in 1..=INSTANCE_PATHS.len() {
        match claim_run(db, &url, receiver, rows, ClaimSetup::new(instances, 0)).await {
            Ok(r) => {
                print_claim(db, &r, s.unkeyed(1).filter(|_| instances > 1));
                s.scaling.push(r);
            }
            Err(e) => {
                println!(
                    "  {:<8} claim     {instances} inst unkeyed ERROR: {e:#}",
                    db.name()
                );
                s.errors
                    .push(format!("claim {instances} inst unkeyed: {e:#}"));
            }
        }
    }
    // Ordering on: the same runs on keyed rows, then a diagnostic with a short poll interval
    // (a claim that comes back short, as when most keys' heads are in flight, makes the loop
    // sleep poll_interval; this shows how much of the cost is that sleep).
    let keyed = [
        ClaimSetup::new(1, ORDERING_KEYS),
        ClaimSetup::new(INSTANCE_PATHS.len(), ORDERING_KEYS),
        ClaimSetup {
            poll_interval: Some(KEYED_DIAGNOSTIC_POLL),
            ..ClaimSetup::new(1, ORDERING_KEYS)
        },
    ];
    for setup in keyed {
        match claim_run(db, &url, receiver, rows, setup).await {
            Ok(r) => {
                print_claim(db, &r, s.unkeyed(setup.instances));
                s.keyed.push(r);
            }
            Err(e) => {
                let poll = setup
                    .poll_interval
                    .map(|p| format!(" poll {}ms", p.as_millis()))
                    .unwrap_or_default();
                let what = format!("{} inst {} keys{poll}", setup.instances, setup.keys);
                println!("  {:<8} claim     {what} ERROR: {e:#}", db.name());
                s.errors.push(format!("claim {what}: {e:#}"));
            }
        }
    }
    s
}

/// The claim section's lines of the final summary.
fn print_claim_summary(s: &ClaimSection) -> bool {
    if let Some(why) = &s.skipped {
        println!("{:<9} claim skipped: {why}", s.db.name());
        return true;
    }
    let base = s.unkeyed(1).map(|r| r.rows_per_sec);
    let mut line = format!("{:<9} claim", s.db.name());
    for n in 1..=INSTANCE_PATHS.len() {
        match s.unkeyed(n) {
            Some(r) => {
                line.push_str(&format!("  {n} inst {:.0} rows/s", r.rows_per_sec));
                if let (true, Some(b)) = (n > 1, base.filter(|b| *b > 0.0)) {
                    line.push_str(&format!(" ({:.2}x)", r.rows_per_sec / b));
                }
            }
            None => line.push_str(&format!("  {n} inst -")),
        }
    }
    if let Some(r) = s.scaling.iter().max_by_key(|r| r.instances)
        && r.instances > 1
    {
        line.push_str(&format!("  shares({} inst) {}", r.instances, r.shares()));
    }
    if !s.keyed.is_empty() {
        line.push_str(&format!("  ordering({ORDERING_KEYS} keys)"));
    }
    for r in &s.keyed {
        let poll = r
            .poll_interval
            .map(|p| format!(" poll {}ms", p.as_millis()))
            .unwrap_or_default();
        line.push_str(&format!(
            " {} inst{poll} {:.0}",
            r.instances, r.rows_per_sec
        ));
        if let Some(b) = s.unkeyed(r.instances).filter(|b| b.rows_per_sec > 0.0) {
            line.push_str(&format!(
                " ({:.2}x of unkeyed)",
                r.rows_per_sec / b.rows_per_sec
            ));
        }
    }
    println!("{line}");
    for r in s.scaling.iter().chain(&s.keyed) {
        if r.received != r.rows as u64 || r.repeats > 0 {
            println!(
                "{:<9}   NOTE: {}: receiver counted {} requests for {} rows, {} of them for an id already received",
                "",
                r.label(),
                r.received,
                r.rows,
                r.repeats
            );
        }
        if r.claim_failures > 0 {
            println!(
                "{:<9}   NOTE: {}: {} failed claims (an instance's readiness went false; each costs a backoff of at least 500ms)",
                "",
                r.label(),
                r.claim_failures
            );
        }
    }
    for e in &s.errors {
        println!("{:<9}   ERROR claim {e}", s.db.name());
    }
    s.errors.is_empty()
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
    let wanted_sections =
        std::env::var("OUTBOX_RELAY_BENCH_SECTIONS").unwrap_or_else(|_| "leader,claim".into());
    let section_on = |name: &str| wanted_sections.split(',').any(|w| w.trim() == name);
    let claim_rows: usize = std::env::var("OUTBOX_RELAY_BENCH_CLAIM_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
        .max(1);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);

    let receiver = match Receiver::start().await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the loopback receiver: {e:#}");
            return false;
        }
    };
    println!(
        "outbox-relay throughput bench: receiver {} (204, no work); {} worker threads; tracing and metrics recorder not installed",
        receiver.url, cores
    );
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "?".into())
    };
    let load_at_start = load();
    let bench_started = Instant::now();
    let mut sections = Vec::new();
    if section_on("leader") {
        for &db in &dbs {
            let rows = if db == Db::Postgres {
                base_rows
            } else {
                (base_rows / 2).max(1000)
            };
            sections.push(run_section(db, &receiver, rows).await);
        }
    }
    let leader_secs = bench_started.elapsed().as_secs_f64();
    let mut claim_sections = Vec::new();
    let mut claim_secs = 0.0;
    if section_on("claim") {
        let claim_started = Instant::now();
        for &db in dbs.iter().filter(|d| **d != Db::Sqlite) {
            claim_sections.push(run_claim_section(db, &receiver, claim_rows).await);
        }
        claim_secs = claim_started.elapsed().as_secs_f64();
    }
    receiver.stop.cancel();

    println!();
    println!(
        "load average at start {load_at_start}, at end {} (other work on this machine skews absolute figures; compare ratios)",
        load()
    );
    if !sections.is_empty() {
        println!(
            "== summary (leader section {leader_secs:.0}s, bench total {:.0}s; relay = rows/s until all SUCCESS in the database; naive = select-one/POST/update-one loop on the same database over fewer rows; ceiling = POSTs alone at the same concurrency)",
            bench_started.elapsed().as_secs_f64()
        );
    }
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
    if !sections.is_empty() {
        println!(
            "* sink concurrency left at its default (32), which then caps max_in_flight; elsewhere it is set to max_in_flight."
        );
    }
    if !claim_sections.is_empty() {
        println!(
            "== claim summary ({claim_secs:.0}s; rows/s until all SUCCESS; N inst = N claim-mode relays in this process, each with its own pool, sinks, instance id and receiver path; (x) = ratio to 1 inst in this run; shares = requests per instance a/b/c; ordering = rows with {ORDERING_KEYS} ordering keys round-robin vs unkeyed rows, same instance count)"
        );
        for s in &claim_sections {
            ok &= print_claim_summary(s);
        }
        println!(
            "note: the claim-mode instances share this machine's {cores} CPU(s) with each other, the database server and the receiver: 2 and 3 instances add contention on the SQL claim path and its locks, not CPUs, so the ratios show how the claim path scales (or degrades) under concurrency, not what more machines would give."
        );
    }
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
