//! Ordering keys: one row of a key at a time, in id order, and the blocked-keys gauge.

use super::*;

/// Enqueues one row of channel `log` per key of `keys` (`None`: keyless), in that order;
/// returns their ids.
async fn enqueue_logs<const N: usize>(td: &TestDb, keys: [Option<&str>; N]) -> [i64; N] {
    let mut ids = [0; N];
    for (id, key) in ids.iter_mut().zip(keys) {
        *id = td.enqueue("log", r#"{"n":1}"#, key).await;
    }
    ids
}

/// Writes `resolution` for row `id` of the claim `req`, and checks that it was written.
async fn complete_one(td: &TestDb, req: &ClaimRequest, id: i64, resolution: Resolution) {
    let done = [completion(req, id, resolution)];
    assert_eq!(complete(&*td.store, &done).await, 1);
}

per_db!(ordering_keys_deliver_one_at_a_time);
async fn ordering_keys_deliver_one_at_a_time(db: Db) {
    let Some(td) = TestDb::open(db, "st_order").await else {
        return;
    };
    let store = td.store.clone();
    let (a, b) = (Some("A"), Some("B"));
    let [a1, k1, b1, a2, k2, b2, a3] = enqueue_logs(&td, [a, None, b, a, None, b, a]).await;

    let (r1, heads) = claim(&*store, 100, LONG, "a", None).await;
    assert_eq!(
        ids(&heads),
        vec![a1, k1, b1, k2],
        "only the heads of each key plus keyless rows"
    );
    assert_eq!(heads[0].ordering_key.as_deref(), Some("A"));
    assert_eq!(heads[1].ordering_key, None);

    // While A1 is claimed (still PENDING), A2 waits; so does B2 behind B1.
    let (_, none) = claim(&*store, 100, LONG, "b", None).await;
    assert!(none.is_empty(), "claimed behind a head: {:?}", ids(&none));

    // A1 released (throttled): still the head, A2 still waits.
    let release = Resolution::Release {
        delay: Duration::ZERO,
        error: None,
    };
    complete_one(&td, &r1, a1, release).await;
    let (r2, again) = claim(&*store, 100, LONG, "b", None).await;
    assert_eq!(
        ids(&again),
        vec![a1],
        "a released head is the next of its key"
    );

    // A1 delivered, B1 to RETRY later, keyless ones delivered.
    let done = [
        completion(&r2, a1, Resolution::Delivered),
        completion(
            &r1,
            b1,
            Resolution::Retry {
                delay: Duration::from_secs(3600),
                error: "later".into(),
            },
        ),
        completion(&r1, k1, Resolution::Delivered),
        completion(&r1, k2, Resolution::Delivered),
    ];
    assert_eq!(complete(&*store, &done).await, 4);
    // A2 is next for A; the RETRY head B1 holds back B2 only. Claimed as an idle poll does,
    // reading first whether anything is claimable: on MariaDB that read (plain, through the
    // index of unfinished rows of every channel) once found nothing here, under load with
    // the rows just changed (docs/design.md, "Claim-mode locks on MySQL").
    let r3 = request(100, LONG, "c", None);
    assert_eq!(
        bounded("probe", store.probe(&r3)).await,
        Probe::Claimable,
        "the idle poll's read missed a2"
    );
    let next = bounded("claim", store.claim(&r3)).await;
    assert_eq!(ids(&next), vec![a2], "the idle poll's read missed a2");
    let bad = Resolution::Failed {
        error: "bad".into(),
    };
    complete_one(&td, &r3, a2, bad).await;
    // A FAILED head no longer holds its key back.
    let (r4, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![a3]);
    deliver(&td, &r4, &next).await;
    // B1 becomes due and is delivered: then B2.
    td.exec(&format!(
        "UPDATE {{t}} SET next_attempt_at = {} WHERE id = {b1}",
        db_time(db, -1)
    ))
    .await;
    let (r5, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![b1]);
    deliver(&td, &r5, &next).await;
    let (_, next) = claim(&*store, 100, LONG, "c", None).await;
    assert_eq!(ids(&next), vec![b2]);
    td.drop_table().await;
}

per_db!(blocked_keys_gauge_counts_keys_waiting_behind_an_unfinished_row);
/// `ordering_blocked_keys`: keys with an unfinished row behind an earlier unfinished row of the
/// same key. (On MySQL/MariaDB it reads the indexed `open_key` column, which holds the key of
/// unfinished rows only: a finished head no longer blocks.)
async fn blocked_keys_gauge_counts_keys_waiting_behind_an_unfinished_row(db: Db) {
    let Some(td) = TestDb::open(db, "st_blocked").await else {
        return;
    };
    let store = td.store.clone();
    let k1 = td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("k")).await;
    td.enqueue("hook", "{}", Some("j")).await;
    let j2 = td.enqueue("hook", "{}", Some("j")).await;
    td.enqueue("hook", "{}", Some("alone")).await;
    td.enqueue("hook", "{}", None).await;
    let blocked = || async {
        store
            .sample(false)
            .await
            .expect("sample")
            .ordering_blocked_keys
    };
    assert_eq!(blocked().await, 2, "k and j wait behind their heads");
    td.exec(&format!(
        "UPDATE {} SET status = 'SUCCESS' WHERE id = {k1}",
        td.table
    ))
    .await;
    td.exec(&format!("DELETE FROM {} WHERE id = {j2}", td.table))
        .await;
    assert_eq!(
        blocked().await,
        1,
        "k's next row still waits behind the one after its head"
    );
    td.drop_table().await;
}

