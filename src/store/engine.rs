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
        Columns::from_settings(&TableSettings {
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
        })
    }

    #[test]
    fn every_dialect_has_its_engine() {
        assert_eq!(engine(Dialect::Postgres).now(), "now()");
        let mariadb = Dialect::MySql {
            mariadb: true,
            skip_locked: true,
        };
        assert_eq!(engine(mariadb).now(), "NOW(6)");
        assert!(engine(Dialect::Sqlite).single_writer());
    }

    #[test]
    fn keywords_are_quoted_for_each_database() {
        let mut c = Columns::default();
        c.ordering_key = Some("key".into());
        c.recipient = Some("receiverMobileNo".into());
        let my = c.clone().quoted_for(MY);
        assert_eq!(my.ordering_key.as_deref(), Some("`key`"));
        assert_eq!(my.recipient.as_deref(), Some("receiverMobileNo"));
        let pg = c.quoted_for(PG);
        assert_eq!(pg.ordering_key.as_deref(), Some("\"key\""));
        assert_eq!(bare("\"key\""), "key");
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
                .starts_with("CASE state WHEN 0 THEN 'PENDING'")
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
            "CAST(o.aggregate_id AS TEXT)"
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
