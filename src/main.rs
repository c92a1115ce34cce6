//! The `outbox-relay` binary: parses the command line and maps failures to exit codes
//! (0 ok, 2 usage or configuration error, 1 runtime failure).

use clap::Parser;
use outbox_relay::cli::{self, Cli, CliError};

fn main() {
    // One process-wide rustls provider before any TLS client is built (reqwest and sqlx are built without one, and rustls needs exactly one per process).
    outbox_relay::install_crypto_provider();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(cli::execute(cli));
    if let Err(e) = result {
        match &e {
            CliError::Usage(msg) => eprintln!("error: {msg}"),
            CliError::Runtime(err) => eprintln!("error: {err:#}"),
            CliError::Closed => {}
        }
        std::process::exit(e.exit_code());
    }
}
