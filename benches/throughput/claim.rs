//! The claim section: 1, 2 and 3 relays in claim mode on one table, with and without
//! ordering keys, and unkeyed rows mixed into a keyed backlog.

use super::*;

/// The longest one claim-mode run may take.
pub(crate) const CLAIM_RUN_LIMIT: Duration = Duration::from_secs(40);
/// Distinct ordering keys in the keyed claim runs (assigned round-robin).
pub(crate) const ORDERING_KEYS: usize = 200;
/// The short `relay.poll_interval` of the keyed diagnostic run (the default is 500ms).
pub(crate) const KEYED_DIAGNOSTIC_POLL: Duration = Duration::from_millis(20);
/// Each claim-mode instance's `batch_size` and `max_in_flight` (as the leader section's main
/// run; the sink's concurrency is set to `max_in_flight`).
pub(crate) const CLAIM_BATCH: u32 = 100;
pub(crate) const CLAIM_IN_FLIGHT: u32 = 64;

/// What one claim-mode run measured.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRun {
    pub(crate) rows: usize,
    pub(crate) instances: usize,
    /// Distinct ordering keys (0: no row has one).
    pub(crate) keys: usize,
    /// `relay.poll_interval` when set for the run (diagnostic); else the default (500ms).
    pub(crate) poll_interval: Option<Duration>,
    pub(crate) rows_per_sec: f64,
    pub(crate) halves: Option<(f64, f64)>,
    /// Requests each instance's sink made (from its receiver path), in instance order.
    pub(crate) shares: Vec<u64>,
    pub(crate) received: u64,
    /// Requests whose `webhook-id` the receiver had already seen in this run.
    pub(crate) repeats: u64,
    /// Statements of all instances' stores together.
    pub(crate) statements: u64,
    /// Times an instance's readiness was seen going false (a failed claim: the loop then
    /// backs off for at least 500ms), sampled every few milliseconds.
    pub(crate) claim_failures: u64,
    pub(crate) cpu: Option<CpuShares>,
    /// With unkeyed rows mixed in: their rate, and the keyed rows sent before the last one.
    pub(crate) mixed: Option<Mixed>,
}

/// What a run of unkeyed rows mixed one for one into a keyed backlog measured besides its
/// rows/s (see [`unkeyed_rate`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mixed {
    pub(crate) unkeyed_per_sec: f64,
    pub(crate) keyed_meanwhile: i64,
}

impl ClaimRun {
    pub(crate) fn label(&self) -> String {
        let keys = match (self.keys, self.mixed) {
            (0, _) => "unkeyed".to_string(),
            (k, Some(_)) => format!("unkeyed among {k} keys"),
            (k, None) => format!("{k} keys"),
        };
        let poll = self
            .poll_interval
            .map(|p| format!(" poll {}ms", p.as_millis()))
            .unwrap_or_default();
        format!("{} inst {keys}{poll}", self.instances)
    }

    pub(crate) fn shares(&self) -> String {
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
pub(crate) struct ClaimSetup {
    pub(crate) instances: usize,
    /// Distinct ordering keys, round-robin (0: none).
    pub(crate) keys: usize,
    /// Diagnostic: `relay.poll_interval` for every instance (None: the default).
    pub(crate) poll_interval: Option<Duration>,
    /// The receiver answers after `SLOW_REPLY` (20 ms) instead of at once.
    pub(crate) slow: bool,
    /// With `keys`: every other row has none (unkeyed rows mixed into a keyed backlog).
    pub(crate) mixed: bool,
}

impl ClaimSetup {
    pub(crate) fn new(instances: usize, keys: usize) -> ClaimSetup {
        ClaimSetup {
            instances,
            keys,
            poll_interval: None,
            slow: false,
            mixed: false,
        }
    }
}

/// Runs `instances` claim-mode relays in this process, each with its own pool, sinks and
/// instance id, over one table of `n` pre-inserted rows, until all are SUCCESS.
pub(crate) async fn claim_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    n: usize,
    setup: ClaimSetup,
) -> anyhow::Result<ClaimRun> {
    let table = unique_table("claim");
    let result = match claim_run_on(url, &table, receiver, n, setup).await {
        Ok(run) if setup.mixed => (unkeyed_rate(db, url, &table, n, run.rows_per_sec).await).map(
            |(unkeyed_per_sec, keyed_meanwhile)| ClaimRun {
                mixed: Some(Mixed {
                    unkeyed_per_sec,
                    keyed_meanwhile,
                }),
                ..run
            },
        ),
        other => other,
    };
    let dialect = (db == Db::Postgres).then_some(Dialect::Postgres);
    drop_table(url, &table, dialect).await;
    result
}

pub(crate) async fn claim_run_on(
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
        mixed,
        ..
    } = setup;
    if instances == 0 || instances > INSTANCE_PATHS.len() {
        bail!("instances must be 1..={}", INSTANCE_PATHS.len());
    }
    prepare_table(
        url,
        table,
        n,
        true,
        Rows {
            keys,
            mixed,
            ..Rows::default()
        },
    )
    .await?;
    let dir = tempfile::tempdir()?;

