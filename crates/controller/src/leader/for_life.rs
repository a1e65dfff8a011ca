//! Leader-for-life (operator-lib's `leader.Become`): the leader is whoever
//! created a ConfigMap owned (ownerReference) by its own Pod. Nobody renews
//! anything; the lock goes away only when the leader deletes it on exit,
//! or when its Pod is deleted and the garbage collector removes what the
//! Pod owned. So two leaders are impossible while the lock exists.
//!
//! Differences from operator-lib, from Pinterest's findings: the retry
//! backoff is configuration (operator-lib hard-codes 1 s doubling to 16 s,
//! which dominated their leaderless time), a standby watches the ConfigMap
//! and tries at once when it is deleted, and the leader deletes its lock
//! on shutdown (proactive release) instead of waiting for garbage
//! collection. The leader also checks its lock every `check_period` and
//! stops its workers if it is gone or owned by another Pod (someone
//! deleted it by hand).

use std::future::Future;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::error::{ConfigError, LockError};
use super::lease::changed;
use super::metrics::{LeaderMetrics, TermEnd};
use super::state::{Leadership, LeadershipState, Publisher, Term};

/// The Pod that owns the lock (the leader's own Pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace` (the lock lives in the same namespace: owner
    /// references cannot cross namespaces).
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
}

/// The lock ConfigMap as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockObject {
    /// The ConfigMap's uid (deletes are preconditioned on it).
    pub uid: String,
    /// The uid of the Pod named in its ownerReferences, if any.
    pub owner_uid: Option<String>,
}

/// What the for-life elector needs from the API server.
pub trait ConfigMapLock: Send + Sync + 'static {
    /// Reads the lock; `None` if absent.
    fn get(&self) -> impl Future<Output = Result<Option<LockObject>, LockError>> + Send;
    /// Creates the lock owned by `owner` (`AlreadyExists` if it is there).
    fn create(&self, owner: &PodRef) -> impl Future<Output = Result<LockObject, LockError>> + Send;
    /// Deletes the lock if its uid is still `uid`.
    fn delete(&self, uid: &str) -> impl Future<Output = Result<(), LockError>> + Send;
    /// A counter that moves whenever the lock may have changed.
    fn changes(&self) -> watch::Receiver<u64>;
    /// `namespace/name`.
    fn describe(&self) -> String;
}

/// A for-life candidate's settings.
#[derive(Debug, Clone)]
pub struct ForLifeConfig {
    /// This candidate's Pod.
    pub owner: PodRef,
    /// Waits between a standby's attempts (cut short when the lock
    /// changes).
    pub backoff: Backoff,
    /// How often the leader checks that its lock still exists.
    pub check_period: Duration,
    /// Delete the lock on shutdown.
    pub release_on_shutdown: bool,
    /// Timeout of each API call.
    pub call_timeout: Duration,
    /// Seed of the jitter (tests).
    pub seed: Option<u64>,
}

impl ForLifeConfig {
    /// Defaults for `owner`: the kit's [`Backoff::default`], a check every
    /// 5 s, release on shutdown, 10 s per call.
    pub fn new(owner: PodRef) -> Self {
        Self {
            owner,
            backoff: Backoff::default(),
            check_period: Duration::from_secs(5),
            release_on_shutdown: true,
            call_timeout: Duration::from_secs(10),
            seed: None,
        }
    }

    /// Sets the standby backoff.
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets how often the leader checks its lock.
    #[must_use]
    pub fn check_period(mut self, period: Duration) -> Self {
        self.check_period = period;
        self
    }

    /// Seeds the jitter.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks the fields.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |field, rule| Err(ConfigError::Invalid { field, rule });
        if self.owner.uid.is_empty() || self.owner.name.is_empty() {
            return bad("owner", "needs the Pod's name and uid");
        }
        if self.check_period.is_zero() {
            return bad("check_period", "must be positive");
        }
        if self.call_timeout.is_zero() {
            return bad("call_timeout", "must be positive");
        }
        if let Err(field) = self.backoff.check() {
            return bad(
                field,
                "must be positive, max >= initial, factor >= 1, jitter >= 0",
            );
        }
        Ok(())
    }
}

enum Attempt {
    Won(LockObject),
    Held,
}

/// A leader-for-life candidate; [`ForLifeElector::run`] campaigns until
/// shut down.
#[derive(Debug)]
pub struct ForLifeElector<L: ConfigMapLock> {
    lock: L,
    cfg: ForLifeConfig,
    publisher: Publisher,
    rng: StdRng,
    leaderless_since: Option<Instant>,
    failing: bool,
}

