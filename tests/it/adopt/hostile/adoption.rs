//! `migrate --adopt` on tables the suite's own are not: status columns of every type with
//! several open values (MariaDB refuses `IN` over a `CHAR(n)` column, and a `CHAR(n)` value, in
//! an indexed virtual column), all or nothing when a step fails (nothing of the run is left
//! behind, the failing statement is named, and a rerun after the cause is gone completes),
//! and a dry run that changes nothing at all (on SQLite not even the lease table).

use super::*;
use crate::support::process::*;
use crate::support::receiver::Receiver;

/// A table whose status, channel and key columns are of the given types.
async fn typed_table(db: Db, n: usize, status: &str, channel: &str) -> Option<TestDb> {
    let mut td = app_db(db, "hostile_adopt").await?;
    td.table = format!("{}_{n}", td.table);
    let columns =
        format!("ch {channel} NULL, k CHAR(8) NULL, body TEXT NULL, st {status} NOT NULL");
    created(td, &columns).await
}

const MAPPING: &str = r#"
[table.columns]
id = "id"
channel = "ch"
ordering_key = "k"
payload = "body"
status = "st"

[table.status]
pending = ["R", "T"]
retry = "Y"
success = "S"
failed = "F"
"#;

/// Status column types with several open values, and channel column types.
const TYPES: &[(&str, &str)] = &[
    ("CHAR(1)", "CHAR(10)"),
    ("CHAR(3)", "VARCHAR(16)"),
    ("VARCHAR(4)", "CHAR(16)"),
    ("TEXT", "TEXT"),
    ("VARCHAR(2)", "INT"),
];

/// MySQL only: more types.
const MYSQL_TYPES: &[(&str, &str)] = &[
    (
        "CHAR(1) CHARACTER SET latin1",
        "CHAR(10) CHARACTER SET latin1",
    ),
    ("CHAR(2) COLLATE utf8mb4_bin", "VARCHAR(16)"),
    ("ENUM('R','T','Y','S','F')", "ENUM('hook','other')"),
    ("SET('R','T','Y','S','F')", "VARCHAR(16)"),
];

per_db!(char_status_columns_with_several_open_values_are_adopted);
async fn char_status_columns_with_several_open_values_are_adopted(db: Db) {
    let more = if db == Db::MySql { MYSQL_TYPES } else { &[] };
    for (n, (status, channel)) in TYPES.iter().chain(more).enumerate() {
        let Some(td) = typed_table(db, n, status, channel).await else {
            return;
        };
        let cfg = config("http://127.0.0.1:1/hook", MAPPING, 1);
        let plan = ok(&td, &cfg, &["migrate", "--adopt"]).await;
        ok(&td, &cfg, &["check-config"]).await;
        assert!(
            ok(&td, &cfg, &["migrate", "--adopt"])
                .await
                .contains("nothing to change"),
            "{status}: {plan}"
        );
    }
    // One of them delivered end to end: both open values, the key, a NULL channel.
    let Some(td) = typed_table(db, 99, "CHAR(1)", "CHAR(10)").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let cfg = config(&rx.url(), MAPPING, 1);
    ok(&td, &cfg, &["migrate", "--adopt"]).await;
    exec(
        &td,
        "INSERT INTO {T} (ch, k, body, st) VALUES ('hook', 'k1', '{\"n\":1}', 'R'), \
         ('hook', 'k1', '{\"n\":2}', 'T'), (NULL, NULL, '{\"n\":3}', 'T'), \
         ('hook', NULL, '{\"n\":4}', 'S')",
    )
    .await;
    let relay = RelayProc::start(&td, &cfg, "chars");
    let want = [Some("S"), Some("S"), Some("F"), Some("S")];
    // CHAR(n) read as text (the driver decodes no `bpchar`).
    let states = match db {
        Db::Postgres => "SELECT st::text FROM {T} ORDER BY id",
        _ => "SELECT st FROM {T} ORDER BY id",
    };
    wait_for(&td, states, &want, || relay.log_text()).await;
    assert_eq!(
        rx.received_ids(),
        vec![1, 2],
        "in key order, the finished row never"
    );
}

per_db!(a_failed_adoption_leaves_nothing_behind);
async fn a_failed_adoption_leaves_nothing_behind(db: Db) {
    let Some(td) = typed_table(db, 0, "CHAR(1)", "VARCHAR(16)").await else {
        return;
    };
    let t = td.table.clone();
    // Something the plan cannot get past: a table named like the claims' index (PostgreSQL,
    // SQLite: one namespace), or a table at MySQL's 64 indexes.
    let blocker = match db {
        Db::MySql => {
            for i in 0..63 {
                exec(&td, &format!("CREATE INDEX x{i} ON {{T}} (id, st)")).await;
            }
            None
        }
        _ => {
            let name = format!("{t}_channel_due_idx");
            exec(&td, &format!("CREATE TABLE {} (x INT)", q(db, &name))).await;
            Some(name)
        }
    };
    let cfg = config("http://127.0.0.1:1/hook", MAPPING, 1);
    let before = texts(&td, &columns_sql(db, &t)).await;
    let out = verb(&td, &cfg, &["migrate", "--adopt"]).await;
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("failed at `CREATE INDEX"),
        "the failing statement is named: {said}"
    );
    assert_eq!(
        texts(&td, &columns_sql(db, &t)).await,
        before,
        "a failed adoption changed the table's columns: {said}"
    );
    // Once the cause is gone, the same command completes.
    match blocker {
        Some(name) => exec(&td, &format!("DROP TABLE {}", q(db, &name))).await,
        // Room for both indexes (the channel's and the key's).
        None => exec(&td, "ALTER TABLE {T} DROP INDEX x0, DROP INDEX x1").await,
    }
    ok(&td, &cfg, &["migrate", "--adopt"]).await;
    ok(&td, &cfg, &["check-config"]).await;
}

