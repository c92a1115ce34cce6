//! PostgreSQL's session settings, run on every connection the pool opens.

use sqlx::Executor;
use sqlx::any::AnyPoolOptions;

use super::Postgres;
use crate::store::db::{Connect, LOCK_WAIT, Options, STATEMENT_TIME};

impl Connect for Postgres {
    fn options(&self, url: &str, options: AnyPoolOptions) -> Options {
        let options = options.after_connect(|conn, _| Box::pin(settings(conn)));
        Ok((url.to_string(), options))
    }
}

/// The settings of one new session.
///
/// A relay paused inside a transaction (SIGSTOP, a stall) must not keep its locks for as
/// long as it is stopped: the server ends such a session after 5 s. Every statement waits at
/// most [`LOCK_WAIT`] for a lock and runs at most [`STATEMENT_TIME`]: a table locked by
/// another session (a migration, a long transaction of the application's) makes a claim fail
/// and retry instead of hanging, so readiness tells the truth and shutdown is never held up by
/// the database.
async fn settings(conn: &mut sqlx::AnyConnection) -> Result<(), sqlx::Error> {
    conn.execute(sqlx::AssertSqlSafe(format!(
        "SET idle_in_transaction_session_timeout = '5s'; SET lock_timeout = '{}ms'; SET statement_timeout = '{}ms'",
        LOCK_WAIT.as_millis(),
        STATEMENT_TIME.as_millis()
    )))
    .await?;
    // The relay's statements are short and run thousands of times; compiling one with LLVM
    // when its estimate passes `jit_above_cost` costs far more than running it
    // (docs/performance-log.md). PostgreSQL before 11 has no JIT and refuses the setting,
    // which is harmless.
    let _ = conn.execute("SET jit = off").await;
    // Prepared statements run their generic plan, planned once per connection
    // (docs/design.md, "Generic plans"). Only when the session is at the default (`auto`):
    // a `plan_cache_mode` set in the URL's `options`, or for the role or the database, is
    // kept. PostgreSQL before 12 has no such setting and refuses the statement, which is
    // harmless.
    let _ = conn
        .execute(
            "SELECT set_config('plan_cache_mode', 'force_generic_plan', false) \
             WHERE current_setting('plan_cache_mode') = 'auto'",
        )
        .await;
    // No bitmap scans (docs/design.md, "No bitmap scans"): every read of the relay's is an
    // ordered walk of an index with a `LIMIT`, or a lookup by key, and a bitmap scan reads
    // every match before it returns the first. Only where the setting is at its default.
    let _ = conn
        .execute(
            "SELECT set_config('enable_bitmapscan', 'off', false) \
             FROM pg_settings WHERE name = 'enable_bitmapscan' \
             AND source = 'default'",
        )
        .await;
    Ok(())
}
