//! Turning what a JetStream publish came to into an [`Outcome`] (docs/sinks.md, "nats", has
//! the same table for operators).
//!
//! | what happened | outcome |
//! |---|---|
//! | a PubAck, also one with `duplicate: true` (the stream already holds this `Nats-Msg-Id`) | Delivered |
//! | no responders on the subject: no stream captures it, or JetStream is off | ConfigError |
//! | the same within 10 s of a reconnect (a restarted server may still be recovering its streams) | Retry |
//! | 10060 the subject is in another stream than `stream`, 10059 stream not found, 10039 JetStream not enabled for the account | ConfigError |
//! | a permissions violation the server reported for the subject or the reply inbox; credentials refused | ConfigError |
//! | 10077 "maximum messages/bytes/messages per subject exceeded" (a full stream with discard new), 10023, 10002, 10028, 10047 (storage or account limits) | Throttle for 5 s |
//! | 10077 "message too large", 10054, 10097; larger than the server's `max_payload` | Permanent |
//! | no ack within the timeout, the connection lost, not connected, anything else | Retry |
//!
//! Why a full stream throttles instead of retrying: the stream is full for every row of the
//! sink, not for this one, and space comes back only when consumers catch up or messages
//! age out; counting attempts against rows would fail good rows during an ordinary backlog.

use std::time::Duration;

use crate::sink::Outcome;

/// How long a full stream (discard new) or exhausted storage pauses the sink.
pub const FULL_PAUSE: Duration = Duration::from_secs(5);

/// After a reconnect, how long "no responders" is taken for a server still recovering its
/// streams (a restart) rather than for a stream that does not exist.
pub const RECOVERY_GRACE: Duration = Duration::from_secs(10);

/// JetStream API error codes the classifier knows (nats-server's `server/errors.json`).
pub mod code {
    pub const ACCOUNT_RESOURCES_EXCEEDED: u64 = 10002;
    pub const INSUFFICIENT_RESOURCES: u64 = 10023;
    pub const MEMORY_RESOURCES_EXCEEDED: u64 = 10028;
    pub const NOT_ENABLED_FOR_ACCOUNT: u64 = 10039;
    pub const STORAGE_RESOURCES_EXCEEDED: u64 = 10047;
    pub const MESSAGE_EXCEEDS_MAXIMUM: u64 = 10054;
    pub const STREAM_NOT_FOUND: u64 = 10059;
    pub const STREAM_NOT_MATCH: u64 = 10060;
    pub const STORE_FAILED: u64 = 10077;
    pub const HEADER_EXCEEDS_MAXIMUM: u64 = 10097;
}

/// What one publish came to, as the sink saw it: the classifier's whole input.
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    /// JetStream stored the message in `stream`; `duplicate`: it already held one with this
    /// `Nats-Msg-Id` (stored by an earlier attempt), so nothing new was stored.
    Acked { stream: String, duplicate: bool },
    /// JetStream answered with an API error.
    Refused {
        status: usize,
        code: u64,
        description: String,
    },
    /// Nobody listens on the subject. `since_reconnect`: how long ago the connection came
    /// back after a loss (`None` when it never dropped).
    NoResponders { since_reconnect: Option<Duration> },
    /// No answer within the sink's timeout.
    TimedOut,
    /// The connection dropped while the answer was awaited.
    ConnectionLost,
    /// Not connected to any server: nothing was sent.
    NotConnected,
    /// Larger than the server's `max_payload`: nothing was sent.
    TooLarge { detail: String },
    /// Anything else the client reported.
    Other(String),
}

/// What else the sink knows when it classifies.
#[derive(Debug, Clone, Default)]
pub struct Context<'a> {
    /// The sink's name, for the keys named in reasons.
    pub sink: &'a str,
    /// The subject the row was published to.
    pub subject: &'a str,
    /// The configured `stream`, if any.
    pub stream: Option<&'a str>,
    /// The server's last permissions violation about this subject or the sink's reply inbox
    /// (its text), if one came lately.
    pub violation: Option<&'a str>,
    /// The server refused the credentials at the last connection attempt.
    pub auth_refused: bool,
}

