use super::*;
use crate::store::claim::choose::choose;
use crate::store::claim::fixtures::request;
use crate::store::claim::plan::budgets;

fn candidate(id: i64, key: Option<&str>) -> Candidate {
    Candidate {
        id,
        channel: Some("hook".into()),
        key: key.map(str::to_string),
        free: true,
        head: true,
        last: false,
    }
}

fn window(from: Option<i64>, rows: u32) -> Part {
    Part::Window {
        channel: "hook".into(),
        from,
        rows,
        newest: false,
        sweep: false,
    }
}

/// A plan of the oldest window of `hook` from `from`, as `Cursors::plan` makes it.
fn planned(from: Option<i64>) -> Planned {
    Planned {
        parts: vec![window(from, 20)],
        full_walk: None,
        busy: Vec::new(),
    }
}

/// A claim of 10 rows that read rows 1..=20 of `hook` (none keyed unless `keyed`) from the
/// lowest row and took the first 10: what it keeps.
fn after_first_claim(keyed: Option<i64>) -> WindowsAhead {
    let rows = (1..=20)
        .map(|id| candidate(id, (Some(id) == keyed).then_some("k")))
        .collect();
    let found = vec![(window(None, 20), rows)];
    let choice = choose(&found, &budgets(&request()), 16);
    assert_eq!(choice.ids, (1..=10).collect::<Vec<_>>());
    let kept = WindowsAhead::default();
    kept.learn(found, &choice);
    kept
}

#[test]
fn the_next_claim_takes_the_rows_a_window_read_beyond_its_budget() {
    let kept = after_first_claim(None);
    let req = request();
    let found = kept
        .instead_of(&planned(Some(10)), &req, &budgets(&req))
        .expect("the floor is where the kept rows start");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, window(Some(10), 10));
    let ids: Vec<i64> = found[0].1.iter().map(|c| c.id).collect();
    assert_eq!(ids, (11..=20).collect::<Vec<_>>());
    // Used once: the claim after it reads (unless it learns again).
    assert!(
        kept.instead_of(&planned(Some(20)), &req, &budgets(&req))
            .is_none()
    );
}

#[test]
fn kept_rows_are_not_used_when_anything_else_would_be_read() {
    let req = request();
    let b = budgets(&req);
    // The floor moved (a row given back, a retry came due): read.
    assert!(
        after_first_claim(None)
            .instead_of(&planned(Some(4)), &req, &b)
            .is_none()
    );
    // Claim mode: other claimers take rows too.
    let shared = ClaimRequest {
        alone: false,
        ..request()
    };
    assert!(
        after_first_claim(None)
            .instead_of(&planned(Some(10)), &shared, &b)
            .is_none()
    );
    // A full walk, a newest window, a key: read.
    let mut walk = planned(Some(10));
    walk.full_walk = Some(Instant::now());
    assert!(
        after_first_claim(None)
            .instead_of(&walk, &req, &b)
            .is_none()
    );
    let mut newest = planned(Some(10));
    newest.parts.push(Part::Window {
        channel: "hook".into(),
        from: None,
        rows: 4,
        newest: true,
        sweep: false,
    });
    assert!(
        after_first_claim(None)
            .instead_of(&newest, &req, &b)
            .is_none()
    );
    // A budget the kept rows cannot fill: read.
    let more = ClaimRequest {
        budgets: Some(crate::store::model::Budgets {
            channels: vec![("hook".into(), 11)],
            others: None,
            starts: None,
        }),
        ..request()
    };
    let kept = after_first_claim(None);
    assert!(
        kept.instead_of(&planned(Some(10)), &more, &budgets(&more))
            .is_none()
    );
}

#[test]
fn kept_rows_expire() {
    let kept = after_first_claim(None);
    for k in kept.lock().values_mut() {
        k.at -= KEPT_FOR + Duration::from_millis(1);
    }
    let req = request();
    assert!(
        kept.instead_of(&planned(Some(10)), &req, &budgets(&req))
            .is_none()
    );
}

#[test]
fn windows_with_keyed_rows_or_at_the_channels_end_keep_nothing() {
    let req = request();
    let b = budgets(&req);
    // A keyed row among the rest: whether it may go depends on what the claim took.
    let kept = after_first_claim(Some(15));
    assert!(kept.instead_of(&planned(Some(10)), &req, &b).is_none());
    // A window that held fewer rows than it asked for reached the newest row: its floor waits
    // for late commits, so nothing is kept.
    let rows: Vec<Candidate> = (1..=15).map(|id| candidate(id, None)).collect();
    let found = vec![(window(None, 20), rows)];
    let choice = choose(&found, &b, 16);
    let kept = WindowsAhead::default();
    kept.learn(found, &choice);
    assert!(kept.lock().is_empty());
}
