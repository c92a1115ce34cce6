//! The store's connection pool: the warm-up before the relay's loop starts opens its
//! connections side by side and keeps them, and a server that allows fewer connections than
//! asked does not stop the relay from starting (docs/design.md, "Connections").

use std::time::Duration;

use crate::support::*;
use outbox_relay::store::SqlStore;

async fn warm_opens_connections_side_by_side_and_keeps_them(db: Db) {
    let Some(td) = TestDb::open(db, "pool_warm").await else {
        return;
    };
    let store = SqlStore::connect(&td.url, &td.table, 8, Duration::from_secs(5))
        .await
        .expect("connect");
    bounded("warm", store.warm(4)).await;
    assert!(
        store.pool().size() >= 4,
        "{}: warm(4) left {} connections open",
        db.name(),
        store.pool().size()
    );
    // Idle connections stay open (no idle timeout), and every one of them works.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(store.pool().size() >= 4);
    assert_eq!(store.pool().num_idle(), store.pool().size() as usize);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(store.pool().acquire().await.expect("an open connection"));
    }
    for conn in &mut held {
        let one: i64 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut **conn)
            .await
            .expect("select 1");
        assert_eq!(one, 1);
    }
    drop(held);
    // Never more than the pool's maximum.
    let small = SqlStore::connect(&td.url, &td.table, 2, Duration::from_secs(5))
        .await
        .expect("connect");
    bounded("warm", small.warm(4)).await;
    assert!(small.pool().size() <= 2, "{}", small.pool().size());
    td.drop_table().await;
}
per_db!(warm_opens_connections_side_by_side_and_keeps_them);

/// The relay's start (`connect_opening`) opens its connections before anything else runs, so
/// the migration and the first claims use them instead of opening more; a plain `connect`
/// (the admin commands) opens one.
async fn connect_opening_opens_every_connection_up_front(db: Db) {
    let Some(td) = TestDb::open(db, "pool_opening").await else {
        return;
    };
    let t = Duration::from_secs(5);
    let store = bounded(
        "connect_opening",
        SqlStore::connect_opening(&td.url, &td.table, 8, t, 4),
    )
    .await;
    assert_eq!(store.pool().size(), 4, "{}", db.name());
    bounded("migrate", store.migrate()).await;
    assert_eq!(
        store.pool().size(),
        4,
        "{}: the migration opened a connection of its own",
        db.name()
    );
    let plain = bounded("connect", SqlStore::connect(&td.url, &td.table, 8, t)).await;
    assert_eq!(plain.pool().size(), 1, "{}", db.name());
    // A server that cannot be reached fails the start, naming the cause (sqlx's own error
    // is "pool timed out").
    let closed = match db {
        Db::Postgres => Some("postgres://postgres@127.0.0.1:1/test"),
        Db::MySql => Some("mysql://root@127.0.0.1:1/test"),
        Db::Sqlite => None,
    };
    if let Some(url) = closed {
        let Err(e) = SqlStore::connect_opening(url, &td.table, 8, Duration::from_secs(1), 4).await
        else {
            panic!("{}: connected to a closed port", db.name());
        };
        let message = format!("{e:#}");
        assert!(message.contains("refused"), "{}: {message}", db.name());
    }
    td.drop_table().await;
}
per_db!(connect_opening_opens_every_connection_up_front);

/// The store's TCP connections have `TCP_NODELAY` (the vendored sqlx-core's one change; see
/// vendor/README.md): without it each TLS handshake to PostgreSQL waits twice for the
/// server's delayed ACK. Fails if a sqlx update drops the patch without the upstream fix.
async fn database_sockets_have_tcp_nodelay(db: Db) {
    let Some(td) = TestDb::open(db, "pool_nodelay").await else {
        return;
    };
    let parsed = reqwest::Url::parse(&td.url).expect("database URL");
    let port = parsed
        .port()
        .unwrap_or(if db == Db::Postgres { 5432 } else { 3306 });
    let store = bounded(
        "connect_opening",
        SqlStore::connect_opening(&td.url, &td.table, 4, Duration::from_secs(5), 2),
    )
    .await;
    // Hold both, so that they are open while the process's sockets are looked at.
    let held = [
        store.pool().acquire().await.expect("a connection"),
        store.pool().acquire().await.expect("a connection"),
    ];
    let sockets = tcp_sockets_to(port);
    assert!(
        sockets.len() >= 2,
        "{}: {} sockets to port {port}",
        db.name(),
        sockets.len()
    );
    // Every connection to the database in this process is sqlx's (other tests' too). One
    // that another test is opening at this moment can be caught between its connect and the
    // `set_nodelay` right after it (CI saw it once): a socket that lacks the option is looked
    // at again a moment later, and fails only if it still lacks it. Without the patch every
    // one of them lacks it for good.
    let mut lacking: Vec<i32> = sockets
        .iter()
        .filter(|(_, nodelay)| !nodelay)
        .map(|(fd, _)| *fd)
        .collect();
    if !lacking.is_empty() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = tcp_sockets_to(port);
        lacking.retain(|fd| again.iter().any(|(f, nodelay)| f == fd && !nodelay));
    }
    assert!(
        lacking.is_empty(),
        "{}: sockets {lacking:?} to port {port} lack TCP_NODELAY",
        db.name()
    );
    drop(held);
    td.drop_table().await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sockets_have_tcp_nodelay() {
    database_sockets_have_tcp_nodelay(Db::Postgres).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sockets_have_tcp_nodelay() {
    database_sockets_have_tcp_nodelay(Db::MySql).await
}

/// This process's TCP sockets connected to `port` on the loopback, with their `TCP_NODELAY`.
fn tcp_sockets_to(port: u16) -> Vec<(i32, bool)> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let Ok(entry) = entry else { continue };
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: the descriptor is only borrowed: it is handed back with `into_raw_fd`, never
        // closed here. If another thread closes it meanwhile, the calls below fail and the
        // descriptor is skipped.
        let stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
        let seen = match (stream.peer_addr(), stream.nodelay()) {
            (Ok(peer), Ok(nodelay)) if peer.port() == port && peer.ip().is_loopback() => {
                Some(nodelay)
            }
            _ => None,
        };
        let _ = stream.into_raw_fd();
        if let Some(nodelay) = seen {
            out.push((fd, nodelay));
        }
    }
    out
}

