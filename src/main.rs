//! The `outbox-relay` binary: parses the command line and maps failures to exit codes
//! (0 ok, 2 usage or configuration error, 1 runtime failure).

use clap::Parser;
use outbox_relay::cli::{self, Cli, CliError};

/// mimalloc instead of the system allocator: the relay allocates and frees small buffers on
/// every row, often on different threads (a row decoded on one runtime worker is sent and
/// dropped on another; SQLite's rows come from its own worker thread), which glibc's
/// allocator serves with arena locks and chunk consolidation (13% of the CPU in a profile of
/// a SQLite drain). Built without transparent huge pages (`no_thp`), which doubled its
/// resident memory (docs/performance-log.md, "mimalloc").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // One process-wide rustls provider before any TLS client is built (reqwest and sqlx are built without one, and rustls needs exactly one per process).
    outbox_relay::install_crypto_provider();
    let cli = Cli::parse();
    let runtime = match outbox_relay::runtime::build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    // On a worker, not on this thread: `block_on` polls its future on the calling thread,
    // which put the relay loop beside the runtime's workers instead of on one, and every
    // delivery it spawned and every slot a delivery freed crossed threads (docs/design.md,
    // "Threads"; docs/performance-log.md, "The command runs on a worker").
    let result = runtime.block_on(async {
        tokio::spawn(cli::execute(cli))
            .await
            .unwrap_or_else(|e| Err(CliError::Runtime(anyhow::anyhow!("the relay stopped: {e}"))))
    });
    if let Err(e) = result {
        match &e {
            CliError::Usage(msg) => eprintln!("error: {msg}"),
            CliError::Runtime(err) => eprintln!("error: {err:#}"),
            CliError::Closed => {}
        }
        std::process::exit(e.exit_code());
    }
}
