//! The unit tests of which keys a claim reads: rows read ahead, keys known empty, freed keys
//! and crowded claims.

use super::*;
use crate::store::claim::choose::{self, KeyFate};
use crate::store::claim::fixtures::{self, row};
use crate::store::claim::plan::budgets;
use crate::store::model::Tail;

fn request(tail: i64) -> ClaimRequest {
    ClaimRequest {
        tails: vec![Tail {
            key: "k".into(),
            row: tail,
            channel: "hook".into(),
            run: 16,
        }],
        ..fixtures::request()
    }
}

/// The key part a claim offered the tail `tail` of key `k` reads.
fn part(ahead: &ReadAhead, tail: i64) -> Part {
    let parts = key_parts(
        &request(tail),
        &BTreeMap::new(),
        ahead,
        Instant::now(),
        false,
    );
    assert_eq!(parts.len(), 1, "{parts:?}");
    parts[0].clone()
}

/// A claim that read key `k` behind tail 10, took 11 and 12, and read 13 and 14 ahead.
fn took_two_of_four() -> Choice {
    Choice {
        keys: vec![(
            KeyRef {
                key: "k".into(),
                row: 10,
            },
            KeyFate::Taken,
        )],
        ahead: vec![choose::Ahead {
            key: "k".into(),
            took: vec![11, 12],
            after: Some(10),
            rows: vec![13, 14],
        }],
        ..Choice::default()
    }
}

/// A leader's claim takes the rows read ahead as they were read (with the channels they
/// had), while they are fresh, behind the same tail, and every row's channel is known;
/// otherwise it reads them by id.
#[test]
fn rows_read_ahead_are_taken_as_read_while_fresh() {
    let cand = |id: i64| Candidate {
        id,
        channel: Some(format!("ch{id}")),
        key: Some("k".into()),
        free: true,
        head: id == 11,
        last: false,
    };
    let read = Part::Key {
        key: KeyRef {
            key: "k".into(),
            row: 10,
        },
        after: Some(10),
        rows: RUN,
    };
    let mut ahead = ReadAhead::on();
    ahead.saw(&[(read, (11..=14).map(cand).collect())]);
    ahead.learn(&took_two_of_four(), &[row(11), row(12)]);
    let parts = [part(&ahead, 12)];
    let as_read = ahead.as_read(&parts, Instant::now()).expect("fresh rows");
    let expected = |id: i64| Candidate {
        head: true,
        ..cand(id)
    };
    assert_eq!(as_read, vec![(0, vec![expected(13), expected(14)])]);
    let later = Instant::now() + AS_READ_FOR;
    assert_eq!(ahead.as_read(&parts, later), None, "too old: read by id");
    // Behind another tail (the key's chain moved on): read from it.
    let moved = Part::Known {
        key: KeyRef {
            key: "k".into(),
            row: 14,
        },
        after: 14,
        ids: vec![15],
        more: vec![],
    };
    assert_eq!(ahead.as_read(&[moved], Instant::now()), None);
    // A row whose channel this store did not see: read by id.
    let mut ahead = ReadAhead::on();
    ahead.saw(&[(parts[0].clone(), vec![cand(13)])]);
    ahead.learn(&took_two_of_four(), &[row(11), row(12)]);
    assert_eq!(ahead.as_read(&parts, Instant::now()), None);
    // Nothing read ahead among the parts: nothing to take.
    assert_eq!(ReadAhead::on().as_read(&[], Instant::now()), None);
}

