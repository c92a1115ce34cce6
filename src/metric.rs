//! Every metric's name and help text, defined once. The names are public interface (the
//! README's Metrics section): dashboards and alerts depend on them, so code refers to these
//! constants and never spells a name itself; `telemetry` describes each from [`ALL`].

use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram};

/// Delivery attempts, labelled `sink` and `outcome`.
pub const DELIVERIES: &str = "outbox_relay_deliveries_total";
/// Time one delivery attempt took, labelled `sink`.
pub const DELIVERY_DURATION: &str = "outbox_relay_delivery_duration_seconds";
/// From a row's `created_at` to its delivery, labelled `sink`.
pub const END_TO_END: &str = "outbox_relay_end_to_end_seconds";
/// Rows claimed.
pub const CLAIMED: &str = "outbox_relay_claimed_total";
/// Time one claim statement took.
pub const CLAIM_DURATION: &str = "outbox_relay_claim_duration_seconds";
/// Claimed rows finished FAILED unsent (unreadable column, payload over every limit).
pub const ROWS_UNDELIVERABLE: &str = "outbox_relay_rows_undeliverable_total";
/// Rows parked: the database refused every result for them, even the generic FAILED one.
pub const ROWS_PARKED: &str = "outbox_relay_rows_parked_total";
/// Failed result writes, labelled `kind` (`transient`, `refused`, `dropped`).
pub const RESULT_WRITE_ERRORS: &str = "outbox_relay_result_write_errors_total";
/// Deliveries being sent right now.
pub const IN_FLIGHT: &str = "outbox_relay_in_flight";
/// 1 while this instance holds the lease.
pub const LEASE_HELD: &str = "outbox_relay_lease_held";
/// The fencing epoch of the lease last acquired.
pub const LEASE_EPOCH: &str = "outbox_relay_lease_epoch";
/// Times this instance acquired the lease.
pub const LEASE_ACQUISITIONS: &str = "outbox_relay_lease_acquisitions_total";
/// Lease renewals, labelled `result` (`ok`, `rejected`, `error`, `timeout`).
pub const LEASE_RENEWALS: &str = "outbox_relay_lease_renewals_total";
/// Times a held lease was lost.
pub const LEASE_LOST: &str = "outbox_relay_lease_lost_total";
/// 1 while a sink is paused, labelled `sink`.
pub const SINK_PAUSED: &str = "outbox_relay_sink_paused";
/// Always 1, labelled `version`.
pub const BUILD_INFO: &str = "outbox_relay_build_info";
/// Rows by status (sampled), labelled `status`.
pub const ROWS: &str = "outbox_relay_rows";
/// Age of the oldest PENDING or RETRY row (sampled).
pub const OLDEST_PENDING: &str = "outbox_relay_oldest_pending_seconds";
/// Ordering keys with rows held back behind an unfinished earlier row (sampled).
pub const ORDERING_BLOCKED_KEYS: &str = "outbox_relay_ordering_blocked_keys";
/// Spans of delivery attempts exported to the collector (`[tracing]`).
pub const SPANS_EXPORTED: &str = "outbox_relay_spans_exported_total";
/// Spans dropped, labelled `reason` (`queue_full`, `export_failed`, `shutdown`).
pub const SPANS_DROPPED: &str = "outbox_relay_spans_dropped_total";

/// The outcome labels of [`DELIVERIES`], in the order [`SinkSeries`] keeps their counters.
pub(crate) const OUTCOMES: [&str; 5] = [
    "delivered",
    "retry",
    "throttle",
    "permanent",
    "config_error",
];

/// One sink's per-delivery series ([`DELIVERIES`], [`DELIVERY_DURATION`], [`END_TO_END`]) and
/// [`IN_FLIGHT`], each registered the first time it is used (so /metrics shows the same
/// series as if every delivery named it) and kept: naming a series at every delivery hashes
/// its labels and looks it up in the registry (docs/performance-log.md, "Less relay CPU per
/// delivery").
pub struct SinkSeries {
    sink: String,
    in_flight: OnceLock<Gauge>,
    duration: OnceLock<Histogram>,
    end_to_end: OnceLock<Histogram>,
    outcomes: [OnceLock<Counter>; OUTCOMES.len()],
}

impl SinkSeries {
    pub fn new(sink: &str) -> SinkSeries {
        SinkSeries {
            sink: sink.to_string(),
            in_flight: OnceLock::new(),
            duration: OnceLock::new(),
            end_to_end: OnceLock::new(),
            outcomes: Default::default(),
        }
    }

