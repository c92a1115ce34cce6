//! A transaction begun and ended in text on MySQL/MariaDB: `START TRANSACTION` goes out with
//! the first statements and `COMMIT` with the last, several statements a round trip (one
//! multi-statement text query), where sqlx's transaction costs a round trip of its own to begin
//! and another to commit (docs/design.md, "Statements as text on MySQL/MariaDB").
//!
//! Guarantees: statements run in the order given, in one round trip when every one of them is
//! text and the server takes several statements as one query (`Dialect::multi_statements`,
//! probed when the pool opens), one by one otherwise; the rows each statement returned come
//! back apart; a transaction not committed (an error, or the value dropped) never goes back to
//! the pool open: its connection is closed, and the server rolls the transaction back.

use std::future::poll_fn;

use sqlx::any::AnyRow;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AssertSqlSafe, Either};

use crate::store::db::Db;
use crate::store::sql::Stmt;

/// An open transaction on a connection of the pool (see the module).
pub struct TextTx {
    conn: PoolConnection<Any>,
    /// The server takes several statements as one query (else each goes on its own).
    multi: bool,
    /// `START TRANSACTION` went out and neither `COMMIT` nor `ROLLBACK` has come back.
    open: bool,
}

impl TextTx {
    /// Begins a transaction on a connection of `db`'s pool with `first`; the rows each of
    /// them returned.
    pub async fn begin(db: &Db, first: Vec<Stmt>) -> anyhow::Result<(TextTx, Vec<Vec<AnyRow>>)> {
        let conn = db.pool().acquire().await?;
        let multi = db.dialect().multi_statements();
        let mut tx = TextTx {
            conn,
            multi,
            open: true,
        };
        let mut all = vec![Stmt::Text("START TRANSACTION".into())];
        all.extend(first);
        // The first result is `START TRANSACTION`'s.
        let rows = tx.run(all).await?.into_iter().skip(1).collect();
        Ok((tx, rows))
    }

    /// The transaction's connection, for statements run some other way.
    pub fn conn(&mut self) -> &mut AnyConnection {
        &mut self.conn
    }

    /// Runs `stmts` in the transaction; the rows each returned.
    pub async fn run(&mut self, stmts: Vec<Stmt>) -> anyhow::Result<Vec<Vec<AnyRow>>> {
        match run_all(&mut self.conn, stmts, self.multi).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                // The server may have stopped part-way: close the connection (see Drop).
                self.conn.close_on_drop();
                Err(e)
            }
        }
    }

    /// Runs `last` and commits, in one round trip where it can; the rows each returned.
    pub async fn commit(mut self, last: Vec<Stmt>) -> anyhow::Result<Vec<Vec<AnyRow>>> {
        let mut all = last;
        all.push(Stmt::Text("COMMIT".into()));
        let mut rows = self.run(all).await?;
        self.open = false;
        rows.pop();
        Ok(rows)
    }

    /// Rolls back.
    pub async fn rollback(mut self) -> anyhow::Result<()> {
        self.run(vec![Stmt::Text("ROLLBACK".into())]).await?;
        self.open = false;
        Ok(())
    }
}

impl Drop for TextTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// Runs `stmts` on `conn` in order: as one multi-statement query when each is text and `multi`
/// says the server takes them, otherwise one by one. The rows each returned.
async fn run_all(
    conn: &mut AnyConnection,
    stmts: Vec<Stmt>,
    multi: bool,
) -> anyhow::Result<Vec<Vec<AnyRow>>> {
    let mut texts = Vec::with_capacity(stmts.len());
    for s in &stmts {
        match s {
            Stmt::Text(t) => texts.push(t.as_str()),
            Stmt::Prepared(_) => break,
        }
    }
    if !multi || texts.len() < stmts.len() {
        let mut out = Vec::with_capacity(stmts.len());
        for s in stmts {
            out.push(s.fetch_all(&mut *conn).await?);
        }
        return Ok(out);
    }
    let text = texts.join(";\n");
    let mut out = vec![Vec::new()];
    let mut results = sqlx::raw_sql(AssertSqlSafe(text)).fetch_many(&mut *conn);
    // One `Left` (the statement's result) ends each statement's rows.
    while let Some(next) = poll_fn(|cx| results.as_mut().poll_next(cx)).await {
        match next? {
            Either::Left(_) => out.push(Vec::new()),
            Either::Right(row) => {
                if let Some(rows) = out.last_mut() {
                    rows.push(row);
                }
            }
        }
    }
    out.pop();
    anyhow::ensure!(
        out.len() == stmts.len(),
        "{} statements sent, {} results read",
        stmts.len(),
        out.len()
    );
    Ok(out)
}
