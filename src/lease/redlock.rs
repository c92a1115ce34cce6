//! The `redlock` lease: the `redis` lease's key, token and scripts on N independent Redis
//! servers (no replication between them), held only while a majority agrees.
//!
//! - acquire: `SET key token NX PX ttl` on every node at once, with one random token; taken
//!   when at least `N/2 + 1` nodes set it *and* the validity `ttl - elapsed - (ttl*1% + 2ms)`,
//!   measured from when this attempt started, is still positive. The grant's `sent_at` is that
//!   start, so the keeper's deadline (`sent_at + ttl - drift`) is exactly the end of the
//!   validity. A failed attempt deletes its token on *every* node at once (compare-and-`DEL`:
//!   a `SET` that timed out may still have landed), silently, so no standby wakes for nothing;
//! - renew: compare-and-`PEXPIRE` on every node; renewed only with a quorum of confirmations.
//!   More refusals than `N - quorum` mean the key is gone on too many nodes ever to be a
//!   majority again (a renewal never re-creates a key): lost. Anything else is unknown, and the
//!   keeper retries until its deadline;
//! - release: compare-and-`DEL` + `PUBLISH <key>:released` on every node;
//! - standbys wake on a release message from any node, look at every node's `PTTL` and try
//!   again once enough keys are gone (or expire) for a majority to be free;
//! - `/readyz` is ready while a quorum of nodes answers `PING`.
//!
//! Every command on one node is bounded by the node timeout `min(renew_timeout / 3, ttl / 10)`:
//! - `ttl / 10`: one slow or dead node can eat at most a tenth of the validity (the Redlock
//!   spec asks for a per-node timeout far below the ttl, so a partition cannot stall a grant);
//! - `renew_timeout / 3`: the keeper gives a whole acquire or renewal `renew_timeout`; within
//!   it, the commands on all nodes (at most one node timeout, as they run in parallel) plus the
//!   clean-up after a failed acquire (at most two: a script may need `SCRIPT LOAD` first) must
//!   fit, so that a decision is always reached before the keeper gives up on the attempt.
//!
//! A node whose connection is down fails its commands at once (fred would otherwise queue them
//! until the node timeout), so a dead node slows nothing down.
//!
//! The attempt itself runs on its own task: if the keeper stops waiting for it anyway, a grant
//! nobody received is given back at once rather than left to expire.
//!
//! Known limits (Redlock's, stated by Kleppmann and the Redis docs): the validity assumes the
//! nodes' clocks run at about the same rate as ours and that this process is not paused for
//! long; a clock jump on a node (wall clock: Redis expires keys by it), a long GC/VM/`SIGSTOP`
//! pause, or a node restarted empty (no `fsync always`, no delayed restart) can let two
//! instances believe they hold the lease at once. The relay stays safe then because every
//! claim is fenced by the database epoch the keeper bumps after each acquire (and every result
//! write by its row's claim token): once the newer holder has bumped it, the older one claims
//! nothing more; at worst a row it had already claimed is sent twice (at-least-once, never
//! lost). The lease keeps delivery on one instance; the epoch makes a wrong lease harmless.
//! Independence is the operator's job: two URLs of the same server (or of one replicated
//! group) would count twice; identical URLs are refused by the configuration.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::redis::RedisNode;
use super::{Grant, Lease, Tenure, drift};
use crate::BoxFuture;

/// A lease held on a majority of independent Redis servers.
pub struct RedlockLease {
    /// One client per node, in the order of `lease.redlock_urls` (shared with attempt tasks).
    nodes: Arc<[RedisNode]>,
    /// `N/2 + 1`: how many nodes must agree.
    quorum: usize,
    /// The lease's name (the key on every node, and the `outbox_relay_lease` row), the ttl,
    /// and our holder token while we believe we hold the lease.
    tenure: Tenure,
    /// The bound on one command on one node (see the module doc).
    node_timeout: Duration,
    /// Bumped whenever any node delivers a release message; standbys watch it.
    released: watch::Sender<u64>,
    /// The last attempt failed although some nodes had set our key (contenders split the
    /// nodes between them): the next wait starts with a random pause, so that they do not
    /// split them again in lockstep.
    contended: AtomicBool,
}

