//! Turning SIGTERM and SIGINT into a [`CancellationToken`] every task watches.
//!
//! The first signal starts a graceful shutdown (G6 in docs/design.md); a second one, at least a second later,
//! exits at once with code 1, for the operator who really means it. A repeat within that
//! second is the same signal delivered twice (GNU `timeout` signals the child and its process
//! group; some supervisors do similar) and is ignored.

use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGTERM or SIGINT; exits the process on the second.
pub fn on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        if wait_for_signal().await.is_err() {
            tracing::error!("cannot listen for signals; stop the relay with SIGKILL");
            return;
        }
        tracing::info!("signal received: shutting down gracefully (send again to exit at once)");
        token.cancel();
        let first = tokio::time::Instant::now();
        while wait_for_signal().await.is_ok() {
            if first.elapsed() >= std::time::Duration::from_secs(1) {
                tracing::warn!("second signal: exiting now");
                std::process::exit(1);
            }
        }
    });
}

async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
