//! Configuration: a TOML file layered with `OUTBOX_RELAY__SECTION__KEY` environment variables.
//!
//! Guarantees:
//! - with no file and no environment, [`Settings::load`] yields a configuration that runs on
//!   its own (SQLite file, `database` lease, a `log` sink);
//! - every error names the key it is about (`relay.claim_ttl: ...`), and the CLI turns it
//!   into exit code 2;
//! - settings that cannot be safe (G7 in docs/design.md) are refused here, before anything starts;
//! - an unknown key is refused wherever it is (a section, `[table.*]`, an inline table such as
//!   a `payload_object` entry, a sink's table), by its full path, from the file and from the
//!   environment alike; only a webhook's `headers` and `tracing.headers` take any name;
//! - every value can come from the environment, where all are strings: each key reads its kind
//!   from a string (`number`, `duration`, comma-separated lists, `status` for the status
//!   codes), and a number outside its key's range is refused with the range (`number`; the
//!   file's numbers beyond 64 bits reach their key too: `file`);
//! - secrets are [`Secret`]s and never appear in `Debug` output.

pub mod duration;
mod error;
mod file;
pub mod number;
mod otel;
mod payload;
mod secret;
mod sinks;
mod status;
mod table;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use number::{U32_MAX, flag, int};
use serde::Deserialize;

pub use error::ConfigError;
pub use otel::TracingSettings;
pub use payload::PayloadValue;
use secret::secret_list;
pub use secret::{Secret, check_headers, redact_url};
pub use sinks::{DEFAULT_CONCURRENCY, SinkCommon, SinkSettings};
pub use status::{Code, Codes, StatusSettings};
pub use table::{ColumnSettings, RESERVED, TableSettings};
pub use validate::CLAIM_MARGIN;
pub use validate::sql_string;

/// The environment prefix: `OUTBOX_RELAY__DATABASE__URL` sets `database.url`.
pub const ENV_PREFIX: &str = "OUTBOX_RELAY";
/// The file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "config/relay.toml";

/// Everything the relay is configured with, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub relay: RelaySettings,
    pub database: DatabaseSettings,
    pub lease: LeaseSettings,
    pub retry: RetrySettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    pub retention: RetentionSettings,
    /// `[console]`: the operator console; `None` unless configured and enabled.
    pub console: Option<ConsoleSettings>,
    /// `[table]`: how an existing table's columns map to the relay's (empty: the relay's own).
    pub table: TableSettings,
    /// `[tracing]`: trace propagation and span export (off without `tracing.endpoint`).
    pub tracing: TracingSettings,
    /// Sinks by name; a row's `channel` names one of them. Their kind's own keys are parsed
    /// by the sink module (`sink::SinkSpec::parse`).
    pub sinks: BTreeMap<String, SinkSettings>,
    /// Where the settings came from (shown by `check-config`).
    pub source: Option<PathBuf>,
}

/// How rows are taken from the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One lease holder claims and delivers; the others stand by.
    Leader,
    /// Every instance claims disjoint batches.
    Claim,
}

/// `[relay]`: the delivery loop.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelaySettings {
    /// Written to `claimed_by` and the lease holder; defaults to `<hostname>:<pid>`.
    pub instance_id: String,
    pub mode: Mode,
    /// Sleep after an empty claim (a NOTIFY or a full batch wakes the loop sooner).
    #[serde(deserialize_with = "duration::deserialize")]
    pub poll_interval: Duration,
    /// Most rows taken by one claim statement (default 400: with 100, a drain on PostgreSQL
    /// took 0.025 statements per row, with 200 0.015, at the same rows/s or better; with 400
    /// on a slower machine fewer statements everywhere and, on MariaDB, whose drains its
    /// claims set, 1.1-1.4x the rows/s, the claims' fixed cost spread over more rows;
    /// docs/performance-log.md, 2026-12-06).
    #[serde(deserialize_with = "int::<_, _, 1, 10_000>")]
    pub batch_size: u32,
    /// Most rows claimed and not yet finished (being sent, waiting for a sink slot, or
    /// waiting for their result to be written), across all sinks. Sends at once are capped by
    /// each sink's `concurrency`; the rest of the slots let the next rows be claimed while
    /// the current ones are sent and recorded. Default 1,024: eight times a sink's default
    /// `concurrency`, room for its rows claimed ahead and for results waiting to be written
    /// (see `sinks::DEFAULT_CONCURRENCY` for the measurement; 512 with 128 sends at once gave
    /// half of the gain, 1,024 with 64 little).
    #[serde(deserialize_with = "int::<_, _, 1, 100_000>")]
    pub max_in_flight: u32,
    /// How long a claim keeps other instances off a row.
    #[serde(deserialize_with = "duration::deserialize")]
    pub claim_ttl: Duration,
    /// How long SIGTERM waits for in-flight sends before exiting.
    #[serde(deserialize_with = "duration::deserialize")]
    pub shutdown_timeout: Duration,
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            instance_id: default_instance_id(),
            mode: Mode::Leader,
            poll_interval: Duration::from_millis(500),
            batch_size: 400,
            max_in_flight: 1024,
            claim_ttl: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(25),
        }
    }
}

