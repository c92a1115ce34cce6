//! A private MariaDB server for tests that need one of their own (a server time zone, a
//! restart): `mariadb-install-db` into a temporary directory, `mariadbd` on a free port of
//! 127.0.0.1 with a database `t`, killed when its guard drops. It can be stopped (SIGTERM, a
//! clean shutdown, or SIGKILL, a crash) and started again on the same port and data.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::{Connection, Executor};

use super::process::{free_port, until};
use super::services_required;

/// A MariaDB server owned by one test.
pub struct PrivateMariaDb {
    child: Option<Child>,
    port: u16,
    zone: String,
    dir: tempfile::TempDir,
}

impl PrivateMariaDb {
    /// Starts one whose global time zone is `zone`, with a database `t`. `None` when the
    /// server binaries are missing and services are not required.
    pub async fn start(zone: &str) -> Option<PrivateMariaDb> {
        let dir = tempfile::tempdir().expect("tempdir");
        let data: PathBuf = dir.path().join("data");
        let installed = Command::new("mariadb-install-db")
            .args(["--no-defaults", "--user=root", "--skip-test-db"])
            .arg(format!("--datadir={}", data.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !installed.is_ok_and(|s| s.success()) {
            assert!(!services_required(), "mariadb-install-db is required");
            eprintln!("skipped: mariadb-install-db not available");
            return None;
        }
        let mut server = PrivateMariaDb {
            child: None,
            port: free_port(),
            zone: zone.to_string(),
            dir,
        };
        server.start_again().await;
        Some(server)
    }

    /// Starts the server (again) on its port and data; waits up to 60 s until it answers.
    pub async fn start_again(&mut self) {
        let dir = self.dir.path();
        let child = Command::new("mariadbd")
            .args(["--no-defaults", "--user=root", "--skip-grant-tables"])
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--default-time-zone={}", self.zone))
            .arg("--innodb-buffer-pool-size=16M")
            // Commits reach the OS, not the disk: a killed server loses nothing (only a machine
            // crash would), and tests that commit often do not wait on fsync.
            .arg("--innodb-flush-log-at-trx-commit=2")
            .arg(format!("--log-error={}", dir.join("err.log").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd");
        self.child = Some(child);
        let root = format!("mysql://root@127.0.0.1:{}/mysql", self.port);
        until("private MariaDB up", Duration::from_secs(60), || {
            let root = root.clone();
            async move {
                match sqlx::mysql::MySqlConnection::connect(&root).await {
                    Ok(mut c) => c.execute("CREATE DATABASE IF NOT EXISTS t").await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
    }

    /// Stops the server: SIGKILL (a crash) with `crash`, else SIGTERM (a clean shutdown),
    /// and waits up to 60 s for it to exit.
    pub async fn stop(&mut self, crash: bool) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if crash {
            let _ = child.kill();
        } else {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let exited = super::wait::holds_within(Duration::from_secs(60), async || {
            !matches!(child.try_wait(), Ok(None))
        })
        .await;
        if !exited {
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    /// `mysql://root@127.0.0.1:PORT/t`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/t", self.port)
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
