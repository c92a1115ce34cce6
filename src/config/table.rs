//! `[table]`: running on an existing outbox table (docs/adopting-a-table.md). Maps the
//! relay's columns to the table's own, its status values to the table's codes, and says how
//! the payload is assembled.
//!
//! Guarantees:
//! - without a `[table]` section (no key set), the mapping is the relay's own table exactly,
//!   so nothing changes for a table the relay created;
//! - every column name is a plain identifier, every status code and payload key is checked
//!   so that it can be written as an SQL literal without escaping surprises (no backslash,
//!   no control character), and every error names its key (`table.columns.status`);
//! - a mapped table must name its id, status, channel (or a constant) and payload (one
//!   column, or an object of columns); the other columns are optional.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::payload::{self, PayloadValue};
use super::status::StatusSettings;
use super::validate::column_name;
use super::{ConfigError, number};

/// `[table]` as written: every key optional, so that "not set" can be told from a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TableSettings {
    /// The channel of every row, for a table of one channel (instead of `columns.channel`).
    pub channel_value: Option<String>,
    /// PostgreSQL: `migrate --adopt` installs the insert trigger's NOTIFY on the mapped table
    /// and `run` listens for it (otherwise new rows are noticed by the newest id).
    #[serde(deserialize_with = "number::flag_opt")]
    pub notify_trigger: Option<bool>,
    pub columns: ColumnSettings,
    pub status: StatusSettings,
    /// The payload as a JSON object built by the database from columns: `key = "column"`
    /// (the column's value as text), `key = { json = "column" }` (a JSON column's value),
    /// or a nested table (a nested object). Instead of `columns.payload`.
    pub payload_object: Option<BTreeMap<String, PayloadValue>>,
}

/// `[table.columns]`: the table's column for each of the relay's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ColumnSettings {
    pub id: Option<String>,
    pub channel: Option<String>,
    pub recipient: Option<String>,
    pub payload: Option<String>,
    pub status: Option<String>,
    pub attempts: Option<String>,
    pub next_attempt_at: Option<String>,
    pub last_error: Option<String>,
    pub created_at: Option<String>,
    pub ordering_key: Option<String>,
    pub updated_at: Option<String>,
    pub sent_at: Option<String>,
    /// The writer's W3C `traceparent` (docs/tracing.md); read only with `[tracing]` on.
    pub traceparent: Option<String>,
    /// The writer's W3C `tracestate`; read only with `[tracing]` on.
    pub tracestate: Option<String>,
}

impl TableSettings {
    /// True when any key of `[table]` is set: the table is an existing one, mapped.
    pub fn is_mapped(&self) -> bool {
        let c = &self.columns;
        let s = &self.status;
        self.channel_value.is_some()
            || self.notify_trigger.is_some()
            || self.payload_object.is_some()
            || [
                &c.id,
                &c.channel,
                &c.recipient,
                &c.payload,
                &c.status,
                &c.attempts,
                &c.next_attempt_at,
                &c.last_error,
                &c.created_at,
                &c.ordering_key,
                &c.updated_at,
                &c.sent_at,
                &c.traceparent,
                &c.tracestate,
            ]
            .iter()
            .any(|v| v.is_some())
            || s.pending.is_some()
            || s.retry.is_some()
            || s.success.is_some()
            || s.failed.is_some()
    }

