//! The operator's queries: `status` and the table gauges' sample (`status.rs`), the verbs
//! that change rows, `enqueue`, `requeue` and `purge` (`verbs.rs`), and the console's reads
//! (`console.rs`). Each has one caller, and none is a seam anything else implements; what
//! differs between databases is each one's [`AdminSql`].

pub mod console;
pub mod status;
pub mod verbs;

use sqlx::Row;

use crate::BoxFuture;
use crate::store::db::Db;
use crate::store::sql::Sql;

/// Why `purge` (and the console's purge) cannot run on a mapped table without time columns.
pub const NO_AGE: &str = "the table maps neither table.columns.updated_at nor \
                          table.columns.created_at: purge and retention need one of them to \
                          tell a row's age";

/// What the operator's queries are on one database.
pub trait AdminSql: Send + Sync {
    /// What reads the unfinished rows' `created_at` and channel from an index: the table
    /// (with any hint), the condition, and the channel as text. By default the status
    /// condition, which the index on unfinished rows' `created_at` serves.
    fn unfinished_rows(&self, db: &Db) -> (String, String, String) {
        let c = db.cols();
        (
            db.table().to_string(),
            c.open(""),
            c.channel_text("", db.syntax()),
        )
    }

    /// `{statement} {cond}` limited to the first `n` matching rows in id order. By default
    /// the batch is picked by a subquery, and `cond` is checked by the outer statement too,
    /// so a row changed since it was picked is left alone.
    fn in_batches(&self, db: &Db, mut statement: Sql, cond: Sql, n: i64) -> Sql {
        let (t, id) = (db.table(), &db.cols().id);
        statement
            .append(cond.clone())
            .push(&format!(" AND {id} IN (SELECT {id} FROM {t} WHERE "))
            .append(cond)
            .push(&format!(" ORDER BY {id} LIMIT "))
            .int(n)
            .push(")");
        statement
    }

    /// How many ordering keys have rows held back behind an unfinished earlier row: keys
    /// with more than one unfinished row, grouped in one pass (a look-up per row for an
    /// earlier row of its key made PostgreSQL compare each row with every row of its key:
    /// 1,010,000 comparisons and 70 ms for 200 keys of 100 rows, against 4.8 ms grouped).
    fn blocked_keys(&self, db: &Db) -> Option<String> {
        blocked_keys_in(db, &format!("{} o", db.table()))
    }

    /// The relay's own index of FAILED rows, where the query must name it: (the table with
    /// its hint, a condition the index needs before the others). `None`: the plain table.
    fn failed_rows_index(&self, _db: &Db) -> Option<(String, &'static str)> {
        None
    }

    /// Tells the relays at once that rows were put back, where the database can (a hint:
    /// the rows are found by the next read anyway).
    fn announce<'a>(&'a self, _db: &'a Db) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Runs `insert` (an `INSERT` of one row) and returns the new row's id. By default with
    /// `RETURNING`.
    fn insert<'a>(&'a self, db: &'a Db, mut insert: Sql) -> BoxFuture<'a, anyhow::Result<i64>> {
        Box::pin(async move {
            insert.push(" RETURNING id");
            let r = db.query(insert).fetch_one(db.pool()).await?;
            Ok(r.try_get::<i64, _>(0)?)
        })
    }
}

/// [`AdminSql::blocked_keys`] reading `from` (the table as `o`, and how the database is to
/// read it); `None` where the table has no key.
pub fn blocked_keys_in(db: &Db, from: &str) -> Option<String> {
    let c = db.cols();
    let k = c.ordering_key.as_ref()?;
    Some(format!(
        "SELECT COUNT(*) FROM (SELECT o.{k} FROM {from} \
         WHERE {} AND o.{k} IS NOT NULL GROUP BY o.{k} HAVING COUNT(*) > 1) b",
        c.open("o."),
    ))
}
