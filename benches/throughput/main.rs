//! Throughput benchmark: the relay against a fast loopback webhook receiver, on PostgreSQL,
//! MariaDB/MySQL and SQLite, next to two references measured in the same run (the machine is
//! shared and noisy, so only ratios within one run mean much):
//!
//! - **naive**: the "select one due row, POST it, mark it SUCCESS" loop many hand-rolled
//!   pollers use, one row at a time, same HTTP client settings as the webhook sink;
//! - **ceiling**: the receiver alone, with no database: wrk (Debian's `wrk`) at the best of
//!   several connection counts when it is installed, else (and always beside it) the bench's
//!   own client with as many concurrent loops as the sink's default sends at once
//!   (`ceiling.rs`); measured right before and right after the main run (and around the relay
//!   binary's runs), and the share taken against the mean, since this machine's speed drifts
//!   within a minute. The receiver is started and warmed once and serves the whole run.
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
//! insert leaves it) and payloads of 1 KiB (`payload 1024 B`: the
//! defaults on payloads the size of a push message; the main run's are about 75 bytes).
//! The keyed variations (`keyed.rs`) drain backlogs of ordering keys with the defaults: 200
//! keys of 100 rows, 20 keys of 1,000 rows, and as many unkeyed rows mixed into the latter
//! (the unkeyed rows' rate), each as a ratio to unkeyed drains of as many rows made beside it
//! (two pairs; and to the main run) beside its target; 200 keys of 100 rows written key by
//! key (each key's rows one after another); 20,000 rows of a key each; one key.
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
//! defaults and reads its resident memory idle and at its peak while draining a backlog, then
//! times it started on a backlog, unkeyed and of 20 ordering keys five times as long. The
//! **idle** section runs it with the defaults on an empty table and reads how many statements
//! the database server executed for it per second (PostgreSQL and MariaDB). The run ends with
//! markdown tables of every figure, one of them each target beside its figure (`targets.rs`).
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
//! - `OUTBOX_RELAY_BENCH_CEILING=own` measures the ceiling with the bench's own client even
//!   when wrk is installed;
//! - `OUTBOX_RELAY_TEST_POSTGRES_URL`, `OUTBOX_RELAY_TEST_MYSQL_URL` as for the tests.
//!
//! A database that cannot be reached is skipped with a message. Every run is bounded in time;
//! a run whose rows do not all finish is reported as an error (with the row counts by status)
//! and the bench exits non-zero at the end.

/// The relay binary's allocator (src/main.rs), so the relay in this process runs as it does
/// in its own.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod ceiling;
mod claim;
mod cpu;
mod db;
mod idle;
mod keyed;
mod latency;
mod leader;
mod memory;
mod receiver;
mod references;
mod report;
mod summary;
/// The integration tests' toolkit (databases, receivers); the bench uses part of it.
#[allow(dead_code, unused_macros)]
#[path = "../../tests/it/support/mod.rs"]
mod support;
mod targets;
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

use ceiling::*;
use claim::*;
use cpu::*;
use db::*;
use idle::*;
use keyed::*;
use latency::*;
use leader::*;
use memory::*;
use receiver::*;
use references::*;
use summary::*;
use support::Db;
use support::config::Config;
use targets::*;
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
