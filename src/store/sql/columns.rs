//! [`Columns`]: the one place that knows the table's column names and status values. Every
//! statement of the store names columns and states through it, so that the relay runs on its
//! own table (the default, identical to the schema it creates) or on an application's existing
//! table mapped by `[table]` (docs/adopting-a-table.md).
//!
//! Guarantees:
//! - names and literals come only from the validated configuration, never from rows or the
//!   command line; on a mapped table every name is quoted the database's own way
//!   ([`Columns::quoted_for`], `ident.rs`), and status values are SQL string literals
//!   (quotes doubled; no backslash or control character), which the statement builder never
//!   takes for placeholders;
//! - an assembled payload is built by the database (`payload.rs`), never by concatenating
//!   text, so every value is escaped as JSON;
//! - an optional column that is not mapped is never named: reads give NULL, writes skip it;
//! - every status a row can hold has a name ([`Columns::state_name`]): a state's, `NULL`,
//!   `UNKNOWN(<value>)` for a value no state maps, or `PARKED` for a row whose result the
//!   database refused (docs/design.md, "9a. Mapped tables").

use std::collections::BTreeMap;

use super::dialect::Syntax;
use super::ident::{quote, quote_object};
use super::payload::{LiveType, Payload};
use crate::config::{Code, TableSettings, sql_string};
use crate::store::model::PARKED_BY;

/// A state of the relay's state machine (docs/design.md, "The table and its states").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Retry,
    Success,
    Failed,
}

impl State {
    pub const ALL: [State; 4] = [State::Pending, State::Retry, State::Success, State::Failed];

    /// The relay's name for it (what `status` and the metrics show).
    pub fn name(self) -> &'static str {
        match self {
            State::Pending => "PENDING",
            State::Retry => "RETRY",
            State::Success => "SUCCESS",
            State::Failed => "FAILED",
        }
    }
}

/// The table's columns and status values (see the module doc).
#[derive(Debug, Clone)]
pub struct Columns {
    /// An existing table mapped by `[table]`, not the relay's own.
    pub mapped: bool,
    pub id: String,
    /// The channel column; `None` with a constant channel.
    channel: Option<String>,
    /// The text around the channel column where it must be compared as text (the
    /// database compares its type with no text, see [`Syntax::compares_with_text`]).
    channel_as_text: Option<(String, String)>,
    /// The constant channel, as an SQL literal.
    channel_value: Option<String>,
    pub recipient: Option<String>,
    payload: Payload,
    pub status: String,
    pub attempts: String,
    pub next_attempt_at: String,
    pub last_error: Option<String>,
    pub created_at: Option<String>,
    pub ordering_key: Option<String>,
    pub updated_at: Option<String>,
    pub sent_at: String,
    /// The writer's W3C trace context (docs/tracing.md): claimed only when a claim asks for
    /// it (`ClaimRequest::trace`, tracing on), so a claim without it reads nothing more.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// SQL literals per state; the first is the one written.
    codes: [Vec<String>; 4],
    /// The values per state as configured (for the live check).
    values: [Vec<Code>; 4],
    /// The server's type of mapped columns read as text (by their SQL form), once the live
    /// table was read ([`Columns::with_types`]).
    types: BTreeMap<String, LiveType>,
    /// PostgreSQL: the table has (or `migrate --adopt` installs) the NOTIFY trigger.
    pub notify: bool,
    /// Which columns are the relay's bookkeeping on a mapped table (not mapped by it).
    pub owned: Owned,
}

/// Which of the columns a mapped table may lack are the relay's own bookkeeping (added by
/// `migrate --adopt`) rather than the table's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    pub attempts: bool,
    pub next_attempt_at: bool,
    pub sent_at: bool,
}

