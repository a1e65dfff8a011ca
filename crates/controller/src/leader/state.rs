//! What a candidate is doing, and the term a leader's workers run under.
//!
//! An elector publishes a [`Status`] on a watch channel; controllers hold a
//! [`Leadership`] to read it and to wait for a [`Term`]. A term's
//! cancellation token is cancelled *before* the elector gives up or stops
//! renewing the lock, so workers that obey it have stopped before anyone
//! else can lead (fencing).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::{LeaderMetrics, TermEnd};

/// Where a candidate is in the election.
///
/// ```text
///            ┌──────────── lock held / conflict / error ───────────┐
///            v                                                     │
///  start → Standby ── wait ends (backoff, expiry, lock changed) → Acquiring
///            ^                                                     │ won
///            │ fenced: no renewal within renew_deadline,           v
///            │ lock held by another, or edited away  ────────── Leading
///            │                                                     │ shutdown
///          Stopped ←───────────── lock given up (or not) ─── Releasing
/// ```
/// A shutdown in `Standby` or `Acquiring` goes straight to `Stopped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeadershipState {
    /// Not leading: waiting for the lock to come free. Left for
    /// `Acquiring` when the backoff delay or the holder's lease runs out,
    /// or the lock object changes; for `Stopped` on shutdown.
    Standby,
    /// An attempt to take the lock is in flight. Left for `Leading` when it
    /// succeeds, for `Standby` when someone else holds the lock, won a
    /// write conflict, or the API failed.
    Acquiring,
    /// Holding the lock: the current [`Term`] is live. Left for `Standby`
    /// when fenced (the lock could not be renewed within the renew
    /// deadline, or was found held by someone else), the term's token
    /// being cancelled first; for `Releasing` on shutdown.
    Leading,
    /// Shutting down while leading: the term's token is cancelled and the
    /// lock is being given up so a standby can take it at once. Left for
    /// `Stopped`.
    Releasing,
    /// The elector has exited; no further terms.
    Stopped,
}

/// What an elector publishes.
#[derive(Debug, Clone)]
pub struct Status {
    /// The candidate's state.
    pub state: LeadershipState,
    /// The current term while `Leading`.
    pub term: Option<Term>,
    /// The holder last observed on the lock (this candidate's identity
    /// while leading), if any.
    pub leader: Option<String>,
}

/// A leader's term: live from winning the lock until the token is
/// cancelled (fenced, lost or shutting down).
#[derive(Debug, Clone)]
pub struct Term {
    inner: Arc<TermInner>,
}

#[derive(Debug)]
struct TermInner {
    number: u64,
    since: Instant,
    token: CancellationToken,
    reconciled: AtomicBool,
    metrics: LeaderMetrics,
}

impl Term {
    /// This candidate's term count, from 1.
    pub fn number(&self) -> u64 {
        self.inner.number
    }

    /// When this candidate became leader.
    pub fn since(&self) -> Instant {
        self.inner.since
    }

    /// Cancelled when the term ends; workers stop when it is.
    pub fn token(&self) -> &CancellationToken {
        &self.inner.token
    }

    /// Resolves when the term ends.
    pub async fn lost(&self) {
        self.inner.token.cancelled().await;
    }

    /// Whether the term is still live.
    pub fn is_live(&self) -> bool {
        !self.inner.token.is_cancelled()
    }

    /// Tells the kit the controller finished its first reconcile of this
    /// term: the first call records the ramp-up time (became leader →
    /// first reconcile); later calls do nothing.
    pub fn reconciled(&self) {
        if !self.inner.reconciled.swap(true, Ordering::AcqRel) {
            self.inner.metrics.ramp_up(self.inner.since.elapsed());
        }
    }
}

/// A controller's view of an elector: its state and its terms.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<Status>,
}

impl Leadership {
    /// The status now.
    pub fn status(&self) -> Status {
        self.rx.borrow().clone()
    }

    /// The state now.
    pub fn state(&self) -> LeadershipState {
        self.rx.borrow().state
    }

    /// Whether this candidate leads now.
    pub fn is_leader(&self) -> bool {
        self.rx.borrow().state == LeadershipState::Leading
    }

    /// Waits until this candidate leads and returns the term, or `None`
    /// once the elector has stopped.
    pub async fn leading(&mut self) -> Option<Term> {
        loop {
            {
                let s = self.rx.borrow_and_update();
                match (&s.state, &s.term) {
                    (LeadershipState::Leading, Some(t)) if t.is_live() => return Some(t.clone()),
                    (LeadershipState::Stopped, _) => return None,
                    _ => {}
                }
            }
            if self.rx.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Waits until the status changes; `false` once the elector is gone.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// The elector's side: publishes the status and runs terms.
#[derive(Debug)]
pub(crate) struct Publisher {
    tx: watch::Sender<Status>,
    metrics: LeaderMetrics,
    terms: u64,
}

impl Publisher {
    pub(crate) fn new(metrics: LeaderMetrics) -> (Self, Leadership) {
        let (tx, rx) = watch::channel(Status {
            state: LeadershipState::Standby,
            term: None,
            leader: None,
        });
        (
            Self {
                tx,
                metrics,
                terms: 0,
            },
            Leadership { rx },
        )
    }

    pub(crate) fn metrics(&self) -> &LeaderMetrics {
        &self.metrics
    }

    /// Sets a non-leading state (never `Leading`: see `begin_term`).
    pub(crate) fn set(&self, state: LeadershipState) {
        self.tx.send_modify(|s| s.state = state);
    }

    /// Records the holder last seen on the lock.
    pub(crate) fn observed_leader(&self, leader: Option<&str>) {
        self.tx.send_if_modified(|s| {
            let new = leader.filter(|l| !l.is_empty()).map(str::to_owned);
            if s.leader == new {
                return false;
            }
            s.leader = new;
            true
        });
    }

    /// Starts a term: `Leading`, with a live token.
    pub(crate) fn begin_term(&mut self, identity: &str) -> Term {
        self.terms += 1;
        let term = Term {
            inner: Arc::new(TermInner {
                number: self.terms,
                since: Instant::now(),
                token: CancellationToken::new(),
                reconciled: AtomicBool::new(false),
                metrics: self.metrics.clone(),
            }),
        };
        self.metrics.started_leading();
        self.tx.send_modify(|s| {
            s.state = LeadershipState::Leading;
            s.term = Some(term.clone());
            s.leader = Some(identity.to_owned());
        });
        term
    }

    /// The current term, if leading.
    fn current(&self) -> Option<Term> {
        self.tx.borrow().term.clone()
    }

    /// Ends the current term: cancels its token first (workers stop), then
    /// moves to `next`.
    pub(crate) fn end_term(&self, term: &Term, why: TermEnd, next: LeadershipState) {
        term.inner.token.cancel();
        self.metrics.stopped_leading(why);
        self.tx.send_modify(|s| {
            s.state = next;
            s.term = None;
        });
    }
}

impl Drop for Publisher {
    /// An elector dropped while leading (its task aborted or panicked)
    /// cannot renew: its workers stop too. The lock is not released.
    fn drop(&mut self) {
        if let Some(term) = self.current() {
            term.inner.token.cancel();
            self.metrics.stopped_leading(TermEnd::fenced);
        }
        self.tx.send_modify(|s| {
            s.state = LeadershipState::Stopped;
            s.term = None;
        });
    }
}
