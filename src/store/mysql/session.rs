//! MySQL/MariaDB's session settings, run on every connection the pool opens, and what the
//! server can do (read once connections are open).

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Executor};

use super::{MySql, capabilities};
use crate::store::db::{Connect, LOCK_WAIT, Options, Refined, STATEMENT_TIME};
use crate::store::sql::Dialect;

impl Connect for MySql {
    fn options(&self, url: &str, options: AnyPoolOptions) -> Options {
        let options = options.after_connect(|conn, _| Box::pin(settings(conn)));
        Ok((url.to_string(), options))
    }

    fn opened<'a>(&'a self, pool: &'a AnyPool, _url: &'a str, _dialect: Dialect) -> Refined<'a> {
        Box::pin(async move {
            // One connection for both questions: the pool may not have the first back yet.
            let mut conn = pool.acquire().await?;
            let version: String = sqlx::query_scalar("SELECT VERSION()")
                .fetch_one(&mut *conn)
                .await?;
            let (mariadb, skip_locked) = capabilities(&version);
            if !skip_locked {
                tracing::warn!(
                    %version,
                    "server has no FOR UPDATE SKIP LOCKED; claims will wait on each other"
                );
            }
            let multi_statements = multi_statements(&mut conn).await;
            if !multi_statements {
                tracing::warn!(
                    %version,
                    "the server (or a proxy in front of it) refuses several statements in one \
                     query; claims will send theirs one by one"
                );
            }
            Ok(Dialect::MySql {
                mariadb,
                skip_locked,
                multi_statements,
            })
        })
    }
}

/// Whether two statements sent as one query both run: MySQL and MariaDB grant the client's
/// `CLIENT_MULTI_STATEMENTS`, which sqlx asks for; a proxy in front of them may not.
async fn multi_statements(conn: &mut AnyConnection) -> bool {
    let probe = sqlx::raw_sql(AssertSqlSafe("SELECT 1; SELECT 2"));
    probe
        .fetch_all(conn)
        .await
        .is_ok_and(|rows| rows.len() == 2)
}

/// The settings of one new session.
///
/// Every statement waits at most [`LOCK_WAIT`] for a lock and runs at most
/// [`STATEMENT_TIME`] on the server: a table locked by another session (a migration, a long
/// transaction of the application's) makes a claim fail and retry instead of hanging. A relay
/// paused inside a transaction (SIGSTOP, a stall) must not keep its locks for as long as it
/// is stopped: MariaDB ends such a session after 5 s (MySQL 8 has no such setting; only its
/// claim and migrations use transactions).
async fn settings(conn: &mut sqlx::AnyConnection) -> Result<(), sqlx::Error> {
    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "SET SESSION innodb_lock_wait_timeout = {lock}, lock_wait_timeout = {lock}",
        lock = LOCK_WAIT.as_secs()
    )))
    .await?;
    // MariaDB only; MySQL refuses the unknown variables, which is harmless (there,
    // max_execution_time bounds SELECTs only).
    let _ = conn
        .execute("SET SESSION idle_transaction_timeout = 5")
        .await;
    let _ = conn
        .execute(sqlx::AssertSqlSafe(format!(
            "SET SESSION max_statement_time = {}",
            STATEMENT_TIME.as_secs()
        )))
        .await;
    Ok(())
}
