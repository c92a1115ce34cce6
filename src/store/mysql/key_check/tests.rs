//! The key check's groups and its walk of each key's chosen rows, without a server.

use super::*;

fn chosen(keys: &[(&str, &[i64])]) -> HashMap<String, BTreeSet<i64>> {
    let set = |ids: &[i64]| ids.iter().copied().collect();
    keys.iter()
        .map(|(k, ids)| (k.to_string(), set(ids)))
        .collect()
}

fn earlier(open: &[(&str, &[i64])], held_tails: &[i64]) -> Earlier {
    Earlier {
        open: chosen(open),
        held_tails: held_tails.iter().copied().collect(),
    }
}

fn sorted(set: HashSet<i64>) -> Vec<i64> {
    let mut v: Vec<i64> = set.into_iter().collect();
    v.sort_unstable();
    v
}

#[test]
fn heads_and_rows_behind_chosen_rows_or_held_tails_are_kept() {
    let c = chosen(&[("a", &[10, 12]), ("b", &[11]), ("c", &[13])]);
    // a: 10 is the head, 12 follows it; b: 11 follows the held tail 7; c: no earlier row.
    let e = earlier(&[("a", &[10]), ("b", &[3, 7])], &[7]);
    assert!(behind_their_key(&c, &e).is_empty());
}

#[test]
fn a_row_behind_a_row_left_out_is_left_out_too() {
    // 5 committed after 10 and 12 were read: 10 is behind it, and 12 behind 10.
    let c = chosen(&[("a", &[10, 12, 14]), ("b", &[11])]);
    let e = earlier(&[("a", &[5, 10, 12])], &[]);
    assert_eq!(sorted(behind_their_key(&c, &e)), vec![10, 12, 14]);
}

fn keys(g: &Group) -> String {
    g.keys.join(",")
}

#[test]
fn check_groups_bound_keys_whose_last_rows_are_near_each_other() {
    let c = chosen(&[
        ("a", &[12]),
        ("b", &[11]),
        ("c", &[10 + CHECK_SPAN]),
        ("d", &[11 + CHECK_SPAN, 20 + CHECK_SPAN]),
        ("e", &[5_000_000]),
    ]);
    let groups = check_groups(&c, &HashMap::new());
    assert_eq!(groups.len(), 3, "{groups:?}");
    // Sorted by last chosen row: b (11), a (12), c; d's last row is past the span.
    assert_eq!(
        (keys(&groups[0]), groups[0].below),
        ("b,a,c".into(), 10 + CHECK_SPAN)
    );
    assert_eq!(
        (keys(&groups[1]), groups[1].below),
        ("d".into(), 20 + CHECK_SPAN)
    );
    assert_eq!((keys(&groups[2]), groups[2].below), ("e".into(), 5_000_000));
    assert!(groups.iter().all(|g| g.from.is_none()));
    // Every key's rows below its last chosen row are inside its group's bound.
    for (key, ids) in &c {
        let g = groups.iter().find(|g| g.keys.contains(key)).unwrap();
        assert!(*ids.last().unwrap() <= g.below);
    }
}

#[test]
fn keys_whose_rows_follow_each_other_are_not_read_past_their_last_chosen_rows() {
    // The same at ids near the top of the range: the estimate works on offsets, not ids.
    for base in [0, 4_000_000_000_000_000_000] {
        // A backlog written key by key: each key's rows are consecutive ids, 100 a key, and
        // each key's chosen rows follow its tail. One bound would read the rest of every
        // key below the highest last chosen row (about 100 rows a key): each is a group.
        let block: Vec<(String, Vec<i64>)> = (0..20)
            .map(|k| {
                (
                    format!("k{k:02}"),
                    (base + k * 100 + 40..base + k * 100 + 44).collect(),
                )
            })
            .collect();
        let c: HashMap<String, BTreeSet<i64>> = (block.iter())
            .map(|(k, ids)| (k.clone(), ids.iter().copied().collect()))
            .collect();
        let from: HashMap<String, i64> = (block.iter())
            .map(|(k, ids)| (k.clone(), ids[0] - 1))
            .collect();
        let groups = check_groups(&c, &from);
        assert_eq!(groups.len(), 20, "{groups:?}");
        // Interleaved, 200 keys one after another: each key's rows lie 200 ids apart, and
        // one bound reads about one row a key past its last chosen row: one group.
        let c: HashMap<String, BTreeSet<i64>> = (0..200)
            .map(|k| {
                (
                    format!("k{k:03}"),
                    [base + 10_000 + k, base + 10_200 + k].into(),
                )
            })
            .collect();
        let from: HashMap<String, i64> = (0..200)
            .map(|k| (format!("k{k:03}"), base + 9_800 + k))
            .collect();
        let groups = check_groups(&c, &from);
        assert_eq!(groups.len(), 1, "{groups:?}");
        let bounds = (groups[0].from, groups[0].below);
        assert_eq!(bounds, (Some(base + 9_800), base + 10_399));
    }
}

