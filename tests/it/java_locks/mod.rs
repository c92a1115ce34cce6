//! The locks shared with Java pollers (issue 12, part 2): `redisson`, `shedlock` and
//! `mysql-get-lock`. In every test a small client speaks the Java side's protocol exactly
//! (Redisson's own Lua scripts and unlock publish on a private `redis-server`; ShedLock's own
//! `usingDbTime()` SQL; a plain `GET_LOCK` session) against a real `outbox-relay run` process,
//! and a loopback receiver records who sent what when:
//!
//! 1. the Java side holds: the relay waits and sends nothing; the Java side lets go: the relay
//!    delivers within one renewal interval (ttl/3);
//!    the Java side dies holding it: the relay takes over when the hold expires (GET_LOCK:
//!    at once), within one renewal interval;
//! 2. the relay holds: the Java side cannot lock (across several renewals); SIGTERM: the
//!    relay releases as the Java library would (Redisson: the unlock message arrives on
//!    `redisson_lock__channel:{name}`), and the Java side locks at once;
//! 3. never both: a Java client trying every 20 ms only gets the lock once the relay's hold is
//!    gone (SIGSTOP past the ttl, then kill -9), and the relay sends nothing after losing it;
//!    for GET_LOCK, killing the relay's MySQL connection frees the lock at once and the relay
//!    stops sending within one check of its session (ttl/10);
//! 4. ([`checks`]) ShedLock's statements on each database, `migrate` creating a missing
//!    ShedLock table only, and validation: `mysql-get-lock` on PostgreSQL/SQLite is refused
//!    naming `lease.backend`; names over 64 characters and bad table names naming their key.

use std::time::{Duration, Instant};

use sqlx::{AnyConnection, Connection, Row};

use crate::support::config::Config;
use crate::support::process::*;
use crate::support::receiver::{Receiver, sender, timeline};
use crate::support::redis::{RedisServer, Resp, Subscription, command};
use crate::support::*;
use clients::JavaLock;

mod checks;
mod clients;

/// The relay's lease ttl in these tests: renewals every second.
const TTL: Duration = Duration::from_secs(3);
const RENEW_TIMEOUT: Duration = Duration::from_millis(500);
/// Which Java lock a test is about.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Redisson,
    ShedLock(Db),
    GetLock,
}

/// One test's world: the database table, the receiver, the Java side, and what the relay's
/// configuration needs (a private Redis for Redisson).
struct World {
    td: TestDb,
    rx: Receiver,
    java: JavaLock,
    redis: Option<RedisServer>,
    kind: Kind,
}

impl World {
    /// Sets up `kind` (`None`: a service is missing, test skipped).
    async fn open(kind: Kind, prefix: &str) -> Option<World> {
        let db = match kind {
            Kind::Redisson => Db::Postgres,
            Kind::ShedLock(db) => db,
            Kind::GetLock => Db::MySql,
        };
        let redis = match kind {
            Kind::Redisson => Some(RedisServer::start(&[]).await?),
            _ => None,
        };
        let td = TestDb::open(db, prefix).await?;
        let rx = Receiver::start(None).await;
        let name = td.table.clone();
        let java = match kind {
            Kind::Redisson => JavaLock::Redisson {
                port: redis.as_ref().map(RedisServer::port).unwrap_or_default(),
                name,
                field: "0b6b7a4e-3c5c-4d2b-9a53-8d7c7f1b2e11:57".to_string(),
            },
            Kind::ShedLock(db) => {
                let table = format!("sl_{}", td.table);
                // The application's own table, created with ShedLock's README schema.
                let time = match db {
                    Db::Postgres => "TIMESTAMP NOT NULL",
                    Db::MySql => "TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)",
                    Db::Sqlite => "TEXT NOT NULL",
                };
                td.exec(&format!(
                    "CREATE TABLE {table} (name VARCHAR(64) NOT NULL, lock_until {time}, \
                     locked_at {time}, locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))"
                ))
                .await;
                let conn = AnyConnection::connect(&td.url)
                    .await
                    .expect("java connection");
                JavaLock::ShedLock {
                    conn,
                    db,
                    table,
                    name,
                    locked_by: "java-host-1".to_string(),
                }
            }
            Kind::GetLock => {
                let conn = AnyConnection::connect(&td.url)
                    .await
                    .expect("java connection");
                JavaLock::GetLock { conn, name }
            }
        };
        Some(World {
            td,
            rx,
            java,
            redis,
            kind,
        })
    }

