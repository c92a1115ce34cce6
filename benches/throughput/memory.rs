//! The relay binary as its own process (the other sections run the relay inside the bench
//! process, where the receiver and the bench share its memory and CPU): its resident memory
//! with the defaults, idle and at its peak while it drains a backlog as fast as it can; and its
//! start, on a table whose backlog is already there when it starts, with the default
//! `database` lease: the time to its first send, and its rate counted from the start; then
//! started on a keyed backlog five times as long, over [`KEYED_START_KEYS`] keys, with all
//! its housekeeping on (the in-process drains of the leader section have none: a gauge
//! sampled every 15 s whose cost grew with the square of a key's backlog went unseen there).

use super::*;

/// One memory run's figures.
#[derive(Debug, Clone)]
pub(crate) struct Rss {
    /// `VmRSS` after two seconds with nothing to do, KiB.
    pub(crate) idle_kib: u64,
    /// `VmHWM` (peak resident) after draining the backlog, KiB.
    pub(crate) peak_kib: u64,
    /// The binary's rate over the backlog, from its first send until every row is SUCCESS.
    pub(crate) rows_per_sec: f64,
    /// The receiver's ceiling around the binary's runs (before the memory run and after the
    /// start run), set by the caller.
    pub(crate) ceiling: Option<f64>,
}

/// One start run's figures.
#[derive(Debug, Clone)]
pub(crate) struct Start {
    /// From the spawn of the process to the receiver's first request.
    pub(crate) first_send: Duration,
    /// The backlog's rows over the time from the spawn until every row is SUCCESS.
    pub(crate) rows_per_sec: f64,
    /// As [`Rss::ceiling`].
    pub(crate) ceiling: Option<f64>,
    /// Started on the keyed backlog: its rows and rows/s from the spawn.
    pub(crate) keyed: Option<(usize, f64)>,
}

/// The keys of the keyed start's backlog, round-robin (20 hot keys: issue 36).
pub(crate) const KEYED_START_KEYS: usize = 20;

/// A field of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Runs `outbox-relay run` with the defaults (no lease) on a fresh table: idle for two
/// seconds, then a backlog of `rows` rows committed at once, until all are SUCCESS.
pub(crate) async fn rss_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    rows: usize,
) -> anyhow::Result<Rss> {
    on_own_table(db, url, "rss", async |t| {
        rss_run_on(url, t, receiver, rows).await
    })
    .await
}

async fn rss_run_on(
    url: &str,
    table: &str,
    receiver: &Receiver,
    rows: usize,
) -> anyhow::Result<Rss> {
    prepare_table(url, table, 0, false, Rows::default()).await?;
    let dir = tempfile::tempdir()?;
    let config = Config::webhook(&receiver.url)
        .no_lease()
        .poll_interval(Duration::from_millis(500))
        .hook(|s| s.timeout(SINK_TIMEOUT))
        .write(dir.path(), "relay.toml");
    let mut child = spawn_relay(&config, dir.path(), url, table)?;
    let pid = child.id();
    let outcome = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle_kib = status_kib(pid, "VmRSS:").context("read VmRSS")?;
        let store = SqlStore::connect(url, table, 2, Duration::from_secs(5)).await?;
        // The backlog commits in one transaction, so the relay finds it whole (as it finds
        // the main run's), and is timed from its first send: neither the insert nor the
        // relay's wait for its next poll counts, as neither does in the main run.
        let received_before = receiver.count();
        fill_at_once(&store, table, rows).await?;
        let committed = Instant::now();
        let deadline = committed + RELAY_RUN_LIMIT;
        let started = first_send(receiver, received_before, deadline).await?;
        all_delivered(&store, table, receiver, received_before, rows, deadline).await?;
        let rows_per_sec = rows as f64 / started.elapsed().as_secs_f64();
        let peak_kib = status_kib(pid, "VmHWM:").context("read VmHWM")?;
        store.pool().close().await;
        anyhow::Ok(Rss {
            idle_kib,
            peak_kib,
            rows_per_sec,
            ceiling: None,
        })
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    outcome
}

/// Runs `outbox-relay run` with the defaults (the `database` lease included) on a table that
/// already holds `rows` waiting rows, timed from the spawn: what a user who starts the relay
/// on a backlog sees, start-up (connections, migration check, lease) included.
pub(crate) async fn start_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
    rows: usize,
    keys: usize,
) -> anyhow::Result<Start> {
    on_own_table(db, url, "start", async |t| {
        start_run_on(url, t, receiver, rows, keys).await
    })
    .await
}

