//! Throwaway `redis-server` processes for fault tests: each on a free port of 127.0.0.1, with
//! no persistence, killed (SIGKILL) when its guard drops. A server can be killed and started
//! again on the same port (a Redis outage and its recovery).
//!
//! Also a minimal RESP client over a plain TCP connection ([`RedisServer::cmd`]), so a test
//! can play a foreign client (`SET key other NX PX 3000`) or inspect the lease key without
//! going through the code under test.
//!
//! Skip rule (as for the databases): when `redis-server` is not on `PATH`, [`RedisServer::start`]
//! returns `None` after printing a message, unless `OUTBOX_RELAY_REQUIRE_SERVICES=1`, which
//! makes it panic instead.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::process::start_on_free_port;
use super::services_required;

/// One RESP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Int(i64),
    /// `$n` (text, lossily decoded); `None` for the null bulk string (`$-1`).
    Bulk(Option<String>),
    /// `*n`; `None` for the null array.
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The reply as text: simple and bulk strings (`None` for nil and other kinds).
    pub fn text(&self) -> Option<&str> {
        match self {
            Resp::Simple(s) | Resp::Bulk(Some(s)) => Some(s),
            _ => None,
        }
    }

    /// The reply as an integer, if it is one.
    pub fn int(&self) -> Option<i64> {
        match self {
            Resp::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// True for the null bulk string or null array (e.g. `SET .. NX` that did not set).
    pub fn is_nil(&self) -> bool {
        matches!(self, Resp::Bulk(None) | Resp::Array(None))
    }
}

/// True when `redis-server` is found on `PATH`.
pub fn redis_server_available() -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|d| d.join("redis-server").is_file())
}

/// A `redis-server` process owned by one test.
pub struct RedisServer {
    port: u16,
    /// Extra arguments (e.g. `--requirepass x`), kept for restarts.
    extra: Vec<String>,
    /// The password given with `--requirepass`, used by [`RedisServer::cmd`].
    password: Option<String>,
    child: Option<Child>,
    /// Working directory (nothing is persisted, but Redis wants one) and log file.
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl RedisServer {
    /// Starts `redis-server` on a free port with `extra` arguments and waits until it answers.
    /// `None` (test skipped) when `redis-server` is not installed and services are not
    /// required; panics when they are.
    pub async fn start(extra: &[&str]) -> Option<RedisServer> {
        if !redis_server_available() {
            if services_required() {
                panic!(
                    "redis-server is required (OUTBOX_RELAY_REQUIRE_SERVICES=1) but is not on PATH"
                );
            }
            eprintln!("SKIPPED: redis-server is not on PATH");
            return None;
        }
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let password = extra
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| extra.get(i + 1))
            .cloned();
        let dir = tempfile::tempdir().expect("tempdir for redis-server");
        let log = dir.path().join("redis.log");
        let mut server = RedisServer {
            port: 0,
            extra,
            password,
            child: None,
            dir,
            log,
        };
        start_on_free_port("redis-server", async |port| {
            server.port = port;
            server.spawn_and_wait().await
        })
        .await;
        Some(server)
    }