    /// The relay's configuration for this lock (sink header `x-relay: <name>`).
    fn config(&self, name: &str) -> Config {
        let c = Config::webhook(&self.rx.url())
            .shutdown_timeout(Duration::from_secs(5))
            .hook(|s| s.header("x-relay", name));
        match (&self.kind, &self.java) {
            (Kind::Redisson, _) => c.lease_backend("redisson", TTL, RENEW_TIMEOUT).lease_key(
                "redis_url",
                &self
                    .redis
                    .as_ref()
                    .map(RedisServer::url)
                    .unwrap_or_default(),
            ),
            (_, JavaLock::ShedLock { table, .. }) => c
                .lease_backend("shedlock", TTL, RENEW_TIMEOUT)
                .lease_key("shedlock_table", table),
            _ => c.lease_backend("mysql-get-lock", TTL, RENEW_TIMEOUT),
        }
    }

    /// `outbox-relay status` with this lock's configuration.
    async fn status(&self) -> String {
        let path = self
            .config("status")
            .write(self.td.dir.path(), "status.toml");
        let mut cmd = relay_with_config(&self.td, &path);
        cmd.arg("status");
        let out = run_to_end("outbox-relay status", &mut cmd, Duration::from_secs(30)).await;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "status: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// Asserts that `status` names `holder` as the Java lock's holder.
    async fn assert_status_names(&self, holder: &str) {
        let out = self.status().await;
        let line = match self.kind {
            Kind::Redisson => "HGETALL".to_string(),
            Kind::ShedLock(_) => format!("held by {holder}"),
            Kind::GetLock => "held by connection".to_string(),
        };
        assert!(out.contains(&line), "status should say {line:?}:\n{out}");
    }

    fn start_relay(&self, name: &str) -> RelayProc {
        RelayProc::start(&self.td, &self.config(name), name)
    }

    /// A second Java client of the same lock (another JVM): Redisson with its own client id.
    async fn other_java(&self) -> JavaLock {
        match &self.java {
            JavaLock::Redisson { port, name, .. } => JavaLock::Redisson {
                port: *port,
                name: name.clone(),
                field: "5f0e2d1c-7a6b-4c3d-8e9f-0a1b2c3d4e5f:1".to_string(),
            },
            JavaLock::ShedLock {
                db, table, name, ..
            } => JavaLock::ShedLock {
                conn: AnyConnection::connect(&self.td.url)
                    .await
                    .expect("java connection"),
                db: *db,
                table: table.clone(),
                name: name.clone(),
                locked_by: "java-host-2".to_string(),
            },
            JavaLock::GetLock { name, .. } => JavaLock::GetLock {
                conn: AnyConnection::connect(&self.td.url)
                    .await
                    .expect("java connection"),
                name: name.clone(),
            },
        }
    }

    /// Asserts the relay's hold has the Java library's own shape.
    async fn assert_relay_holds_in_java_format(&self, relay: &str) {
        match &self.java {
            JavaLock::Redisson { port, name, .. } => {
                let r = command(*port, None, &["HGETALL", name])
                    .await
                    .expect("HGETALL");
                let Resp::Array(Some(items)) = r else {
                    panic!("the lock {name} must be a hash, got {r:?}");
                };
                assert_eq!(items.len(), 2, "one field (one holder): {items:?}");
                let field = items[0].text().unwrap_or_default();
                let (uuid, thread) = field.rsplit_once(':').expect("<uuid>:<threadId>");
                assert_eq!(uuid.len(), 36, "a UUID: {field}");
                assert!(thread.parse::<u64>().is_ok(), "a thread id: {field}");
                assert_eq!(items[1].text(), Some("1"), "re-entry count 1");
                let pttl = command(*port, None, &["PTTL", name]).await.expect("PTTL");
                assert!(
                    matches!(pttl, Resp::Int(ms) if ms > 0 && ms <= TTL.as_millis() as i64),
                    "the hold expires within the relay's ttl: {pttl:?}"
                );
            }
            JavaLock::ShedLock { table, name, .. } => {
                let by: String = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT locked_by FROM {table} WHERE name = '{name}'"
                )))
                .fetch_one(self.td.store.pool())
                .await
                .expect("shedlock row")
                .try_get(0)
                .expect("locked_by");
                assert!(by.starts_with(&format!("{relay}#")), "locked_by {by:?}");
            }
            JavaLock::GetLock { name, .. } => {
                let used = self
                    .td
                    .scalar(&format!(
                        "SELECT CAST(COALESCE(IS_USED_LOCK('{name}'), 0) AS SIGNED)"
                    ))
                    .await;
                assert!(
                    used > 0,
                    "GET_LOCK {name} must be held by the relay's session"
                );
            }
        }
    }
}

