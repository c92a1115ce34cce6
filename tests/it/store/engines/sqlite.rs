//! SQLite: one store's claims and results never collide, and the build's memory counters.

use super::*;

/// SQLite has one writer: a store's claims and result writes wait for one another inside the
/// process instead of colliding on the database's write lock (where the loser sleeps in
/// SQLite's busy handler). With every connection's busy timeout at zero a collision would be
/// an error at once; four workers claiming and completing side by side on two connections
/// meet none, and every row ends SUCCESS once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claims_and_results_of_one_store_never_collide() {
    let Some(td) = TestDb::open(Db::Sqlite, "st_writer").await else {
        return;
    };
    const ROWS: i64 = 2000;
    td.insert_hooks(ROWS as usize).await;
    let store = Arc::new(
        SqlStore::connect(&td.url, &td.table, 2, Duration::from_secs(5))
            .await
            .expect("connect"),
    );
    let mut conns = Vec::new();
    for _ in 0..2 {
        let mut c = store.pool().acquire().await.expect("acquire");
        sqlx::query("PRAGMA busy_timeout = 0")
            .execute(&mut *c)
            .await
            .expect("busy_timeout");
        conns.push(c);
    }
    drop(conns);
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let store = store.clone();
        workers.spawn(async move {
            let mut done = 0u64;
            loop {
                let (req, rows) = claim(&*store, 50, LONG, &format!("w{w}"), None).await;
                if rows.is_empty() {
                    return done;
                }
                let results: Vec<Completion> = rows
                    .iter()
                    .map(|r| completion(&req, r.delivery.id, Resolution::Delivered))
                    .collect();
                done += complete(&*store, &results).await;
            }
        });
    }
    let mut written = 0;
    while let Some(w) = workers.join_next().await {
        written += w.expect("worker");
    }
    assert_eq!(written, ROWS as u64, "each row's result written once");
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE status = 'SUCCESS'")
            .await,
        ROWS
    );
    td.drop_table().await;
}

/// The bundled SQLite is built without its memory counters (`.cargo/config.toml`; docs/design.md,
/// "SQLite's memory counters"): SQLite lists the options it was compiled with, and a build
/// that lost the setting (the config file removed, or `LIBSQLITE3_FLAGS` overridden without
/// it) fails here instead of quietly taking a mutex at every allocation again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_is_built_without_its_memory_counters() {
    let Some(td) = TestDb::open(Db::Sqlite, "st_memstat").await else {
        return;
    };
    let options: Vec<String> = sqlx::query_scalar("PRAGMA compile_options")
        .fetch_all(td.store.pool())
        .await
        .expect("compile_options");
    assert!(
        options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
        "SQLite's compile options lack DEFAULT_MEMSTATUS=0: {options:?}"
    );
    td.drop_table().await;
}
