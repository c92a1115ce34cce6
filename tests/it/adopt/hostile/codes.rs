//! Status values against the status column: a value the column cannot hold (out of its
//! integer range, longer than it, not a member of its enum) or cannot tell from another
//! state's (its collation ignores case or trailing spaces, `CHAR(n)` pads, an integer column
//! reads `01` as `1`) is refused by `check-config`, `run` and `migrate --adopt`, naming the
//! key; values the column holds and tells apart are accepted.

use super::*;

/// One case: the status column's type, `[table.status]` as TOML, and what the refusal must
/// say (nothing: accepted).
struct Case {
    column: String,
    status: &'static str,
    said: &'static [&'static str],
}

/// A table with a status column of type `column`, and its check with `status`.
async fn check(db: Db, n: usize, case: &Case) {
    let Some(mut td) = app_db(db, "hostile_codes").await else {
        return;
    };
    td.table = format!("{}_{n}", td.table);
    create(&td, "id", &format!("body TEXT NULL, st {}", case.column)).await;
    let mapping = format!(
        "[table]\nchannel_value = \"hook\"\n[table.columns]\nid = \"id\"\nstatus = \"st\"\n\
         payload = \"body\"\n[table.status]\n{}\n",
        case.status
    );
    let config = config("http://127.0.0.1:1/hook", &mapping, 2);
    if case.said.is_empty() {
        ok(&td, &config, &["migrate", "--adopt"]).await;
        ok(&td, &config, &["check-config"]).await;
        return;
    }
    refused(&td, &config, &["check-config"], case.said).await;
    let out = verb(&td, &config, &["migrate", "--adopt"]).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(case.said[0]), "{}", text(&out));
    assert!(
        !super::super::has_column(&td, "claimed_by").await,
        "a refused mapping changed the table"
    );
}

const RANGE: &[&str] = &["table.status.failed", "32768 does not fit"];
const SPACES: &[&str] = &["table.status.failed", "equals \"NEW\""];
const CASE: &[&str] = &["table.status.success", "equals \"ready\""];
const MEMBER: &[&str] = &["table.status.failed", "not a member"];
const LENGTH: &[&str] = &["table.status.pending", "holds at most 3"];
const NUMBER: &[&str] = &["table.status.success", "equals \"0\""];

/// `[table.status]` with these pending, success and failed values: numbers (`num!`) or
/// strings (`text!`).
macro_rules! num {
    ($p:literal, $s:literal, $f:literal) => {
        concat!("pending = ", $p, "\nsuccess = ", $s, "\nfailed = ", $f)
    };
}
macro_rules! text {
    ($p:literal, $s:literal, $f:literal) => {
        concat!(
            "pending = \"",
            $p,
            "\"\nsuccess = \"",
            $s,
            "\"\nfailed = \"",
            $f,
            "\""
        )
    };
}

/// A case as a table row: (the column's type, `[table.status]`, what the refusal says).
type Row = (&'static str, &'static str, &'static [&'static str]);

/// The cases of every database.
const ANY_DB: &[Row] = &[
    ("SMALLINT NOT NULL", num!(0, 1, 32768), RANGE),
    ("SMALLINT NOT NULL", num!(0, 1, 2), &[]),
    ("VARCHAR(3) NOT NULL", text!("WAITING", "OK", "ERR"), LENGTH),
    ("VARCHAR(8) NOT NULL", text!("NEW", "SENT", "FAILED"), &[]),
    ("SMALLINT NOT NULL", text!("0", "00", "2"), NUMBER),
];

/// `CHAR(n)` pads: a trailing space tells no value from another.
const PADDED: Row = ("CHAR(4) NOT NULL", text!("NEW", "SENT", "NEW "), SPACES);

const POSTGRES: &[Row] = &[
    PADDED,
    ("CHAR(4) NOT NULL", text!("NEW", "SENT", "ERR"), &[]),
];

const MYSQL: &[Row] = &[
    PADDED,
    ("VARCHAR(8) NOT NULL", text!("ready", "READY", "ERR"), CASE),
    ("VARCHAR(8) NOT NULL", text!("NEW", "SENT", "NEW "), SPACES),
    (
        "ENUM('NEW','SENT') NOT NULL",
        text!("NEW", "SENT", "FAILED"),
        MEMBER,
    ),
    // An enum takes a member in any case its collation ignores.
    (
        "ENUM('NEW','SENT','ERR') NOT NULL",
        text!("new", "SENT", "ERR"),
        &[],
    ),
    (
        "VARCHAR(8) COLLATE utf8mb4_bin NOT NULL",
        text!("ready", "READY", "ERR"),
        &[],
    ),
];

const SQLITE: &[Row] = &[
    (
        "TEXT COLLATE NOCASE NOT NULL",
        text!("ready", "READY", "ERR"),
        CASE,
    ),
    (
        "TEXT COLLATE RTRIM NOT NULL",
        text!("NEW", "SENT", "NEW "),
        SPACES,
    ),
    ("TEXT NOT NULL", text!("ready", "READY", "ERR"), &[]),
];

fn cases(db: Db) -> Vec<Case> {
    let own = match db {
        Db::Postgres => POSTGRES,
        Db::MySql => MYSQL,
        Db::Sqlite => SQLITE,
    };
    ANY_DB
        .iter()
        .chain(own)
        .map(|&(column, status, said)| Case {
            column: column.to_string(),
            status,
            said,
        })
        .collect()
}

per_db!(status_values_must_fit_the_column_and_be_told_apart);
async fn status_values_must_fit_the_column_and_be_told_apart(db: Db) {
    // SQLite's columns take any value: only what it compares equal is refused.
    let cases: Vec<Case> = cases(db)
        .into_iter()
        .filter(|c| db != Db::Sqlite || c.said != RANGE && c.said != LENGTH)
        .collect();
    for (n, case) in cases.iter().enumerate() {
        check(db, n, case).await;
    }
}

/// PostgreSQL: an enum type's members, and a case-insensitive (ICU) collation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_enum_types_and_nondeterministic_collations() {
    let Some(td) = app_db(Db::Postgres, "hostile_pg_types").await else {
        return;
    };
    let t = &td.table;
    exec(
        &td,
        &format!("CREATE TYPE {t}_state AS ENUM ('NEW', 'SENT')"),
    )
    .await;
    exec(
        &td,
        "CREATE COLLATION IF NOT EXISTS outbox_relay_test_ci \
         (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
    )
    .await;
    let cases = [
        Case {
            column: format!("{t}_state NOT NULL"),
            status: text!("NEW", "SENT", "FAILED"),
            said: MEMBER,
        },
        Case {
            column: "TEXT COLLATE outbox_relay_test_ci NOT NULL".into(),
            status: text!("ready", "READY", "ERR"),
            said: CASE,
        },
    ];
    for (n, case) in cases.iter().enumerate() {
        check(Db::Postgres, 100 + n, case).await;
    }
}
