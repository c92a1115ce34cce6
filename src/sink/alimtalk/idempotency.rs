//! Which `X-NC-API-IDEMPOTENCY-KEY` each NHN request carries.
//!
//! Guarantees: a row's first request carries `{key_prefix}{id}-{attempts}`; the same key is
//! sent again only after an outcome that left it unknown whether NHN acted on it (so NHN
//! answers the repeat with -1005 instead of sending twice); after a definite NHN answer the
//! next request carries a key never sent before, also when the answer counted no attempt
//! (throttle, configuration error), because NHN keeps a key spent for 10 minutes.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::sink::Delivery;

/// Rows whose key state is remembered at most; past it the memory starts over.
const MAX_TRACKED: usize = 10_000;

/// Per-row memory of idempotency keys (see the module docs). Held in memory only: after a
/// restart every row starts again from `{key}-{attempts}`, which is fresh after any refusal
/// that counted an attempt; only a throttle or configuration error shortly before a restart
/// can make NHN see a spent key again (it answers -1005, taken as delivered).
pub struct IdempotencyKeys {
    /// Prefix of every key.
    prefix: String,
    /// What is known per row id; rows with nothing to remember are absent.
    rows: Mutex<HashMap<i64, KeyState>>,
}

/// What is known about a row's earlier requests.
#[derive(Debug, Clone, Default, PartialEq)]
struct KeyState {
    /// The last key, when its outcome was unknown: send it again.
    reuse: Option<String>,
    /// Definite refusals so far; each makes the next key new.
    spent: u32,
}

/// How a request's key is to be treated afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFate {
    /// The row finished, or NHN answered definitely and an attempt was counted: the next
    /// key follows from the attempt count alone, so the row is forgotten.
    Forget,
    /// NHN answered definitely without an attempt being counted (throttle, configuration
    /// error): the key is used up and the attempt count has not moved.
    Spent,
    /// The outcome is unknown: the next attempt sends the same key.
    Reuse,
    /// The request never left: nothing changes.
    Unsent,
}

impl IdempotencyKeys {
    pub fn new(prefix: &str) -> Self {
        IdempotencyKeys {
            prefix: prefix.to_string(),
            rows: Mutex::new(HashMap::new()),
        }
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, HashMap<i64, KeyState>> {
        match self.rows.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The key for this attempt of `d`.
    pub fn key(&self, d: &Delivery) -> String {
        let state = self.rows().get(&d.id).cloned().unwrap_or_default();
        match state {
            KeyState { reuse: Some(k), .. } => k,
            KeyState { spent: 0, .. } => format!("{}{}-{}", self.prefix, d.id, d.attempts),
            KeyState { spent, .. } => {
                format!("{}{}-{}-{spent}", self.prefix, d.id, d.attempts)
            }
        }
    }

    /// Records what became of the request that carried `key`.
    pub fn settle(&self, id: i64, key: &str, fate: KeyFate) {
        let mut rows = self.rows();
        match fate {
            KeyFate::Unsent => {}
            KeyFate::Forget => {
                rows.remove(&id);
            }
            KeyFate::Spent | KeyFate::Reuse => {
                if rows.len() >= MAX_TRACKED && !rows.contains_key(&id) {
                    rows.clear();
                }
                let state = rows.entry(id).or_default();
                if fate == KeyFate::Spent {
                    state.reuse = None;
                    state.spent += 1;
                } else {
                    state.reuse = Some(key.to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(id: i64, attempts: u32) -> Delivery {
        Delivery {
            id,
            channel: "kakao".into(),
            recipient: Some("01012345678".into()),
            payload: String::new(),
            attempts,
            trace: None,
        }
    }

    #[test]
    fn keys_are_reused_only_after_unknown_outcomes() {
        let k = IdempotencyKeys::new("svc-");
        let key = k.key(&delivery(7, 0));
        assert_eq!(key, "svc-7-0");
        // Unknown outcome, retried (an attempt counted): the same key again.
        k.settle(7, &key, KeyFate::Reuse);
        assert_eq!(k.key(&delivery(7, 1)), "svc-7-0");
        // A definite refusal that counted no attempt (config error): a new key.
        k.settle(7, "svc-7-0", KeyFate::Spent);
        let next = k.key(&delivery(7, 1));
        assert_eq!(next, "svc-7-1-1");
        k.settle(7, &next, KeyFate::Spent);
        assert_eq!(k.key(&delivery(7, 1)), "svc-7-1-2");
        k.settle(7, "x", KeyFate::Unsent);
        assert_eq!(k.key(&delivery(7, 1)), "svc-7-1-2");
        k.settle(7, "x", KeyFate::Forget);
        assert_eq!(k.key(&delivery(7, 3)), "svc-7-3");
    }
}
