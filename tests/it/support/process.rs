//! Child processes of the suites: the relay binary with a clean environment, a guard that kills
//! a running relay when its test ends (and prints its log if the test failed), its HTTP
//! endpoints, one-shot commands run to their end under a timeout, and polling with a deadline.
//!
//! Every process started through [`RelayProc`] is killed (SIGKILL) and reaped by its guard,
//! however the test ends; the waits on relays and on [`run_to_end`] / [`output_within`]
//! commands have timeouts.

use std::ffi::OsStr;
use std::fmt::Display;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::config::Config;
pub use super::wait::*;
use super::{TestDb, relay_bin};

/// How many lines of a relay's log are printed when its test fails (unless the whole log was
/// asked for with [`RelayProc::print_whole_log`]).
const LOG_TAIL: usize = 60;

/// How often [`RelayProc::wait_exit`] looks at the process: often, so the moment of the exit
/// is measured to a few milliseconds (hand-off tests compare it with request times).
const EXIT_POLL: Duration = Duration::from_millis(2);

/// How often [`run_to_end`] and [`output_within`] look at their command.
const COMMAND_POLL: Duration = Duration::from_millis(20);

/// A duration as the relay's configuration spells it: `"1500ms"`.
pub fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Signed milliseconds from `from` to `to` (negative when `to` is earlier).
pub fn delta_ms(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1000.0
    } else {
        -((from - to).as_secs_f64() * 1000.0)
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local address").port()
}

/// Starts a server of the test's own with `start(port)` on a free port. Another process may
/// take the port between the probe and the server's bind, so a failed start is tried again on
/// a fresh port, five times in all; panics naming `what` with the last error.
pub async fn start_on_free_port(what: &str, mut start: impl AsyncFnMut(u16) -> Result<(), String>) {
    let mut err = String::new();
    for _ in 0..5 {
        match start(free_port()).await {
            Ok(()) => return,
            Err(e) => {
                eprintln!("{what} failed to start ({e}); trying another port");
                err = e;
            }
        }
    }
    panic!("{what} did not start: {err}");
}

/// Writes `text` to the file `name` in `dir` (a test's config file); returns its path.
pub fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

