//! Shared test harness: which databases to run against, unique table names, the binary.
//!
//! Services come from `OUTBOX_RELAY_TEST_POSTGRES_URL`, `OUTBOX_RELAY_TEST_MYSQL_URL`,
//! `OUTBOX_RELAY_TEST_REDIS_URL` (defaulting to the local services). A test whose service is down is
//! skipped with a message, unless `OUTBOX_RELAY_REQUIRE_SERVICES=1` (set by `.ci/run`), which
//! makes it fail instead.

pub mod config;
pub mod console;
pub mod counting;
pub mod mariadb;
pub mod nats;
pub mod otlp;
pub mod plans;
pub mod postgres;
pub mod process;
pub mod receiver;
pub mod redis;
pub mod storm;
pub mod sweep;
pub mod vendors;
pub mod wait;
pub mod webdriver;

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
    /// The name used in output and in `OUTBOX_RELAY_BENCH_DBS`.
    pub fn name(self) -> &'static str {
        match self {
            Db::Postgres => "postgres",
            Db::MySql => "mysql",
            Db::Sqlite => "sqlite",
        }
    }

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

/// A realistic payload for row `i`: JSON with non-ASCII text, markup characters, an emoji
/// and a list (no quotes or backslashes, so it can be written as an SQL literal).
pub fn payload(i: usize) -> String {
    format!(r#"{{"n":{i},"msg":"héllo wörld <{i}> & 😀","tags":["a","b"]}}"#)
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
        let td = TestDb::open_in(db, url, dir, prefix).await?;
        sweep::once(db, td.store.pool()).await;
        Some(td)
    }

    /// [`TestDb::open`] on the server at `url` (a server of the test's own).
    pub async fn open_at(db: Db, url: String, prefix: &str) -> Option<TestDb> {
        let dir = tempfile::tempdir().expect("tempdir");
        TestDb::open_in(db, url, dir, prefix).await
    }

    async fn open_in(db: Db, url: String, dir: tempfile::TempDir, prefix: &str) -> Option<TestDb> {
        let table = unique_table(prefix);
        let store = match SqlStore::connect(&url, &table, 8, Duration::from_secs(5)).await {
            Ok(s) => s,
            Err(e) => {
                if services_required() {
                    panic!(
                        "{} at {url} is required (OUTBOX_RELAY_REQUIRE_SERVICES=1) but unreachable: {e}",
                        db.name()
                    );
                }
                eprintln!("SKIPPED: {} at {url} unreachable: {e}", db.name());
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

    /// Runs a statement on the test's database (`{t}` is replaced by the table name).
    pub async fn exec(&self, sql: &str) {
        let sql = sql.replace("{t}", &self.table);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(self.store.pool())
            .await
            .expect("exec");
    }

    /// The rows `sql` reads (`{t}` is replaced by the table name).
    pub async fn fetch(&self, sql: &str) -> Vec<sqlx::any::AnyRow> {
        let sql = sql.replace("{t}", &self.table);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(self.store.pool())
            .await
            .expect("fetch")
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
        let placeholder = match self.store.dialect() {
            outbox_relay::store::Dialect::Postgres => "$1",
            _ => "?",
        };
        let sql =
            format!("SELECT holder, epoch FROM outbox_relay_lease WHERE name = {placeholder}");
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

    /// Inserts rows of `channel` as an application does, with plain SQL (multi-row VALUES,
    /// 250 rows per statement): one row per (ordering key, payload). Payloads must hold no
    /// quote or backslash (they are written as SQL literals).
    pub async fn insert(
        &self,
        channel: &str,
        rows: impl IntoIterator<Item = (Option<String>, String)>,
    ) {
        let cast = if self.db == Db::Postgres {
            "::jsonb"
        } else {
            ""
        };
        let values: Vec<String> = rows
            .into_iter()
            .map(|(key, payload)| {
                assert!(!payload.contains('\\') && !payload.contains('\''));
                let key = key.map_or_else(|| "NULL".to_string(), |k| format!("'{k}'"));
                format!("('{channel}', '{payload}'{cast}, {key})")
            })
            .collect();
        for chunk in values.chunks(250) {
            self.exec(&format!(
                "INSERT INTO {{t}} (channel, payload, ordering_key) VALUES {}",
                chunk.join(", ")
            ))
            .await;
        }
    }

    /// Inserts `n` rows of channel `hook` with payloads [`payload`]`(1..=n)`.
    pub async fn insert_hooks(&self, n: usize) {
        self.insert("hook", (1..=n).map(|i| (None, payload(i))))
            .await;
    }

    /// Inserts one row through the store's `enqueue` (the CLI verb's path); returns its id.
    pub async fn enqueue(&self, channel: &str, payload: &str, key: Option<&str>) -> i64 {
        let row = NewRow {
            channel: channel.to_string(),
            recipient: Some("r".into()),
            payload: payload.to_string(),
            ordering_key: key.map(str::to_string),
        };
        bounded("enqueue", self.store.enqueue(&row)).await
    }

    /// Enqueues `n` rows of `channel` with `payload`, one by one through [`TestDb::enqueue`];
    /// returns their ids in order.
    pub async fn enqueue_n(&self, channel: &str, payload: &str, n: usize) -> Vec<i64> {
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(self.enqueue(channel, payload, None).await);
        }
        ids
    }

    /// Waits until every row is SUCCESS (and there is at least one); after `timeout` panics
    /// with the counts and the first unfinished rows. PostgreSQL only.
    pub async fn wait_all_success(&self, timeout: Duration) {
        use sqlx::Row;
        let all_done = |[pending, retry, success, failed]: &[i64; 4]| {
            pending + retry + failed == 0 && *success > 0
        };
        if wait::holds_within(timeout, async || all_done(&self.counts().await)).await {
            return;
        }
        let [pending, retry, success, failed] = self.counts().await;
        let sql = format!(
            "SELECT concat_ws(' ', id, status, coalesce(claimed_by, '-'), \
             coalesce(claimed_until::text, '-'), coalesce(last_error, '-')) \
             FROM {} WHERE status <> 'SUCCESS' ORDER BY id LIMIT 20",
            self.table
        );
        let rows: Vec<String> = self
            .fetch(&sql)
            .await
            .iter()
            .map(|r| r.try_get::<String, _>(0).expect("text"))
            .collect();
        panic!(
            "rows not all SUCCESS after {timeout:?}: pending {pending}, retry {retry}, \
             success {success}, failed {failed}; unfinished (id status claimed_by \
             claimed_until last_error): {rows:#?}"
        );
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

/// Asserts that the fencing row of `lease` names `holder` (its token is `<holder>#...`) and
/// that the relays' metrics agree: `lease_held` is 1 on the holder only, and the holder's
/// `lease_epoch` is the row's. Returns the row's (token, epoch) for the backend's own checks.
pub async fn assert_fenced_holder(
    td: &TestDb,
    lease: &str,
    relays: &[process::RelayProc],
    holder: &str,
) -> (String, i64) {
    use outbox_relay::metric;
    let (db_holder, epoch) = td.lease_row(lease).await.expect("fencing row exists");
    let token = db_holder.expect("the fencing row names the holder");
    assert!(
        token.starts_with(&format!("{holder}#")),
        "outbox_relay_lease.holder is {token:?}, but {holder} is the one delivering"
    );
    for r in relays {
        let held = r.metric(metric::LEASE_HELD).await;
        let want = if r.name == holder { 1.0 } else { 0.0 };
        assert_eq!(
            held,
            want,
            "{} of relay {} is {held}",
            metric::LEASE_HELD,
            r.name
        );
    }
    if let Some(r) = relays.iter().find(|r| r.name == holder) {
        let e = r.metric(metric::LEASE_EPOCH).await;
        assert_eq!(e, epoch as f64, "{} of the holder", metric::LEASE_EPOCH);
    }
    (token, epoch)
}

/// Kills the lease holder `holder` among `relays` (SIGKILL) and checks the hand-over: another
/// relay delivers within `ttl + ttl/3 + 400 ms` of the kill (one lease lifetime plus one
/// renewal interval, with slack for a loaded machine), and the killed relay delivers nothing
/// after it (requests already on the wire get 50 ms). Prints the failover time; returns the
/// instant of the kill and the successor's name.
pub async fn kill_holder_and_check_failover(
    relays: &mut [process::RelayProc],
    rx: &receiver::Receiver,
    holder: &str,
    ttl: Duration,
    t0: Instant,
) -> (Instant, String) {
    use receiver::{sender, timeline};
    let hi = relays
        .iter()
        .position(|r| r.name == holder)
        .unwrap_or_else(|| panic!("no relay named {holder:?}"));
    let t_kill = Instant::now();
    relays[hi].kill9();
    let first = &successor_after(
        rx,
        holder,
        t_kill,
        Duration::from_secs(6),
        "no other relay delivered within 6s of the holder's kill -9",
    )
    .await;
    let reqs = rx.requests();
    let failover = first.at - t_kill;
    let bound = ttl + ttl / 3 + Duration::from_millis(400);
    println!(
        "MEASURED crash failover (kill -9 of the holder to the first delivery by {}): {:.1} ms \
         (ttl {ttl:?}, renewal every {:?}, bound {bound:?})",
        sender(first),
        failover.as_secs_f64() * 1000.0,
        ttl / 3,
    );
    assert!(
        failover <= bound,
        "failover took {failover:?}, more than ttl + ttl/3 + 400ms = {bound:?}\n{}",
        timeline(&reqs, t0)
    );
    let late: Vec<_> = reqs
        .iter()
        .filter(|r| sender(r) == holder && r.at > t_kill + Duration::from_millis(50))
        .collect();
    assert!(
        late.is_empty(),
        "the killed relay still delivered: {late:?}"
    );
    (t_kill, sender(first).to_string())
}

/// The first delivery by a relay other than `holder` after `since`; panics with `what` when
/// none comes `within`.
pub async fn successor_after(
    rx: &receiver::Receiver,
    holder: &str,
    since: Instant,
    within: Duration,
    what: &str,
) -> receiver::Received {
    use receiver::sender;
    rx.first_where(|r| r.at > since && sender(r) != holder, within, what)
        .await
}

/// After the kill of `holder` at `t_kill`, a second of deliveries (a fixed window: that only
/// one relay sends in it is the subject) all come from `successor`. Requests of the killed
/// relay already on the wire at the kill (arriving within 50 ms) are not deliveries after it.
pub async fn assert_only_successor(
    rx: &receiver::Receiver,
    holder: &str,
    successor: &str,
    t_kill: Instant,
    t0: Instant,
) {
    use receiver::{sender, senders, timeline};
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after: Vec<receiver::Received> = rx
        .requests()
        .into_iter()
        .filter(|r| r.at > t_kill)
        .filter(|r| !(sender(r) == holder && r.at <= t_kill + Duration::from_millis(50)))
        .collect();
    assert_eq!(
        senders(&after),
        std::collections::BTreeSet::from([successor.to_string()]),
        "after the crash exactly one relay must deliver\n{}",
        timeline(&after, t0)
    );
}

/// After the lease backend went away at `t_down` (Redis down, the quorum lost: `without`
/// says which), `window` of deliveries is watched (a fixed time: the holder's stop in it is
/// the subject). Then: nothing arrived past the holder's deadline (`ttl` + 150 ms), only the
/// old holder `holder` sent, it logged the loss, and no relay holds or is ready.
pub async fn assert_holder_stops(
    rx: &receiver::Receiver,
    relays: &[process::RelayProc],
    holder: &str,
    (t_down, ttl, window): (Instant, Duration, Duration),
    without: &str,
) {
    use process::delta_ms;
    use receiver::{sender, senders, timeline};
    tokio::time::sleep(window).await;
    let reqs = rx.requests();
    let during: Vec<&receiver::Received> = reqs.iter().filter(|r| r.at > t_down).collect();
    let last = during.iter().map(|r| r.at).max();
    println!(
        "MEASURED lease backend lost ({without}): the holder's last request came {} after it \
         went (ttl {ttl:?})",
        last.map(|t| format!("{:.0} ms", delta_ms(t_down, t)))
            .unwrap_or_else(|| "never".into())
    );
    let late: Vec<String> = during
        .iter()
        .filter(|r| r.at > t_down + ttl + Duration::from_millis(150))
        .map(|r| format!("{} at +{:.0}ms", sender(r), delta_ms(t_down, r.at)))
        .collect();
    assert!(
        late.is_empty(),
        "requests after the holder's deadline ({without}, ttl {ttl:?}): {late:?}"
    );
    assert!(
        senders(during.iter().copied()).iter().all(|s| *s == holder),
        "only the old holder may send {without}\n{}",
        timeline(&reqs, t_down)
    );
    let log = relays
        .iter()
        .find(|r| r.name == holder)
        .expect("the holder")
        .log_text();
    assert!(
        log.contains("lease lost"),
        "the holder must log the loss:\n{log}"
    );
    for r in relays {
        assert_eq!(
            r.metric(outbox_relay::metric::LEASE_HELD).await,
            0.0,
            "relay {} reports holding the lease {without}",
            r.name
        );
        let (code, body) = r.readyz().await;
        assert_ne!(code, 200, "relay {} is ready {without}: {body}", r.name);
    }
}

/// While a foreign client holds lease `lease` (`held`: how), the relays started meanwhile
/// are up and kept out: nothing was delivered and none acquired (bumped the epoch).
pub async fn assert_kept_out(
    rx: &receiver::Receiver,
    td: &TestDb,
    lease: &str,
    relays: &[process::RelayProc],
    held: &str,
) {
    assert_eq!(rx.len(), 0, "a relay delivered while {held}");
    assert!(
        td.lease_row(lease)
            .await
            .is_none_or(|(_, epoch)| epoch == 0),
        "no relay may have acquired (bumped the epoch) while {held}"
    );
    for r in relays {
        assert!(
            r.log_text().contains("relay started"),
            "relay {} is not up yet, the test would prove nothing:\n{}",
            r.name,
            r.log_text()
        );
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
