//! The chaos run (issue 13): three real relay processes deliver rows that are inserted while
//! faults strike on a seeded schedule, against services of the run's own on 127.0.0.1 (a
//! private PostgreSQL cluster or MariaDB server, a private `redis-server`, the
//! [`StormReceiver`]). At the end the table and the receiver's record must show no row lost,
//! none stuck, every duplicate caused by a kill or a pause of the instance that had it in
//! flight (at most `max_in_flight` per fault), and each ordering key's rows first sent in id
//! order ([`report`]). One summary table is printed.
//!
//! Scenarios: `relay.mode = "claim"` and leader mode with the `redis` lease on PostgreSQL and
//! on MariaDB, and leader mode on SQLite (a file of the run's own, shared by the three
//! processes; no database restarts). Faults: kill -9 of a random instance about every 10 s
//! and its restart; SIGSTOP of the lease holder (claim mode: a random instance) past its ttl /
//! claim_ttl, then SIGCONT; SIGTERM and restart (a graceful stop, which must cause no
//! duplicate); Redis killed and restarted (leader scenario); the database stopped (cleanly, or
//! crashed: `pg_ctl -m immediate`, SIGKILL of `mariadbd`) and restarted; receiver storms (503s,
//! 429 with Retry-After, connection resets, answers slower than the sink timeout), all
//! transient.
//!
//! Short form (the default, part of `cargo test`): 6,000 rows per scenario over about 45 s of
//! faults. Long form: `OUTBOX_RELAY_CHAOS_ROWS` (rows per scenario),
//! `OUTBOX_RELAY_CHAOS_DURATION` (`600s`, `10m`), `OUTBOX_RELAY_CHAOS_SEED` (repeats a
//! schedule), e.g. `OUTBOX_RELAY_CHAOS_ROWS=100000 OUTBOX_RELAY_CHAOS_DURATION=12m cargo test
//! --test it chaos:: -- --nocapture --test-threads=3`.

mod report;
mod server;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::config::Config;
use crate::support::process::RelayProc;
use crate::support::redis::RedisServer;
use crate::support::storm::{Storm, StormReceiver};
use crate::support::{Db, TestDb, unique_table};
use outbox_relay::store::SqlStore;
use report::{Evidence, Fault, Kind, Row};
use server::Server;
use sqlx::Row as _;

mod scenarios;

/// The instances, by their `x-relay` header (each restart is a new instance id, `a-2`, ...).
const SLOTS: [&str; 3] = ["a", "b", "c"];
/// `batch_size` and `max_in_flight`: the duplicate bound per kill or pause.
const IN_FLIGHT: u32 = 16;
const SINK_TIMEOUT: Duration = Duration::from_secs(1);
/// Calm answers take this long after the receiver accepted (acted on) a request: a kill in
/// between is a duplicate the run must account for.
const CALM_ANSWER: Duration = Duration::from_millis(10);
/// `Slow` storms answer after this (past the sink timeout).
const SLOW_ANSWER: Duration = Duration::from_millis(1500);
/// The shortest claim_ttl the relay accepts with a 1 s sink timeout.
const CLAIM_TTL: Duration = Duration::from_secs(6);
const LEASE_TTL: Duration = Duration::from_secs(2);
const RENEW_TIMEOUT: Duration = Duration::from_millis(400);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// Of every 10 rows, this many carry one of [`KEYS`] ordering keys.
const KEYED_IN_10: u64 = 3;
const KEYS: u64 = 20;

/// Rows, fault time and seed of one run.
#[derive(Debug, Clone, Copy)]
struct Plan {
    rows: u64,
    duration: Duration,
    seed: u64,
}

/// `600` (seconds), or as the relay's settings spell durations (`90s`, `10m`, `1h30m`).
fn parse_duration(s: &str) -> Option<Duration> {
    match s.trim().parse::<u64>() {
        Ok(secs) => Some(Duration::from_secs(secs)),
        Err(_) => outbox_relay::config::duration::parse(s).ok(),
    }
}