/// Enqueues `n` rows of channel `hook` under `key(i)`; returns their ids.
async fn enqueue_keyed(td: &TestDb, n: usize, key: impl Fn(usize) -> String) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(td.enqueue("hook", "{}", Some(&key(i))).await);
    }
    ids
}

/// Inserts a row of channel `hook` and key `key` with the id `id` (a free id below rows
/// already there): a transaction that committed late, as the claims see it.
async fn appears_late(td: &TestDb, id: i64, key: &str) {
    td.exec(&format!(
        "INSERT INTO {{t}} (id, channel, payload, ordering_key) VALUES ({id}, 'hook', '{{}}', '{key}')"
    ))
    .await;
}

/// Delivers `rows` (claimed by `req`).
async fn deliver(td: &TestDb, req: &ClaimRequest, rows: &[ClaimedRow]) {
    let done: Vec<Completion> = rows
        .iter()
        .map(|r| completion(req, r.delivery.id, Resolution::Delivered))
        .collect();
    assert_eq!(complete(&*td.store, &done).await, rows.len() as u64);
}

per_db!(a_keyed_backlog_is_claimed_in_runs_of_its_freed_keys);
/// Fewer keys than the claim could take, many rows each (docs/design.md, "Claims"): the first
/// claim takes each key's head; once those are delivered their keys are freed, and the next
/// claim reads those keys' first rows and takes runs of them (each key's head and the rows
/// right behind it), a key's rows breadth first so that the budget is shared among the keys.
async fn a_keyed_backlog_is_claimed_in_runs_of_its_freed_keys(db: Db) {
    let Some(td) = TestDb::open(db, "st_runs").await else {
        return;
    };
    let store = td.store.clone();
    let rows = enqueue_keyed(&td, 200, |i| format!("k{}", i % 4)).await;
    let first = hook_request(8, "a");
    let got = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&got), rows[..4].to_vec(), "the four keys' heads");
    deliver(&td, &first, &got).await;
    for round in 0..3 {
        let req = hook_request(8, "a");
        let got = bounded("claim", store.claim(&req)).await;
        let from = 4 + round * 8;
        assert_eq!(
            ids(&got),
            rows[from..from + 8].to_vec(),
            "round {round}: two rows of each key, its head and the row right behind it"
        );
        deliver(&td, &req, &got).await;
    }
    td.drop_table().await;
}

