//! The operator console: server-rendered pages on `console.listen` to see what is waiting,
//! failing and holding the lease, and to requeue or purge FAILED rows (docs/console.md).
//!
//! Guarantees:
//! - off unless `[console]` is configured; on its own address, never on the metrics port;
//! - every page, query and action needs the token, as a login session (an HttpOnly,
//!   SameSite=Strict cookie carrying a MAC'd session id, never the token) or as
//!   `Authorization: Bearer`; tokens and MACs are compared in constant time;
//! - the right token is accepted at once; the answer to a wrong one is held by a process-wide
//!   limiter (per address and for all together: `throttle`), so guessing is slow however many
//!   connections guess, and memory stays bounded;
//! - actions are POST only and refused with 403 when cross-site (`Sec-Fetch-Site`, `Origin`)
//!   or, for a cookie session, without the session's CSRF token;
//! - actions go through the store's own verbs (`requeue`, `purge`), so they keep the CLI's
//!   race-free semantics: a row is requeued only if still FAILED and under no live claim, and
//!   purged only if still FAILED and old enough; a confirmed selection is re-checked when
//!   written and capped at the newest row the operator was shown;
//! - every action is logged at info with who did it and what it changed;
//! - everything shown from the table is HTML-escaped; recipients are masked and payloads
//!   hidden unless configured; no secret of the configuration is ever rendered;
//! - on a table mapped by `[table]` every page reads and writes through the mapping (the
//!   store's `Columns`): states show by the relay's names, a column the table does not have
//!   shows as "not mapped", and a filter or purge that would need one is refused naming its
//!   key, never run as something else;
//! - nothing is loaded from elsewhere: the CSS and JavaScript are embedded in the binary.

mod actions;
mod auth;
mod live;
mod pages;
mod queries;
mod throttle;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{ConsoleSettings, LeaseBackend, Mode, Settings};
use crate::sink::SinkRegistry;
use crate::store::SqlStore;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    settings: ConsoleSettings,
    /// The lease row shown on the overview, and the instance this process is.
    lease_name: String,
    lease_backend: LeaseBackend,
    mode: Mode,
    instance_id: String,
    table: String,
    store: Arc<SqlStore>,
    sinks: Arc<SinkRegistry>,
    auth: auth::Auth,
    /// What the failed rows can be filtered by on this table (see `queries::Filterable`).
    filterable: queries::Filterable,
    live: live::Live,
    /// Cancelled at shutdown: a purge in progress stops between batches.
    stop: CancellationToken,
}

/// Serves the console until `stop`. Returns the bound address once listening.
pub async fn serve(
    settings: &Settings,
    store: Arc<SqlStore>,
    sinks: Arc<SinkRegistry>,
    prom: Option<PrometheusHandle>,
    stop: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let Some(c) = settings.console.clone() else {
        anyhow::bail!("the console is not configured");
    };
    let listener = tokio::net::TcpListener::bind(&c.listen)
        .await
        .map_err(|e| anyhow::anyhow!("console.listen {}: {e}", c.listen))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "the console listens beyond loopback: anyone who can reach it may try tokens; prefer 127.0.0.1 and kubectl port-forward");
    }
    let live = live::Live::default();
    if let Some(prom) = prom {
        tokio::spawn(live.clone().sample(prom, stop.clone()));
    }
    let console = Console {
        inner: Arc::new(Inner {
            auth: auth::Auth::new(c.token.expose()),
            settings: c,
            lease_name: settings.lease.name.clone(),
            lease_backend: settings.lease.backend,
            mode: settings.relay.mode,
            instance_id: settings.relay.instance_id.clone(),
            table: settings.database.table.clone(),
            filterable: queries::Filterable::of(store.columns()),
            store,
            sinks,
            live,
            stop: stop.clone(),
        }),
    };
    let app = router(console);
    tokio::spawn(async move {
        let result = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(stop.cancelled_owned())
        .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "console server failed");
        }
    });
    Ok(addr)
}

fn router(console: Console) -> Router {
    Router::new()
        .route("/login", get(auth::login_page).post(auth::login))
        .route("/logout", post(auth::logout))
        .route("/", get(pages::overview))
        .route("/live.json", get(pages::live_json))
        .route("/failed", get(pages::failed))
        .route("/row/{id}", get(pages::row))
        .route("/row/{id}/requeue", post(actions::requeue_row))
        .route(
            "/requeue",
            get(actions::requeue_confirm).post(actions::requeue_selection),
        )
        .route("/purge", get(actions::purge_confirm).post(actions::purge))
        .route("/console.css", get(css))
        .route("/console.js", get(js))
        .fallback(|| async { view::error_page(axum::http::StatusCode::NOT_FOUND, "No such page.") })
        .layer(axum::middleware::map_response(view::security_headers))
        .with_state(console)
}

/// The style sheet and script: static, embedded, public (the login page needs them).
async fn css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("console.css"),
    )
}

async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("console.js"),
    )
}
