//! The full walk, a claim from the start of each channel's index that finds what came due
//! below the floors (docs/design.md, "Floors"): its period stretches to as much as 5 s when
//! walks are slow, and a retry of the store's own still has a walk when it comes due.

use std::time::Instant;

use super::*;

per_db!(a_retry_below_the_floor_is_claimed_when_due_while_walks_are_far_apart);
/// A walk past many rows waiting for later is slow, and the next is up to 5 s away
/// (`SqlStore::hold_full_walks` sets that, as such a walk would). A row this store sends back
/// for a retry a second later is still claimed when it comes due, by a walk planned for it,
/// and not before.
async fn a_retry_below_the_floor_is_claimed_when_due_while_walks_are_far_apart(db: Db) {
    let Some(td) = TestDb::open(db, "st_walks").await else {
        return;
    };
    let store = td.store.clone();
    let rows = td.enqueue_n("hook", "{}", 3).await;
    let budget = |n: u32| hook_request(n, "a");
    // The whole budget came back: the floor is the highest row at once.
    let first = budget(3);
    assert_eq!(ids(&bounded("claim", store.claim(&first)).await), rows);
    let done = [
        completion(&first, rows[0], Resolution::Delivered),
        completion(&first, rows[1], Resolution::Delivered),
    ];
    assert_eq!(complete(&*store, &done).await, 2);
    store.hold_full_walks(Duration::from_secs(5));
    let retry = Resolution::Retry {
        delay: Duration::from_secs(1),
        error: "503".into(),
    };
    assert_eq!(
        complete(&*store, &[completion(&first, rows[2], retry)]).await,
        1
    );
    let sent_back = Instant::now();
    // Due after 1 s, and its walk then; the periodic one is 5 s away.
    let (got, waited) = until_reads(
        Duration::from_millis(2500),
        async || {
            let got = ids(&bounded("claim", store.claim(&budget(2))).await);
            (got, sent_back.elapsed())
        },
        |(got, _)| !got.is_empty(),
        |(_, waited)| format!("the retry, due below the floor, was not claimed within {waited:?}"),
    )
    .await;
    assert_eq!(got, [rows[2]]);
    assert!(
        waited >= Duration::from_secs(1),
        "claimed before it was due"
    );
    td.drop_table().await;
}