/// The rows read ahead of a key are read by id by the next claim, while the key's tail is
/// the last row the claim got; a claim that did not get them all, or a tail that moved
/// elsewhere, reads the key from its tail again, a whole run.
#[test]
fn rows_read_ahead_are_read_by_id_behind_the_same_tail() {
    let mut ahead = ReadAhead::on();
    ahead.learn(&took_two_of_four(), &[row(11), row(12)]);
    let known = Part::Known {
        key: KeyRef {
            key: "k".into(),
            row: 12,
        },
        after: 12,
        ids: vec![13, 14],
        more: vec![],
    };
    assert_eq!(part(&ahead, 12), known);
    let whole_run = |p: Part| matches!(p, Part::Key { rows: RUN, .. });
    assert!(whole_run(part(&ahead, 11)), "another tail: read from it");
    // The claim got 11 but not 12: 13 may not be right behind the tail.
    let mut ahead = ReadAhead::on();
    ahead.learn(&took_two_of_four(), &[row(11)]);
    assert!(whole_run(part(&ahead, 11)));
    // A later claim that read the key and found nothing ahead forgets what was.
    let mut ahead = ReadAhead::on();
    ahead.learn(&took_two_of_four(), &[row(11), row(12)]);
    let done = Choice {
        keys: vec![(
            KeyRef {
                key: "k".into(),
                row: 12,
            },
            KeyFate::Done,
        )],
        ..Choice::default()
    };
    ahead.learn(&done, &[]);
    assert!(whole_run(part(&ahead, 12)));
    // Not reading ahead: nothing learnt, nothing read by id.
    let mut off = ReadAhead::default();
    off.learn(&took_two_of_four(), &[row(11), row(12)]);
    assert!(matches!(part(&off, 12), Part::Key { .. }));
}

/// A claim that read key `k` behind tail 10 and found no row at all.
fn empty_behind_ten() -> Choice {
    let key = KeyRef {
        key: "k".into(),
        row: 10,
    };
    let read = vec![(
        Part::Key {
            key,
            after: Some(10),
            rows: RUN,
        },
        vec![],
    )];
    choose::choose(&read, &budgets(&fixtures::request()), RUN)
}

/// A key read as empty behind its tail is not read again behind that tail, nor from its
/// first row once that tail frees it, for [`EMPTY_FOR`]; then, or once a window reads a
/// row of it, or behind another tail, it is.
#[test]
fn a_key_read_as_empty_behind_its_tail_is_not_read_again_for_a_while() {
    let mut ahead = ReadAhead::on();
    ahead.learn(&empty_behind_ten(), &[]);
    let now = Instant::now();
    let parts = |ahead: &ReadAhead, tail: i64, now: Instant| {
        key_parts(&request(tail), &BTreeMap::new(), ahead, now, false).len()
    };
    let freed_by = |ahead: &ReadAhead, row: i64| {
        let freed = BTreeMap::from([("k".to_string(), row)]);
        key_parts(&fixtures::request(), &freed, ahead, now, false).len()
    };
    assert_eq!(parts(&ahead, 10, now), 0, "in flight: not read");
    assert_eq!(parts(&ahead, 12, now), 1, "another tail: read");
    assert_eq!(
        freed_by(&ReadAhead::on(), 10),
        1,
        "freed, nothing known: read"
    );
    assert_eq!(freed_by(&ahead, 10), 0, "freed by 10: not read");
    assert_eq!(freed_by(&ahead, 12), 1, "freed by another row: read");
    assert_eq!(parts(&ahead, 10, now + EMPTY_FOR), 1, "read again later");
    // A window read a row of `k` (a row passed behind the tail, or one that came since).
    let seen = Candidate {
        id: 20,
        channel: Some("hook".into()),
        key: Some("k".into()),
        free: true,
        head: false,
        last: false,
    };
    let window = Part::Window {
        channel: "hook".into(),
        from: None,
        rows: 10,
        newest: false,
        sweep: false,
    };
    ahead.saw(&[(window, vec![seen])]);
    assert_eq!(parts(&ahead, 10, now), 1, "a window saw a row: read");
    // Not reading ahead: every key is read.
    let mut off = ReadAhead::default();
    off.learn(&empty_behind_ten(), &[]);
    assert_eq!(parts(&off, 10, now), 1);
    // A window took 10 as its key's only unfinished row: once the claim got it, the key
    // is empty behind its new tail.
    let alone = Choice {
        ahead: vec![choose::Ahead {
            key: "k".into(),
            took: vec![10],
            after: None,
            rows: vec![],
        }],
        ..Choice::default()
    };
    let mut ahead = ReadAhead::on();
    ahead.learn(&alone, &[]);
    assert_eq!(parts(&ahead, 10, Instant::now()), 1, "not got: read");
    ahead.learn(&alone, &[row(10)]);
    assert_eq!(parts(&ahead, 10, Instant::now()), 0, "got: not read");
}

