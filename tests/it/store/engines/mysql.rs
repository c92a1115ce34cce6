//! MySQL/MariaDB: what a claim reads and locks, and which indexes a delivery changes.

use super::*;

/// The server's `Handler_read_next` for the session of `store`'s only connection (MySQL/MariaDB):
/// index entries read in order so far.
async fn handler_read_next(store: &SqlStore) -> i64 {
    let row = sqlx::query("SHOW SESSION STATUS LIKE 'Handler_read_next'")
        .fetch_one(store.pool())
        .await
        .expect("status");
    row.try_get::<String, _>(1)
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .or_else(|| row.try_get::<i64, _>(1).ok())
        .expect("a number")
}

/// No claim walks finished rows (MySQL/MariaDB, which has no partial indexes): with thousands
/// of SUCCESS rows before the due ones, in the claimed channel and under the due rows'
/// ordering key, a claim reads about as many index entries as it returns rows. Counted with
/// the server's own `Handler_read_next` on the store's only connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claims_never_walk_finished_rows() {
    let Some(td) = TestDb::open(Db::MySql, "st_walk").await else {
        return;
    };
    finished_then_due(&td, 5).await;
    // One connection: the statistics read back are the claim's session's.
    let store = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("connect");
    let read_next = || handler_read_next(&store);
    let mut req = request(10, LONG, "a", None);
    req.budgets = Some(Budgets {
        channels: vec![("hook".into(), 10)],
        others: Some((vec!["hook".into()], 5)),
        starts: None,
    });
    let before = read_next().await;
    let rows = bounded("claim", store.claim(&req)).await;
    let read = read_next().await - before;
    assert_eq!(rows.len(), 6, "the five due rows and the head of key k");
    assert!(
        read < 100,
        "the claim read {read} index entries past {FINISHED} finished rows"
    );
    td.drop_table().await;
}

/// MySQL/MariaDB: a claim reads one bounded window of its channel's unfinished rows (and
/// locks only the rows it takes), whether other instances claim (claim mode) or not (leader
/// mode; `ClaimRequest::alone`): the server's `Handler_read_next` on the store's only
/// connection stays within the window and the claimed rows, with 200 rows waiting. (Leader
/// mode's claims once read every row waiting behind a key, every claim.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_claim_reads_one_window_in_either_mode() {
    let Some(td) = TestDb::open(Db::MySql, "st_alone").await else {
        return;
    };
    td.insert_hooks(200).await;
    td.exec("ANALYZE TABLE {t}").await;
    let store = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("connect");
    let read_next = || handler_read_next(&store);
    for alone in [false, true] {
        let mut req = hook_request(10, if alone { "leader" } else { "claimer" });
        req.alone = alone;
        let before = read_next().await;
        let rows = bounded("claim", store.claim(&req)).await;
        let read = read_next().await - before;
        assert_eq!(rows.len(), 10, "alone: {alone}");
        // The window's 64 entries, and the claim's lock and `UPDATE` of its 10 rows, each a
        // range of consecutive ids read in order (docs/design.md, "Id sets as ranges on
        // MySQL/MariaDB"); all 200 waiting rows would be 200 or more.
        assert!(
            read <= 100,
            "alone: {alone}: {read} index entries read for a window of 64 rows and 10 claimed"
        );
    }
    td.drop_table().await;
}

/// Makes a claim by `claimer` slow (MySQL/MariaDB): a trigger sleeps 0.1 s for each row its
/// `UPDATE` marks, so the claim's transaction holds its locks that long per row.
async fn slow_claims_by(td: &TestDb, claimer: &str) {
    let sql = format!(
        "CREATE TRIGGER {t}_slow BEFORE UPDATE ON {t} FOR EACH ROW \
         BEGIN IF NEW.claimed_by = '{claimer}' THEN DO SLEEP(0.1), '{t}'; END IF; END",
        t = td.table
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(td.store.pool())
        .await
        .expect("create trigger");
}

/// Whether a claim is marking its rows (in the trigger's sleep of [`slow_claims_by`], which
/// names the table): its picks are done. (Probing its rows' locks before would race with the picks: a row a probe
/// holds for a moment is skipped by them.)
async fn marking(td: &TestDb) -> bool {
    td.scalar(&format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE INFO LIKE 'DO SLEEP%' AND INFO LIKE '%{}%'",
        td.table
    ))
    .await
        > 0
}

