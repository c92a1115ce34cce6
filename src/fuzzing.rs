//! The fuzz targets' bodies (`fuzz/`, cargo-fuzz), shared with the corpus regression test
//! (`tests/it/fuzz_corpus.rs`), so that what each target checks is written once and the
//! committed corpora run on stable in every `cargo test`.
//!
//! Each entry point takes one raw input and panics only when a promise is broken: a refusal
//! (`Err`, `Outcome::Permanent`, ...) is a correct answer to garbage. The promises: nothing
//! here panics on any input (G7 for configuration, G5 for rows and vendor answers), a
//! configuration error names a key, a reason stays short, a built body is JSON.
//!
//! Inputs with several fields separate them with a line `====` (see [`fields`]); the corpora
//! under `fuzz/corpus/<target>/` show the layout of each. Not part of the relay's interface.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use crate::config::Settings;
use crate::sink::Outcome;
use crate::sink::alimtalk::{self, NhnKeys, SolapiKeys, TemplateMessage, Verdict};
use crate::sink::http::{MAX_RETRY_AFTER, Reply, parse_retry_after, snippet};
use crate::sink::{Delivery, fcm, webhook};
use crate::store::{ClaimRequest, ClaimedRow, Undeliverable};

/// The separator of an input's fields: a line holding `====`.
pub const SEPARATOR: &[u8] = b"\n====\n";

/// The first `n` fields of `data` (missing ones empty; the last takes the rest).
pub fn fields(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out = Vec::with_capacity(n);
    let mut rest = data;
    while out.len() + 1 < n {
        match rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(i) => {
                out.push(&rest[..i]);
                rest = &rest[i + SEPARATOR.len()..];
            }
            None => break,
        }
    }
    out.push(rest);
    out.resize(n, &[]);
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A one-line header field: trimmed, `None` when empty.
fn header(b: &[u8]) -> Option<String> {
    Some(text(b).trim().to_string()).filter(|s| !s.is_empty())
}

/// An HTTP status from a decimal field (anything else: the field's first two bytes), so that
/// the fuzzer reaches every status.
fn status(b: &[u8]) -> u16 {
    match text(b).trim().parse::<u16>() {
        Ok(s) => s,
        Err(_) => u16::from_le_bytes([
            b.first().copied().unwrap_or(0),
            b.get(1).copied().unwrap_or(0),
        ]),
    }
}

/// The promises every outcome keeps, whatever the answer was.
fn check_outcome(o: &Outcome) {
    match o {
        Outcome::Delivered => {}
        Outcome::Retry { after, reason } => {
            assert!(after.is_none_or(|a| a <= MAX_RETRY_AFTER), "{after:?}");
            check_reason(reason);
        }
        Outcome::Throttle { pause, reason } => {
            assert!(*pause <= MAX_RETRY_AFTER, "{pause:?}");
            check_reason(reason);
        }
        Outcome::Permanent { reason } | Outcome::ConfigError { reason } => check_reason(reason),
    }
}

/// A reason is written to the row: never empty, and bounded whatever the answer held (the
/// answer contributes at most a snippet).
fn check_reason(reason: &str) {
    assert!(!reason.trim().is_empty(), "empty reason");
    assert!(reason.len() <= 2_000, "reason of {} bytes", reason.len());
}

/// `config`: TOML text, then `NAME=value` lines of environment. Loading and validation never
/// panic, and an error names a key.
pub fn config(data: &[u8]) {
    let f = fields(data, 2);
    let env: BTreeMap<String, String> = text(f[1])
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // The loader reads a file; one per thread, rewritten for each input.
    let path = std::env::temp_dir().join(format!(
        "outbox-relay-fuzz-{}-{:?}.toml",
        std::process::id(),
        std::thread::current().id()
    ));
    let written = std::fs::File::create(&path).and_then(|mut file| file.write_all(f[0]));
    if written.is_err() {
        return;
    }
    let result = Settings::load_with_env(Some(&path), Some(env));
    let _ = std::fs::remove_file(&path);
    if let Err(e) = result {
        // The key as given: an environment variable `OUTBOX_RELAY__ ` names the key " ".
        assert!(!e.key.is_empty(), "an error without a key: {e:?}");
        assert!(
            !e.problem.trim().is_empty(),
            "an error without a problem: {e:?}"
        );
    }
}

/// `fcm`: recipient, payload, status, `Retry-After`, response body. Building a message never
/// panics and gives a JSON body; classifying any answer never panics and keeps its reason short.
pub fn fcm(data: &[u8]) {
    let f = fields(data, 5);
    let recipient = header(f[0]);
    let payload = text(f[1]);
    for validate_only in [false, true] {
        if let Ok(body) = fcm::build_body(&payload, recipient.as_deref(), validate_only) {
            let v: serde_json::Value = serde_json::from_slice(&body).expect("a built body is JSON");
            assert!(v["message"].is_object(), "no message object");
        }
    }
    let status = status(f[2]);
    let retry_after = header(f[3]);
    let raw = text(f[4]);
    let outcome = fcm::classify(status, retry_after.as_deref(), &raw);
    check_outcome(&outcome);
    let _ = fcm::wants_new_token(status, &fcm::ErrorBody::parse(&raw));
}