    let shutdown = CancellationToken::new();
    // Whatever way this function returns, the instances and their LISTEN sessions stop.
    let _stop_all = shutdown.clone().drop_guard();
    let (relays, stores, healths) =
        assemble_instances(url, table, receiver, setup, dir.path(), &shutdown).await?;
    let probe = SqlStore::connect(url, table, 1, Duration::from_secs(5)).await?;

    let shares_before = receiver.instance_counts();
    let repeats_before = receiver.reset_seen();
    let statements_before: u64 = stores.iter().map(|s| s.statements()).sum();
    let cpu_before = CpuSnap::take();
    let watch = Watch::start(receiver, n, &probe, table, CLAIM_RUN_LIMIT);
    let tasks: Vec<_> = relays.into_iter().map(spawn_relay_task).collect();
    let mut failed_claims = FailedClaims::new(instances);
    let watched = watch
        .until_done(|| {
            failed_claims.sample(&healths);
            tasks
                .iter()
                .any(|t| t.is_finished())
                .then_some("a relay loop ended by itself")
        })
        .await?;
    let elapsed = watch.started.elapsed();
    let statements = stores.iter().map(|s| s.statements()).sum::<u64>() - statements_before;
    let halves = watched.halves(n, elapsed);
    let cpu = cpu_before
        .zip(CpuSnap::take())
        .and_then(|(a, b)| a.since(b));

    shutdown.cancel();
    stop_all(tasks).await;
    let received = receiver.count() - watch.received_before;
    let shares = shares_since(receiver, &shares_before, instances);
    let repeats = receiver.reset_seen() - repeats_before;
    for store in &stores {
        store.pool().close().await;
    }
    probe.pool().close().await;
    watched.outcome?;
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
        claim_failures: failed_claims.seen,
        cpu,
        mixed: None,
    })
}

/// The run's claim-mode instances, each with its own pool, sinks, instance id and receiver
/// path (a slow one with `setup.slow`), not yet running; their stores and health.
async fn assemble_instances(
    url: &str,
    table: &str,
    receiver: &Receiver,
    setup: ClaimSetup,
    dir: &std::path::Path,
    shutdown: &CancellationToken,
) -> anyhow::Result<(Vec<Assembled>, Vec<Arc<SqlStore>>, Vec<Arc<Health>>)> {
    let instances = setup.instances;
    let mut relays = Vec::with_capacity(instances);
    let mut stores = Vec::with_capacity(instances);
    let mut healths = Vec::with_capacity(instances);
    for (i, path) in INSTANCE_PATHS.iter().enumerate().take(instances) {
        let sink_url = if setup.slow {
            receiver.slow_instance_url(i)
        } else {
            receiver.instance_url(i)
        };
        let config = Config::webhook(&sink_url)
            .claim_mode()
            .no_lease()
            .batch_size(CLAIM_BATCH)
            .max_in_flight(CLAIM_IN_FLIGHT)
            .poll_interval(setup.poll_interval.unwrap_or(Duration::from_millis(500)))
            .hook(|s| s.timeout(SINK_TIMEOUT).concurrency(CLAIM_IN_FLIGHT));
        let instance = format!("bench-{path}");
        let (relay, store, health) =
            assemble(url, table, &instance, &config, dir, shutdown).await?;
        relays.push(relay);
        healths.push(health);
        stores.push(store);
    }
    Ok((relays, stores, healths))
}