/// Whether another session can lock row `id` now (`FOR UPDATE NOWAIT`).
async fn lockable(td: &TestDb, id: i64) -> bool {
    let mut tx = td.store.pool().begin().await.expect("begin");
    let sql = format!(
        "SELECT id FROM {} WHERE id = {id} FOR UPDATE NOWAIT",
        td.table
    );
    let free = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_optional(&mut *tx)
        .await
        .is_ok();
    tx.rollback().await.expect("rollback");
    free
}

/// MySQL/MariaDB, claim mode: a claim locks only the rows it returns. Its picks walk past
/// retries not yet due, rows under another instance's live claim and a row behind an earlier
/// one of its ordering key; while the claim's transaction is open (slowed by a trigger),
/// another session can lock every one of those, and none of the rows claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claim_mode_locks_only_the_rows_it_returns() {
    let Some(td) = TestDb::open(Db::MySql, "st_locks").await else {
        return;
    };
    td.insert_hooks(20).await;
    td.exec(
        "UPDATE {t} SET status = 'RETRY', attempts = 1, \
         next_attempt_at = NOW(6) + INTERVAL 1 HOUR",
    )
    .await;
    let not_due = td.scalar("SELECT MAX(id) FROM {t}").await;
    td.insert_hooks(20).await;
    td.exec(&format!(
        "UPDATE {{t}} SET claimed_by = 'other', claim_token = 'x', \
         claimed_until = NOW(6) + INTERVAL 1 HOUR WHERE id > {not_due}"
    ))
    .await;
    let walked_past = td.scalar("SELECT MAX(id) FROM {t}").await;
    td.insert(
        "hook",
        (0..2).map(|_| (Some("k".to_string()), "{}".to_string())),
    )
    .await;
    let behind_its_key = td.scalar("SELECT MAX(id) FROM {t}").await;
    td.insert_hooks(9).await;
    slow_claims_by(&td, "slow").await;

    let store = td.store.clone();
    let claim = tokio::spawn(async move { store.claim(&hook_request(20, "slow")).await });
    // The claim is inside its UPDATE for 1 s of trigger sleeps.
    let first = behind_its_key - 1;
    until(
        "the claim to mark its rows",
        Duration::from_secs(5),
        || async { claim.is_finished() || marking(&td).await },
    )
    .await;
    assert!(
        !claim.is_finished(),
        "the claim returned early: {:?}",
        claim.await.map(|r| r.map(|r| ids(&r)))
    );
    let mut locked = Vec::new();
    for id in (1..=walked_past).chain([behind_its_key]) {
        if !lockable(&td, id).await {
            locked.push(id);
        }
    }
    let still_open = !lockable(&td, first).await;
    let rows = bounded("claim", async { Ok(claim.await) })
        .await
        .expect("join")
        .expect("claim");
    assert!(still_open, "the claim committed before the probes ended");
    assert_eq!(
        locked,
        Vec::<i64>::new(),
        "rows the claim walked past stayed locked"
    );
    assert_eq!(
        ids(&rows),
        (behind_its_key - 1..=behind_its_key + 9)
            .filter(|i| *i != behind_its_key)
            .collect::<Vec<_>>()
    );
    td.drop_table().await;
}

