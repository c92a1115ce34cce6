//! What the operator's queries and the lock tables do differently on SQLite: on the relay's
//! own table the FAILED rows, the unfinished rows' ages and the blocked keys are read through
//! the relay's indexes by name (without `ANALYZE` statistics SQLite sorts every FAILED row, or
//! walks every unfinished row through the status index, instead), and ShedLock's times are
//! text in its `strftime` form.

use super::Sqlite;
use crate::store::admin::{AdminSql, blocked_keys_in};
use crate::store::db::Db;
use crate::store::locks::LockSql;
use crate::store::sql::Sql;

impl AdminSql for Sqlite {
    /// On the relay's own table through the index of unfinished rows' `created_at`, named:
    /// SQLite's planner, with no statistics, took the status index, and the age gauge read
    /// every unfinished row instead of the index's first entry.
    fn unfinished_rows(&self, db: &Db) -> (String, String, String) {
        let (t, c) = (db.table(), db.cols());
        let from = match c.mapped {
            false => format!("{t} INDEXED BY {}", db.object("pending_age_idx").1),
            true => t.to_string(),
        };
        (from, c.open(""), c.channel_text("", db.syntax()))
    }

    /// On the relay's own table through the index of unfinished keyed rows, named: the keys
    /// come in order from it, without the status index's walk and a sort to group them.
    fn blocked_keys(&self, db: &Db) -> Option<String> {
        let t = db.table();
        match db.cols().mapped {
            false => blocked_keys_in(db, &format!("{t} o INDEXED BY {t}_open_key_idx")),
            true => blocked_keys_in(db, &format!("{t} o")),
        }
    }

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
