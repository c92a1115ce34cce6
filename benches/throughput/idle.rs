//! What an idle relay costs the database: the release binary with the defaults (the
//! `database` lease included) on an empty table, counted by the server itself over
//! [`IDLE_WINDOW`] once the relay has settled. PostgreSQL: the database's transactions in
//! `pg_stat_database` (each of the relay's statements is one; its NOTIFY listener sends
//! none); MySQL/MariaDB: the server's `Questions`, which counts `BEGIN` and `COMMIT` too.
//! SQLite runs inside the relay, so no server counts it (its statements are MariaDB's).

use super::*;

/// How long the idle relay is counted: one gauge sample (every 15 s) falls in it.
const IDLE_WINDOW: Duration = Duration::from_secs(15);
/// How long it runs before counting starts: start-up, its first claims and the lease. On
/// PostgreSQL a session that goes idle less than a second after its last report holds its
/// counts back for up to 10 s (`PGSTAT_IDLE_INTERVAL`), so the start-up's statements (the
/// schema check, the lease, the first claims) reach `pg_stat_database` up to 10 s late:
/// counted from 3 s, they made an idle relay look like 3.3-3.7 transactions a second where
/// its sessions' statement log showed 1.3-1.6.
fn settle(db: Db) -> Duration {
    match db {
        Db::Postgres => Duration::from_secs(12),
        _ => Duration::from_secs(3),
    }
}

/// Statements per second an idle relay binary sent, as its database server counted them;
/// `None` on SQLite.
pub(crate) async fn idle_run(
    db: Db,
    url: &str,
    receiver: &Receiver,
) -> anyhow::Result<Option<f64>> {
    if db == Db::Sqlite {
        return Ok(None);
    }
    on_own_table(db, url, "idle", async |t| {
        idle_run_on(db, url, t, receiver).await
    })
    .await
}

async fn idle_run_on(
    db: Db,
    url: &str,
    table: &str,
    receiver: &Receiver,
) -> anyhow::Result<Option<f64>> {
    prepare_table(url, table, 0, false, Rows::default()).await?;
    let dir = tempfile::tempdir()?;
    let config = Config::webhook(&receiver.url)
        .poll_interval(Duration::from_millis(500))
        .hook(|s| s.timeout(SINK_TIMEOUT))
        .write(dir.path(), "relay.toml");
    let mut child = spawn_relay(&config, dir.path(), url, table)?;
    let outcome = async {
        tokio::time::sleep(settle(db)).await;
        // One session of our own for both reads: opening one sends statements too (MySQL's
        // session settings), which would be counted.
        let mut counter = Counter::open(db, url).await?;
        let before = counter.read().await?;
        let started = Instant::now();
        tokio::time::sleep(IDLE_WINDOW).await;
        let after = counter.read().await?;
        let took = started.elapsed().as_secs_f64();
        counter.close().await;
        // Less our own first read (the second is not counted in what it reads).
        anyhow::Ok(Some((after - before - 1).max(0) as f64 / took))
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    outcome
}

/// A session reading the server's count of statements.
enum Counter {
    /// Transactions of the URL's database (each of the relay's statements is one). A busy
    /// session reports its counts at least once a second, an idle one within 10 s (see
    /// [`settle`]).
    Postgres(sqlx::PgConnection),
    /// The server's `Questions`.
    MySql(sqlx::MySqlConnection),
}

impl Counter {
    async fn open(db: Db, url: &str) -> anyhow::Result<Counter> {
        Ok(match db {
            Db::Postgres => Counter::Postgres(sqlx::PgConnection::connect(url).await?),
            Db::MySql => Counter::MySql(sqlx::MySqlConnection::connect(url).await?),
            Db::Sqlite => bail!("SQLite has no server to count statements"),
        })
    }

    async fn read(&mut self) -> anyhow::Result<i64> {
        match self {
            Counter::Postgres(conn) => Ok(sqlx::query_scalar(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database \
                 WHERE datname = current_database()",
            )
            .fetch_one(conn)
            .await?),
            Counter::MySql(conn) => {
                let n: String = sqlx::query_scalar(
                    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                     WHERE VARIABLE_NAME = 'QUESTIONS'",
                )
                .fetch_one(conn)
                .await?;
                Ok(n.trim().parse()?)
            }
        }
    }

    async fn close(self) {
        let _ = match self {
            Counter::Postgres(c) => c.close().await,
            Counter::MySql(c) => c.close().await,
        };
    }
}

/// The idle section: the release binary on an empty table, statements per second at the
/// server.
pub(crate) async fn idle_section(plan: &Plan, receiver: &Receiver) -> Vec<(Db, f64)> {
    let mut idles: Vec<(Db, f64)> = Vec::new();
    for &db in &plan.dbs {
        let Ok(dir) = tempfile::tempdir() else {
            continue;
        };
        match idle_run(db, &db.url(dir.path()), receiver).await {
            Ok(Some(per_sec)) => {
                println!(
                    "  {:<8} idle      the relay binary, defaults (database lease), nothing to do: {per_sec:.1} statements/s as the server counts them",
                    db.name()
                );
                idles.push((db, per_sec));
            }
            Ok(None) => {}
            Err(e) => println!("  {:<8} idle      ERROR: {e:#}", db.name()),
        }
    }
    idles
}
