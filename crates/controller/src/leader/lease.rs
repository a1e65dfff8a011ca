//! Leader-with-lease: client-go's election on a `coordination.k8s.io/v1`
//! Lease, so Petrel and client-go candidates can share one Lease.
//!
//! The rules, as client-go's `tryAcquireOrRenew`:
//! * A candidate takes the Lease when it is absent (create), has no holder
//!   (released), is ours, or has **expired**: the record has not changed
//!   for `leaseDurationSeconds` *as measured on our clock since we first
//!   saw it*. The holder's `renewTime` is never compared with our clock, so
//!   a clock skew of seconds is harmless.
//! * Every write carries the resourceVersion read (optimistic
//!   concurrency): a conflict means someone else wrote first and won.
//! * Taking it from someone else increments `leaseTransitions` and sets
//!   `acquireTime`; renewing keeps both.
//! * The leader renews every `retry_period`. If no renewal succeeds
//!   within `renew_deadline` of the last good one (measured from when that
//!   attempt *started*, before the server could stamp it), the term's token
//!   is cancelled: since `renew_deadline < lease_duration`, the workers
//!   have stopped before anyone else may take the Lease (fencing).
//! * A leader that finds the Lease held by someone else (it was edited)
//!   stops at once rather than at the deadline.
//! * On shutdown the leader cancels its term, then writes an empty holder
//!   with `leaseDurationSeconds: 1` (client-go's `ReleaseOnCancel`), so a
//!   standby — woken by its watch on the Lease — takes over at once.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::error::{ConfigError, LockError};
use super::lease_api::{LeaseApi, LeaseRecord, Versioned};
use super::metrics::{LeaderMetrics, TermEnd};
use super::state::{Leadership, LeadershipState, Publisher, Term};

/// A lease candidate's settings. Defaults are client-go's (15 s, 10 s,
/// 2 s) with the kit's [`Backoff::default`] between attempts.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// This candidate's `holderIdentity` (unique per process: pod name, or
    /// host name plus a random suffix).
    pub identity: String,
    /// `leaseDurationSeconds` written (whole seconds, at least 1): how long
    /// others wait after the last renewal they saw.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the leader renews.
    pub retry_period: Duration,
    /// Waits between a standby's attempts (also cut short by the holder's
    /// expiry and by any change of the Lease).
    pub backoff: Backoff,
    /// Give the Lease up on shutdown (client-go's `ReleaseOnCancel`).
    pub release_on_shutdown: bool,
    /// Seed of the jitter (tests); `None` = from entropy.
    pub seed: Option<u64>,
}

impl LeaseConfig {
    /// client-go's defaults for `identity`.
    pub fn new(identity: impl Into<String>) -> Self {
        Self {
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            backoff: Backoff::default(),
            release_on_shutdown: true,
            seed: None,
        }
    }

    /// Sets lease duration, renew deadline and retry period.
    #[must_use]
    pub fn timing(mut self, lease: Duration, renew_deadline: Duration, retry: Duration) -> Self {
        self.lease_duration = lease;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry;
        self
    }

    /// Sets the standby backoff.
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets whether the Lease is given up on shutdown.
    #[must_use]
    pub fn release_on_shutdown(mut self, yes: bool) -> Self {
        self.release_on_shutdown = yes;
        self
    }

