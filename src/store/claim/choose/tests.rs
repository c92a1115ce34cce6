//! The choice's unit tests: the order in which a claim spends each channel's budget, runs,
//! and what the floors learn.

use super::*;

fn row(id: i64, key: Option<&str>, free: bool, head: bool) -> Candidate {
    Candidate {
        id,
        channel: Some("a".into()),
        key: key.map(String::from),
        free,
        head,
        last: false,
    }
}

fn window(from: Option<i64>, rows: u32) -> Part {
    Part::Window {
        channel: "a".into(),
        from,
        rows,
        newest: false,
        sweep: false,
    }
}

fn budget(total: u32, newest: u32) -> Vec<Budget> {
    vec![Budget {
        channel: "a".into(),
        total,
        newest,
        fresh: u32::MAX,
        waited: Vec::new(),
    }]
}

#[test]
fn a_window_takes_claimable_rows_and_settles_past_the_others() {
    let rows = vec![
        row(1, None, true, true),
        row(2, Some("k"), true, false),
        row(3, None, false, true),
        row(4, None, true, true),
    ];
    let c = choose(&[(window(Some(0), 4), rows)], &budget(10, 0), 1);
    assert_eq!(c.ids, [1, 4]);
    assert_eq!(c.seen[0].settled, Some(4));
    assert!(!c.seen[0].reached_end);
    assert_eq!(c.seen[0].took, 2);
}

#[test]
fn a_small_window_taken_whole_is_read_on_past_with_a_window_for_the_room_left() {
    // A first window made small (64) by keys in flight whose rows behind their tails
    // were not there: the next window reads twice the 136 rows of room left, not 64.
    let rows: Vec<Candidate> = (1..=64).map(|id| row(id, None, true, true)).collect();
    let c = choose(&[(window(None, 64), rows)], &budget(200, 0), 1);
    assert_eq!((c.seen[0].took, c.seen[0].room), (64, 136));
    assert!(c.seen[0].wants_more);
    assert_eq!(super::super::read_on(&c), [window(Some(64), 272)]);
    // No room left: no more reads.
    let rows: Vec<Candidate> = (1..=64).map(|id| row(id, None, true, true)).collect();
    let c = choose(&[(window(None, 64), rows)], &budget(64, 0), 1);
    assert_eq!(c.seen[0].room, 0);
    assert!(super::super::read_on(&c).is_empty());
}

#[test]
fn a_window_whose_budget_ran_out_settles_before_the_first_row_left() {
    let rows = vec![
        row(5, None, true, true),
        row(6, Some("k"), true, false),
        row(7, None, true, true),
        row(8, None, true, true),
    ];
    let c = choose(&[(window(Some(4), 8), rows)], &budget(1, 0), 1);
    assert_eq!(c.ids, [5]);
    assert_eq!(c.seen[0].settled, Some(6), "7 is claimable and left");
    assert!(c.seen[0].reached_end);
}

#[test]
fn a_freed_key_takes_a_run_while_rows_are_free() {
    let key = KeyRef {
        key: "k".into(),
        row: 1,
    };
    let rows = vec![
        row(3, Some("k"), true, true),
        row(9, Some("k"), true, false),
        row(12, Some("k"), false, false),
        row(14, Some("k"), true, false),
        row(15, Some("other"), true, true),
    ];
    let c = choose(
        &[(
            Part::Key {
                key: key.clone(),
                after: None,
                rows: 8,
            },
            rows,
        )],
        &budget(10, 0),
        8,
    );
    assert_eq!(c.ids, [3, 9], "stops at the first row that is not free");
    assert_eq!(c.runs, [vec![3, 9]]);
    assert_eq!(c.keys, [(key, KeyFate::Taken)]);
}

fn key_part(k: &str, row: i64, after: Option<i64>) -> Part {
    Part::Key {
        key: KeyRef { key: k.into(), row },
        after,
        rows: 8,
    }
}

/// Key `k`'s rows `ids`, the first its head (or right behind its tail).
fn keyed(k: &str, ids: &[i64]) -> Vec<Candidate> {
    (ids.iter().enumerate())
        .map(|(i, &id)| row(id, Some(k), true, i == 0))
        .collect()
}