per_db!(a_hot_key_hides_no_row_behind_it);
/// A window full of one key's rows, behind its head: the claim reads on past it, a window at
/// a time, and takes the other keys' heads beyond it; once the hot key's head is delivered its
/// next rows come as a run.
async fn a_hot_key_hides_no_row_behind_it(db: Db) {
    let Some(td) = TestDb::open(db, "st_hot").await else {
        return;
    };
    let store = td.store.clone();
    let hot = enqueue_keyed(&td, 100, |_| "hot".into()).await;
    let others = enqueue_keyed(&td, 8, |i| format!("k{}", i % 4)).await;

    let first = hook_request(8, "a");
    let got = bounded("claim", store.claim(&first)).await;
    let mut heads = vec![hot[0]];
    heads.extend(&others[..4]);
    assert_eq!(ids(&got), heads, "the hot key's head and the others'");
    deliver(&td, &first, &got).await;

    let second = hook_request(8, "a");
    let got = bounded("claim", store.claim(&second)).await;
    let mut next = vec![hot[1], hot[2], hot[3], hot[4]];
    next.extend(&others[4..]);
    next.sort();
    assert_eq!(
        ids(&got),
        next,
        "each key's next row, then the hot key's run with what is left of the budget"
    );
    td.drop_table().await;
}

per_db!(keys_of_any_text_are_claimed_in_order);
/// Keys with quotes, backslashes, control characters, placeholders' marks and non-ASCII text
/// (on MySQL/MariaDB values go out as literals where they can, and are bound where they
/// cannot: docs/design.md, "Statements as text on MySQL/MariaDB"): each key's head first,
/// then, once it is delivered, the rest of its rows, each row with its key as written.
async fn keys_of_any_text_are_claimed_in_order(db: Db) {
    let Some(td) = TestDb::open(db, "st_keytext").await else {
        return;
    };
    let store = td.store.clone();
    let keys = [
        "o'brien",
        "back\\slash",
        "tab\tnew\nline",
        "q?$1 %s",
        "키-é-😀",
        "it''s\\'",
    ];
    let rows = enqueue_keyed(&td, 3 * keys.len(), |i| keys[i % keys.len()].to_string()).await;
    let key_of = |id: i64| keys[rows.iter().position(|&r| r == id).unwrap() % keys.len()];

    let first = hook_request(32, "a");
    let got = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&got), rows[..keys.len()], "each key's head");
    for r in &got {
        assert_eq!(r.ordering_key.as_deref(), Some(key_of(r.delivery.id)));
    }
    deliver(&td, &first, &got).await;

    let second = hook_request(32, "a");
    let got = bounded("claim", store.claim(&second)).await;
    let mut rest = ids(&got);
    rest.sort();
    assert_eq!(
        rest,
        rows[keys.len()..],
        "the rest of each key, behind its delivered head"
    );
    for r in &got {
        assert_eq!(r.ordering_key.as_deref(), Some(key_of(r.delivery.id)));
    }
    td.drop_table().await;
}

