//! PostgreSQL: schema, and LISTEN wake-ups from the insert trigger.
//!
//! `migrate` installs a statement-level AFTER INSERT trigger that `NOTIFY`s `<table>_new`, so a
//! relay wakes as soon as a transaction that wrote outbox rows commits, instead of waiting
//! for its next poll. Notifications are only a hint: the poll stays the source of truth, so a
//! notification lost while the listener reconnects delays rows by one poll interval at most.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::watch::Arrivals;

/// The lease table (`outbox_relay_lease`): also created beside a mapped table.
pub(super) fn lease_table() -> String {
    "CREATE TABLE IF NOT EXISTS outbox_relay_lease (
            name TEXT PRIMARY KEY,
            holder TEXT NULL,
            lease_until TIMESTAMPTZ NULL,
            epoch BIGINT NOT NULL DEFAULT 0
        )"
    .to_string()
}

/// Schema version 1.
pub(super) fn schema_v1(t: &str) -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                id BIGSERIAL PRIMARY KEY,
                channel TEXT NOT NULL,
                recipient TEXT NULL,
                payload JSONB NOT NULL,
                ordering_key TEXT NULL,
                status TEXT NOT NULL DEFAULT 'PENDING'
                    CHECK (status IN ('PENDING', 'RETRY', 'SUCCESS', 'FAILED')),
                attempts INT NOT NULL DEFAULT 0,
                next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                claimed_by TEXT NULL,
                claim_token TEXT NULL,
                claimed_until TIMESTAMPTZ NULL,
                last_error TEXT NULL,
                created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                sent_at TIMESTAMPTZ NULL
            )"
        ),
        // The claim walks this partial index in id order: only unfinished rows are in it.
        format!(
            "CREATE INDEX IF NOT EXISTS {t}_due_idx ON {t} (id, next_attempt_at)
             WHERE status IN ('PENDING', 'RETRY')"
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {t}_ordering_idx ON {t} (ordering_key, id)
             WHERE ordering_key IS NOT NULL AND status IN ('PENDING', 'RETRY')"
        ),
        format!("CREATE INDEX IF NOT EXISTS {t}_status_idx ON {t} (status, updated_at)"),
        // A queue table: every row is updated soon after insert. The default autovacuum
        // thresholds (20% / 10% of the table) let dead entries pile up in the partial due
        // index and let statistics go stale after a burst, which flips the claim's plan to a
        // primary-key walk or a sort of the whole backlog (measured: 2-20 ms per claim instead
        // of 0.5 ms). Vacuum and analyze this table after 1% of it changed.
        format!(
            "ALTER TABLE {t} SET (autovacuum_vacuum_scale_factor = 0.01,
             autovacuum_analyze_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
             autovacuum_analyze_threshold = 1000)"
        ),
        // oldest_pending_seconds and `status`: MIN(created_at) of unfinished rows.
        format!(
            "CREATE INDEX IF NOT EXISTS {t}_pending_age_idx ON {t} (created_at)
             WHERE status IN ('PENDING', 'RETRY')"
        ),
        lease_table(),
    ]
    .into_iter()
    .chain(notify_trigger(t))
    .collect()
}

/// The statement-level insert trigger that NOTIFYs `<table>_new` (on a mapped table only
/// when `table.notify_trigger` asks, through `migrate --adopt`).
pub(super) fn notify_trigger(t: &str) -> Vec<String> {
    vec![
        format!(
            "CREATE OR REPLACE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
             BEGIN PERFORM pg_notify('{t}_new', ''); RETURN NULL; END $fn$"
        ),
        format!("DROP TRIGGER IF EXISTS {t}_notify ON {t}"),
        format!(
            "CREATE TRIGGER {t}_notify AFTER INSERT ON {t}
             FOR EACH STATEMENT EXECUTE FUNCTION {t}_notify()"
        ),
    ]
}

/// The channel the trigger notifies.
pub fn notify_channel(table: &str) -> String {
    format!("{table}_new")
}

/// Listens for the insert trigger and signals `arrivals` on each notification, until `stop`.
/// Reconnects by itself (with a pause) when the connection drops.
pub async fn listen(url: String, table: String, arrivals: Arc<Arrivals>, stop: CancellationToken) {
    let channel = notify_channel(&table);
    loop {
        let result: Result<(), sqlx::Error> = async {
            let mut listener = sqlx::postgres::PgListener::connect(&url).await?;
            listener.listen(&channel).await?;
            tracing::debug!(%channel, "listening for new outbox rows");
            // Rows may have arrived while we were not listening.
            arrivals.set_announced(true);
            arrivals.signal();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    n = listener.recv() => { n?; arrivals.signal(); }
                }
            }
        }
        .await;
        arrivals.set_announced(false);
        if stop.is_cancelled() {
            return;
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "LISTEN connection lost; polling only until it is back");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}
