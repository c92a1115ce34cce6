//! Throwaway `nats-server` processes with JetStream for the `nats` sink's tests: each on a free
//! port of 127.0.0.1 with its store in a temporary directory, killed (SIGKILL) when its guard
//! drops, its log printed if the test failed. A test can give the server a configuration of
//! its own (users and permissions), and kill it and start it again on the same port and store
//! (an outage).
//!
//! Also the test's own view of the server through async-nats (which the relay depends on
//! anyway): streams created, purged and read back message by message, so assertions look at
//! what the stream holds, not at what the relay says it did.
//!
//! Skip rule (as for redis-server): when `nats-server` is not installed, [`NatsServer::start`]
//! returns `None` after printing a message, unless `OUTBOX_RELAY_REQUIRE_SERVICES=1`, which
//! makes it panic instead.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};

use super::process::start_on_free_port;
use super::services_required;

/// The admin user of servers started with [`NatsServer::start_with_users`].
pub const ADMIN: (&str, &str) = ("admin", "admin-pw");

/// `nats-server` on `PATH`, or Debian's `/usr/sbin/nats-server`.
pub fn nats_server_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// One message as the stream holds it.
#[derive(Debug, Clone)]
pub struct Stored {
    pub subject: String,
    pub payload: String,
    /// Its `Nats-Msg-Id` header.
    pub msg_id: Option<String>,
}

/// A `nats-server -js` process owned by one test.
pub struct NatsServer {
    bin: PathBuf,
    /// The `users` of [`NatsServer::start_with_users`], kept for restarts.
    users: Option<String>,
    port: u16,
    child: Option<Child>,
    /// The store and the log.
    dir: tempfile::TempDir,
    log: PathBuf,
    /// The user the test connects as, when the server has users.
    admin: Option<(String, String)>,
}

impl NatsServer {
    /// A server with JetStream and no authentication. `None` (test skipped) when nats-server
    /// is not installed and services are not required; panics when they are.
    pub async fn start() -> Option<NatsServer> {
        NatsServer::launch(None).await
    }

    /// A server whose `authorization { users = [...] }` block holds [`ADMIN`] (everything
    /// allowed) and `users`, NATS configuration text, e.g.
    /// `{ user: relay, password: pw, permissions: { publish: ["orders.>"] } }`.
    pub async fn start_with_users(users: &str) -> Option<NatsServer> {
        NatsServer::launch(Some(users.to_string())).await
    }

