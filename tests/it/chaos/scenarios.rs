//! The chaos runs themselves: one run set up on its own servers, the faults struck while rows
//! go in, the drain, and the report's verdict; one test per scenario.

use super::*;

/// The run's description for its output: the mode and the database.
fn scenario(mode: Mode, db: Db) -> String {
    format!(
        "3 instances, {}, private {}",
        match mode {
            Mode::Claim => "relay.mode = \"claim\"",
            Mode::Leader => "leader mode, redis lease",
        },
        match db {
            Db::Postgres => "PostgreSQL",
            Db::MySql => "MariaDB",
            Db::Sqlite => "SQLite file",
        }
    )
}

/// A run on servers of its own (a database, and Redis in leader mode) with a migrated table;
/// `None` when a server cannot be started (the test is skipped).
async fn open_run(mode: Mode, db: Db, plan: Plan) -> Option<Run> {
    let server = Server::start(db).await?;
    let redis = match mode {
        Mode::Leader => Some(RedisServer::start(&[]).await?),
        Mode::Claim => None,
    };
    let url = server.url();
    let table = unique_table("chaos");
    let store = SqlStore::connect(&url, &table, 4, Duration::from_secs(5))
        .await
        .expect("connect to the private database");
    store.migrate().await.expect("migrate");
    let td = TestDb {
        db,
        url,
        table,
        store: Arc::new(store),
        dir: tempfile::tempdir().expect("tempdir"),
    };
    let rx = StormReceiver::start(&SLOTS, CALM_ANSWER, SLOW_ANSWER).await;
    Some(Run {
        mode,
        plan,
        rng: Rng(plan.seed ^ mode as u64 ^ ((db as u64) << 8)),
        server,
        redis,
        td,
        rx,
        slots: SLOTS
            .iter()
            .map(|&name| Slot {
                name,
                generation: 0,
                proc: None,
            })
            .collect(),
        faults: Vec::new(),
        exits: Vec::new(),
        t0: Instant::now(),
    })
}

/// Inserts rows `from..to` into the run's table at `rate` rows per second (see [`insert_rows`]).
fn insert(
    run: &Run,
    (from, to): (u64, u64),
    rate: f64,
    deadline: Instant,
) -> impl Future<Output = Inserted> + use<> {
    insert_rows(
        run.td.store.clone(),
        run.td.db,
        run.td.table.clone(),
        from,
        to,
        rate,
        deadline,
    )
}

/// A backlog first, then the instances, and rows while the faults strike: every row whose
/// transaction committed, when.
async fn load_under_faults(run: &mut Run) -> Inserted {
    let plan = run.plan;
    let backlog = (plan.rows / 5).max(1);
    let deadline = Instant::now() + Duration::from_secs(300);
    let backlog_rows = insert(run, (0, backlog), f64::INFINITY, deadline).await;
    assert_eq!(backlog_rows.uncertain, 0, "the backlog went in");
    run.t0 = Instant::now();
    for i in 0..SLOTS.len() {
        run.start_slot(i);
    }
    let rate = (plan.rows - backlog) as f64 / plan.duration.as_secs_f64().max(1.0);
    let deadline = run.t0 + plan.duration + Duration::from_secs(120);
    let inserter = tokio::spawn(insert(run, (backlog, plan.rows), rate, deadline));
    run.faults().await;
    let mut inserted = tokio::time::timeout(Duration::from_secs(180), inserter)
        .await
        .expect("the inserter ends by its deadline")
        .expect("inserter");
    inserted.commits.extend(backlog_rows.commits);
    run.log(&format!(
        "faults over; {} rows committed, {} in failed transactions; draining",
        inserted.commits.len(),
        inserted.uncertain
    ));
    inserted
}