#[test]
fn keys_first_rows_up_to_their_share_come_before_a_window_and_the_rest_after_it() {
    // Two keys of four rows each, and a window of four unkeyed rows behind them.
    let unkeyed: Vec<Candidate> = (20..24).map(|id| row(id, None, true, true)).collect();
    let found = [
        (key_part("a", 1, None), keyed("a", &[1, 3, 5, 7])),
        (key_part("b", 2, None), keyed("b", &[2, 4, 6, 8])),
        (window(Some(10), 4), unkeyed),
    ];
    // Budget for eight, a keyed share of one: the oldest key's first row, the whole window,
    // the other key's first row, then the keys' second rows.
    let c = choose(&found, &budget(8, 0), 8);
    assert_eq!(c.ids, [1, 20, 21, 22, 23, 2, 3, 4]);
    assert_eq!(c.runs, [vec![1, 3], vec![2, 4]]);
    assert_eq!(c.seen[0].took, 4);
    // Budget for 32, a keyed share of two: both keys' first rows before the window.
    let c = choose(&found, &budget(32, 0), 8);
    assert_eq!(&c.ids[..6], [1, 2, 20, 21, 22, 23]);
    // Budget for three: the keyed share, then the window's oldest; no run grows, and the
    // other key waits for the next claim.
    let c = choose(&found, &budget(3, 0), 8);
    assert_eq!(c.ids, [1, 20, 21]);
    assert!(c.runs.is_empty());
    let fates: Vec<KeyFate> = c.keys.iter().map(|(_, f)| f.clone()).collect();
    assert_eq!(fates, [KeyFate::Taken, KeyFate::Deferred]);
    // What they read and did not take is ahead of what they took.
    assert_eq!(c.ahead[0].rows, [3, 5, 7]);
}

#[test]
fn a_keyed_backlog_leaves_the_unkeyed_rows_among_it_all_but_its_share() {
    // 40 keys in flight, each with rows behind its tail, and a window of 128 unkeyed rows
    // as old: a budget of 128 goes 8 to keys (the oldest rows first, tails or not) and 120 to
    // the window.
    let mut found: Vec<(Part, Vec<Candidate>)> = (0..40)
        .map(|k| {
            let first = 1000 + 10 * (40 - k);
            let name = format!("k{k}");
            let rows = keyed(&name, &[first, first + 1, first + 2]);
            (key_part(&name, first - 1, Some(first - 1)), rows)
        })
        .collect();
    let unkeyed: Vec<Candidate> = (1..=128).map(|id| row(id, None, true, true)).collect();
    found.push((window(None, 128), unkeyed));
    let c = choose(&found, &budget(128, 0), 8);
    let firsts: Vec<i64> = (0..8).map(|n| 1010 + 10 * n).collect();
    assert_eq!(
        c.ids[..8],
        firsts,
        "the keyed share goes to the oldest rows"
    );
    assert_eq!(c.ids[8..], (1..=120).collect::<Vec<i64>>());
    assert!(c.runs.is_empty());
    let deferred = (c.keys.iter())
        .filter(|(_, f)| *f == KeyFate::Deferred)
        .count();
    assert_eq!(deferred, 32);
    // With no unkeyed rows waiting, every key moves a row, and the rest go to their runs.
    found.pop();
    let c = choose(&found, &budget(64, 0), 8);
    assert_eq!(c.ids.len(), 64);
    assert!(c.keys.iter().all(|(_, f)| *f == KeyFate::Taken));
    assert_eq!(c.runs.len(), 24, "24 keys take a second row");
}

#[test]
fn a_key_whose_head_is_not_claimable_is_done_and_one_without_budget_is_deferred() {
    let k = |key: &str| KeyRef {
        key: key.into(),
        row: 1,
    };
    let found = vec![
        (
            Part::Key {
                key: k("busy"),
                after: None,
                rows: 4,
            },
            vec![row(2, Some("busy"), false, true)],
        ),
        (
            Part::Key {
                key: k("late"),
                after: None,
                rows: 4,
            },
            vec![row(3, Some("late"), true, true)],
        ),
    ];
    let c = choose(&found, &budget(0, 0), 4);
    assert!(c.ids.is_empty());
    assert_eq!(
        c.keys,
        [(k("busy"), KeyFate::Done), (k("late"), KeyFate::Deferred)]
    );
}

