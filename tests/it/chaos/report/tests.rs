//! The verdict on made-up evidence: each guarantee it checks, broken and kept.

use super::*;

const SENDERS: [&str; 2] = ["a", "b"];

fn hit(id: i64, sender: u8, t0: Instant, ms: u64, accepted: bool) -> Hit {
    let at = t0 + Duration::from_millis(ms);
    Hit {
        id: Some(id),
        sender,
        at,
        answered: Some(at),
        accepted,
        storm: if accepted {
            Storm::Calm
        } else {
            Storm::ServerErrors
        },
    }
}

fn fault(kind: Kind, slot: u8, t0: Instant, ms: u64) -> Fault {
    let at = t0 + Duration::from_millis(ms);
    Fault {
        kind,
        slot: Some(slot),
        holder: true,
        at,
        end: at + Duration::from_millis(500),
    }
}

fn row(id: i64, key: Option<&str>) -> Row {
    Row {
        id,
        seq: id as u64,
        key: key.map(str::to_string),
        status: "SUCCESS".into(),
    }
}

fn analyze_with(rows: &[Row], hits: &[Hit], faults: &[Fault], t0: Instant) -> Report {
    analyze(&Evidence {
        scenario: "unit".into(),
        seed: 1,
        leader: true,
        max_in_flight: 2,
        senders: &SENDERS,
        rows,
        hits,
        faults,
        commits: &HashMap::new(),
        t0,
    })
}

#[test]
fn a_duplicate_is_accounted_only_to_a_kill_or_pause_of_its_first_sender() {
    let t0 = Instant::now();
    let rows = [row(1, None), row(2, None), row(3, None), row(4, None)];
    let hits = [
        // Row 1: a (killed at 100 ms) had it; b delivers it again: a kill.
        hit(1, 0, t0, 90, true),
        hit(1, 1, t0, 1_000, true),
        // Row 2: a again, but a second time before the kill: unaccounted.
        hit(2, 0, t0, 10, true),
        hit(2, 1, t0, 50, true),
        // Row 3: b had it and then stopped gracefully: unaccounted.
        hit(3, 1, t0, 1_100, true),
        hit(3, 0, t0, 3_000, true),
        // Row 4: a's request written when it woke from its pause (4,000 to 4,500 ms), the
        // next holder b sending it too.
        hit(4, 0, t0, 4_550, true),
        hit(4, 1, t0, 4_700, true),
    ];
    let faults = [
        fault(Kind::Kill9, 0, t0, 100),
        fault(Kind::Graceful, 1, t0, 1_200),
        fault(Kind::Pause, 0, t0, 4_000),
    ];
    let rep = analyze_with(&rows, &hits, &faults, t0);
    assert_eq!(rep.duplicates.values().sum::<usize>(), 2, "{rep:?}");
    assert_eq!(rep.unaccounted.len(), 2, "{:?}", rep.unaccounted);
    assert!(rep.unaccounted[0].contains("before its sender was killed"));
    assert!(rep.unaccounted[1].contains("gracefully"));
    assert_eq!(rep.failovers.len(), 3);
    assert_eq!(rep.failovers[0].2, Some(Duration::from_millis(900)));
    assert!(rep.lost.is_empty() && rep.order_violations.is_empty());
}

#[test]
fn key_order_loss_and_the_per_fault_bound_are_checked() {
    let t0 = Instant::now();
    let rows = [
        row(1, Some("k")),
        row(2, Some("k")),
        row(3, None),
        row(4, None),
        row(5, None),
    ];
    let hits = [
        // Row 2 of key k arrives before row 1 was first accepted (only failed so far).
        hit(1, 0, t0, 10, false),
        hit(2, 0, t0, 20, true),
        hit(1, 0, t0, 30, true),
        // Rows 3, 4, 5: a killed with all three in flight, over the bound of 2.
        hit(3, 0, t0, 40, true),
        hit(4, 0, t0, 41, true),
        hit(5, 0, t0, 42, true),
        hit(3, 1, t0, 500, true),
        hit(4, 1, t0, 501, true),
        hit(5, 1, t0, 502, true),
    ];
    let faults = [fault(Kind::Kill9, 0, t0, 100)];
    let mut rep = analyze_with(&rows, &hits, &faults, t0);
    assert_eq!(rep.order_violations.len(), 1, "{:?}", rep.order_violations);
    assert_eq!(rep.over_bound.len(), 1, "{:?}", rep.over_bound);
    assert!(rep.unaccounted.is_empty());
    rep.lost.clear();
    let mut rows = rows.to_vec();
    rows[4].status = "RETRY".into();
    let rep = analyze_with(&rows, &hits[..8], &faults, t0);
    assert_eq!(rep.stuck, 1);
    assert_eq!(rep.lost, vec![5]);
    assert_eq!(rep.problems().len(), 3, "{:?}", rep.problems());
}
