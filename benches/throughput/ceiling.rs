//! The receiver's ceiling: what it takes with no database and no relay, the figure every
//! share is taken against. Measured with wrk (Debian's `wrk`) when it is on PATH, at the best
//! of [`WRK_CONNECTIONS`] connection counts: the bench's own client (reqwest, shaped like the
//! webhook sink, [`DEFAULT_SINK_CONCURRENCY`] POSTs at once) costs more CPU per request than
//! the receiver does, and on this 2-core machine it reached 28,000-44,000 requests/s where wrk
//! measured 46,000-61,000 minutes apart (issue 36). Our own client is measured beside wrk
//! every time, for comparison; without wrk it is the ceiling, and the output says so.

use super::*;

/// The connection counts wrk is run at; the ceiling is the best of them.
const WRK_CONNECTIONS: [u32; 3] = [64, 128, 256];
/// How long each wrk run lasts.
const WRK_SECONDS: u32 = 3;
/// wrk's threads: one per core of this machine.
const WRK_THREADS: u32 = 2;

/// Which client measures the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CeilingClient {
    Wrk,
    /// The bench's own client: wrk is not installed, or `OUTBOX_RELAY_BENCH_CEILING=own`.
    Own,
}

impl CeilingClient {
    /// wrk when `wrk --version` runs (and `OUTBOX_RELAY_BENCH_CEILING` is not `own`), else the
    /// bench's own client; decided once per run.
    pub(crate) fn get() -> CeilingClient {
        static CLIENT: std::sync::OnceLock<CeilingClient> = std::sync::OnceLock::new();
        *CLIENT.get_or_init(|| {
            let forced_own = CeilingClient::wrk_forced_off();
            let wrk = std::process::Command::new("wrk")
                .arg("--version")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok();
            if wrk && !forced_own {
                CeilingClient::Wrk
            } else {
                CeilingClient::Own
            }
        })
    }

    /// Says which client measured the ceiling, for the output and the table's header.
    pub(crate) fn label(self) -> String {
        match self {
            CeilingClient::Wrk => format!(
                "wrk, best of {} connections, {WRK_SECONDS} s each",
                WRK_CONNECTIONS.map(|c| c.to_string()).join(" / ")
            ),
            CeilingClient::Own if CeilingClient::wrk_forced_off() => format!(
                "own client, {DEFAULT_SINK_CONCURRENCY} POSTs at once (OUTBOX_RELAY_BENCH_CEILING=own)"
            ),
            CeilingClient::Own => {
                format!("own client, {DEFAULT_SINK_CONCURRENCY} POSTs at once: wrk not installed")
            }
        }
    }

    fn wrk_forced_off() -> bool {
        std::env::var("OUTBOX_RELAY_BENCH_CEILING").is_ok_and(|v| v == "own")
    }
}

/// One measurement of the ceiling.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ceiling {
    /// What shares are taken against: wrk's best, or our own client's without wrk.
    pub(crate) best: Option<f64>,
    /// The bench's own client's, beside it.
    pub(crate) own: Option<f64>,
}

/// Warms the receiver before anything is measured: a receiver that compiles as it goes
/// (Node's JIT) answers the first thousands of requests slower. `requests` from our own client,
/// then a wrk run when wrk measures the ceiling.
pub(crate) async fn warm(receiver: &Receiver, requests: usize) {
    let _ = ceiling_run(receiver, requests, DEFAULT_SINK_CONCURRENCY).await;
    if CeilingClient::get() == CeilingClient::Wrk {
        let _ = wrk_run(receiver, DEFAULT_SINK_CONCURRENCY).await;
    }
}