fn default_instance_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_string());
    format!("{host}:{}", std::process::id())
}

/// `[database]`: where the outbox lives.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `postgres://`, `mysql://` (MySQL 8, MariaDB 10.6+) or `sqlite://`.
    pub url: Secret,
    /// The outbox table's name (a plain SQL identifier).
    pub table: String,
    #[serde(deserialize_with = "int::<_, _, 1, U32_MAX>")]
    pub max_connections: u32,
    /// PostgreSQL only: LISTEN for the insert trigger's NOTIFY.
    #[serde(deserialize_with = "flag")]
    pub listen: bool,
    /// How long to wait for a connection from the pool.
    #[serde(deserialize_with = "duration::deserialize")]
    pub connect_timeout: Duration,
    /// Run `migrate` when `run` starts (idempotent); turn off where schema changes are
    /// applied by other means.
    #[serde(deserialize_with = "flag")]
    pub migrate: bool,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        DatabaseSettings {
            url: Secret::new("sqlite://outbox-relay.db?mode=rwc"),
            table: "outbox".into(),
            max_connections: 8,
            listen: true,
            connect_timeout: Duration::from_secs(5),
            migrate: true,
        }
    }
}

/// Which lease coordinates leader mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseBackend {
    /// A row of `outbox_relay_lease`, on the database clock (no other service).
    Database,
    /// A Redis key with a watchdog.
    Redis,
    /// The same on several independent Redis nodes.
    Redlock,
    /// The hash of a Redisson `RLock` of the same name, so the relay and a Java poller guarded
    /// by that lock exclude each other (src/lease/redisson.rs).
    Redisson,
    /// The row of a ShedLock table in the relay's own database (src/lease/shedlock.rs).
    Shedlock,
    /// `GET_LOCK(name, 0)` on a dedicated MySQL/MariaDB connection (src/lease/get_lock.rs).
    #[serde(rename = "mysql-get-lock")]
    MysqlGetLock,
    /// No coordination: a single instance.
    None,
}

impl LeaseBackend {
    /// The backend's name in the configuration, for the locks shared with Java pollers.
    pub fn java_lock(self) -> Option<&'static str> {
        match self {
            LeaseBackend::Redisson => Some("redisson"),
            LeaseBackend::Shedlock => Some("shedlock"),
            LeaseBackend::MysqlGetLock => Some("mysql-get-lock"),
            _ => None,
        }
    }
}

/// `[lease]`: leader election for `relay.mode = "leader"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseSettings {
    pub backend: LeaseBackend,
    /// The lease's name: the row in `outbox_relay_lease` and the Redis key suffix.
    pub name: String,
    /// How long a grant lasts without renewal; renewed every `ttl / 3`.
    #[serde(deserialize_with = "duration::deserialize")]
    pub ttl: Duration,
    /// The longest one acquire or renew round trip may take before it counts as failed.
    #[serde(deserialize_with = "duration::deserialize")]
    pub renew_timeout: Duration,
    pub redis_url: Option<Secret>,
    /// A TOML array; in the environment (where every value is a string), comma-separated.
    #[serde(deserialize_with = "secret_list")]
    pub redlock_urls: Vec<Secret>,
    /// The ShedLock table (`lease.backend = "shedlock"`), in the outbox database.
    pub shedlock_table: String,
    /// The zone of the times in the ShedLock table: `UTC` (the Java side uses `usingDbTime()`
    /// or `withTimeZone(UTC)`), or the fixed offset of the JVM's zone (`+09:00`) when it
    /// writes its local time.
    pub shedlock_time_zone: String,
}

