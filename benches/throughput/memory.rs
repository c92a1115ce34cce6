//! The relay binary's resident memory with the defaults: idle, and its peak while it drains
//! a backlog as fast as it can. The release binary runs as its own process (the other
//! sections run the relay inside the bench process, where the receiver and the bench share
//! its memory).

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
}

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
    let table = unique_table("rss");
    let result = rss_run_on(url, &table, receiver, rows).await;
    drop_table(
        url,
        &table,
        (db == Db::Postgres).then_some(Dialect::Postgres),
    )
    .await;
    result
}

async fn rss_run_on(
    url: &str,
    table: &str,
    receiver: &Receiver,
    rows: usize,
) -> anyhow::Result<Rss> {
    prepare_table(url, table, 0, false, 0).await?;
    let dir = tempfile::tempdir()?;
    let config = Config::webhook(&receiver.url)
        .no_lease()
        .poll_interval(Duration::from_millis(500))
        .hook(|s| s.timeout(SINK_TIMEOUT))
        .write(dir.path(), "relay.toml");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .env("OUTBOX_RELAY__DATABASE__URL", url)
        .env("OUTBOX_RELAY__DATABASE__TABLE", table)
        .env("OUTBOX_RELAY__HTTP__LISTEN", "127.0.0.1:0")
        .env("OUTBOX_RELAY__LOG__LEVEL", "warn")
        .arg("--config")
        .arg(&config)
        .arg("run")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("spawn outbox-relay")?;
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
        let started = loop {
            if receiver.count() > received_before {
                break Instant::now();
            }
            if Instant::now() > deadline {
                bail!("no row delivered within {RELAY_RUN_LIMIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        loop {
            // The receiver first (free), then the database to confirm.
            if receiver.count() - received_before >= rows as u64 {
                let done = scalar(
                    store.pool(),
                    format!("SELECT COUNT(*) FROM {table} WHERE status = 'SUCCESS'"),
                )
                .await?;
                if done as usize >= rows {
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{} of {rows} rows received within {RELAY_RUN_LIMIT:?}",
                    receiver.count() - received_before
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rows_per_sec = rows as f64 / started.elapsed().as_secs_f64();
        let peak_kib = status_kib(pid, "VmHWM:").context("read VmHWM")?;
        store.pool().close().await;
        anyhow::Ok(Rss {
            idle_kib,
            peak_kib,
            rows_per_sec,
        })
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    outcome
}
