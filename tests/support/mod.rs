//! Shared test harness: which databases to run against, unique table names, the binary.
//!
//! Services come from `OUTBOX_RELAY_TEST_POSTGRES_URL`, `OUTBOX_RELAY_TEST_MYSQL_URL`,
//! `OUTBOX_RELAY_TEST_REDIS_URL` (SPEC section 11 defaults). A test whose service is down is
//! skipped with a message, unless `OUTBOX_RELAY_REQUIRE_SERVICES=1` (set by `.ci/run`), which
//! makes it fail instead.
#![allow(dead_code)]

pub mod receiver;
pub mod redis;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use outbox_relay::store::{OutboxStore, SqlStore};

/// A database the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Postgres,
    MySql,
    Sqlite,
}

impl Db {
    /// The server URL for this database; SQLite gets a fresh file under `dir`.
    pub fn url(self, dir: &std::path::Path) -> String {
        match self {
            Db::Postgres => std::env::var("OUTBOX_RELAY_TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            Db::MySql => std::env::var("OUTBOX_RELAY_TEST_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
            Db::Sqlite => format!("sqlite://{}?mode=rwc", dir.join("outbox.db").display()),
        }
    }
}

/// True when service-backed tests must not be skipped.
pub fn services_required() -> bool {
    std::env::var("OUTBOX_RELAY_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// A unique, valid table name for one test (tests run in parallel and across processes).
pub fn unique_table(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}_{}_{}_{n}", std::process::id(), nanos % 100_000)
}

/// One test's database: a store on a fresh, migrated table.
pub struct TestDb {
    pub db: Db,
    pub url: String,
    pub table: String,
    pub store: Arc<SqlStore>,
    /// Holds the SQLite file (and anything else the test writes) until the test ends.
    pub dir: tempfile::TempDir,
}

impl TestDb {
    /// Connects and migrates a fresh table, or returns `None` (test skipped) when the
    /// service is unreachable and not required. Panics when required and unreachable.
    pub async fn open(db: Db, prefix: &str) -> Option<TestDb> {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = db.url(dir.path());
        let table = unique_table(prefix);
        let store = match SqlStore::connect(&url, &table, 8, Duration::from_secs(5)).await {
            Ok(s) => s,
            Err(e) => {
                if services_required() {
                    panic!(
                        "{db:?} at {url} is required (OUTBOX_RELAY_REQUIRE_SERVICES=1) but unreachable: {e}"
                    );
                }
                eprintln!("SKIPPED: {db:?} at {url} unreachable: {e}");
                return None;
            }
        };
        store.migrate().await.expect("migrate");
        Some(TestDb {
            db,
            url,
            table,
            store: Arc::new(store),
            dir,
        })
    }

    /// The store as the trait object the relay uses.
    pub fn dyn_store(&self) -> Arc<dyn OutboxStore> {
        self.store.clone()
    }

    /// Runs a statement on the test's database (`{t}` is replaced by the table name).
    pub async fn exec(&self, sql: &str) {
        let sql = sql.replace("{t}", &self.table);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(self.store.pool())
            .await
            .expect("exec");
    }

    /// Reads one integer (`{t}` is replaced by the table name).
    pub async fn scalar(&self, sql: &str) -> i64 {
        use sqlx::Row;
        let sql = sql.replace("{t}", &self.table);
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_one(self.store.pool())
            .await
            .expect("scalar");
        row.try_get::<i64, _>(0).expect("integer")
    }

    /// Row counts by status: (PENDING, RETRY, SUCCESS, FAILED).
    pub async fn counts(&self) -> [i64; 4] {
        let mut out = [0; 4];
        for (i, s) in ["PENDING", "RETRY", "SUCCESS", "FAILED"].iter().enumerate() {
            out[i] = self
                .scalar(&format!("SELECT COUNT(*) FROM {{t}} WHERE status = '{s}'"))
                .await;
        }
        out
    }

    /// Drops the test's table (best effort; tables have unique names anyway).
    pub async fn drop_table(&self) {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {}",
            self.table
        )))
        .execute(self.store.pool())
        .await;
    }
}

/// The relay binary built by cargo for integration tests.
pub fn relay_bin() -> &'static str {
    env!("CARGO_BIN_EXE_outbox-relay")
}

/// Generates one `#[tokio::test]` per database from an async fn taking a [`Db`].
#[macro_export]
macro_rules! per_db {
    ($name:ident) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(support::Db::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                super::$name(support::Db::MySql).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(support::Db::Sqlite).await
            }
        }
    };
}
