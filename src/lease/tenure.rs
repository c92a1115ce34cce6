//! What every lease backend keeps the same way ([`Tenure`]): the lease's name and ttl, this
//! instance's id, and the hold of the current acquisition (its token and, for a backend that
//! bumps the epoch itself, that epoch). The backends only send; the bookkeeping around what
//! they send lives here, so that no backend can get it subtly different.
//!
//! Guarantees:
//! - every acquisition is made under a token of its own (`<instance_id>#<random>`, or the
//!   token a foreign format dictates, as Redisson's hash field), held from the grant until
//!   the hold is lost or released; a token is never taken up again after that;
//! - a renewal is sent only for a hold; when the backend refuses it, the hold is gone (a
//!   renewal never re-creates a lease) and is forgotten, so the next acquire starts afresh;
//! - a release forgets the hold *before* it is sent: whatever the answer, nothing relies on
//!   the hold from then on. Without a hold, neither a renewal nor a release sends anything;
//! - the holder identity is the current hold's token, or the instance id while standing by.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Grant;

/// One acquisition, as a backend remembers it while it believes it holds the lease.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    /// What the backend stored as the holder: the holder token (Redisson: the hash field).
    pub(crate) token: String,
    /// The epoch the grant came with, when the backend bumped it itself (the `database`
    /// backend, which must present it again); `None` for the others.
    pub(crate) epoch: Option<i64>,
}

/// A lease's name and ttl, this instance's id, and the current hold: what
/// [`Lease::tenure`](super::Lease::tenure) gives the keeper, and what each backend's
/// acquire, renew and release go through.
#[derive(Debug)]
pub struct Tenure {
    /// The lease's name (the `outbox_relay_lease` row, the Redis key, the lock's name).
    name: String,
    /// This instance's id: the prefix of every holder token.
    instance_id: String,
    /// How long a grant lasts without renewal.
    ttl: Duration,
    /// The current hold: set on a grant, cleared on a refused renewal or a release. A
    /// poisoned lock is read through: the value is replaced whole, never left half-written.
    held: Mutex<Option<Hold>>,
}

impl Tenure {
    /// A lease `name` with grants of `ttl`, held by the instance `instance_id`; not held yet.
    pub fn new(name: &str, instance_id: &str, ttl: Duration) -> Tenure {
        Tenure {
            name: name.to_string(),
            instance_id: instance_id.to_string(),
            ttl,
            held: Mutex::new(None),
        }
    }

    /// The lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long a grant lasts without renewal.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The current hold's token, or the instance id while standing by: what the fencing row
    /// and the logs record as the holder.
    pub fn holder(&self) -> String {
        self.hold()
            .map(|h| h.token)
            .unwrap_or_else(|| self.instance_id.clone())
    }

    /// A fresh holder token for one acquisition: `<instance_id>#<random>`, so that logs and
    /// the fencing row say which instance holds the lease, and no two acquisitions share one.
    pub(crate) fn new_token(&self) -> String {
        format!("{}#{}", self.instance_id, crate::random_token())
    }

