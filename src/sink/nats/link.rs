//! The sink's connection to NATS and what its events have said.
//!
//! One client per sink, opened on first use and kept for the life of the relay; async-nats
//! reconnects by itself, for ever, trying every configured server. While no server can be
//! reached the sink publishes nothing (docs/design.md, "Sending": nothing is handed to a
//! connection that could only send it later).
//!
//! The server reports a refused publish (permissions) or refused credentials only as an
//! `-ERR` on the connection, never as the publish's answer; the client hands those to an
//! event callback, and [`Watch`] keeps the recent ones so the classifier can tell a timeout
//! caused by a permissions violation from a slow server.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::{ClientError, ConnectOptions, Event, ServerError};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::{Auth, NatsConfig};

/// Most permissions violations remembered.
const VIOLATIONS_KEPT: usize = 32;

/// An open client and its JetStream context.
pub struct Link {
    pub client: async_nats::Client,
    pub js: async_nats::jetstream::Context,
}

/// What the connection's events have said so far.
#[derive(Default)]
pub struct Watch {
    seen: Mutex<Seen>,
    /// Woken at each connection, for the sends waiting for one.
    connected: Notify,
}

#[derive(Default)]
struct Seen {
    /// A connection was made at least once.
    ever_connected: bool,
    /// When the connection last came back after a loss.
    reconnected_at: Option<Instant>,
    /// The last connection attempt was refused for the credentials.
    auth_refused: bool,
    /// Recent `Permissions Violation ...` texts, newest last.
    violations: VecDeque<(Instant, String)>,
}

impl Watch {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        match self.seen.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records one event of the client.
    pub fn record(&self, event: &Event) {
        let mut s = self.seen();
        match event {
            Event::Connected => {
                if s.ever_connected {
                    s.reconnected_at = Some(Instant::now());
                }
                s.ever_connected = true;
                s.auth_refused = false;
                self.connected.notify_waiters();
            }
            Event::ServerError(ServerError::AuthorizationViolation) => s.auth_refused = true,
            // The connect loop reports a refusal by its kind's text.
            Event::ClientError(ClientError::Other(text))
                if text == "authorization violation" || text == "failed signing nonce" =>
            {
                s.auth_refused = true;
            }
            Event::ServerError(ServerError::Other(text))
                if text
                    .to_ascii_lowercase()
                    .starts_with("permissions violation") =>
            {
                if s.violations.len() == VIOLATIONS_KEPT {
                    s.violations.pop_front();
                }
                s.violations.push_back((Instant::now(), text.clone()));
            }
            _ => {}
        }
    }

    /// How long ago the connection came back after a loss; `None` if it never dropped.
    pub fn since_reconnect(&self) -> Option<Duration> {
        self.seen().reconnected_at.map(|at| at.elapsed())
    }

    /// True while the last connection attempt was refused for the credentials.
    pub fn auth_refused(&self) -> bool {
        self.seen().auth_refused
    }

    /// The newest permissions violation within `within` about `subject`, or about a reply
    /// inbox (the publish's answer could not be received).
    pub fn violation(&self, subject: &str, within: Duration) -> Option<String> {
        let quoted = format!("\"{subject}\"");
        self.seen()
            .violations
            .iter()
            .rev()
            .take_while(|(at, _)| at.elapsed() <= within)
            .find(|(_, text)| text.contains(&quoted) || text.contains("\"_INBOX."))
            .map(|(_, text)| text.clone())
    }
}

/// Opens a client for `cfg` that reports its events to `watch`. With `retry`, it returns at
/// once and connects (and reconnects) in the background for ever; without, it fails when no
/// server answers within `timeout` (`check-config`).
pub async fn open(
    sink: &str,
    cfg: &NatsConfig,
    timeout: Duration,
    watch: Arc<Watch>,
    retry: bool,
) -> Result<Link, async_nats::ConnectError> {
    let options = match &cfg.auth {
        Auth::None => ConnectOptions::new(),
        Auth::Token(t) => ConnectOptions::with_token(t.expose().to_string()),
        Auth::UserPassword { user, password } => {
            ConnectOptions::with_user_and_password(user.clone(), password.expose().to_string())
        }
        // Checked when the configuration was read; an error here says nothing of the file.
        Auth::Credentials(c) => ConnectOptions::with_credentials(c.expose()).map_err(|_| {
            async_nats::ConnectError::new(async_nats::ConnectErrorKind::Authentication)
        })?,
    };
    let mut options = options
        .name(format!("outbox-relay sink {sink}"))
        .connection_timeout(timeout.min(Duration::from_secs(5)))
        .request_timeout(Some(timeout))
        .max_reconnects(None)
        .event_callback(move |event| {
            watch.record(&event);
            async {}
        });
    if retry {
        options = options.retry_on_initial_connect();
    }
    let client = options.connect(cfg.urls.as_slice()).await?;
    let js = async_nats::jetstream::ContextBuilder::new()
        .timeout(timeout)
        .build(client.clone());
    Ok(Link { client, js })
}

/// Waits until the client is connected, for at most `wait`; true if it is. Woken by the
/// connection's event, and looks again every 100 ms anyway (the client sets its state and
/// reports the event separately, in either order).
pub async fn connected_within(client: &async_nats::Client, watch: &Watch, wait: Duration) -> bool {
    use async_nats::connection::State;
    let deadline = Instant::now() + wait;
    loop {
        let woken = watch.connected.notified();
        if client.connection_state() == State::Connected {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let _ = tokio::time::timeout((deadline - now).min(Duration::from_millis(100)), woken).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn events_are_remembered() {
        let w = Watch::default();
        w.record(&Event::Connected);
        assert_eq!(
            w.since_reconnect(),
            None,
            "a first connection is no reconnect"
        );
        w.record(&Event::Disconnected);
        w.record(&Event::Connected);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(w.since_reconnect(), Some(Duration::from_secs(3)));

        w.record(&Event::ClientError(ClientError::Other(
            "authorization violation".into(),
        )));
        assert!(w.auth_refused());
        w.record(&Event::Connected);
        assert!(!w.auth_refused(), "a connection clears it");

        w.record(&Event::ServerError(ServerError::Other(
            "Permissions Violation for Publish to \"orders.x\"".into(),
        )));
        let within = Duration::from_secs(10);
        assert!(w.violation("orders.x", within).is_some());
        assert!(
            w.violation("orders", within).is_none(),
            "whole subjects only"
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(w.violation("orders.x", within).is_none(), "old ones expire");
        w.record(&Event::ServerError(ServerError::Other(
            "Permissions Violation for Subscription to \"_INBOX.abc.*\"".into(),
        )));
        assert!(w.violation("anything", within).is_some(), "the reply inbox");
        for i in 0..100 {
            w.record(&Event::ServerError(ServerError::Other(format!(
                "Permissions Violation for Publish to \"s{i}\""
            ))));
        }
        assert_eq!(w.seen().violations.len(), VIOLATIONS_KEPT);
    }
}
