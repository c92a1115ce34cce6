//! Throughput benchmark: the relay against a fast loopback webhook receiver, on PostgreSQL,
//! MariaDB/MySQL and SQLite, next to two references measured in the same run (the machine is
//! shared and noisy, so only ratios within one run mean much):
//!
//! - **naive**: the "select one due row, POST it, mark it SUCCESS" loop many hand-rolled
//!   pollers use, one row at a time, same HTTP client settings as the webhook sink;
//! - **ceiling**: the receiver alone, POSTed to from as many concurrent loops as the sink's
//!   default sends at once, with no database at all; measured right before and right after
//!   the main run (and around the relay binary's runs), and the share taken against the mean,
//!   since this machine's speed drifts within a minute.
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
//! default `concurrency` (64), the planner's statistics (`no-ANALYZE`: the table as a bulk
//! insert leaves it), ordering keys (`200 keys`: the defaults on rows of 200 keys,
//! round-robin, fewer keys than rows in flight) and payloads of 1 KiB (`payload 1024 B`: the
//! defaults on payloads the size of a push message; the main run's are about 75 bytes).
//! PostgreSQL diagnostics pass settings to the
//! relay's sessions through the URL's `options` (never recommended settings, only to show what
//! a cost is): `custom_plans` (`plan_cache_mode=force_custom_plan`: every execution planned
//! again, as PostgreSQL chose for the claim before the relay asked for generic plans),
//! `plan=due_idx` (`enable_sort` and `enable_bitmapscan` off, which leaves the claim the
//! partial index in id order) and `sync_commit=off` (commits do not wait for the WAL flush).
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
//! The **latency** section inserts rows one per transaction at 100 and 1,000 rows/s into an
//! empty table served by one relay with the defaults, and times each from its commit to its
//! arrival at the receiver (NOTIFY wakes the relay on PostgreSQL; elsewhere the newest-id
//! check does). The **memory** section runs the release binary as its own process with the
//! defaults and reads its resident memory idle and at its peak while draining a backlog. The
//! **idle** section runs it with the defaults on an empty table and reads how many statements
//! the database server executed for it per second (PostgreSQL and MariaDB). The run ends with
//! one markdown table of every figure.
//!
//! Run: `cargo bench --bench throughput`. Environment knobs:
//! - `OUTBOX_RELAY_BENCH_ROWS` rows for the main relay run (default 20000 on PostgreSQL,
//!   half that on the others; variations and the naive loop use fewer, stated in the output);
//! - `OUTBOX_RELAY_BENCH_DBS` comma-separated subset of `postgres,mysql,sqlite`;
//! - `OUTBOX_RELAY_BENCH_SECTIONS` comma-separated subset of
//!   `leader,claim,latency,memory,idle` (default all);
//! - `OUTBOX_RELAY_BENCH_VARIATIONS` `batch/in_flight/concurrency[/noanalyze],...` replaces the
//!   leader section's variations (for exploring settings);
//! - `OUTBOX_RELAY_BENCH_CLAIM_ROWS` rows per claim-section run (default 10000);
//! - `OUTBOX_RELAY_BENCH_RECEIVER=node` receives with Node's http server in its own process
//!   (`receiver.js`, as the performance targets were first measured) instead of the
//!   in-process receiver; the claim and latency sections are then skipped;
//! - `OUTBOX_RELAY_TEST_POSTGRES_URL`, `OUTBOX_RELAY_TEST_MYSQL_URL` as for the tests.
//!
//! A database that cannot be reached is skipped with a message. Every run is bounded in time;
//! a run whose rows do not all finish is reported as an error (with the row counts by status)
//! and the bench exits non-zero at the end.

/// The relay binary's allocator (src/main.rs), so the relay in this process runs as it does
/// in its own.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod claim;
mod cpu;
mod db;
mod idle;
mod latency;
mod leader;
mod memory;
mod references;
mod report;
/// The integration tests' toolkit (databases, receivers); the bench uses part of it.
#[allow(dead_code, unused_macros)]
#[path = "../../tests/it/support/mod.rs"]
mod support;
mod trace_overhead;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use outbox_relay::config::Settings;
use outbox_relay::lease;
use outbox_relay::relay::{self, Relay};
use outbox_relay::sink::SinkRegistry;
use outbox_relay::store::{self, Dialect, SqlStore};
use outbox_relay::telemetry::Health;
use sqlx::{Connection, Row};
use tokio_util::sync::CancellationToken;