/// MySQL/MariaDB, claim mode: claims made while another claim holds the oldest rows (its
/// transaction slowed by a trigger) read past them and take a full budget each, instead of
/// coming back empty: the second one reads past the held rows once, the third past those and
/// the second's (claimed by then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_claims_read_past_rows_another_claim_holds() {
    let Some(td) = TestDb::open(Db::MySql, "st_past").await else {
        return;
    };
    td.insert_hooks(40).await;
    slow_claims_by(&td, "slow").await;
    let first = td.scalar("SELECT MIN(id) FROM {t}").await;
    let store = td.store.clone();
    let slow = tokio::spawn(async move { store.claim(&hook_request(10, "slow")).await });
    until(
        "the slow claim to mark its rows",
        Duration::from_secs(5),
        || async { slow.is_finished() || marking(&td).await },
    )
    .await;
    assert!(
        !slow.is_finished(),
        "the slow claim returned early: {:?}",
        slow.await.map(|r| r.map(|r| ids(&r)))
    );
    let mut newest = hook_request(10, "b");
    newest.newest = true;
    let b = bounded("claim b", td.store.claim(&newest)).await;
    let c = bounded("claim c", td.store.claim(&hook_request(10, "c"))).await;
    let held = !lockable(&td, first).await;
    let slow = bounded("claim", async { Ok(slow.await) })
        .await
        .expect("join")
        .expect("claim");
    assert!(held, "the slow claim committed before the others ended");
    assert_eq!(ids(&slow), (first..first + 10).collect::<Vec<_>>());
    // b's newest share is the channel's newest row; the rest of its budget the oldest after
    // the held rows.
    let mut want_b: Vec<i64> = (first + 10..first + 19).collect();
    want_b.push(first + 39);
    assert_eq!(ids(&b), want_b, "b read past the held rows");
    assert_eq!(
        ids(&c),
        (first + 19..first + 29).collect::<Vec<_>>(),
        "c read past the held rows and b's"
    );
    td.drop_table().await;
}

/// MySQL/MariaDB: the columns of index `{t}_<name>`, comma-separated (empty: no such index).
async fn index_columns(td: &TestDb, name: &str) -> String {
    let cols: Vec<String> = sqlx::query_scalar(
        "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = \
         DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = ? ORDER BY SEQ_IN_INDEX",
    )
    .bind(&td.table)
    .bind(format!("{}_{name}", td.table))
    .fetch_all(td.store.pool())
    .await
    .expect("index columns");
    cols.join(",")
}

/// MySQL/MariaDB: `EXPLAIN` of `sql` (`{t}` is the table): the key it uses and its Extra.
async fn explain_key(td: &TestDb, sql: &str) -> (String, String) {
    let row = td.fetch(&format!("EXPLAIN {sql}")).await.remove(0);
    let text = |i: usize| {
        row.try_get::<Option<String>, _>(i)
            .ok()
            .flatten()
            .or_else(|| {
                row.try_get::<Option<Vec<u8>>, _>(i)
                    .ok()
                    .flatten()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
            })
            .unwrap_or_default()
    };
    // id, select_type, table, type, possible_keys, key, key_len, ref, rows, Extra
    (text(5), text(9))
}

