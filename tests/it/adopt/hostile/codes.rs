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

/// `[table.status]` with these pending, success and failed values.
macro_rules! status {
    ($p:expr, $s:expr, $f:expr) => {
        concat!("pending = ", $p, "\nsuccess = ", $s, "\nfailed = ", $f)
    };
}

fn cases(db: Db) -> Vec<Case> {
    let c = |column: &str, status, said| Case {
        column: column.to_string(),
        status,
        said,
    };
    let mut all = vec![
        c("SMALLINT NOT NULL", status!("0", "1", "32768"), RANGE),
        c("SMALLINT NOT NULL", status!("0", "1", "2"), &[]),
        c(
            "VARCHAR(3) NOT NULL",
            status!("\"WAITING\"", "\"OK\"", "\"ERR\""),
            LENGTH,
        ),
        c(
            "VARCHAR(8) NOT NULL",
            status!("\"NEW\"", "\"SENT\"", "\"FAILED\""),
            &[],
        ),
        c(
            "SMALLINT NOT NULL",
            status!("\"0\"", "\"00\"", "\"2\""),
            NUMBER,
        ),
    ];
    match db {
        Db::Postgres => {
            all.push(c(
                "CHAR(4) NOT NULL",
                status!("\"NEW\"", "\"SENT\"", "\"NEW \""),
                SPACES,
            ));
            all.push(c(
                "CHAR(4) NOT NULL",
                status!("\"NEW\"", "\"SENT\"", "\"ERR\""),
                &[],
            ));
        }
        Db::MySql => {
            all.push(c(
                "CHAR(4) NOT NULL",
                status!("\"NEW\"", "\"SENT\"", "\"NEW \""),
                SPACES,
            ));
            all.push(c(
                "VARCHAR(8) NOT NULL",
                status!("\"ready\"", "\"READY\"", "\"ERR\""),
                CASE,
            ));
            all.push(c(
                "VARCHAR(8) NOT NULL",
                status!("\"NEW\"", "\"SENT\"", "\"NEW \""),
                SPACES,
            ));
            all.push(c(
                "ENUM('NEW','SENT') NOT NULL",
                status!("\"NEW\"", "\"SENT\"", "\"FAILED\""),
                MEMBER,
            ));
            // An enum takes a member in any case its collation ignores.
            all.push(c(
                "ENUM('NEW','SENT','ERR') NOT NULL",
                status!("\"new\"", "\"SENT\"", "\"ERR\""),
                &[],
            ));
            all.push(c(
                "VARCHAR(8) COLLATE utf8mb4_bin NOT NULL",
                status!("\"ready\"", "\"READY\"", "\"ERR\""),
                &[],
            ));
        }
        Db::Sqlite => {
            all.push(c(
                "TEXT COLLATE NOCASE NOT NULL",
                status!("\"ready\"", "\"READY\"", "\"ERR\""),
                CASE,
            ));
            all.push(c(
                "TEXT COLLATE RTRIM NOT NULL",
                status!("\"NEW\"", "\"SENT\"", "\"NEW \""),
                SPACES,
            ));
            all.push(c(
                "TEXT NOT NULL",
                status!("\"ready\"", "\"READY\"", "\"ERR\""),
                &[],
            ));
        }
    }
    all
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
            status: status!("\"NEW\"", "\"SENT\"", "\"FAILED\""),
            said: MEMBER,
        },
        Case {
            column: "TEXT COLLATE outbox_relay_test_ci NOT NULL".into(),
            status: status!("\"ready\"", "\"READY\"", "\"ERR\""),
            said: CASE,
        },
    ];
    for (n, case) in cases.iter().enumerate() {
        check(Db::Postgres, 100 + n, case).await;
    }
}
