//! The run's own database: a private PostgreSQL cluster or MariaDB server, which faults stop
//! and start again, or a SQLite file in a directory of the run's own.

use crate::support::Db;
use crate::support::mariadb::PrivateMariaDb;
use crate::support::postgres::PrivatePostgres;

/// The run's own database server, which it stops and starts again; SQLite has none (the run
/// never restarts it).
pub enum Server {
    Postgres(PrivatePostgres),
    MariaDb(PrivateMariaDb),
    Sqlite(tempfile::TempDir),
}

impl Server {
    /// Starts one for `db`; `None` when skipped.
    pub async fn start(db: Db) -> Option<Server> {
        match db {
            Db::Postgres => PrivatePostgres::start().await.map(Server::Postgres),
            Db::MySql => PrivateMariaDb::start("+00:00").await.map(Server::MariaDb),
            Db::Sqlite => Some(Server::Sqlite(tempfile::tempdir().expect("tempdir"))),
        }
    }

    pub fn url(&self) -> String {
        match self {
            Server::Postgres(s) => s.url(),
            Server::MariaDb(s) => s.url(),
            Server::Sqlite(dir) => {
                format!("sqlite://{}/chaos.db?mode=rwc", dir.path().display())
            }
        }
    }

    /// Stops it: a crash (`pg_ctl -m immediate`, SIGKILL) or a clean shutdown. SQLite's file
    /// is never stopped (its runs deal no database restarts).
    pub async fn stop(&mut self, crash: bool) {
        match self {
            Server::Postgres(s) => s.stop(crash).await,
            Server::MariaDb(s) => s.stop(crash).await,
            Server::Sqlite(_) => {}
        }
    }

    pub async fn start_again(&mut self) {
        match self {
            Server::Postgres(s) => s.start_again().await,
            Server::MariaDb(s) => s.start_again().await,
            Server::Sqlite(_) => {}
        }
    }
}