use claim::*;
use cpu::*;
use db::*;
use idle::*;
use latency::*;
use leader::*;
use memory::*;
use references::*;
use support::Db;
use support::config::Config;
use trace_overhead::*;

/// A relay assembled in this process as `outbox-relay run` assembles it (`relay::assemble`:
/// its arrival watcher, and its lease, none unless `config` asks for one), without HTTP
/// endpoints: `config` is written to `dir` and loaded as the binary loads its file. Returns
/// the relay (not yet running; see [`spawn_relay_task`]), its store and its health.
async fn assemble(
    url: &str,
    table: &str,
    instance: &str,
    config: &Config,
    dir: &std::path::Path,
    shutdown: &CancellationToken,
) -> anyhow::Result<(Assembled, Arc<SqlStore>, Arc<Health>)> {
    let file = config.write(dir, &format!("{instance}.toml"));
    let env: BTreeMap<String, String> = [
        ("OUTBOX_RELAY__DATABASE__URL", url),
        ("OUTBOX_RELAY__DATABASE__TABLE", table),
        ("OUTBOX_RELAY__HTTP__LISTEN", ""),
        ("OUTBOX_RELAY__RELAY__INSTANCE_ID", instance),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let settings = Settings::load_with_env(Some(&file), Some(env))
        .map_err(|e| anyhow::anyhow!("settings: {e}"))?;
    let sinks = Arc::new(SinkRegistry::build(&settings)?);
    // As `run` wires it: the store is opened, and claims and results run, on the database
    // thread.
    let (u, t) = (url.to_string(), table.to_string());
    let (max, timeout) = (
        settings.database.max_connections,
        settings.database.connect_timeout,
    );
    let store = store::on_db_thread(async move {
        let store = Arc::new(SqlStore::connect(&u, &t, max, timeout).await?);
        store.warm(store::WARM_CONNECTIONS).await?;
        anyhow::Ok(store)
    })
    .await?;
    let health = Arc::new(Health::default());
    health.set_database(true);
    let relay = relay::assemble(&settings, &store, sinks, health.clone(), shutdown.clone())?;
    Ok((relay, store, health))
}

/// A relay and the keeper of its lease, if it has one.
type Assembled = (Relay, Option<lease::Keeper>);

/// `benches/throughput/receiver.js` under `node`, killed when dropped.
struct NodeReceiver(std::process::Child);

impl NodeReceiver {
    /// Starts the script and waits for the port it prints.
    fn start() -> anyhow::Result<(Receiver, NodeReceiver)> {
        use std::io::BufRead;
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/throughput/receiver.js"
        );
        let mut child = std::process::Command::new("node")
            .arg(script)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("spawn node (OUTBOX_RELAY_BENCH_RECEIVER=node needs Node.js on PATH)")?;
        let stdout = child.stdout.take().context("node's stdout")?;
        let guard = NodeReceiver(child);
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        let port: u16 = line
            .trim()
            .parse()
            .with_context(|| format!("node printed {line:?}, not a port"))?;
        Ok((
            Receiver::external(&format!("http://127.0.0.1:{port}"))?,
            guard,
        ))
    }
}

impl Drop for NodeReceiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The runtime the relays under test run on, built as the binary builds its own
/// (`outbox_relay::runtime::build`: one worker fewer than the cores, the last left to the
/// database thread), so that their figures are the binary's. The bench's own work (the
/// in-process receiver, the ceiling's client, the watching) stays on the bench's runtime.
fn relay_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| outbox_relay::runtime::build().expect("the relay's runtime"))
}

/// Starts a relay under test on [`relay_runtime`]; it releases its lease, if any, after its
/// drain, as `run` does.
fn spawn_relay_task((relay, keeper): Assembled) -> tokio::task::JoinHandle<()> {
    relay_runtime().spawn(relay.run_then_release(keeper))
}

