//! Commit-to-send latency: rows inserted one per transaction at a steady rate (as an
//! application writes them) into an empty table served by one relay with the default
//! settings, timed from the INSERT's commit to the row's arrival at the receiver.

use super::*;

/// One latency run's figures.
#[derive(Debug, Clone)]
pub(crate) struct Latency {
    /// Rows per second inserted.
    pub(crate) rate: u32,
    pub(crate) rows: usize,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
    /// Rows that did not arrive within the run's limit.
    pub(crate) missing: usize,
}

impl Latency {
    /// `p50 / p99 / max` in milliseconds.
    pub(crate) fn cell(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let missing = if self.missing > 0 {
            format!(" ({} missing)", self.missing)
        } else {
            String::new()
        };
        format!(
            "{:.1} / {:.1} / {:.1}{missing}",
            ms(self.p50),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// How many tasks insert at once (each a steady share of the rate).
const INSERTERS: u32 = 4;
/// Rows sent through a fresh relay before the measurement starts.
const WARM_UP_ROWS: usize = 20;
/// The longest a row may take to arrive before it is counted missing.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(15);

/// The defaults but for the lease (none) and the sink (the timed receiver path).
fn timed_config(receiver: &Receiver) -> Config {
    Config::webhook(&receiver.timed_url())
        .no_lease()
        .poll_interval(Duration::from_millis(500))
        .hook(|s| s.timeout(SINK_TIMEOUT))
}

/// Inserts `rate` rows per second for `seconds` into a fresh table served by one relay with
/// the default settings (no lease), and measures each row from commit to arrival.
pub(crate) async fn latency_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    rate: u32,
    seconds: u32,
) -> anyhow::Result<Latency> {
    on_own_table(db, url, "latency", async |t| {
        latency_run_on(url, t, receiver, rate, seconds).await
    })
    .await
}

async fn latency_run_on(
    url: &str,
    table: &str,
    receiver: &Receiver,
    rate: u32,
    seconds: u32,
) -> anyhow::Result<Latency> {
    prepare_table(url, table, 0, false, Rows::default()).await?;
    let dir = tempfile::tempdir()?;
    let config = timed_config(receiver);
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (relay, _store, _) =
        assemble(url, table, "latency", &config, dir.path(), &shutdown).await?;
    let task = spawn_relay_task(relay);
    let app = Arc::new(SqlStore::connect(url, table, INSERTERS, Duration::from_secs(5)).await?);
    warm_up(&app, receiver).await?;
    let committed = insert_at(&app, rate, seconds).await?;
    let deadline = Instant::now() + ARRIVAL_LIMIT;
    let mut arrived: HashMap<i64, Instant> = HashMap::new();
    while Instant::now() < deadline {
        arrived.extend(receiver.take_arrivals());
        if committed.iter().all(|(id, _)| arrived.contains_key(id)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let _ = task.await;
    app.pool().close().await;

    let mut waits: Vec<Duration> = committed
        .iter()
        .filter_map(|(id, at)| arrived.get(id).map(|a| a.saturating_duration_since(*at)))
        .collect();
    let missing = committed.len() - waits.len();
    if waits.is_empty() {
        bail!("no row arrived");
    }
    waits.sort();
    let pick = |q: f64| waits[((waits.len() as f64 * q).ceil() as usize).clamp(1, waits.len()) - 1];
    Ok(Latency {
        rate,
        rows: committed.len(),
        p50: pick(0.50),
        p99: pick(0.99),
        max: waits[waits.len() - 1],
        missing,
    })
}

/// Warm-up, not measured: a few rows through the fresh relay until they arrive. (A relay
/// just started delivers its first rows up to about 100 ms late on PostgreSQL while its
/// connections come up; that is start-up, not the steady state measured here.)
async fn warm_up(app: &SqlStore, receiver: &Receiver) -> anyhow::Result<()> {
    for i in 0..WARM_UP_ROWS {
        let row = store::NewRow {
            channel: "hook".into(),
            payload: payload(i),
            ..Default::default()
        };
        app.enqueue(&row).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let warm_until = Instant::now() + ARRIVAL_LIMIT;
    let mut warmed = 0;
    while warmed < WARM_UP_ROWS && Instant::now() < warm_until {
        warmed += receiver.take_arrivals().len();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    receiver.take_arrivals();
    Ok(())
}

/// Inserts rows one per transaction at `rate` rows/s for `seconds`, from [`INSERTERS`]
/// tasks; returns each row's id and commit time.
async fn insert_at(
    app: &Arc<SqlStore>,
    rate: u32,
    seconds: u32,
) -> anyhow::Result<Vec<(i64, Instant)>> {
    let per_task = rate / INSERTERS;
    let every = Duration::from_secs_f64(1.0 / f64::from(per_task.max(1)));
    let mut inserters = Vec::new();
    for t in 0..INSERTERS {
        let app = app.clone();
        inserters.push(tokio::spawn(async move {
            // Staggered, so the tasks' inserts interleave evenly.
            tokio::time::sleep(every / INSERTERS * t).await;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut committed = Vec::new();
            for i in 0..per_task * seconds {
                tick.tick().await;
                let row = store::NewRow {
                    channel: "hook".into(),
                    payload: payload(i as usize),
                    ..Default::default()
                };
                let id = app.enqueue(&row).await?;
                committed.push((id, Instant::now()));
            }
            anyhow::Ok(committed)
        }));
    }
    let mut committed = Vec::new();
    for t in inserters {
        committed.extend(t.await??);
    }
    Ok(committed)
}

/// A row committed under a backlog: how long it took and how many backlog rows went out
/// between its commit and its own arrival (the issue's "not starved behind it for more than
/// one claim round"; docs/design.md, "Oldest first, but not only").
#[derive(Debug, Clone)]
pub(crate) struct UnderBacklog {
    /// Each new row's commit-to-arrival time, and the backlog rows that arrived in between.
    pub(crate) rows: Vec<(Duration, usize)>,
}

impl UnderBacklog {
    /// `worst wait ms, most rows ahead`.
    pub(crate) fn cell(&self) -> String {
        let worst = self.rows.iter().map(|r| r.0).max().unwrap_or_default();
        let ahead = self.rows.iter().map(|r| r.1).max().unwrap_or_default();
        format!("{:.1} ms, {ahead} rows", worst.as_secs_f64() * 1000.0)
    }
}

/// New rows committed while the relay drains a backlog.
const NEW_UNDER_BACKLOG: usize = 5;

/// Starts one relay with the defaults on `backlog` waiting rows; once a quarter of them have
/// arrived, commits [`NEW_UNDER_BACKLOG`] rows one per transaction, 20 ms apart, and times
/// each from its commit to its arrival.
pub(crate) async fn under_backlog_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    backlog: usize,
) -> anyhow::Result<UnderBacklog> {
    on_own_table(db, url, "backlog", async |t| {
        under_backlog_run_on(url, t, receiver, backlog).await
    })
    .await
}

async fn under_backlog_run_on(
    url: &str,
    table: &str,
    receiver: &Receiver,
    backlog: usize,
) -> anyhow::Result<UnderBacklog> {
    prepare_table(url, table, backlog, true, Rows::default()).await?;
    let dir = tempfile::tempdir()?;
    let config = timed_config(receiver);
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let app = SqlStore::connect(url, table, 1, Duration::from_secs(5)).await?;
    receiver.take_arrivals();
    let (relay, _store, _) =
        assemble(url, table, "backlog", &config, dir.path(), &shutdown).await?;
    let task = spawn_relay_task(relay);
    let mut arrived: HashMap<i64, Instant> = HashMap::new();
    let deadline = Instant::now() + ARRIVAL_LIMIT;
    while arrived.len() < backlog / 4 {
        if Instant::now() > deadline {
            bail!("a quarter of the backlog did not arrive within {ARRIVAL_LIMIT:?}");
        }
        arrived.extend(receiver.take_arrivals());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut committed = Vec::new();
    for i in 0..NEW_UNDER_BACKLOG {
        let row = store::NewRow {
            channel: "hook".into(),
            payload: payload(i),
            ..Default::default()
        };
        let id = app.enqueue(&row).await?;
        committed.push((id, Instant::now()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while Instant::now() < deadline && committed.iter().any(|(id, _)| !arrived.contains_key(id)) {
        arrived.extend(receiver.take_arrivals());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown.cancel();
    let _ = task.await;
    app.pool().close().await;
    let new: Vec<i64> = committed.iter().map(|(id, _)| *id).collect();
    let mut rows = Vec::new();
    for (id, at) in &committed {
        let Some(got) = arrived.get(id) else {
            bail!("row {id}, committed under the backlog, did not arrive within {ARRIVAL_LIMIT:?}");
        };
        let ahead = arrived
            .iter()
            .filter(|(i, a)| !new.contains(i) && **a > *at && **a < *got)
            .count();
        rows.push((got.saturating_duration_since(*at), ahead));
    }
    Ok(UnderBacklog { rows })
}

/// The latency section: rows committed one by one at each of [`LATENCY_RATES`], and a few
/// committed while a backlog as large as the main run's drains.
pub(crate) async fn latency_section(
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