    async fn launch(users: Option<String>) -> Option<NatsServer> {
        let Some(bin) = nats_server_bin() else {
            if services_required() {
                panic!(
                    "nats-server is required (OUTBOX_RELAY_REQUIRE_SERVICES=1) but is not installed (apt-get install nats-server)"
                );
            }
            eprintln!("SKIPPED: nats-server is not installed");
            return None;
        };
        let dir = tempfile::tempdir().expect("tempdir for nats-server");
        let admin = users
            .as_ref()
            .map(|_| (ADMIN.0.to_string(), ADMIN.1.to_string()));
        let mut server = NatsServer {
            bin,
            users,
            port: 0,
            child: None,
            log: dir.path().join("nats.log"),
            admin,
            dir,
        };
        start_on_free_port("nats-server", async |port| {
            server.port = port;
            server.spawn_and_wait().await
        })
        .await;
        Some(server)
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn spawn(&mut self) -> Result<(), String> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("open nats log: {e}"))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let store = self.dir.path().join("js");
        let mut cmd = Command::new(&self.bin);
        match self.users.as_deref() {
            None => {
                cmd.args([
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-js",
                    "-sd",
                ])
                .arg(&store);
            }
            Some(users) => {
                let conf = format!(
                    "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: \"{store}\" }}\n\
                     authorization {{\n  users = [\n    {{ user: {admin}, password: {pw} }}\n    {users}\n  ]\n}}\n",
                    port = self.port,
                    store = store.display(),
                    admin = ADMIN.0,
                    pw = ADMIN.1,
                );
                let path = self.dir.path().join("nats.conf");
                std::fs::write(&path, conf).map_err(|e| e.to_string())?;
                cmd.arg("-c").arg(path);
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("spawn nats-server: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Spawns the server and waits (up to 10 s) until it answers.
    async fn spawn_and_wait(&mut self) -> Result<(), String> {
        self.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let exited = match &mut self.child {
                Some(c) => !matches!(c.try_wait(), Ok(None)),
                None => true,
            };
            if exited {
                self.child = None;
                return Err(format!(
                    "nats-server on port {} exited at start:\n{}",
                    self.port,
                    self.log_text()
                ));
            }
            // JetStream is up before the server accepts clients ("Server is ready").
            if let Ok(c) = self.try_client().await
                && c.flush().await.is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "nats-server on port {} did not answer within 10s:\n{}",
                    self.port,
                    self.log_text()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn try_client(&self) -> Result<async_nats::Client, async_nats::ConnectError> {
        let options = match &self.admin {
            Some((u, p)) => {
                async_nats::ConnectOptions::with_user_and_password(u.clone(), p.clone())
            }
            None => async_nats::ConnectOptions::new(),
        };
        options
            .connection_timeout(Duration::from_secs(2))
            .connect(self.url())
            .await
    }

    /// Starts the server again on the same port and store (its streams and messages are
    /// kept); panics if it does not answer within 10 s.
    pub async fn restart(&mut self) {
        self.kill();
        // The port may still be held for a moment after the kill.
        let port = self.port;
        super::wait::until_reads(
            Duration::from_secs(10),
            async || self.spawn_and_wait().await,
            Result::is_ok,
            |e| {
                format!(
                    "nats-server could not restart on port {port}: {}",
                    e.unwrap_err()
                )
            },
        )
        .await
        .expect("restarted");
    }

    /// Kills the server at once and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A JetStream context of the test's own (as the admin user, if the server has users).
    pub async fn js(&self) -> jetstream::Context {
        let client = self.try_client().await.expect("connect to nats-server");
        jetstream::new(client)
    }

    /// Creates stream `name` on `subjects`; with `max_msgs`, a stream that refuses new
    /// messages once it holds that many (discard new).
    pub async fn create_stream(&self, name: &str, subjects: &[&str], max_msgs: Option<i64>) {
        let config = stream::Config {
            name: name.to_string(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            max_messages: max_msgs.unwrap_or(-1),
            discard: if max_msgs.is_some() {
                stream::DiscardPolicy::New
            } else {
                stream::DiscardPolicy::Old
            },
            ..Default::default()
        };
        self.js()
            .await
            .create_stream(config)
            .await
            .unwrap_or_else(|e| panic!("create stream {name}: {e}"));
    }

    /// Stream `name`; panics if it cannot be had.
    async fn stream(&self, name: &str) -> stream::Stream {
        self.js()
            .await
            .get_stream(name)
            .await
            .unwrap_or_else(|e| panic!("stream {name}: {e}"))
    }

    /// How many messages stream `name` holds.
    pub async fn count(&self, name: &str) -> u64 {
        self.stream(name)
            .await
            .info()
            .await
            .unwrap_or_else(|e| panic!("info of stream {name}: {e}"))
            .state
            .messages
    }

    /// Every message stream `name` holds, in order.
    pub async fn messages(&self, name: &str) -> Vec<Stored> {
        let mut s = self.stream(name).await;
        let state = s.info().await.expect("stream info").state.clone();
        let mut out = Vec::new();
        if state.messages == 0 {
            return out;
        }
        for seq in state.first_sequence..=state.last_sequence {
            let m = s
                .get_raw_message(seq)
                .await
                .unwrap_or_else(|e| panic!("message {seq} of {name}: {e}"));
            out.push(Stored {
                subject: m.subject.to_string(),
                payload: String::from_utf8_lossy(&m.payload).into_owned(),
                msg_id: m
                    .headers
                    .get(async_nats::header::NATS_MESSAGE_ID)
                    .map(|v| v.as_str().to_string()),
            });
        }
        out
    }

    /// Removes every message of stream `name` (space frees in a full stream).
    pub async fn purge(&self, name: &str) {
        self.stream(name)
            .await
            .purge()
            .await
            .unwrap_or_else(|e| panic!("purge {name}: {e}"));
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log_text();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "---- log of nats-server on port {} (last 30 lines) ----",
                self.port
            );
            for line in &lines[lines.len().saturating_sub(30)..] {
                eprintln!("{line}");
            }
        }
    }
}
