//! What the operator's queries and the lock tables do differently on MySQL/MariaDB: the
//! relay's own table is read through the index of unfinished rows (`open_index.rs`); batches
//! are `UPDATE/DELETE ... ORDER BY ... LIMIT`; there is no `RETURNING`, so a new row's id
//! and a new epoch come back as the statement's `LAST_INSERT_ID`; ShedLock's statements run
//! in the server's global time zone, as the Java side's do.

use super::MySql;
use super::open_index;
use crate::BoxFuture;
use crate::store::admin::AdminSql;
use crate::store::db::Db;
use crate::store::locks::{Epoch, LockSql};
use crate::store::sql::Sql;

impl AdminSql for MySql {
    fn unfinished_rows(&self, db: &Db) -> (String, String, String) {
        match open_index::unfinished_rows(db) {
            Some(from) => from,
            None => {
                let c = db.cols();
                (
                    db.table().to_string(),
                    c.open(""),
                    c.channel_text("", db.syntax()),
                )
            }
        }
    }

    fn in_batches(&self, db: &Db, mut statement: Sql, cond: Sql, n: i64) -> Sql {
        statement
            .append(cond)
            .push(&format!(" ORDER BY {} LIMIT ", db.cols().id))
            .int(n);
        statement
    }

    fn blocked_keys(&self, db: &Db) -> Option<String> {
        open_index::blocked_keys(db)
    }

    fn failed_rows_index(&self, db: &Db) -> Option<(String, &'static str)> {
        Some(open_index::failed_rows(db))
    }

    fn insert<'a>(&'a self, db: &'a Db, insert: Sql) -> BoxFuture<'a, anyhow::Result<i64>> {
        Box::pin(async move {
            let r = db.query(insert).execute(db.pool()).await?;
            r.last_insert_id()
                .ok_or_else(|| anyhow::anyhow!("the database returned no id"))
        })
    }
}

impl LockSql for MySql {
    /// `UPDATE outbox_relay_lease SET {set}, epoch = LAST_INSERT_ID(epoch + 1) WHERE
    /// {filter}`: the new epoch comes back as the statement's `LAST_INSERT_ID`, so no second
    /// statement (and no transaction holding the lease row) is needed.
    fn bump_epoch<'a>(&'a self, db: &'a Db, set: Sql, filter: Sql) -> Epoch<'a> {
        Box::pin(async move {
            let mut q = Sql::new("UPDATE outbox_relay_lease SET ");
            q.append(set)
                .push(", epoch = LAST_INSERT_ID(epoch + 1) WHERE ")
                .append(filter);
            let r = db.query(q).execute(db.pool()).await?;
            if r.rows_affected() == 0 {
                return Ok(None);
            }
            let epoch = r
                .last_insert_id()
                .ok_or_else(|| anyhow::anyhow!("the server did not report the new epoch"))?;
            Ok(Some(epoch))
        })
    }

    fn insert_if_absent(&self, _key: &str) -> (&'static str, String) {
        ("INSERT IGNORE INTO", String::new())
    }

    fn shedlock_now(&self, offset_minutes: i32) -> String {
        match offset_minutes {
            0 => "UTC_TIMESTAMP(3)".to_string(),
            off => format!("TIMESTAMPADD(MINUTE, {off}, UTC_TIMESTAMP(3))"),
        }
    }

    fn shedlock_now_plus(&self, q: &mut Sql, offset_minutes: i32, ms: i64) {
        q.push("TIMESTAMPADD(MICROSECOND, ")
            .int(ms * 1000)
            .push(&format!(", {})", self.shedlock_now(offset_minutes)));
    }

    /// An explicit DEFAULT keeps a server with `explicit_defaults_for_timestamp = OFF` from
    /// giving the first TIMESTAMP column an `ON UPDATE CURRENT_TIMESTAMP` of its own.
    fn shedlock_time_type(&self) -> &'static str {
        "TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)"
    }

    fn shedlock_left(&self, now: &str) -> String {
        format!("CAST(TIMESTAMPDIFF(MICROSECOND, {now}, lock_until) DIV 1000 AS SIGNED)")
    }

    /// A `TIMESTAMP` column converts values through the session time zone. The relay's
    /// sessions run at UTC, while a Java application's sessions normally run in the server's
    /// global zone; so ShedLock's statements run in the global zone, as the Java side's would.
    fn shedlock_session(&self) -> Option<(&'static str, &'static str)> {
        Some((
            "SET SESSION time_zone = @@GLOBAL.time_zone",
            "SET SESSION time_zone = '+00:00'",
        ))
    }
}