impl Default for Columns {
    /// The relay's own table.
    fn default() -> Self {
        let own = |s: &str| s.to_string();
        Columns {
            mapped: false,
            id: own("id"),
            channel: Some(own("channel")),
            channel_as_text: None,
            channel_value: None,
            recipient: Some(own("recipient")),
            payload: Payload::Column(own("payload")),
            status: own("status"),
            attempts: own("attempts"),
            next_attempt_at: own("next_attempt_at"),
            last_error: Some(own("last_error")),
            created_at: Some(own("created_at")),
            ordering_key: Some(own("ordering_key")),
            updated_at: Some(own("updated_at")),
            sent_at: own("sent_at"),
            traceparent: Some(own("traceparent")),
            tracestate: Some(own("tracestate")),
            codes: State::ALL.map(|s| vec![sql_string(s.name())]),
            values: State::ALL.map(|s| vec![Code::Text(s.name().into())]),
            types: BTreeMap::new(),
            notify: true,
            owned: Owned::default(),
        }
    }
}

impl Columns {
    /// The mapping `[table]` describes (validated by the configuration).
    pub fn from_settings(t: &TableSettings) -> Columns {
        if !t.is_mapped() {
            return Columns::default();
        }
        let c = &t.columns;
        let list = |c: &Option<crate::config::Codes>| match c {
            Some(crate::config::Codes::One(x)) => vec![x.clone()],
            Some(crate::config::Codes::Many(v)) => v.clone(),
            None => Vec::new(),
        };
        let pending = list(&t.status.pending);
        let retry = match list(&t.status.retry) {
            // No retry state of its own: a retried row goes back to pending (with its
            // next_attempt_at in the future).
            r if r.is_empty() => pending.iter().take(1).cloned().collect(),
            r => r,
        };
        let one = |c: &Option<Code>| c.iter().cloned().collect::<Vec<_>>();
        let values = [
            pending,
            retry,
            one(&t.status.success),
            one(&t.status.failed),
        ];
        let lits = |codes: &Vec<Code>| codes.iter().map(Code::literal).collect::<Vec<_>>();
        Columns {
            mapped: true,
            id: c.id.clone().unwrap_or_else(|| "id".into()),
            channel: c.channel.clone(),
            channel_as_text: None,
            channel_value: t.channel_value.as_deref().map(sql_string),
            recipient: c.recipient.clone(),
            payload: match (&c.payload, &t.payload_object) {
                (_, Some(obj)) => Payload::Object(obj.clone()),
                (Some(p), None) => Payload::Column(p.clone()),
                (None, None) => Payload::Column("payload".into()),
            },
            status: c.status.clone().unwrap_or_else(|| "status".into()),
            // Bookkeeping columns `migrate --adopt` adds when the table has none of its own.
            attempts: c.attempts.clone().unwrap_or_else(|| "attempts".into()),
            next_attempt_at: c
                .next_attempt_at
                .clone()
                .unwrap_or_else(|| "next_attempt_at".into()),
            last_error: c.last_error.clone(),
            created_at: c.created_at.clone(),
            ordering_key: c.ordering_key.clone(),
            updated_at: c.updated_at.clone(),
            sent_at: c.sent_at.clone().unwrap_or_else(|| "sent_at".into()),
            // Optional, and never added by `migrate --adopt`: the table's own or none.
            traceparent: c.traceparent.clone(),
            tracestate: c.tracestate.clone(),
            codes: [
                lits(&values[0]),
                lits(&values[1]),
                lits(&values[2]),
                lits(&values[3]),
            ],
            values,
            types: BTreeMap::new(),
            notify: t.notify_trigger.unwrap_or(false),
            owned: Owned {
                attempts: c.attempts.is_none(),
                next_attempt_at: c.next_attempt_at.is_none(),
                sent_at: c.sent_at.is_none(),
            },
        }
    }