#[test]
fn rows_read_and_not_taken_are_ahead_of_the_rows_taken() {
    let key = KeyRef {
        key: "k".into(),
        row: 10,
    };
    // Read behind tail 10: the budget takes two; 13 and 14 are ahead, and so is 15, known
    // from an earlier read and not read now.
    let rows: Vec<Candidate> = (11..=14).map(|i| row(i, Some("k"), true, true)).collect();
    let known = Part::Known {
        key: key.clone(),
        after: 10,
        ids: vec![11, 12, 13, 14],
        more: vec![15],
    };
    let c = choose(&[(known, rows.clone())], &budget(2, 0), 8);
    assert_eq!(c.ids, [11, 12]);
    let ahead = Ahead {
        key: "k".into(),
        took: vec![11, 12],
        after: Some(10),
        rows: vec![13, 14, 15],
    };
    assert_eq!(c.ahead, [ahead]);
    // A row not free ends what is ahead: nothing known behind it counts.
    let mut rows = rows;
    rows[3].free = false;
    let part = Part::Key {
        key,
        after: Some(10),
        rows: 4,
    };
    let c = choose(&[(part, rows)], &budget(2, 0), 8);
    assert_eq!(c.ahead[0].rows, [13]);
}

/// Rows read ahead behind rows a claim asked for by id and did not get back (another claim
/// took one, or it is no longer free): what was known behind them is not right behind the
/// rows taken any more, and is not kept. Kept, the next claim read them by id behind the
/// key's tail, the database refused them (the missing row is unfinished), and the key was
/// read from its tail only a claim later.
#[test]
fn rows_known_behind_a_read_that_came_back_short_are_not_kept() {
    let known = Part::Known {
        key: KeyRef {
            key: "k".into(),
            row: 10,
        },
        after: 10,
        ids: vec![11, 12, 13],
        more: vec![14, 15],
    };
    // 11 and 12 came back, 13 did not: 12 is ahead, 14 and 15 are not.
    let rows: Vec<Candidate> = (11..=12).map(|i| row(i, Some("k"), true, true)).collect();
    let c = choose(&[(known.clone(), rows)], &budget(1, 0), 8);
    assert_eq!(c.ids, [11]);
    assert_eq!(c.ahead[0].rows, [12]);
    // Nothing came back: nothing is ahead.
    let c = choose(&[(known, Vec::new())], &budget(1, 0), 8);
    assert!(c.ids.is_empty());
    assert!(c.ahead.is_empty(), "{:?}", c.ahead);
}

/// A window's head known to be its key's only unfinished row marks its key empty behind
/// it (and only if taken).
#[test]
fn a_taken_head_that_is_its_keys_last_row_marks_the_key_empty_behind_it() {
    let mut rows = vec![
        row(1, Some("k"), true, true),
        row(2, Some("j"), true, true),
        row(3, Some("i"), true, true),
    ];
    rows[0].last = true;
    rows[2].last = true;
    let c = choose(&[(window(None, 3), rows)], &budget(2, 0), 8);
    assert_eq!(c.ids, [1, 2]);
    let empty = Ahead {
        key: "k".into(),
        took: vec![1],
        after: None,
        rows: vec![],
    };
    assert_eq!(c.ahead, [empty], "3 is the last of `i` but not taken");
}

#[test]
fn the_newest_share_is_kept_for_the_newest_window() {
    let oldest: Vec<Candidate> = (1..=10).map(|i| row(i, None, true, true)).collect();
    let newest: Vec<Candidate> = (90..=100).rev().map(|i| row(i, None, true, true)).collect();
    let found = vec![
        (window(None, 20), oldest),
        (
            Part::Window {
                channel: "a".into(),
                from: None,
                rows: 8,
                newest: true,
                sweep: false,
            },
            newest,
        ),
    ];
    let c = choose(&found, &budget(4, 1), 1);
    assert_eq!(c.ids, [1, 2, 3, 100]);
}

