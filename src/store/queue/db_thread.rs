//! The relay's database work on a thread of its own (docs/design.md, "The database thread").
//!
//! The relay loop's claims and the recorder's result writes are round trips to the database,
//! each needing a few wake-ups: the socket turning readable, then the waiting task being run.
//! On the main runtime both wait behind the delivery tasks (hundreds at full speed), and its
//! I/O driver is polled only between batches of those tasks: at full speed a claim that took
//! the PostgreSQL server about 1 ms took the loop 3-4 ms, and the sinks waited for it. Here the
//! store's connections are opened, and its claims and result writes run, on a single-threaded
//! runtime whose thread does nothing else, so a response is read the moment it arrives.
//!
//! Guarantees: what runs here is exactly what would run on the main runtime (the same store,
//! the same statements, the same errors). A caller that stops waiting (shutdown's deadlines)
//! no longer cancels the call: it runs to its end on the thread. An abandoned claim may still
//! commit, as a claim abandoned on the server always could, and its rows wait out their claim
//! (docs/design.md, "Shutdown"); an abandoned result write still lands. The thread is started
//! once per process, on first use, and lives as long as the process.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::runtime::Handle;

use super::{Queue, WriteError};
use crate::BoxFuture;
use crate::store::model::{ClaimRequest, ClaimedRow, Completion, Probe};

/// The database thread's runtime, or why it could not be started.
static RUNTIME: OnceLock<Result<Handle, String>> = OnceLock::new();

/// The database thread's runtime, started on first use.
fn runtime() -> anyhow::Result<Handle> {
    RUNTIME
        .get_or_init(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot build the database thread's runtime: {e}"))?;
            let handle = rt.handle().clone();
            std::thread::Builder::new()
                .name("outbox-relay-db".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()))
                .map_err(|e| format!("cannot start the database thread: {e}"))?;
            Ok(handle)
        })
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// Runs `work` on the database thread and waits for it. Connections opened inside `work`
/// (connecting and warming a store) are driven by that thread from then on.
pub async fn on_db_thread<T, F>(work: F) -> anyhow::Result<T>
where
    F: Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    match runtime()?.spawn(work).await {
        Ok(result) => result,
        Err(e) => Err(anyhow::anyhow!("database thread task failed: {e}")),
    }
}

/// A queue whose claims and result writes run on the database thread.
pub struct OnDbThread(pub Arc<dyn Queue>);

impl Queue for OnDbThread {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, anyhow::Result<Vec<ClaimedRow>>> {
        let (queue, req) = (self.0.clone(), req.clone());
        Box::pin(on_db_thread(async move { queue.claim(&req).await }))
    }

    fn complete<'a>(&'a self, done: &'a [Completion]) -> BoxFuture<'a, Result<u64, WriteError>> {
        let (queue, done) = (self.0.clone(), done.to_vec());
        Box::pin(async move {
            match on_db_thread(async move { Ok(queue.complete(&done).await) }).await {
                Ok(written) => written,
                // The thread itself failed: nothing was written, and nothing about the rows
                // says the same write would fail again.
                Err(e) => Err(WriteError::nothing_written(e)),
            }
        })
    }

    fn probe<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, anyhow::Result<Probe>> {
        let (queue, req) = (self.0.clone(), req.clone());
        Box::pin(on_db_thread(async move { queue.probe(&req).await }))
    }

    fn more_behind(&self) -> bool {
        self.0.more_behind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_database_thread_and_its_errors_come_back_whole() {
        let name = on_db_thread(async { Ok(std::thread::current().name().map(String::from)) })
            .await
            .expect("runs");
        assert_eq!(name.as_deref(), Some("outbox-relay-db"));
        // The same thread every time (one per process).
        let again = on_db_thread(async { Ok(std::thread::current().id()) })
            .await
            .expect("runs");
        let once_more = on_db_thread(async { Ok(std::thread::current().id()) })
            .await
            .expect("runs");
        assert_eq!(again, once_more);
        // An error keeps its type.
        let e = on_db_thread(async {
            Err::<(), _>(anyhow::Error::new(std::io::Error::other("refused")))
        })
        .await
        .expect_err("fails");
        assert!(e.downcast_ref::<std::io::Error>().is_some(), "{e:#}");
    }

    #[tokio::test]
    async fn a_call_its_caller_stops_waiting_for_still_runs_to_its_end() {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let call = on_db_thread(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        // The caller gives up (as shutdown's deadlines do) long before the call ends.
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(5), call).await;
        assert!(gave_up.is_err());
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !done.load(std::sync::atomic::Ordering::SeqCst) && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(
            done.load(std::sync::atomic::Ordering::SeqCst),
            "the call ran on after its caller left"
        );
    }
}
