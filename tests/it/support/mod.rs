//! Shared test harness: which databases to run against, unique table names, the binary.
//!
//! Services come from `OUTBOX_RELAY_TEST_POSTGRES_URL`, `OUTBOX_RELAY_TEST_MYSQL_URL`,
//! `OUTBOX_RELAY_TEST_REDIS_URL` (defaulting to the local services). A test whose service is down is
//! skipped with a message, unless `OUTBOX_RELAY_REQUIRE_SERVICES=1` (set by `.ci/run`), which
//! makes it fail instead.

pub mod config;
pub mod process;
pub mod receiver;
pub mod redis;
pub mod vendors;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use outbox_relay::store::{NewRow, SqlStore};

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
    pub fn dyn_store(&self) -> Arc<SqlStore> {
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

    /// The fencing row of lease `name`, read directly: (holder, epoch), `None` before any
    /// acquisition.
    pub async fn lease_row(&self, name: &str) -> Option<(Option<String>, i64)> {
        use sqlx::Row;
        let sql = self
            .store
            .dialect()
            .finalize("SELECT holder, epoch FROM outbox_relay_lease WHERE name = ?");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(name.to_string())
            .fetch_optional(self.store.pool())
            .await
            .expect("lease row")
            .map(|r| {
                (
                    r.try_get::<Option<String>, _>(0).expect("holder"),
                    r.try_get::<i64, _>(1).expect("epoch"),
                )
            })
    }

    /// Inserts `n` webhook rows (channel `hook`, payload `{"n": i}`) in one statement.
    /// PostgreSQL only.
    pub async fn insert_hook_rows(&self, n: usize) {
        self.exec(&format!(
            "INSERT INTO {{t}} (channel, payload) \
             SELECT 'hook', jsonb_build_object('n', g) FROM generate_series(1, {n}) g"
        ))
        .await;
    }

    /// Waits until every row is SUCCESS (and there is at least one); after `timeout` panics
    /// with the counts and the first unfinished rows. PostgreSQL only.
    pub async fn wait_all_success(&self, timeout: Duration) {
        use sqlx::Row;
        let deadline = Instant::now() + timeout;
        loop {
            let [pending, retry, success, failed] = self.counts().await;
            if pending + retry + failed == 0 && success > 0 {
                return;
            }
            if Instant::now() >= deadline {
                let sql = format!(
                    "SELECT concat_ws(' ', id, status, coalesce(claimed_by, '-'), \
                     coalesce(claimed_until::text, '-'), coalesce(last_error, '-')) \
                     FROM {} WHERE status <> 'SUCCESS' ORDER BY id LIMIT 20",
                    self.table
                );
                let rows: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .fetch_all(self.store.pool())
                    .await
                    .expect("unfinished rows")
                    .iter()
                    .map(|r| r.try_get::<String, _>(0).expect("text"))
                    .collect();
                panic!(
                    "rows not all SUCCESS after {timeout:?}: pending {pending}, retry {retry}, \
                     success {success}, failed {failed}; unfinished (id status claimed_by \
                     claimed_until last_error): {rows:#?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A timestamp expression `secs` seconds from the database's now (negative: in the past).
pub fn db_time(db: Db, secs: i64) -> String {
    match db {
        Db::Postgres => format!("(now() + make_interval(secs => {secs}))"),
        Db::MySql => format!("DATE_ADD(NOW(6), INTERVAL {secs} SECOND)"),
        Db::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f','now','{secs} seconds')"),
    }
}

/// Upper bound for any single store or lease call made through [`bounded`]: nothing may hang.
pub const CALL: Duration = Duration::from_secs(30);

/// Awaits `f` for at most [`CALL`]; panics naming `what` if it fails or takes longer.
pub async fn bounded<T>(what: &str, f: impl std::future::Future<Output = anyhow::Result<T>>) -> T {
    match tokio::time::timeout(CALL, f).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what} failed: {e:#}"),
        Err(_) => panic!("{what} did not finish within {CALL:?}"),
    }
}

/// Enqueues a webhook row (channel `hook`, payload `{"feed": n}`) every `every` until
/// stopped, so rows are always available while relays come and go.
pub struct Feeder {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Feeder {
    /// Starts feeding `store`.
    pub fn start(store: Arc<SqlStore>, every: Duration) -> Feeder {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut n = 0u64;
            let mut tick = tokio::time::interval(every);
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                n += 1;
                store
                    .enqueue(&NewRow {
                        channel: "hook".into(),
                        recipient: None,
                        payload: format!(r#"{{"feed":{n}}}"#),
                        ordering_key: None,
                    })
                    .await
                    .expect("enqueue");
            }
            n
        });
        Feeder { stop, task }
    }

    /// Stops feeding; returns how many rows were enqueued.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("feeder")
    }
}

/// The relay binary built by cargo for integration tests.
pub fn relay_bin() -> &'static str {
    env!("CARGO_BIN_EXE_outbox-relay")
}

/// Generates one `#[tokio::test]` per database from an async fn taking a [`Db`].
macro_rules! per_db {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::support::Db::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                super::$name($crate::support::Db::MySql).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::support::Db::Sqlite).await
            }
        }
    };
}