/// `alimtalk`: recipient, payload, status, `Retry-After`, vendor answer. Payload checks and
/// both vendors' bodies never panic and give JSON; both vendors' reading of any answer never
/// panics and keeps its reason short.
pub fn alimtalk(data: &[u8]) {
    let f = fields(data, 5);
    let recipient = header(f[0]);
    let d = Delivery {
        id: 42,
        channel: "alimtalk".into(),
        recipient: recipient.clone(),
        payload: text(f[1]),
        attempts: 0,
        trace: None,
    };
    let (nhn, solapi) = vendors();
    if let (Ok(msg), Ok(phone)) = (
        TemplateMessage::parse(&d.payload),
        alimtalk::normalize_phone(recipient.as_deref()),
    ) {
        assert!(
            !phone.is_empty() && phone.chars().all(|c| c.is_ascii_digit()),
            "{phone:?}"
        );
        for body in [nhn.body(&d, &msg, &phone), solapi.body(&d, &msg, &phone)]
            .into_iter()
            .flatten()
        {
            serde_json::from_slice::<serde_json::Value>(&body).expect("a built body is JSON");
        }
    }
    let reply = Reply {
        status: status(f[2]),
        retry_after: header(f[3]),
        body: f[4].to_vec(),
    };
    for verdict in [
        alimtalk::interpret_nhn(&reply),
        alimtalk::interpret_solapi(&reply),
    ] {
        match verdict {
            Verdict::Definite(o) | Verdict::RetrySameKey(o) => check_outcome(&o),
            Verdict::NotSent(r) | Verdict::Unknown(r) => check_reason(&r),
        }
    }
}

/// One NHN and one Solapi account, made once.
fn vendors() -> &'static (alimtalk::Nhn, alimtalk::Solapi) {
    static VENDORS: OnceLock<(alimtalk::Nhn, alimtalk::Solapi)> = OnceLock::new();
    VENDORS.get_or_init(|| {
        let nhn = alimtalk::Nhn::new(
            alimtalk::NHN_ENDPOINT,
            &NhnKeys {
                app_key: "app".into(),
                secret_key: crate::config::Secret::new("secret"),
                sender_key: "0123456789012345678901234567890123456789".into(),
            },
            "outbox-",
        )
        .expect("a fixed, valid NHN account");
        let solapi = alimtalk::Solapi::new(
            alimtalk::SOLAPI_ENDPOINT,
            &SolapiKeys {
                api_key: "key".into(),
                api_secret: crate::config::Secret::new("secret"),
                pf_id: "KA01PF0000000000000000".into(),
                from: "0212345678".into(),
            },
            "outbox-",
        );
        (nhn, solapi)
    })
}

/// `webhook`: status, `Retry-After`, body. Classification (of the body's snippet, as the sink
/// does it) and `Retry-After` parsing never panic; a wait is never above [`MAX_RETRY_AFTER`];
/// 2xx, and only 2xx, is delivered.
pub fn webhook(data: &[u8]) {
    let f = fields(data, 3);
    let status = status(f[0]);
    let retry_after = text(f[1]);
    for now in [SystemTime::UNIX_EPOCH, SystemTime::now()] {
        if let Some(d) = parse_retry_after(&retry_after, now) {
            assert!(d <= MAX_RETRY_AFTER, "{d:?}");
        }
    }
    let header = Some(retry_after.trim()).filter(|s| !s.is_empty());
    // The sink hands classification the snippet of what it read, never the body itself.
    let outcome = webhook::classify(status, header, &snippet(&text(f[2])));
    assert_eq!(
        matches!(outcome, Outcome::Delivered),
        (200..300).contains(&status),
        "{status}: {outcome:?}"
    );
    check_outcome(&outcome);
}

/// A value of one column of a claim, as the fuzzer writes it: one line `kind:value`.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// One line per column of the claim's select list (`id`, `channel`, `recipient`, `payload`,
/// `attempts`, age, `ordering_key`, payload length, SQLite storage classes), each `null`,
/// `int:<i64>`, `real:<f64>`, `text:<utf-8>` or `blob:<bytes>`; then optionally a line
/// `max:<bytes>` (the payload limit). Anything else on a line is a blob of its bytes.
pub fn parse_row(data: &[u8]) -> (Vec<Column>, Option<u64>) {
    let mut cols = Vec::new();
    let mut max = None;
    for line in data.split(|b| *b == b'\n') {
        let s = String::from_utf8_lossy(line);
        let col = if line == b"null" {
            Column::Null
        } else if let Some(v) = s.strip_prefix("max:") {
            max = v.trim().parse().ok();
            continue;
        } else if let Some(v) = s.strip_prefix("int:") {
            match v.trim().parse() {
                Ok(i) => Column::Int(i),
                Err(_) => Column::Text(v.to_string()),
            }
        } else if let Some(v) = s.strip_prefix("real:") {
            // SQLite stores NaN as NULL: say so here, so that the payload's length, derived
            // below as the database derives it, agrees.
            match v.trim().parse::<f64>() {
                Ok(r) if !r.is_nan() => Column::Real(r),
                _ => Column::Null,
            }
        } else if let (Some(v), true) = (s.strip_prefix("text:"), std::str::from_utf8(line).is_ok())
        {
            Column::Text(v.to_string())
        } else {
            Column::Blob(line.strip_prefix(b"blob:").unwrap_or(line).to_vec())
        };
        cols.push(col);
    }
    (cols, max)
}

