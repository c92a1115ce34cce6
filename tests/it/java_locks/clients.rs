//! The Java side of each lock, spoken exactly as its library speaks it: Redisson's own Lua
//! scripts (and unlock publish) over plain RESP, ShedLock's own `usingDbTime()` statements, a
//! plain `GET_LOCK` session. Kept apart from the relay's code, so the tests check the relay
//! against the Java libraries, not against itself.

use sqlx::{AnyConnection, Row};

use crate::support::Db;
use crate::support::redis::{Resp, command};

/// How long the Java side's own holds last (Redisson's default watchdog timeout).
pub const JAVA_LEASE_MS: u64 = 30_000;

/// Redisson's tryLock, unlock and renewal scripts, as Redisson sends them (RedissonLock /
/// RedissonBaseLock, 3.x); kept here verbatim and separately from the relay's copy, so the
/// test checks the relay against Redisson, not against itself.
pub const R_TRY_LOCK: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";
pub const R_UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil;end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end; return nil;";

/// The Java side of one lock.
pub enum JavaLock {
    Redisson {
        port: u16,
        name: String,
        /// `<uuid>:<threadId>`, as a Redisson client's hold.
        field: String,
    },
    ShedLock {
        conn: AnyConnection,
        db: Db,
        table: String,
        name: String,
        locked_by: String,
    },
    GetLock {
        conn: AnyConnection,
        name: String,
    },
}

