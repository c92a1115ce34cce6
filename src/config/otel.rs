//! `[tracing]`: trace propagation and span export over OTLP/HTTP (docs/tracing.md).
//!
//! Guarantees: tracing is off unless `endpoint` is set, and then nothing of it runs (no span,
//! no trace column read); the endpoint and the headers are [`Secret`]s (a collector's token
//! rides in either), shown only as the endpoint's host and the headers' names; every bound
//! that keeps export from growing the relay's memory (`queue_size`, `batch_size`) is
//! checked against the other here, naming the key.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::secret::redact_url;
use super::{ConfigError, Secret, duration, number};

/// `[tracing]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingSettings {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`): spans are POSTed as
    /// protobuf to `<endpoint>/v1/traces`. Empty: tracing is off.
    pub endpoint: Secret,
    /// Extra headers of every export request (a collector's token): any name, values secret.
    pub headers: BTreeMap<String, Secret>,
    /// The `service.name` of the exported spans.
    pub service_name: String,
    /// The share of root traces recorded (rows without a sampled parent); a row's parent
    /// decides for its own trace (parent-based sampling).
    #[serde(deserialize_with = "ratio")]
    pub sample_ratio: f64,
    /// Most ended spans waiting for export; past it spans are dropped and counted.
    #[serde(deserialize_with = "number::int::<_, _, 1, 1_000_000>")]
    pub queue_size: usize,
    /// Most spans in one export request.
    #[serde(deserialize_with = "number::int::<_, _, 1, 100_000>")]
    pub batch_size: usize,
    /// Longest one export request may take; its spans are dropped and counted after it.
    #[serde(deserialize_with = "duration::deserialize")]
    pub export_timeout: Duration,
    /// A top-level string field of the payload holding the writer's `traceparent`, for rows
    /// without a trace column (or whose column is NULL).
    pub traceparent_field: Option<String>,
    /// The same for `tracestate`.
    pub tracestate_field: Option<String>,
}

impl Default for TracingSettings {
    fn default() -> Self {
        TracingSettings {
            endpoint: Secret::default(),
            headers: BTreeMap::new(),
            service_name: "outbox-relay".into(),
            sample_ratio: 1.0,
            queue_size: 2048,
            batch_size: 512,
            export_timeout: Duration::from_secs(10),
            traceparent_field: None,
            tracestate_field: None,
        }
    }
}

/// `sample_ratio`: from 0 (no root trace recorded) to 1 (every one).
fn ratio<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    number::float(d, 0.0, 1.0)
}

impl TracingSettings {
    /// Spans are made and exported: `endpoint` is set.
    pub fn enabled(&self) -> bool {
        !self.endpoint.expose().trim().is_empty()
    }

    /// The URL spans are POSTed to: `<endpoint>/v1/traces`.
    pub fn traces_url(&self) -> String {
        format!(
            "{}/v1/traces",
            self.endpoint.expose().trim().trim_end_matches('/')
        )
    }

    /// One line for `check-config`: the settings without secrets (the endpoint's credentials
    /// masked, the headers by name only).
    pub fn describe(&self) -> String {
        if !self.enabled() {
            return "tracing: off (no tracing.endpoint)".into();
        }
        let headers: Vec<&str> = self.headers.keys().map(String::as_str).collect();
        let field = |f: &Option<String>| f.clone().unwrap_or_else(|| "-".into());
        format!(
            "tracing: OTLP/HTTP to {} headers=[{}] service_name={} sample_ratio={} \
             queue_size={} batch_size={} export_timeout={} traceparent_field={} \
             tracestate_field={}",
            redact_url(&self.traces_url()),
            headers.join(", "),
            self.service_name,
            self.sample_ratio,
            self.queue_size,
            self.batch_size,
            duration::format(self.export_timeout),
            field(&self.traceparent_field),
            field(&self.tracestate_field),
        )
    }