per_db!(a_claim_extends_a_key_behind_its_tail_held_by_this_claimer);
/// Chains (docs/design.md, "Ordering keys: chains"): while a key's rows are in flight, a claim
/// that offers the last of them as the key's tail takes the rows right behind it; a claim
/// offering a tail another claimer holds, or one given back, or a row with rows of the key in
/// flight behind it, takes nothing of the key.
async fn a_claim_extends_a_key_behind_its_tail_held_by_this_claimer(db: Db) {
    let Some(td) = TestDb::open(db, "st_chain").await else {
        return;
    };
    let store = td.store.clone();
    let rows = enqueue_keyed(&td, 12, |_| "k".into()).await;
    let tail = |row: i64| Tail {
        key: "k".into(),
        row,
        channel: "hook".into(),
    };
    let with_tails = |n: u32, claimer: &str, row: i64| ClaimRequest {
        tails: vec![tail(row)],
        ..hook_request(n, claimer)
    };
    let first = hook_request(4, "a");
    let got = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&got), rows[..1].to_vec(), "the key's head");

    let other = with_tails(4, "b", rows[0]);
    let got = bounded("claim", store.claim(&other)).await;
    assert!(got.is_empty(), "b holds no row of the key: {:?}", ids(&got));

    let second = with_tails(3, "a", rows[0]);
    let got = bounded("claim", store.claim(&second)).await;
    assert_eq!(
        ids(&got),
        rows[1..4].to_vec(),
        "the rows right behind the tail"
    );

    let early = with_tails(3, "a", rows[0]);
    let got = bounded("claim", store.claim(&early)).await;
    assert!(
        got.is_empty(),
        "rows in flight behind the tail offered: {:?}",
        ids(&got)
    );

    // The second claim's rows are given back: the last of them is no tail held any more.
    let back: Vec<Completion> = (rows[1..4].iter())
        .map(|id| {
            let release = Resolution::Release {
                delay: Duration::ZERO,
                error: None,
            };
            completion(&second, *id, release)
        })
        .collect();
    assert_eq!(complete(&*store, &back).await, 3);
    let stale = with_tails(3, "a", rows[3]);
    let got = bounded("claim", store.claim(&stale)).await;
    assert!(got.is_empty(), "the tail was given back: {:?}", ids(&got));

    let again = with_tails(3, "a", rows[0]);
    let got = bounded("claim", store.claim(&again)).await;
    assert_eq!(ids(&got), rows[1..4].to_vec(), "behind the tail still held");
    td.drop_table().await;
}

per_db!(a_finished_tail_extends_nothing_while_an_earlier_row_of_its_key_is_unfinished);
/// A tail offered whose result was written while an earlier row of its key is still in
/// flight: the row behind the tail follows that earlier row, which is no tail offered, so it
/// waits (MySQL/MariaDB read a key from its tail first, and must then read below it); once
/// that row is delivered too, the row behind the tail is the key's head.
async fn a_finished_tail_extends_nothing_while_an_earlier_row_of_its_key_is_unfinished(db: Db) {
    let Some(td) = TestDb::open(db, "st_donetail").await else {
        return;
    };
    let store = td.store.clone();
    let rows = enqueue_keyed(&td, 4, |_| "k".into()).await;
    let behind = |row: i64, n: u32| ClaimRequest {
        tails: vec![Tail {
            key: "k".into(),
            row,
            channel: "hook".into(),
        }],
        ..hook_request(n, "a")
    };
    let first = hook_request(1, "a");
    let got = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&got), rows[..1].to_vec(), "the key's head");
    let second = behind(rows[0], 1);
    let got = bounded("claim", store.claim(&second)).await;
    assert_eq!(ids(&got), rows[1..2].to_vec(), "the row behind the tail");
    // The second row's result is written first; the head is still in flight.
    complete_one(&td, &second, rows[1], Resolution::Delivered).await;
    let got = bounded("claim", store.claim(&behind(rows[1], 2))).await;
    assert!(
        got.is_empty(),
        "taken behind a finished tail while the key's head is in flight: {:?}",
        ids(&got)
    );
    complete_one(&td, &first, rows[0], Resolution::Delivered).await;
    let got = bounded("claim", store.claim(&behind(rows[1], 2))).await;
    assert_eq!(
        ids(&got),
        rows[2..].to_vec(),
        "the key's head and the row behind it"
    );
    td.drop_table().await;
}