/// PostgreSQL: a role allowed two connections. The warm-up asks for four, opens two, and the
/// store works; before the fallback, the relay refused to start on such a server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_goes_on_with_fewer_connections_than_asked() {
    let Some(td) = TestDb::open(Db::Postgres, "pool_limit").await else {
        return;
    };
    let role = unique_table("relay_role");
    td.exec(&format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 2"))
        .await;
    let url = td
        .url
        .replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert_ne!(url, td.url, "the test expects a URL with user postgres");
    let store = SqlStore::connect(&url, &td.table, 8, Duration::from_secs(2))
        .await
        .expect("connect as the limited role");
    bounded("warm", store.warm(4)).await;
    assert_eq!(store.pool().size(), 2);
    let one: i64 = sqlx::query_scalar("SELECT 1")
        .fetch_one(store.pool())
        .await
        .expect("the store works");
    assert_eq!(one, 1);
    store.pool().close().await;
    td.exec(&format!("DROP ROLE {role}")).await;
    td.drop_table().await;
}

/// SQLite: the relay's connections commit with `synchronous = NORMAL` unless the URL asks for
/// `synchronous=full` (or `extra`); the parameter is the relay's, taken out of the URL before
/// sqlx sees it, and a wrong value is refused naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_synchronous_comes_from_the_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = format!("sqlite://{}?mode=rwc", dir.path().join("o.db").display());
    let level = |store: &SqlStore| {
        let pool = store.pool().clone();
        async move {
            let v: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&pool)
                .await
                .expect("pragma");
            v
        }
    };
    let t = Duration::from_secs(5);
    let normal = SqlStore::connect(&base, "outbox", 2, t)
        .await
        .expect("default");
    assert_eq!(level(&normal).await, 1, "NORMAL by default");
    let full = SqlStore::connect(&format!("{base}&synchronous=full"), "outbox", 2, t)
        .await
        .expect("full");
    assert_eq!(level(&full).await, 2, "FULL when asked");
    let first = format!(
        "sqlite://{}?synchronous=EXTRA&mode=rwc",
        dir.path().join("p.db").display()
    );
    let extra = SqlStore::connect(&first, "outbox", 2, t)
        .await
        .expect("extra");
    assert_eq!(level(&extra).await, 3, "EXTRA, the parameter first");
    let Err(err) = SqlStore::connect(&format!("{base}&synchronous=off"), "outbox", 2, t).await
    else {
        panic!("synchronous=off is refused");
    };
    let msg = format!("{err:#}");
    assert!(
        msg.contains("database.url") && msg.contains("synchronous"),
        "{msg}"
    );
}

/// PostgreSQL: settings in the URL's `options` apply to every session of the pool, next to
/// the relay's own (README, "Guarantees": `synchronous_commit` is set this way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_take_settings_from_the_url() {
    let Some(td) = TestDb::open(Db::Postgres, "pool_options").await else {
        return;
    };
    let sep = if td.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-c%20synchronous_commit%3Doff", td.url);
    let store = bounded(
        "connect_opening",
        SqlStore::connect_opening(&url, &td.table, 4, Duration::from_secs(5), 2),
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(store.pool().acquire().await.expect("a connection"));
    }
    for conn in &mut held {
        let row: (String, String) =
            sqlx::query_as("SELECT current_setting('synchronous_commit'), current_setting('jit')")
                .fetch_one(&mut **conn)
                .await
                .expect("current_setting");
        assert_eq!(row, ("off".to_string(), "off".to_string()));
    }
    drop(held);
    // Without it, the server's default.
    let default: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
        .fetch_one(td.store.pool())
        .await
        .expect("current_setting");
    assert_eq!(default, "on");
    td.drop_table().await;
}

/// PostgreSQL: every connection of the store runs with JIT off (the relay's short statements
/// must never be compiled with LLVM, see `store/sql.rs`), whatever the server's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_run_without_jit() {
    let Some(td) = TestDb::open(Db::Postgres, "pool_jit").await else {
        return;
    };
    td.store.warm(4).await.expect("warm");
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(td.store.pool().acquire().await.expect("a connection"));
    }
    for conn in &mut held {
        let jit: String = sqlx::query_scalar("SELECT current_setting('jit')")
            .fetch_one(&mut **conn)
            .await
            .expect("current_setting");
        assert_eq!(jit, "off");
    }
    drop(held);
    td.drop_table().await;
}