impl Plan {
    /// From the environment; the short form by default.
    fn from_env() -> Plan {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let rows = var("OUTBOX_RELAY_CHAOS_ROWS").map_or(6_000, |v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("OUTBOX_RELAY_CHAOS_ROWS={v:?} is not a number"))
        });
        let duration = var("OUTBOX_RELAY_CHAOS_DURATION").map_or(Duration::from_secs(45), |v| {
            parse_duration(&v).unwrap_or_else(|| {
                panic!("OUTBOX_RELAY_CHAOS_DURATION={v:?}: use seconds, 90s, 10m or 1h30m")
            })
        });
        let seed = var("OUTBOX_RELAY_CHAOS_SEED").map_or_else(
            || {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            },
            |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("OUTBOX_RELAY_CHAOS_SEED={v:?} is not a number"))
            },
        );
        Plan {
            rows,
            duration,
            seed,
        }
    }
}

/// SplitMix64: a seeded, dependency-free generator (the schedule must repeat from the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A duration between `lo` and `hi` milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Row `seq`'s ordering key (a fixed function of `seq`, so keys interleave).
fn key_of(seq: u64) -> Option<String> {
    let h = mix(seq);
    (h % 10 < KEYED_IN_10).then(|| format!("k{}", (h >> 8) % KEYS))
}