/// The table's column names, in order.
fn columns_sql(db: Db, table: &str) -> String {
    match db {
        Db::Postgres => format!(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_name = '{table}' ORDER BY ordinal_position"
        ),
        Db::MySql => format!(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' ORDER BY ORDINAL_POSITION"
        ),
        Db::Sqlite => format!("SELECT name FROM pragma_table_xinfo('{table}')"),
    }
}

per_db!(a_dry_run_changes_nothing);
async fn a_dry_run_changes_nothing(db: Db) {
    let Some(td) = typed_table(db, 0, "CHAR(1)", "VARCHAR(16)").await else {
        return;
    };
    if db == Db::Sqlite {
        // A database of the application's: no table of the relay's yet.
        exec(&td, "DROP TABLE outbox_relay_lease").await;
    }
    let objects = match db {
        Db::Postgres => format!(
            "SELECT relname::text FROM pg_class WHERE relname::text LIKE '{}%' ORDER BY 1",
            td.table
        ),
        Db::MySql => format!(
            "SELECT CONCAT(TABLE_NAME, '.', INDEX_NAME) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{}' ORDER BY 1",
            td.table
        ),
        Db::Sqlite => "SELECT name FROM sqlite_master ORDER BY 1".to_string(),
    };
    let before = (
        texts(&td, &columns_sql(db, &td.table)).await,
        texts(&td, &objects).await,
    );
    let cfg = config("http://127.0.0.1:1/hook", MAPPING, 1);
    let plan = ok(&td, &cfg, &["migrate", "--adopt", "--dry-run"]).await;
    assert!(plan.contains("dry run: nothing was changed"), "{plan}");
    let after = (
        texts(&td, &columns_sql(db, &td.table)).await,
        texts(&td, &objects).await,
    );
    assert_eq!(before, after, "the dry run changed something: {plan}");
    if db == Db::Sqlite {
        assert!(
            !after
                .1
                .iter()
                .any(|n| n.as_deref() == Some("outbox_relay_lease")),
            "{after:?}"
        );
    }
}

per_db!(adoption_never_refuses_the_applications_rows);
/// What `migrate --adopt` adds never refuses a row the application could insert before: a
/// channel or an ordering key as long as its column allows (MySQL's indexed virtual columns are
/// as wide as their source, or cut the channel short); a key column too wide for MySQL's index
/// is refused by the check instead.
async fn adoption_never_refuses_the_applications_rows(db: Db) {
    let Some(td) = typed_table(db, 0, "VARCHAR(4)", "VARCHAR(300)").await else {
        return;
    };
    exec(&td, "ALTER TABLE {T} ADD COLUMN long_key VARCHAR(700) NULL").await;
    let mapping = MAPPING.replace("ordering_key = \"k\"", "ordering_key = \"long_key\"");
    let rx = Receiver::start(None).await;
    let cfg = config(&rx.url(), &mapping, 1);
    ok(&td, &cfg, &["migrate", "--adopt"]).await;
    let (long_channel, long_key) = ("c".repeat(250), "k".repeat(700));
    exec(
        &td,
        &format!(
            "INSERT INTO {{T}} (ch, long_key, body, st) VALUES \
             ('{long_channel}', '{long_key}', '{{}}', 'R'), ('hook', '{long_key}', '{{}}', 'R')"
        ),
    )
    .await;
    let relay = RelayProc::start(&td, &cfg, "long");
    let want = [Some("F"), Some("S")];
    wait_for(&td, "SELECT st FROM {T} ORDER BY id", &want, || {
        relay.log_text()
    })
    .await;
    if db == Db::MySql {
        exec(&td, "ALTER TABLE {T} ADD COLUMN text_key TEXT NULL").await;
        let mapping = MAPPING.replace("ordering_key = \"k\"", "ordering_key = \"text_key\"");
        let cfg = config(&rx.url(), &mapping, 1);
        let said = ["table.columns.ordering_key", "VARCHAR(765) or shorter"];
        refused(&td, &cfg, &["check-config"], &said).await;
    }
}

per_db!(a_column_of_the_tables_own_named_like_bookkeeping_is_checked);
/// A column of the application's named like one the relay keeps (`attempts`), not mapped, is
/// where the relay would write: of another kind, it is refused before anything is written.
async fn a_column_of_the_tables_own_named_like_bookkeeping_is_checked(db: Db) {
    let Some(td) = typed_table(db, 0, "VARCHAR(4)", "VARCHAR(16)").await else {
        return;
    };
    exec(&td, "ALTER TABLE {T} ADD COLUMN attempts VARCHAR(10) NULL").await;
    let cfg = config("http://127.0.0.1:1/hook", MAPPING, 1);
    if db == Db::Sqlite {
        // Its columns take any value: an integer count fits.
        ok(&td, &cfg, &["migrate", "--adopt"]).await;
        return;
    }
    refused(&td, &cfg, &["check-config"], &["\"attempts\""]).await;
    refused(&td, &cfg, &["migrate", "--adopt"], &["\"attempts\""]).await;
}