    /// Seeds the jitter.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// Checks client-go's rules: `lease_duration` (whole seconds, >= 1) >
    /// `renew_deadline` > `retry_period` > 0, an identity, a sane backoff.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |field, rule| Err(ConfigError::Invalid { field, rule });
        if self.identity.is_empty() {
            return bad("identity", "must not be empty");
        }
        if self.lease_duration < Duration::from_secs(1) {
            return bad("lease_duration", "must be at least 1 s");
        }
        if self.renew_deadline >= Duration::from_secs(self.lease_duration.as_secs()) {
            return bad(
                "renew_deadline",
                "must be shorter than lease_duration (whole seconds)",
            );
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return bad(
                "retry_period",
                "must be positive and shorter than renew_deadline",
            );
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

/// The last distinct record seen, and when (our clock).
#[derive(Debug, Clone)]
struct Observation {
    record: LeaseRecord,
    at: Instant,
}

/// What an attempt to take the Lease found.
enum Attempt {
    /// We hold it now.
    Won(Versioned),
    /// Someone holds it, validly until `until` unless they renew.
    Held { until: Instant },
    /// Someone else wrote first (create or update raced).
    Raced,
}

/// What a renewal found.
enum Renewal {
    Renewed(Versioned),
    /// The Lease is gone or held by someone else.
    Lost,
}

/// How a term ended.
enum Ended {
    Shutdown,
    Lost,
}

/// A lease candidate; [`LeaseElector::run`] campaigns until shut down.
#[derive(Debug)]
pub struct LeaseElector<A: LeaseApi> {
    api: A,
    cfg: LeaseConfig,
    publisher: Publisher,
    rng: StdRng,
    observed: Option<Observation>,
    /// When the record that left the lock free was first seen.
    leaderless_since: Option<Instant>,
    /// Whether the last API call failed (log once per episode).
    failing: bool,
}

impl<A: LeaseApi> LeaseElector<A> {
    /// A candidate on `api`; the [`Leadership`] is how controllers follow
    /// it.
    pub fn new(
        api: A,
        cfg: LeaseConfig,
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
                api,
                cfg,
                publisher,
                rng,
                observed: None,
                leaderless_since: None,
                failing: false,
            },
            leadership,
        ))
    }

    /// Campaigns, leads, and on `shutdown` stops (releasing the Lease if
    /// leading and so configured). Returns when `Stopped`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut changes = self.api.changes();
        let mut attempt: u32 = 0;
        while !shutdown.is_cancelled() {
            self.publisher.set(LeadershipState::Acquiring);
            // Changes from now on wake the wait below.
            changes.borrow_and_update();
            let started = Instant::now();
            let outcome = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                r = timeout(self.cfg.renew_deadline, self.try_acquire()) => r,
            };
            let now = Instant::now();
            let mut wait = self.cfg.backoff.delay(attempt, &mut self.rng);
            match outcome {
                Ok(Ok(Attempt::Won(v))) => {
                    self.recovered();
                    attempt = 0;
                    match self.lead(v, started, &shutdown).await {
                        Ended::Shutdown => break,
                        Ended::Lost => {
                            // Someone else may have it now: start waiting
                            // with a fresh view and backoff.
                            self.observed = None;
                            wait = self.cfg.backoff.delay(0, &mut self.rng);
                        }
                    }
                }
                Ok(Ok(Attempt::Held { until })) => {
                    self.recovered();
                    wait = wait.min(until.saturating_duration_since(now));
                    attempt = attempt.saturating_add(1);
                }
                Ok(Ok(Attempt::Raced)) => attempt = attempt.saturating_add(1),
                Ok(Err(e)) => {
                    self.failed(&e);
                    attempt = attempt.saturating_add(1);
                }
                Err(_) => {
                    self.failed_timeout();
                    attempt = attempt.saturating_add(1);
                }
            }
            self.publisher.set(LeadershipState::Standby);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = sleep(wait) => {}
                _ = changed(&mut changes) => {}
            }
        }
        self.publisher.set(LeadershipState::Stopped);
    }

    /// Notes `record` as seen now, keeping the first time it was seen.
    fn observe(&mut self, record: &LeaseRecord, now: Instant) -> Instant {
        match &self.observed {
            Some(o) if &o.record == record => o.at,
            _ => {
                self.observed = Some(Observation {
                    record: record.clone(),
                    at: now,
                });
                now
            }
        }
    }

    fn leaderless_from(&mut self, since: Instant) {
        if self.leaderless_since.is_none() {
            self.leaderless_since = Some(since);
        }
    }

    fn leaderless_over(&mut self, now: Instant) {
        if let Some(since) = self.leaderless_since.take() {
            self.publisher
                .metrics()
                .leaderless(now.saturating_duration_since(since));
        }
    }

    fn wall_now() -> Option<Timestamp> {
        Some(Timestamp::now())
    }

    async fn try_acquire(&mut self) -> Result<Attempt, LockError> {
        let me = self.cfg.identity.clone();
        let now = Instant::now();
        let Some(current) = self.api.get().await? else {
            self.leaderless_from(now);
            let record = LeaseRecord {
                holder: me,
                lease_duration_seconds: self.cfg.lease_seconds(),
                acquire_time: Self::wall_now(),
                renew_time: Self::wall_now(),
                transitions: 0,
            };
            return match self.api.create(&record).await {
                Ok(v) => Ok(Attempt::Won(v)),
                Err(LockError::AlreadyExists { .. }) => Ok(Attempt::Raced),
                Err(e) => Err(e),
            };
        };
        let seen_at = self.observe(&current.record, now);
        let r = &current.record;
        self.publisher.observed_leader(Some(&r.holder));
        let until =
            seen_at + Duration::from_secs(u64::try_from(r.lease_duration_seconds).unwrap_or(0));
        if !r.holder.is_empty() && r.holder != me && until > now {
            self.leaderless_over(now);
            return Ok(Attempt::Held { until });
        }
        let record = if r.holder == me {
            // Ours already (a renewal that landed after we gave up, or a
            // restart with the same identity): keep the term's fields.
            LeaseRecord {
                renew_time: Self::wall_now(),
                lease_duration_seconds: self.cfg.lease_seconds(),
                ..r.clone()
            }
        } else {
            self.leaderless_from(seen_at);
            LeaseRecord {
                holder: me,
                lease_duration_seconds: self.cfg.lease_seconds(),
                acquire_time: Self::wall_now(),
                renew_time: Self::wall_now(),
                transitions: r.transitions.saturating_add(1),
            }
        };
        match self.api.update(&record, &current.resource_version).await {
            Ok(v) => Ok(Attempt::Won(v)),
            Err(LockError::Conflict { .. }) => Ok(Attempt::Raced),
            Err(e) => Err(e),
        }
    }

    /// Leads until shutdown or the term is lost.
    async fn lead(
        &mut self,
        won: Versioned,
        started: Instant,
        shutdown: &CancellationToken,
    ) -> Ended {
        self.leaderless_over(Instant::now());
        self.observe(&won.record, started);
        let term = self.publisher.begin_term(&self.cfg.identity);
        tracing::info!(lock = %self.api.describe(), identity = %self.cfg.identity, term = term.number(), "leading");
        let mut held = won;
        let mut last_ok = started;
        let mut next = started + self.cfg.retry_period;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return self.shut_down_leading(&term).await,
                _ = sleep_until(next) => {}
            }
            let now = Instant::now();
            let deadline = last_ok + self.cfg.renew_deadline;
            if now >= deadline {
                return self.fence(&term, TermEnd::fenced);
            }
            let outcome = tokio::select! {
                biased;
                _ = shutdown.cancelled() => None,
                r = timeout(deadline - now, self.renew(&held)) => Some(r),
            };
            let Some(outcome) = outcome else {
                return self.shut_down_leading(&term).await;
            };
            match outcome {
                Ok(Ok(Renewal::Renewed(v))) => {
                    self.recovered();
                    self.observe(&v.record, now);
                    held = v;
                    last_ok = now;
                    next = now + self.cfg.retry_period;
                }
                Ok(Ok(Renewal::Lost)) => return self.fence(&term, TermEnd::lost),
                Ok(Err(e)) => {
                    self.failed(&e);
                    // Retry within the deadline (the check above fences).
                    next = (Instant::now() + self.cfg.retry_period).min(deadline);
                }
                Err(_) => return self.fence(&term, TermEnd::fenced),
            }
        }
    }

    fn fence(&mut self, term: &Term, why: TermEnd) -> Ended {
        tracing::warn!(lock = %self.api.describe(), identity = %self.cfg.identity, term = term.number(), reason = ?why, "stopped leading");
        self.publisher.end_term(term, why, LeadershipState::Standby);
        Ended::Lost
    }

    async fn shut_down_leading(&mut self, term: &Term) -> Ended {
        self.publisher
            .end_term(term, TermEnd::released, LeadershipState::Releasing);
        if self.cfg.release_on_shutdown {
            match timeout(self.cfg.renew_deadline, self.release()).await {
                Ok(Ok(())) => tracing::info!(lock = %self.api.describe(), "released"),
                Ok(Err(e)) => {
                    tracing::warn!(lock = %self.api.describe(), error = %e, "release failed")
                }
                Err(_) => tracing::warn!(lock = %self.api.describe(), "release timed out"),
            }
        }
        Ended::Shutdown
    }

    async fn renew(&self, held: &Versioned) -> Result<Renewal, LockError> {
        let me = &self.cfg.identity;
        let record = LeaseRecord {
            holder: me.clone(),
            lease_duration_seconds: self.cfg.lease_seconds(),
            acquire_time: held.record.acquire_time,
            renew_time: Self::wall_now(),
            transitions: held.record.transitions,
        };
        match self.api.update(&record, &held.resource_version).await {
            Ok(v) => return Ok(Renewal::Renewed(v)),
            Err(LockError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
        // Someone wrote the Lease: still ours (labels edited, or our own
        // timed-out write landed) or taken?
        let Some(current) = self.api.get().await? else {
            return Ok(Renewal::Lost);
        };
        if current.record.holder != *me {
            return Ok(Renewal::Lost);
        }
        let record = LeaseRecord {
            acquire_time: current.record.acquire_time,
            transitions: current.record.transitions,
            ..record
        };
        match self.api.update(&record, &current.resource_version).await {
            Ok(v) => Ok(Renewal::Renewed(v)),
            Err(LockError::Conflict { .. }) => Ok(Renewal::Lost),
            Err(e) => Err(e),
        }
    }

    async fn release(&self) -> Result<(), LockError> {
        let Some(current) = self.api.get().await? else {
            return Ok(());
        };
        if current.record.holder != self.cfg.identity {
            return Ok(());
        }
        let record = LeaseRecord {
            holder: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Self::wall_now(),
            renew_time: Self::wall_now(),
            transitions: current.record.transitions,
        };
        self.api
            .update(&record, &current.resource_version)
            .await
            .map(|_| ())
    }

    fn failed(&mut self, e: &LockError) {
        if !self.failing {
            tracing::warn!(identity = %self.cfg.identity, error = %e, "leader election: lock call failed");
            self.failing = true;
        }
    }

    fn failed_timeout(&mut self) {
        if !self.failing {
            tracing::warn!(lock = %self.api.describe(), identity = %self.cfg.identity, "leader election: lock call timed out");
            self.failing = true;
        }
    }

    fn recovered(&mut self) {
        if std::mem::take(&mut self.failing) {
            tracing::info!(lock = %self.api.describe(), "leader election: lock calls work again");
        }
    }
}

/// Resolves when `rx` changes; never, once its sender is gone.
pub(crate) async fn changed(rx: &mut watch::Receiver<u64>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}
