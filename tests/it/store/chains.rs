//! Ordering keys: chains (a claim that takes a key's rows behind its tail in flight), runs
//! behind rows other claims lock, and rows read ahead of keys in flight.

use super::keys::{appears_late, complete_one, deliver, enqueue_keyed};
use super::*;

/// A claim of `n` rows of channel `hook` by `claimer` that offers row `row` as the tail of
/// key `k`, asking for runs of `run` behind it.
fn behind_tail(n: u32, claimer: &str, row: i64, run: u32) -> ClaimRequest {
    ClaimRequest {
        tails: vec![Tail {
            key: "k".into(),
            row,
            channel: "hook".into(),
            run,
        }],
        ..hook_request(n, claimer)
    }
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
    let with_tails = |n: u32, claimer: &str, row: i64| behind_tail(n, claimer, row, 16);
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

per_db!(a_claim_takes_as_long_a_run_behind_a_tail_as_the_tail_asks);
/// A key's pace (docs/design.md, "Ordering keys: a key's pace"): the relay asks for longer
/// runs behind the tails of keys whose receiver takes their rows quickly. A claim takes at
/// most the run its tail asks for behind it (16 rows, then 64, then 16 again), never less
/// than a run of 16 (a tail asking for fewer), and never more than 64 (`LONGEST_RUN`, a tail
/// asking for more).
async fn a_claim_takes_as_long_a_run_behind_a_tail_as_the_tail_asks(db: Db) {
    let Some(td) = TestDb::open(db, "st_pace").await else {
        return;
    };
    let store = td.store.clone();
    let rows = enqueue_keyed(&td, 200, |_| "k".into()).await;
    let behind = |row: i64, run: u32| behind_tail(100, "a", row, run);
    let got = bounded("claim", store.claim(&hook_request(100, "a"))).await;
    assert_eq!(ids(&got), rows[..1].to_vec(), "the key's head");
    let got = bounded("claim", store.claim(&behind(rows[0], 16))).await;
    assert_eq!(ids(&got), rows[1..17].to_vec(), "a run of 16");
    let got = bounded("claim", store.claim(&behind(rows[16], 64))).await;
    assert_eq!(
        ids(&got),
        rows[17..81].to_vec(),
        "the 64 rows the tail asks for"
    );
    let got = bounded("claim", store.claim(&behind(rows[80], 16))).await;
    assert_eq!(ids(&got), rows[81..97].to_vec(), "a run of 16 again");
    let got = bounded("claim", store.claim(&behind(rows[96], 4))).await;
    assert_eq!(ids(&got), rows[97..113].to_vec(), "never less than a run");
    let got = bounded("claim", store.claim(&behind(rows[112], u32::MAX))).await;
    assert_eq!(ids(&got), rows[113..177].to_vec(), "never more than 64");
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
    let behind = |row: i64, n: u32| behind_tail(n, "a", row, 16);
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
    let tail = |row: i64| behind_tail(2, "a", row, 16);
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