/// Drain: every instance runs, every service is up, the receiver calm (all were restored by
/// each fault); the rows of claims that died must come back within claim_ttl. Then the relays
/// are stopped.
async fn drain(run: &mut Run, committed: usize) {
    let drain = CLAIM_TTL * 3 + Duration::from_secs(30) + Duration::from_millis(run.plan.rows / 2);
    let deadline = Instant::now() + drain;
    loop {
        run.check_alive();
        let open = run.open_rows().await;
        if matches!(open, Some((0, n)) if n as usize >= committed) {
            break;
        }
        if Instant::now() >= deadline {
            run.log(&format!(
                "drain did not finish within {drain:?}: {open:?}; first open rows:\n{}",
                run.open_sample().await
            ));
            break;
        }
        // A deadline wait (it logs instead of panicking, so the report still shows the run):
        // `check_alive` borrows the run mutably, which the `until` helpers' closures cannot.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    run.log("drained; stopping the relays");
    for slot in &mut run.slots {
        if let Some(p) = slot.proc.as_mut() {
            p.stop(SHUTDOWN_TIMEOUT + Duration::from_secs(5)).await;
        }
    }
}

/// The report of the run from the table and the receiver's hits; panics with it when a
/// guarantee broke (keeping the relays' logs).
async fn verdict(run: &mut Run, scenario: &str, inserted: &Inserted) {
    let rows = run.table_rows().await;
    let hits = run.rx.hits();
    let rep = report::analyze(&Evidence {
        scenario: scenario.to_string(),
        seed: run.plan.seed,
        leader: run.mode == Mode::Leader,
        max_in_flight: IN_FLIGHT as usize,
        senders: &SLOTS,
        rows: &rows,
        hits: &hits,
        faults: &run.faults,
        commits: &inserted.commits,
        t0: run.t0,
    });
    println!("{}", rep.table());
    let mut problems = rep.problems();
    problems.extend(run.exits.iter().cloned());
    if !problems.is_empty() {
        // Every instance's log, restarts included, for the post-mortem.
        let dir = std::mem::replace(&mut run.td.dir, tempfile::tempdir().expect("tempdir"));
        println!("relay logs kept in {}", dir.keep().display());
        // The verdict must be the last thing a CI log shows, not three relays' logs after it.
        for p in run.slots.iter_mut().filter_map(|s| s.proc.as_mut()) {
            p.set_log_tail(0);
        }
    }
    assert!(
        problems.is_empty(),
        "chaos run ({scenario}, seed {}) broke a guarantee:\n{}\n{}",
        run.plan.seed,
        problems.join("\n"),
        rep.table()
    );
}

async fn chaos(mode: Mode, db: Db) {
    let plan = Plan::from_env();
    let scenario = scenario(mode, db);
    println!(
        "chaos run: {scenario}; seed {} (OUTBOX_RELAY_CHAOS_SEED), {} rows, {:?} of faults",
        plan.seed, plan.rows, plan.duration
    );
    let Some(mut run) = open_run(mode, db, plan).await else {
        return;
    };
    let inserted = load_under_faults(&mut run).await;
    drain(&mut run, inserted.commits.len()).await;
    verdict(&mut run, &scenario, &inserted).await;
    run.td.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_mode_survives_repeated_faults() {
    chaos(Mode::Claim, Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_mode_with_redis_lease_survives_repeated_faults() {
    chaos(Mode::Leader, Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_mode_on_mariadb_survives_repeated_faults() {
    chaos(Mode::Claim, Db::MySql).await;
}

/// Leader mode on MariaDB: its claims take the rows read ahead of keys in flight as they were
/// read (docs/design.md, "Ordering keys: rows read ahead"), which no other scenario runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_mode_on_mariadb_survives_repeated_faults() {
    chaos(Mode::Leader, Db::MySql).await;
}

/// Leader mode on SQLite, the embedded default: three processes share the run's own file,
/// and the leader's claims take the rows read ahead of keys in flight as they were read (no
/// database restarts: a file has no server to stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_mode_on_sqlite_survives_repeated_faults() {
    chaos(Mode::Leader, Db::Sqlite).await;
}

#[test]
fn durations_and_keys() {
    assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
    assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
    assert_eq!(parse_duration("5x"), None);
    let keyed = (0..10_000).filter(|&s| key_of(s).is_some()).count();
    assert!((2_500..3_500).contains(&keyed), "{keyed}");
    let mut a = Rng(7);
    let mut b = Rng(7);
    assert_eq!(
        (0..5).map(|_| a.next()).collect::<Vec<_>>(),
        (0..5).map(|_| b.next()).collect::<Vec<_>>()
    );
}
