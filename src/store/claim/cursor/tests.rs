//! The floors', freed keys' and plans' unit tests.

use std::sync::Arc;

use super::*;
use crate::store::claim::fixtures::{request, row};
use crate::store::model::Resolution;

fn delivered(id: i64) -> Completion {
    Completion {
        id,
        token: Arc::from("t"),
        resolution: Resolution::Delivered,
    }
}

/// The keys of the rows in flight go with each plan, once each, sorted, at most
/// [`BUSY_KEYS`]; a key whose rows all finished is not among them.
#[test]
fn a_plan_names_the_keys_in_flight() {
    let c = Cursors::default();
    let keyed = |i: i64| ClaimedRow {
        ordering_key: Some(format!("k{}", i % 3)),
        ..row(i)
    };
    c.claimed(&Choice::default(), &[keyed(1), keyed(2), keyed(4)], true);
    assert_eq!(c.plan(&request()).busy, ["k1", "k2"]);
    c.completed(&[delivered(2)]);
    assert_eq!(c.plan(&request()).busy, ["k1"]);
    let many: Vec<ClaimedRow> = (0..3_000)
        .map(|i| ClaimedRow {
            ordering_key: Some(format!("w{i}")),
            ..row(i + 10)
        })
        .collect();
    c.claimed(&Choice::default(), &many, true);
    assert_eq!(c.plan(&request()).busy.len(), BUSY_KEYS);
}

/// The freed keys the next claim of `c` reads.
fn keys_read(c: &Cursors) -> Vec<KeyRef> {
    let parts = c.plan(&request()).parts;
    parts
        .into_iter()
        .filter_map(|p| match p {
            Part::Key { key, .. } => Some(key),
            _ => None,
        })
        .collect()
}

/// A key taken as its only row, delivered: nothing to read when it is freed. Given back
/// instead: the key is read again, from that very row.
#[test]
fn a_key_known_empty_is_read_again_only_when_its_row_comes_back() {
    let alone = Choice {
        ahead: vec![super::super::choose::Ahead {
            key: "k".into(),
            took: vec![5],
            after: None,
            rows: vec![],
        }],
        ..Choice::default()
    };
    let c = Cursors::reading_ahead(false);
    c.claimed(&alone, &[row(5)], true);
    c.completed(&[delivered(5)]);
    assert!(keys_read(&c).is_empty());
    let c = Cursors::reading_ahead(false);
    c.claimed(&alone, &[row(5)], true);
    let back = Completion {
        resolution: Resolution::Release {
            delay: Duration::ZERO,
            error: None,
        },
        ..delivered(5)
    };
    c.completed(&[back]);
    assert_eq!(keys_read(&c).iter().map(|k| k.row).collect::<Vec<_>>(), [5]);
}

/// A key's run finishes while a claim that read the key (and found its next row still
/// behind the run) is running: the freeing by the run's last row outlives that claim, so
/// the next claim reads the key again rather than leaving it to the next full walk.
#[test]
fn a_key_freed_while_a_claim_ran_stays_freed() {
    let c = Cursors::reading_ahead(false);
    c.claimed(&Choice::default(), &[row(1), row(2)], true);
    c.completed(&[delivered(1)]);
    let read = keys_read(&c);
    assert_eq!(read.len(), 1);
    // Meanwhile the run's last row finishes, then the claim ends: the key's head was
    // still behind row 2, so the claim took nothing of it.
    c.completed(&[delivered(2)]);
    let choice = Choice {
        keys: vec![(read[0].clone(), KeyFate::Done)],
        ..Choice::default()
    };
    c.claimed(&choice, &[], true);
    let again = keys_read(&c);
    assert_eq!(again.len(), 1, "the key is read again: {again:?}");
    assert_eq!(again[0].row, 2);
    // Used up by a claim that read this freeing, it is gone.
    let choice = Choice {
        keys: vec![(again[0].clone(), KeyFate::Done)],
        ..Choice::default()
    };
    c.claimed(&choice, &[], true);
    assert!(keys_read(&c).is_empty());
}

/// A claim chose rows of a freed key and got none of them (the database found the row
/// before them finished or given back meanwhile): the freeing stays, and the next claim
/// reads the key again; a claim that got them uses it up.
#[test]
fn a_freeing_whose_chosen_rows_were_not_got_stays() {
    let c = Cursors::reading_ahead(false);
    c.claimed(&Choice::default(), &[row(1)], true);
    c.completed(&[delivered(1)]);
    let read = keys_read(&c);
    let chose = Choice {
        keys: vec![(read[0].clone(), KeyFate::Taken)],
        ..Choice::default()
    };
    c.claimed(&chose, &[], true);
    assert_eq!(keys_read(&c), read, "got nothing: the key is read again");
    c.claimed(&chose, &[row(2)], true);
    assert!(keys_read(&c).is_empty(), "got its row: the freeing is used");
}

/// After a crowded claim the plan names the freed keys too: among more than [`BUSY_KEYS`]
/// keys, those freed once only up to [`BUSY_KEYS`] (a key per row: they mostly have no row
/// left), those that came back (freed again) up to [`BUSY_KEYS_RETURNING`].
#[test]
fn a_crowded_plan_names_the_freed_keys_that_came_back_beyond_the_others() {
    let c = Cursors::default();
    let keyed = |i: i64, from: i64| ClaimedRow {
        ordering_key: Some(format!("w{i}")),
        ..row(from + i)
    };
    let crowded = Choice {
        crowded: true,
        ..Choice::default()
    };
    let round = |from: i64| {
        let rows: Vec<ClaimedRow> = (0..3_000).map(|i| keyed(i, from)).collect();
        c.claimed(&Choice::default(), &rows, true);
        let done: Vec<Completion> = rows.iter().map(|r| delivered(r.delivery.id)).collect();
        c.completed(&done);
        c.claimed(&crowded, &[], true);
    };
    round(10);
    assert_eq!(c.plan(&request()).busy.len(), BUSY_KEYS, "freed once");
    // Each key's next row, taken by a window (its freeing not used), finishes: freed again.
    round(10_000);
    assert_eq!(c.plan(&request()).busy.len(), 3_000, "came back");
    // Not crowded: the keys in flight only.
    c.claimed(&Choice::default(), &[], true);
    assert!(c.plan(&request()).busy.is_empty());
}