#[test]
fn without_unkeyed_rows_in_the_windows_every_keys_first_row_comes_first() {
    // Two keys read, and a window holding only other keys' heads: no unkeyed row waits, so
    // the keys read take their first rows before the window's, whatever the keyed share.
    let found = [
        (key_part("a", 1, None), keyed("a", &[5, 7])),
        (key_part("b", 2, None), keyed("b", &[6, 8])),
        (
            window(Some(0), 4),
            vec![row(1, Some("c"), true, true), row(2, Some("d"), true, true)],
        ),
    ];
    let c = choose(&found, &budget(3, 0), 8);
    assert_eq!(c.ids, [5, 6, 1]);
    assert!(!c.crowded);
    // An unkeyed row among them: the keyed share (one) first, then the window.
    let mut found = found.to_vec();
    found[2].1.push(row(3, None, true, true));
    let c = choose(&found, &budget(3, 0), 8);
    assert_eq!(c.ids, [5, 1, 2]);
    assert!(!c.crowded, "the window took no unkeyed row");
    let c = choose(&found, &budget(4, 0), 8);
    assert_eq!(c.ids, [5, 1, 2, 3]);
    assert!(c.crowded, "it did, and left no room");
}

#[test]
fn unkeyed_rows_another_claimer_holds_keep_the_keys_to_their_share_and_the_window_reading_on() {
    // Another claimer holds the window's unkeyed rows (not free) among rows of keys it has
    // in flight (not heads); 20 keys of this claimer's wait with runs behind their tails.
    let mut found: Vec<(Part, Vec<Candidate>)> = (0..20)
        .map(|k| {
            let first = 1000 + 10 * k;
            let name = format!("k{k}");
            let rows = keyed(&name, &[first, first + 1, first + 2]);
            (key_part(&name, first - 1, Some(first - 1)), rows)
        })
        .collect();
    let held: Vec<Candidate> = (1..=64)
        .map(|id| match id % 2 {
            0 => row(id, None, false, true),
            _ => row(id, Some("other"), false, false),
        })
        .collect();
    found.push((window(None, 64), held));
    // A budget of 48: the keyed share (three) before the window, which takes nothing; the
    // window still reads on into the room the windows left, not the room the keys' rows
    // after it left.
    let c = choose(&found, &budget(48, 0), 8);
    assert_eq!(c.ids[..3], [1000, 1010, 1020]);
    assert_eq!(c.ids.len(), 48, "the keys take the rest after the window");
    assert_eq!((c.seen[0].took, c.seen[0].room), (0, 45));
    assert!(c.seen[0].wants_more);
    assert_eq!(super::super::read_on(&c), [window(Some(64), 90)]);
    // Read on: free unkeyed rows behind them go before the keys' other rows.
    let free: Vec<Candidate> = (65..=154).map(|id| row(id, None, true, true)).collect();
    found.push((window(Some(64), 90), free));
    let c = choose(&found, &budget(48, 0), 8);
    assert_eq!(c.ids[..3], [1000, 1010, 1020]);
    assert_eq!(c.ids[3..], (65..=109).collect::<Vec<i64>>());
    // Without any unkeyed row in the window, the keys take their first rows first, and the
    // window does not read on for them.
    found.pop();
    found[20].1.retain(|r| r.key.is_some());
    let c = choose(&found, &budget(48, 0), 8);
    assert_eq!(
        c.ids[..20],
        (0..20).map(|k| 1000 + 10 * k).collect::<Vec<i64>>()
    );
    assert_eq!(c.seen[0].room, 0);
}

#[test]
fn a_window_takes_no_more_heads_of_new_keys_than_its_bound_and_settles_before_the_first_left() {
    let rows = vec![
        row(1, Some("k1"), true, true),
        row(2, None, true, true),
        row(3, Some("k2"), true, true),
        row(4, Some("k3"), true, true),
        row(5, None, true, true),
        row(6, Some("k1"), true, false),
    ];
    let mut b = budget(10, 0);
    b[0].fresh = 2;
    let c = choose(&[(window(Some(0), 6), rows.clone())], &b, 1);
    assert_eq!(
        c.ids,
        [1, 2, 3, 5],
        "two keys' heads, and every unkeyed row"
    );
    assert_eq!(
        c.seen[0].settled,
        Some(3),
        "k3's head is left for another claimer"
    );
    assert!(
        !c.seen[0].wants_more,
        "read again from there, not read on past it"
    );
    // Without a bound (a leader, or no sink asked), every head.
    let c = choose(&[(window(Some(0), 6), rows)], &budget(10, 0), 1);
    assert_eq!(c.ids, [1, 2, 3, 4, 5]);
    assert_eq!(c.seen[0].settled, Some(6));
}
