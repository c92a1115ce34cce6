//! The `redis` lease: one Redis key holding a random holder token, Redisson-style but fenced.
//!
//! - acquire: `SET key token NX PX ttl` (a plain string, so a Redlock client in another
//!   language that locks the same key excludes the relay, and the relay excludes it);
//! - renew (the keeper's watchdog, every ttl/3): a compare-and-`PEXPIRE` script, so a renewal
//!   never re-creates a key that expired or belongs to someone else;
//! - release: a compare-and-`DEL` script that also `PUBLISH`es `<key>:released`, after the
//!   keeper has stopped the watchdog;
//! - standbys wait on that channel (re-subscribed after reconnects) and otherwise retry when the
//!   key's `PTTL` runs out.
//!
//! Every command is bounded by `lease.renew_timeout` and sent at most once: fred's default of
//! re-sending a command after a reconnect could apply a lease operation twice, so it is off.
//!
//! The per-server primitives live in [`RedisNode`], which the `redlock` backend runs on each of
//! its nodes.

use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use fred::types::scripts::Script;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::{Grant, Lease, Tenure};
use crate::BoxFuture;

/// Extends the key only if it still holds our token. Returns 1 or 0.
const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

/// Deletes the key only if it still holds our token, and tells standbys. Returns 1 or 0.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    redis.call('DEL', KEYS[1]); redis.call('PUBLISH', KEYS[1] .. ':released', ARGV[1]); \
    return 1 else return 0 end";

/// Deletes the key only if it still holds our token, telling nobody (a grant we never had:
/// waking standbys for it would only make them retry in vain). Returns 1 or 0.
const DISCARD: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('DEL', KEYS[1]) else return 0 end";

/// One Redis server's share of a lease: the key, the release channel and the scripts that
/// operate on them, each command sent at most once and bounded by the command timeout.
pub(super) struct RedisNode {
    /// The command connection.
    client: Client,
    /// A separate connection subscribed to [`RedisNode::channel`] (pub/sub needs its own).
    subscriber: SubscriberClient,
    /// The Redis key (the lease name).
    key: String,
    /// `<key>:released`, published on release.
    channel: String,
    /// The compare-and-`PEXPIRE` script ([`RENEW`]).
    renew: Script,
    /// The compare-and-`DEL` + `PUBLISH` script ([`RELEASE`]).
    release: Script,
    /// The silent compare-and-`DEL` script ([`DISCARD`]).
    discard: Script,
    /// Fail a command at once while the connection is down, instead of queueing it until the
    /// command timeout (for Redlock: a dead node must not slow down every operation).
    fail_fast: bool,
    /// Counts re-established command connections; [`RedisNode::reconnected`] waits for the
    /// next one (one that happened before the wait began is not reported: a reconnection
    /// while standing by says nothing about a hold taken later).
    reconnections: watch::Sender<u64>,
}

impl RedisNode {
    /// The node's [`Connections`] to `url` (`what` names the setting in errors), subscribed to
    /// `<name>:released`. With `fail_fast`, commands fail at once while the connection is down.
    pub(super) fn connect(
        url: &str,
        what: &str,
        name: &str,
        timeouts: (Duration, Duration),
        fail_fast: bool,
    ) -> anyhow::Result<RedisNode> {
        let channel = format!("{name}:released");
        let Connections {
            client,
            subscriber,
            reconnections,
        } = Connections::open(url, what, timeouts, &channel)?;
        Ok(RedisNode {
            client,
            subscriber,
            key: name.to_string(),
            channel,
            renew: Script::from_lua(RENEW),
            release: Script::from_lua(RELEASE),
            discard: Script::from_lua(DISCARD),
            fail_fast,
            reconnections,
        })
    }

    /// With `fail_fast`: an error while the connection is down.
    fn check(&self) -> anyhow::Result<()> {
        if self.fail_fast && !self.client.is_connected() {
            anyhow::bail!("not connected");
        }
        Ok(())
    }

    /// Resolves at the next re-established connection.
    pub(super) async fn reconnected(&self) {
        next_reconnection(&self.reconnections).await
    }