/// PostgreSQL and MySQL/MariaDB: a claim passes over rows another claim is locking (`SKIP
/// LOCKED`). When that is the first row of a run the claim chose, the rows chosen behind it
/// wait too: a row is taken only behind a row the same claim takes (given back at once where
/// the database took it; SQLite has one writer and no row locks).
mod a_run_behind_a_row_another_claim_is_locking_waits {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::a_run_behind_a_row_another_claim_is_locking_waits(crate::support::Db::Postgres).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        super::a_run_behind_a_row_another_claim_is_locking_waits(crate::support::Db::MySql).await
    }
}
async fn a_run_behind_a_row_another_claim_is_locking_waits(db: Db) {
    let Some(td) = TestDb::open(db, "st_lockrun").await else {
        return;
    };
    let store = td.store.clone();
    let rows = enqueue_keyed(&td, 5, |_| "k".into()).await;
    let first = hook_request(8, "a");
    let got = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&got), rows[..1].to_vec(), "the key's head");
    deliver(&td, &first, &got).await;
    let free = td.enqueue("hook", "{}", None).await;
    // Another claimer's transaction, between its locking read and its commit, holds the
    // key's new head.
    let mut other = store.pool().begin().await.expect("begin");
    let lock = format!(
        "SELECT id FROM {} WHERE id = {} FOR UPDATE",
        td.table, rows[1]
    );
    sqlx::query(sqlx::AssertSqlSafe(lock))
        .fetch_all(&mut *other)
        .await
        .expect("lock the head");
    let got = bounded("claim", store.claim(&hook_request(8, "a"))).await;
    assert_eq!(ids(&got), vec![free], "only the row without a key");
    other.rollback().await.expect("rollback");

    let got = bounded("claim", store.claim(&hook_request(8, "a"))).await;
    assert!(!got.is_empty(), "nothing claimed once the head is free");
    assert_eq!(
        ids(&got),
        rows[1..1 + got.len()].to_vec(),
        "the key's rows from its head, once it is free"
    );
    td.drop_table().await;
}

/// MySQL/MariaDB check the keys of a claim after its lock, a range of `open_key_idx` per key,
/// in statements of at most 500 keys: a claim of more keys' heads than that takes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_more_keys_than_one_check_reads_takes_every_head() {
    let Some(td) = TestDb::open(Db::MySql, "st_widekeys").await else {
        return;
    };
    td.insert(
        "hook",
        (0..700).map(|i| (Some(format!("w{i}")), "{}".to_string())),
    )
    .await;
    let req = hook_request(700, "a");
    let got = bounded("claim", td.store.claim(&req)).await;
    assert!(
        got.len() > 500,
        "a claim of {} heads of as many keys",
        got.len()
    );
    let keys: std::collections::HashSet<_> = got.iter().map(|r| &r.ordering_key).collect();
    assert_eq!(keys.len(), got.len(), "one row of each key");
    td.drop_table().await;
}

per_db!(a_row_that_appears_between_rows_read_ahead_is_not_passed);
/// Rows read ahead (docs/design.md, "Ordering keys: rows read ahead"): a claim that extends a
/// key behind its tail may take rows an earlier claim read and did not take. A row of the key
/// that appears between them afterwards (a transaction that committed late, with a lower id)
/// is not passed: each claim takes only rows right behind its tail, and the row that appeared
/// goes out in its place in the key's order.
async fn a_row_that_appears_between_rows_read_ahead_is_not_passed(db: Db) {
    row_appears_between_rows_read_ahead(db, false).await;
}

per_db!(a_row_that_appears_between_rows_a_leader_read_ahead_is_not_passed);
/// The same for a leader's claims, which take the rows read ahead as they were read instead
/// of reading them again by id.
async fn a_row_that_appears_between_rows_a_leader_read_ahead_is_not_passed(db: Db) {
    row_appears_between_rows_read_ahead(db, true).await;
}