/// The relay binary, run in `dir` (so no `config/relay.toml` of the checkout is picked up),
/// with stdin closed and nothing from the test's own environment leaking into its
/// configuration: every `OUTBOX_RELAY*` variable and `RUST_LOG` are removed.
pub fn relay_command(dir: &Path) -> Command {
    let mut cmd = Command::new(relay_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OUTBOX_RELAY") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("RUST_LOG")
        .current_dir(dir)
        .stdin(Stdio::null());
    cmd
}

/// [`relay_command`] in `td`'s directory on `td`'s database and table; the lease name is the
/// table name, so parallel tests never share a lease row.
pub fn relay_on_table(td: &TestDb) -> Command {
    let mut cmd = relay_command(td.dir.path());
    cmd.env("OUTBOX_RELAY__DATABASE__URL", &td.url)
        .env("OUTBOX_RELAY__DATABASE__TABLE", &td.table)
        .env("OUTBOX_RELAY__LEASE__NAME", &td.table);
    cmd
}

/// [`relay_on_table`] with `--config config` and the HTTP endpoints on a free port (never the
/// default one): ready for `run`, or for a verb that reads the same configuration.
pub fn relay_with_config(td: &TestDb, config: &Path) -> Command {
    let mut cmd = relay_on_table(td);
    cmd.env("OUTBOX_RELAY__HTTP__LISTEN", "127.0.0.1:0")
        .arg("--config")
        .arg(config);
    cmd
}

/// A running relay (`outbox-relay run`, or any long-lived child) owned by one test. Its stdout
/// and stderr go to a log file. When dropped it is killed (SIGKILL) and reaped if still
/// running, and if the test is failing the end of its log is printed.
pub struct RelayProc {
    /// The instance name, used in every message about this process.
    pub name: String,
    child: Child,
    log: PathBuf,
    /// The exit status, once the exit was seen.
    status: Option<ExitStatus>,
    /// How many lines of the log to print on failure; `None`: all of it.
    tail: Option<usize>,
}

impl RelayProc {
    /// Spawns `cmd` as relay `name`, its stdout and stderr written to the (new) file `log`.
    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> RelayProc {
        let out = std::fs::File::create(&log).expect("create log");
        let err = out.try_clone().expect("clone log");
        let child = cmd
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn outbox-relay");
        RelayProc {
            name: name.to_string(),
            child,
            log,
            status: None,
            tail: Some(LOG_TAIL),
        }
    }

    /// `outbox-relay run` as instance `instance` on `td`'s table with `config`
    /// ([`relay_with_config`]) and the extra variables `envs` (which win over the defaults);
    /// its log is `<dir>/<instance>.log`.
    pub fn start_instance<I, K, V>(td: &TestDb, config: &Path, instance: &str, envs: I) -> RelayProc
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let mut cmd = relay_with_config(td, config);
        cmd.env("OUTBOX_RELAY__RELAY__INSTANCE_ID", instance)
            .envs(envs)
            .arg("run");
        let log = td.dir.path().join(format!("{instance}.log"));
        RelayProc::spawn(instance, &mut cmd, log)
    }

    /// `outbox-relay run` as instance `instance` on `td`'s table with `config`, written to
    /// `<dir>/<instance>.toml`; the sink requests carry no instance marker unless the config
    /// adds one (an `x-relay` header). Its log is `<dir>/<instance>.log`.
    pub fn start(td: &TestDb, config: &Config, instance: &str) -> RelayProc {
        let path = config.write(td.dir.path(), &format!("{instance}.toml"));
        let lease = config.lease_name_set().unwrap_or_else(|| td.table.clone());
        RelayProc::start_instance(td, &path, instance, [("OUTBOX_RELAY__LEASE__NAME", lease)])
    }

    /// Prints the whole log, not only its last lines, if the test fails.
    pub fn print_whole_log(mut self) -> RelayProc {
        self.tail = None;
        self
    }

    /// Prints only the last `n` lines of the log if the test fails (none for 0).
    pub fn set_log_tail(&mut self, n: usize) {
        self.tail = Some(n);
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process has not exited.
    pub fn running(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status.is_none()
    }

    /// Sends a signal by name (`TERM`, `STOP`, `CONT`, ...) through `kill(1)`; true if sent.
    fn send_signal(&self, sig: &str) -> bool {
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill")
            .success()
    }

    /// Sends a signal by name (`TERM`, `STOP`, `CONT`, ...); panics if it could not be sent.
    pub fn signal(&self, sig: &str) {
        assert!(
            self.send_signal(sig),
            "kill -{sig} {} ({}) failed",
            self.pid(),
            self.name
        );
    }

    /// Sends SIGTERM; panics if it could not be sent.
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// kill -9, and waits for the process to be gone.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.status = Some(self.child.wait().expect("wait after SIGKILL"));
    }

    /// Waits for the process to exit; panics (with its log) after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.wait_exit_at(timeout).await.0
    }

    /// As [`RelayProc::wait_exit`], also returning when the exit was seen (polled every 2 ms).
    pub async fn wait_exit_at(&mut self, timeout: Duration) -> (ExitStatus, Instant) {
        let deadline = Instant::now() + timeout;
        while self.running() {
            if Instant::now() >= deadline {
                panic!(
                    "relay {} did not exit within {timeout:?}\n{}",
                    self.name,
                    self.log_text()
                );
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
        (self.status.expect("exited"), Instant::now())
    }

    /// Stops the relay if it still runs: SIGTERM, then waits up to `timeout` for the exit.
    /// Does not fail when it does not exit in time (the guard kills it when dropped); returns
    /// the exit status if it exited.
    pub async fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.running() {
            let _ = self.send_signal("TERM");
        }
        holds_within(timeout, async || !self.running()).await;
        self.status
    }

    /// The log so far (stdout and stderr).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The HTTP address (`/metrics`, `/readyz`), from the "serving /metrics" log line; waits up
    /// to 10 s for it.
    pub async fn http_addr(&self) -> String {
        self.logged_addr("serving /metrics").await
    }

    /// The console's address, from the "serving the console" log line; waits up to 10 s.
    pub async fn console_addr(&self) -> String {
        self.logged_addr("serving the console").await
    }

    /// The `addr=` of the first log line containing `marker`; waits up to 10 s for it.
    async fn logged_addr(&self, marker: &str) -> String {
        let addr = poll_every(POLL, Duration::from_secs(10), async || {
            self.log_text()
                .lines()
                .filter(|l| l.contains(marker))
                .find_map(|l| l.split("addr=").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string)
        })
        .await;
        addr.unwrap_or_else(|| {
            panic!(
                "relay {} never logged {marker:?} with an address:\n{}",
                self.name,
                self.log_text()
            )
        })
    }

    /// The `/metrics` text; panics unless it is answered with 200.
    pub async fn metrics(&self) -> String {
        let addr = self.http_addr().await;
        let (status, body) = http_get(&addr, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("GET /metrics of relay {}: {e}", self.name));
        assert_eq!(status, 200, "GET /metrics of relay {}", self.name);
        body
    }

    /// The sum of a metric's samples (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        self.metric_labelled(name, "").await
    }

    /// The sum of a metric's samples whose label text contains `labels` (0 when absent).
    pub async fn metric_labelled(&self, name: &str, labels: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter(|l| l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next())
            .filter_map(|v| v.parse::<f64>().ok())
            .sum()
    }

    /// `/readyz`: (status, body).
    pub async fn readyz(&self) -> (u16, String) {
        let addr = self.http_addr().await;
        http_get(&addr, "/readyz")
            .await
            .unwrap_or_else(|e| panic!("GET /readyz of relay {}: {e}", self.name))
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        // No `expect` here: a second panic while the test is failing would abort the run.
        if self.status.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            let log = self.log_text();
            let lines: Vec<&str> = log.lines().collect();
            let shown = match self.tail {
                Some(0) => &lines[..0],
                Some(n) => {
                    eprintln!("---- log of relay {} (last {n} lines) ----", self.name);
                    &lines[lines.len().saturating_sub(n)..]
                }
                None => {
                    eprintln!("---- log of relay {} ----", self.name);
                    &lines[..]
                }
            };
            for line in shown {
                eprintln!("{line}");
            }
        }
    }
}

