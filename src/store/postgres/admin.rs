//! What the operator's queries and the lock tables do differently on PostgreSQL: rows put
//! back are announced by NOTIFY, and ShedLock's statements are its `usingDbTime()` forms for
//! PostgreSQL.

use super::Postgres;
use super::notify::announce;
use crate::BoxFuture;
use crate::store::admin::AdminSql;
use crate::store::db::Db;
use crate::store::locks::LockSql;
use crate::store::sql::Sql;

impl AdminSql for Postgres {
    fn announce<'a>(&'a self, db: &'a Db) -> BoxFuture<'a, ()> {
        Box::pin(announce(db))
    }
}

impl LockSql for Postgres {
    fn shedlock_now(&self, offset_minutes: i32) -> String {
        match offset_minutes {
            0 => "timezone('utc', CURRENT_TIMESTAMP)".to_string(),
            off => format!("(timezone('utc', CURRENT_TIMESTAMP) + interval '{off} minutes')"),
        }
    }

    fn shedlock_now_plus(&self, q: &mut Sql, offset_minutes: i32, ms: i64) {
        q.push(&format!("{} + cast(", self.shedlock_now(offset_minutes)))
            .text(&format!("{ms} milliseconds"))
            .push(" as interval)");
    }

    fn shedlock_time_type(&self) -> &'static str {
        "TIMESTAMP NOT NULL"
    }

    fn shedlock_left(&self, now: &str) -> String {
        format!("CAST(EXTRACT(EPOCH FROM (lock_until - {now})) * 1000 AS BIGINT)")
    }
}
