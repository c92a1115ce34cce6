//! Which database errors go away by themselves.
//!
//! The recorder retries a transient failure (connection lost, lock or statement timeout,
//! deadlock, server shutting down) for as long as it lasts, and splits a batch that failed for
//! a reason that will not go away (a value the database refuses, a trigger or constraint) until
//! the refused row is isolated. Getting this wrong in one direction blocks every result behind
//! one bad row; in the other it gives up on rows during an ordinary outage. So anything not
//! recognised as a refusal of the data is treated as transient (see docs/design.md, "Failure
//! model").

/// True when `e` (anywhere in its chain) is a database failure that retrying the same
/// statement later can cure.
pub fn is_transient(e: &anyhow::Error) -> bool {
    for cause in e.chain() {
        if let Some(e) = cause.downcast_ref::<sqlx::Error>() {
            return sqlx_transient(e);
        }
    }
    // Not a database error at all (e.g. a pool that could not be reached): retry.
    true
}

fn sqlx_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return mysql_transient(my.number(), my.code());
            }
            match db.code() {
                Some(code) if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() => {
                    sqlite_transient(code.parse().unwrap_or(0))
                }
                Some(code) => sqlstate_transient(&code),
                None => true,
            }
        }
        // The statement itself cannot be built or its answer read: the same again fails again.
        sqlx::Error::Encode(_)
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::RowNotFound => false,
        // I/O, TLS, protocol, pool timeouts, a closed pool, a crashed worker: the connection.
        _ => true,
    }
}

/// PostgreSQL (and standard) SQLSTATE classes that describe the moment, not the data:
/// 08 connection, 40 transaction rollback (serialization failure, deadlock), 53 insufficient
/// resources, 57 operator intervention (statement timeout, shutdown), 55P03 lock not available,
/// 58 system error, HY000 (MySQL's "general") handled by number instead.
fn sqlstate_transient(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "40" | "53" | "57" | "58")) || code == "55P03"
}

/// MySQL/MariaDB: most errors carry the generic SQLSTATE HY000, so go by number first.
fn mysql_transient(number: u16, sqlstate: Option<&str>) -> bool {
    match number {
        // lock wait timeout, deadlock, too many connections, shutdown in progress, query
        // interrupted, connection killed, MariaDB max_statement_time, MySQL
        // max_execution_time, server gone away / lost connection, read-only (failover).
        1205 | 1213 | 1040 | 1053 | 1317 | 1927 | 1969 | 3024 | 2006 | 2013 | 1290 | 1836
        | 4031 => true,
        _ => sqlstate.is_some_and(sqlstate_transient),
    }
}

/// SQLite primary result codes (the low byte of an extended code): BUSY 5, LOCKED 6,
/// NOMEM 7, IOERR 10, FULL 13, CANTOPEN 14, PROTOCOL 15.
fn sqlite_transient(code: i64) -> bool {
    matches!(code & 0xff, 5 | 6 | 7 | 10 | 13 | 14 | 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates() {
        assert!(sqlstate_transient("08006"));
        assert!(sqlstate_transient("40001"));
        assert!(sqlstate_transient("40P01"));
        assert!(sqlstate_transient("57014"));
        assert!(sqlstate_transient("55P03"));
        assert!(!sqlstate_transient("22021")); // invalid byte sequence (NUL)
        assert!(!sqlstate_transient("23514")); // check violation
        assert!(!sqlstate_transient("P0001")); // raised by a trigger
        assert!(!sqlstate_transient("HY000"));
    }

    #[test]
    fn mysql_numbers() {
        assert!(mysql_transient(1205, Some("HY000")));
        assert!(mysql_transient(1213, Some("40001")));
        assert!(mysql_transient(1644, Some("40001"))); // SIGNAL SQLSTATE '40001'
        assert!(!mysql_transient(1366, Some("HY000"))); // incorrect string value
        assert!(!mysql_transient(1644, Some("45000"))); // SIGNAL from a trigger
        assert!(!mysql_transient(1406, Some("22001"))); // data too long
    }

    #[test]
    fn sqlite_codes() {
        assert!(sqlite_transient(5));
        assert!(sqlite_transient(517)); // BUSY_SNAPSHOT
        assert!(sqlite_transient(10 | (3 << 8)));
        assert!(!sqlite_transient(19)); // CONSTRAINT
        assert!(!sqlite_transient(1811)); // CONSTRAINT_TRIGGER (RAISE(ABORT))
        assert!(!sqlite_transient(1));
    }

    #[test]
    fn anything_unknown_is_transient() {
        assert!(is_transient(&anyhow::anyhow!("pool unreachable")));
        assert!(!is_transient(&anyhow::Error::new(sqlx::Error::RowNotFound)));
        let wrapped = anyhow::Error::new(sqlx::Error::PoolTimedOut).context("a claim");
        assert!(is_transient(&wrapped));
    }
}