    /// A one-line summary for `check-config`.
    pub fn describe(&self) -> String {
        let codes: Vec<String> = State::ALL
            .iter()
            .map(|s| format!("{}={}", s.name(), self.codes[*s as usize].join("|")))
            .collect();
        let opt = |c: &Option<String>| c.clone().unwrap_or_else(|| "-".into());
        format!(
            "id={} channel={} recipient={} payload={} status={} [{}] attempts={} \
             next_attempt_at={} last_error={} created_at={} ordering_key={} updated_at={} \
             sent_at={} traceparent={} tracestate={}",
            self.id,
            self.channel(""),
            opt(&self.recipient),
            match &self.payload {
                Payload::Column(c) => c.clone(),
                Payload::Object(_) => "<object>".into(),
            },
            self.status,
            codes.join(" "),
            self.attempts,
            self.next_attempt_at,
            opt(&self.last_error),
            opt(&self.created_at),
            opt(&self.ordering_key),
            opt(&self.updated_at),
            self.sent_at,
            opt(&self.traceparent),
            opt(&self.tracestate)
        )
    }

    /// What the status column may be, by the values mapped: (integer ok, text ok). Integers
    /// written as TOML numbers need an integer column (PostgreSQL compares no text column
    /// with a number); digits given as strings (as every value from the environment is) fit
    /// either, since every database converts a quoted literal to the column's type.
    pub fn status_kinds(&self) -> (bool, bool) {
        let all = || self.values.iter().flatten();
        if all().all(|v| matches!(v, Code::Int(_))) {
            (true, false)
        } else if all().all(|v| v.to_string().trim().parse::<i64>().is_ok()) {
            (true, true)
        } else {
            (false, true)
        }
    }

    /// The values of state `s` as configured (the first is the one written).
    pub fn values(&self, s: State) -> &[Code] {
        &self.values[s as usize]
    }

    /// The same mapping with every name quoted the database's way (a mapped table; the
    /// relay's own keeps its bare names): a column named like a keyword (`key`, `order`,
    /// `partition`) or spelled in mixed case (`receiverMobileNo`, which PostgreSQL would
    /// fold to lower case unquoted) is used exactly as configured. The live check resolves
    /// every name the same way first (`schema/check.rs`).
    pub fn quoted_for(mut self, s: &dyn Syntax) -> Columns {
        if !self.mapped {
            return self;
        }
        let q = |n: &mut String| *n = quote(s, n);
        let qo = |n: &mut Option<String>| {
            if let Some(n) = n {
                *n = quote(s, n);
            }
        };
        q(&mut self.id);
        qo(&mut self.channel);
        qo(&mut self.recipient);
        q(&mut self.status);
        q(&mut self.attempts);
        q(&mut self.next_attempt_at);
        qo(&mut self.last_error);
        qo(&mut self.created_at);
        qo(&mut self.ordering_key);
        qo(&mut self.updated_at);
        q(&mut self.sent_at);
        qo(&mut self.traceparent);
        qo(&mut self.tracestate);
        self.payload = match self.payload {
            Payload::Column(c) => Payload::Column(quote(s, &c)),
            Payload::Object(obj) => Payload::Object(quote_object(s, obj)),
        };
        self
    }

    /// The same mapping knowing the server's type of its columns (`types`: lower-case type
    /// name by the column's SQL form), so that each is read as text in its type's format.
    pub fn with_types(mut self, types: BTreeMap<String, LiveType>, s: &dyn Syntax) -> Columns {
        self.types = types;
        self.channel_as_text = match &self.channel {
            Some(c) if !s.compares_with_text(self.type_of(c)) => s
                .cast_text("\u{0}")
                .split_once('\u{0}')
                .map(|(before, after)| (before.to_string(), after.to_string())),
            _ => None,
        };
        self
    }

    /// The server's type of a column (by its SQL form), empty when unknown.
    pub fn type_of(&self, col: &str) -> &str {
        self.types.get(col).map_or("", |t| t.ty.as_str())
    }

    /// The most characters a column (by its SQL form) holds, where the live table says.
    pub fn max_len_of(&self, col: &str) -> Option<i64> {
        self.types.get(col).and_then(|t| t.max_len)
    }

    /// The channel column, if the channel is not a constant.
    pub fn channel_column(&self) -> Option<&str> {
        self.channel.as_deref()
    }

