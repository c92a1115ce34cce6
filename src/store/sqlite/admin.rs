//! What the operator's queries and the lock tables do differently on SQLite: the FAILED rows
//! are read through the relay's index by name (without `ANALYZE` statistics SQLite sorts
//! every FAILED row instead), and ShedLock's times are text in its `strftime` form.

use super::Sqlite;
use crate::store::admin::AdminSql;
use crate::store::db::Db;
use crate::store::locks::LockSql;
use crate::store::sql::Sql;

impl AdminSql for Sqlite {
    fn failed_rows_index(&self, db: &Db) -> Option<(String, &'static str)> {
        let t = db.table();
        Some((format!("{t} INDEXED BY {t}_failed_idx"), ""))
    }
}

impl LockSql for Sqlite {
    fn shedlock_now(&self, offset_minutes: i32) -> String {
        format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '{offset_minutes} minutes')")
    }

    fn shedlock_now_plus(&self, q: &mut Sql, offset_minutes: i32, ms: i64) {
        q.push(&format!(
            "strftime('%Y-%m-%d %H:%M:%f', 'now', '{offset_minutes} minutes', ("
        ))
        .int(ms)
        .push(" / 1000.0) || ' seconds')");
    }

    fn shedlock_time_type(&self) -> &'static str {
        "TEXT NOT NULL"
    }

    fn shedlock_left(&self, now: &str) -> String {
        format!("CAST((julianday(lock_until) - julianday({now})) * 86400000 AS INTEGER)")
    }
}
