//! The leader section: one relay over a backlog, its variations, and the references
//! (`references.rs`) measured in the same run.

use super::*;

/// The payload size of the `payload` variation: a push message or a template's parameters.
const PAYLOAD_VARIATION_BYTES: usize = 1024;

/// How one relay run is set up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunConfig {
    pub(crate) batch_size: u32,
    pub(crate) max_in_flight: u32,
    /// The webhook sink's `concurrency` (None: left at its default, 32).
    pub(crate) sink_concurrency: Option<u32>,
    /// Whether the table's statistics are fresh (ANALYZE after the bulk insert) when the run
    /// starts, or as a just-filled table has them (none, or from before the rows arrived).
    pub(crate) analyze: bool,
    /// PostgreSQL only, diagnostic: settings for the relay's sessions, passed in the URL's
    /// `options` (`-c name=value ...`), with a short label. Used to show what the claim's
    /// query plan and the WAL flush at each commit cost; not recommended settings.
    pub(crate) pg_options: Option<(&'static str, &'static str)>,
    /// The backlog's ordering keys and payload size.
    pub(crate) rows: Rows,
    /// `[tracing]` on, exporting to a loopback collector (`trace_overhead.rs`).
    pub(crate) tracing: bool,
}

impl RunConfig {
    pub(crate) fn new(batch_size: u32, max_in_flight: u32) -> RunConfig {
        RunConfig {
            batch_size,
            max_in_flight,
            sink_concurrency: Some(max_in_flight),
            analyze: true,
            pg_options: None,
            rows: Rows::default(),
            tracing: false,
        }
    }
}

/// What one relay run measured.
#[derive(Debug, Clone)]
pub(crate) struct RelayRun {
    pub(crate) rows: usize,
    pub(crate) config: RunConfig,
    pub(crate) rows_per_sec: f64,
    pub(crate) statements: u64,
    pub(crate) xacts: Option<i64>,
    pub(crate) received: u64,
    pub(crate) cpu: Option<CpuShares>,
    /// Rows/s over the first and the second half of the rows.
    pub(crate) halves: Option<(f64, f64)>,
}

impl RelayRun {
    pub(crate) fn statements_per_row(&self) -> f64 {
        self.statements as f64 / self.rows as f64
    }

    pub(crate) fn xacts_per_row(&self) -> Option<f64> {
        self.xacts.map(|x| x as f64 / self.rows as f64)
    }
}

/// Runs the relay in-process over `n` pre-inserted rows until all are SUCCESS.
pub(crate) async fn relay_run(
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

pub(crate) async fn relay_run_on(
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
        rows,
        tracing,
    } = config;
    prepare_table(url, table, n, analyze, rows).await?;
    let relay_url = with_pg_options(url, pg_options.map(|(_, options)| options));

    let dir = tempfile::tempdir()?;
    let mut cfg = Config::webhook(&receiver.url)
        .no_lease()
        .batch_size(batch_size)
        .max_in_flight(max_in_flight)
        .poll_interval(Duration::from_millis(500))
        .hook(|s| s.timeout(SINK_TIMEOUT));
    // Unset, the sink's own cap is its default (`DEFAULT_SINK_CONCURRENCY`), whatever
    // max_in_flight says.
    if let Some(c) = sink_concurrency {
        cfg = cfg.hook(|s| s.concurrency(c));
    }
    // Kept until the run ends: the relay exports to it.
    let collector = match tracing {
        true => Some(support::otlp::Collector::start().await),
        false => None,
    };
    if let Some(c) = &collector {
        cfg = cfg.sections(&format!("[tracing]\nendpoint = \"{}\"\n", c.endpoint()));
    }
    let shutdown = CancellationToken::new();
    let (relay, store, _) =
        assemble(&relay_url, table, "bench", &cfg, dir.path(), &shutdown).await?;
    if let Some((_, options)) = pg_options {
        check_pg_options(&store, options).await?;
    }
    // The bench's own progress checks go through a separate one-connection pool.
    let probe = SqlStore::connect(url, table, 1, Duration::from_secs(5)).await?;

    let xacts_before = settled_xacts(db, url).await;
    let statements_before = store.statements();
    let cpu_before = CpuSnap::take();
    let watch = Watch::start(receiver, n, &probe, table, RELAY_RUN_LIMIT);
    let task = spawn_relay_task(relay);
    let watched = watch
        .until_done(|| {
            task.is_finished()
                .then_some("the relay loop ended by itself")
        })
        .await?;
    let elapsed = watch.started.elapsed();
    let statements = store.statements() - statements_before;
    let halves = watched.halves(n, elapsed);
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
    watched.outcome?;
    let received = receiver.count() - watch.received_before;
    store.pool().close().await;
    probe.pool().close().await;
    let xacts_after = settled_xacts(db, url).await;
    let xacts = match (xacts_before, xacts_after) {
        // Our own sessions: the probe's queries and the stats read itself.
        (Some(a), Some(b)) => Some(b - a - watched.probe_queries - 1),
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

/// `url` with PostgreSQL settings for the relay's sessions in its `options` (`-c name=value
/// ...`), if any.
fn with_pg_options(url: &str, options: Option<&str>) -> String {
    match options {
        Some(options) => {
            let sep = if url.contains('?') { '&' } else { '?' };
            let encoded = options.replace(' ', "%20").replace('=', "%3D");
            format!("{url}{sep}options={encoded}")
        }
        None => url.to_string(),
    }
}

/// Checks that the server took each `-c name=value` of `options` on the relay's sessions.
async fn check_pg_options(store: &SqlStore, options: &str) -> anyhow::Result<()> {
    for setting in options.split("-c").map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = setting.split_once('=').unwrap_or((setting, ""));
        let actual: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {name}")))
            .fetch_one(store.pool())
            .await?;
        if actual != value {
            bail!("{name} is {actual:?} on the relay's sessions, not {value:?}");
        }
    }
    Ok(())
}

/// Watching a run of `n` rows until every one is SUCCESS: the receiver first (free), then
/// the database (cheap, a few queries), within `limit`.
pub(crate) struct Watch<'a> {
    receiver: &'a Receiver,
    pub(crate) received_before: u64,
    n: usize,
    /// The bench's own one-connection pool.
    probe: &'a SqlStore,
    table: &'a str,
    limit: Duration,
    pub(crate) started: Instant,
}