    /// The port it listens on (kept across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// True while the server process runs.
    pub fn running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server at once (SIGKILL: no shutdown, no goodbye to clients) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port, with the same arguments (empty: nothing is
    /// persisted). Waits until it answers; panics if it does not within 10 s.
    pub async fn restart(&mut self) {
        self.kill();
        let port = self.port;
        super::wait::until_reads(
            Duration::from_secs(10),
            async || {
                let started = self.spawn_and_wait().await;
                if let Err(e) = &started {
                    // The port may still be held for a moment (or taken by someone else).
                    eprintln!("redis-server restart on port {port} failed: {e}; retrying");
                }
                started
            },
            Result::is_ok,
            |e| {
                format!(
                    "redis-server could not restart on port {port}: {}",
                    e.unwrap_err()
                )
            },
        )
        .await
        .expect("restarted");
    }

    /// The server's own log (for failure messages).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends one command on a fresh connection (AUTH first when the server has a password)
    /// and returns the reply. Bounded by 2 s.
    pub async fn cmd(&self, args: &[&str]) -> anyhow::Result<Resp> {
        command(self.port, self.password.as_deref(), args).await
    }

    /// The lease key's value (`None` when absent). Panics if Redis does not answer.
    pub async fn get(&self, key: &str) -> Option<String> {
        match self.cmd(&["GET", key]).await {
            Ok(r) if r.is_nil() => None,
            Ok(r) => Some(
                r.text()
                    .unwrap_or_else(|| panic!("GET {key}: unexpected reply {r:?}"))
                    .to_string(),
            ),
            Err(e) => panic!("GET {key} on redis port {}: {e}", self.port),
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("open redis log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .spawn()
            .map_err(|e| format!("spawn redis-server: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Spawns the process and waits (up to 5 s) until it answers PING.
    async fn spawn_and_wait(&mut self) -> Result<(), String> {
        self.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if !self.running() {
                self.child = None;
                return Err(format!(
                    "redis-server on port {} exited at start:\n{}",
                    self.port,
                    self.log_text()
                ));
            }
            if let Ok(r) = command(self.port, self.password.as_deref(), &["PING"]).await
                && r.text() == Some("PONG")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "redis-server on port {} did not answer PING within 5s",
                    self.port
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!(
                "---- log of redis-server on port {} (last 20 lines) ----",
                self.port
            );
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// One command on a fresh connection to 127.0.0.1:`port`, authenticating first if `password`.
pub async fn command(port: u16, password: Option<&str>, args: &[&str]) -> anyhow::Result<Resp> {
    let fut = async {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        let mut conn = BufReader::new(stream);
        if let Some(pw) = password {
            write_command(&mut conn, &["AUTH", pw]).await?;
            match read_reply(&mut conn).await? {
                Resp::Simple(_) => {}
                other => anyhow::bail!("AUTH failed: {other:?}"),
            }
        }
        write_command(&mut conn, args).await?;
        read_reply(&mut conn).await
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .map_err(|_| anyhow::anyhow!("redis command {:?} timed out", args.first()))?
}

/// A connection subscribed to one channel, as a Redis client library's waiters are.
pub struct Subscription {
    conn: BufReader<TcpStream>,
}

impl Subscription {
    /// Subscribes to `channel` on 127.0.0.1:`port`; returns once the server confirmed it.
    pub async fn open(port: u16, channel: &str) -> anyhow::Result<Subscription> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        let mut conn = BufReader::new(stream);
        write_command(&mut conn, &["SUBSCRIBE", channel]).await?;
        let confirm = tokio::time::timeout(Duration::from_secs(2), read_reply(&mut conn))
            .await
            .map_err(|_| anyhow::anyhow!("SUBSCRIBE {channel} not confirmed"))??;
        anyhow::ensure!(
            matches!(&confirm, Resp::Array(Some(v)) if v.first().and_then(Resp::text) == Some("subscribe")),
            "SUBSCRIBE {channel}: {confirm:?}"
        );
        Ok(Subscription { conn })
    }

    /// The next message's (channel, payload), or `None` when none arrives within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<(String, String)> {
        let reply = tokio::time::timeout(timeout, read_reply(&mut self.conn))
            .await
            .ok()?
            .ok()?;
        match reply {
            Resp::Array(Some(v)) if v.len() == 3 && v[0].text() == Some("message") => Some((
                v[1].text().unwrap_or_default().to_string(),
                v[2].text().unwrap_or_default().to_string(),
            )),
            _ => None,
        }
    }
}

async fn write_command(conn: &mut BufReader<TcpStream>, args: &[&str]) -> anyhow::Result<()> {
    let mut buf = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        buf.extend_from_slice(a.as_bytes());
        buf.extend_from_slice(b"\r\n");
    }
    conn.get_mut().write_all(&buf).await?;
    Ok(())
}

async fn read_line(conn: &mut BufReader<TcpStream>) -> anyhow::Result<String> {
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        anyhow::bail!("connection closed by redis-server");
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_reply(
    conn: &mut BufReader<TcpStream>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Resp>> + Send + '_>> {
    Box::pin(async move {
        let line = read_line(conn).await?;
        let (kind, rest) = line.split_at(1.min(line.len()));
        Ok(match kind {
            "+" => Resp::Simple(rest.to_string()),
            "-" => Resp::Error(rest.to_string()),
            ":" => Resp::Int(rest.parse()?),
            "$" => {
                let n: i64 = rest.parse()?;
                if n < 0 {
                    Resp::Bulk(None)
                } else {
                    let mut data = vec![0u8; n as usize + 2];
                    conn.read_exact(&mut data).await?;
                    data.truncate(n as usize);
                    Resp::Bulk(Some(String::from_utf8_lossy(&data).into_owned()))
                }
            }
            "*" => {
                let n: i64 = rest.parse()?;
                if n < 0 {
                    Resp::Array(None)
                } else {
                    let mut items = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        items.push(read_reply(conn).await?);
                    }
                    Resp::Array(Some(items))
                }
            }
            _ => anyhow::bail!("unexpected RESP line {line:?}"),
        })
    })
}