/// MySQL/MariaDB, schema versions 8 and 9: a table migrated by an older build (version 7's
/// indexes) is brought to the slimmer set, in which a delivery changes only `open_idx` and
/// `status_idx`; and the reads the dropped indexes served still come from an index: the
/// oldest unfinished row's age from `open_idx` alone, the FAILED page from `failed_idx`. An
/// idle read's question "is any unfinished row due?" is answered from `open_idx` alone too
/// (version 9), without reading the rows that wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_deliveries_change_two_secondary_indexes() {
    let Some(td) = TestDb::open(Db::MySql, "st_slim").await else {
        return;
    };
    // Version 7's shape.
    td.exec(
        "ALTER TABLE {t} DROP INDEX {t}_failed_idx, DROP INDEX {t}_open_idx, \
         DROP COLUMN failed_flag, ADD INDEX {t}_failed_idx (status, id), \
         ADD INDEX {t}_open_idx (open_channel, id), \
         ADD INDEX {t}_due_idx (status, next_attempt_at), \
         ADD INDEX {t}_age_idx (status, created_at)",
    )
    .await;
    td.exec("UPDATE outbox_relay_schema SET version = 7 WHERE target = '{t}'")
        .await;
    bounded("migrate to version 9", td.store.migrate()).await;
    bounded("migrate again", td.store.migrate()).await;
    assert_eq!(index_columns(&td, "due_idx").await, "");
    assert_eq!(index_columns(&td, "age_idx").await, "");
    assert_eq!(index_columns(&td, "failed_idx").await, "failed_flag,id");
    assert_eq!(
        index_columns(&td, "open_idx").await,
        "open_channel,id,created_at,next_attempt_at"
    );
    assert_eq!(index_columns(&td, "status_idx").await, "status,updated_at");

    // A delivered row leaves failed_flag NULL (no entry of failed_idx changes); a FAILED one
    // sets it.
    let ids = [
        td.enqueue("hook", "{}", None).await,
        td.enqueue("hook", "{}", None).await,
        td.enqueue("hook", "{}", None).await,
    ];
    td.exec(&format!(
        "UPDATE {{t}} SET status = 'SUCCESS' WHERE id = {}",
        ids[0]
    ))
    .await;
    td.exec(&format!(
        "UPDATE {{t}} SET status = 'FAILED', created_at = NOW(6) - INTERVAL 2 HOUR \
         WHERE id = {}",
        ids[1]
    ))
    .await;
    td.exec(&format!(
        "UPDATE {{t}} SET created_at = NOW(6) - INTERVAL 1 HOUR WHERE id = {}",
        ids[2]
    ))
    .await;
    assert_eq!(
        td.scalar("SELECT COUNT(*) FROM {t} WHERE failed_flag = 1")
            .await,
        1
    );
    let (key, extra) = explain_key(
        &td,
        "SELECT MIN(created_at) FROM {t} FORCE INDEX ({t}_open_idx) \
         WHERE open_channel IS NOT NULL",
    )
    .await;
    assert_eq!(key, format!("{}_open_idx", td.table));
    assert!(
        extra.contains("Using index"),
        "reads the table too: {extra}"
    );
    // As `mysql_claim::anything_due` asks it.
    let (key, extra) = explain_key(
        &td,
        "SELECT 1 FROM {t} FORCE INDEX ({t}_open_idx) \
         WHERE open_channel IS NOT NULL AND next_attempt_at <= NOW(6) LIMIT 1",
    )
    .await;
    assert_eq!(key, format!("{}_open_idx", td.table));
    assert!(
        extra.contains("Using index"),
        "the due check reads the table too: {extra}"
    );
    let (key, _) = explain_key(
        &td,
        "SELECT id FROM {t} FORCE INDEX ({t}_failed_idx) WHERE failed_flag = 1 \
         AND status = 'FAILED' AND id < 1000000 ORDER BY id DESC LIMIT 51",
    )
    .await;
    assert_eq!(key, format!("{}_failed_idx", td.table));
    // The store's own reads: the oldest unfinished row is the one an hour old (the FAILED
    // one, older, is finished), and the FAILED page holds the FAILED row.
    let status = bounded("status", td.store.status(&td.table)).await;
    let oldest = status.oldest_pending.expect("an unfinished row").as_secs();
    assert!((3590..3700).contains(&oldest), "oldest {oldest} s");
    let failed = bounded("failed page", td.store.failed(50, None)).await;
    assert_eq!(failed.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[1]]);
    td.drop_table().await;
}