/// Whether `db` at `url` answers at all; `Err` with the message printed as SKIPPED when
/// not.
async fn reachable(db: Db, url: &str) -> Result<(), String> {
    match SqlStore::connect(url, "bench_probe", 1, Duration::from_secs(3)).await {
        Ok(store) => {
            store.pool().close().await;
            Ok(())
        }
        Err(e) => {
            let msg = format!("{} at {url} unreachable: {e}", db.name());
            println!("SKIPPED: {msg}");
            Err(msg)
        }
    }
}

/// Reports a failed run of `kind` (`relay`, `naive`, `variation`, `claim`), `what` it was
/// (empty for a run of its own kind): a line in the run's column, and an entry in `errors`
/// for the summary.
fn run_failed(db: Db, kind: &str, what: &str, e: &anyhow::Error, errors: &mut Vec<String>) {
    let (line, entry) = if what.is_empty() {
        (String::new(), kind.to_string())
    } else {
        (format!("{what} "), format!("{kind} {what}"))
    };
    println!("  {:<8} {kind:<9} {line}ERROR: {e:#}", db.name());
    errors.push(format!("{entry}: {e:#}"));
}

/// A unique table name for one run.
fn unique_table(tag: &str) -> String {
    support::unique_table(&format!("bench_{tag}"))
}
use support::counting::{INSTANCE_PATHS, Receiver, SLOW_REPLY};

/// Rows per multi-row INSERT when preparing a table.
const INSERT_CHUNK: usize = 1000;
/// The longest a relay run may take before it is declared stuck.
const RELAY_RUN_LIMIT: Duration = Duration::from_secs(60);
/// The longest the naive loop runs; it reports the rate over the rows it managed.
const NAIVE_RUN_LIMIT: Duration = Duration::from_secs(15);
/// The longest the ceiling run may take.
const CEILING_RUN_LIMIT: Duration = Duration::from_secs(30);
/// The latency runs: (rows per second, seconds).
const LATENCY_RATES: [(u32, u32); 2] = [(100, 5), (1000, 5)];
/// A webhook sink's default `concurrency` (the sends at once), which the ceiling run uses.
const DEFAULT_SINK_CONCURRENCY: u32 = outbox_relay::config::DEFAULT_CONCURRENCY;
/// Requests sent to the Node receiver before anything is measured (see `main`).
const NODE_WARM_UP: usize = 150_000;
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

/// What to run, from the environment (see the module's knobs).
struct Plan {
    /// Rows of the main relay run on PostgreSQL (half that, at least 1,000, elsewhere).
    base_rows: usize,
    dbs: Vec<Db>,
    /// `OUTBOX_RELAY_BENCH_SECTIONS`, comma-separated.
    sections: String,
    claim_rows: usize,
    cores: usize,
    /// The Node receiver instead of the in-process one.
    node: bool,
}