/// `?` placeholders as PostgreSQL's `$n`.
fn pg(sql: &str) -> String {
    let mut n = 0;
    sql.chars()
        .map(|c| {
            if c == '?' {
                n += 1;
                format!("${n}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `sql` (a `GET_LOCK` or `RELEASE_LOCK` of `name`) on the Java side's session: its value.
async fn lock_function(conn: &mut AnyConnection, sql: &'static str, name: &str) -> Option<i64> {
    let row = sqlx::query(sql)
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    row.try_get::<Option<i64>, _>(0)
        .expect("lock function value")
}

impl JavaLock {
    /// ShedLock's connection, database, table and (name, locked_by); `None` for the others.
    fn shedlock(&mut self) -> Option<(&mut AnyConnection, Db, &str, (&str, &str))> {
        match self {
            JavaLock::ShedLock {
                conn,
                db,
                table,
                name,
                locked_by,
            } => Some((conn, *db, table, (name, locked_by))),
            _ => None,
        }
    }

    /// One attempt (Redisson `tryLock()`, ShedLock `lock()`, `GET_LOCK(name, 0)`).
    pub async fn try_lock(&mut self) -> bool {
        self.try_lock_for(JAVA_LEASE_MS).await
    }

    /// One attempt holding for `lease_ms` (Redisson's lease time, ShedLock's lockAtMostFor;
    /// GET_LOCK has none).
    pub async fn try_lock_for(&mut self, lease_ms: u64) -> bool {
        match self {
            JavaLock::Redisson { port, name, field } => {
                let ms = lease_ms.to_string();
                let r = command(*port, None, &["EVAL", R_TRY_LOCK, "1", name, &ms, field])
                    .await
                    .expect("redisson tryLock");
                r.is_nil()
            }
            JavaLock::ShedLock { .. } => {
                let (conn, db, table, who) = self.shedlock().expect("ShedLock");
                shedlock_lock(conn, db, table, who, lease_ms).await
            }
            JavaLock::GetLock { conn, name } => {
                let sql = "SELECT CAST(GET_LOCK(?, 0) AS SIGNED)";
                lock_function(conn, sql, name).await == Some(1)
            }
        }
    }

    /// Lets go (Redisson `unlock()`, ShedLock's unlock with lockAtLeastFor 0, `RELEASE_LOCK`).
    pub async fn unlock(&mut self) {
        match self {
            JavaLock::Redisson { port, name, field } => {
                let channel = format!("redisson_lock__channel:{{{name}}}");
                let ms = JAVA_LEASE_MS.to_string();
                let r = command(
                    *port,
                    None,
                    &["EVAL", R_UNLOCK, "2", name, &channel, "0", &ms, field],
                )
                .await
                .expect("redisson unlock");
                assert_eq!(r, Resp::Int(1), "the Java side's unlock must find its hold");
            }
            JavaLock::ShedLock { .. } => {
                let (conn, db, table, (name, locked_by)) = self.shedlock().expect("ShedLock");
                let sql = match db {
                    Db::Postgres => pg(&format!(
                        "UPDATE {table} SET lock_until = CASE WHEN locked_at + cast(? as interval) > timezone('utc', CURRENT_TIMESTAMP) THEN locked_at + cast(? as interval) ELSE timezone('utc', CURRENT_TIMESTAMP) END WHERE name = ? AND locked_by = ?"
                    )),
                    Db::MySql => format!(
                        "UPDATE {table} SET lock_until = IF (TIMESTAMPADD(MICROSECOND, ?, locked_at) > UTC_TIMESTAMP(3) , TIMESTAMPADD(MICROSECOND, ?, locked_at), UTC_TIMESTAMP(3)) WHERE name = ? AND locked_by = ?"
                    ),
                    Db::Sqlite => format!(
                        "UPDATE {table} SET lock_until = CASE WHEN strftime('%Y-%m-%d %H:%M:%f', locked_at, ?) > strftime('%Y-%m-%d %H:%M:%f','now') THEN strftime('%Y-%m-%d %H:%M:%f', locked_at, ?) ELSE strftime('%Y-%m-%d %H:%M:%f','now') END WHERE name = ? AND locked_by = ?"
                    ),
                };
                let at_least = match db {
                    Db::Postgres => "0 milliseconds",
                    Db::MySql => "0",
                    Db::Sqlite => "+0 seconds",
                };
                let n = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(at_least)
                    .bind(at_least)
                    .bind(name)
                    .bind(locked_by)
                    .execute(&mut *conn)
                    .await
                    .expect("shedlock unlock")
                    .rows_affected();
                assert_eq!(n, 1, "the Java side's unlock must find its row");
            }
            JavaLock::GetLock { conn, name } => {
                let sql = "SELECT CAST(RELEASE_LOCK(?) AS SIGNED)";
                assert_eq!(lock_function(conn, sql, name).await, Some(1));
            }
        }
    }
}

/// ShedLock's lock with `usingDbTime()` (PostgreSQL: one upsert; MySQL: INSERT IGNORE, then
/// the conditional UPDATE; SQLite, which ShedLock has no db-time statements for: the generic
/// INSERT, then the UPDATE, on the database clock).
async fn shedlock_lock(
    conn: &mut AnyConnection,
    db: Db,
    table: &str,
    (name, by): (&str, &str),
    at_most_ms: u64,
) -> bool {
    let exec = |sql: String, binds: Vec<String>| {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for b in binds {
            q = q.bind(b);
        }
        q
    };
    let (name, by) = (name.to_string(), by.to_string());
    match db {
        Db::Postgres => {
            let now = "timezone('utc', CURRENT_TIMESTAMP)";
            let until = format!("{now} + cast(? as interval)");
            let sql = pg(&format!(
                "INSERT INTO {table}(name, lock_until, locked_at, locked_by) VALUES(?, {until}, {now}, ?) ON CONFLICT (name) DO UPDATE SET lock_until = {until}, locked_at = {now}, locked_by = ? WHERE {table}.name = ? AND {table}.lock_until <= {now}"
            ));
            let iv = format!("{at_most_ms} milliseconds");
            let b = vec![name.clone(), iv.clone(), by.clone(), iv, by, name];
            exec(sql, b)
                .execute(&mut *conn)
                .await
                .expect("shedlock upsert")
                .rows_affected()
                == 1
        }
        Db::MySql | Db::Sqlite => {
            let (now, until, at_most) = if db == Db::MySql {
                (
                    "UTC_TIMESTAMP(3)".to_string(),
                    "TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3))".to_string(),
                    (at_most_ms * 1000).to_string(),
                )
            } else {
                (
                    "strftime('%Y-%m-%d %H:%M:%f','now')".to_string(),
                    "strftime('%Y-%m-%d %H:%M:%f','now', ?)".to_string(),
                    format!("+{:.3} seconds", at_most_ms as f64 / 1000.0),
                )
            };
            let insert = if db == Db::MySql {
                "INSERT IGNORE INTO"
            } else {
                "INSERT OR IGNORE INTO"
            };
            let sql = format!(
                "{insert} {table}(name, lock_until, locked_at, locked_by) VALUES(?, {until}, {now}, ?)"
            );
            let b = vec![name.clone(), at_most.clone(), by.clone()];
            if exec(sql, b)
                .execute(&mut *conn)
                .await
                .expect("shedlock insert")
                .rows_affected()
                == 1
            {
                return true;
            }
            let sql = format!(
                "UPDATE {table} SET lock_until = {until}, locked_at = {now}, locked_by = ? WHERE name = ? AND lock_until <= {now}"
            );
            let b = vec![at_most, by, name];
            exec(sql, b)
                .execute(&mut *conn)
                .await
                .expect("shedlock update")
                .rows_affected()
                == 1
        }
    }
}