/// More keys known empty than [`AHEAD_REMEMBERED`] (a key per row: every row a window
/// takes is its key's only one) are kept while fresh, though no claim offers their tails
/// (their rows are freeing them), so that the claim after skips them as freed; pruned once
/// older than [`EMPTY_FOR`].
#[test]
fn keys_known_empty_outlive_the_pruning_while_fresh() {
    let n = AHEAD_REMEMBERED as i64 * 3;
    let alone = |keys: std::ops::Range<i64>| {
        let choice = Choice {
            ahead: keys
                .clone()
                .map(|i| choose::Ahead {
                    key: format!("k{i}"),
                    took: vec![i],
                    after: None,
                    rows: vec![],
                })
                .collect(),
            ..Choice::default()
        };
        (choice, keys.map(row).collect::<Vec<ClaimedRow>>())
    };
    let mut ahead = ReadAhead::on();
    let (choice, claimed) = alone(0..n);
    ahead.learn(&choice, &claimed);
    let now = Instant::now();
    // Every key's row finished: freed by it, no tail offered.
    let freed: BTreeMap<String, i64> = (0..n).map(|i| (format!("k{i}"), i)).collect();
    let req = fixtures::request();
    ahead.forget_beyond(&req, now);
    assert_eq!(ahead.keys.len(), n as usize, "fresh: kept");
    assert_eq!(
        key_parts(&req, &freed, &ahead, now, false),
        vec![],
        "all known empty"
    );
    // Past twice what was kept, the stale ones go.
    let (choice, claimed) = alone(n..n * 5);
    ahead.learn(&choice, &claimed);
    ahead.forget_beyond(&req, now + EMPTY_FOR * 2);
    assert!(ahead.keys.is_empty(), "stale: pruned");
    assert_eq!(
        key_parts(&req, &freed, &ahead, now, false).len(),
        KEYS_PER_CLAIM
    );
}