/// Failed claims, as seen from the instances' readiness (it goes false at a failed claim),
/// sampled at every look of the run's watch.
struct FailedClaims {
    was_ok: Vec<bool>,
    seen: u64,
}

impl FailedClaims {
    fn new(instances: usize) -> FailedClaims {
        FailedClaims {
            was_ok: vec![true; instances],
            seen: 0,
        }
    }

    fn sample(&mut self, healths: &[Arc<Health>]) {
        for (ok, health) in self.was_ok.iter_mut().zip(healths) {
            let now_ok = health.database_ok();
            if *ok && !now_ok {
                self.seen += 1;
            }
            *ok = now_ok;
        }
    }
}

/// The requests each of the first `instances` receiver paths got since `before`.
fn shares_since(receiver: &Receiver, before: &[u64], instances: usize) -> Vec<u64> {
    receiver
        .instance_counts()
        .iter()
        .zip(before)
        .take(instances)
        .map(|(after, before)| after - before)
        .collect()
}

/// Waits for the instances to stop after shutdown, 30 s at most in all.
async fn stop_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    let stop_by = tokio::time::Instant::now() + Duration::from_secs(30);
    for task in tasks {
        if tokio::time::timeout_at(stop_by, task).await.is_err() {
            eprintln!("warning: a claim-mode relay did not stop within 30s of shutdown");
            break;
        }
    }
}

/// One database's claim-mode figures, for the final table.
pub(crate) struct ClaimSection {
    pub(crate) db: Db,
    /// Unkeyed runs by instance count (1, 2, 3; a failed run is missing).
    pub(crate) scaling: Vec<ClaimRun>,
    /// The same on rows with ordering keys (1 and 3 instances), then unkeyed rows mixed one
    /// for one into them (2 and 3 instances).
    pub(crate) keyed: Vec<ClaimRun>,
    /// Unkeyed, 1 and 3 instances, against a receiver answering after 20 ms.
    pub(crate) slow: Vec<ClaimRun>,
    pub(crate) errors: Vec<String>,
    pub(crate) skipped: Option<String>,
}

impl ClaimSection {
    pub(crate) fn unkeyed(&self, instances: usize) -> Option<&ClaimRun> {
        self.scaling.iter().find(|r| r.instances == instances)
    }

    /// The mixed run of `instances`: its unkeyed rows' rate against the unkeyed run of as
    /// many instances, and the keyed rows sent before its last unkeyed one.
    pub(crate) fn mixed(&self, instances: usize) -> Option<(f64, i64)> {
        let r = (self.keyed.iter()).find(|r| r.instances == instances && r.mixed.is_some())?;
        let (m, b) = r.mixed.zip(self.unkeyed(instances))?;
        (b.rows_per_sec > 0.0).then(|| (m.unkeyed_per_sec / b.rows_per_sec, m.keyed_meanwhile))
    }
}

