//! Every scalar type of each database in a payload object: `check-config` accepts them all,
//! and each arrives as a JSON string in the format docs/adopting-a-table.md documents
//! (numbers with their exact digits, dates and times in ISO 8601, a time with a zone in UTC
//! with a `Z`, booleans `true`/`false`, bytes as lower-case hex).

use super::*;
use crate::support::process::*;
use crate::support::receiver::Receiver;

/// (column, its type, the value inserted as SQL, the text delivered) for `db`.
fn columns(db: Db, mariadb: bool) -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    match db {
        Db::Postgres => vec![
            ("n", "NUMERIC(10,3)", "12.500", "12.500"),
            ("i", "INTEGER", "42", "42"),
            ("big", "BIGINT", "9007199254740993", "9007199254740993"),
            ("s", "SMALLINT", "-5", "-5"),
            ("r", "REAL", "1.5", "1.5"),
            ("d", "DOUBLE PRECISION", "0.1", "0.1"),
            ("b", "BOOLEAN", "true", "true"),
            ("dt", "DATE", "'2024-02-29'", "2024-02-29"),
            (
                "ts",
                "TIMESTAMP(6)",
                "'2024-01-02 03:04:05.25'",
                "2024-01-02T03:04:05.25",
            ),
            (
                "ts0",
                "TIMESTAMP",
                "'2024-01-02 03:04:00'",
                "2024-01-02T03:04:00",
            ),
            (
                "tz",
                "TIMESTAMPTZ",
                "'2024-01-02 03:04:05+02'",
                "2024-01-02T01:04:05Z",
            ),
            ("tm", "TIME", "'12:30:00'", "12:30:00"),
            (
                "u",
                "UUID",
                "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            ),
            ("by", "BYTEA", "'\\xdeadbeef'", "deadbeef"),
            ("j", "JSONB", "'{\"a\": 1}'", "{\"a\": 1}"),
            ("txt", "TEXT", "'héllo'", "héllo"),
        ],
        Db::MySql => {
            let mut all = vec![
                ("n", "DECIMAL(10,3)", "12.500", "12.500"),
                ("i", "INT", "42", "42"),
                ("big", "BIGINT", "9007199254740993", "9007199254740993"),
                ("s", "SMALLINT", "-5", "-5"),
                ("un", "INT UNSIGNED", "4294967295", "4294967295"),
                ("flag", "TINYINT(1)", "1", "1"),
                ("r", "FLOAT", "1.5", "1.5"),
                ("d", "DOUBLE", "0.1", "0.1"),
                ("bits", "BIT(3)", "b'101'", "5"),
                ("dt", "DATE", "'2024-02-29'", "2024-02-29"),
                (
                    "ts",
                    "DATETIME(6)",
                    "'2024-01-02 03:04:05.25'",
                    "2024-01-02T03:04:05.25",
                ),
                (
                    "ts0",
                    "DATETIME",
                    "'2024-01-02 03:04:00'",
                    "2024-01-02T03:04:00",
                ),
                (
                    "tz",
                    "TIMESTAMP(6) NULL",
                    "'2024-01-02 03:04:05'",
                    "2024-01-02T03:04:05Z",
                ),
                ("tm", "TIME", "'12:30:00'", "12:30:00"),
                ("y", "YEAR", "2024", "2024"),
                ("e", "ENUM('a','b')", "'b'", "b"),
                ("st", "SET('x','y')", "'x,y'", "x,y"),
                ("bin", "VARBINARY(4)", "X'DEADBEEF'", "deadbeef"),
                ("bl", "BLOB", "X'00FF'", "00ff"),
                ("j", "JSON", "'{\"a\": 1}'", "{\"a\": 1}"),
                ("p", "POINT", "POINT(1, 2)", "POINT(1 2)"),
                ("txt", "TEXT", "'héllo'", "héllo"),
            ];
            if mariadb {
                all.push((
                    "u",
                    "UUID",
                    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
                    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                ));
            }
            all
        }
        Db::Sqlite => vec![
            ("i", "INTEGER", "42", "42"),
            ("r", "REAL", "0.1", "0.1"),
            ("n", "NUMERIC", "'12.500'", "12.5"),
            ("dt", "DATE", "'2024-02-29'", "2024-02-29"),
            ("b", "BOOLEAN", "1", "1"),
            ("bl", "BLOB", "X'DEADBEEF'", "deadbeef"),
            ("txt", "TEXT", "'héllo'", "héllo"),
        ],
    }
}

per_db!(every_scalar_type_becomes_text_in_its_documented_format);
async fn every_scalar_type_becomes_text_in_its_documented_format(db: Db) {
    let Some(td) = app_db(db, "hostile_types").await else {
        return;
    };
    let mariadb = matches!(
        td.store.dialect(),
        outbox_relay::store::Dialect::MySql { mariadb: true, .. }
    );
    let cols = columns(db, mariadb);
    let defs: Vec<String> = cols
        .iter()
        .map(|(c, ty, _, _)| format!("{c} {ty}"))
        .collect();
    let columns = format!(
        "state VARCHAR(8) NOT NULL DEFAULT 'NEW', {}",
        defs.join(", ")
    );
    create(&td, "id", &columns).await;
    let pairs: Vec<String> = cols
        .iter()
        .map(|(c, ..)| format!("{c} = \"{c}\""))
        .collect();
    let mapping = format!(
        "[table]\nchannel_value = \"hook\"\n[table.columns]\nid = \"id\"\nstatus = \"state\"\n\
         [table.status]\npending = \"NEW\"\nsuccess = \"SENT\"\nfailed = \"FAILED\"\n\
         [table.payload_object]\n{}\n",
        pairs.join("\n")
    );
    let rx = Receiver::start(None).await;
    let cfg = config(&rx.url(), &mapping, 1);
    ok(&td, &cfg, &["migrate", "--adopt"]).await;
    ok(&td, &cfg, &["check-config"]).await;
    let names: Vec<&str> = cols.iter().map(|(c, ..)| *c).collect();
    let values: Vec<&str> = cols.iter().map(|(_, _, v, _)| *v).collect();
    insert(&td, &names, &values).await;
    // A row of NULLs: every type's NULL is a JSON null.
    exec(&td, "INSERT INTO {T} (state) VALUES ('NEW')").await;
    let relay = RelayProc::start(&td, &cfg, "types");
    let sent = [Some("SENT"), Some("SENT")];
    wait_for(&td, "SELECT state FROM {T} ORDER BY id", &sent, || {
        relay.log_text()
    })
    .await;
    let body: serde_json::Value = serde_json::from_str(&rx.requests_for(1)[0].body).expect("JSON");
    for (c, ty, _, want) in &cols {
        assert_eq!(
            body[c],
            serde_json::Value::String(want.to_string()),
            "{ty} column {c} in {body}"
        );
    }
    let nulls: serde_json::Value = serde_json::from_str(&rx.requests_for(2)[0].body).expect("JSON");
    for (c, ..) in &cols {
        assert_eq!(nulls[c], serde_json::Value::Null, "{c} in {nulls}");
    }
}