/// What watching a run saw.
pub(crate) struct Watched {
    /// `Err`: the rows did not all arrive in time, or a relay loop ended by itself.
    pub(crate) outcome: anyhow::Result<()>,
    /// When the receiver saw half the rows: a second half much slower than the first points
    /// at claims getting costlier as delivered rows pile up in the table.
    half_at: Option<Duration>,
    /// Queries the probe made (its own transactions, on PostgreSQL).
    probe_queries: i64,
}

impl<'a> Watch<'a> {
    /// Starts the clock; the run's relays start right after.
    pub(crate) fn start(
        receiver: &'a Receiver,
        n: usize,
        probe: &'a SqlStore,
        table: &'a str,
        limit: Duration,
    ) -> Watch<'a> {
        Watch {
            received_before: receiver.count(),
            receiver,
            n,
            probe,
            table,
            limit,
            started: Instant::now(),
        }
    }

    /// Watches every 5 ms until done, `limit` passes or `ended` says why a relay stopped
    /// (then the outcome is that error). An error of the database check ends the run at
    /// once, as `Err`.
    pub(crate) async fn until_done(
        &self,
        mut ended: impl FnMut() -> Option<&'static str>,
    ) -> anyhow::Result<Watched> {
        let (n, table) = (self.n, self.table);
        let deadline = self.started + self.limit;
        let mut half_at = None;
        let mut probe_queries = 0i64;
        let outcome = loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let received = self.receiver.count() - self.received_before;
            if half_at.is_none() && received >= n as u64 / 2 {
                half_at = Some(self.started.elapsed());
            }
            if Instant::now() > deadline {
                let counts = status_counts(self.probe.pool(), table).await;
                break Err(anyhow::anyhow!(
                    "rows did not all reach SUCCESS within {:?}: received {received} of {n}, table: {counts}",
                    self.limit
                ));
            }
            if let Some(why) = ended() {
                break Err(anyhow::anyhow!(why));
            }
            if received < n as u64 {
                continue;
            }
            probe_queries += 1;
            let done = scalar(
                self.probe.pool(),
                format!("SELECT COUNT(*) FROM {table} WHERE status = 'SUCCESS'"),
            )
            .await?;
            if done >= n as i64 {
                break Ok(());
            }
        };
        Ok(Watched {
            outcome,
            half_at,
            probe_queries,
        })
    }
}

impl Watched {
    /// Rows/s over the first and the second half of `n` rows delivered in `elapsed`.
    pub(crate) fn halves(&self, n: usize, elapsed: Duration) -> Option<(f64, f64)> {
        self.half_at.map(|h| {
            let half = (n / 2) as f64;
            (
                half / h.as_secs_f64(),
                (n as f64 - half) / (elapsed - h).as_secs_f64().max(1e-6),
            )
        })
    }
}

