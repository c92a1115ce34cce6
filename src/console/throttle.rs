//! How long the answer to a wrong console token is held: a process-wide limiter over every
//! connection, so that guessing the token is slow however many connections guess at once
//! (docs/console.md, "Security").
//!
//! Guarantees:
//! - the right token never meets this limiter: it is checked first, in constant time, and a
//!   request carrying it is served at once, during an attack too (and clears its address's
//!   history);
//! - a wrong token is answered no sooner than [`BASE`], no sooner than its address's backoff
//!   allows (each further wrong token from one address, IPv4 or IPv6 /64, within [`FORGET`]
//!   doubles the spacing), and no sooner than its turn in the process-wide schedule: after a
//!   burst of [`GLOBAL_BURST`], one wrong answer per [`GLOBAL_INTERVAL`], whatever the
//!   address. So 200 wrong tokens sent at once, from any number of connections and
//!   addresses, are answered over 48 s or more, where the per-request delay alone answered
//!   them in about 4 s;
//! - no answer is held longer than [`MAX_WAIT`]: a wrong token whose turn would come later is
//!   held that long and refused with 429 without taking a turn, so the schedule, the
//!   connections held and the time until the process can stop stay bounded;
//! - memory is bounded: at most [`MAX_ADDRESSES`] addresses are remembered (the forgotten,
//!   then the longest quiet, make room), a few dozen bytes each.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Every wrong token is answered this late at least.
pub(super) const BASE: Duration = Duration::from_millis(400);
/// Wrong answers the whole process gives at once before they are spaced.
pub(super) const GLOBAL_BURST: u32 = 8;
/// The spacing of wrong answers across every connection and address, after the burst.
pub(super) const GLOBAL_INTERVAL: Duration = Duration::from_millis(250);
/// The longest one address's spacing grows to.
const ADDRESS_MAX: Duration = Duration::from_secs(60);
/// The longest a wrong token's answer is held; later turns are refused (429) instead.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(60);
/// An address's wrong tokens are forgotten this long after its last one.
const FORGET: Duration = Duration::from_secs(15 * 60);
/// Most addresses remembered at once.
pub(super) const MAX_ADDRESSES: usize = 4096;

/// What to do with a wrong token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hold {
    /// How long to hold the answer.
    pub wait: Duration,
    /// True: answer 429 (too many wrong tokens) rather than 401; no turn was taken.
    pub too_many: bool,
}

/// One address's recent wrong tokens.
#[derive(Debug, Clone, Copy)]
struct Address {
    /// Wrong tokens answered (or due to be) since the address was last forgotten.
    failures: u32,
    /// The earliest its next wrong token may be answered.
    next: Instant,
    /// When its last wrong token came.
    last: Instant,
}

#[derive(Debug)]
struct State {
    /// The process-wide schedule's theoretical arrival time (GCRA): the turn after the
    /// burst is `tat - (GLOBAL_BURST - 1) * GLOBAL_INTERVAL`.
    tat: Instant,
    addresses: HashMap<u128, Address>,
}

/// The process-wide limiter of wrong tokens.
#[derive(Debug)]
pub(super) struct Throttle {
    state: Mutex<State>,
}

/// The key of `ip`'s address: IPv4 (also as IPv6-mapped) whole, IPv6 by its /64 (one host
/// is usually given a whole /64).
fn key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u128::from(u32::from(v4)),
            None => u128::from(v6) & !u128::from(u64::MAX),
        },
    }
}

/// The spacing after an address's `failures`-th wrong token: [`BASE`] doubled each time.
fn spacing(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BASE.saturating_mul(1 << doublings).min(ADDRESS_MAX)
}