/// Scenario 1. The Java side holds: the relay waits and sends nothing; it unlocks: the relay
/// delivers within one renewal interval.
async fn java_holds_then_relay_takes_over(kind: Kind) {
    let Some(mut w) = World::open(kind, "jl_first").await else {
        return;
    };
    assert!(w.java.try_lock().await, "the Java side locks first");
    w.td.insert_hooks(5).await;
    let t0 = Instant::now();
    let relay = w.start_relay("r1");
    // Long enough for the relay to start, try many times, and renew nothing.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    assert!(
        w.rx.requests().is_empty(),
        "the relay delivered while the Java side held the lock\n{}",
        timeline(&w.rx.requests(), t0)
    );
    assert_eq!(relay.metric("outbox_relay_lease_held").await, 0.0);
    w.assert_status_names("java-host-1").await;
    // A waiting relay that stops leaves the Java side's hold alone (its unlock below must
    // still find it).
    let mut waiting = w.start_relay("r0");
    waiting.http_addr().await;
    // Let it try to acquire a few times: a failed try shows in neither its log nor its metrics.
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiting.sigterm();
    assert!(waiting.wait_exit(Duration::from_secs(10)).await.success());

    w.java.unlock().await;
    let t_unlock = Instant::now();
    w.rx.expect_requests(1, TTL, "the relay's first delivery after the unlock")
        .await;
    let took = w.rx.requests()[0].at.saturating_duration_since(t_unlock);
    println!("{kind:?}: Java unlock -> first relay delivery in {took:?}");
    assert!(
        took <= TTL / 3,
        "the relay took over {took:?} after the unlock, more than one renewal interval ({:?})",
        TTL / 3
    );
    w.td.wait_all_success(Duration::from_secs(10)).await;
    w.assert_relay_holds_in_java_format("r1").await;
    assert_eq!(relay.metric("outbox_relay_lease_held").await, 1.0);
    w.assert_status_names("r1#").await;
}

/// Scenario 1b. The Java side dies holding the lock (no unlock, nothing published): the
/// relay takes over when the hold expires (Redisson: the key's PTTL; ShedLock: `lock_until`),
/// or at once for GET_LOCK (the server drops the lock with the connection), and within one
/// renewal interval of that moment.
async fn java_crash_then_relay_takes_over_at_expiry(kind: Kind) {
    let Some(mut w) = World::open(kind, "jl_crash").await else {
        return;
    };
    const HOLD: Duration = Duration::from_millis(2500);
    assert!(w.java.try_lock_for(HOLD.as_millis() as u64).await);
    let t_lock = Instant::now();
    w.td.insert_hooks(3).await;
    let _relay = w.start_relay("r1");
    // A second of the Java side's hold, in which nothing may be delivered.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        w.rx.requests().is_empty(),
        "delivered while the Java side held"
    );
    // The Java process dies: its client goes without a word (a GET_LOCK connection closes).
    let other = w.other_java().await;
    drop(std::mem::replace(&mut w.java, other));
    let t_crash = Instant::now();
    w.rx.expect_requests(1, HOLD + TTL, "the relay's take-over")
        .await;
    let first = w.rx.requests()[0].at;
    let free = if kind == Kind::GetLock {
        t_crash
    } else {
        t_lock + HOLD
    };
    println!(
        "{kind:?}: first relay delivery {:?} after the Java hold ended",
        first.saturating_duration_since(free)
    );
    assert!(
        first + Duration::from_millis(100) >= free,
        "the relay delivered {:?} before the Java hold ended",
        free - first
    );
    assert!(
        first <= free + TTL / 3,
        "the relay took over {:?} after the Java hold ended, more than ttl/3",
        first - free
    );
}

