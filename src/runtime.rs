//! The async runtime the relay runs on, and how many worker threads it has.
//!
//! The relay's work is split over two kinds of thread: the runtime's workers (the loop, the
//! deliveries, the HTTP connections, the lease, the endpoints) and the database thread
//! (`store::db_thread`), which runs every claim and result write and nothing else. A worker
//! per core, tokio's default, puts one thread more than there are cores to run on: the
//! database thread then preempts a worker at every response from the database, and the
//! workers wake and steal each other's tasks across cores. Giving the workers one core fewer
//! than the machine (the process's CPU quota in a container) leaves that core to the database
//! thread. Measured alternately on this repository's 2-core machine, release binary against a
//! Node receiver, 40,000 rows per drain: with one worker instead of two the relay spent 0.88x
//! the CPU per row on PostgreSQL (6 pairs; rows/s 1.06x), 0.90x on SQLite (4 pairs; 1.08x) and
//! 0.88x on MariaDB (4 pairs; 1.05x) (docs/design.md, "Threads").
//!
//! `TOKIO_WORKER_THREADS`, when set, decides instead (tokio reads it itself).

use std::num::NonZeroUsize;

/// The environment variable tokio reads for its worker count.
pub const WORKER_THREADS_ENV: &str = "TOKIO_WORKER_THREADS";

/// The multi-threaded runtime `main` runs everything on, with [`worker_threads`] workers.
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if std::env::var_os(WORKER_THREADS_ENV).is_none() {
        builder.worker_threads(worker_threads(std::thread::available_parallelism().ok()));
    }
    builder.build()
}

/// One worker per core the process may use, less the core left to the database thread; at
/// least one. `cores` is what the process may use (`None` when unknown: one worker).
pub fn worker_threads(cores: Option<NonZeroUsize>) -> usize {
    cores.map_or(1, |n| n.get().saturating_sub(1).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_core_is_left_to_the_database_thread() {
        let n = |c: usize| worker_threads(NonZeroUsize::new(c));
        assert_eq!(n(1), 1);
        assert_eq!(n(2), 1);
        assert_eq!(n(4), 3);
        assert_eq!(n(16), 15);
        assert_eq!(worker_threads(None), 1);
    }

    #[test]
    fn the_runtime_has_the_workers_it_was_given() {
        // Only when the environment does not decide (a developer may have set it).
        if std::env::var_os(WORKER_THREADS_ENV).is_some() {
            return;
        }
        let rt = build().expect("runtime");
        let want = worker_threads(std::thread::available_parallelism().ok());
        assert_eq!(rt.metrics().num_workers(), want);
    }
}
