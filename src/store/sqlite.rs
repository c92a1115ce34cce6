//! SQLite: schema. Timestamps are UTC text `YYYY-MM-DD HH:MM:SS.SSS`, which sorts like time.
//! SQLite has one writer at a time, so a claim (one `UPDATE ... RETURNING`) is atomic without
//! row locks; the database runs in WAL mode so `enqueue` and `status` do not block the relay.

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
