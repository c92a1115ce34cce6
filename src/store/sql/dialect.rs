//! Which database a store talks to ([`Dialect`]), and the SQL text that differs between
//! databases ([`Syntax`]: clock expressions, casts, JSON, placeholders). Each database's
//! folder (`store/postgres/`, `store/mysql/`, `store/sqlite/`) implements [`Syntax`]; shared
//! code writes a statement once and asks the syntax for the pieces that differ.

/// A supported database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    /// MySQL 8 or MariaDB; `skip_locked` when the server has `FOR UPDATE SKIP LOCKED`
    /// (MySQL 8.0.1+, MariaDB 10.6+), `multi_statements` when it (or a proxy in front of it)
    /// runs several statements sent as one query.
    MySql {
        mariadb: bool,
        skip_locked: bool,
        multi_statements: bool,
    },
    Sqlite,
}

impl Dialect {
    /// The dialect a URL's scheme names (MySQL's flavour is refined after connecting).
    pub fn from_url(url: &str) -> Option<Dialect> {
        let scheme = url.split("://").next()?;
        match scheme {
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "mysql" | "mariadb" => Some(Dialect::MySql {
                mariadb: false,
                skip_locked: true,
                multi_statements: true,
            }),
            "sqlite" => Some(Dialect::Sqlite),
            _ => None,
        }
    }

    /// A short name for logs and `status`.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql { mariadb: true, .. } => "mariadb",
            Dialect::MySql { .. } => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }

    /// Whether locking reads can skip rows locked by others (`FOR UPDATE SKIP LOCKED`).
    pub fn skip_locked(self) -> bool {
        match self {
            Dialect::MySql { skip_locked, .. } => skip_locked,
            _ => true,
        }
    }

    /// Whether several statements may go as one query (MySQL/MariaDB, where the server or
    /// proxy accepts it; docs/design.md, "Statements as text on MySQL/MariaDB").
    pub fn multi_statements(self) -> bool {
        matches!(
            self,
            Dialect::MySql {
                multi_statements: true,
                ..
            }
        )
    }

    /// MariaDB rather than MySQL (their DDL differs in places).
    pub fn mariadb(self) -> bool {
        matches!(self, Dialect::MySql { mariadb: true, .. })
    }
}

/// The SQL text that differs between databases. Expressions are returned as text; those that
/// carry a value are returned as the text before and after its placeholder, which the
/// statement builder binds (`Sql::now_plus` and the like), so a value never drifts from its
/// placeholder.
pub trait Syntax: Send + Sync {
    /// Placeholders are numbered (`$1, $2, ...`, PostgreSQL) rather than `?`.
    fn numbered_placeholders(&self) -> bool {
        false
    }

    /// Statements with values go out as text, each value written as a literal, instead of
    /// being prepared: where a statement's text differs with its values (an `IN` list of ids,
    /// a list of keys), preparing it is a round trip of its own before every execution
    /// (MySQL/MariaDB; docs/design.md, "Statements as text on MySQL/MariaDB").
    fn values_as_literals(&self) -> bool {
        false
    }

    /// Sets of the relay's own ids (a claim's rows, a result write's) go as ranges of
    /// consecutive ids where there are such (`id BETWEEN a AND b`) rather than one `IN` list
    /// ([`Sql::one_of_ids`](super::Sql::one_of_ids)): MySQL/MariaDB's parser and range
    /// optimizer take each list item as a range of its own (docs/design.md, "Id sets as
    /// ranges on MySQL/MariaDB").
    fn ids_as_ranges(&self) -> bool {
        false
    }

    /// `name` quoted as an identifier.
    fn quote_ident(&self, name: &str) -> String {
        format!("\"{}\"", name.replace('"', "\"\""))
    }

    /// The name of a 64-bit integer type in a `CAST`.
    fn integer_type(&self) -> &'static str {
        "BIGINT"
    }

    /// The database's current time, in the type of the timestamp columns.
    fn now(&self) -> &'static str;

    /// Now plus a number of milliseconds (bound as an integer), in the type of the timestamp
    /// columns: the text before and after the value.
    fn now_plus_ms(&self) -> (&'static str, &'static str);

    /// The instant a number of Unix seconds (bound as an integer) names, in the type of the
    /// timestamp columns: the text before and after the value.
    fn unix_time(&self) -> (&'static str, &'static str);

    /// The Unix seconds to bind for `secs` (a database whose timestamps end earlier than the
    /// value caps it).
    fn unix_secs(&self, secs: i64) -> i64 {
        secs
    }

    /// Milliseconds from `col` to now (an integer expression).
    fn age_ms(&self, col: &str) -> String;

    /// A timestamp column as UTC text `YYYY-MM-DD HH:MM:SS` (for display).
    fn time_text(&self, col: &str) -> String;

    /// The payload (a JSON column or expression) as text.
    fn payload_text(&self, col: &str) -> String;

    /// A text column as a claim reads it. Read as bytes where the driver would decode every
    /// text value of a row eagerly, so that a value that is not valid UTF-8 fails only its own
    /// row (decoded in Rust) instead of the whole result set.
    fn claim_text(&self, col: &str) -> String {
        col.to_string()
    }

    /// The storage classes of the given columns, then whether each of `times` holds a time,
    /// comma-separated (`text,null,...,time`), for databases whose columns take any type
    /// whatever the schema says; NULL where columns are typed.
    fn storage_classes(&self, _cols: &[String], _times: &[String]) -> String {
        "NULL".to_string()
    }

    /// An integer column as a claim reads it: where columns take any type whatever the schema
    /// says, only an integer is read as one (anything else is NULL).
    fn int_value(&self, col: &str) -> String {
        col.to_string()
    }

    /// The condition that the time in `col` has come.
    fn due(&self, col: &str) -> String {
        format!("{col} <= {}", self.now())
    }

    /// The length of `col` in bytes, as the database stores it as text.
    fn byte_length(&self, col: &str) -> String;

    /// A NULL of a text type (a column a mapped table does not have).
    fn null_text(&self) -> &'static str;

    /// A NULL of an integer type.
    fn null_int(&self) -> &'static str;

    /// Any value as text.
    fn cast_text(&self, expr: &str) -> String;

    /// A column holding JSON, as a JSON value inside a built object.
    fn json_value(&self, col: &str) -> String;

    /// A JSON object built by the database from `key, value` pairs (already SQL), however
    /// many (a database whose object function takes fewer arguments joins several).
    fn json_object(&self, pairs: &[String]) -> String;

    /// The most pairs one object of a payload may have here (`None`: any number), where
    /// [`Syntax::json_object`] cannot join objects without changing their values.
    fn max_object_pairs(&self) -> Option<usize> {
        None
    }

    /// Whether a column of the server's type `ty` compares with a bound text value as it is
    /// (PostgreSQL compares no integer or enum with text: such a channel is compared as text).
    fn compares_with_text(&self, _ty: &str) -> bool {
        true
    }

    /// A mapped column of the server's type `ty` (its lower-case name, as the live table
    /// reports it; empty when unknown) as text, in the documented format of that type
    /// (docs/adopting-a-table.md, "Types"). By default [`Syntax::cast_text`].
    fn scalar_text(&self, expr: &str, _ty: &str) -> String {
        self.cast_text(expr)
    }

    /// A bound payload (text) as a value of the payload column's type: the text before and
    /// after the value.
    fn payload_value(&self) -> (&'static str, &'static str) {
        ("", "")
    }
}
