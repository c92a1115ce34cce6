//! What a sink carries and reports for tracing (docs/tracing.md): the W3C trace context a
//! request propagates ([`TraceContext`], `traceparent`/`tracestate`), and what the receiver
//! answered ([`Answer`]: an HTTP status, a vendor's code), noted by the sink for the attempt's
//! span without changing what a sink returns.
//!
//! Guarantees:
//! - a value that is not a valid W3C `traceparent` (any version, any case, any length) gives
//!   no context: the row is delivered as a fresh root, never failed for it; a `tracestate` is
//!   kept only as whole list members of printable ASCII within [`TRACESTATE_MAX`] characters
//!   (W3C lets a participant drop members past 512), so both are always valid header values;
//! - what a sink notes ([`note_http_status`], [`note_vendor_code`]) is a status or a code from
//!   a closed vocabulary, never a payload, a recipient or a secret, and costs nothing when no
//!   attempt is traced ([`answered`] not in scope).

use std::cell::RefCell;
use std::future::Future;

/// The header (and column) holding the W3C trace parent.
pub const TRACEPARENT: &str = "traceparent";
/// The header (and column) holding the W3C vendor trace state.
pub const TRACESTATE: &str = "tracestate";
/// A version-00 `traceparent`: `00-<32 hex>-<16 hex>-<2 hex>`.
pub const TRACEPARENT_LEN: usize = 55;
/// Longest `traceparent` looked at (a later version may append fields): longer is invalid.
pub const TRACEPARENT_MAX: usize = 256;
/// Most characters of `tracestate` kept (W3C: at least 512 should be propagated; beyond, whole
/// members may be dropped).
pub const TRACESTATE_MAX: usize = 512;
/// Most `tracestate` list members (W3C).
const TRACESTATE_MEMBERS: usize = 32;

/// A W3C trace context: the writer's (from the row), or the one a delivery attempt propagates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The parent's span id (the writer's span, or the attempt's own span when propagated).
    pub span_id: [u8; 8],
    /// Trace flags; bit 0 is "sampled".
    pub flags: u8,
    /// The vendor trace state, already cut to whole members within [`TRACESTATE_MAX`].
    pub state: Option<String>,
}

impl TraceContext {
    /// The context of a `traceparent` (and `tracestate`) value as stored: surrounding
    /// whitespace ignored (a `CHAR(n)` column pads). `None` when `traceparent` is not valid.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let tp = traceparent.trim().as_bytes();
        if tp.len() < TRACEPARENT_LEN || tp.len() > TRACEPARENT_MAX {
            return None;
        }
        let version = hex_byte(&tp[0..2])?;
        // Version ff is invalid; 00 has exactly four fields; a later version may append
        // fields after a dash, which this reader ignores (and answers in version 00).
        let tail_ok = match version {
            0xff => false,
            0x00 => tp.len() == TRACEPARENT_LEN,
            _ => tp.len() == TRACEPARENT_LEN || tp[TRACEPARENT_LEN] == b'-',
        };
        if !tail_ok || tp[2] != b'-' || tp[35] != b'-' || tp[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&tp[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&tp[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&tp[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
            state: tracestate.and_then(clean_state),
        })
    }

    /// The `traceparent` header value, version 00.
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(TRACEPARENT_LEN);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.span_id);
        out.push('-');
        push_hex(&mut out, &[self.flags]);
        out
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        let mut out = String::with_capacity(32);
        push_hex(&mut out, &self.trace_id);
        out
    }

    /// The span id as 16 lower-case hex digits.
    pub fn span_id_hex(&self) -> String {
        let mut out = String::with_capacity(16);
        push_hex(&mut out, &self.span_id);
        out
    }
}

/// A `tracestate` as kept: trimmed, whole members of printable ASCII with a `=` each, within
/// [`TRACESTATE_MAX`] characters and [`TRACESTATE_MEMBERS`] members; `None` when nothing
/// is left or a member is malformed (W3C: a malformed `tracestate` is discarded whole).
fn clean_state(raw: &str) -> Option<String> {
    let raw = raw.trim();
    if raw.is_empty() || !raw.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return None;
    }
    let mut out = String::new();
    let members = raw.split(',').map(str::trim).filter(|m| !m.is_empty());
    for (kept, member) in members.enumerate() {
        let (key, value) = member.split_once('=')?;
        if key.is_empty() || value.is_empty() || key.contains(' ') {
            return None;
        }
        let added = member.len() + usize::from(!out.is_empty());
        if out.len() + added > TRACESTATE_MAX || kept == TRACESTATE_MEMBERS {
            break;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(member);
    }
    (!out.is_empty()).then_some(out)
}