async fn row_appears_between_rows_read_ahead(db: Db, alone: bool) {
    let Some(td) = TestDb::open(db, "st_ahead").await else {
        return;
    };
    let hook_request = |n: u32, claimer: &str| ClaimRequest {
        alone,
        ..hook_request(n, claimer)
    };
    let store = td.store.clone();
    // The key's rows with a free id after each (the other key's rows, deleted).
    let both = enqueue_keyed(&td, 40, |i| if i % 2 == 0 { "k" } else { "x" }.into()).await;
    let (rows, gaps): (Vec<i64>, Vec<i64>) = both.chunks(2).map(|p| (p[0], p[1])).unzip();
    let list: Vec<String> = gaps.iter().map(i64::to_string).collect();
    td.exec(&format!(
        "DELETE FROM {} WHERE id IN ({})",
        td.table,
        list.join(", ")
    ))
    .await;
    let tail = |row: i64| ClaimRequest {
        tails: vec![Tail {
            key: "k".into(),
            row,
            channel: "hook".into(),
        }],
        ..hook_request(2, "a")
    };
    let got = bounded("claim", store.claim(&hook_request(1, "a"))).await;
    assert_eq!(ids(&got), rows[..1].to_vec(), "the key's head");
    // Two rows behind the tail: MySQL/MariaDB read the rest of the run ahead.
    let got = bounded("claim", store.claim(&tail(rows[0]))).await;
    assert_eq!(ids(&got), rows[1..3].to_vec(), "the rows behind the tail");
    // A row of the key appears right behind the next one.
    let late = gaps[3];
    appears_late(&td, late, "k").await;
    let mut order = vec![rows[3], late];
    order.extend(&rows[4..]);
    let (mut taken, mut last): (Vec<i64>, i64) = (Vec::new(), rows[2]);
    for _ in 0..4 {
        let got = ids(&bounded("claim", store.claim(&tail(last))).await);
        assert!(!got.is_empty(), "a claim behind {last} took nothing");
        taken.extend(&got);
        last = *got.last().unwrap_or(&last);
    }
    assert_eq!(
        taken,
        order[..taken.len()].to_vec(),
        "the key's rows in id order from behind the tail, {late} in its place"
    );
    assert!(
        taken.len() >= 4,
        "the claims went on past {late}: {taken:?}"
    );
    td.drop_table().await;
}

per_db!(a_row_passed_behind_a_key_in_flight_is_claimed_once_the_key_is_freed);
/// A window takes a row of a key this store has rows in flight of as behind an earlier row,
/// without looking that up (docs/design.md, "Ordering keys: windows past keys in flight"),
/// and its floor passes it. Such a row is not lost: the key's rows in flight free it when they finish, and
/// the next claim reads the key from its first unfinished row. Here the row appears below
/// the row in flight (a transaction that committed late, with a lower id).
async fn a_row_passed_behind_a_key_in_flight_is_claimed_once_the_key_is_freed(db: Db) {
    let Some(td) = TestDb::open(db, "st_busy").await else {
        return;
    };
    let store = td.store.clone();
    store.hold_full_walks(Duration::from_secs(60));
    let gap = td.enqueue("hook", "{}", Some("x")).await;
    let rows = enqueue_keyed(&td, 2, |_| "k".into()).await;
    td.exec(&format!("DELETE FROM {} WHERE id = {gap}", td.table))
        .await;
    let first = hook_request(1, "a");
    let head = bounded("claim", store.claim(&first)).await;
    assert_eq!(ids(&head), rows[..1].to_vec(), "the key's head");
    appears_late(&td, gap, "k").await;
    let got = bounded("claim", store.claim(&hook_request(4, "a"))).await;
    assert!(
        got.is_empty(),
        "{gap} is behind the key's row in flight: {:?}",
        ids(&got)
    );
    deliver(&td, &first, &head).await;
    let got = bounded("claim", store.claim(&hook_request(4, "a"))).await;
    assert_eq!(
        ids(&got),
        vec![gap, rows[1]],
        "the key's rows from its first unfinished row, once it is freed"
    );
    td.drop_table().await;
}