/// Classifies one publish.
pub fn classify(attempt: &Attempt, cx: &Context<'_>) -> Outcome {
    let sink = cx.sink;
    let subject = cx.subject;
    let config = |reason: String| Outcome::ConfigError { reason };
    let retry = |reason: String| Outcome::Retry {
        after: None,
        reason,
    };
    // A publish the server refuses for permissions is dropped with an -ERR on the connection
    // and never answered: the client sees a timeout (or, for the reply inbox, nothing at all).
    if let Some(v) = cx.violation
        && matches!(attempt, Attempt::TimedOut | Attempt::NoResponders { .. })
    {
        return config(format!(
            "the NATS server refused it: {v} (grant the sink's user publish on the subject \
             and subscribe on _INBOX.>)"
        ));
    }
    match attempt {
        Attempt::Acked { .. } => Outcome::Delivered,
        Attempt::NoResponders { since_reconnect }
            if since_reconnect.is_some_and(|d| d < RECOVERY_GRACE) =>
        {
            retry(format!(
                "no responders on {subject} shortly after reconnecting to NATS (JetStream may \
                 still be recovering its streams)"
            ))
        }
        Attempt::NoResponders { .. } => config(format!(
            "no JetStream stream captures subject {subject} (no responders); create one, or \
             fix sinks.{sink}.subject / subject_field"
        )),
        Attempt::Refused {
            status,
            code,
            description,
        } => refused(*status, *code, description, cx),
        Attempt::TimedOut | Attempt::NotConnected if cx.auth_refused => config(format!(
            "the NATS server refused the sink's credentials (authorization violation); check \
             sinks.{sink}.credentials_file / token / user"
        )),
        Attempt::TimedOut => retry(format!("no JetStream ack for {subject} in time")),
        Attempt::NotConnected => retry("not connected to NATS; nothing was sent".into()),
        Attempt::ConnectionLost => retry(format!(
            "the NATS connection was lost before the ack for {subject}"
        )),
        Attempt::TooLarge { detail } => Outcome::Permanent {
            reason: format!("the message is larger than the NATS server accepts: {detail}"),
        },
        Attempt::Other(text) => retry(format!("publish to {subject} failed: {text}")),
    }
}

