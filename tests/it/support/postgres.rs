//! A private PostgreSQL cluster for fault tests that restart the database: `initdb` into a
//! temporary directory, `pg_ctl` on a free port of 127.0.0.1 (never the machine's shared
//! server), `fsync=off`. It can be stopped (`fast` or `immediate`, a crash) and started again on
//! the same port and data, and is stopped (immediate) when its guard drops.
//!
//! `initdb` refuses to run as root: as root every server command runs as the `postgres` user
//! (`runuser -u postgres --`), in a directory handed to that user.
//!
//! Skip rule (as for the other services): without `initdb` (Debian's `postgresql` server
//! package), [`PrivatePostgres::start`] returns `None` after a message, unless
//! `OUTBOX_RELAY_REQUIRE_SERVICES=1`, which makes it panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{free_port, run_to_end};
use super::services_required;

/// How long `pg_ctl` may take to start or stop the server.
const PG_CTL_WAIT: Duration = Duration::from_secs(60);

/// The directory holding `initdb` and `pg_ctl`: `OUTBOX_RELAY_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin` that has them.
fn pg_bin() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("OUTBOX_RELAY_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// True when running as root (the server commands then run as `postgres`).
fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A PostgreSQL cluster owned by one test.
pub struct PrivatePostgres {
    port: u16,
    bin: PathBuf,
    as_postgres: bool,
    /// Holds the data directory, the socket and the server log.
    dir: tempfile::TempDir,
    running: bool,
}

impl PrivatePostgres {
    /// Creates a cluster and starts it; `None` (test skipped) when `initdb` is missing and
    /// services are not required.
    pub async fn start() -> Option<PrivatePostgres> {
        let Some(bin) = pg_bin() else {
            if services_required() {
                panic!(
                    "initdb is required (OUTBOX_RELAY_REQUIRE_SERVICES=1) but no \
                     /usr/lib/postgresql/*/bin/initdb was found (set OUTBOX_RELAY_TEST_PG_BIN)"
                );
            }
            eprintln!("SKIPPED: no PostgreSQL server binaries (initdb) found");
            return None;
        };
        let dir = tempfile::tempdir().expect("tempdir for PostgreSQL");
        let as_postgres = is_root();
        if as_postgres {
            let out = run_to_end(
                "chown the cluster directory",
                Command::new("chown").arg("postgres:").arg(dir.path()),
                Duration::from_secs(10),
            )
            .await;
            assert!(out.status.success(), "chown: {out:?}");
        }
        let mut pg = PrivatePostgres {
            port: 0,
            bin,
            as_postgres,
            dir,
            running: false,
        };
        let data = pg.data();
        let out = run_to_end(
            "initdb",
            pg.command("initdb").arg("-D").arg(&data).args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ]),
            Duration::from_secs(120),
        )
        .await;
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Another process may take the port between the probe and the server's bind.
        for attempt in 0..5 {
            pg.port = free_port();
            match pg.start_server().await {
                Ok(()) => return Some(pg),
                Err(e) if attempt < 4 => eprintln!("PostgreSQL did not start ({e}); new port"),
                Err(e) => panic!("private PostgreSQL did not start: {e}"),
            }
        }
        unreachable!()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// `bin/name`, run as `postgres` when we are root.
    fn command(&self, name: &str) -> Command {
        let exe = self.bin.join(name);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        cmd.stdin(Stdio::null()).current_dir(self.dir.path());
        cmd
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server on its port; waits until it accepts connections.
    async fn start_server(&mut self) -> Result<(), String> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off \
             -c max_connections=200 -c shared_buffers=32MB",
            self.port,
            self.dir.path().display()
        );
        let out = run_to_end(
            "pg_ctl start",
            self.command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .arg("-l")
                .arg(self.log())
                .args(["-w", "-t", &PG_CTL_WAIT.as_secs().to_string(), "-o", &opts])
                .arg("start"),
            PG_CTL_WAIT + Duration::from_secs(10),
        )
        .await;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl start: {}{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log_tail(20)
            ));
        }
        self.running = true;
        Ok(())
    }

    /// Starts the server again (same port and data); panics if it does not come up.
    pub async fn start_again(&mut self) {
        super::wait::until_reads(
            Duration::from_secs(30),
            async || {
                let started = self.start_server().await;
                // The port may linger for a moment after a stop.
                if let Err(e) = &started {
                    eprintln!("PostgreSQL restart failed ({e}); retrying");
                }
                started
            },
            Result::is_ok,
            |e| format!("private PostgreSQL did not restart: {}", e.unwrap_err()),
        )
        .await
        .expect("restarted");
    }

    /// Stops the server: `fast` (clients are disconnected, a clean shutdown) or, with
    /// `immediate`, a crash (recovery at the next start).
    pub async fn stop(&mut self, immediate: bool) {
        let mode = if immediate { "immediate" } else { "fast" };
        let out = run_to_end(
            "pg_ctl stop",
            self.command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-w", "-t", &PG_CTL_WAIT.as_secs().to_string(), "-m", mode])
                .arg("stop"),
            PG_CTL_WAIT + Duration::from_secs(10),
        )
        .await;
        assert!(
            out.status.success(),
            "pg_ctl stop -m {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.running = false;
    }

    /// The whole server log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// The last `n` lines of the server log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// The postmaster's pid from `data/postmaster.pid` (its first line).
fn postmaster_pid(data: &Path) -> Option<u32> {
    std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // No panics here: `pg_ctl stop -m immediate`, bounded; only if that did not succeed,
        // SIGKILL of the postmaster named by the pid file (its children exit when it goes).
        let mut stopped = !self.running;
        if let Ok(mut child) = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "20", "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            let deadline = Instant::now() + Duration::from_secs(25);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            stopped |= child.wait().is_ok_and(|s| s.success());
        }
        if !stopped && let Some(pid) = postmaster_pid(&self.data()) {
            let _ = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- log of the private PostgreSQL on port {} (last 20 lines) ----\n{}",
                self.port,
                self.log_tail(20)
            );
        }
    }
}