/// Scenario 2. The relay holds: the Java side cannot lock; SIGTERM: it can at once (Redisson:
/// told by the unlock message).
async fn relay_holds_then_java_takes_over(kind: Kind) {
    let Some(mut w) = World::open(kind, "jl_back").await else {
        return;
    };
    w.td.insert_hooks(3).await;
    let mut relay = w.start_relay("r1");
    w.rx.expect_requests(3, Duration::from_secs(15), "the relay's deliveries")
        .await;
    w.assert_relay_holds_in_java_format("r1").await;
    // Across several renewals the Java side never gets in.
    throughout(TTL + TTL / 2, Duration::from_millis(100), async || {
        assert!(
            !w.java.try_lock().await,
            "the Java side locked while the relay held"
        );
    })
    .await;
    let mut sub = match &w.java {
        JavaLock::Redisson { port, name, .. } => Some(
            Subscription::open(*port, &format!("redisson_lock__channel:{{{name}}}"))
                .await
                .expect("subscribe"),
        ),
        _ => None,
    };
    relay.sigterm();
    let (status, t_exit) = relay.wait_exit_at(Duration::from_secs(10)).await;
    assert!(status.success(), "graceful exit: {status:?}");
    if let (Some(sub), JavaLock::Redisson { name, .. }) = (sub.as_mut(), &w.java) {
        let msg = sub.next(Duration::from_secs(2)).await;
        assert_eq!(
            msg,
            Some((
                format!("redisson_lock__channel:{{{name}}}"),
                "0".to_string()
            )),
            "the relay's release must publish Redisson's unlock message"
        );
    }
    assert!(
        w.java.try_lock().await,
        "the Java side must lock at once after the relay's exit"
    );
    println!(
        "{kind:?}: Java locked {:?} after the relay's exit",
        t_exit.elapsed()
    );
    w.java.unlock().await;
}

/// Scenario 3. Never both: a Java client trying every 20 ms gets the lock only after the relay
/// lost it, and the relay sends nothing after that.
async fn never_both_hold(kind: Kind) {
    let Some(mut w) = World::open(kind, "jl_both").await else {
        return;
    };
    let t0 = Instant::now();
    let mut relay = w.start_relay("r1");
    let feeder = Feeder::start(w.td.store.clone(), Duration::from_millis(20));
    w.rx.expect_requests(1, Duration::from_secs(15), "the relay's first delivery")
        .await;

    // SIGSTOP the holder past its ttl: the hold expires (Redisson, ShedLock) and the Java side
    // gets it; or it does not (GET_LOCK: the session is alive, so the lock is still held).
    // Half a second of steady delivery (the feeder's rows flowing), so the stop falls mid-work.
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.signal("STOP");
    let t_stop = Instant::now();
    let got = poll_java(&mut w.java, TTL * 2).await;
    let t_cont = Instant::now();
    match (kind, got) {
        (Kind::GetLock, None) => {}
        (Kind::GetLock, Some(t)) => panic!(
            "the Java side got GET_LOCK from a live session after {:?}",
            t - t_stop
        ),
        (_, None) => panic!("the Java side never got the lock after the relay stopped"),
        (_, Some(t)) => {
            let after = t - t_stop;
            println!("{kind:?}: Java locked {after:?} after the relay's SIGSTOP");
            assert!(
                after >= TTL / 3,
                "the Java side locked {after:?} after the stop: before the hold could expire"
            );
        }
    }
    relay.signal("CONT");
    // The relay wakes past its deadline: it must send nothing while the Java side holds.
    tokio::time::sleep(TTL).await;
    if kind != Kind::GetLock {
        // A send whose lease check passed just before the SIGSTOP completes right after the
        // SIGCONT (a paused process cannot be fenced by any lock: the duplicate window of
        // G3); nothing may start after that.
        let wire = t_cont + Duration::from_millis(100);
        let late: Vec<_> =
            w.rx.requests()
                .into_iter()
                .filter(|r| r.at > wire)
                .collect();
        assert!(
            late.is_empty(),
            "the relay sent after losing the lock to the Java side\n{}",
            timeline(&late, t0)
        );
        w.java.unlock().await;
    }
    // The relay holds (again); kill -9: the Java side only gets the lock once the hold is gone.
    let n = w.rx.len();
    w.rx.expect_requests(n + 1, TTL * 2, "the relay delivering again")
        .await;
    w.assert_relay_holds_in_java_format("r1").await;
    relay.kill9();
    let t_kill = Instant::now();
    let got = poll_java(&mut w.java, TTL * 2)
        .await
        .expect("the Java side gets the lock after the kill");
    let after = got - t_kill;
    println!("{kind:?}: Java locked {after:?} after kill -9 of the relay");
    if kind != Kind::GetLock {
        // The last renewal was at most ttl/3 before the kill.
        assert!(
            after >= TTL / 2,
            "locked {after:?} after the kill: the relay's hold was still live"
        );
    }
    let late: Vec<_> =
        w.rx.requests()
            .into_iter()
            .filter(|r| r.at > got && sender(r) == "r1")
            .collect();
    assert!(
        late.is_empty(),
        "deliveries after the Java side locked: {}",
        late.len()
    );
    feeder.stop().await;
}

