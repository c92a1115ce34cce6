//! The one place that knows every database: which folder serves a [`Dialect`]. Each database
//! implements the interfaces its callers define (the text, [`Syntax`]; opening, [`Connect`];
//! claims, [`ClaimSql`]; results, [`ResultSql`]; the schema, [`SchemaSql`]; the operator's
//! queries, [`AdminSql`]; the lock tables, [`LockSql`]), and [`Engine`] is all of them.
//! Adding a database is one folder and one line here.

use crate::store::admin::AdminSql;
use crate::store::claim::ClaimSql;
use crate::store::db::Connect;
use crate::store::locks::LockSql;
use crate::store::mysql::MySql;
use crate::store::postgres::Postgres;
use crate::store::queue::results::ResultSql;
use crate::store::schema::SchemaSql;
use crate::store::sql::{Dialect, Syntax};
use crate::store::sqlite::Sqlite;
use crate::store::sqlite::claim::SqliteClaims;

/// Everything one database provides.
pub trait Engine: Syntax + Connect + ResultSql + SchemaSql + AdminSql + LockSql {
    /// A new store's claims (they may keep state of their own).
    fn claims(&self) -> Box<dyn ClaimSql>;
}

impl Engine for Postgres {
    fn claims(&self) -> Box<dyn ClaimSql> {
        Box::new(Postgres)
    }
}

impl Engine for MySql {
    fn claims(&self) -> Box<dyn ClaimSql> {
        Box::new(MySql)
    }
}

impl Engine for Sqlite {
    fn claims(&self) -> Box<dyn ClaimSql> {
        Box::new(SqliteClaims::default())
    }
}

/// The database that serves `dialect`.
pub fn engine(dialect: Dialect) -> &'static dyn Engine {
    match dialect {
        Dialect::Postgres => &Postgres,
        Dialect::MySql { .. } => &MySql,
        Dialect::Sqlite => &Sqlite,
    }
}

#[cfg(test)]
mod tests {
    //! The table's columns rendered for each database.
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::{Code, Codes, ColumnSettings, PayloadValue, StatusSettings, TableSettings};
    use crate::store::sql::ident::bare;
    use crate::store::sql::{Columns, State};

    const PG: &dyn Syntax = &Postgres;
    const LITE: &dyn Syntax = &Sqlite;
    const MY: &dyn Syntax = &MySql;

    fn mapped() -> Columns {
        Columns::from_settings(&mapped_settings())
    }

    fn mapped_settings() -> TableSettings {
        TableSettings {
            channel_value: Some("alimtalk".into()),
            columns: ColumnSettings {
                id: Some("event_id".into()),
                status: Some("state".into()),
                ..Default::default()
            },
            status: StatusSettings {
                pending: Some(Codes::Many(vec![Code::Int(0), Code::Int(5)])),
                retry: None,
                success: Some(Code::Int(1)),
                failed: Some(Code::Int(9)),
            },
            payload_object: Some(BTreeMap::from([
                ("template_code".into(), PayloadValue::Column("tpl".into())),
                (
                    "parameters".into(),
                    PayloadValue::Object(BTreeMap::from([(
                        "it's".into(),
                        PayloadValue::Json {
                            json: "params".into(),
                        },
                    )])),
                ),
            ])),
            ..Default::default()
        }
    }

    #[test]
    fn every_dialect_has_its_engine() {
        assert_eq!(engine(Dialect::Postgres).now(), "now()");
        let mariadb = Dialect::MySql {
            mariadb: true,
            skip_locked: true,
            multi_statements: true,
        };
        assert_eq!(engine(mariadb).now(), "NOW(6)");
        assert!(engine(Dialect::Sqlite).single_writer());
    }

    #[test]
    fn every_name_of_a_mapped_table_is_quoted_for_each_database() {
        let mut c = mapped();
        c.ordering_key = Some("partition".into());
        c.recipient = Some("receiverMobileNo".into());
        let my = c.clone().quoted_for(MY);
        assert_eq!(my.ordering_key.as_deref(), Some("`partition`"));
        assert_eq!(my.recipient.as_deref(), Some("`receiverMobileNo`"));
        assert_eq!(my.id, "`event_id`");
        let pg = c.clone().quoted_for(PG);
        assert_eq!(pg.recipient.as_deref(), Some("\"receiverMobileNo\""));
        assert_eq!(pg.status, "\"state\"");
        assert!(pg.payload("o.", PG).contains("o.\"tpl\""));
        assert_eq!(bare("\"receiverMobileNo\""), "receiverMobileNo");
        // The relay's own table keeps its bare names.
        assert_eq!(Columns::default().quoted_for(PG).status, "status");
    }

    #[test]
    fn values_with_question_marks_stay_literals() {
        let mut t = TableSettings {
            channel_value: Some("hook".into()),
            columns: ColumnSettings {
                id: Some("id".into()),
                status: Some("st".into()),
                ..Default::default()
            },
            status: StatusSettings {
                pending: Some(Codes::One(Code::Text("NEW?".into()))),
                retry: None,
                success: Some(Code::Text("it's $1".into())),
                failed: Some(Code::Text("?".into())),
            },
            payload_object: Some(BTreeMap::from([(
                "vip?".into(),
                PayloadValue::Column("v".into()),
            )])),
            ..Default::default()
        };
        let c = Columns::from_settings(&t).quoted_for(PG);
        let mut q = crate::store::sql::Sql::new(&format!(
            "SELECT {} FROM t WHERE {} AND a = ",
            c.payload("", PG),
            c.open("")
        ));
        q.int(1).push(&format!(" AND {}", c.set(State::Success)));
        assert_eq!(
            q.render(PG),
            "SELECT json_build_object('vip?', (\"v\")::text) FROM t WHERE \"st\" IN ('NEW?') \
             AND a = $1 AND \"st\" = 'it''s $1'"
        );
        t.status.failed = None;
        assert!(
            c.status_name("", PG)
                .contains("WHEN \"st\" = '?' THEN 'FAILED'")
        );
    }

