//! The live view's numbers: deliveries per second and errors per sink, from this process's own
//! `deliveries_total{sink,outcome}` counters, sampled every second over a short window.
//!
//! These are the counters of this instance only (another instance's deliveries show on its
//! own console, or on the dashboard, which sums them).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::metric;

/// The window a rate is measured over.
const WINDOW: Duration = Duration::from_secs(10);

/// Counters per (sink, outcome).
type Counts = BTreeMap<(String, String), f64>;

/// The recent samples, shared with the handlers.
#[derive(Clone, Default)]
pub(super) struct Live {
    samples: Arc<Mutex<VecDeque<(Instant, Counts)>>>,
}

/// One sink's line of the live view.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct SinkRate {
    pub sink: String,
    /// Deliveries per second over the window.
    pub delivered_per_sec: f64,
    /// Failed attempts (retry, throttle, permanent, config error) per second over the window.
    pub errors_per_sec: f64,
    /// Failed attempts since this process started.
    pub errors_total: f64,
    pub delivered_total: f64,
}

impl Live {
    /// Samples the counters every second until `stop`.
    pub(super) async fn sample(self, prom: PrometheusHandle, stop: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let counts = parse(&prom.render());
            let mut s = self.lock();
            let now = Instant::now();
            s.push_back((now, counts));
            while s.len() > 2 && s.front().is_some_and(|(t, _)| now - *t > WINDOW) {
                s.pop_front();
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Instant, Counts)>> {
        match self.samples.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Rates per sink over the window (empty until two samples were taken).
    pub(super) fn rates(&self) -> Vec<SinkRate> {
        let s = self.lock();
        let (Some((t0, first)), Some((t1, last))) = (s.front(), s.back()) else {
            return Vec::new();
        };
        let secs = (*t1 - *t0).as_secs_f64();
        let mut out: BTreeMap<String, SinkRate> = BTreeMap::new();
        for ((sink, outcome), v) in last {
            let delta = v - first
                .get(&(sink.clone(), outcome.clone()))
                .copied()
                .unwrap_or(0.0);
            let rate = if secs > 0.0 {
                delta.max(0.0) / secs
            } else {
                0.0
            };
            let e = out.entry(sink.clone()).or_insert_with(|| SinkRate {
                sink: sink.clone(),
                ..SinkRate::default()
            });
            if outcome == "delivered" {
                e.delivered_per_sec += rate;
                e.delivered_total += v;
            } else {
                e.errors_per_sec += rate;
                e.errors_total += v;
            }
        }
        out.into_values().collect()
    }
}

/// The `deliveries_total` samples of a Prometheus text exposition.
fn parse(text: &str) -> Counts {
    let mut out = Counts::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric::DELIVERIES) else {
            continue;
        };
        let Some((labels, value)) = rest.strip_prefix('{').and_then(|r| r.split_once("} ")) else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.trim_matches('"').to_string())
        };
        if let (Some(sink), Some(outcome), Ok(v)) =
            (label("sink"), label("outcome"), value.trim().parse::<f64>())
        {
            out.insert((sink, outcome), v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_counter_deltas() {
        let text = |d: u32, r: u32| {
            format!(
                "# TYPE outbox_relay_deliveries_total counter\n\
                 outbox_relay_deliveries_total{{sink=\"hook\",outcome=\"delivered\"}} {d}\n\
                 outbox_relay_deliveries_total{{sink=\"hook\",outcome=\"retry\"}} {r}\n\
                 outbox_relay_delivery_duration_seconds_count{{sink=\"hook\"}} 9\n"
            )
        };
        let live = Live::default();
        let t0 = Instant::now();
        live.lock().push_back((t0, parse(&text(10, 1))));
        live.lock()
            .push_back((t0 + Duration::from_secs(2), parse(&text(30, 5))));
        let r = live.rates();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].sink, "hook");
        assert!((r[0].delivered_per_sec - 10.0).abs() < 1e-9);
        assert!((r[0].errors_per_sec - 2.0).abs() < 1e-9);
        assert_eq!(r[0].errors_total, 5.0);
    }
}