    /// The channel of row `a` (a column, or the constant as a literal), as it compares with
    /// a sink's name.
    pub fn channel(&self, a: &str) -> String {
        match (&self.channel, &self.channel_value) {
            (Some(c), _) => match &self.channel_as_text {
                Some((before, after)) => format!("{before}{a}{c}{after}"),
                None => format!("{a}{c}"),
            },
            (None, Some(v)) => v.clone(),
            (None, None) => "NULL".into(),
        }
    }

    /// An optional text column of row `a`, or a typed NULL when the table has none.
    pub fn text_or_null(&self, a: &str, col: &Option<String>, s: &dyn Syntax) -> String {
        match col {
            // A mapped column may be of any type (a number, a VARCHAR): read it as text.
            Some(c) if self.mapped => s.scalar_text(&format!("{a}{c}"), self.type_of(c)),
            Some(c) => format!("{a}{c}"),
            None => s.null_text().to_string(),
        }
    }

    /// `<status> IN (<pending and retry values>)`: the row is unfinished.
    pub fn open(&self, a: &str) -> String {
        self.any_of(a, &[State::Pending, State::Retry])
    }

    /// [`Columns::open`] written as equalities joined by `OR` (the same rows), for
    /// expressions a database accepts no `IN` in (MariaDB's indexed virtual columns over a
    /// `CHAR(n)` status, see `mysql/open_index.rs`).
    pub fn open_by_equalities(&self, a: &str) -> String {
        let mut values: Vec<&str> = Vec::new();
        for v in [State::Pending, State::Retry]
            .iter()
            .flat_map(|s| &self.codes[*s as usize])
        {
            if !values.contains(&v.as_str()) {
                values.push(v);
            }
        }
        let eq: Vec<String> = values
            .iter()
            .map(|v| format!("{a}{} = {v}", self.status))
            .collect();
        format!("({})", eq.join(" OR "))
    }

    /// `<status> IN (<every value of these states>)`, each value once (a retry state that
    /// shares the pending value is one value): one condition the status index can serve.
    pub fn any_of(&self, a: &str, states: &[State]) -> String {
        let mut values: Vec<&str> = Vec::new();
        for v in states.iter().flat_map(|s| &self.codes[*s as usize]) {
            if !values.contains(&v.as_str()) {
                values.push(v);
            }
        }
        format!("{a}{} IN ({})", self.status, values.join(", "))
    }

    /// The channel of row `a` as text: the relay's own column as it is (so its indexes
    /// serve), a mapped column or a constant cast (a mapped column may be of another type).
    pub fn channel_text(&self, a: &str, s: &dyn Syntax) -> String {
        match (&self.channel, self.mapped) {
            (Some(c), false) => format!("{a}{c}"),
            _ => s.cast_text(&self.channel(a)),
        }
    }

    /// Row `a`'s attempt count; a mapped table's may be NULL (rows the application wrote
    /// before adoption): it counts as 0, as [`Columns::count_attempt`] counts it.
    pub fn attempts_read(&self, a: &str) -> String {
        let col = format!("{a}{}", self.attempts);
        if self.mapped {
            format!("COALESCE({col}, 0)")
        } else {
            col
        }
    }

    /// An optional time column of row `a` as UTC text, or a typed NULL when the table has
    /// none.
    pub fn time_or_null(&self, a: &str, col: &Option<String>, s: &dyn Syntax) -> String {
        match col {
            Some(c) => s.time_text(&format!("{a}{c}")),
            None => s.null_text().to_string(),
        }
    }

    /// `<status> IN (<the state's values>)`.
    pub fn is(&self, a: &str, s: State) -> String {
        let values = &self.codes[s as usize];
        if values.len() == 1 {
            format!("{a}{} = {}", self.status, values[0])
        } else {
            format!("{a}{} IN ({})", self.status, values.join(", "))
        }
    }

    /// `<status> = <the value written for the state>`, for SET clauses.
    pub fn set(&self, s: State) -> String {
        let v = self.codes[s as usize]
            .first()
            .map_or("NULL", |v| v.as_str());
        format!("{} = {v}", self.status)
    }