impl<L: ConfigMapLock> ForLifeElector<L> {
    /// A candidate on `lock`.
    pub fn new(
        lock: L,
        cfg: ForLifeConfig,
        metrics: LeaderMetrics,
    ) -> Result<(Self, Leadership), ConfigError> {
        cfg.check()?;
        let (publisher, leadership) = Publisher::new(metrics);
        let rng = match cfg.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_entropy(),
        };
        Ok((
            Self {
                lock,
                cfg,
                publisher,
                rng,
                leaderless_since: None,
                failing: false,
            },
            leadership,
        ))
    }

    /// Campaigns, leads, and on `shutdown` stops (deleting the lock if
    /// leading and so configured).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut changes = self.lock.changes();
        let mut attempt: u32 = 0;
        while !shutdown.is_cancelled() {
            self.publisher.set(LeadershipState::Acquiring);
            changes.borrow_and_update();
            let outcome = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                r = timeout(self.cfg.call_timeout, self.try_acquire()) => r,
            };
            match outcome {
                Ok(Ok(Attempt::Won(obj))) => {
                    self.ok();
                    attempt = 0;
                    if self.lead(obj, &shutdown).await {
                        break;
                    }
                }
                Ok(Ok(Attempt::Held)) => {
                    self.ok();
                    attempt = attempt.saturating_add(1);
                }
                Ok(Err(e)) => {
                    self.failed(&e.to_string());
                    attempt = attempt.saturating_add(1);
                }
                Err(_) => {
                    self.failed("lock call timed out");
                    attempt = attempt.saturating_add(1);
                }
            }
            self.publisher.set(LeadershipState::Standby);
            let wait = self
                .cfg
                .backoff
                .delay(attempt.saturating_sub(1), &mut self.rng);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = sleep(wait) => {}
                _ = changed(&mut changes) => {}
            }
        }
        self.publisher.set(LeadershipState::Stopped);
    }

    fn ours(&self, obj: &LockObject) -> bool {
        obj.owner_uid.as_deref() == Some(self.cfg.owner.uid.as_str())
    }

    async fn try_acquire(&mut self) -> Result<Attempt, LockError> {
        let now = Instant::now();
        if let Some(obj) = self.lock.get().await? {
            if self.ours(&obj) {
                // Ours from before (a restart of the same Pod).
                return Ok(Attempt::Won(obj));
            }
            self.leaderless_over(now);
            return Ok(Attempt::Held);
        }
        if self.leaderless_since.is_none() {
            self.leaderless_since = Some(now);
        }
        match self.lock.create(&self.cfg.owner).await {
            Ok(obj) => Ok(Attempt::Won(obj)),
            Err(LockError::AlreadyExists { .. }) => {
                self.leaderless_over(Instant::now());
                Ok(Attempt::Held)
            }
            Err(e) => Err(e),
        }
    }

    fn leaderless_over(&mut self, now: Instant) {
        if let Some(since) = self.leaderless_since.take() {
            self.publisher
                .metrics()
                .leaderless(now.saturating_duration_since(since));
        }
    }

    /// Leads; `true` when it ended by shutdown.
    async fn lead(&mut self, obj: LockObject, shutdown: &CancellationToken) -> bool {
        self.leaderless_over(Instant::now());
        let term = self.publisher.begin_term(&self.cfg.owner.name);
        tracing::info!(lock = %self.lock.describe(), pod = %self.cfg.owner.name, "leading for life");
        let mut changes = self.lock.changes();
        loop {
            changes.borrow_and_update();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    self.release(&term, &obj).await;
                    return true;
                }
                _ = sleep(self.cfg.check_period) => {}
                _ = changed(&mut changes) => {}
            }
            match timeout(self.cfg.call_timeout, self.lock.get()).await {
                Ok(Ok(Some(now))) if now.uid == obj.uid && self.ours(&now) => self.ok(),
                Ok(Ok(_)) => {
                    tracing::warn!(lock = %self.lock.describe(), "lock gone or taken: stopped leading");
                    self.publisher
                        .end_term(&term, TermEnd::lost, LeadershipState::Standby);
                    return false;
                }
                // Nobody can take a lock that exists; an unreadable one is
                // still ours.
                Ok(Err(e)) => self.failed(&e.to_string()),
                Err(_) => self.failed("lock call timed out"),
            }
        }
    }

    async fn release(&mut self, term: &Term, obj: &LockObject) {
        self.publisher
            .end_term(term, TermEnd::released, LeadershipState::Releasing);
        if !self.cfg.release_on_shutdown {
            return;
        }
        match timeout(self.cfg.call_timeout, self.lock.delete(&obj.uid)).await {
            Ok(Ok(())) => tracing::info!(lock = %self.lock.describe(), "released"),
            Ok(Err(e)) => {
                tracing::warn!(lock = %self.lock.describe(), error = %e, "release failed")
            }
            Err(_) => tracing::warn!(lock = %self.lock.describe(), "release timed out"),
        }
    }

    fn failed(&mut self, e: &str) {
        if !self.failing {
            tracing::warn!(lock = %self.lock.describe(), error = %e, "leader-for-life: lock call failed");
            self.failing = true;
        }
    }

    fn ok(&mut self) {
        if std::mem::take(&mut self.failing) {
            tracing::info!(lock = %self.lock.describe(), "leader-for-life: lock calls work again");
        }
    }
}
