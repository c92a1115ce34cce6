//! Windows read ahead (docs/design.md, "Claims: windows read ahead"): in leader mode the claim
//! after a backlog claim takes the rows the last one's window read beyond its budget, without
//! a read of its own, and reads again as soon as the floor moved.

use super::*;

/// A leader's claim of `n` rows of channel `hook`, and the statements it took.
async fn leader_claim(store: &SqlStore, n: u32) -> (ClaimRequest, Vec<i64>, u64) {
    let mut req = hook_request(n, "a");
    req.alone = true;
    let before = store.statements();
    let rows = bounded("claim", store.claim(&req)).await;
    let statements = store.statements() - before;
    (req, ids(&rows), statements)
}

per_db!(a_leaders_next_claim_takes_the_rows_its_window_read_ahead);
async fn a_leaders_next_claim_takes_the_rows_its_window_read_ahead(db: Db) {
    let Some(td) = TestDb::open(db, "st_ahead").await else {
        return;
    };
    let store = td.store.clone();
    let rows = td.enqueue_n("hook", "{}", 200).await;
    // No full walk in these claims (it would read).
    store.hold_full_walks(Duration::from_secs(5));
    // The window reads 80 rows (twice the budget) and the claim takes the first 40.
    let (_, first, read_and_claim) = leader_claim(&store, 40).await;
    assert_eq!(first, rows[..40]);
    let (_, second, without_read) = leader_claim(&store, 40).await;
    assert_eq!(second, rows[40..80], "the rows the first window read next");
    assert_eq!(
        without_read + 1,
        read_and_claim,
        "the second claim sends every statement of the first but its read"
    );
    // Nothing was read beyond those: the third claim reads again.
    let (third_req, third, statements) = leader_claim(&store, 40).await;
    assert_eq!(third, rows[80..120]);
    assert_eq!(statements, read_and_claim);
    // A row given back below the floor moves it: the claim after reads, and takes that row
    // first, though the third claim's window read 40 rows ahead.
    let release = Resolution::Release {
        delay: Duration::ZERO,
        error: None,
    };
    complete(&*store, &[completion(&third_req, rows[90], release)]).await;
    let (_, fourth, statements) = leader_claim(&store, 40).await;
    assert_eq!(statements, read_and_claim, "read again: {fourth:?}");
    assert_eq!(fourth[0], rows[90], "{fourth:?}");
    assert_eq!(fourth[1..], rows[120..159]);
    td.drop_table().await;
}

per_db!(claim_mode_claims_always_read);
/// Another instance may claim in between: no claim takes rows kept from the last one's read.
async fn claim_mode_claims_always_read(db: Db) {
    let Some(td) = TestDb::open(db, "st_ahead_cm").await else {
        return;
    };
    let store = td.store.clone();
    let rows = td.enqueue_n("hook", "{}", 120).await;
    store.hold_full_walks(Duration::from_secs(5));
    let mut counts = Vec::new();
    for i in 0..3 {
        let before = store.statements();
        let got = bounded("claim", store.claim(&hook_request(40, "a"))).await;
        counts.push(store.statements() - before);
        assert_eq!(ids(&got), rows[i * 40..(i + 1) * 40]);
    }
    assert!(counts.windows(2).all(|w| w[0] == w[1]), "{counts:?}");
    td.drop_table().await;
}
