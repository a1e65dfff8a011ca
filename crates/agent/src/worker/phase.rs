//! A pod's phase in its worker's hands: one enum instead of three
//! optional fields that had to agree.
//!
//! ```text
//!                 manifest deleted (terminate)
//!   Active ------------------------------------------> Terminating --(runtime empty)--> forgotten
//!    |  ^                                              ^    |
//!    |  | changed manifest (clear_eviction)            |    | manifest back (activate)
//!    v  |                                              |    v
//!   Evicted ------------- manifest deleted ------------+  Active
//!     (request_eviction / a record of a previous agent / a refused admission)
//! ```
//!
//! Every transition is made by the pod's own worker during a sync, except
//! [`PodPhase::evict`], which the eviction manager asks for (the pod's
//! next sync acts on it).

use std::time::SystemTime;

use super::Fingerprint;

/// An eviction the eviction manager asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EvictionOrder {
    /// Grace period for the pod's containers, seconds.
    pub grace_secs: i64,
    /// The desired pod evicted (by identity): a changed manifest is a new
    /// pod, which may run again.
    pub pod: usize,
}

/// Where a pod is.
#[derive(Debug, Clone)]
pub(super) enum PodPhase {
    /// Wanted by its manifest and run to its spec. `settled` is what the
    /// last sync that changed nothing and asked for nothing saw: a sync
    /// that would see the same again has nothing to do.
    ///
    /// → `Evicted` by [`PodPhase::evict`]; → `Terminating` by
    /// [`PodPhase::terminate`].
    Active { settled: Option<Fingerprint> },
    /// Evicted for node pressure, or refused admission before it ever
    /// started: its containers are stopped with the order's grace period,
    /// it is never started again and shows as Failed, reason Evicted (or
    /// the refusal's). `settled` as for `Active`.
    ///
    /// → `Active` by [`PodPhase::clear_eviction`] (its manifest changed:
    /// a new pod); → `Terminating` by [`PodPhase::terminate`] (deleted).
    Evicted {
        order: EvictionOrder,
        settled: Option<Fingerprint>,
    },
    /// Its manifest is gone since `since`: it is stopped gracefully
    /// (with the eviction's grace period if it was evicted) and removed,
    /// then its worker forgets it.
    ///
    /// → `Active` by [`PodPhase::activate`] (the manifest came back
    /// before the pod was gone); → `Evicted` by [`PodPhase::evict`].
    Terminating {
        since: SystemTime,
        eviction_grace: Option<i64>,
    },
}

impl Default for PodPhase {
    fn default() -> Self {
        Self::Active { settled: None }
    }
}

impl PodPhase {
    /// What the last quiet sync saw (never while terminating).
    pub fn settled(&self) -> Option<&Fingerprint> {
        match self {
            Self::Active { settled } | Self::Evicted { settled, .. } => settled.as_ref(),
            Self::Terminating { .. } => None,
        }
    }

    /// Records what a quiet sync saw (None: the next sync acts). Nothing
    /// while terminating: each sync of a terminating pod acts.
    pub fn set_settled(&mut self, fp: Option<Fingerprint>) {
        match self {
            Self::Active { settled } | Self::Evicted { settled, .. } => *settled = fp,
            Self::Terminating { .. } => {}
        }
    }

    /// The eviction, while evicted.
    pub fn eviction(&self) -> Option<&EvictionOrder> {
        match self {
            Self::Evicted { order, .. } => Some(order),
            _ => None,
        }
    }

    /// The grace period its containers are stopped with instead of their
    /// own: an eviction's, if the pod was evicted.
    pub fn grace_override(&self) -> Option<i64> {
        match self {
            Self::Evicted { order, .. } => Some(order.grace_secs),
            Self::Terminating { eviction_grace, .. } => *eviction_grace,
            Self::Active { .. } => None,
        }
    }

    /// Since when its manifest is gone, while terminating.
    pub fn terminating_since(&self) -> Option<SystemTime> {
        match self {
            Self::Terminating { since, .. } => Some(*since),
            _ => None,
        }
    }

    /// Evicted with `order`; false (and unchanged) when already evicted
    /// by an order for the same pod.
    pub fn evict(&mut self, order: EvictionOrder) -> bool {
        if self.eviction().is_some_and(|e| e.pod == order.pod) {
            return false;
        }
        *self = Self::Evicted {
            order,
            settled: None,
        };
        true
    }

    /// Its manifest changed since the eviction: a new pod, Active again.
    /// True if it was evicted.
    pub fn clear_eviction(&mut self) -> bool {
        if let Self::Evicted { .. } = self {
            *self = Self::default();
            return true;
        }
        false
    }

    /// Its manifest is gone, at `now` (kept from the first time).
    pub fn terminate(&mut self, now: SystemTime) {
        if let Self::Terminating { .. } = self {
            return;
        }
        *self = Self::Terminating {
            since: now,
            eviction_grace: self.grace_override(),
        };
    }

    /// Its manifest is back before the pod was gone: Active again.
    pub fn activate(&mut self) {
        if let Self::Terminating { .. } = self {
            *self = Self::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(pod: usize) -> EvictionOrder {
        EvictionOrder { grace_secs: 5, pod }
    }

    #[test]
    fn phase_should_evict_once_per_pod_and_clear_on_a_new_manifest() {
        let mut p = PodPhase::default();
        assert!(p.eviction().is_none() && p.grace_override().is_none());
        assert!(p.evict(order(1)));
        assert!(!p.evict(order(1)), "the same pod is evicted once");
        assert!(
            !p.evict(EvictionOrder {
                grace_secs: 0,
                pod: 1
            }),
            "whatever the grace period"
        );
        assert_eq!(p.grace_override(), Some(5));
        assert!(p.evict(order(2)), "a changed pod can be evicted again");
        assert!(p.clear_eviction());
        assert!(matches!(p, PodPhase::Active { settled: None }));
        assert!(!p.clear_eviction());
    }

    #[test]
    fn phase_should_terminate_once_and_keep_the_evictions_grace() {
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(100);
        let mut p = PodPhase::default();
        p.evict(order(1));
        p.terminate(t0);
        p.terminate(t0 + std::time::Duration::from_secs(9));
        assert_eq!(p.terminating_since(), Some(t0), "the first time stays");
        assert_eq!(p.grace_override(), Some(5));
        assert!(p.eviction().is_none());
        assert!(p.settled().is_none());
        p.activate();
        assert!(matches!(p, PodPhase::Active { settled: None }));
        p.activate();
        assert!(p.terminating_since().is_none());
    }
}