impl RedlockLease {
    /// Builds one client per URL and starts connecting in the background (nodes that are down
    /// are retried for ever; the lease works while a quorum is up).
    pub fn connect(
        urls: &[&str],
        name: &str,
        instance_id: &str,
        ttl: Duration,
        renew_timeout: Duration,
    ) -> anyhow::Result<RedlockLease> {
        if urls.len() < 3 {
            anyhow::bail!("lease.redlock_urls: at least 3 nodes are needed");
        }
        let node_timeout = (renew_timeout / 3)
            .min(ttl / 10)
            .max(Duration::from_millis(1));
        let nodes = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let what = format!("lease.redlock_urls[{i}]");
                RedisNode::connect(url, &what, name, (node_timeout, renew_timeout), true)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (released, _) = watch::channel(0u64);
        for node in &nodes {
            // Forward this node's release messages to the standbys' watch.
            let mut rx = node.message_rx();
            let channel = node.channel().to_string();
            let tx = released.clone();
            tokio::spawn(async move {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    match rx.recv().await {
                        Ok(m) if *m.channel == *channel => tx.send_modify(|n| *n += 1),
                        Ok(_) => {}
                        // Missed messages may have been releases: wake to look.
                        Err(RecvError::Lagged(_)) => tx.send_modify(|n| *n += 1),
                        Err(RecvError::Closed) => return,
                    }
                }
            });
        }
        Ok(RedlockLease {
            quorum: nodes.len() / 2 + 1,
            nodes: nodes.into(),
            tenure: Tenure::new(name, instance_id, ttl),
            node_timeout,
            released,
            contended: AtomicBool::new(false),
        })
    }

    /// The bound on one node's share of an operation: a script may take two commands
    /// (`NOSCRIPT`, then `SCRIPT LOAD` and `EVALSHA`), each bounded by the node timeout.
    fn limit(&self) -> Duration {
        self.node_timeout * 2
    }

    /// How long until a majority of nodes may be free: zero when it is now; the k-th shortest
    /// `PTTL` when k more keys must go; a short poll when unreachable nodes decide it; `max`
    /// when only keys without expiry (a foreign client's) stand in the way.
    async fn time_to_turn(&self, max: Duration) -> Duration {
        let limit = self.limit();
        let replies = on_all(&self.nodes, |n| bounded(limit, n.pttl())).await;
        let mut free = 0;
        let mut unreachable = 0;
        let mut expiring = Vec::new();
        for r in replies {
            match r {
                Ok(-2) => free += 1,
                Ok(ms) if ms >= 0 => expiring.push(ms as u64),
                Ok(_) => {} // no expiry
                Err(_) => unreachable += 1,
            }
        }
        if free >= self.quorum {
            return Duration::ZERO;
        }
        expiring.sort_unstable();
        match expiring.get(self.quorum - free - 1) {
            Some(ms) => Duration::from_millis(ms + 1).min(max),
            None if unreachable > 0 => max.min(Duration::from_millis(500)),
            None => max,
        }
    }
}

/// One node's answer to a yes/no operation, counted.
#[derive(Debug, Default)]
struct Tally {
    /// Nodes that did it (set, renewed, released).
    yes: usize,
    /// Nodes that explicitly refused (key absent or someone else's).
    no: usize,
    /// Nodes that failed or timed out, as `node i: error`.
    errors: Vec<String>,
}

impl Tally {
    fn of(replies: Vec<anyhow::Result<bool>>) -> Tally {
        let mut t = Tally::default();
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(true) => t.yes += 1,
                Ok(false) => t.no += 1,
                Err(e) => t.errors.push(format!("node {i}: {e:#}")),
            }
        }
        t
    }

    /// `2 of 3 nodes ok, 0 refused, errors: node 2: ...`.
    fn summary(&self, n: usize) -> String {
        let mut s = format!("{} of {n} nodes ok, {} refused", self.yes, self.no);
        if !self.errors.is_empty() {
            s.push_str(&format!(", errors: {}", self.errors.join("; ")));
        }
        s
    }
}

/// Runs `f` on every node at once; the outputs come back in node order.
async fn on_all<'a, T, Fut>(nodes: &'a [RedisNode], f: impl Fn(&'a RedisNode) -> Fut) -> Vec<T>
where
    Fut: Future<Output = T> + 'a,
{
    let mut futs: Vec<Pin<Box<Fut>>> = nodes.iter().map(|n| Box::pin(f(n))).collect();
    let mut out: Vec<Option<T>> = futs.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (fut, slot) in futs.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// `fut`, failing after `limit` (a backstop: fred's own command timeout comes first).
async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| anyhow::anyhow!("timed out after {limit:?}"))?
}

/// Deletes `token`'s key on every node, telling nobody (best effort: what is left expires).
async fn discard_all(nodes: &[RedisNode], token: &str, limit: Duration) {
    let t = Tally::of(on_all(nodes, |n| bounded(limit, n.discard(token))).await);
    if !t.errors.is_empty() {
        tracing::debug!(result = %t.summary(nodes.len()), "redlock clean-up incomplete; the rest expires");
    }
}