/// The receiver's ceiling, printed with `when` (before or after the run it brackets): wrk at
/// each of [`WRK_CONNECTIONS`] (when installed), and our own client with the sink's default
/// sends at once over `requests` POSTs. A failure is noted in `errors`.
pub(crate) async fn ceiling_logged(
    db: Db,
    receiver: &Receiver,
    requests: usize,
    when: &str,
    errors: &mut Vec<String>,
) -> Ceiling {
    let sends = DEFAULT_SINK_CONCURRENCY;
    let own = match ceiling_run(receiver, requests, sends).await {
        Ok((r, cpu)) => {
            println!(
                "  {:<8} ceiling   own client, concurrency {sends}, POSTs {requests} ({when}): {r:.0} req/s{}",
                db.name(),
                fmt_cpu(cpu)
            );
            Some(r)
        }
        Err(e) => {
            errors.push(format!("ceiling {when}, own client: {e:#}"));
            None
        }
    };
    if CeilingClient::get() == CeilingClient::Own {
        return Ceiling { best: own, own };
    }
    let mut rates: Vec<(u32, f64)> = Vec::new();
    for connections in WRK_CONNECTIONS {
        match wrk_run(receiver, connections).await {
            Ok(r) => rates.push((connections, r)),
            Err(e) => errors.push(format!("ceiling {when}, wrk -c{connections}: {e:#}")),
        }
    }
    let best = rates.iter().map(|(_, r)| *r).reduce(f64::max);
    let each: Vec<String> = rates.iter().map(|(c, r)| format!("-c{c} {r:.0}")).collect();
    println!(
        "  {:<8} ceiling   wrk -t{WRK_THREADS} -d{WRK_SECONDS}s ({when}): {} req/s; best {}",
        db.name(),
        each.join(", "),
        best.map_or("-".into(), |b| format!("{b:.0}"))
    );
    Ceiling { best, own }
}

/// The ceiling a run's share is taken against: the mean of the ceilings measured right
/// before and right after it. This machine's speed drifts within a minute (neighbours on a
/// shared host); bracketing the run makes a share show the drift instead of hiding it in one
/// number (docs/performance-log.md has the run that showed it).
pub(crate) fn ceiling_around(before: Ceiling, after: Ceiling) -> Ceiling {
    let mean = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some((a + b) / 2.0),
        (a, b) => a.or(b),
    };
    Ceiling {
        best: mean(before.best, after.best),
        own: mean(before.own, after.own),
    }
}

/// The script that makes wrk's requests the webhook sink's: a POST of a payload as the bench
/// stores them, with the sink's headers.
fn wrk_script() -> String {
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|t| t.as_secs())
        .unwrap_or(0);
    let lua = |s: &str| format!("{s:?}");
    format!(
        "wrk.method = \"POST\"\nwrk.body = {}\n\
         wrk.headers[\"content-type\"] = \"application/json\"\n\
         wrk.headers[\"webhook-id\"] = \"1\"\n\
         wrk.headers[\"webhook-timestamp\"] = \"{timestamp}\"\n\
         wrk.headers[\"idempotency-key\"] = {}\n\
         wrk.headers[\"user-agent\"] = {}\n",
        lua(&payload(1)),
        lua("\"1\""),
        lua(concat!("outbox-relay/", env!("CARGO_PKG_VERSION"))),
    )
}

/// One wrk run of [`WRK_SECONDS`] at `connections` against the receiver: its requests/s.
/// Fails when wrk does, or when the receiver answered anything but 2xx.
async fn wrk_run(receiver: &Receiver, connections: u32) -> anyhow::Result<f64> {
    let mut script = tempfile::Builder::new().suffix(".lua").tempfile()?;
    std::io::Write::write_all(&mut script, wrk_script().as_bytes())?;
    let args = [
        format!("-t{WRK_THREADS}"),
        format!("-c{connections}"),
        format!("-d{WRK_SECONDS}s"),
        "-s".to_string(),
        script.path().display().to_string(),
        receiver.url.clone(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("wrk")
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
    })
    .await??;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "wrk exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if let Some(line) = text.lines().find(|l| l.contains("Non-2xx")) {
        bail!("the receiver answered wrk other than 2xx: {}", line.trim());
    }
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("no Requests/sec in wrk's output: {text}"))
}

/// The receiver alone: `n` POSTs from `concurrency` loops of our own client, no database.
pub(crate) async fn ceiling_run(
    receiver: &Receiver,
    n: usize,
    concurrency: u32,
) -> anyhow::Result<(f64, Option<CpuShares>)> {
    let client = sink_like_client()?;
    let target = reqwest::Url::parse(&receiver.url)?;
    let next = Arc::new(AtomicU64::new(0));
    let cpu_before = CpuSnap::take();
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next, url) = (client.clone(), next.clone(), target.clone());
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