    /// Refuses a mapping that cannot work, naming the key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.is_mapped() {
            return Ok(());
        }
        self.validate_columns()?;
        self.validate_channel()?;
        self.validate_payload()?;
        self.status.validate()
    }

    /// `table.columns.*`: plain identifiers, none of the relay's bookkeeping columns, and
    /// `id` and `status` set.
    fn validate_columns(&self) -> Result<(), ConfigError> {
        let c = &self.columns;
        let named = [
            ("id", &c.id),
            ("channel", &c.channel),
            ("recipient", &c.recipient),
            ("payload", &c.payload),
            ("status", &c.status),
            ("attempts", &c.attempts),
            ("next_attempt_at", &c.next_attempt_at),
            ("last_error", &c.last_error),
            ("created_at", &c.created_at),
            ("ordering_key", &c.ordering_key),
            ("updated_at", &c.updated_at),
            ("sent_at", &c.sent_at),
            ("traceparent", &c.traceparent),
            ("tracestate", &c.tracestate),
        ];
        for (key, v) in named {
            if let Some(name) = v {
                column_name(&format!("table.columns.{key}"), name)?;
                if RESERVED.contains(&name.to_ascii_lowercase().as_str())
                    && !matches!(key, "sent_at")
                {
                    return Err(ConfigError::new(
                        format!("table.columns.{key}"),
                        format!(
                            "\"{name}\" is one of the relay's own bookkeeping columns ({}); map \
                             a column of the table",
                            RESERVED.join(", ")
                        ),
                    ));
                }
            }
        }
        for (key, v) in [("id", &c.id), ("status", &c.status)] {
            if v.is_none() {
                return Err(ConfigError::new(
                    format!("table.columns.{key}"),
                    "is required for a mapped table (the table's column holding it)",
                ));
            }
        }
        Ok(())
    }

    /// `table.columns.channel` or `table.channel_value` (a sink name), one of them.
    fn validate_channel(&self) -> Result<(), ConfigError> {
        match (&self.columns.channel, &self.channel_value) {
            (None, None) => Err(ConfigError::new(
                "table.columns.channel",
                "a mapped table needs table.columns.channel (a column naming each row's \
                 sink) or table.channel_value (one sink for every row)",
            )),
            (Some(_), Some(_)) => Err(ConfigError::new(
                "table.channel_value",
                "set either table.channel_value or table.columns.channel, not both",
            )),
            (None, Some(v))
                if v.is_empty()
                    || v.len() > 100
                    || !v
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "_-.".contains(ch)) =>
            {
                Err(ConfigError::new(
                    "table.channel_value",
                    format!("\"{v}\" is not a sink name (letters, digits, _ - .; at most 100)"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// `table.columns.payload` or `table.payload_object`, one of them.
    fn validate_payload(&self) -> Result<(), ConfigError> {
        match (&self.columns.payload, &self.payload_object) {
            (None, None) => Err(ConfigError::new(
                "table.columns.payload",
                "a mapped table needs table.columns.payload (one column holding the \
                 payload) or table.payload_object (an object built from columns)",
            )),
            (Some(_), Some(_)) => Err(ConfigError::new(
                "table.payload_object",
                "set either table.payload_object or table.columns.payload, not both",
            )),
            (None, Some(obj)) => payload::validate("table.payload_object", obj),
            (Some(_), None) => Ok(()),
        }
    }
}

/// The relay's bookkeeping columns: `migrate --adopt` adds them, so a mapped column must not
/// be one of them (`sent_at` may be mapped to a column of the table's own).
pub const RESERVED: [&str; 5] = [
    "claimed_by",
    "claim_token",
    "claimed_until",
    "open_channel",
    "open_key",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Code, Codes};

    fn seed002() -> TableSettings {
        TableSettings {
            channel_value: Some("alimtalk".into()),
            columns: ColumnSettings {
                id: Some("id".into()),
                status: Some("status".into()),
                recipient: Some("receiver_mobile_no".into()),
                attempts: Some("retry_count".into()),
                ..Default::default()
            },
            status: StatusSettings {
                pending: Some(Codes::One(Code::Text("PENDING".into()))),
                retry: Some(Codes::One(Code::Text("RETRY".into()))),
                success: Some(Code::Text("SUCCESS".into())),
                failed: Some(Code::Text("FAILED".into())),
            },
            payload_object: Some(BTreeMap::from([(
                "template_code".to_string(),
                PayloadValue::Column("template_code".into()),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn an_empty_section_is_the_relays_own_table() {
        assert!(!TableSettings::default().is_mapped());
        assert!(TableSettings::default().validate().is_ok());
        assert!(seed002().is_mapped());
        assert!(seed002().validate().is_ok());
    }

    #[test]
    fn errors_name_the_key() {
        let mut t = seed002();
        t.columns.recipient = Some("receiver mobile".into());
        assert_eq!(t.validate().unwrap_err().key, "table.columns.recipient");
        let mut t = seed002();
        t.status.failed = Some(Code::Text("SUCCESS".into()));
        assert_eq!(t.validate().unwrap_err().key, "table.status.failed");
        let mut t = seed002();
        t.status.success = Some(Code::Int(2));
        assert_eq!(t.validate().unwrap_err().key, "table.status");
        let mut t = seed002();
        t.status.pending = Some(Codes::One(Code::Text("a\\b".into())));
        assert_eq!(t.validate().unwrap_err().key, "table.status.pending");
        let mut t = seed002();
        t.channel_value = None;
        assert_eq!(t.validate().unwrap_err().key, "table.columns.channel");
        let mut t = seed002();
        t.columns.last_error = Some("claim_token".into());
        assert_eq!(t.validate().unwrap_err().key, "table.columns.last_error");
        let mut t = seed002();
        t.payload_object = Some(BTreeMap::from([(
            "p".to_string(),
            PayloadValue::Object(BTreeMap::from([(
                "x".to_string(),
                PayloadValue::Column("a;b".into()),
            )])),
        )]));
        assert_eq!(t.validate().unwrap_err().key, "table.payload_object.p.x");
    }

    /// Settings from the environment alone (no file): a table mapped by `TABLE__*` variables,
    /// and `extra` (each key without the `OUTBOX_RELAY__` prefix).
    fn mapped_from_env(
        extra: &[(&str, &str)],
    ) -> Result<crate::config::Settings, crate::config::ConfigError> {
        let mapped = [
            ("TABLE__CHANNEL_VALUE", "kakao"),
            ("TABLE__COLUMNS__ID", "event_id"),
            ("TABLE__COLUMNS__STATUS", "state"),
            ("TABLE__COLUMNS__PAYLOAD", "body"),
            ("TABLE__STATUS__PENDING", "0"),
            ("TABLE__STATUS__SUCCESS", "1"),
            ("TABLE__STATUS__FAILED", "2"),
        ];
        let env = mapped
            .iter()
            .chain(extra)
            .map(|(k, v)| (format!("OUTBOX_RELAY__{k}"), v.to_string()))
            .collect();
        crate::config::Settings::load_with_env(None, Some(env))
    }

    #[test]
    fn every_key_can_come_from_the_environment() {
        let s = mapped_from_env(&[]).expect("loads");
        assert!(s.table.is_mapped());
        assert_eq!(s.table.columns.id.as_deref(), Some("event_id"));
        // Environment values are strings: the codes are quoted digits.
        assert_eq!(s.table.status.failed, Some(Code::Text("2".into())));
    }

    #[test]
    fn the_console_runs_on_a_mapped_table() {
        let console = ("CONSOLE__TOKEN", "console-test-token-0123456789");
        let s = mapped_from_env(&[console]).expect("accepted");
        assert!(s.table.is_mapped() && s.console.is_some());
    }

    #[test]
    fn retry_may_share_the_pending_value() {
        let mut t = seed002();
        t.status.pending = Some(Codes::One(Code::Text("READY".into())));
        t.status.retry = Some(Codes::One(Code::Text("READY".into())));
        assert!(t.validate().is_ok());
        assert_eq!(Code::Text("it's".into()).literal(), "'it''s'");
        assert_eq!(Code::Int(3).literal(), "3");
    }
}
