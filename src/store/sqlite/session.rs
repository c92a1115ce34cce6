//! SQLite's connection settings: `PRAGMA synchronous` (the relay's own URL parameter), WAL
//! mode, one connection for an in-memory database, one writer at a time, and errors that say
//! how to fix a database file that cannot be opened.

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Executor};

use super::Sqlite;
use crate::store::db::{Connect, Options, Refined};
use crate::store::sql::Dialect;

impl Connect for Sqlite {
    /// The relay's own commits (claims, results) wait for the WAL to reach the disk only at
    /// checkpoints (docs/design.md, "SQLite durability"). A process crash loses nothing; a
    /// power loss or OS crash can roll back its last commits, which only makes rows claimable
    /// or deliverable again (a duplicate, never a loss). `?synchronous=full` in the URL waits
    /// on every commit.
    fn options(&self, url: &str, options: AnyPoolOptions) -> Options {
        let (url, sync) = take_synchronous(url)?;
        let pragma = format!("PRAGMA synchronous = {sync}");
        let options = options.after_connect(move |conn, _| {
            let pragma = pragma.clone();
            Box::pin(async move {
                conn.execute(sqlx::AssertSqlSafe(pragma)).await?;
                Ok(())
            })
        });
        Ok((url, options))
    }

    fn opened<'a>(&'a self, pool: &'a AnyPool, url: &'a str, dialect: Dialect) -> Refined<'a> {
        Box::pin(async move {
            if !self.one_connection(url) {
                pool.execute("PRAGMA journal_mode=WAL").await?;
            }
            Ok(dialect)
        })
    }

    /// An in-memory database lives and dies with its one connection.
    fn one_connection(&self, url: &str) -> bool {
        url.contains(":memory:") || url.contains("mode=memory")
    }

    fn open_error(&self, e: anyhow::Error, url: &str) -> anyhow::Error {
        open_hint(e, url)
    }

    /// SQLite lets one connection write at a time: the relay's claims and result writes
    /// queue in process instead of meeting SQLite's busy handler (docs/design.md, "SQLite
    /// writers").
    fn single_writer(&self) -> bool {
        true
    }
}

/// Splits the relay's own `synchronous=normal|full|extra` parameter (which sqlx does not know)
/// off a SQLite URL, and returns the URL without it and the `PRAGMA synchronous` value
/// (`NORMAL` when absent). Other URLs are returned unchanged.
fn take_synchronous(url: &str) -> anyhow::Result<(String, &'static str)> {
    let mut sync = "NORMAL";
    let Some((base, query)) = url.split_once('?').filter(|_| url.starts_with("sqlite:")) else {
        return Ok((url.to_string(), sync));
    };
    let mut kept = Vec::new();
    for param in query.split('&') {
        match param.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("synchronous") => {
                sync = match value.to_ascii_lowercase().as_str() {
                    "normal" => "NORMAL",
                    "full" => "FULL",
                    "extra" => "EXTRA",
                    _ => anyhow::bail!(
                        "database.url: synchronous must be normal, full or extra, not {value:?}"
                    ),
                };
            }
            _ => kept.push(param),
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, sync))
}

/// SQLite's "unable to open database file" (`SQLITE_CANTOPEN`, 14), said so that a user can
/// act on it: for a URL without a `mode`, SQLite opens an existing file only, unless told
/// `mode=rwc` (the embedded default's URL is); with one, the likely cause is a directory
/// that does not exist, which SQLite never creates.
fn open_hint(e: anyhow::Error, url: &str) -> anyhow::Error {
    let cannot_open = e
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|d| d.code())
        .is_some_and(|code| code == "14");
    match (cannot_open, url.contains("mode=")) {
        (true, false) => e.context(
            "unable to open the SQLite database file: if it does not exist yet, add \
             `?mode=rwc` to database.url to have it created; otherwise check the path and its \
             permissions",
        ),
        // SQLite creates the file, never its directory.
        (true, true) => e.context(
            "unable to open the SQLite database file: check that the directory in \
             database.url exists and is writable",
        ),
        (false, _) => e,
    }
}
