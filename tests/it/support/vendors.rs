//! Shared harness of the vendor-sink suites (`fcm.rs`, `alimtalk.rs`): sinks built
//! from TOML through the public configuration API, test RSA keys made with the `openssl` CLI
//! at test time (never stored in the repository), an RS256 verifier that does not share code
//! with the relay's signer, request recorders for wiremock servers, and the relay binary run
//! against a SQLite file with its log captured.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use outbox_relay::config::Settings;
use outbox_relay::sink::{Delivery, Outcome, SinkHandle, SinkRegistry, SinkSpec};
use outbox_relay::store::{NewRow, SqlStore};
use sqlx::Row;

use crate::support::process::{RelayProc, relay_command, write_config};

/// An RSA key pair in PEM form (PKCS#8 private, SPKI public).
pub struct KeyPair {
    pub private_pem: String,
    pub public_pem: String,
}

/// Makes an RSA-2048 key pair with `openssl` (in a temporary directory removed at once).
fn generate_key() -> KeyPair {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("key.pem");
    let public = dir.path().join("pub.pem");
    let ok = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key)
        .stderr(Stdio::null())
        .status()
        .expect("the vendor-sink tests need the openssl CLI on PATH")
        .success();
    assert!(ok, "openssl genpkey failed");
    let ok = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&public)
        .status()
        .expect("openssl pkey")
        .success();
    assert!(ok, "openssl pkey -pubout failed");
    KeyPair {
        private_pem: std::fs::read_to_string(&key).expect("read key"),
        public_pem: std::fs::read_to_string(&public).expect("read public key"),
    }
}

/// The key the service account signs with (one per test process).
pub fn service_key() -> &'static KeyPair {
    static KEY: OnceLock<KeyPair> = OnceLock::new();
    KEY.get_or_init(generate_key)
}

/// A second, unrelated key (a service account whose key the token endpoint does not know).
pub fn other_key() -> &'static KeyPair {
    static KEY: OnceLock<KeyPair> = OnceLock::new();
    KEY.get_or_init(generate_key)
}

/// Checks an RS256 JWT against `public_pem` with `openssl dgst` and returns its header and
/// claims; `Err` says what is wrong.
pub fn verify_rs256(
    jwt: &str,
    public_pem: &str,
) -> Result<(serde_json::Value, serde_json::Value), String> {
    let parts: Vec<&str> = jwt.split('.').collect();
    if parts.len() != 3 {
        return Err(format!("a JWT has 3 parts, this one {}", parts.len()));
    }
    let decode = |p: &str| {
        URL_SAFE_NO_PAD
            .decode(p)
            .map_err(|e| format!("base64url: {e}"))
    };
    let header: serde_json::Value =
        serde_json::from_slice(&decode(parts[0])?).map_err(|e| format!("header: {e}"))?;
    let claims: serde_json::Value =
        serde_json::from_slice(&decode(parts[1])?).map_err(|e| format!("claims: {e}"))?;
    let signature = decode(parts[2])?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (pub_path, data_path, sig_path) = (
        dir.path().join("pub.pem"),
        dir.path().join("data"),
        dir.path().join("sig"),
    );
    std::fs::write(&pub_path, public_pem).map_err(|e| e.to_string())?;
    std::fs::write(&data_path, format!("{}.{}", parts[0], parts[1])).map_err(|e| e.to_string())?;
    std::fs::write(&sig_path, signature).map_err(|e| e.to_string())?;
    let out = Command::new("openssl")
        .args(["dgst", "-sha256", "-verify"])
        .arg(&pub_path)
        .arg("-signature")
        .arg(&sig_path)
        .arg(&data_path)
        .output()
        .map_err(|e| format!("openssl dgst: {e}"))?;
    if !out.status.success() {
        return Err("the RS256 signature does not verify".into());
    }
    Ok((header, claims))
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Loads `toml` (a whole config file) through [`Settings::load_with_env`] with an empty
/// environment and builds the sink `name`, as `outbox-relay run` would.
pub fn sink_from_toml(toml: &str, name: &str) -> Arc<SinkHandle> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, toml).expect("write config");
    let settings =
        Settings::load_with_env(Some(&path), Some(BTreeMap::new())).expect("config loads");
    let registry = SinkRegistry::build(&settings).expect("sinks build");
    registry.get(name).expect("sink configured").clone()
}

