//! Per-sink pacing: a token-bucket rate limiter, a pause that throttles and config errors set,
//! and a moving average of send durations.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket: at most `rate` starts per second on average, bursts of up to one second's
/// worth. Waiters are served in the order they reserve.
pub struct RateLimiter {
    /// Tokens added per second.
    rate: f64,
    /// The bucket's size.
    burst: f64,
    /// (tokens available, when they were counted); tokens may go negative to queue waiters.
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(rate_per_sec: f64) -> Self {
        let burst = rate_per_sec.max(1.0);
        RateLimiter {
            rate: rate_per_sec,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Reserves one token and returns how long to wait before using it.
    pub fn reserve(&self) -> Duration {
        let mut state = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let now = Instant::now();
        let (tokens, at) = *state;
        let refilled = (tokens + now.duration_since(at).as_secs_f64() * self.rate).min(self.burst);
        let left = refilled - 1.0;
        *state = (left, now);
        if left >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-left / self.rate)
        }
    }

    /// How long a reservation made now would wait (the queue of earlier reservations).
    pub fn backlog(&self) -> Duration {
        let state = match self.state.lock() {
            Ok(g) => *g,
            Err(poisoned) => *poisoned.into_inner(),
        };
        let (tokens, at) = state;
        let refilled = tokens + Instant::now().duration_since(at).as_secs_f64() * self.rate;
        if refilled >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - refilled) / self.rate)
        }
    }

    /// The least time between two starts at the steady rate (`None` for a rate so low that
    /// the interval does not fit a `Duration`, or not above zero).
    pub fn interval(&self) -> Option<Duration> {
        if self.rate > 0.0 {
            Duration::try_from_secs_f64(1.0 / self.rate).ok()
        } else {
            None
        }
    }

    /// How many starts a claim made now can count on within `horizon`: the tokens there will
    /// be by then, less the reservations already queued.
    pub fn starts_within(&self, horizon: Duration) -> usize {
        let state = match self.state.lock() {
            Ok(g) => *g,
            Err(poisoned) => *poisoned.into_inner(),
        };
        let (tokens, at) = state;
        let now = Instant::now();
        let then = (tokens + now.duration_since(at).as_secs_f64() * self.rate).min(self.burst)
            + horizon.as_secs_f64() * self.rate;
        if then < 1.0 { 0 } else { then.floor() as usize }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// A sink's pause: until when no delivery may start. Exposed as `sink_paused{sink}`.
pub struct Pause {
    /// The sink's name, the metric's label.
    sink: String,
    /// Shared with the timer that clears the pause (and its gauge) when it runs out.
    until: Arc<Mutex<Option<Instant>>>,
    /// Why the last pause began (shown by the console while it lasts).
    reason: Mutex<String>,
}

impl Pause {
    pub fn new(sink: &str) -> Self {
        metrics::gauge!(crate::metric::SINK_PAUSED, "sink" => sink.to_string()).set(0.0);
        Pause {
            sink: sink.to_string(),
            until: Arc::new(Mutex::new(None)),
            reason: Mutex::new(String::new()),
        }
    }

    /// Pauses for `d` from now (extends, never shortens, a running pause).
    pub fn pause_for(&self, d: Duration, reason: &str) {
        let until = Instant::now() + d;
        let mut g = match self.until.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if g.is_none_or(|u| u < until) {
            *g = Some(until);
            match self.reason.lock() {
                Ok(mut r) => *r = reason.to_string(),
                Err(p) => *p.into_inner() = reason.to_string(),
            }
            tracing::warn!(sink = %self.sink, pause_ms = d.as_millis() as u64, reason, "sink paused");
            metrics::gauge!(crate::metric::SINK_PAUSED, "sink" => self.sink.clone()).set(1.0);
            // Clear the pause when it runs out even if no delivery to this sink asks again
            // (a standby, or no more rows): otherwise sink_paused would stay 1 for good.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (sink, shared) = (self.sink.clone(), self.until.clone());
                rt.spawn(async move {
                    tokio::time::sleep_until(until).await;
                    clear_if_over(&sink, &shared);
                });
            }
        }
    }

    /// The time left on the pause, or `None` when the sink may send.
    pub fn remaining(&self) -> Option<Duration> {
        clear_if_over(&self.sink, &self.until)
    }

    /// The time left on the pause and why it began, or `None` when the sink may send.
    pub fn state(&self) -> Option<(Duration, String)> {
        let left = self.remaining()?;
        let reason = match self.reason.lock() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        };
        Some((left, reason))
    }
}

/// The time left on a pause; clears it (and the gauge) once it has run out.
fn clear_if_over(sink: &str, until: &Mutex<Option<Instant>>) -> Option<Duration> {
    let mut g = match until.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let now = Instant::now();
    match *g {
        Some(u) if u > now => Some(u - now),
        Some(_) => {
            *g = None;
            tracing::info!(sink, "sink resumed");
            metrics::gauge!(crate::metric::SINK_PAUSED, "sink" => sink.to_string()).set(0.0);
            None
        }
        None => None,
    }
}

/// A moving average of durations (each new sample weighs 1/8), lock-free: the relay loop reads
/// it while deliveries write it. Used to size how many rows are claimed ahead of a sink
/// (docs/design.md, "Claims").
#[derive(Default)]
pub struct MovingAverage {
    /// Microseconds; 0 until the first sample.
    micros: AtomicU64,
}

impl MovingAverage {
    /// Adds a sample. Concurrent updates may lose one another's sample, which only makes the
    /// average a little less smooth.
    pub fn record(&self, d: Duration) {
        let sample = (d.as_micros().min(u64::MAX as u128) as u64).max(1);
        let old = self.micros.load(Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.micros.store(new.max(1), Relaxed);
    }

    /// The average, or `None` before the first sample.
    pub fn get(&self) -> Option<Duration> {
        match self.micros.load(Relaxed) {
            0 => None,
            m => Some(Duration::from_micros(m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_limiter_spaces_starts() {
        let lim = RateLimiter::new(10.0);
        // The first second's burst is free, then one every 100ms.
        for _ in 0..10 {
            assert_eq!(lim.reserve(), Duration::ZERO);
        }
        let w = lim.reserve();
        assert!(
            w > Duration::from_millis(90) && w <= Duration::from_millis(100),
            "{w:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pause_expires_by_itself() {
        let p = Pause::new("t");
        assert!(p.remaining().is_none());
        p.pause_for(Duration::from_secs(2), "test");
        assert!(p.remaining().is_some());
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(p.remaining().is_none());
    }

    /// The pause (and so `sink_paused`) clears when it runs out even if nothing asks.
    #[tokio::test(start_paused = true)]
    async fn pause_clears_without_being_asked() {
        let p = Pause::new("t");
        p.pause_for(Duration::from_secs(2), "test");
        p.pause_for(Duration::from_secs(5), "longer");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            p.until.lock().unwrap().is_some(),
            "the longer pause still runs"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(p.until.lock().unwrap().is_none(), "cleared by its timer");
    }

    #[test]
    fn the_average_starts_at_the_first_sample_and_moves_an_eighth() {
        let a = MovingAverage::default();
        assert_eq!(a.get(), None);
        a.record(Duration::from_micros(800));
        assert_eq!(a.get(), Some(Duration::from_micros(800)));
        a.record(Duration::from_micros(1600));
        assert_eq!(a.get(), Some(Duration::from_micros(900)));
        a.record(Duration::ZERO);
        assert!(a.get().is_some_and(|d| d < Duration::from_micros(900)));
    }
}