    /// Refuses settings that cannot work, naming the key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        let url = self.endpoint.expose().trim();
        if !(url.starts_with("http://") || url.starts_with("https://"))
            || reqwest::Url::parse(url).is_err()
        {
            // Without the value: it may carry credentials.
            return Err(ConfigError::new(
                "tracing.endpoint",
                "is not an http:// or https:// URL (the collector's OTLP/HTTP base, e.g. \
                 http://127.0.0.1:4318)",
            ));
        }
        super::check_headers("tracing.headers", &self.headers)?;
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::new(
                "tracing.service_name",
                "must not be empty",
            ));
        }
        if self.batch_size > self.queue_size {
            return Err(ConfigError::new(
                "tracing.batch_size",
                format!(
                    "{} is more than tracing.queue_size ({}): a batch is taken from the queue",
                    self.batch_size, self.queue_size
                ),
            ));
        }
        if self.export_timeout.is_zero() {
            return Err(ConfigError::new(
                "tracing.export_timeout",
                "must be more than 0",
            ));
        }
        for (key, field) in [
            ("tracing.traceparent_field", &self.traceparent_field),
            ("tracing.tracestate_field", &self.tracestate_field),
        ] {
            if field.as_deref().is_some_and(|f| f.trim().is_empty()) {
                return Err(ConfigError::new(key, "must not be empty"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<crate::config::Settings, ConfigError> {
        let env = vars
            .iter()
            .map(|(k, v)| (format!("OUTBOX_RELAY__TRACING__{k}"), v.to_string()))
            .collect();
        crate::config::Settings::load_with_env(None, Some(env))
    }

    #[test]
    fn off_without_an_endpoint_and_described_without_secrets() {
        let s = load(&[]).expect("defaults");
        assert!(!s.tracing.enabled());
        assert_eq!(s.tracing.describe(), "tracing: off (no tracing.endpoint)");
        let s = load(&[
            ("ENDPOINT", "https://user:hunter2@otel.example:4318/"),
            ("HEADERS__AUTHORIZATION", "Bearer sekrit"),
            ("SAMPLE_RATIO", "0.25"),
            ("QUEUE_SIZE", "100"),
            ("BATCH_SIZE", "10"),
            ("EXPORT_TIMEOUT", "2s"),
            ("TRACEPARENT_FIELD", "tp"),
        ])
        .expect("valid");
        assert!(s.tracing.enabled());
        assert_eq!(
            s.tracing.traces_url(),
            "https://user:hunter2@otel.example:4318/v1/traces"
        );
        let line = s.tracing.describe();
        assert!(
            !line.contains("hunter2") && !line.contains("sekrit"),
            "{line}"
        );
        assert!(line.contains("authorization") && line.contains("sample_ratio=0.25"));
        assert!(line.contains("traceparent_field=tp"), "{line}");
    }

    #[test]
    fn settings_that_cannot_work_are_refused_by_key() {
        let key = |vars: &[(&str, &str)]| load(vars).map(|_| ()).unwrap_err().key;
        let on = ("ENDPOINT", "http://127.0.0.1:4318");
        assert_eq!(key(&[("ENDPOINT", "127.0.0.1:4318")]), "tracing.endpoint");
        assert_eq!(key(&[on, ("SAMPLE_RATIO", "1.5")]), "tracing.sample_ratio");
        assert_eq!(key(&[on, ("QUEUE_SIZE", "0")]), "tracing.queue_size");
        assert_eq!(
            key(&[on, ("QUEUE_SIZE", "10"), ("BATCH_SIZE", "11")]),
            "tracing.batch_size"
        );
        assert_eq!(
            key(&[on, ("EXPORT_TIMEOUT", "0s")]),
            "tracing.export_timeout"
        );
        assert_eq!(
            key(&[on, ("HEADERS__BAD NAME", "x")]),
            "tracing.headers.bad name"
        );
        assert_eq!(key(&[on, ("SERVICE_NAME", " ")]), "tracing.service_name");
        assert_eq!(key(&[on, ("NOPE", "x")]), "tracing.nope");
        // Without an endpoint nothing runs, so nothing else is looked at.
        assert!(load(&[("SAMPLE_RATIO", "0")]).is_ok());
    }
}
