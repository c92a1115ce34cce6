//! The command line (SPEC section 8). Exit codes: 0 ok, 2 usage or configuration error,
//! 1 runtime failure.

mod admin;
mod run;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{ConfigError, Settings};

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
    /// Create or upgrade the outbox and lease tables (idempotent).
    Migrate,
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
    /// Validate the configuration and print the effective settings (secrets masked).
    CheckConfig,
}

/// Why a command failed, deciding the exit code.
#[derive(Debug)]
pub enum CliError {
    /// Bad configuration or arguments: exit 2.
    Usage(String),
    /// Something failed while running: exit 1.
    Runtime(anyhow::Error),
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
        }
    }
}

/// Runs the parsed command.
pub async fn execute(cli: Cli) -> Result<(), CliError> {
    let settings = Settings::load(cli.config.as_deref())?;
    match cli.command {
        Command::Run => run::run(settings).await,
        Command::Migrate => admin::migrate(&settings).await,
        Command::Enqueue {
            channel,
            recipient,
            payload,
            ordering_key,
        } => admin::enqueue(&settings, channel, recipient, payload, ordering_key).await,
        Command::Status => admin::status(&settings).await,
        Command::Failed { limit, channel } => admin::failed(&settings, limit, channel).await,
        Command::CheckConfig => {
            admin::check_config(&settings);
            Ok(())
        }
    }
}
