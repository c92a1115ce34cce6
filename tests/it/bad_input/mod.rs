//! Bad input and poisoned results never block good rows (issue 9), through the real binary on
//! PostgreSQL, MariaDB and SQLite with a loopback webhook receiver:
//! - rows whose columns cannot be decoded (wrong storage class, invalid UTF-8, NULL) or whose
//!   payload is over every sink's limit end FAILED naming the column; their neighbours are
//!   delivered once;
//! - a result the database refuses (a trigger) is isolated: that row ends FAILED with a
//!   generic reason, every other result is written, nothing is sent twice;
//! - a failure reason with NUL and control characters is stored cleaned;
//! - while results cannot be written (a transient error), nothing new is claimed, and once
//!   they can, every row ends SUCCESS having been sent exactly once.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::config::{Config, Sink};
use crate::support::process::*;
use crate::support::receiver::{Receiver, Reply};
use crate::support::*;
use sqlx::Row;

mod neighbours;
mod poison;
mod stalls;

/// The config every test starts from: one webhook sink `hook`, one attempt per row.
fn base(rx: &Receiver) -> Config {
    Config::webhook(&rx.url()).retry(Duration::from_secs(1), Duration::from_secs(1), 1)
}

/// (status, last_error) of every row, by id.
async fn rows(td: &TestDb) -> HashMap<i64, (String, Option<String>)> {
    let sql = format!("SELECT id, status, last_error FROM {}", td.table);
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(td.store.pool())
        .await
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r.try_get::<i64, _>(0).expect("id"),
                (
                    r.try_get(1).expect("status"),
                    r.try_get(2).expect("last_error"),
                ),
            )
        })
        .collect()
}

/// Waits until no row is PENDING or RETRY.
async fn until_finished(td: &TestDb, timeout: Duration) {
    until("every row finished", timeout, || async move {
        let c = td.counts().await;
        c[0] + c[1] == 0
    })
    .await;
}

/// A JSON payload literal for an INSERT on `db`.
fn json(db: Db, text: &str) -> String {
    match db {
        Db::Postgres => format!("'{text}'::jsonb"),
        _ => format!("'{text}'"),
    }
}

/// Inserts good rows `{"n": i}` for each i in `ns`.
async fn insert_good(td: &TestDb, ns: impl IntoIterator<Item = usize>) {
    td.insert(
        "hook",
        ns.into_iter().map(|i| (None, format!(r#"{{"n":{i}}}"#))),
    )
    .await;
}

/// Asserts that every row but `bad` is SUCCESS and was received exactly once, and that no
/// request was made for a row in `bad`.
fn assert_good_delivered_once(
    rx: &Receiver,
    state: &HashMap<i64, (String, Option<String>)>,
    bad: &[i64],
) {
    let counts = rx.count_by_id();
    for (id, (status, err)) in state {
        if bad.contains(id) {
            continue;
        }
        assert_eq!(status, "SUCCESS", "row {id}: {err:?}");
        assert_eq!(counts.get(id), Some(&1), "row {id} deliveries");
    }
}

/// A BEFORE UPDATE trigger `{t}_<name>` on the outbox table that runs `body` (statements
/// of PostgreSQL's plpgsql or MySQL's trigger language; `{t}` is the table).
async fn before_update(td: &TestDb, name: &str, body: &str) {
    let trigger = format!("{{t}}_{name}");
    match td.db {
        Db::Postgres => {
            td.exec(&format!(
                "CREATE FUNCTION {trigger}() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN {body} RETURN NEW; END $$"
            ))
            .await;
            td.exec(&format!(
                "CREATE TRIGGER {trigger} BEFORE UPDATE ON {{t}} FOR EACH ROW
                 EXECUTE FUNCTION {trigger}()"
            ))
            .await;
        }
        Db::MySql => {
            td.exec(&format!(
                "CREATE TRIGGER {trigger} BEFORE UPDATE ON {{t}} FOR EACH ROW BEGIN {body} END"
            ))
            .await;
        }
        Db::Sqlite => unreachable!("SQLite's triggers are written out where they are set"),
    }
}