    /// `<key>:released`.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// Release messages (and any other message on the subscriber connection) from now on.
    pub(super) fn message_rx(&self) -> broadcast::Receiver<Message> {
        self.subscriber.message_rx()
    }

    /// `SET key token NX PX ttl`: true when the key was set.
    pub(super) async fn set_nx(&self, token: &str, ttl: Duration) -> anyhow::Result<bool> {
        self.check()?;
        let reply: Option<String> = self
            .client
            .set(
                self.key.as_str(),
                token,
                Some(Expiration::PX(ttl.as_millis() as i64)),
                Some(SetOptions::NX),
                false,
            )
            .await?;
        Ok(reply.is_some())
    }

    /// Compare-and-`PEXPIRE`: true when the key still held `token` and now lives `ttl` again.
    pub(super) async fn renew(&self, token: &str, ttl: Duration) -> anyhow::Result<bool> {
        self.check()?;
        let n: i64 = self
            .renew
            .evalsha_with_reload(
                &self.client,
                vec![self.key.as_str()],
                vec![token.to_string(), ttl.as_millis().to_string()],
            )
            .await?;
        Ok(n == 1)
    }

    /// Compare-and-`DEL` + `PUBLISH <key>:released`: true when the key held `token`.
    pub(super) async fn release(&self, token: &str) -> anyhow::Result<bool> {
        self.check()?;
        let n: i64 = self
            .release
            .evalsha_with_reload(&self.client, vec![self.key.as_str()], vec![token])
            .await?;
        Ok(n == 1)
    }

    /// Compare-and-`DEL` without telling anyone: true when the key held `token`.
    pub(super) async fn discard(&self, token: &str) -> anyhow::Result<bool> {
        self.check()?;
        let n: i64 = self
            .discard
            .evalsha_with_reload(&self.client, vec![self.key.as_str()], vec![token])
            .await?;
        Ok(n == 1)
    }

    /// The key's `PTTL` in ms: -2 when absent, -1 when it has no expiry.
    pub(super) async fn pttl(&self) -> anyhow::Result<i64> {
        self.check()?;
        Ok(self.client.pttl(self.key.as_str()).await?)
    }

    /// One `PING` round trip.
    pub(super) async fn ping(&self) -> anyhow::Result<()> {
        self.check()?;
        let _: String = self.client.ping(None).await?;
        Ok(())
    }
}

/// The two connections of a Redis-based lease: one for commands, and one subscribed to the
/// lease's wake-up channel (pub/sub needs a connection of its own).
pub(super) struct Connections {
    pub(super) client: Client,
    pub(super) subscriber: SubscriberClient,
    /// Counts re-established command connections (see [`next_reconnection`]).
    pub(super) reconnections: watch::Sender<u64>,
}

impl Connections {
    /// Builds the clients for `url` and starts connecting in the background (a server that is
    /// down is retried for ever), subscribing to `channel` once connected. `what` names the
    /// setting in errors (never the URL: it may hold a password). Each command times out after
    /// `command_timeout`; fred then also drops it from its queue, so a command that waited out
    /// a disconnection is never sent late.
    pub(super) fn open(
        url: &str,
        what: &str,
        (command_timeout, connect_timeout): (Duration, Duration),
        channel: &str,
    ) -> anyhow::Result<Connections> {
        let config = Config::from_url(url).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = connect_timeout;
                c.internal_command_timeout = command_timeout;
                // Never re-send a lease command on reconnect: it may already have run.
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| p.default_command_timeout = command_timeout)
            // Reconnect attempts back off to at most 500 ms: with a longer cap (2 s before), a
            // standby whose command connection was in backoff when Redis came back was still
            // disconnected when the holder released, and took over only after its next
            // attempt and acquire retry (~0.5-2 s) instead of at the release message.
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 500, 2));
        let client = builder.build()?;
        let subscriber = builder.build_subscriber_client()?;
        client.on_error(|(e, server)| async move {
            tracing::warn!(server = ?server, error = %e, "redis connection error");
            Ok(())
        });
        let reconnections = watch::Sender::new(0u64);
        let counter = reconnections.clone();
        client.on_reconnect(move |server| {
            let counter = counter.clone();
            async move {
                tracing::info!(server = %server, "redis connection re-established");
                counter.send_modify(|n| *n += 1);
                Ok(())
            }
        });
        client.connect();
        subscriber.connect();
        let _resubscribe = subscriber.manage_subscriptions();
        let sub = subscriber.clone();
        let ch = channel.to_string();
        tokio::spawn(async move {
            // Subscribe once connected; manage_subscriptions re-subscribes after reconnects.
            loop {
                match sub.subscribe(ch.as_str()).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, "subscribing to the release channel failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(Connections {
            client,
            subscriber,
            reconnections,
        })
    }
}