    /// The relay's name of row `a`'s status (`PENDING`, ...), whatever the table stores: on a
    /// mapped table a NULL shows as `NULL` and a value that is no state's as
    /// `UNKNOWN(<value>)` (the relay never claims either; docs/adopting-a-table.md).
    pub fn status_name(&self, a: &str, s: &dyn Syntax) -> String {
        if !self.mapped {
            return format!("{a}{}", self.status);
        }
        let col = format!("{a}{}", self.status);
        let mut out = format!("CASE WHEN {col} IS NULL THEN 'NULL'");
        for s in State::ALL {
            for v in &self.codes[s as usize] {
                out.push_str(&format!(" WHEN {col} = {v} THEN '{}'", s.name()));
            }
        }
        out.push_str(&format!(
            " ELSE CONCAT('UNKNOWN(', {}, ')') END",
            s.cast_text(&col)
        ));
        // A retry that goes back to pending matches PENDING first, which is what it is.
        out
    }

    /// [`Columns::status_name`], or `PARKED` for a row the relay parked because the database
    /// refused every result for it ([`Columns::parked`]).
    pub fn state_name(&self, a: &str, s: &dyn Syntax) -> String {
        format!(
            "CASE WHEN {} THEN 'PARKED' ELSE {} END",
            self.parked(a),
            self.status_name(a, s)
        )
    }

    /// The condition that row `a` is parked: claimed by the marker the relay writes when the
    /// database refused every result for the row (docs/design.md, "Results"). Claims never
    /// take it again (its claim runs a year); `requeue` brings it back.
    pub fn parked(&self, a: &str) -> String {
        format!("{a}claimed_by = {}", sql_string(PARKED_BY))
    }

    /// `attempts = attempts + 1` (a mapped table's count may be NULL: it counts from 0).
    pub fn count_attempt(&self) -> String {
        let a = &self.attempts;
        if self.mapped {
            format!("{a} = COALESCE({a}, 0) + 1")
        } else {
            format!("{a} = {a} + 1")
        }
    }

    /// The condition that row `a` is due. On a mapped table, a NULL `next_attempt_at` (the
    /// bookkeeping column `migrate --adopt` adds, NULL for the application's rows) is due.
    pub fn due(&self, a: &str, s: &dyn Syntax) -> String {
        let col = format!("{a}{}", self.next_attempt_at);
        if self.mapped {
            format!("({col} IS NULL OR {})", s.due(&col))
        } else {
            s.due(&col)
        }
    }

    /// `, updated_at = now` when the table has an `updated_at`.
    pub fn touch(&self, s: &dyn Syntax) -> String {
        match &self.updated_at {
            Some(u) => format!(", {u} = {}", s.now()),
            None => String::new(),
        }
    }

    /// The time column `purge` and `failed` go by: `updated_at`, else `sent_at`'s row
    /// creation time `created_at`; `None` when the table has neither.
    pub fn changed_at(&self) -> Option<&str> {
        self.updated_at.as_deref().or(self.created_at.as_deref())
    }

    /// The payload of row `a` as JSON (a column, or the object built by the database).
    pub fn payload(&self, a: &str, s: &dyn Syntax) -> String {
        self.payload.render(a, s, &self.types)
    }

    /// The columns the payload is read from (for the live check): (key, column SQL form,
    /// embedded as JSON).
    pub fn payload_columns(&self) -> Vec<(String, String, bool)> {
        self.payload.columns()
    }

    /// The key and pair count of the payload's widest object, if it is built from columns.
    pub fn widest_object(&self) -> Option<(String, usize)> {
        self.payload.widest_object()
    }

    /// Whether the payload is one column the relay may insert into (`enqueue`).
    pub fn payload_column(&self) -> Option<&str> {
        match &self.payload {
            Payload::Column(c) => Some(c),
            Payload::Object(_) => None,
        }
    }
}