/// `row_decode`: a claimed row's values (see [`parse_row`]), selected from SQLite through
/// sqlx's `Any` driver, exactly as a claim returns them, then decoded by the store. Never
/// panics; a row is refused only naming a column; only an unreadable id fails it.
pub fn row_decode(data: &[u8]) {
    let (mut cols, max) = parse_row(data);
    cols.resize(9, Column::Null);
    cols.truncate(9);
    // The payload and its length come from one stored value, as the claim's SQL makes them:
    // the payload withheld (NULL) when over the limit, its length in bytes beside it.
    let len = match &cols[3] {
        Column::Null => None,
        Column::Text(t) => Some(t.len()),
        Column::Blob(b) => Some(b.len()),
        Column::Int(i) => Some(i.to_string().len()),
        Column::Real(r) => Some(r.to_string().len()),
    };
    cols[7] = len.map_or(Column::Null, |l| Column::Int(l as i64));
    let stored_payload = cols[3].clone();
    if len.is_some_and(|l| max.is_some_and(|m| l as u64 > m)) {
        cols[3] = Column::Null;
    }
    // Made once from fixed values; failing here is the harness's fault, not the input's.
    let (rt, pool) = sqlite().expect("an in-memory SQLite pool");
    let select = (1..=cols.len())
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!("SELECT {select}");
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
    for c in &cols {
        q = match c {
            Column::Null => q.bind(Option::<i64>::None),
            Column::Int(i) => q.bind(*i),
            Column::Real(r) => q.bind(*r),
            Column::Text(t) => q.bind(t.clone()),
            Column::Blob(b) => q.bind(b.clone()),
        };
    }
    let row = match rt.block_on(q.fetch_one(pool)) {
        Ok(r) => r,
        // The driver refused the values themselves: nothing of ours ran.
        Err(_) => return,
    };
    let req = ClaimRequest {
        tails: Vec::new(),
        trace: false,
        limit: 1,
        ttl: Duration::from_secs(60),
        claimer: "fuzz".into(),
        token: "t".into(),
        fence: None,
        alone: false,
        exclude_channels: Vec::new(),
        max_payload_bytes: max,
        newest: false,
        budgets: None,
    };
    match crate::store::to_claimed(&row, &req) {
        Ok(r) => check_claimed(&r, &cols, &stored_payload, max),
        Err(e) => {
            assert!(
                !matches!(cols[0], Column::Int(_)),
                "an integer id refused: {e}"
            );
            assert!(e.to_string().contains("id"), "{e}");
        }
    }
}

fn check_claimed(r: &ClaimedRow, cols: &[Column], stored_payload: &Column, max: Option<u64>) {
    if let Column::Int(id) = cols[0] {
        assert_eq!(r.delivery.id, id);
    }
    match &r.undeliverable {
        Some(Undeliverable::Unreadable(why)) => {
            assert!(why.contains("column "), "names no column: {why}");
        }
        Some(Undeliverable::TooLarge { bytes }) => {
            assert!(max.is_some_and(|m| *bytes > m), "{bytes} over {max:?}");
            assert!(
                matches!(cols[3], Column::Null),
                "{stored_payload:?} withheld"
            );
        }
        None => {
            // A row to send has its channel and payload as they were stored.
            let as_text = |c: &Column| match c {
                Column::Text(t) => Some(t.clone()),
                Column::Blob(b) => String::from_utf8(b.clone()).ok(),
                _ => None,
            };
            assert_eq!(Some(r.delivery.channel.clone()), as_text(&cols[1]));
            assert_eq!(Some(r.delivery.payload.clone()), as_text(&cols[3]));
        }
    }
}

/// An in-memory SQLite pool behind sqlx's `Any` driver, on a runtime of its own (made once;
/// `None` if it cannot be made, which no input can cause).
fn sqlite() -> Option<&'static (tokio::runtime::Runtime, sqlx::AnyPool)> {
    static DB: OnceLock<Option<(tokio::runtime::Runtime, sqlx::AnyPool)>> = OnceLock::new();
    DB.get_or_init(|| {
        sqlx::any::install_default_drivers();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        let pool = rt
            .block_on(
                sqlx::any::AnyPoolOptions::new()
                    .max_connections(1)
                    .connect("sqlite::memory:"),
            )
            .ok()?;
        Some((rt, pool))
    })
    .as_ref()
}