/// Inserts rows `seqs` in one transaction with plain SQL, as an application does.
async fn insert_txn(
    store: &SqlStore,
    db: Db,
    table: &str,
    seqs: std::ops::Range<u64>,
) -> anyhow::Result<()> {
    let cast = if db == Db::Postgres { "::jsonb" } else { "" };
    let values: Vec<String> = seqs
        .map(|seq| {
            let key = key_of(seq);
            let payload = match &key {
                Some(k) => format!(r#"{{"seq":{seq},"key":"{k}"}}"#),
                None => format!(r#"{{"seq":{seq}}}"#),
            };
            let key = key.map_or("NULL".into(), |k| format!("'{k}'"));
            format!("('hook', '{payload}'{cast}, {key})")
        })
        .collect();
    let sql = format!(
        "INSERT INTO {table} (channel, payload, ordering_key) VALUES {}",
        values.join(", ")
    );
    let mut tx = store.pool().begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// What the inserter did: when each row's COMMIT returned, and rows whose transaction failed
/// (the database was down: committed or not, the table tells).
#[derive(Default)]
struct Inserted {
    commits: HashMap<u64, Instant>,
    uncertain: u64,
}

/// Inserts rows `from..to` at `rate` rows per second in small transactions (a single writer, so
/// each key's rows get ids in `seq` order); gives up at `deadline`.
async fn insert_rows(
    store: Arc<SqlStore>,
    db: Db,
    table: String,
    from: u64,
    to: u64,
    rate: f64,
    deadline: Instant,
) -> Inserted {
    let mut out = Inserted::default();
    let start = Instant::now();
    let mut seq = from;
    while seq < to && Instant::now() < deadline {
        let due = from + ((start.elapsed().as_secs_f64() * rate) as u64).min(to - from);
        if seq >= due {
            // Ahead of the rate: the inserts are paced.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        // 1 to 5 rows; up to 50 while catching up after an outage or on a slow database.
        let behind = due - seq;
        let n = if behind > 50 {
            50
        } else {
            1 + mix(seq ^ 0xABCD) % 5
        }
        .min(to - seq);
        let done = tokio::time::timeout(
            Duration::from_secs(5),
            insert_txn(&store, db, &table, seq..seq + n),
        )
        .await;
        match done {
            Ok(Ok(())) => {
                let at = Instant::now();
                out.commits.extend((seq..seq + n).map(|s| (s, at)));
            }
            _ => {
                out.uncertain += n;
                // The database is down (a fault): back off a little before the next insert.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        seq += n;
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Claim,
    Leader,
}

/// One relay slot: the running process (`None` while it is down) and its restarts.
struct Slot {
    name: &'static str,
    generation: u32,
    proc: Option<RelayProc>,
}

/// Fields drop in order: the relays first (their guards print their logs, which live in the
/// test's directory, if the run failed), then the receiver, the table's directory and the
/// servers.
struct Run {
    slots: Vec<Slot>,
    rx: StormReceiver,
    td: TestDb,
    server: Server,
    redis: Option<RedisServer>,
    mode: Mode,
    plan: Plan,
    rng: Rng,
    faults: Vec<Fault>,
    /// Instances that exited without being told to (a relay must outlive every fault).
    exits: Vec<String>,
    t0: Instant,
}

impl Run {
    fn config(&self, slot: &str) -> Config {
        let c = Config::webhook(&self.rx.url())
            .in_flight(IN_FLIGHT)
            .claim_ttl(CLAIM_TTL)
            .shutdown_timeout(SHUTDOWN_TIMEOUT)
            .retry(Duration::from_millis(100), Duration::from_secs(1), 100_000)
            .hook(|s| {
                s.timeout(SINK_TIMEOUT)
                    .concurrency(IN_FLIGHT)
                    .header("x-relay", slot)
            });
        match (self.mode, &self.redis) {
            (Mode::Leader, Some(r)) => c.redis_lease(&r.url(), LEASE_TTL, RENEW_TIMEOUT),
            _ => c.claim_mode(),
        }
    }

    fn start_slot(&mut self, i: usize) {
        let slot = &self.slots[i];
        let instance = format!("{}-{}", slot.name, slot.generation + 1);
        let proc = RelayProc::start(&self.td, &self.config(slot.name), &instance);
        let slot = &mut self.slots[i];
        slot.generation += 1;
        slot.proc = Some(proc);
    }

    fn proc(&mut self, i: usize) -> &mut RelayProc {
        self.slots[i].proc.as_mut().expect("the slot's relay runs")
    }

    /// The instance to hit: in leader mode the one delivering (the holder), else any.
    fn target(&mut self) -> (usize, bool) {
        if self.mode == Mode::Leader
            && let Some(s) = self
                .rx
                .latest_sender_since(Instant::now() - Duration::from_secs(1))
        {
            return (s as usize, true);
        }
        (self.rng.below(SLOTS.len() as u64) as usize, false)
    }

    fn log(&self, what: &str) {
        println!(
            "[chaos {:?}/{} {:7.2}s] {what}",
            self.mode,
            self.td.db.name(),
            self.t0.elapsed().as_secs_f64()
        );
    }

    /// Notes and restarts any instance that exited by itself, so the run goes on.
    fn check_alive(&mut self) {
        for i in 0..self.slots.len() {
            let Some(p) = self.slots[i].proc.as_mut() else {
                continue;
            };
            if !p.running() {
                let tail: Vec<String> = p
                    .log_text()
                    .lines()
                    .rev()
                    .take(5)
                    .map(String::from)
                    .collect();
                let what = format!(
                    "relay {} exited by itself at {:.1}s; its log ends:\n    {}",
                    p.name,
                    self.t0.elapsed().as_secs_f64(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n    ")
                );
                self.log(&what);
                self.exits.push(what);
                self.start_slot(i);
            }
        }
    }

    async fn inject(&mut self, kind: Kind) {
        let mut at = Instant::now();
        let mut end = None;
        let mut slot = None;
        let mut holder = false;
        match kind {
            Kind::Kill9 => {
                let (i, h) = self.target_any_or_holder();
                (slot, holder) = (Some(i as u8), h);
                self.proc(i).kill9();
                // Once it is gone (kill9 reaps it): what it sent before may still be read.
                at = Instant::now();
                let down = self.rng.ms(300, 1500);
                self.log(&format!(
                    "kill -9 {} (holder: {h}), down {down:?}",
                    SLOTS[i]
                ));
                tokio::time::sleep(down).await;
                self.start_slot(i);
            }
            Kind::Pause => {
                let (i, h) = self.target();
                (slot, holder) = (Some(i as u8), h);
                let ttl = if self.mode == Mode::Leader {
                    LEASE_TTL
                } else {
                    CLAIM_TTL
                };
                let pause = ttl + self.rng.ms(500, 1500);
                self.log(&format!("SIGSTOP {} (holder: {h}) for {pause:?}", SLOTS[i]));
                self.proc(i).signal("STOP");
                at = Instant::now();
                tokio::time::sleep(pause).await;
                // It may run (and write what it had ready) from the moment the signal is sent,
                // before `signal` has returned: the pause ends here.
                end = Some(Instant::now());
                self.proc(i).signal("CONT");
            }
            Kind::Graceful => {
                let i = self.rng.below(SLOTS.len() as u64) as usize;
                slot = Some(i as u8);
                self.log(&format!("SIGTERM {}", SLOTS[i]));
                self.proc(i).sigterm();
                self.proc(i)
                    .wait_exit(SHUTDOWN_TIMEOUT + Duration::from_secs(10))
                    .await;
                self.start_slot(i);
            }
            Kind::RedisRestart => {
                let down = self.rng.ms(300, 1500);
                self.log(&format!("redis-server killed, down {down:?}"));
                let redis = self.redis.as_mut().expect("leader scenario has redis");
                redis.kill();
                tokio::time::sleep(down).await;
                redis.restart().await;
            }
            Kind::DbRestart => {
                let immediate = self.rng.below(2) == 0;
                let down = self.rng.ms(300, 1500);
                self.log(&format!(
                    "database {}, down {down:?}",
                    if immediate { "crashed" } else { "shut down" }
                ));
                self.server.stop(immediate).await;
                tokio::time::sleep(down).await;
                self.server.start_again().await;
            }
            Kind::Storm(s) => {
                let len = self.rng.ms(1000, 3000);
                self.log(&format!("{} for {len:?}", s.name()));
                self.rx.set_storm(s);
                tokio::time::sleep(len).await;
                self.rx.set_storm(Storm::Calm);
            }
        }
        self.faults.push(Fault {
            kind,
            slot,
            holder,
            at,
            end: end.unwrap_or_else(Instant::now),
        });
    }

    /// kill -9 hits a random instance (leader mode: the holder every other time, so failovers
    /// are measured and standbys are killed too).
    fn target_any_or_holder(&mut self) -> (usize, bool) {
        if self.mode == Mode::Leader && self.rng.below(2) == 0 {
            return self.target();
        }
        let i = self.rng.below(SLOTS.len() as u64) as usize;
        let holder = self.mode == Mode::Leader
            && self
                .rx
                .latest_sender_since(Instant::now() - Duration::from_secs(1))
                == Some(i as u8);
        (i, holder)
    }

    /// Faults until the plan's duration has passed and every kind has struck at least once:
    /// kill -9 about every 10 s, the other kinds from a shuffled deck in between.
    async fn faults(&mut self) {
        let end = self.t0 + self.plan.duration;
        let hard_end = end + Duration::from_secs(90);
        let mut kinds = vec![
            Kind::Pause,
            Kind::Graceful,
            Kind::Storm(Storm::ServerErrors),
            Kind::Storm(Storm::TooMany),
            Kind::Storm(Storm::Resets),
            Kind::Storm(Storm::Slow),
        ];
        // SQLite is a file, not a server to stop (the others' deck keeps its order, so a
        // seed repeats its schedule).
        if self.td.db != Db::Sqlite {
            kinds.insert(2, Kind::DbRestart);
        }
        if self.mode == Mode::Leader {
            kinds.push(Kind::RedisRestart);
        }
        let mut deck: Vec<Kind> = Vec::new();
        let mut first_deck_done = false;
        let mut next_kill = Instant::now() + self.rng.ms(4000, 8000);
        // Let the instances start and get going first: a random stretch of the run's schedule
        // (drawn from its seed, like the gaps between faults below), not a wait for a state.
        tokio::time::sleep(self.rng.ms(1000, 3000)).await;
        loop {
            let now = Instant::now();
            if now >= hard_end || (now >= end && first_deck_done) {
                break;
            }
            let kind = if now >= next_kill {
                next_kill = now + self.rng.ms(8000, 12000);
                Kind::Kill9
            } else {
                if deck.is_empty() {
                    deck = kinds.clone();
                    for i in (1..deck.len()).rev() {
                        let j = self.rng.below(i as u64 + 1) as usize;
                        deck.swap(i, j);
                    }
                }
                let k = deck.pop().expect("a card");
                first_deck_done |= deck.is_empty();
                k
            };
            self.check_alive();
            self.inject(kind).await;
            // The schedule's gap before the next fault.
            tokio::time::sleep(self.rng.ms(500, 2000)).await;
        }
    }

    /// (PENDING + RETRY, all) rows.
    async fn open_rows(&self) -> Option<(i64, i64)> {
        let sql = format!(
            "SELECT COUNT(CASE WHEN status IN ('PENDING', 'RETRY') THEN 1 END), COUNT(*) FROM {}",
            self.td.table
        );
        let query = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(self.td.store.pool());
        let row = tokio::time::timeout(Duration::from_secs(30), query)
            .await
            .ok()?
            .ok()?;
        Some((row.try_get(0).ok()?, row.try_get(1).ok()?))
    }

    /// The first unfinished rows, one line each, for the failure message.
    async fn open_sample(&self) -> String {
        let now = match self.td.db {
            Db::Postgres => "now()",
            _ => "NOW(6)",
        };
        let sql = format!(
            "SELECT CONCAT(id, ' ', status, ' attempts ', attempts, ' key ', \
             COALESCE(ordering_key, '-'), ' by ', COALESCE(claimed_by, '-'), ' until ', \
             COALESCE(CAST(claimed_until AS CHAR(40)), '-'), ' now ', CAST({now} AS CHAR(40)), \
             ' next ', CAST(next_attempt_at AS CHAR(40)), ' error ', COALESCE(last_error, '-')) \
             FROM {} WHERE status IN ('PENDING', 'RETRY') ORDER BY id LIMIT 20",
            self.td.table
        );
        let query = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(self.td.store.pool());
        match tokio::time::timeout(Duration::from_secs(30), query).await {
            Ok(Ok(rows)) => rows
                .iter()
                .map(|r| format!("  {}\n", r.try_get::<String, _>(0).unwrap_or_default()))
                .collect(),
            Ok(Err(e)) => format!("  (could not read them: {e})"),
            Err(_) => "  (reading them timed out)".into(),
        }
    }

    /// Every row, in id order (bounded by [`crate::support::bounded`]).
    async fn table_rows(&self) -> Vec<Row> {
        let seq = match self.td.db {
            Db::Postgres => "(payload->>'seq')::bigint",
            Db::MySql => "CAST(JSON_VALUE(payload, '$.seq') AS SIGNED)",
            Db::Sqlite => "CAST(json_extract(payload, '$.seq') AS INTEGER)",
        };
        let sql = format!(
            "SELECT id, {seq}, ordering_key, status FROM {} ORDER BY id",
            self.td.table
        );
        let query = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(self.td.store.pool());
        crate::support::bounded("read the table", async { Ok(query.await?) })
            .await
            .iter()
            .map(|r| Row {
                id: r.try_get(0).expect("id"),
                seq: r.try_get::<i64, _>(1).expect("seq") as u64,
                key: r.try_get(2).expect("key"),
                status: r.try_get(3).expect("status"),
            })
            .collect()
    }
}