/// One database's figures, for the final table.
pub(crate) struct Section {
    pub(crate) db: Db,
    pub(crate) main: Option<RelayRun>,
    pub(crate) naive: Option<NaiveRun>,
    /// The ceiling the shares are taken against: the mean of the ceilings measured right
    /// before and right after the main run (see [`ceiling_around`]).
    pub(crate) ceiling: Option<f64>,
    /// The ceilings measured before and after the main run.
    pub(crate) ceilings: (Option<f64>, Option<f64>),
    /// The bench's own client's ceiling around the main run, beside [`Section::ceiling`]
    /// when wrk measured that (`ceiling.rs`).
    pub(crate) own_ceiling: Option<f64>,
    /// The keyed variations (`keyed.rs`).
    pub(crate) keyed: Vec<KeyedRun>,
    /// The tracing variation's mean rows/s, off and on (`trace_overhead.rs`).
    pub(crate) tracing: Option<(f64, f64)>,
    pub(crate) variations: Vec<RelayRun>,
    pub(crate) errors: Vec<String>,
    pub(crate) skipped: Option<String>,
}

pub(crate) fn relay_config(r: &RelayRun) -> String {
    let c = r.config;
    let sink = match c.sink_concurrency {
        Some(n) => format!("sink conc {n:>4}"),
        None => format!("sink conc {DEFAULT_SINK_CONCURRENCY:>3}*"),
    };
    let stats = if c.analyze { "" } else { " no-ANALYZE" };
    let keys = match (c.rows.keys, c.rows.mixed) {
        (0, _) => String::new(),
        (n, false) => format!(" {n} keys"),
        (n, true) => format!(" {n} keys + unkeyed"),
    };
    let payload = match c.rows.payload_bytes {
        0 => String::new(),
        n => format!(" payload {n} B"),
    };
    let options = c
        .pg_options
        .map(|(label, _)| format!(" {label}"))
        .unwrap_or_default();
    let tracing = if c.tracing { " tracing" } else { "" };
    format!(
        "batch {:>4} in_flight {:>4} {sink}{stats}{keys}{payload}{options}{tracing}",
        c.batch_size, c.max_in_flight
    )
}

