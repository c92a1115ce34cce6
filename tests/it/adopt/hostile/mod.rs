//! Mapped tables unlike the suite's own (issue 35): each class of table an application may
//! have, created by plain SQL as the application would, on every database, through the relay
//! binary. Names: keywords of one database and quoted mixed-case names ([`names`]); values
//! inside SQL text and wide payload objects ([`values`]); status values the status column cannot
//! hold or tell apart ([`codes`]); NULLs in every mapped column ([`nulls`]); every scalar type
//! in a payload ([`types`]); `migrate --adopt` on `CHAR(n)` status columns, all or nothing, and
//! a dry run that changes nothing ([`adoption`]); rows whose result the database refuses
//! ([`parked`]).

mod adoption;
mod codes;
mod names;
mod nulls;
mod parked;
mod types;
mod values;

use std::process::Output;
use std::time::Duration;

use sqlx::Row;

use super::{text, verb};
use crate::support::config::Config;
use crate::support::wait::*;
use crate::support::*;

/// A test database without the relay's own table: the test creates the application's.
async fn app_db(db: Db, prefix: &str) -> Option<TestDb> {
    let td = TestDb::open(db, prefix).await?;
    td.drop_table().await;
    Some(td)
}

/// `name` quoted as an identifier for `db`, for the tests' own SQL.
fn q(db: Db, name: &str) -> String {
    match db {
        Db::MySql => format!("`{name}`"),
        _ => format!("\"{name}\""),
    }
}

/// Runs `sql` on `td`'s database, `{T}` replaced by the table's quoted name.
async fn exec(td: &TestDb, sql: &str) {
    let sql = sql.replace("{T}", &q(td.db, &td.table));
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .execute(td.store.pool())
        .await
    {
        panic!("{sql}: {e}");
    }
}

/// One text column of every row of `sql` (`{T}` as in [`exec`]).
async fn texts(td: &TestDb, sql: &str) -> Vec<Option<String>> {
    let sql = sql.replace("{T}", &q(td.db, &td.table));
    sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .fetch_all(td.store.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| r.try_get::<Option<String>, _>(0).expect("text"))
        .collect()
}

/// Creates `td`'s table as an application would: an integer primary key `id` (`eventId` for
/// [`names`]) and `columns` (SQL).
async fn create(td: &TestDb, id: &str, columns: &str) {
    let name = q(td.db, id);
    let id = match td.db {
        Db::Postgres => format!("{name} BIGSERIAL PRIMARY KEY"),
        Db::MySql => format!("{name} BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY"),
        Db::Sqlite => format!("{name} INTEGER PRIMARY KEY AUTOINCREMENT"),
    };
    exec(td, &format!("CREATE TABLE {{T}} ({id}, {columns})")).await;
}

/// `td` with its table created by [`create`] (id column `id`).
async fn created(td: TestDb, columns: &str) -> Option<TestDb> {
    create(&td, "id", columns).await;
    Some(td)
}

/// Inserts one row of `values` (SQL) into `columns`.
async fn insert(td: &TestDb, columns: &[&str], values: &[&str]) {
    let sql = format!(
        "INSERT INTO {{T}} ({}) VALUES ({})",
        columns.join(", "),
        values.join(", ")
    );
    exec(td, &sql).await;
}

/// A configuration for a webhook at `url` with `mapping`, retries 300 ms apart, `attempts`
/// attempts.
fn config(url: &str, mapping: &str, attempts: u32) -> Config {
    let backoff = Duration::from_millis(300);
    Config::webhook(url)
        .retry(backoff, backoff, attempts)
        .sections(mapping)
}

/// Runs verb `args` and asserts it succeeded; returns its output as text.
async fn ok(td: &TestDb, config: &Config, args: &[&str]) -> String {
    let out = verb(td, config, args).await;
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    text(&out)
}

/// Runs verb `args` and asserts it exited 2 (a configuration the table does not fit) with
/// every one of `said` in its output.
async fn refused(td: &TestDb, config: &Config, args: &[&str], said: &[&str]) -> Output {
    let out = verb(td, config, args).await;
    let all = text(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} was not refused: {all}"
    );
    for s in said {
        assert!(all.contains(s), "{args:?} does not say {s:?}: {all}");
    }
    out
}

/// Texts as `&str`s.
fn as_strs(texts: &[Option<String>]) -> Vec<Option<&str>> {
    texts.iter().map(Option::as_deref).collect()
}

/// Waits (up to 30 s) until `sql` (`{T}` as in [`exec`]) reads `want`.
async fn wait_for(td: &TestDb, sql: &str, want: &[Option<&str>], log: impl Fn() -> String) {
    until_reads(
        Duration::from_secs(30),
        async || texts(td, sql).await,
        |got| as_strs(got) == want,
        |got| format!("{sql} reads {:?}, not {want:?}\n{}", as_strs(&got), log()),
    )
    .await;
}