/// A plain HTTP/1.0 GET of `path` on `addr` (`host:port`) with a 5 s timeout; returns the
/// status and the body.
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| anyhow::anyhow!("no HTTP status in {text:?}"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .map_err(|_| anyhow::anyhow!("GET {path} timed out"))?
}

/// A GET of `url` through `reqwest`: (status, body), or `None` when there is no answer (not
/// listening yet, connection refused, ...).
pub async fn fetch(url: &str) -> Option<(u16, String)> {
    outbox_relay::install_crypto_provider();
    let resp = reqwest::get(url).await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

/// A spawned command whose stdout and stderr are read by threads as it writes them (a chatty
/// command cannot fill a pipe and stall).
struct Captured {
    child: Child,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
}

impl Captured {
    /// Spawns `cmd` with stdout and stderr captured.
    fn spawn(cmd: &mut Command) -> Captured {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
        let stdout = drain(child.stdout.take().expect("stdout"));
        let stderr = drain(child.stderr.take().expect("stderr"));
        Captured {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits (blocking) for the command to end and collects what it wrote; past `timeout`
    /// SIGKILLs it, reaps it and panics naming `what`, with what it wrote.
    fn wait_within(mut self, what: &str, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let mut timed_out = false;
        while self.child.try_wait().expect("try_wait").is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                timed_out = true;
                break;
            }
            std::thread::sleep(COMMAND_POLL);
        }
        let status = self.child.wait().expect("wait");
        let out = Output {
            status,
            stdout: self.stdout.join().expect("stdout reader"),
            stderr: self.stderr.join().expect("stderr reader"),
        };
        if timed_out {
            panic!(
                "{what} did not finish within {timeout:?}; it wrote:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        out
    }
}

/// Reads a pipe to its end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        buf
    })
}

/// Runs `cmd` to its end with stdout and stderr captured, from async code (the waiting runs
/// on the blocking pool); SIGKILLs it and panics (naming `what`, with what it wrote) if it
/// takes longer than `timeout`.
pub async fn run_to_end(what: impl Display, cmd: &mut Command, timeout: Duration) -> Output {
    let c = Captured::spawn(cmd);
    let what = what.to_string();
    match tokio::task::spawn_blocking(move || c.wait_within(&what, timeout)).await {
        Ok(out) => out,
        // The waiter's panic (the timeout) is the test's failure: pass it on as it is.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// As [`run_to_end`], for tests without a runtime (blocks the calling thread).
pub fn output_within(what: impl Display, cmd: &mut Command, timeout: Duration) -> Output {
    Captured::spawn(cmd).wait_within(&what.to_string(), timeout)
}

/// Enqueues a row for the built-in `log` sink with `outbox-relay enqueue` in `dir` (the
/// embedded default database, created on demand there); panics with its stderr if that fails.
pub fn enqueue_log_row(dir: &Path, payload: &str) {
    let out = relay_command(dir)
        .args(["enqueue", "--channel", "log", "--payload", payload])
        .output()
        .expect("run outbox-relay enqueue");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