impl LeaseSettings {
    /// `shedlock_time_zone` as minutes east of UTC: `UTC`/`Z`/`+00:00`, or `+HH:MM`/`-HH:MM`
    /// (at most 14 hours). `None` when it is neither.
    pub fn shedlock_utc_offset_minutes(&self) -> Option<i32> {
        let z = self.shedlock_time_zone.trim();
        if z.eq_ignore_ascii_case("utc") || z == "Z" {
            return Some(0);
        }
        let (sign, rest) = match z.as_bytes().first() {
            Some(b'+') => (1, &z[1..]),
            Some(b'-') => (-1, &z[1..]),
            _ => return None,
        };
        let (h, m) = rest.split_once(':')?;
        if h.len() != 2 || m.len() != 2 {
            return None;
        }
        let (h, m): (i32, i32) = (h.parse().ok()?, m.parse().ok()?);
        (h <= 14 && m < 60 && h * 60 + m <= 14 * 60).then_some(sign * (h * 60 + m))
    }
}

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            backend: LeaseBackend::Database,
            // Filled in from the table after loading (see `default_lease_name`).
            name: String::new(),
            ttl: Duration::from_secs(10),
            renew_timeout: Duration::from_secs(1),
            redis_url: None,
            redlock_urls: Vec::new(),
            shedlock_table: "shedlock".to_string(),
            shedlock_time_zone: "UTC".to_string(),
        }
    }
}

/// `[retry]` (and per-sink overrides): exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrySettings {
    #[serde(deserialize_with = "duration::deserialize")]
    pub initial_backoff: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub max_backoff: Duration,
    #[serde(deserialize_with = "multiplier")]
    pub multiplier: f64,
    /// Delivery attempts before a row is FAILED; 1 means never retry.
    #[serde(deserialize_with = "int::<_, _, 1, U32_MAX>")]
    pub max_attempts: u32,
}

/// `multiplier`, here and in a sink's overrides: a growth, from 1 (no growth) to 100.
fn multiplier<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    number::float(d, 1.0, 100.0)
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            multiplier: 2.0,
            max_attempts: 10,
        }
    }
}

/// `[http]`: metrics and health probes.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// `host:port`; an empty string disables the server.
    pub listen: String,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            listen: "127.0.0.1:9090".into(),
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// A tracing filter (`info`, `outbox_relay=debug,warn`); `RUST_LOG` wins when set.
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

/// `[retention]`: deleting delivered and failed rows after a while (off unless set).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    #[serde(deserialize_with = "duration::deserialize_opt")]
    pub success_after: Option<Duration>,
    #[serde(deserialize_with = "duration::deserialize_opt")]
    pub failed_after: Option<Duration>,
}

/// `[console]`: the operator console (off unless this section is present and `enabled` is not
/// false). Its token is a secret: read from `token`, `token_file` or
/// `OUTBOX_RELAY__CONSOLE__TOKEN`, never shown.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleSettings {
    /// True by default once the section exists; `false` turns the console off.
    #[serde(deserialize_with = "flag")]
    pub enabled: bool,
    /// `host:port`, separate from `http.listen` (which Kubernetes exposes to Prometheus).
    pub listen: String,
    /// The operator token (at least [`CONSOLE_TOKEN_MIN`] characters).
    pub token: Secret,
    /// A file holding the token (a mounted Kubernetes Secret); surrounding whitespace is
    /// ignored. Exclusive with `token`.
    pub token_file: Option<PathBuf>,
    /// Show row payloads on the row page (they may hold personal data).
    #[serde(deserialize_with = "flag")]
    pub show_payloads: bool,
    /// Show only the last 4 characters of recipients (phone numbers, device tokens).
    #[serde(deserialize_with = "flag")]
    pub mask_recipients: bool,
}

/// The shortest console token accepted: a guessable token would open the console.
pub const CONSOLE_TOKEN_MIN: usize = 16;

impl Default for ConsoleSettings {
    fn default() -> Self {
        ConsoleSettings {
            enabled: true,
            listen: "127.0.0.1:9091".into(),
            token: Secret::default(),
            token_file: None,
            show_payloads: false,
            mask_recipients: true,
        }
    }
}

/// The file's shape before validation: sink tables stay raw until their kind is known.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawSettings {
    relay: RelaySettings,
    database: DatabaseSettings,
    lease: LeaseSettings,
    retry: RetrySettings,
    http: HttpSettings,
    log: LogSettings,
    retention: RetentionSettings,
    console: Option<ConsoleSettings>,
    table: TableSettings,
    tracing: TracingSettings,
    sinks: BTreeMap<String, config::Value>,
}

/// The lease name when `lease.name` is not set: derived from the table, so that relays of two
/// outbox tables in one database never share a lease (one table would never be served).
/// The default table keeps the historical name `outbox-relay`, so upgrading a relay on the
/// default table never changes its lease.
pub fn default_lease_name(table: &str) -> String {
    if table == "outbox" {
        "outbox-relay".to_string()
    } else {
        format!("outbox-relay:{table}")
    }
}