/// Resolves at the next re-established connection counted by `reconnections` (one that
/// happened before the wait began is not reported: a reconnection while standing by says
/// nothing about a hold taken later).
pub(super) async fn next_reconnection(reconnections: &watch::Sender<u64>) {
    let mut rx = reconnections.subscribe();
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A lease on one Redis server.
pub struct RedisLease {
    /// The server's key, channel and scripts.
    node: RedisNode,
    /// The key's name, the ttl, and our holder token while we believe we hold the key.
    tenure: Tenure,
}

impl RedisLease {
    /// Connects to `url` (`lease.redis_url`) in the background, as `Connections::open`
    /// does: a Redis that is down at start is retried, and the keeper simply fails to acquire
    /// until it is back. Every command is bounded by `command_timeout`.
    pub fn connect(
        url: &str,
        tenure: Tenure,
        command_timeout: Duration,
    ) -> anyhow::Result<RedisLease> {
        let name = tenure.name();
        let timeouts = (command_timeout, command_timeout);
        let node = RedisNode::connect(url, "lease.redis_url", name, timeouts, false)?;
        Ok(RedisLease { node, tenure })
    }
}

impl Lease for RedisLease {
    fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    fn try_acquire(&self) -> BoxFuture<'_, anyhow::Result<Option<Grant>>> {
        Box::pin(
            self.tenure
                .acquire(move |token| async move { self.node.set_nx(&token, self.ttl()).await }),
        )
    }

    fn renew(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(
            self.tenure
                .renew(move |hold| async move { self.node.renew(&hold.token, self.ttl()).await }),
        )
    }

    fn release(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.tenure.release(move |hold| async move {
            // Whether the key was still ours is no matter: either way it is not ours now.
            self.node.release(&hold.token).await?;
            Ok(())
        }))
    }

    fn reconnected(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.node.reconnected())
    }

    fn wait_turn(&self, max: Duration) -> BoxFuture<'_, ()> {
        // Listen first, then look: a release between the two is still seen.
        let rx = self.node.message_rx();
        Box::pin(wait_for_turn(rx, self.node.pttl(), &self.node.channel, max))
    }

    fn ping(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move { self.node.ping().await })
    }
}

/// A standby's wait on a Redis-held lease: returns at once when the key is gone, on a message
/// on `channel` (received through `rx`, taken *before* `pttl` was asked, so a release between
/// the two is still seen), or when the key's `PTTL` runs out (an expiry publishes nothing),
/// after `max` at the latest.
pub(super) async fn wait_for_turn(
    mut rx: broadcast::Receiver<Message>,
    pttl: impl std::future::Future<Output = anyhow::Result<i64>>,
    channel: &str,
    max: Duration,
) {
    let pttl: i64 = match pttl.await {
        Ok(ms) => ms,
        Err(e) => {
            tracing::debug!(error = %e, "PTTL failed");
            tokio::time::sleep(max.min(Duration::from_millis(500))).await;
            return;
        }
    };
    let wait = match pttl {
        -2 => return, // no key: try at once
        -1 => max,    // a key without expiry (a foreign client): poll
        ms => Duration::from_millis(ms.max(0) as u64 + 1).min(max),
    };
    let until = Instant::now() + wait;
    loop {
        tokio::select! {
            m = rx.recv() => match m {
                Ok(m) if *m.channel == *channel => return,
                Ok(_) => {}
                Err(_) => return,
            },
            _ = tokio::time::sleep_until(until) => return,
        }
    }
}