async fn start_run_on(
    url: &str,
    table: &str,
    receiver: &Receiver,
    rows: usize,
    keys: usize,
) -> anyhow::Result<Start> {
    let keyed = Rows {
        keys,
        ..Rows::default()
    };
    prepare_table(url, table, rows, true, keyed).await?;
    let dir = tempfile::tempdir()?;
    let config = Config::webhook(&receiver.url)
        .poll_interval(Duration::from_millis(500))
        .hook(|s| s.timeout(SINK_TIMEOUT))
        .write(dir.path(), "relay.toml");
    let store = SqlStore::connect(url, table, 2, Duration::from_secs(5)).await?;
    let received_before = receiver.count();
    let spawned = Instant::now();
    let mut child = spawn_relay(&config, dir.path(), url, table)?;
    let outcome = async {
        let deadline = spawned + RELAY_RUN_LIMIT;
        let first = first_send(receiver, received_before, deadline).await?;
        all_delivered(&store, table, receiver, received_before, rows, deadline).await?;
        anyhow::Ok(Start {
            first_send: first - spawned,
            rows_per_sec: rows as f64 / spawned.elapsed().as_secs_f64(),
            ceiling: None,
            keyed: None,
        })
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    store.pool().close().await;
    outcome
}

/// Starts the release binary with `config`, on `table` at `url`, logging warnings only.
pub(crate) fn spawn_relay(
    config: &std::path::Path,
    dir: &std::path::Path,
    url: &str,
    table: &str,
) -> anyhow::Result<std::process::Child> {
    std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env("OUTBOX_RELAY__DATABASE__URL", url)
        .env("OUTBOX_RELAY__DATABASE__TABLE", table)
        .env("OUTBOX_RELAY__HTTP__LISTEN", "127.0.0.1:0")
        .env("OUTBOX_RELAY__LOG__LEVEL", "warn")
        .arg("--config")
        .arg(config)
        .arg("run")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("spawn outbox-relay")
}

/// Waits for the receiver's first request after `before`; returns when it came.
async fn first_send(
    receiver: &Receiver,
    before: u64,
    deadline: Instant,
) -> anyhow::Result<Instant> {
    loop {
        if receiver.count() > before {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("no row delivered within {RELAY_RUN_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until the receiver has `rows` requests more than `before` and the database shows
/// every row SUCCESS.
async fn all_delivered(
    store: &SqlStore,
    table: &str,
    receiver: &Receiver,
    before: u64,
    rows: usize,
    deadline: Instant,
) -> anyhow::Result<()> {
    loop {
        // The receiver first (free), then the database to confirm.
        if receiver.count() - before >= rows as u64 {
            let done = scalar(
                store.pool(),
                format!("SELECT COUNT(*) FROM {table} WHERE status = 'SUCCESS'"),
            )
            .await?;
            if done as usize >= rows {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "{} of {rows} rows received within {RELAY_RUN_LIMIT:?}",
                receiver.count() - before
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The memory section: the release binary as its own process, draining as many rows as the
/// leader section's main run (its resident memory) and started on them (its first send).
/// Its shares are taken against a ceiling measured around its two runs (see
/// `ceiling_around`), not the leader section's, minutes earlier.
pub(crate) async fn binary_section(
    plan: &Plan,
    receiver: &Receiver,
) -> (Vec<(Db, Rss)>, Vec<(Db, Start)>) {
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
        let mut start = match start_run(db, &db.url(dir.path()), receiver, rows, 0).await {
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
        if let Some(r) = start.as_mut() {
            r.keyed =
                keyed_start(db, &db.url(dir.path()), receiver, 5 * rows, r.rows_per_sec).await;
        }
        let after = ceiling_logged(db, receiver, rows, "after the binary", &mut errors).await;
        for e in errors {
            println!("  {:<8} {e}", db.name());
        }
        let ceiling = ceiling_around(before, after).best;
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

/// The release binary started on `rows` waiting rows of [`KEYED_START_KEYS`] keys: prints
/// its rate against `unkeyed` (the unkeyed start's) and returns its rows and rate.
async fn keyed_start(
    db: Db,
    url: &str,
    receiver: &Receiver,
    rows: usize,
    unkeyed: f64,
) -> Option<(usize, f64)> {
    match start_run(db, url, receiver, rows, KEYED_START_KEYS).await {
        Ok(r) => {
            println!(
                "  {:<8} start     the relay binary, defaults (database lease), started on {rows} waiting rows of {KEYED_START_KEYS} keys: {:.0} rows/s from the start, {:.2}x the unkeyed start",
                db.name(),
                r.rows_per_sec,
                r.rows_per_sec / unkeyed
            );
            Some((rows, r.rows_per_sec))
        }
        Err(e) => {
            println!("  {:<8} start     keyed: ERROR: {e:#}", db.name());
            None
        }
    }
}
