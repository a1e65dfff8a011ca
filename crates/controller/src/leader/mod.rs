//! Leader election: two mechanisms, one way to follow them.
//!
//! * **Leader-with-lease** ([`LeaseElector`] on a [`KubeLease`]): client-go's
//!   semantics on a `coordination.k8s.io/v1` Lease, so Petrel and client-go
//!   candidates may share a Lease and never both lead.
//! * **Leader-for-life** ([`ForLifeElector`] on a [`KubeConfigMapLock`]):
//!   operator-lib's lock, a ConfigMap owned by the leader's Pod; it is gone
//!   when the Pod is garbage-collected or the leader deletes it on exit.
//!
//! Both publish a [`LeadershipState`] and run [`Term`]s: a term's
//! cancellation token is cancelled before the lock is given up or can
//! expire elsewhere, so workers that obey it never overlap another
//! leader's (fencing). Standbys retry with a configurable [`Backoff`] and
//! are woken at once when the lock object changes, so a leader that
//! releases on shutdown is replaced in about one API round trip.
//!
//! Warm standby: a controller starts its informers at once, on every
//! replica, and hands [`run_warm`] a future that resolves when their caches
//! are synced; the [`Readiness`] endpoint reports ready only then, and only
//! the leader's work (handlers and workers) waits for a term. The
//! controller calls [`Term::reconciled`] after its first reconcile, which
//! records the ramp-up time in [`LeaderMetrics`].

mod backoff;
mod error;
mod for_life;
mod kube_config_map;
mod kube_lease;
mod lease;
mod lease_api;
mod metrics;
mod readiness;
mod standby;
mod state;
mod watch_changes;

#[cfg(test)]
mod fake;
#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests;

pub use backoff::Backoff;
pub use error::{ConfigError, LockError};
pub use for_life::{ConfigMapLock, ForLifeConfig, ForLifeElector, LockObject, PodRef};
pub use kube_config_map::{own_pod, pod_ref, KubeConfigMapLock, OwnPodError};
pub use kube_lease::KubeLease;
pub use lease::{LeaseConfig, LeaseElector};
pub use lease_api::{LeaseApi, LeaseRecord, Versioned};
pub use metrics::LeaderMetrics;
pub use readiness::{serve_readiness, Readiness};
pub use standby::run_warm;
pub use state::{Leadership, LeadershipState, Status, Term};