pub(crate) fn print_claim(db: Db, r: &ClaimRun, base: Option<&ClaimRun>) {
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
    let mixed = (r.mixed.zip(base))
        .filter(|(_, b)| b.rows_per_sec > 0.0)
        .map(|(m, b)| {
            format!(
                "  unkeyed rows {:.0}/s, {:.2}x of {} inst unkeyed, {} keyed rows sent meanwhile",
                m.unkeyed_per_sec,
                m.unkeyed_per_sec / b.rows_per_sec,
                b.instances,
                m.keyed_meanwhile
            )
        })
        .unwrap_or_default();
    println!(
        "  {:<8} claim     {:<16} rows {:>6}: {:>6.0} rows/s{}{ratio}{mixed}  shares {}  statements/row {:.4} ({} stmts)  received {}{failures}{}",
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
pub(crate) async fn run_claim_section(db: Db, receiver: &Receiver, rows: usize) -> ClaimSection {
    let mut s = ClaimSection {
        db,
        scaling: Vec::new(),
        keyed: Vec::new(),
        slow: Vec::new(),
        errors: Vec::new(),
        skipped: None,
    };
    // Only PostgreSQL and MySQL/MariaDB run here; the path is for SQLite's file.
    let url = db.url(&std::env::temp_dir());
    if let Err(msg) = reachable(db, &url).await {
        s.skipped = Some(msg);
        return s;
    }
    println!(
        "== {}: claim mode, {rows} rows per run, each instance batch {CLAIM_BATCH} max_in_flight {CLAIM_IN_FLIGHT}, own pool and receiver path",
        db.name()
    );
    scaling_runs(&mut s, &url, receiver, rows).await;
    slow_runs(&mut s, &url, receiver, rows).await;
    keyed_runs(&mut s, &url, receiver, rows).await;
    s
}

/// 1, 2 and 3 instances on unkeyed rows.
async fn scaling_runs(s: &mut ClaimSection, url: &str, receiver: &Receiver, rows: usize) {
    let db = s.db;
    for instances in 1..=INSTANCE_PATHS.len() {
        match claim_run(db, url, receiver, rows, ClaimSetup::new(instances, 0)).await {
            Ok(r) => {
                print_claim(db, &r, s.unkeyed(1).filter(|_| instances > 1));
                s.scaling.push(r);
            }
            Err(e) => {
                let what = format!("{instances} inst unkeyed");
                run_failed(db, "claim", &what, &e, &mut s.errors);
            }
        }
    }
}

/// 1 and 3 instances against a receiver that takes 20 ms per request: each instance is then
/// bounded by its sends at once, as in most deployments, and more instances deliver more.
async fn slow_runs(s: &mut ClaimSection, url: &str, receiver: &Receiver, rows: usize) {
    let db = s.db;
    for instances in [1, INSTANCE_PATHS.len()] {
        let setup = ClaimSetup {
            slow: true,
            ..ClaimSetup::new(instances, 0)
        };
        match claim_run(db, url, receiver, rows, setup).await {
            Ok(r) => {
                println!(
                    "  {:<8} claim     {instances} inst, receiver answering after {} ms: {:.0} rows/s",
                    db.name(),
                    SLOW_REPLY.as_millis(),
                    r.rows_per_sec
                );
                s.slow.push(r);
            }
            Err(e) => {
                let what = format!("{instances} inst slow receiver");
                run_failed(db, "claim", &what, &e, &mut s.errors);
            }
        }
    }
}

/// Ordering on: the same runs on keyed rows, then a diagnostic with a short poll interval
/// (a claim that comes back short, as when most keys' heads are in flight, makes the loop
/// sleep poll_interval; this shows how much of the cost is that sleep), then unkeyed rows
/// mixed one for one into the keyed ones: each instance keeps the keys to their share while
/// unkeyed rows wait, whatever the others hold (docs/design.md, "Ordering keys: a keyed share
/// among claimers").
async fn keyed_runs(s: &mut ClaimSection, url: &str, receiver: &Receiver, rows: usize) {
    let db = s.db;
    let keyed = [
        ClaimSetup::new(1, ORDERING_KEYS),
        ClaimSetup::new(INSTANCE_PATHS.len(), ORDERING_KEYS),
        ClaimSetup {
            poll_interval: Some(KEYED_DIAGNOSTIC_POLL),
            ..ClaimSetup::new(1, ORDERING_KEYS)
        },
        ClaimSetup {
            mixed: true,
            ..ClaimSetup::new(2, ORDERING_KEYS)
        },
        ClaimSetup {
            mixed: true,
            ..ClaimSetup::new(INSTANCE_PATHS.len(), ORDERING_KEYS)
        },
    ];
    for setup in keyed {
        match claim_run(db, url, receiver, rows, setup).await {
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
                run_failed(db, "claim", &what, &e, &mut s.errors);
            }
        }
    }
}

/// The claim section's lines of the final summary.
pub(crate) fn print_claim_summary(s: &ClaimSection) -> bool {
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
        let mixed = r.mixed.map(|_| " mixed").unwrap_or_default();
        line.push_str(&format!(
            " {} inst{poll}{mixed} {:.0}",
            r.instances, r.rows_per_sec
        ));
        if let Some(b) = s.unkeyed(r.instances).filter(|b| b.rows_per_sec > 0.0) {
            line.push_str(&format!(
                " ({:.2}x of unkeyed)",
                r.rows_per_sec / b.rows_per_sec
            ));
        }
        if let (Some(_), Some((x, first))) = (r.mixed, s.mixed(r.instances)) {
            line.push_str(&format!(
                " (its unkeyed rows {x:.2}x, {first} keyed rows first)"
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