/// One acquire attempt (see the module doc), cleaning up after itself when it fails. Also
/// returns how many nodes had set the key.
async fn attempt(
    nodes: &[RedisNode],
    token: &str,
    (ttl, quorum, limit): (Duration, usize, Duration),
) -> (anyhow::Result<Option<Grant>>, usize) {
    let sent_at = Instant::now();
    let t = Tally::of(on_all(nodes, |n| bounded(limit, n.set_nx(token, ttl))).await);
    let elapsed = sent_at.elapsed();
    // Saturating: a slow attempt must come out as "no validity", never wrap around.
    let validity = ttl.saturating_sub(elapsed).saturating_sub(drift(ttl));
    if t.yes >= quorum && !validity.is_zero() {
        let grant = Grant {
            epoch: None,
            sent_at,
        };
        return (Ok(Some(grant)), t.yes);
    }
    discard_all(nodes, token, limit).await;
    let outcome = if t.yes >= quorum {
        Err(anyhow::anyhow!(
            "redlock quorum reached only after {elapsed:?}, too late for ttl {ttl:?}"
        ))
    } else if t.no > nodes.len() - quorum {
        // Held elsewhere on too many nodes for a majority: wait for a turn.
        Ok(None)
    } else {
        Err(anyhow::anyhow!(
            "redlock acquire without quorum ({quorum} needed): {}",
            t.summary(nodes.len())
        ))
    };
    (outcome, t.yes)
}

impl Lease for RedlockLease {
    fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        Box::pin(async move {
            // Not `Tenure::acquire`: the grant counts from when the attempt's task started
            // (see the module doc), and a refusal says whether the nodes were split.
            let token = self.tenure.new_token();
            let (tx, rx) = oneshot::channel();
            let nodes = self.nodes.clone();
            let knobs = (self.ttl(), self.quorum, self.limit());
            let t = token.clone();
            tokio::spawn(async move {
                let outcome = attempt(&nodes, &t, knobs).await;
                if let Err((Ok(Some(_)), _)) = tx.send(outcome) {
                    // Granted, but the keeper stopped waiting: nobody would renew it.
                    discard_all(&nodes, &t, knobs.2).await;
                }
            });
            let (outcome, took) = rx
                .await
                .map_err(|_| anyhow::anyhow!("the redlock acquire attempt was aborted"))?;
            let outcome = outcome?;
            self.contended
                .store(outcome.is_none() && took > 0, Ordering::Relaxed);
            Ok(outcome.map(|grant| self.tenure.keep(token, grant)))
        })
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(self.tenure.renew(move |hold| async move {
            let (ttl, limit, n) = (self.ttl(), self.limit(), self.nodes.len());
            let token = hold.token;
            let t = Tally::of(
                on_all(&self.nodes, |node| bounded(limit, node.renew(&token, ttl))).await,
            );
            if t.yes >= self.quorum {
                return Ok(true);
            }
            if t.no > n - self.quorum {
                // Gone on too many nodes for a majority ever again: lost. Tidy our leftovers.
                tracing::debug!(result = %t.summary(n), "redlock renewal refused");
                let nodes = self.nodes.clone();
                tokio::spawn(async move { discard_all(&nodes, &token, limit).await });
                return Ok(false);
            }
            anyhow::bail!(
                "redlock renewal without quorum ({} needed): {}",
                self.quorum,
                t.summary(n)
            )
        }))
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.tenure.release(move |hold| async move {
            let limit = self.limit();
            let t =
                Tally::of(on_all(&self.nodes, |n| bounded(limit, n.release(&hold.token))).await);
            if !t.errors.is_empty() {
                anyhow::bail!(
                    "redlock release incomplete ({}); the rest expires",
                    t.summary(self.nodes.len())
                );
            }
            Ok(())
        }))
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let end = Instant::now() + max;
            // Listen first, then look: a release between the two is still seen.
            let mut rx = self.released.subscribe();
            if self.contended.swap(false, Ordering::Relaxed) {
                let ms = self.limit().as_millis().max(1) as u64;
                let pause = Duration::from_millis(rand::random::<u64>() % ms);
                tokio::time::sleep(pause.min(max)).await;
            }
            loop {
                let left = end.saturating_duration_since(Instant::now());
                let wait = self.time_to_turn(left).await;
                if wait.is_zero() {
                    return;
                }
                let until = (Instant::now() + wait).min(end);
                tokio::select! {
                    // A release on some node: look again (the others may still hold).
                    Ok(()) = rx.changed() => {}
                    _ = tokio::time::sleep_until(until) => return,
                }
                if Instant::now() >= end {
                    return;
                }
            }
        })
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let limit = self.limit();
            let replies = on_all(&self.nodes, |n| bounded(limit, n.ping())).await;
            let t = Tally::of(replies.into_iter().map(|r| r.map(|()| true)).collect());
            if t.yes >= self.quorum {
                Ok(())
            } else {
                anyhow::bail!(
                    "only {} of {} redlock nodes answer ({} needed): {}",
                    t.yes,
                    self.nodes.len(),
                    self.quorum,
                    t.errors.join("; ")
                )
            }
        })
    }
}