impl Plan {
    fn from_env() -> Plan {
        let base_rows: usize = std::env::var("OUTBOX_RELAY_BENCH_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let wanted = std::env::var("OUTBOX_RELAY_BENCH_DBS")
            .unwrap_or_else(|_| "postgres,mysql,sqlite".into());
        let dbs: Vec<Db> = [Db::Postgres, Db::MySql, Db::Sqlite]
            .into_iter()
            .filter(|d| wanted.split(',').any(|w| w.trim() == d.name()))
            .collect();
        let sections = std::env::var("OUTBOX_RELAY_BENCH_SECTIONS")
            .unwrap_or_else(|_| "leader,claim,latency,memory,idle".into());
        let claim_rows: usize = std::env::var("OUTBOX_RELAY_BENCH_CLAIM_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000)
            .max(1);
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0);
        let node = std::env::var("OUTBOX_RELAY_BENCH_RECEIVER").is_ok_and(|v| v == "node");
        Plan {
            base_rows,
            dbs,
            sections,
            claim_rows,
            cores,
            node,
        }
    }

    fn section_on(&self, name: &str) -> bool {
        self.sections.split(',').any(|w| w.trim() == name)
    }

    /// The main run's rows on `db` (also the latency section's backlog and the binary's
    /// drain).
    fn rows(&self, db: Db) -> usize {
        if db == Db::Postgres {
            self.base_rows
        } else {
            (self.base_rows / 2).max(1000)
        }
    }
}

/// Every section's figures, for the summaries.
#[derive(Default)]
struct Figures {
    sections: Vec<Section>,
    claim_sections: Vec<ClaimSection>,
    latencies: Vec<(Db, Vec<Latency>, Option<UnderBacklog>)>,
    memory: Vec<(Db, Rss)>,
    starts: Vec<(Db, Start)>,
    idles: Vec<(Db, f64)>,
    leader_secs: f64,
    claim_secs: f64,
}

async fn bench() -> bool {
    let plan = Plan::from_env();
    let Some((receiver, _node)) = start_receiver(&plan).await else {
        return false;
    };
    let load_at_start = load();
    let bench_started = Instant::now();
    let mut figures = Figures::default();
    if plan.section_on("leader") {
        for &db in &plan.dbs {
            let section = run_section(db, &receiver, plan.rows(db)).await;
            figures.sections.push(section);
        }
    }
    figures.leader_secs = bench_started.elapsed().as_secs_f64();
    if plan.section_on("claim") && !plan.node {
        let claim_started = Instant::now();
        for &db in plan.dbs.iter().filter(|d| **d != Db::Sqlite) {
            let section = run_claim_section(db, &receiver, plan.claim_rows).await;
            figures.claim_sections.push(section);
        }
        figures.claim_secs = claim_started.elapsed().as_secs_f64();
    }
    if plan.section_on("latency") && !plan.node {
        figures.latencies = latency_section(&plan, &receiver).await;
    }
    if plan.section_on("memory") {
        (figures.memory, figures.starts) = binary_section(&plan, &receiver).await;
    }
    if plan.section_on("idle") {
        figures.idles = idle_section(&plan, &receiver).await;
    }
    drop(receiver);

    println!();
    println!(
        "load average at start {load_at_start}, at end {} (other work on this machine skews absolute figures; compare ratios)",
        load()
    );
    let ok = print_summary(&plan, &figures, bench_started);
    report::print_markdown(
        &figures.sections,
        &figures.claim_sections,
        &figures.latencies,
        &figures.memory,
        &figures.starts,
        &figures.idles,
        plan.cores,
    );
    if figures
        .sections
        .iter()
        .any(|s| s.db == Db::Postgres && s.main.is_some())
    {
        println!(
            "note: xacts/row comes from pg_stat_database for the whole database; other sessions running at the same time add to it."
        );
    }
    ok
}

/// The machine's load average (1, 5 and 15 minutes).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Starts the receiver the plan asks for (warming Node's first) and says what it is; `None`
/// when it cannot start.
async fn start_receiver(plan: &Plan) -> Option<(Receiver, Option<NodeReceiver>)> {
    let started_receiver = if plan.node {
        NodeReceiver::start().map(|(r, child)| (r, Some(child)))
    } else {
        Receiver::start().await.map(|r| (r, None))
    };
    let (receiver, node) = match started_receiver {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the loopback receiver: {e:#}");
            return None;
        }
    };
    let kind = if plan.node {
        "Node's http server, its own process"
    } else {
        "in this process"
    };
    println!(
        "outbox-relay throughput bench: receiver {} (204, no work; {kind}); {} worker threads; tracing and metrics recorder not installed",
        receiver.url, plan.cores
    );
    if plan.node {
        // Node compiles its request path as it goes, which makes the first database's
        // ceiling low unless Node is warmed first (docs/performance-log.md).
        let _ = references::ceiling_run(&receiver, NODE_WARM_UP, DEFAULT_SINK_CONCURRENCY).await;
    }
    if plan.node && (plan.section_on("claim") || plan.section_on("latency")) {
        println!(
            "note: the claim and latency sections need the in-process receiver; skipped with OUTBOX_RELAY_BENCH_RECEIVER=node"
        );
    }
    Some((receiver, node))
}

/// The latency section: rows committed one by one at each of [`LATENCY_RATES`], and a few
/// committed while a backlog as large as the main run's drains.
async fn latency_section(
    plan: &Plan,
    receiver: &Receiver,
) -> Vec<(Db, Vec<Latency>, Option<UnderBacklog>)> {
    let mut latencies = Vec::new();
    for &db in &plan.dbs {
        let Ok(dir) = tempfile::tempdir() else {
            continue;
        };
        let url = db.url(dir.path());
        let mut runs = Vec::new();
        for (rate, seconds) in LATENCY_RATES {
            match latency_run(db, &url, receiver, rate, seconds).await {
                Ok(l) => {
                    println!(
                        "  {:<8} latency   {rate:>5} rows/s, one per transaction, {} rows: p50 / p99 / max {} ms",
                        db.name(),
                        l.rows,
                        l.cell()
                    );
                    runs.push(l);
                }
                Err(e) => {
                    println!("  {:<8} latency   {rate} rows/s ERROR: {e:#}", db.name());
                }
            }
        }
        // A row committed while the relay drains a backlog as large as the main run's.
        let backlog = plan.rows(db);
        let under = match under_backlog_run(db, &url, receiver, backlog).await {
            Ok(u) => {
                println!(
                    "  {:<8} latency   {} rows committed one by one while {backlog} rows drain: worst {} ahead of it; each (ms, backlog rows sent between its commit and its arrival): {}",
                    db.name(),
                    u.rows.len(),
                    u.cell(),
                    u.rows
                        .iter()
                        .map(|(d, n)| format!("{:.1}/{n}", d.as_secs_f64() * 1000.0))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
                Some(u)
            }
            Err(e) => {
                println!("  {:<8} latency   under a backlog ERROR: {e:#}", db.name());
                None
            }
        };
        latencies.push((db, runs, under));
    }
    latencies
}

/// The memory section: the release binary as its own process, draining as many rows as the
/// leader section's main run (its resident memory) and started on them (its first send).
/// Its shares are taken against a ceiling measured around its two runs (see
/// `ceiling_around`), not the leader section's, minutes earlier.
async fn binary_section(plan: &Plan, receiver: &Receiver) -> (Vec<(Db, Rss)>, Vec<(Db, Start)>) {
    let mut memory: Vec<(Db, Rss)> = Vec::new();
    let mut starts: Vec<(Db, Start)> = Vec::new();
    for &db in &plan.dbs {
        let Ok(dir) = tempfile::tempdir() else {
            continue;
        };
        let rows = plan.rows(db);
        let mut errors = Vec::new();
        let before = ceiling_logged(db, receiver, rows, "before the binary", &mut errors).await;
        let mut rss = match rss_run(db, &db.url(dir.path()), receiver, rows).await {
            Ok(r) => {
                println!(
                    "  {:<8} memory    the relay binary, defaults: idle {:.1} MiB resident, peak {:.1} MiB draining {rows} rows ({:.0} rows/s)",
                    db.name(),
                    r.idle_kib as f64 / 1024.0,
                    r.peak_kib as f64 / 1024.0,
                    r.rows_per_sec
                );
                Some(r)
            }
            Err(e) => {
                println!("  {:<8} memory    ERROR: {e:#}", db.name());
                None
            }
        };
        let mut start = match start_run(db, &db.url(dir.path()), receiver, rows).await {
            Ok(r) => {
                println!(
                    "  {:<8} start     the relay binary, defaults (database lease), started on {rows} waiting rows: first send after {:.0} ms, {:.0} rows/s from the start",
                    db.name(),
                    r.first_send.as_secs_f64() * 1000.0,
                    r.rows_per_sec
                );
                Some(r)
            }
            Err(e) => {
                println!("  {:<8} start     ERROR: {e:#}", db.name());
                None
            }
        };
        let after = ceiling_logged(db, receiver, rows, "after the binary", &mut errors).await;
        for e in errors {
            println!("  {:<8} {e}", db.name());
        }
        let ceiling = ceiling_around((before, after));
        if let Some(r) = rss.as_mut() {
            r.ceiling = ceiling;
        }
        if let Some(r) = start.as_mut() {
            r.ceiling = ceiling;
        }
        memory.extend(rss.map(|r| (db, r)));
        starts.extend(start.map(|r| (db, r)));
    }
    (memory, starts)
}

/// The idle section: the release binary on an empty table, statements per second at the
/// server.
async fn idle_section(plan: &Plan, receiver: &Receiver) -> Vec<(Db, f64)> {
    let mut idles: Vec<(Db, f64)> = Vec::new();
    for &db in &plan.dbs {
        let Ok(dir) = tempfile::tempdir() else {
            continue;
        };
        match idle_run(db, &db.url(dir.path()), receiver).await {
            Ok(Some(per_sec)) => {
                println!(
                    "  {:<8} idle      the relay binary, defaults (database lease), nothing to do: {per_sec:.1} statements/s as the server counts them",
                    db.name()
                );
                idles.push((db, per_sec));
            }
            Ok(None) => {}
            Err(e) => println!("  {:<8} idle      ERROR: {e:#}", db.name()),
        }
    }
    idles
}

/// The plain-text summaries of the leader and claim sections; `false` when a run failed.
fn print_summary(plan: &Plan, figures: &Figures, bench_started: Instant) -> bool {
    let sections = &figures.sections;
    if !sections.is_empty() {
        println!(
            "== summary (leader section {:.0}s, bench total {:.0}s; relay = rows/s until all SUCCESS in the database; naive = select-one/POST/update-one loop on the same database over fewer rows; ceiling = POSTs alone at the same concurrency)",
            figures.leader_secs,
            bench_started.elapsed().as_secs_f64()
        );
    }
    let mut ok = true;
    for s in sections {
        ok &= print_section_summary(s);
    }
    if !sections.is_empty() {
        println!(
            "* sink concurrency left at its default ({DEFAULT_SINK_CONCURRENCY}): the sends at once, with up to as many rows claimed ahead while relay slots are free; elsewhere it is set to max_in_flight."
        );
    }
    if !figures.claim_sections.is_empty() {
        println!(
            "== claim summary ({:.0}s; rows/s until all SUCCESS; N inst = N claim-mode relays in this process, each with its own pool, sinks, instance id and receiver path; (x) = ratio to 1 inst in this run; shares = requests per instance a/b/c; ordering = rows with {ORDERING_KEYS} ordering keys round-robin vs unkeyed rows, same instance count)",
            figures.claim_secs
        );
        for s in &figures.claim_sections {
            ok &= print_claim_summary(s);
        }
        println!(
            "note: the claim-mode instances share this machine's {} CPU(s) with each other, the database server and the receiver: 2 and 3 instances add contention on the SQL claim path and its locks, not CPUs, so the ratios show how the claim path scales (or degrades) under concurrency, not what more machines would give.",
            plan.cores
        );
    }
    ok
}

/// One database's leader-section summary; `false` when a run failed.
fn print_section_summary(s: &Section) -> bool {
    if let Some(why) = &s.skipped {
        println!("{:<9} skipped: {why}", s.db.name());
        return true;
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
    println!(
        "{:<9} relay {} rows/s  naive {} rows/s  relay/naive {}  ceiling {} rows/s  relay/ceiling {}  statements/row {stmts}{}",
        s.db.name(),
        fmt_rate(relay),
        fmt_rate(naive),
        ratio(relay, naive),
        fmt_rate(s.ceiling),
        ratio(relay, s.ceiling),
        xacts_per_row(s.main.as_ref()),
    );
    for v in &s.variations {
        println!(
            "{:<9}   {}: {:>6.0} rows/s  statements/row {:.4}{}",
            "",
            relay_config(v),
            v.rows_per_sec,
            v.statements_per_row(),
            xacts_per_row(Some(v)),
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
    }
    s.errors.is_empty()
}

/// `  xacts/row N` for a run that has the figure (PostgreSQL), else nothing.
fn xacts_per_row(r: Option<&RelayRun>) -> String {
    r.and_then(|r| r.xacts_per_row())
        .map(|x| format!("  xacts/row {x:.4}"))
        .unwrap_or_default()
}
