//! What the claim's unit tests share: a request and a claimed row.

use std::sync::Arc;
use std::time::Duration;

use crate::sink::Delivery;
use crate::store::model::{Budgets, ClaimRequest, ClaimedRow};

/// A request for 10 rows of channel `hook`, no tails.
pub fn request() -> ClaimRequest {
    ClaimRequest {
        tails: Vec::new(),
        limit: 10,
        ttl: Duration::from_secs(30),
        claimer: "test".into(),
        token: Arc::from("t"),
        fence: None,
        alone: true,
        exclude_channels: Vec::new(),
        max_payload_bytes: None,
        newest: false,
        budgets: Some(Budgets {
            channels: vec![("hook".into(), 10)],
            others: None,
            starts: None,
        }),
        trace: false,
    }
}

/// Row `id` of key `k`, claimed.
pub fn row(id: i64) -> ClaimedRow {
    ClaimedRow {
        delivery: Delivery {
            id,
            channel: "hook".into(),
            recipient: None,
            payload: "{}".into(),
            attempts: 0,
            trace: None,
        },
        ordering_key: Some("k".into()),
        age_at_claim: Duration::ZERO,
        undeliverable: None,
    }
}