#[test]
fn keys_with_tails_are_read_from_their_groups_lowest_tail() {
    let c = chosen(&[
        ("a", &[5_000, 5_002]),
        ("b", &[5_001]),
        ("c", &[5_003]),
        ("d", &[5_004]),
        ("h", &[5_005]),
    ]);
    // a, b and c follow tails near each other; d's tail lies past the span from theirs;
    // h is a head (no tail), read from its key's first row.
    let from: HashMap<String, i64> = [
        ("a", 4_000),
        ("b", 4_100),
        ("c", 3_900),
        ("d", 4_000 - 2 * CHECK_SPAN),
    ]
    .map(|(k, t)| (k.to_string(), t))
    .into();
    let groups = check_groups(&c, &from);
    let by_key = |k: &str| {
        groups
            .iter()
            .find(|g| g.keys.iter().any(|x| x == k))
            .unwrap()
    };
    assert_eq!(by_key("h").keys, vec!["h".to_string()]);
    assert_eq!(by_key("h").from, None);
    assert_eq!(keys(by_key("a")), "b,a,c");
    assert_eq!(by_key("a").from, Some(3_900));
    assert_eq!(by_key("a").below, 5_003);
    assert_eq!(by_key("d").keys, vec!["d".to_string()]);
    assert_eq!(by_key("d").from, Some(4_000 - 2 * CHECK_SPAN));
    // Every key's tail and last chosen row are inside its group's range.
    for (key, ids) in &c {
        let g = by_key(key);
        assert!(*ids.last().unwrap() <= g.below);
        assert!(
            from.get(key)
                .is_none_or(|t| g.from.is_some_and(|f| f <= *t))
        );
    }
}

#[test]
fn tails_below_take_only_a_chosen_keys_tail_before_its_first_chosen_row() {
    let tail = |key: &str, row: i64| crate::store::model::Tail {
        key: key.into(),
        row,
        channel: "hook".into(),
        run: 16,
    };
    let req = ClaimRequest {
        tails: vec![tail("a", 7), tail("b", 20), tail("x", 3)],
        trace: false,
        limit: 10,
        ttl: std::time::Duration::from_secs(60),
        claimer: "c".into(),
        token: "t".into(),
        fence: None,
        alone: true,
        exclude_channels: Vec::new(),
        max_payload_bytes: None,
        newest: false,
        budgets: None,
    };
    let c = chosen(&[("a", &[10, 12]), ("b", &[11])]);
    // b's offered tail lies after its chosen row (not a tail it follows); x chose nothing.
    assert_eq!(tails_below(&req, &c), HashMap::from([("a".to_string(), 7)]));
}

#[test]
fn a_key_read_from_its_tail_is_settled_only_by_a_row_before_its_first_chosen_row() {
    let ids: BTreeSet<i64> = [10, 12].into();
    // The tail 7 was read: the nearest earlier row of 10 is known.
    assert!(earlier(&[("a", &[7, 10, 12])], &[]).settles("a", &ids));
    // Only the chosen rows were read (the tail finished meanwhile): an earlier row may
    // lie below the range, so the key is read again from its first row.
    assert!(!earlier(&[("a", &[10, 12])], &[]).settles("a", &ids));
    assert!(!earlier(&[], &[]).settles("a", &ids));
}

#[test]
fn a_tail_not_held_blocks_its_key() {
    // 7 is a tail no longer held (its claim ran out): 11 waits, and so does 15.
    let c = chosen(&[("b", &[11, 15])]);
    let e = earlier(&[("b", &[7, 11])], &[]);
    assert_eq!(sorted(behind_their_key(&c, &e)), vec![11, 15]);
    // An unfinished row between two chosen rows that the claim does not hold.
    let c = chosen(&[("b", &[11, 15])]);
    let e = earlier(&[("b", &[11, 13])], &[]);
    assert_eq!(sorted(behind_their_key(&c, &e)), vec![15]);
}
