//! `/metrics`, `/healthz` (the process is alive) and `/readyz` (database reachable, not
//! draining), on `http.listen`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::Health;
use crate::lease::Lease;
use crate::store::SqlStore;

/// Shared with the handlers.
#[derive(Clone)]
struct AppState {
    prom: PrometheusHandle,
    health: Arc<Health>,
    /// Set once the database is connected; `/readyz` pings it.
    store: Arc<OnceCell<Arc<SqlStore>>>,
    /// Set when a lease backend is in use; `/readyz` pings it too.
    lease: Arc<OnceCell<Arc<dyn Lease>>>,
}

/// Serves until `stop`. Returns the bound address once listening.
pub async fn serve(
    listen: &str,
    prom: PrometheusHandle,
    health: Arc<Health>,
    store: Arc<OnceCell<Arc<SqlStore>>>,
    lease: Arc<OnceCell<Arc<dyn Lease>>>,
    stop: CancellationToken,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("http.listen {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    // Upkeep drains histogram buffers; without it /metrics grows stale.
    let upkeep = prom.clone();
    let upkeep_stop = stop.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = tick.tick() => upkeep.run_upkeep(),
                _ = upkeep_stop.cancelled() => return,
            }
        }
    });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            prom,
            health,
            store,
            lease,
        });
    tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "http server failed");
        }
    });
    Ok(addr)
}

async fn metrics(State(s): State<AppState>) -> String {
    s.prom.render()
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, String) {
    if s.health.draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n".into());
    }
    let Some(store) = s.store.get() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "database not connected yet\n".into(),
        );
    };
    match tokio::time::timeout(Duration::from_secs(2), store.ping()).await {
        Ok(Ok(())) => {
            s.health.set_database(true);
            if let Some(lease) = s.lease.get() {
                match tokio::time::timeout(Duration::from_secs(2), lease.ping()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        return (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("lease backend unreachable: {e}\n"),
                        );
                    }
                    Err(_) => {
                        return (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "lease backend ping timed out\n".into(),
                        );
                    }
                }
            }
            (StatusCode::OK, "ready\n".into())
        }
        Ok(Err(e)) => {
            s.health.set_database(false);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("database unreachable: {e}\n"),
            )
        }
        Err(_) => {
            s.health.set_database(false);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "database ping timed out\n".into(),
            )
        }
    }
}