/// Loads `toml` and parses its sinks, as the CLI does, and returns the configuration error's
/// text.
pub fn config_error(toml: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, toml).expect("write config");
    let loaded = Settings::load_with_env(Some(&path), Some(BTreeMap::new()))
        .and_then(|s| SinkSpec::all(&s).map(|_| s));
    match loaded {
        Ok(_) => panic!("config was accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

/// A row as the relay hands it to a sink.
pub fn delivery(id: i64, recipient: Option<&str>, payload: &str, attempts: u32) -> Delivery {
    Delivery {
        id,
        channel: "test".into(),
        recipient: recipient.map(str::to_string),
        payload: payload.to_string(),
        attempts,
        trace: None,
    }
}

/// The outcome's reason (empty for Delivered).
pub fn reason(o: &Outcome) -> &str {
    o.reason()
}

/// One request a fake vendor received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub at: Instant,
}

impl Seen {
    pub fn from(req: &wiremock::Request) -> Seen {
        Seen {
            path: req.url.path().to_string(),
            headers: req
                .headers
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect(),
            body: String::from_utf8_lossy(&req.body).into_owned(),
            at: Instant::now(),
        }
    }

    /// A header's value (names are lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("request body is JSON")
    }
}

/// Requests seen by a fake, shared with its responder.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<Seen>>>);

impl Log {
    pub fn push(&self, s: Seen) -> usize {
        let mut g = self.0.lock().unwrap();
        g.push(s);
        g.len()
    }

    pub fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A SQLite outbox in a temporary directory, for runs of the binary.
pub struct Outbox {
    pub dir: tempfile::TempDir,
    pub url: String,
    pub store: SqlStore,
}

impl Outbox {
    pub async fn create() -> Outbox {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("o.db").display());
        let store = SqlStore::connect(&url, "outbox", 2, Duration::from_secs(5))
            .await
            .expect("sqlite");
        store.migrate().await.expect("migrate");
        Outbox { dir, url, store }
    }

    pub async fn enqueue(&self, channel: &str, recipient: &str, payload: &str) -> i64 {
        self.store
            .enqueue(&NewRow {
                channel: channel.into(),
                recipient: Some(recipient.into()),
                payload: payload.into(),
                ordering_key: None,
            })
            .await
            .expect("enqueue")
    }

    /// (status, attempts, last_error) of a row.
    pub async fn row(&self, id: i64) -> (String, i64, Option<String>) {
        let r = sqlx::query("SELECT status, attempts, last_error FROM outbox WHERE id = ?")
            .bind(id)
            .fetch_one(self.store.pool())
            .await
            .expect("row");
        (
            r.try_get(0).expect("status"),
            r.try_get(1).expect("attempts"),
            r.try_get(2).expect("last_error"),
        )
    }

    /// Waits until row `id` has `status`; panics (with the relay's log) after `timeout`.
    pub async fn wait_status(&self, relay: &Relay, id: i64, status: &str, timeout: Duration) {
        super::wait::until_reads(
            timeout,
            async || self.row(id).await.0,
            |s| s == status,
            |s| {
                format!(
                    "row {id} is {s}, not {status}, after {timeout:?}; relay log:\n{}",
                    relay.log()
                )
            },
        )
        .await;
    }

    /// Writes a config file into the outbox's directory.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        write_config(self.dir.path(), name, text)
    }
}

/// `outbox-relay run` on an [`Outbox`] with `RUST_LOG=debug`; killed when dropped (its whole
/// log is printed if the test failed).
pub struct Relay(RelayProc);

impl Relay {
    /// Starts the relay on `outbox` with `config`; its log is `<dir>/relay.log`.
    pub fn start(outbox: &Outbox, config: &Path) -> Relay {
        let mut cmd = relay_command(outbox.dir.path());
        cmd.env("RUST_LOG", "debug")
            .env("OUTBOX_RELAY__DATABASE__URL", &outbox.url)
            .env("OUTBOX_RELAY__HTTP__LISTEN", "127.0.0.1:0")
            .arg("--config")
            .arg(config)
            .arg("run");
        let log = outbox.dir.path().join("relay.log");
        Relay(RelayProc::spawn("relay", &mut cmd, log).print_whole_log())
    }

    /// The relay's log so far.
    pub fn log(&self) -> String {
        self.0.log_text()
    }

    /// Stops the relay with SIGTERM and waits (at most 15 s) for it to exit.
    pub async fn stop(&mut self) {
        self.0.stop(Duration::from_secs(15)).await;
    }

    /// Panics if any of `secrets` is in the log. A secret longer than 32 characters is
    /// looked for in aligned 16-character pieces, so any 32-character stretch of it is caught.
    pub fn assert_log_free_of(&self, secrets: &[&str]) {
        let log = self.log();
        assert!(!log.trim().is_empty(), "the relay wrote no log");
        for secret in secrets {
            let chars: Vec<char> = secret.chars().collect();
            let pieces: Vec<String> = if chars.len() <= 32 {
                vec![secret.to_string()]
            } else {
                chars.chunks_exact(16).map(|w| w.iter().collect()).collect()
            };
            for piece in pieces {
                if log.contains(piece.as_str()) {
                    let line = log.lines().find(|l| l.contains(piece.as_str()));
                    panic!("a secret appears in the relay's log: {line:?}");
                }
            }
        }
    }
}
