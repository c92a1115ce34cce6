//! Properties of the lease deadline arithmetic (docs/design.md, "Leases and fencing"), over
//! random ttls and instants: the deadline is `sent_at + ttl - drift(ttl)`, strictly before the
//! backend can forget the grant, the allowance grows with the ttl, and a state whose deadline
//! has passed gives no fence. The clock is tokio's paused one, so "now" is exact.

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::{LeaseState, deadline, drift};

/// A paused current-thread runtime: `Instant::now()` moves only with `advance`.
fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// Any ttl up to ten days, in microseconds (below and above the 300 ms config minimum),
/// drawn evenly over the scales: a uniform draw would almost never be under a minute.
fn ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![
        0u64..=1_000_000,
        1_000_000u64..=3_600_000_000,
        3_600_000_000u64..=864_000_000_000,
    ]
    .prop_map(Duration::from_micros)
}

proptest! {
    #[test]
    fn the_deadline_is_sent_at_plus_ttl_less_drift_and_strictly_before_expiry(
        ttl in ttl(),
        offset_us in 0u64..=3_600_000_000,
    ) {
        let rt = paused();
        let _in = rt.enter();
        // Far enough from the clock's origin that subtracting the drift cannot underflow.
        let sent_at = Instant::now() + Duration::from_secs(3600) + Duration::from_micros(offset_us);
        let d = deadline(sent_at, ttl);
        prop_assert_eq!(d, sent_at + ttl - drift(ttl));
        prop_assert!(d < sent_at + ttl, "deadline {:?} not before expiry", d - sent_at);
        // Every ttl the configuration accepts leaves a usable hold.
        if ttl >= Duration::from_millis(300) {
            prop_assert!(d > sent_at);
            prop_assert!(d - sent_at >= ttl * 98 / 100 - Duration::from_millis(2));
        }
    }

    #[test]
    fn drift_grows_with_the_ttl_and_is_never_zero(a in ttl(), b in ttl()) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(drift(lo) <= drift(hi));
        prop_assert!(drift(lo) >= Duration::from_millis(2));
    }

    #[test]
    fn a_state_gives_a_fence_only_before_its_deadline_and_only_when_confirmed(
        ttl_ms in 300u64..=600_000,
        elapsed_us in 0u64..=700_000_000,
        epoch in any::<i64>(),
        confirmed in any::<bool>(),
    ) {
        let rt = paused();
        rt.block_on(async {
            let ttl = Duration::from_millis(ttl_ms);
            let sent_at = Instant::now();
            let state = LeaseState::Held { epoch, deadline: deadline(sent_at, ttl), confirmed };
            tokio::time::advance(Duration::from_micros(elapsed_us)).await;
            let before_deadline = Instant::now() < sent_at + ttl - drift(ttl);
            let fence = state.fence("lease");
            prop_assert_eq!(fence.is_some(), confirmed && before_deadline);
            if let Some(f) = fence {
                prop_assert_eq!(f.epoch, epoch);
                prop_assert_eq!(f.lease, "lease");
            }
            prop_assert!(LeaseState::Standby.fence("lease").is_none());
            // At the deadline itself the hold is over.
            let d = deadline(sent_at, ttl);
            if Instant::now() < d {
                tokio::time::advance(d - Instant::now()).await;
            }
            prop_assert!(state.fence("lease").is_none());
            Ok(())
        })?;
    }
}