/// A claim whose transaction fails part-way (its `UPDATE` refused by a trigger) returns the
/// error and leaves no transaction open: its connection is closed, not given back to the pool
/// inside the transaction, so the next statement on the pool (a result write, which needs no
/// transaction) is committed at once, and no row the failed claim locked stays locked
/// (docs/design.md, "Statements as text on MySQL/MariaDB").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_failed_claim_leaves_no_transaction_open() {
    let Some(td) = TestDb::open(Db::MySql, "st_txfail").await else {
        return;
    };
    td.insert_hooks(6).await;
    let sql = format!(
        "CREATE TRIGGER {t}_refuse BEFORE UPDATE ON {t} FOR EACH ROW \
         BEGIN IF NEW.claimed_by = 'boom' THEN \
         SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; END IF; END",
        t = td.table
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(td.store.pool())
        .await
        .expect("create trigger");
    // One connection: whatever the failed claim leaves on it, the next statement gets.
    let one = SqlStore::connect(&td.url, &td.table, 1, Duration::from_secs(5))
        .await
        .expect("connect");

    let first = hook_request(2, "a");
    let taken = bounded("claim", one.claim(&first)).await;
    assert_eq!(taken.len(), 2);
    let refused = one.claim(&hook_request(2, "boom")).await;
    assert!(refused.is_err(), "the refused UPDATE fails the claim");

    let done: Vec<Completion> = (taken.iter())
        .map(|r| completion(&first, r.delivery.id, Resolution::Delivered))
        .collect();
    assert_eq!(complete(&one, &done).await, 2);
    let committed = td
        .scalar("SELECT COUNT(*) FROM {t} WHERE status = 'SUCCESS'")
        .await;
    assert_eq!(
        committed, 2,
        "the result write after the failed claim is committed"
    );
    let max = td.scalar("SELECT MAX(id) FROM {t}").await;
    for id in 1..=max {
        assert!(lockable(&td, id).await, "row {id} is still locked");
    }
    let rest = bounded("claim", one.claim(&hook_request(8, "a"))).await;
    assert_eq!(
        rest.len(),
        4,
        "the rows the failed claim chose are claimable"
    );
    td.drop_table().await;
}

/// MySQL/MariaDB: a chosen row that another session locks between the claim's read and its
/// lock (as another claimer would, in the middle of its own claim) is skipped by the lock,
/// and the rows of its key behind it are left out with it (the check of the keys then runs
/// after the lock, built of the rows it kept, and the claim gives back the rest of a run that
/// lost a row; either holds them back: docs/design.md, "Statements as text on
/// MySQL/MariaDB"); once the lock is gone, the key's rows are claimed from it on, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_chosen_row_locked_before_the_claim_holds_back_its_key() {
    let Some(td) = TestDb::open(Db::MySql, "st_lockedkey").await else {
        return;
    };
    let store = td.store.clone();
    let mut k = Vec::new();
    for _ in 0..4 {
        k.push(td.enqueue("hook", "{}", Some("k")).await);
    }
    let j = [
        td.enqueue("hook", "{}", Some("j")).await,
        td.enqueue("hook", "{}", Some("j")).await,
    ];
    let first = hook_request(8, "a");
    let heads = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&heads), vec![k[0], j[0]], "each key's head");
    let done: Vec<Completion> = (heads.iter())
        .map(|r| completion(&first, r.delivery.id, Resolution::Delivered))
        .collect();
    assert_eq!(complete(&*store, &done).await, 2);

    // Another session holds k[1]: the read still sees it free, the lock skips it.
    let mut holder = td.store.pool().begin().await.expect("begin");
    let sql = format!("SELECT id FROM {} WHERE id = {} FOR UPDATE", td.table, k[1]);
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut *holder)
        .await
        .expect("lock k[1]");
    let got = bounded("claim", store.claim(&hook_request(8, "a"))).await;
    assert_eq!(
        ids(&got),
        vec![j[1]],
        "k[2] and k[3] wait behind the held k[1]"
    );
    holder.rollback().await.expect("rollback");

    // The key is found again (by the full walk, at the latest), from k[1] on, in order.
    let mut rest = Vec::new();
    let mut taken = Vec::new();
    for _ in 0..2 {
        let req = hook_request(8, "a");
        let found = wait::holds_within(Duration::from_secs(5), async || {
            taken = bounded("claim", store.claim(&req)).await;
            !taken.is_empty()
        })
        .await;
        assert!(found, "k's rows were not claimed again: {rest:?}");
        rest.extend(ids(&taken));
        let done: Vec<Completion> = (taken.iter())
            .map(|r| completion(&req, r.delivery.id, Resolution::Delivered))
            .collect();
        complete(&*store, &done).await;
        if rest.len() >= 3 {
            break;
        }
    }
    assert_eq!(rest, k[1..].to_vec(), "k's rows, in order");
    td.drop_table().await;
}

