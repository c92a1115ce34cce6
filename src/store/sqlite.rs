//! SQLite: schema. Timestamps are UTC text `YYYY-MM-DD HH:MM:SS.SSS`, which sorts like time.
//! SQLite has one writer at a time, so a claim (one `UPDATE ... RETURNING`) is atomic without
//! row locks; the database runs in WAL mode so `enqueue` and `status` do not block the relay.

use std::time::{Duration, Instant};

use super::SqlStore;

/// The lease table (`outbox_relay_lease`): also created beside a mapped table.
pub(super) fn lease_table() -> String {
    "CREATE TABLE IF NOT EXISTS outbox_relay_lease (
            name TEXT PRIMARY KEY,
            holder TEXT NULL,
            lease_until TEXT NULL,
            epoch INTEGER NOT NULL DEFAULT 0
        )"
    .to_string()
}

/// Schema version 1.
pub(super) fn schema_v1(t: &str) -> Vec<String> {
    let now = "(strftime('%Y-%m-%d %H:%M:%f','now'))";
    vec![
        // AUTOINCREMENT: ids are idempotency keys and must never be reused after a purge.
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                channel TEXT NOT NULL,
                recipient TEXT NULL,
                payload TEXT NOT NULL,
                ordering_key TEXT NULL,
                status TEXT NOT NULL DEFAULT 'PENDING'
                    CHECK (status IN ('PENDING', 'RETRY', 'SUCCESS', 'FAILED')),
                attempts INTEGER NOT NULL DEFAULT 0,
                next_attempt_at TEXT NOT NULL DEFAULT {now},
                claimed_by TEXT NULL,
                claim_token TEXT NULL,
                claimed_until TEXT NULL,
                last_error TEXT NULL,
                created_at TEXT NOT NULL DEFAULT {now},
                updated_at TEXT NOT NULL DEFAULT {now},
                sent_at TEXT NULL
            )"
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {t}_due_idx ON {t} (id, next_attempt_at)
             WHERE status IN ('PENDING', 'RETRY')"
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS {t}_ordering_idx ON {t} (ordering_key, id)
             WHERE ordering_key IS NOT NULL"
        ),
        format!("CREATE INDEX IF NOT EXISTS {t}_status_idx ON {t} (status, updated_at)"),
        format!(
            "CREATE INDEX IF NOT EXISTS {t}_pending_age_idx ON {t} (created_at)
             WHERE status IN ('PENDING', 'RETRY')"
        ),
        lease_table(),
    ]
}

/// Schema version 10: the unfinished rows by `next_attempt_at`, so that an idle read can tell
/// in one index seek whether any of them is due ([`anything_due`]).
pub(super) fn next_attempt_index(t: &str) -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS {t}_next_attempt_idx ON {t} (next_attempt_at)
         WHERE status IN ('PENDING', 'RETRY')"
    )
}

/// The longest an idle relay goes without reading the picks themselves, whatever
/// [`anything_due`]'s index says (see there).
pub(super) const FULL_READ_EVERY: Duration = Duration::from_secs(60);

/// SQLite, on the relay's own table: whether any unfinished row may be due, from
/// `next_attempt_idx` alone (schema version 10). The idle read asks this first. The picks
/// walk a channel's unfinished rows in id order and read each row's `next_attempt_at`: over
/// 100,000 rows waiting for a retry an hour away each idle read took about 20 ms, twice a
/// second (docs/design.md, "Idle cost").
///
/// "No" must never hide a claimable row. The claim counts a row as due when its time has
/// come or when its `next_attempt_at` is not a time at all (an application's typo, which the
/// claim takes so that it can be failed; [`Dialect::due`]). The seek finds times that have
/// come, anything stored as a number (numbers sort before text), and text from `'9999'` up
/// (which covers text starting with a letter, and blobs). Text starting with a digit that is
/// still not a time and sorts after now (`'2099-13-45'`) is not found by the seek; for it the
/// picks are read anyway at least every [`FULL_READ_EVERY`] (and on the first idle read),
/// so such a row waits at most that long on an idle relay, and not at all on a busy one,
/// whose claims do not ask. "Yes" promises nothing (the due row may be claimed, or behind
/// its key), so the picks are read next.
///
/// [`Dialect::due`]: super::Dialect::due
pub(super) async fn anything_due(store: &SqlStore) -> bool {
    let now = Instant::now();
    let read_anyway = match store.full_read_at.lock() {
        Ok(at) => full_read_due(*at, now),
        Err(_) => true,
    };
    let due = read_anyway || seek_due(store).await;
    if due && let Ok(mut at) = store.full_read_at.lock() {
        *at = Some(now);
    }
    due
}

/// The two seeks of [`anything_due`]: whether `next_attempt_idx` holds a time that has come,
/// or a value from `'9999'` up.
async fn seek_due(store: &SqlStore) -> bool {
    let (t, now) = (&store.table, store.dialect.now());
    // Each seek is one range: with the two ranges in one OR, SQLite scanned the whole index.
    let seek = |range: &str| {
        format!(
            "SELECT 1 FROM (SELECT 1 FROM {t} INDEXED BY {t}_next_attempt_idx \
             WHERE status IN ('PENDING', 'RETRY') AND next_attempt_at {range} LIMIT 1)"
        )
    };
    let sql = format!(
        "{} UNION ALL {} LIMIT 1",
        seek(&format!("<= {now}")),
        seek(">= '9999'")
    );
    match store.sql(&sql).fetch_optional(&store.pool).await {
        Ok(row) => row.is_some(),
        // No answer is no "no": the picks are read, and say what is wrong if anything is (a
        // table below version 10, with `database.migrate = false`, lacks the index).
        Err(e) => {
            tracing::debug!(error = %e, "the index of due times could not be read; reading the picks");
            true
        }
    }
}

/// Whether the picks are to be read whatever the index says: never read yet, or not for
/// [`FULL_READ_EVERY`].
fn full_read_due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= FULL_READ_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_picks_are_read_first_and_then_at_least_every_minute() {
        let t0 = Instant::now();
        assert!(full_read_due(None, t0));
        assert!(!full_read_due(Some(t0), t0));
        assert!(!full_read_due(Some(t0), t0 + FULL_READ_EVERY / 2));
        assert!(full_read_due(Some(t0), t0 + FULL_READ_EVERY));
        // A clock read before the last read (another task's) is not a minute later.
        assert!(!full_read_due(Some(t0 + FULL_READ_EVERY), t0));
    }
}
