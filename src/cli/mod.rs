//! The command line (the README's Commands section). Exit codes: 0 ok, 2 usage or configuration error,
//! 1 runtime failure.

mod admin;
mod run;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{ConfigError, Settings};
use crate::sink::SinkSpec;
use crate::store::NewRow;

/// outbox-relay: delivers transactional-outbox rows to webhooks, FCM and Kakao Alimtalk,
/// exactly as often as it must.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, long_about = None)]
pub struct Cli {
    /// TOML config file [default: config/relay.toml if present, else built-in defaults].
    /// Every key can be overridden by OUTBOX_RELAY__SECTION__KEY environment variables.
    #[arg(long, global = true, env = "OUTBOX_RELAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay: claim due rows and deliver them until SIGTERM/SIGINT.
    Run,
    /// Create or upgrade the outbox and lease tables (idempotent). On a table mapped by
    /// [table], only the lease table: use --adopt to add the relay's columns to it.
    Migrate {
        /// On an existing table mapped by [table]: add the relay's bookkeeping columns and
        /// the indexes claims need (never changes existing columns or rows), printing each
        /// statement first.
        #[arg(long)]
        adopt: bool,
        /// With --adopt: print the statements without running them.
        #[arg(long, requires = "adopt")]
        dry_run: bool,
    },
    /// Insert one row into the outbox (for trying things out and for scripts).
    Enqueue {
        /// The sink to deliver to (a key of [sinks]).
        #[arg(long)]
        channel: String,
        /// Device token, phone number; omit for webhooks.
        #[arg(long)]
        recipient: Option<String>,
        /// The message body, as JSON.
        #[arg(long)]
        payload: String,
        /// Rows with the same key are delivered one at a time, in insertion order.
        #[arg(long)]
        ordering_key: Option<String>,
        /// The writer's W3C trace context (`00-<trace id>-<span id>-<flags>`): the delivery's
        /// span is its child (docs/tracing.md).
        #[arg(long)]
        traceparent: Option<String>,
        /// The W3C `tracestate` that goes with --traceparent.
        #[arg(long, requires = "traceparent")]
        tracestate: Option<String>,
    },
    /// Show row counts per status and channel, the oldest pending age, the lease holder and
    /// live claims.
    Status,
    /// List FAILED rows with their last error.
    Failed {
        /// How many rows to show (newest first).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Only rows of this channel.
        #[arg(long)]
        channel: Option<String>,
    },
    /// Put FAILED rows back in the queue (PENDING, attempts reset). Rows that are not FAILED
    /// are never changed.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "all_failed"])))]
    Requeue {
        /// Row ids to requeue (repeat or comma-separate).
        #[arg(long, value_delimiter = ',', num_args = 1..)]
        id: Vec<i64>,
        /// Requeue every FAILED row (of --channel, if given).
        #[arg(long)]
        all_failed: bool,
        /// With --all-failed: only rows of this channel.
        #[arg(long, requires = "all_failed")]
        channel: Option<String>,
        /// Show what would be requeued without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete finished rows older than a duration, in small batches. Never deletes PENDING or
    /// RETRY rows.
    Purge {
        /// Age of the last update, e.g. 7d, 12h.
        #[arg(long, value_parser = parse_duration)]
        older_than: std::time::Duration,
        /// Which finished rows: SUCCESS (default) or FAILED.
        #[arg(long, value_enum, default_value = "SUCCESS")]
        status: PurgeStatus,
    },
    /// Validate the configuration and print the effective settings (secrets masked).
    CheckConfig,
}

/// The statuses `purge` may delete.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum PurgeStatus {
    Success,
    Failed,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    crate::config::duration::parse(s)
}

/// `println!` for the verbs, except that a closed stdout (`outbox-relay status | head -1`)
/// ends the verb quietly with exit 0, as coreutils do, instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::write_line(format_args!($($arg)*))?
    };
}
pub(crate) use say;

/// Writes one line to stdout; see [`say`].
pub(crate) fn write_line(args: std::fmt::Arguments<'_>) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::Closed),
        Err(e) => Err(CliError::Runtime(anyhow::anyhow!("writing to stdout: {e}"))),
    }
}

/// Why a command failed, deciding the exit code.
#[derive(Debug)]
pub enum CliError {
    /// Bad configuration or arguments: exit 2.
    Usage(String),
    /// Something failed while running: exit 1.
    Runtime(anyhow::Error),
    /// Stdout was closed by the reader: stop quietly, exit 0.
    Closed,
}

impl From<ConfigError> for CliError {
    fn from(e: ConfigError) -> Self {
        CliError::Usage(format!("configuration error: {e}"))
    }
}

impl From<anyhow::Error> for CliError {
    fn from(e: anyhow::Error) -> Self {
        CliError::Runtime(e)
    }
}

impl CliError {
    /// The process exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Runtime(_) => 1,
            CliError::Closed => 0,
        }
    }
}

/// Runs the parsed command.
pub async fn execute(cli: Cli) -> Result<(), CliError> {
    let settings = Settings::load(cli.config.as_deref())?;
    // Every verb refuses a configuration with a bad sink, as `check-config` does: the sinks'
    // own keys are parsed by the sink module, after the rest of the configuration.
    SinkSpec::all(&settings)?;
    match cli.command {
        Command::Run => run::run(settings).await,
        Command::Migrate { adopt, dry_run } => admin::migrate(&settings, adopt, dry_run).await,
        Command::Enqueue {
            channel,
            recipient,
            payload,
            ordering_key,
            traceparent,
            tracestate,
        } => {
            let row = NewRow {
                channel,
                recipient,
                payload,
                ordering_key,
            };
            admin::enqueue(&settings, row, traceparent, tracestate).await
        }
        Command::Status => admin::status(&settings).await,
        Command::Failed { limit, channel } => admin::failed(&settings, limit, channel).await,
        Command::Requeue {
            id,
            all_failed,
            channel,
            dry_run,
        } => admin::requeue(&settings, id, all_failed, channel, dry_run).await,
        Command::Purge { older_than, status } => admin::purge(&settings, older_than, status).await,
        Command::CheckConfig => admin::check_config(&settings).await,
    }
}