/// Two lower-case hex digits (W3C refuses upper case) as a byte.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
}

/// What the receiver answered one attempt, as far as its sink noted it: the attributes of the
/// attempt's span beside its outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status of the response (webhook, FCM, the Alimtalk vendors).
    pub http_status: Option<u16>,
    /// A vendor's own code: FCM's `errorCode`, an Alimtalk `resultCode`, a JetStream API
    /// error code.
    pub vendor_code: Option<String>,
}

tokio::task_local! {
    /// The answer of the attempt being traced on this task, if one is.
    static ANSWER: RefCell<Answer>;
}

/// Runs `send` (one sink's delivery), collecting what the sink notes of the answer.
pub async fn answered<F: Future>(send: F) -> (F::Output, Answer) {
    ANSWER
        .scope(RefCell::new(Answer::default()), async move {
            let out = send.await;
            let answer = ANSWER.with(|a| a.take());
            (out, answer)
        })
        .await
}

/// Notes the HTTP status of the attempt's response (a no-op when the attempt is not traced).
pub fn note_http_status(status: u16) {
    let _ = ANSWER.try_with(|a| a.borrow_mut().http_status = Some(status));
}

/// Notes a vendor's code for the attempt (a no-op when the attempt is not traced). Only codes
/// of the vendor's documented vocabulary: never text that may echo the request.
pub fn note_vendor_code(code: &str) {
    let _ = ANSWER.try_with(|a| a.borrow_mut().vendor_code = Some(code.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let c = TraceContext::parse(VALID, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"))
            .expect("valid");
        assert_eq!(c.traceparent(), VALID);
        assert_eq!(c.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.span_id_hex(), "00f067aa0ba902b7");
        assert_eq!(c.flags, 1);
        assert_eq!(
            c.state.as_deref(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        // A CHAR(n) column pads; whitespace around is not part of the value.
        assert_eq!(
            TraceContext::parse(&format!("  {VALID}   "), None).map(|c| c.traceparent()),
            Some(VALID.to_string())
        );
    }

    #[test]
    fn invalid_traceparents_give_no_context() {
        let bad = [
            "",
            "garbage",
            &VALID.to_uppercase(),
            // version ff, all-zero ids, a missing dash, a short or long version 00
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            &format!("{VALID}-extra"),
            &format!("{VALID}{}", "0".repeat(TRACEPARENT_MAX)),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-é1",
        ];
        for b in bad {
            assert_eq!(TraceContext::parse(b, Some("a=b")), None, "{b:?}");
        }
        // A later version may append fields; it is answered in version 00.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future";
        assert_eq!(
            TraceContext::parse(later, None).map(|c| c.traceparent()),
            Some(VALID.to_string())
        );
    }

    #[test]
    fn tracestate_is_kept_as_whole_valid_members_within_the_cap() {
        let state = |s: &str| TraceContext::parse(VALID, Some(s)).and_then(|c| c.state);
        assert_eq!(state(""), None);
        assert_eq!(state("novalue"), None);
        assert_eq!(state("a=1,\u{7}b=2"), None);
        assert_eq!(state(" a=1 , b=2 "), Some("a=1,b=2".into()));
        let long: Vec<String> = (0..40)
            .map(|i| format!("k{i}={}", "v".repeat(20)))
            .collect();
        let kept = state(&long.join(",")).expect("some members kept");
        assert!(kept.len() <= TRACESTATE_MAX, "{}", kept.len());
        assert!(kept.split(',').count() <= TRACESTATE_MEMBERS);
        let n = kept.split(',').count();
        assert_eq!(kept, long[..n].join(","), "whole members, from the first");
        // An invalid tracestate does not invalidate the traceparent.
        assert!(TraceContext::parse(VALID, Some("=\u{1}")).is_some());
    }

    #[tokio::test]
    async fn answers_are_noted_only_inside_a_traced_attempt() {
        note_http_status(500);
        let ((), answer) = answered(async {
            note_http_status(503);
            note_vendor_code("UNAVAILABLE");
        })
        .await;
        assert_eq!(answer.http_status, Some(503));
        assert_eq!(answer.vendor_code.as_deref(), Some("UNAVAILABLE"));
        let ((), answer) = answered(async {}).await;
        assert_eq!(answer, Answer::default());
    }
}