    #[test]
    fn a_wide_object_is_joined_where_a_call_takes_too_few_arguments() {
        let obj: BTreeMap<String, PayloadValue> = (0..150)
            .map(|i| (format!("k{i:03}"), PayloadValue::Column(format!("c{i}"))))
            .collect();
        let c = Columns::from_settings(&TableSettings {
            payload_object: Some(obj),
            ..mapped_settings()
        });
        let pg = c.payload("", PG);
        assert_eq!(pg.matches("jsonb_build_object(").count(), 3, "{pg}");
        assert!(pg.contains(" || "), "{pg}");
        assert!(!c.payload("", MY).contains("||"));
        assert_eq!(
            c.widest_object(),
            Some(("table.payload_object".into(), 150))
        );
        assert_eq!(LITE.max_object_pairs(), Some(500));
    }

    #[test]
    fn every_status_has_a_name() {
        let c = mapped();
        let name = c.status_name("", PG);
        assert!(
            name.starts_with("CASE WHEN state IS NULL THEN 'NULL'"),
            "{name}"
        );
        assert!(
            name.contains("ELSE CONCAT('UNKNOWN(', (state)::text, ')')"),
            "{name}"
        );
        assert!(
            c.state_name("o.", PG)
                .starts_with("CASE WHEN o.claimed_by = 'outbox-relay: parked")
        );
        assert_eq!(c.open_by_equalities(""), "(state = 0 OR state = 5)");
    }

    #[test]
    fn scalar_types_become_text_in_one_format() {
        assert_eq!(PG.scalar_text("d", "date"), "to_char(d, 'YYYY-MM-DD')");
        assert!(
            PG.scalar_text("t", "timestamp with time zone")
                .contains("AT TIME ZONE 'UTC'")
        );
        assert_eq!(PG.scalar_text("b", "bytea"), "encode(b, 'hex')");
        assert_eq!(PG.scalar_text("n", "numeric"), "(n)::text");
        assert!(MY.scalar_text("t", "timestamp").ends_with(", 'Z')"));
        assert_eq!(MY.scalar_text("b", "bit"), "CAST((b) + 0 AS CHAR)");
        assert!(LITE.scalar_text("x", "").contains("typeof(x) = 'blob'"));
    }

    #[test]
    fn the_default_is_the_relays_own_table() {
        let c = Columns::default();
        assert_eq!(c.open("o."), "o.status IN ('PENDING', 'RETRY')");
        assert_eq!(c.set(State::Failed), "status = 'FAILED'");
        assert_eq!(c.status_name("", PG), "status");
        assert_eq!(c.due("o.", PG), "o.next_attempt_at <= now()");
        assert_eq!(c.channel("o."), "o.channel");
        assert_eq!(
            c.any_of("", &[State::Pending, State::Retry, State::Failed]),
            "status IN ('PENDING', 'RETRY', 'FAILED')"
        );
        assert_eq!(c.channel_text("o.", PG), "o.channel");
        assert_eq!(c.attempts_read(""), "attempts");
    }

    #[test]
    fn a_mapped_table_uses_its_names_and_codes() {
        let c = mapped();
        assert_eq!(c.open("o."), "o.state IN (0, 5)");
        assert_eq!(c.is("", State::Retry), "state = 0");
        assert_eq!(c.set(State::Success), "state = 1");
        assert_eq!(c.channel("o."), "'alimtalk'");
        assert!(
            c.status_name("", LITE)
                .starts_with("CASE WHEN state IS NULL THEN 'NULL' WHEN state = 0 THEN 'PENDING'")
        );
        assert_eq!(
            c.payload("o.", PG),
            "json_build_object('parameters', json_build_object('it''s', o.params::jsonb), \
             'template_code', (o.tpl)::text)"
        );
        assert!(
            c.payload("", LITE)
                .starts_with("json_object('parameters', json_object(")
        );
        assert_eq!(c.text_or_null("", &None, PG), "NULL::text");
        let key = Some("aggregate_id".to_string());
        assert_eq!(
            c.text_or_null("o.", &key, LITE),
            "CASE WHEN typeof(o.aggregate_id) = 'blob' THEN lower(hex(o.aggregate_id)) \
             ELSE CAST(o.aggregate_id AS TEXT) END"
        );
        assert!(c.touch(PG).is_empty());
        // Retry shares the pending value 0: each value once.
        assert_eq!(
            c.any_of("", &[State::Pending, State::Retry, State::Failed]),
            "state IN (0, 5, 9)"
        );
        assert_eq!(c.channel_text("", PG), "('alimtalk')::text");
        assert_eq!(c.attempts_read("o."), "COALESCE(o.attempts, 0)");
        assert_eq!(c.time_or_null("", &None, LITE), LITE.null_text());
    }
}