    /// [`IN_FLIGHT`] (not labelled: every sink's handle is the same series).
    pub fn in_flight(&self) -> &Gauge {
        self.in_flight.get_or_init(|| metrics::gauge!(IN_FLIGHT))
    }

    pub fn duration(&self) -> &Histogram {
        self.duration
            .get_or_init(|| metrics::histogram!(DELIVERY_DURATION, "sink" => self.sink.clone()))
    }

    pub fn end_to_end(&self) -> &Histogram {
        self.end_to_end
            .get_or_init(|| metrics::histogram!(END_TO_END, "sink" => self.sink.clone()))
    }

    /// Counts one delivery attempt under [`DELIVERIES`] with `outcome` (an outcome label; any
    /// other is counted under its own name, its series not kept).
    pub fn count(&self, outcome: &'static str) {
        match OUTCOMES.iter().position(|o| *o == outcome) {
            Some(i) => self.outcomes[i]
                .get_or_init(|| {
                    metrics::counter!(DELIVERIES, "sink" => self.sink.clone(), "outcome" => outcome)
                })
                .increment(1),
            None => {
                metrics::counter!(DELIVERIES, "sink" => self.sink.clone(), "outcome" => outcome)
                    .increment(1)
            }
        }
    }
}

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric: name, kind, help.
pub const ALL: &[(&str, Kind, &str)] = &[
    (
        DELIVERIES,
        Kind::Counter,
        "Delivery attempts by sink and outcome.",
    ),
    (
        DELIVERY_DURATION,
        Kind::Histogram,
        "Time one delivery attempt took.",
    ),
    (
        END_TO_END,
        Kind::Histogram,
        "From the row's created_at to its delivery.",
    ),
    (CLAIMED, Kind::Counter, "Rows claimed."),
    (
        CLAIM_DURATION,
        Kind::Histogram,
        "Time one claim statement took.",
    ),
    (
        ROWS_UNDELIVERABLE,
        Kind::Counter,
        "Claimed rows finished FAILED because a column could not be read or the payload was over every sink's limit.",
    ),
    (
        ROWS_PARKED,
        Kind::Counter,
        "Rows parked because the database refused every result for them, even the generic FAILED one: never claimed again until requeued.",
    ),
    (
        RESULT_WRITE_ERRORS,
        Kind::Counter,
        "Failed result writes by kind: transient (retried), refused (the batch is split to isolate the row), dropped (even parking the row was refused).",
    ),
    (IN_FLIGHT, Kind::Gauge, "Deliveries being sent right now."),
    (
        LEASE_HELD,
        Kind::Gauge,
        "1 while this instance holds the lease.",
    ),
    (
        LEASE_EPOCH,
        Kind::Gauge,
        "The fencing epoch of the lease last acquired.",
    ),
    (
        LEASE_ACQUISITIONS,
        Kind::Counter,
        "Times this instance acquired the lease.",
    ),
    (LEASE_RENEWALS, Kind::Counter, "Lease renewals by result."),
    (LEASE_LOST, Kind::Counter, "Times a held lease was lost."),
    (
        SINK_PAUSED,
        Kind::Gauge,
        "1 while a sink is paused (throttle or config error).",
    ),
    (BUILD_INFO, Kind::Gauge, "Build information."),
    (
        ROWS,
        Kind::Gauge,
        "Rows in the outbox table by status (sampled).",
    ),
    (
        OLDEST_PENDING,
        Kind::Gauge,
        "Age of the oldest PENDING or RETRY row (sampled).",
    ),
    (
        ORDERING_BLOCKED_KEYS,
        Kind::Gauge,
        "Ordering keys with rows held back behind an unfinished earlier row (sampled).",
    ),
    (
        SPANS_EXPORTED,
        Kind::Counter,
        "Spans of delivery attempts exported to the OTLP collector (tracing.endpoint).",
    ),
    (
        SPANS_DROPPED,
        Kind::Counter,
        "Spans dropped by reason: queue_full (the collector is slow or down; deliveries never wait), export_failed (refused or timed out), shutdown.",
    ),
];

#[cfg(test)]
mod tests {
    use super::ALL;

    /// The README lists every metric (without the `outbox_relay_` prefix), and nothing else.
    #[test]
    fn the_readme_lists_every_metric() {
        let readme = include_str!("../README.md");
        let section = readme
            .split("## Metrics")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("a Metrics section");
        for (name, _, _) in ALL {
            let short = name.trim_start_matches("outbox_relay_");
            assert!(
                section.contains(&format!("`{short}")),
                "README lacks {short}"
            );
        }
        let listed = section.matches("`").count() / 2;
        assert!(
            listed >= ALL.len(),
            "{listed} code spans for {} metrics",
            ALL.len()
        );
    }
}