/// Freed keys are read oldest first (by the row that freed them), not in their text's
/// order, after the tails, up to [`KEYS_PER_CLAIM`] parts in all; a key read behind its
/// tail is not read again as freed.
#[test]
fn freed_keys_are_read_oldest_first_after_the_tails() {
    // 300 freed keys whose text order is the reverse of their age: "k000" freed last.
    let freed: BTreeMap<String, i64> = (0..300).map(|i| (format!("k{i:03}"), 10_000 - i)).collect();
    let mut req = request(5);
    req.tails[0].key = "k299".into();
    let parts = key_parts(&req, &freed, &ReadAhead::default(), Instant::now(), false);
    assert_eq!(parts.len(), KEYS_PER_CLAIM);
    let read: Vec<(&str, Option<i64>)> = parts
        .iter()
        .map(|p| match p {
            Part::Key { key, after, .. } => (key.key.as_str(), *after),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(read[0], ("k299", Some(5)), "the tail first");
    // Then the oldest: k298 (freed by row 9,702), k297, ...; k299 not twice.
    let expected: Vec<String> = (172..299).rev().map(|i| format!("k{i:03}")).collect();
    let freed_read: Vec<&str> = read[1..].iter().map(|(k, _)| *k).collect();
    assert_eq!(freed_read, expected);
    assert!(read[1..].iter().all(|(_, after)| after.is_none()));
}

/// After a crowded claim, the next reads no more keys than the keyed share of its budget,
/// those that moved longest ago first, whether tails (by their last row claimed) or freed (by
/// the row that freed them); otherwise every tail and freed key, up to [`KEYS_PER_CLAIM`].
#[test]
fn a_crowded_claim_reads_the_keys_that_moved_longest_ago_within_the_keyed_share() {
    let mut req = fixtures::request();
    // A budget of 160: a keyed share of 10.
    req.budgets = Some(crate::store::model::Budgets {
        channels: vec![("hook".into(), 160)],
        others: None,
        starts: None,
    });
    // Tails claimed up to rows 100, 200, ... 2,000, offered newest first; keys freed by rows
    // 150, 250, ... 2,050.
    req.tails = (1..=20)
        .rev()
        .map(|i| Tail {
            key: format!("t{i:02}"),
            row: 100 * i,
            channel: "hook".into(),
            run: 16,
        })
        .collect();
    let freed: BTreeMap<String, i64> = (1..=20)
        .map(|i| (format!("f{i:02}"), 100 * i + 50))
        .collect();
    let read = |crowded: bool| -> Vec<String> {
        key_parts(&req, &freed, &ReadAhead::default(), Instant::now(), crowded)
            .iter()
            .map(|p| match p {
                Part::Key { key, .. } => key.key.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let want: Vec<String> = (1..=5)
        .map(|i| format!("t{i:02}"))
        .chain((1..=5).map(|i| format!("f{i:02}")))
        .collect();
    assert_eq!(read(true), want);
    assert_eq!(read(false).len(), 40);
}

/// A freed key whose next rows a claim read ahead behind the very row that freed it (the
/// key's last row taken, since finished) is read from those rows by id, a run of them, and a
/// leader's claim takes them as read; freed by another row (a later one finished, or the
/// rows ahead were read behind an earlier tail), it is read from its first row. Fewer rows
/// ahead than a run are read by id only by a crowded claim (which takes a key's first row and
/// seldom more); another reads a whole run from the key's first row.
#[test]
fn a_freed_key_is_read_from_the_rows_read_ahead_behind_the_row_that_freed_it() {
    let cand = |id: i64| Candidate {
        id,
        channel: Some("hook".into()),
        key: Some("k".into()),
        free: true,
        head: true,
        last: false,
    };
    // A claim read key `k` from behind tail 10 and took 11 and 12; rows 13 to 40 were read
    // ahead of it.
    let mut ahead = ReadAhead::on().freeing_from_ahead(true);
    let read = Part::Key {
        key: KeyRef {
            key: "k".into(),
            row: 10,
        },
        after: Some(10),
        rows: 32,
    };
    ahead.saw(&[(read, (11..=40).map(cand).collect())]);
    let mut choice = took_two_of_four();
    choice.ahead[0].rows = (13..=40).collect();
    ahead.learn(&choice, &[row(11), row(12)]);
    let freed_by = |row: i64| -> Vec<Part> {
        let freed = BTreeMap::from([("k".to_string(), row)]);
        key_parts(&fixtures::request(), &freed, &ahead, Instant::now(), false)
    };
    // Row 12 finished: the key's next rows are 13 and on, read by id, a run of them.
    let parts = freed_by(12);
    let Some(Part::Known {
        key,
        after,
        ids,
        more,
    }) = parts.first()
    else {
        panic!("{parts:?}");
    };
    assert_eq!((key.row, *after), (12, 12));
    assert_eq!(ids, &(13..13 + i64::from(RUN)).collect::<Vec<_>>());
    assert_eq!(more, &(13 + i64::from(RUN)..=40).collect::<Vec<_>>());
    let as_read = ahead.as_read(&parts, Instant::now()).expect("fresh rows");
    assert_eq!(as_read[0].1.len(), RUN as usize);
    // Freed by row 11 (given back, say, or the rows ahead are not right behind it): the
    // key's first unfinished rows through its index.
    assert!(matches!(
        freed_by(11).first(),
        Some(Part::Key { after: None, .. })
    ));
    // Without reading ahead, or without reading freed keys so, a freed key is always read
    // from its first row.
    let freed = BTreeMap::from([("k".to_string(), 12)]);
    let mut not_freeing = ReadAhead::on();
    not_freeing.learn(&choice, &[row(11), row(12)]);
    for other in [&ReadAhead::default(), &not_freeing] {
        let parts = key_parts(&fixtures::request(), &freed, other, Instant::now(), true);
        assert!(matches!(parts.first(), Some(Part::Key { after: None, .. })));
    }
    // Three rows ahead: by id for a crowded claim, a run from the first row for another.
    let mut choice = took_two_of_four();
    choice.ahead[0].rows = vec![13, 14, 15];
    ahead.learn(&choice, &[row(11), row(12)]);
    let read = |crowded: bool| -> Part {
        let freed = BTreeMap::from([("k".to_string(), 12)]);
        key_parts(
            &fixtures::request(),
            &freed,
            &ahead,
            Instant::now(),
            crowded,
        )[0]
        .clone()
    };
    assert!(matches!(read(true), Part::Known { ids, .. } if ids == [13, 14, 15]));
    assert!(matches!(
        read(false),
        Part::Key {
            after: None,
            rows: RUN,
            ..
        }
    ));
}