impl Throttle {
    pub(super) fn new() -> Throttle {
        Throttle {
            state: Mutex::new(State {
                tat: Instant::now(),
                addresses: HashMap::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// A wrong token from `ip`, now.
    pub(super) fn wrong(&self, ip: IpAddr) -> Hold {
        self.wrong_at(ip, Instant::now())
    }

    /// The right token from `ip`: its wrong ones are forgotten.
    pub(super) fn right(&self, ip: IpAddr) {
        self.state().addresses.remove(&key(ip));
    }

    /// How many addresses are remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.state().addresses.len()
    }

    /// A wrong token from `ip` at `now`: when its answer may go, its turn taken.
    fn wrong_at(&self, ip: IpAddr, now: Instant) -> Hold {
        let mut s = self.state();
        let k = key(ip);
        let mut a = match s.addresses.get(&k) {
            Some(a) if now.saturating_duration_since(a.last) < FORGET => *a,
            _ => Address {
                failures: 0,
                next: now,
                last: now,
            },
        };
        a.last = now;
        let tolerance = GLOBAL_INTERVAL * (GLOBAL_BURST - 1);
        let tat = s.tat.max(now);
        let turn = tat.checked_sub(tolerance).unwrap_or(now).max(now);
        let at = (now + BASE).max(a.next).max(turn);
        let wait = at - now;
        if wait > MAX_WAIT {
            remember(&mut s.addresses, k, a, now);
            return Hold {
                wait: MAX_WAIT,
                too_many: true,
            };
        }
        s.tat = tat + GLOBAL_INTERVAL;
        a.failures = a.failures.saturating_add(1);
        a.next = at + spacing(a.failures);
        remember(&mut s.addresses, k, a, now);
        Hold {
            wait,
            too_many: false,
        }
    }
}

/// Stores `a` under `k`, making room first when [`MAX_ADDRESSES`] are remembered: the
/// forgotten go, then the one quiet the longest (its backoff starts again; the process-wide
/// schedule still holds).
fn remember(addresses: &mut HashMap<u128, Address>, k: u128, a: Address, now: Instant) {
    if !addresses.contains_key(&k) && addresses.len() >= MAX_ADDRESSES {
        addresses.retain(|_, a| now.saturating_duration_since(a.last) < FORGET);
        if addresses.len() >= MAX_ADDRESSES
            && let Some(quiet) = addresses
                .iter()
                .min_by_key(|(_, a)| a.last)
                .map(|(k, _)| *k)
        {
            addresses.remove(&quiet);
        }
    }
    addresses.insert(k, a);
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn v4(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(n))
    }

    #[test]
    fn wrong_tokens_are_spaced_across_addresses() {
        let t = Throttle::new();
        let now = Instant::now();
        // 200 at once from 200 addresses: the burst at BASE, then one per interval.
        let waits: Vec<Duration> = (0..200).map(|i| t.wrong_at(v4(i), now).wait).collect();
        assert!(waits[..GLOBAL_BURST as usize].iter().all(|w| *w == BASE));
        let last = GLOBAL_INTERVAL * (200 - GLOBAL_BURST);
        assert_eq!(waits[199], last);
        assert!(last >= Duration::from_secs(48));
        // Later, the schedule has room again.
        let later = now + last + Duration::from_secs(10);
        assert_eq!(t.wrong_at(v4(1000), later).wait, BASE);
    }

    #[test]
    fn one_address_backs_off_and_is_refused_past_the_longest_wait() {
        let t = Throttle::new();
        let now = Instant::now();
        let holds: Vec<Hold> = (0..12).map(|_| t.wrong_at(v4(7), now)).collect();
        let waits: Vec<u64> = holds.iter().map(|h| h.wait.as_millis() as u64).collect();
        // 0.4 s, then each spacing doubled, until a turn would come after MAX_WAIT.
        assert_eq!(
            &waits[..8],
            &[400, 800, 1600, 3200, 6400, 12800, 25600, 51200]
        );
        assert!(holds[8..].iter().all(|h| h.too_many && h.wait == MAX_WAIT));
        // Refusals took no turn: another address is answered after BASE still.
        assert_eq!(t.wrong_at(v4(8), now).wait, BASE);
        // The right token forgets the address's history.
        t.right(v4(7));
        assert_eq!(t.wrong_at(v4(7), now + MAX_WAIT).wait, BASE);
        // So does time.
        let t = Throttle::new();
        for _ in 0..5 {
            t.wrong_at(v4(9), now);
        }
        assert_eq!(t.wrong_at(v4(9), now + FORGET + ADDRESS_MAX).wait, BASE);
    }

    #[test]
    fn memory_is_bounded_however_many_addresses_guess() {
        let t = Throttle::new();
        let now = Instant::now();
        // All at once: the schedule refuses most, and every address is remembered until the
        // quietest make room.
        for i in 0..(MAX_ADDRESSES as u32 * 3) {
            t.wrong_at(v4(i), now);
            assert!(t.remembered() <= MAX_ADDRESSES);
        }
        assert_eq!(t.remembered(), MAX_ADDRESSES);
        // Spread over hours: the forgotten make room.
        let mut at = now;
        for i in 0..(MAX_ADDRESSES as u32 * 3) {
            at += GLOBAL_INTERVAL;
            assert!(!t.wrong_at(v4(1 << 24 | i), at + MAX_WAIT).too_many);
            assert!(t.remembered() <= MAX_ADDRESSES);
        }
        // IPv6 hosts of one /64 are one address; IPv4-mapped ones are the IPv4 address.
        let a: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8::ffff:1".parse().unwrap();
        assert_eq!(key(IpAddr::V6(a)), key(IpAddr::V6(b)));
        let mapped: Ipv6Addr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(
            key(IpAddr::V6(mapped)),
            key(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
        );
    }
}