/// MySQL/MariaDB: the probe made when the pool opens finds that the server runs several
/// statements sent as one query, so a claim's transaction goes in two round trips (a server or
/// proxy that refuses them gets each statement on its own: docs/design.md, "Statements as
/// text on MySQL/MariaDB"; that path is the one a claim with a key holding a backslash takes,
/// `store::keys::keys_of_any_text_are_claimed_in_order`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_the_server_runs_several_statements_as_one_query() {
    let Some(td) = TestDb::open(Db::MySql, "st_multi").await else {
        return;
    };
    assert!(
        td.store.dialect().multi_statements(),
        "{:?}",
        td.store.dialect()
    );
    td.drop_table().await;
}

/// MySQL/MariaDB: a set of the relay's ids, written as a claim and a result write select it
/// (runs of consecutive ids as ranges, `ids_condition`), selects exactly its rows, and a
/// locking read of it without `SKIP LOCKED` (servers that lack it) waits on no other row:
/// another session holds every row outside the set, the row right after each run among them
/// (a range's scan reads it to find its end), and the read and an `UPDATE` of the set return
/// at once with exactly the set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_set_of_ids_waits_on_no_row_outside_it() {
    let Some(td) = TestDb::open(Db::MySql, "st_idset").await else {
        return;
    };
    td.insert_hooks(40).await;
    let first = td.scalar("SELECT MIN(id) FROM {t}").await;
    let sets: [&[i64]; 4] = [
        &[0, 1, 2, 3, 5, 7, 8, 9, 12, 13, 14, 15, 16, 20, 22, 23],
        &[36, 37, 38, 39, 10, 11, 12, 30, 30, 31, 32],
        &[4, 5, 6],
        &[17, 25],
    ];
    for offsets in sets {
        let mut ids: Vec<i64> = offsets.iter().map(|o| first + o).collect();
        let cond = outbox_relay::store::ids_condition(td.store.dialect(), "id", &ids)
            .expect("integers go inline");
        ids.sort_unstable();
        ids.dedup();
        let t = &td.table;
        // Row by row through the primary key: a scan would keep a lock on every row it
        // walked, the set's own too.
        let mut others = td.store.pool().begin().await.expect("begin");
        for id in (first..first + 40).filter(|id| !ids.contains(id)) {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT id FROM {t} WHERE id = {id} FOR UPDATE"
            )))
            .fetch_one(&mut *others)
            .await
            .expect("lock a row outside the set");
        }
        let mut tx = td.store.pool().begin().await.expect("begin");
        sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
            .execute(&mut *tx)
            .await
            .expect("timeout");
        let read = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {t} WHERE {cond} ORDER BY id FOR UPDATE"
        )))
        .fetch_all(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("{cond}: {e}"));
        let read: Vec<i64> = read.iter().map(|r| r.get::<i64, _>(0)).collect();
        assert_eq!(read, ids, "{cond}");
        let updated = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET claimed_by = 'set' WHERE {cond}"
        )))
        .execute(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("{cond}: {e}"));
        assert_eq!(updated.rows_affected(), ids.len() as u64, "{cond}");
        tx.rollback().await.expect("rollback");
        others.rollback().await.expect("rollback");
    }
}