    /// The current hold, if any.
    pub(crate) fn hold(&self) -> Option<Hold> {
        match self.held.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Replaces the current hold, returning the one it replaces.
    fn replace(&self, hold: Option<Hold>) -> Option<Hold> {
        match self.held.lock() {
            Ok(mut g) => std::mem::replace(&mut *g, hold),
            Err(p) => std::mem::replace(&mut *p.into_inner(), hold),
        }
    }

    /// Records `grant`, made under `token`, as the current hold, and returns it.
    pub(crate) fn keep(&self, token: String, grant: Grant) -> Grant {
        self.replace(Some(Hold {
            token,
            epoch: grant.epoch,
        }));
        grant
    }

    /// Forgets the current hold (the backend learnt on its own that it is gone).
    pub(crate) fn forget(&self) {
        self.replace(None);
    }

    /// One acquire attempt under a fresh holder token (see [`Tenure::acquire_as`]).
    pub(crate) async fn acquire<Fut>(
        &self,
        take: impl FnOnce(String) -> Fut,
    ) -> anyhow::Result<Option<Grant>>
    where
        Fut: Future<Output = anyhow::Result<bool>>,
    {
        self.acquire_as(self.new_token(), take).await
    }

    /// One acquire attempt under `token`: `take` sends it and says whether the lease was
    /// taken. Taken, the token is the current hold, and the grant counts from just before
    /// `take` was sent.
    pub(crate) async fn acquire_as<Fut>(
        &self,
        token: String,
        take: impl FnOnce(String) -> Fut,
    ) -> anyhow::Result<Option<Grant>>
    where
        Fut: Future<Output = anyhow::Result<bool>>,
    {
        let sent_at = Instant::now();
        if !take(token.clone()).await? {
            return Ok(None);
        }
        let grant = Grant {
            epoch: None,
            sent_at,
        };
        Ok(Some(self.keep(token, grant)))
    }

    /// One renewal of the current hold: `extend` sends it and says whether the backend
    /// extended it. `Ok(false)` (and nothing sent) without a hold; a refused renewal forgets
    /// the hold. An error leaves it: whether the renewal landed is unknown, and the keeper
    /// retries until its deadline.
    pub(crate) async fn renew<Fut>(&self, extend: impl FnOnce(Hold) -> Fut) -> anyhow::Result<bool>
    where
        Fut: Future<Output = anyhow::Result<bool>>,
    {
        let Some(hold) = self.hold() else {
            return Ok(false);
        };
        let renewed = extend(hold).await?;
        if !renewed {
            self.forget();
        }
        Ok(renewed)
    }

    /// Gives the current hold back: forgotten first, then `give_back` sends it. Nothing is
    /// sent without a hold.
    pub(crate) async fn release<Fut>(
        &self,
        give_back: impl FnOnce(Hold) -> Fut,
    ) -> anyhow::Result<()>
    where
        Fut: Future<Output = anyhow::Result<()>>,
    {
        match self.replace(None) {
            Some(hold) => give_back(hold).await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(epoch: Option<i64>) -> Grant {
        Grant {
            epoch,
            sent_at: Instant::now(),
        }
    }

    #[tokio::test]
    async fn the_holder_is_the_token_of_the_current_hold() {
        let t = Tenure::new("lease", "inst", Duration::from_secs(3));
        assert_eq!(t.holder(), "inst");
        let token = t.new_token();
        assert!(token.starts_with("inst#") && token.len() == "inst#".len() + 32);
        assert_ne!(t.new_token(), token);
        let g = t.acquire_as(token.clone(), |_| async { Ok(true) }).await;
        assert!(matches!(g, Ok(Some(Grant { epoch: None, .. }))));
        assert_eq!(t.holder(), token);
        t.keep("inst#x".into(), grant(Some(7)));
        assert_eq!(
            t.hold().map(|h| (h.token, h.epoch)),
            Some(("inst#x".into(), Some(7)))
        );
        t.forget();
        assert_eq!(t.holder(), "inst");
    }

    #[tokio::test]
    async fn a_refused_renewal_forgets_the_hold_and_an_error_keeps_it() {
        let t = Tenure::new("lease", "inst", Duration::from_secs(3));
        let sent = |_| async { anyhow::bail!("sent without a hold") };
        assert!(matches!(t.renew(sent).await, Ok(false)));
        t.keep("inst#a".into(), grant(None));
        assert!(
            t.renew(|_| async { anyhow::bail!("timed out") })
                .await
                .is_err()
        );
        assert_eq!(t.holder(), "inst#a");
        assert!(matches!(t.renew(|_| async { Ok(true) }).await, Ok(true)));
        assert!(matches!(t.renew(|_| async { Ok(false) }).await, Ok(false)));
        assert!(t.hold().is_none());
    }

    #[tokio::test]
    async fn a_release_forgets_the_hold_before_it_is_sent() {
        let t = Tenure::new("lease", "inst", Duration::from_secs(3));
        t.keep("inst#a".into(), grant(None));
        let r = t
            .release(|h| {
                assert_eq!(h.token, "inst#a");
                assert!(t.hold().is_none());
                async { anyhow::bail!("connection reset") }
            })
            .await;
        assert!(r.is_err());
        assert!(t.hold().is_none());
        let r = t.release(|_| async { anyhow::bail!("sent without a hold") });
        assert!(r.await.is_ok());
    }
}