/// Reads a configuration file, refusing one that is not valid UTF-8 (TOML must be) with the
/// line and column of the first bad byte, instead of letting it be read with replacement
/// characters.
fn read_utf8(path: &Path) -> Result<String, ConfigError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigError::new(file.clone(), format!("cannot read: {e}")))?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..at];
        let line = before.iter().filter(|b| **b == b'\n').count() + 1;
        let column = at
            - before
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |p| p + 1)
            + 1;
        ConfigError::new(
            file,
            format!("not valid UTF-8: bad byte at line {line}, column {column} (byte offset {at})"),
        )
    })
}

impl Settings {
    /// Loads `path` (or [`DEFAULT_CONFIG_PATH`] if it exists, or nothing) layered with the
    /// process environment, then validates.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_with_env(path, None)
    }

    /// As [`Settings::load`], with an explicit environment (tests) instead of the process's.
    pub fn load_with_env(
        path: Option<&Path>,
        env: Option<BTreeMap<String, String>>,
    ) -> Result<Settings, ConfigError> {
        let file = match path {
            Some(p) if !p.exists() => {
                return Err(ConfigError::new(
                    p.display().to_string(),
                    "config file not found",
                ));
            }
            Some(p) => Some(p.to_path_buf()),
            None => Some(PathBuf::from(DEFAULT_CONFIG_PATH)).filter(|p| p.exists()),
        };
        let mut builder = config::Config::builder();
        let toml = match &file {
            Some(f) => Some(file::TomlFile::parse(
                &f.display().to_string(),
                &read_utf8(f)?,
            )?),
            None => None,
        };
        if let Some(t) = &toml {
            builder = builder.add_source(t.clone());
        }
        let environment = config::Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("__")
            .separator("__")
            // Values stay strings (`try_parsing(false)`): "00123" must not become 123. Each key
            // reads its kind from a string itself (`number`, `duration`, `status`; lists
            // comma-separated).
            .try_parsing(false)
            .source(env.map(|m| m.into_iter().collect()));
        let mut raw: RawSettings = builder
            .add_source(environment)
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| from_config_error(&e, file.as_deref()))?;
        raw.table.status.settle_kinds(toml.as_ref())?;
        let mut sinks = BTreeMap::new();
        for (name, value) in raw.sinks {
            let sink = SinkSettings::parse(&name, value)?;
            sinks.insert(name, sink);
        }
        if sinks.is_empty() {
            sinks.insert("log".to_string(), SinkSettings::default_log());
        }
        let mut lease = raw.lease;
        if lease.name.is_empty() {
            if let Some(b) = lease.backend.java_lock() {
                // A default name would be a lock the Java poller never takes: both would send.
                return Err(ConfigError::new(
                    "lease.name",
                    format!(
                        "is required with lease.backend = \"{b}\": set it to the lock name the \
                         Java poller uses, so that the two exclude each other"
                    ),
                ));
            }
            lease.name = default_lease_name(&raw.database.table);
        }
        let console = match raw.console {
            Some(c) if c.enabled => Some(read_console_token(c)?),
            _ => None,
        };
        let settings = Settings {
            relay: raw.relay,
            database: raw.database,
            lease,
            retry: raw.retry,
            http: raw.http,
            log: raw.log,
            retention: raw.retention,
            console,
            table: raw.table,
            tracing: raw.tracing,
            sinks,
            source: file,
        };
        validate::validate(&settings)?;
        Ok(settings)
    }

    /// The database URL with any password masked, for logs and `status`.
    pub fn database_url_redacted(&self) -> String {
        redact_url(self.database.url.expose())
    }
}

/// Fills `token` from `token_file` when that is set (exclusive with `token`). Surrounding
/// whitespace is dropped wherever the token comes from, as the login form drops it too.
fn read_console_token(mut c: ConsoleSettings) -> Result<ConsoleSettings, ConfigError> {
    c.token = Secret::new(c.token.expose().trim());
    if let Some(path) = &c.token_file {
        if !c.token.is_empty() {
            return Err(ConfigError::new(
                "console.token_file",
                "set either console.token (or OUTBOX_RELAY__CONSOLE__TOKEN) or console.token_file, not both",
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                "console.token_file",
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        c.token = Secret::new(text.trim());
    }
    Ok(c)
}

/// The config crate's error as ours: keyed where the error has a key, else the file.
fn from_config_error(e: &config::ConfigError, file: Option<&Path>) -> ConfigError {
    let mut ours = ConfigError::within("", e);
    if let (Some(f), "configuration") = (file, ours.key.as_str()) {
        ours.key = f.display().to_string();
    }
    ours
}