/// Tries the Java lock every 20 ms for up to `within`; when it got it.
async fn poll_java(java: &mut JavaLock, within: Duration) -> Option<Instant> {
    poll_every(Duration::from_millis(20), within, async || {
        java.try_lock().await.then(Instant::now)
    })
    .await
}

/// GET_LOCK: the relay's MySQL connection is killed: the server frees the lock at once, a Java
/// client takes it, and the relay stops sending within one check of its session (ttl/10, far
/// sooner than a renewal); it takes over
/// again when the Java side lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_lock_connection_killed_stops_the_relay() {
    let Some(w) = World::open(Kind::GetLock, "jl_kill").await else {
        return;
    };
    let t0 = Instant::now();
    let _relay = w.start_relay("r1");
    let feeder = Feeder::start(w.td.store.clone(), Duration::from_millis(20));
    w.rx.expect_requests(1, Duration::from_secs(15), "the relay's first delivery")
        .await;
    let JavaLock::GetLock { name, .. } = &w.java else {
        unreachable!()
    };
    let id =
        w.td.scalar(&format!("SELECT CAST(IS_USED_LOCK('{name}') AS SIGNED)"))
            .await;
    w.td.exec(&format!("KILL {id}")).await;
    let t_kill = Instant::now();
    let mut other = w.other_java().await;
    let got = poll_java(&mut other, Duration::from_secs(2))
        .await
        .expect("the lock is free once its session is killed");
    // A ttl of watching for sends the dead session's relay may not make.
    tokio::time::sleep(TTL).await;
    let late: Vec<_> =
        w.rx.requests()
            .into_iter()
            // The watcher checks the session every ttl/10; a send already started may finish.
            .filter(|r| r.at > t_kill + TTL / 10 + Duration::from_millis(250))
            .collect();
    assert!(
        late.is_empty(),
        "the relay kept sending after its session died\n{}",
        timeline(&late, t0)
    );
    println!("GET_LOCK: Java locked {:?} after KILL", got - t_kill);
    other.unlock().await;
    let n = w.rx.len();
    w.rx.expect_requests(n + 1, TTL, "the relay taking over again")
        .await;
    feeder.stop().await;
}

macro_rules! per_lock {
    ($scenario:ident) => {
        mod $scenario {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redisson() {
                super::$scenario(Kind::Redisson).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shedlock_postgres() {
                super::$scenario(Kind::ShedLock(Db::Postgres)).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shedlock_mysql() {
                super::$scenario(Kind::ShedLock(Db::MySql)).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn get_lock() {
                super::$scenario(Kind::GetLock).await
            }
        }
    };
}

per_lock!(java_holds_then_relay_takes_over);
per_lock!(java_crash_then_relay_takes_over_at_expiry);
per_lock!(relay_holds_then_java_takes_over);
per_lock!(never_both_hold);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedlock_on_sqlite_takes_over_from_java() {
    java_holds_then_relay_takes_over(Kind::ShedLock(Db::Sqlite)).await
}
