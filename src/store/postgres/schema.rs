//! PostgreSQL's schema: the relay's own table and its migrations, the lease table, and what
//! `migrate --adopt` adds to a mapped table. DDL is transactional here: migrations run in one
//! transaction under an advisory lock.

use sqlx::Executor;

use super::Postgres;
use super::notify::{notify_channel, notify_statements, notify_trigger};
use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::schema;
use crate::store::schema::{
    ClaimSupport, ColumnTypes, Conn, SchemaSql, channel_due_index, failed_index, partial_indexes,
};
use crate::store::sql::Sql;

impl SchemaSql for Postgres {
    fn lock<'a>(&'a self, conn: &'a mut Conn) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            conn.execute("BEGIN").await?;
            if let Err(e) = conn.execute("SELECT pg_advisory_xact_lock(7424319)").await {
                let _ = conn.execute("ROLLBACK").await;
                return Err(e.into());
            }
            Ok(())
        })
    }

    fn unlock<'a>(&'a self, conn: &'a mut Conn, ok: bool) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            if ok {
                conn.execute("COMMIT").await?;
            } else {
                let _ = conn.execute("ROLLBACK").await;
            }
            Ok(())
        })
    }

    fn steps(&self, t: &str, version: i64) -> Vec<String> {
        match version {
            1 => schema_v1(t),
            2 => vec![channel_due_index(t)],
            // Leave room in each page, so that claims (which change no indexed column) are
            // HOT updates that write no index entries. Applies to pages written from now on;
            // nothing is rewritten.
            4 => vec![format!("ALTER TABLE {t} SET (fillfactor = 85)")],
            6 => vec![failed_index(t)],
            // Room for a claimed copy of every row of a page. A claim takes rows in id order,
            // so it updates most rows of a page in one statement, and a HOT update needs room
            // for the new version on the same page: at 85% only the first few rows of each
            // page fit, and every other claimed row wrote an entry into each of the table's
            // five indexes. A claimed copy is the row plus about 60 bytes of claim columns,
            // so 40% leaves room for all of them for payloads from about 80 bytes up
            // (docs/design.md, "HOT claims"). Pages written from now on; nothing is rewritten.
            7 => vec![format!("ALTER TABLE {t} SET (fillfactor = 40)")],
            // The writer's W3C trace context (docs/tracing.md): NULLable, no default, so the
            // change is instant and the application's inserts are untouched.
            12 => vec![format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS traceparent TEXT NULL, \
                 ADD COLUMN IF NOT EXISTS tracestate TEXT NULL"
            )],
            _ => Vec::new(),
        }
    }

    fn lease_table(&self) -> String {
        schema::lease_table("TEXT", "TEXT", "TIMESTAMPTZ", "")
    }

    fn table_exists(&self, table: &str) -> Sql {
        let mut q = Sql::new("SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass(");
        q.text(table).push(")");
        q
    }

    /// The table the server resolves the quoted name to (through `search_path`, as every
    /// statement on it does), exactly: not folded to lower case.
    fn live_columns(&self, table: &str) -> Sql {
        let mut q = Sql::new(
            "SELECT c.column_name::text, c.data_type::text, c.udt_name::text, \
             c.character_maximum_length::bigint, c.is_nullable::text, c.collation_name::text, \
             NULL::text FROM information_schema.columns c \
             JOIN pg_class r ON r.relname::text = c.table_name::text \
             JOIN pg_namespace n ON n.oid = r.relnamespace \
             AND n.nspname::text = c.table_schema::text \
             WHERE r.oid = to_regclass(quote_ident(",
        );
        q.text(table).push(")) ORDER BY c.ordinal_position");
        q
    }

    fn table_names(&self) -> Sql {
        Sql::new(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = current_schema()",
        )
    }

    /// Quoted names are case-sensitive.
    fn resolves(&self, configured: &str, live: &str) -> bool {
        configured == live
    }

    fn enum_labels(&self, udt: &str) -> Option<Sql> {
        let mut q = Sql::new(
            "SELECT e.enumlabel::text FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid \
             WHERE t.typname::text = ",
        );
        q.text(udt).push(" ORDER BY e.enumsortorder");
        Some(q)
    }

    /// On the table the server resolves the name to, in whatever schema.
    fn object_exists(&self, table: &str, name: &str, trigger: bool) -> Sql {
        let mut q = Sql::new(match trigger {
            true => {
                "SELECT COUNT(*) FROM pg_trigger WHERE NOT tgisinternal \
                 AND tgrelid = to_regclass(quote_ident("
            }
            false => {
                "SELECT COUNT(*) FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid \
                 WHERE i.indrelid = to_regclass(quote_ident("
            }
        });
        let what = if trigger { "tgname" } else { "x.relname" };
        q.text(table)
            .push(&format!(")) AND {what}::text = "))
            .text(name);
        q
    }

    fn embedded_json_typed(&self) -> bool {
        true
    }

    fn column_types(&self) -> ColumnTypes {
        ColumnTypes {
            claimer: "TEXT NULL",
            token: "TEXT NULL",
            time: "TIMESTAMPTZ NULL",
            attempts: "INT NOT NULL DEFAULT 0",
        }
    }

    fn claim_support(&self, db: &Db) -> ClaimSupport {
        partial_indexes(db)
    }

    fn notify_trigger(&self, db: &Db) -> Option<(String, Vec<String>)> {
        let (name, sql) = db.object("notify");
        let channel = notify_channel(db.table_name());
        Some((name, notify_statements(db.table(), &sql, &channel)))
    }
}

/// Schema version 1.
fn schema_v1(t: &str) -> Vec<String> {
    let keyed = "WHERE ordering_key IS NOT NULL AND status IN ('PENDING', 'RETRY')";
    let time = "TIMESTAMPTZ";
    let table = schema::table_v1(t, "BIGSERIAL PRIMARY KEY", "JSONB", "INT", time, "now()");
    std::iter::once(table)
        .chain(schema::indexes_v1(t, keyed))
        // A queue table: every row is updated soon after insert. The default autovacuum
        // thresholds (20% / 10% of the table) let dead entries pile up in the partial due
        // index and let statistics go stale after a burst, which flips the claim's plan to a
        // primary-key walk or a sort of the whole backlog (docs/performance-log.md). Vacuum
        // and analyze this table after 1% of it changed.
        .chain([format!(
            "ALTER TABLE {t} SET (autovacuum_vacuum_scale_factor = 0.01,
             autovacuum_analyze_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
             autovacuum_analyze_threshold = 1000)"
        )])
        .chain([Postgres.lease_table()])
        .chain(notify_trigger(t))
        .collect()
}