/// A JetStream API error.
fn refused(status: usize, code: u64, description: &str, cx: &Context<'_>) -> Outcome {
    let sink = cx.sink;
    let subject = cx.subject;
    let what = format!("{description} (JetStream error {code}, status {status})");
    let full = || {
        matches!(
            description,
            "maximum messages exceeded"
                | "maximum bytes exceeded"
                | "maximum messages per subject exceeded"
        )
    };
    match code {
        code::STREAM_NOT_MATCH => Outcome::ConfigError {
            reason: format!(
                "subject {subject} is not in stream {} (sinks.{sink}.stream): {what}",
                cx.stream.unwrap_or("?")
            ),
        },
        code::STREAM_NOT_FOUND | code::NOT_ENABLED_FOR_ACCOUNT => Outcome::ConfigError {
            reason: format!("publish to {subject}: {what}"),
        },
        code::STORE_FAILED if description == "message too large" => Outcome::Permanent {
            reason: format!("the stream refused the message: {what}"),
        },
        code::MESSAGE_EXCEEDS_MAXIMUM | code::HEADER_EXCEEDS_MAXIMUM => Outcome::Permanent {
            reason: format!("the stream refused the message: {what}"),
        },
        code::STORE_FAILED if full() => Outcome::Throttle {
            pause: FULL_PAUSE,
            reason: format!("the stream for {subject} is full (discard new): {what}"),
        },
        code::INSUFFICIENT_RESOURCES
        | code::ACCOUNT_RESOURCES_EXCEEDED
        | code::MEMORY_RESOURCES_EXCEEDED
        | code::STORAGE_RESOURCES_EXCEEDED => Outcome::Throttle {
            pause: FULL_PAUSE,
            reason: format!("JetStream is out of resources for {subject}: {what}"),
        },
        _ => Outcome::Retry {
            after: None,
            reason: format!("JetStream refused the publish to {subject}: {what}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context<'static> {
        Context {
            sink: "ev",
            subject: "orders.created",
            stream: Some("ORDERS"),
            violation: None,
            auth_refused: false,
        }
    }

    fn refused(code: u64, description: &str) -> Attempt {
        Attempt::Refused {
            status: 400,
            code,
            description: description.into(),
        }
    }

    #[test]
    fn an_ack_is_delivered_also_a_duplicate() {
        for duplicate in [false, true] {
            let a = Attempt::Acked {
                stream: "ORDERS".into(),
                duplicate,
            };
            assert_eq!(classify(&a, &cx()), Outcome::Delivered);
        }
    }

    #[test]
    fn no_stream_is_a_configuration_error_unless_just_reconnected() {
        let never = Attempt::NoResponders {
            since_reconnect: None,
        };
        let o = classify(&never, &cx());
        assert!(matches!(o, Outcome::ConfigError { .. }), "{o:?}");
        assert!(o.reason().contains("orders.created"), "{o:?}");
        assert!(o.reason().contains("sinks.ev.subject"), "{o:?}");
        let long_ago = Attempt::NoResponders {
            since_reconnect: Some(Duration::from_secs(60)),
        };
        assert!(matches!(
            classify(&long_ago, &cx()),
            Outcome::ConfigError { .. }
        ));
        let just_now = Attempt::NoResponders {
            since_reconnect: Some(Duration::from_secs(2)),
        };
        assert!(matches!(
            classify(&just_now, &cx()),
            Outcome::Retry { after: None, .. }
        ));
    }

    #[test]
    fn wrong_or_missing_streams_and_permissions_are_configuration_errors() {
        let o = classify(&refused(10060, "expected stream does not match"), &cx());
        assert!(matches!(o, Outcome::ConfigError { .. }), "{o:?}");
        assert!(o.reason().contains("sinks.ev.stream"), "{o:?}");
        assert!(o.reason().contains("10060"), "{o:?}");
        for (code, text) in [
            (10059, "stream not found"),
            (10039, "JetStream not enabled for account"),
        ] {
            let o = classify(&refused(code, text), &cx());
            assert!(matches!(o, Outcome::ConfigError { .. }), "{code}: {o:?}");
        }
        let violation = Context {
            violation: Some("Permissions Violation for Publish to \"orders.created\""),
            ..cx()
        };
        for a in [
            Attempt::TimedOut,
            Attempt::NoResponders {
                since_reconnect: Some(Duration::ZERO),
            },
        ] {
            let o = classify(&a, &violation);
            assert!(matches!(o, Outcome::ConfigError { .. }), "{o:?}");
            assert!(o.reason().contains("Permissions Violation"), "{o:?}");
        }
        let auth = Context {
            auth_refused: true,
            ..cx()
        };
        for a in [Attempt::TimedOut, Attempt::NotConnected] {
            let o = classify(&a, &auth);
            assert!(matches!(o, Outcome::ConfigError { .. }), "{o:?}");
            assert!(o.reason().contains("credentials"), "{o:?}");
        }
    }

    #[test]
    fn a_full_stream_with_discard_new_throttles() {
        for text in [
            "maximum messages exceeded",
            "maximum bytes exceeded",
            "maximum messages per subject exceeded",
        ] {
            let o = classify(&refused(10077, text), &cx());
            assert_eq!(
                o,
                Outcome::Throttle {
                    pause: FULL_PAUSE,
                    reason: format!(
                        "the stream for orders.created is full (discard new): {text} \
                         (JetStream error 10077, status 400)"
                    ),
                }
            );
        }
        for code in [10023, 10002, 10028, 10047] {
            let o = classify(&refused(code, "insufficient resources"), &cx());
            assert!(matches!(o, Outcome::Throttle { .. }), "{code}: {o:?}");
        }
    }

    #[test]
    fn a_message_too_large_fails_the_row() {
        for (code, text) in [
            (10077, "message too large"),
            (10054, "message size exceeds maximum allowed"),
            (10097, "header size exceeds maximum allowed of 64k"),
        ] {
            let o = classify(&refused(code, text), &cx());
            assert!(matches!(o, Outcome::Permanent { .. }), "{code}: {o:?}");
        }
        let o = classify(
            &Attempt::TooLarge {
                detail: "2000000 bytes, max_payload 1048576".into(),
            },
            &cx(),
        );
        assert!(matches!(o, Outcome::Permanent { .. }), "{o:?}");
    }

    #[test]
    fn timeouts_lost_connections_and_the_unknown_retry() {
        for a in [
            Attempt::TimedOut,
            Attempt::ConnectionLost,
            Attempt::NotConnected,
            Attempt::Other("broken pipe".into()),
            refused(10077, "stream store EOF"),
            refused(10008, "JetStream system temporarily unavailable"),
        ] {
            let o = classify(&a, &cx());
            assert!(
                matches!(o, Outcome::Retry { after: None, .. }),
                "{a:?}: {o:?}"
            );
        }
    }

    #[test]
    fn a_violation_does_not_change_other_answers() {
        let violation = Context {
            violation: Some("Permissions Violation for Publish to \"orders.created\""),
            ..cx()
        };
        let a = Attempt::Acked {
            stream: "ORDERS".into(),
            duplicate: false,
        };
        assert_eq!(classify(&a, &violation), Outcome::Delivered);
        let o = classify(&refused(10077, "maximum messages exceeded"), &violation);
        assert!(matches!(o, Outcome::Throttle { .. }), "{o:?}");
    }
}
