//! A database that cannot take results for a while: unwritable results stop new claims, a
//! locked SQLite loses nothing, and shutdown on a locked table is bounded.

use super::*;

// ---------------------------------------------------------------------------------------------

/// Makes every result write fail with a transient error (serialization failure, SQLSTATE
/// 40001) while `{t}_block` has a row; claims (which do not change the status) still work.
async fn block_results(td: &TestDb) {
    td.exec("CREATE TABLE {t}_block (x INT)").await;
    td.exec("INSERT INTO {t}_block VALUES (1)").await;
    let blocked = "IF NEW.status <> OLD.status AND EXISTS (SELECT 1 FROM {t}_block) THEN";
    match td.db {
        Db::Postgres => {
            let raise = "RAISE EXCEPTION 'results blocked' USING ERRCODE = '40001'; END IF;";
            before_update(td, "blocks", &format!("{blocked} {raise}")).await;
        }
        Db::MySql => {
            let signal = "SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'results blocked'; END IF;";
            before_update(td, "blocks", &format!("{blocked} {signal}")).await;
        }
        Db::Sqlite => unreachable!("SQLite triggers can only abort"),
    }
}

async fn unwritable_results_stop_new_claims(db: Db) {
    let Some(td) = TestDb::open(db, "bad_backpressure").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    insert_good(&td, 1..=40).await;
    block_results(&td).await;
    let cfg = base(&rx).in_flight(4).claim_ttl(Duration::from_secs(40));
    let mut relay = RelayProc::start(&td, &cfg, "one");
    rx.expect_requests(1, Duration::from_secs(15), "the first batch")
        .await;
    // Two 2 s windows in which no result can be written: what is sent in them is the subject.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sent = rx.len();
    assert!(
        sent <= 4,
        "while no result can be written, no more than max_in_flight (4) rows may be sent: {sent}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rx.len(),
        sent,
        "sends went on while no result could be written"
    );
    assert_eq!(td.counts().await[2], 0, "nothing can be SUCCESS yet");
    td.exec("DELETE FROM {t}_block").await;

    until_finished(&td, Duration::from_secs(30)).await;
    let state = rows(&td).await;
    assert_good_delivered_once(&rx, &state, &[]);
    assert_eq!(rx.len(), 40);
    assert!(relay.running());
    td.exec("DROP TABLE {t}_block").await;
    td.drop_table().await;
}

mod unwritable_results_stop_new_claims {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::unwritable_results_stop_new_claims(Db::Postgres).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        super::unwritable_results_stop_new_claims(Db::MySql).await
    }
}

/// SQLite: the database locked by another writer for a few seconds (results and claims
/// wait, time out as SQLITE_BUSY and are retried); nothing is lost or sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_locked_for_a_while_loses_nothing() {
    let Some(td) = TestDb::open(Db::Sqlite, "bad_locked").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    rx.set_delay(Duration::from_millis(300));
    insert_good(&td, 1..=60).await;
    let _relay = RelayProc::start(&td, &base(&rx).in_flight(8), "one");
    rx.expect_requests(8, Duration::from_secs(15), "the first batch")
        .await;
    {
        let mut conn = td.store.pool().acquire().await.expect("connection");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .expect("lock");
        // The lock is held for 7 s: longer than the relay's waits for it.
        tokio::time::sleep(Duration::from_secs(7)).await;
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("unlock");
    }
    until_finished(&td, Duration::from_secs(40)).await;
    let state = rows(&td).await;
    assert_good_delivered_once(&rx, &state, &[]);
    assert_eq!(rx.len(), 60);
    td.drop_table().await;
}

// ---------------------------------------------------------------------------------------------

/// Holds an exclusive lock on the outbox table from another session until dropped.
async fn lock_table(td: &TestDb) -> sqlx::pool::PoolConnection<sqlx::Any> {
    let mut conn = td.store.pool().acquire().await.expect("connection");
    let statements: Vec<String> = match td.db {
        Db::Postgres => vec![
            "BEGIN".into(),
            format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", td.table),
        ],
        Db::MySql => vec![format!("LOCK TABLES {} WRITE", td.table)],
        Db::Sqlite => vec!["BEGIN EXCLUSIVE".into()],
    };
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await
            .expect("lock");
    }
    conn
}

async fn shutdown_is_bounded_on_a_locked_table(db: Db) {
    let Some(td) = TestDb::open(db, "bad_locked_exit").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let cfg = base(&rx).shutdown_timeout(Duration::from_secs(3));
    let mut relay = RelayProc::start(&td, &cfg, "one");
    insert_good(&td, 1..=3).await;
    rx.expect_requests(3, Duration::from_secs(15), "rows before the lock")
        .await;
    let conn = lock_table(&td).await;
    // Let the relay's next claims run into the lock (a margin: the engines show a statement
    // blocked on a lock each in their own way, SQLite not at all).
    tokio::time::sleep(Duration::from_millis(800)).await;
    let signalled = std::time::Instant::now();
    relay.sigterm();
    let (status, exited) = relay.wait_exit_at(Duration::from_secs(15)).await;
    let took = exited.duration_since(signalled);
    drop(conn);
    assert!(status.success(), "exit status {status:?}");
    assert!(
        took < Duration::from_millis(3_000 + 1_000),
        "exit took {took:?} with shutdown_timeout 3s"
    );
    td.drop_table().await;
}
per_db!(shutdown_is_bounded_on_a_locked_table);
