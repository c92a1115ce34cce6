//! PostgreSQL's NOTIFY wake-ups: the statement-level insert trigger that `NOTIFY`s
//! `<table>_new`, so a relay wakes as soon as a transaction that wrote outbox rows commits
//! instead of waiting for its next poll, and the listener.
//!
//! Notifications are only a hint: the poll stays the source of truth, so a notification lost
//! while the listener reconnects delays rows by one poll interval at most.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::store::db::Db;
use crate::store::queue::arrivals::Arrivals;
use crate::store::sql::Sql;
use crate::store::sql::ident::derived;

/// The statement-level insert trigger that NOTIFYs `<table>_new` on the relay's own table
/// `t` (named as it always was).
pub fn notify_trigger(t: &str) -> Vec<String> {
    notify_statements(t, &format!("{t}_notify"), &notify_channel(t))
}

/// The insert trigger's statements: the function and trigger `trigger` (both SQL forms of one
/// name) on `table` (SQL form), notifying `channel`. On a mapped table only when
/// `table.notify_trigger` asks, through `migrate --adopt`.
pub fn notify_statements(table: &str, trigger: &str, channel: &str) -> Vec<String> {
    // The channel is a name of the relay's (`ident::derived` of a validated identifier): no
    // quote can occur in it, but it is written as a literal all the same.
    let channel = channel.replace('\'', "''");
    vec![
        format!(
            "CREATE OR REPLACE FUNCTION {trigger}() RETURNS trigger LANGUAGE plpgsql AS $fn$
             BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $fn$"
        ),
        format!("DROP TRIGGER IF EXISTS {trigger} ON {table}"),
        format!(
            "CREATE TRIGGER {trigger} AFTER INSERT ON {table}
             FOR EACH STATEMENT EXECUTE FUNCTION {trigger}()"
        ),
    ]
}

/// The channel the trigger of table `table` (its name as configured) notifies, within
/// PostgreSQL's 63 bytes for a channel name.
pub fn notify_channel(table: &str) -> String {
    derived(table, "new")
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

/// NOTIFYs the relays as the insert trigger does, so that rows put back (`requeue`, the
/// console) go out at once: an idle relay that NOTIFY keeps informed reads the table only
/// every second poll interval (docs/design.md, "Idle cost"). Only a hint: a failure is
/// logged, and the rows are found by the next read anyway.
pub async fn announce(db: &Db) {
    if !db.cols().notify {
        return;
    }
    let mut q = Sql::new("SELECT pg_notify(");
    q.text(&notify_channel(db.table_name())).push(", '')");
    if let Err(e) = db.query(q).execute(db.pool()).await {
        tracing::warn!(error = %e, "could not notify the relays of requeued rows");
    }
}
