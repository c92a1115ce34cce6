//! The `log` sink: writes each delivery to the log and succeeds (a payload that is not JSON
//! fails, as with every sink). For dry runs and the embedded demo; it sends nothing anywhere.

use super::{Delivery, Outcome, Sink};
use crate::BoxFuture;

/// Logs deliveries at INFO.
pub struct LogSink {
    /// The sink's configured name, shown in each line.
    name: String,
}

impl LogSink {
    pub fn new(name: &str) -> Self {
        LogSink {
            name: name.to_string(),
        }
    }
}

impl Sink for LogSink {
    fn deliver<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            // The same contract as every other sink: a payload must be JSON.
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&d.payload) {
                return Outcome::Permanent {
                    reason: format!("payload is not valid JSON: {e}"),
                };
            }
            tracing::info!(
                sink = %self.name,
                id = d.id,
                recipient = d.recipient.as_deref().unwrap_or("-"),
                payload = %d.payload,
                "delivered (log sink)"
            );
            Outcome::Delivered
        })
    }
}