pub(crate) fn print_relay(db: Db, label: &str, r: &RelayRun) {
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

/// The leader section on one database: the main run with the relay's defaults between two
/// ceilings, the naive loop, then the variations, the keyed ones and tracing's.
pub(crate) async fn run_section(db: Db, receiver: &Receiver, main_rows: usize) -> Section {
    let mut s = Section {
        db,
        main: None,
        naive: None,
        ceiling: None,
        ceilings: (None, None),
        own_ceiling: None,
        keyed: Vec::new(),
        tracing: None,
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
    if let Err(msg) = reachable(db, &url).await {
        s.skipped = Some(msg);
        return s;
    }
    main_run(&mut s, &url, receiver, main_rows).await;
    naive(&mut s, &url, receiver, main_rows).await;
    for (config, rows) in variations(db, main_rows) {
        let (b, f) = (config.batch_size, config.max_in_flight);
        match relay_run(db, &url, receiver, rows, config).await {
            Ok(r) => {
                print_relay(db, "variation", &r);
                s.variations.push(r);
            }
            Err(e) => {
                let what = format!("batch {b} in_flight {f}");
                run_failed(db, "variation", &what, &e, &mut s.errors);
            }
        }
    }
    keyed_variations(&mut s, &url, receiver).await;
    tracing_overhead(&mut s, &url, receiver, main_rows).await;
    s
}

/// The main run, with the relay's defaults, bracketed by the receiver's ceiling measured
/// with as many POSTs at once as the default sink sends at once.
async fn main_run(s: &mut Section, url: &str, receiver: &Receiver, main_rows: usize) {
    let db = s.db;
    let (batch, in_flight) = relay_defaults();
    let sends = DEFAULT_SINK_CONCURRENCY;
    println!(
        "== {}: main relay run of {main_rows} rows (defaults: batch {batch}, max_in_flight {in_flight}, sink concurrency {sends})",
        db.name()
    );

    // A warm-up first, discarded: a receiver that compiles as it goes (Node's JIT) answers
    // the first thousands of requests slower, which would flatter the share.
    let _ = ceiling_run(receiver, main_rows / 2, sends).await;
    let before = ceiling_logged(db, receiver, main_rows, "before", &mut s.errors).await;

    let config = RunConfig {
        sink_concurrency: None,
        ..RunConfig::new(batch, in_flight)
    };
    match relay_run(db, url, receiver, main_rows, config).await {
        Ok(r) => {
            print_relay(db, "relay", &r);
            s.main = Some(r);
        }
        Err(e) => run_failed(db, "relay", "", &e, &mut s.errors),
    }
    let after = ceiling_logged(db, receiver, main_rows, "after", &mut s.errors).await;
    s.ceilings = (before.best, after.best);
    let around = ceiling_around(before, after);
    (s.ceiling, s.own_ceiling) = (around.best, around.own);
}

/// The mean of `values` (`None` when there are none).
pub(crate) fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// The relay's default `batch_size` and `max_in_flight`.
pub(crate) fn relay_defaults() -> (u32, u32) {
    let defaults = outbox_relay::config::RelaySettings::default();
    (defaults.batch_size, defaults.max_in_flight)
}

/// The naive loop, over a quarter of the main run's rows (at least 500).
async fn naive(s: &mut Section, url: &str, receiver: &Receiver, main_rows: usize) {
    let db = s.db;
    let naive_rows = (main_rows / 4).max(500);
    match naive_run(db, url, receiver, naive_rows).await {
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
        Err(e) => run_failed(db, "naive", "", &e, &mut s.errors),
    }
}

/// The variation runs (configuration, rows): those of `OUTBOX_RELAY_BENCH_VARIATIONS`
/// (`batch/in_flight/concurrency[/noanalyze],...`, for exploring settings) if set; else
/// where the throughput comes from, and PostgreSQL's diagnostics.
fn variations(db: Db, main_rows: usize) -> Vec<(RunConfig, usize)> {
    match std::env::var("OUTBOX_RELAY_BENCH_VARIATIONS") {
        Ok(list) => list
            .split(',')
            .filter_map(|v| {
                let parts: Vec<&str> = v.trim().split('/').collect();
                let num = |i: usize| parts.get(i).and_then(|p| p.parse::<u32>().ok());
                let config = RunConfig {
                    sink_concurrency: num(2),
                    analyze: parts.get(3) != Some(&"noanalyze"),
                    ..RunConfig::new(num(0)?, num(1)?)
                };
                Some((config, main_rows))
            })
            .collect(),
        Err(_) => standard_variations(main_rows)
            .into_iter()
            .chain(pg_diagnostics(db, main_rows))
            .collect(),
    }
}

/// Where the throughput comes from: concurrency, batch size, the sink's default cap, the
/// planner's statistics and payload size (ordering keys: `keyed.rs`).
fn standard_variations(main_rows: usize) -> [(RunConfig, usize); 7] {
    let (batch, in_flight) = relay_defaults();
    let var_rows = (main_rows / 2).max(1000);
    [
        (RunConfig::new(100, 1), (var_rows / 10).max(300)),
        (RunConfig::new(100, 16), var_rows),
        (RunConfig::new(10, 64), var_rows),
        // The defaults before issue 11 (64 in flight, all of them sends).
        (RunConfig::new(100, 64), var_rows),
        (RunConfig::new(500, 256), var_rows),
        // The main run on a table whose statistics predate the rows (no ANALYZE yet).
        (
            RunConfig {
                analyze: false,
                ..RunConfig::new(batch, in_flight)
            },
            main_rows,
        ),
        // The defaults on payloads of a size push messages and template parameters have
        // (the main run's are about 75 bytes).
        (
            RunConfig {
                sink_concurrency: None,
                rows: Rows {
                    payload_bytes: PAYLOAD_VARIATION_BYTES,
                    ..Rows::default()
                },
                ..RunConfig::new(batch, in_flight)
            },
            var_rows,
        ),
    ]
}

/// PostgreSQL diagnostics on the main configuration: statements planned at every
/// execution (the server's own choice, which the relay overrides; docs/design.md, "Generic
/// plans"), the claim held to the plan it was written for (the partial index in id order;
/// see the report), and commits that do not wait for the WAL flush.
fn pg_diagnostics(db: Db, main_rows: usize) -> impl Iterator<Item = (RunConfig, usize)> {
    let (batch, in_flight) = relay_defaults();
    let plan = "-c enable_sort=off -c enable_bitmapscan=off";
    [
        ("custom_plans", "-c plan_cache_mode=force_custom_plan"),
        ("plan=due_idx", plan),
        (
            "plan=due_idx sync_commit=off",
            "-c enable_sort=off -c enable_bitmapscan=off -c synchronous_commit=off",
        ),
    ]
    .into_iter()
    .filter(move |_| db == Db::Postgres)
    .map(move |options| {
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
    })
}
