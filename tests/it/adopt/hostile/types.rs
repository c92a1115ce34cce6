//! Every scalar type of each database in a payload object: `check-config` accepts them all,
//! and each arrives as a JSON string in the format docs/adopting-a-table.md documents
//! (numbers with their exact digits, dates and times in ISO 8601, a time with a zone in UTC
//! with a `Z`, booleans `true`/`false`, bytes as lower-case hex).

use super::*;
use crate::support::process::*;
use crate::support::receiver::Receiver;

/// A column: (its name, its type, the value inserted as SQL, the text delivered).
type Column = (&'static str, &'static str, &'static str, &'static str);

/// Columns as text, one a line: `name | type | value as SQL | text delivered`.
fn table(text: &'static str) -> Vec<Column> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&'static str> = l.split(" | ").map(str::trim).collect();
            (f[0], f[1], f[2], f[3])
        })
        .collect()
}

/// The columns PostgreSQL and MySQL both have (`{...}`: the type's name there, from
/// [`server_columns`]).
const SERVER: &str = "
n   | {numeric}        | 12.500                    | 12.500
i   | {integer}        | 42                        | 42
big | BIGINT           | 9007199254740993          | 9007199254740993
s   | SMALLINT         | -5                        | -5
r   | {real}           | 1.5                       | 1.5
d   | {double}         | 0.1                       | 0.1
dt  | DATE             | '2024-02-29'              | 2024-02-29
ts  | {micros}         | '2024-01-02 03:04:05.25'  | 2024-01-02T03:04:05.25
ts0 | {timestamp}      | '2024-01-02 03:04:00'     | 2024-01-02T03:04:00
tm  | TIME             | '12:30:00'                | 12:30:00
j   | {json}           | '{\"a\": 1}'              | {\"a\": 1}
txt | TEXT             | 'héllo'                   | héllo
";

/// The columns PostgreSQL and MySQL both have, by the names of their types there: numeric,
/// integer, real, double, timestamp with microseconds, timestamp, JSON.
fn server_columns(types: [&'static str; 7]) -> Vec<Column> {
    let names = [
        "{numeric}",
        "{integer}",
        "{real}",
        "{double}",
        "{micros}",
        "{timestamp}",
        "{json}",
    ];
    table(SERVER)
        .into_iter()
        .map(|(c, ty, v, t)| {
            let ty = names.iter().position(|n| *n == ty).map_or(ty, |i| types[i]);
            (c, ty, v, t)
        })
        .collect()
}

const UUID: &str = "
u   | UUID | 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11' | a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11
";

const POSTGRES: &str = r"
b   | BOOLEAN     | true                      | true
tz  | TIMESTAMPTZ | '2024-01-02 03:04:05+02'  | 2024-01-02T01:04:05Z
by  | BYTEA       | '\xdeadbeef'              | deadbeef
";

const MYSQL: &str = "
un   | INT UNSIGNED      | 4294967295             | 4294967295
flag | TINYINT(1)        | 1                      | 1
bits | BIT(3)            | b'101'                 | 5
tz   | TIMESTAMP(6) NULL | '2024-01-02 03:04:05'  | 2024-01-02T03:04:05Z
y    | YEAR              | 2024                   | 2024
e    | ENUM('a','b')     | 'b'                    | b
st   | SET('x','y')      | 'x,y'                  | x,y
bin  | VARBINARY(4)      | X'DEADBEEF'            | deadbeef
bl   | BLOB              | X'00FF'                | 00ff
p    | POINT             | POINT(1, 2)            | POINT(1 2)
";

const SQLITE: &str = "
i   | INTEGER | 42           | 42
r   | REAL    | 0.1          | 0.1
n   | NUMERIC | '12.500'     | 12.5
dt  | DATE    | '2024-02-29' | 2024-02-29
b   | BOOLEAN | 1            | 1
bl  | BLOB    | X'DEADBEEF'  | deadbeef
txt | TEXT    | 'héllo'      | héllo
";

/// The columns of every scalar type of `db` (of MariaDB's too where `mariadb`).
fn columns(db: Db, mariadb: bool) -> Vec<Column> {
    let mut all = match db {
        Db::Postgres => server_columns([
            "NUMERIC(10,3)",
            "INTEGER",
            "REAL",
            "DOUBLE PRECISION",
            "TIMESTAMP(6)",
            "TIMESTAMP",
            "JSONB",
        ]),
        Db::MySql => server_columns([
            "DECIMAL(10,3)",
            "INT",
            "FLOAT",
            "DOUBLE",
            "DATETIME(6)",
            "DATETIME",
            "JSON",
        ]),
        Db::Sqlite => table(SQLITE),
    };
    match db {
        Db::Postgres => all.extend(table(POSTGRES).into_iter().chain(table(UUID))),
        Db::MySql if mariadb => all.extend(table(MYSQL).into_iter().chain(table(UUID))),
        Db::MySql => all.extend(table(MYSQL)),
        Db::Sqlite => {}
    }
    all
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
