//! The pod lifecycle event generator (PLEG): learns what changed in the
//! runtime, keeps the [`PodCache`] fresh and tells its [`EventSink`] (in
//! the agent: the pod's status published at once and its sync queued,
//! straight from the PLEG's own tasks).
//!
//! Two ways to learn, one truth (the runtime):
//! - **Relist** (`relist`): list everything this node made, diff it with
//!   the previous relist, inspect the changed pods (concurrently, bounded)
//!   and emit kubelet's lifecycle events. Every `relist_period` (1 s) in
//!   relist mode and whenever the event stream is down.
//! - **Events** (`evented`): each event of `GetContainerEvents` says its
//!   pod changed. When its payload (the sandbox's status and its
//!   containers') is the whole pod as last seen and newer than the cache,
//!   it becomes the cached status without a call (`payload`); otherwise the
//!   pod is inspected at once. The event is emitted after the cache write.
//!   A full relist runs after every (re)connect and every
//!   `event_relist_period` (5 min) as a safety net. The stream reconnects
//!   forever with capped backoff (`driver`).
//!
//! Only sandboxes and containers labelled with this node
//! ([`LABEL_MANAGED_BY`](crate::types::LABEL_MANAGED_BY)) are ever listed or
//! inspected. Every inspection writes the cache with the time it began,
//! every payload with its event's creation time, so the cache never goes
//! backwards whatever the interleaving.
//!
//! Health: relist mode (or a disconnected stream) is healthy while a relist
//! succeeded within `relist_threshold` (3 min). While the stream is
//! connected the threshold grows by `event_relist_period`, so the PLEG stays
//! healthy between safety-net relists but a runtime whose relists keep
//! failing is still reported (after 8 min by default).

mod driver;
mod evented;
mod events;
#[cfg(test)]
pub(crate) mod fake;
mod ids;
mod inspect;
mod payload;
mod relist;
mod seen;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify, Semaphore};

use crate::cache::{now_ns, PodCache};
use crate::config::PlegMode;
use crate::cri::{CriError, RuntimeObserver};
use crate::health::Health;
use crate::metrics::AgentMetrics;
use crate::types::PodUid;

/// What happened to a container (or sandbox) of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodLifecycleEventType {
    /// It is now running.
    ContainerStarted,
    /// It exited (or vanished without being seen exited).
    ContainerDied,
    /// It was removed from the runtime.
    ContainerRemoved,
    /// Its state became unknown (never sent, kept for kubelet parity).
    ContainerChanged,
}

impl PodLifecycleEventType {
    /// Whether the pod needs a sync for it (kubelet's isSyncPodWorthy): a
    /// removal is no news to act on (a container removed while it ran was
    /// reported dead first).
    pub fn wants_sync(self) -> bool {
        !matches!(self, Self::ContainerRemoved | Self::ContainerChanged)
    }
}

/// One lifecycle event. The cache already holds the inspection that found
/// it when the sink gets it. The sink uses the pod and the kind; the
/// container lets the PLEG report a burst of news about one container
/// once.
#[derive(Debug, Clone)]
pub struct PodLifecycleEvent {
    /// The pod.
    pub uid: PodUid,
    /// What happened.
    pub kind: PodLifecycleEventType,
    /// The container (or sandbox) id it happened to.
    pub container_id: String,
}

/// Where the PLEG delivers its lifecycle events: called from the PLEG's
/// own tasks (relists, event-driven inspections, [`Pleg::inspect`]) once
/// the cache holds the inspection that found the change. It must not
/// block or wait: the PLEG never waits on its consumer.
pub type EventSink = Arc<dyn Fn(PodLifecycleEvent) + Send + Sync>;

/// The PLEG's settings.
#[derive(Debug, Clone)]
pub struct PlegConfig {
    /// Auto, events or relist.
    pub mode: PlegMode,
    /// Relist period in relist mode (and while the stream is down).
    pub relist_period: Duration,
    /// Safety-net relist period while the event stream is connected.
    pub event_relist_period: Duration,
    /// Concurrent pod inspections (relist, events and [`Pleg::inspect`]
    /// together).
    pub inspect_concurrency: usize,
    /// Only sandboxes and containers labelled with this node are ours.
    pub node_name: String,
}

struct Inner {
    runtime: Arc<dyn RuntimeObserver>,
    cache: Arc<PodCache>,
    health: Arc<Health>,
    metrics: AgentMetrics,
    config: PlegConfig,
    emitter: events::Emitter,
    /// Bounds concurrent inspections of every origin.
    permits: Semaphore,
    /// Each pod's newest listing, from which lifecycle events are made.
    seen: seen::Seen,
    /// Container and sandbox id → pod, for events naming only an id.
    ids: ids::IdMap,
    /// The previous relist; held for a whole relist, so relists never
    /// overlap.
    relist: tokio::sync::Mutex<relist::RelistState>,
    /// Pods whose last inspection failed: re-inspected by the next relist.
    reinspect: Mutex<HashSet<PodUid>>,
    /// Pods with an event-triggered inspection in flight.
    work: Mutex<evented::WorkMap>,
    /// Asks the main loop for a full relist now.
    relist_wanted: Notify,
    /// The mode in use: None until the first relist succeeded (adoption
    /// waits for it); then Events or Relist, as the driver says (see
    /// [`Pleg::mode_in_use`]).
    ready: watch::Sender<Option<PlegMode>>,
}

impl Inner {
    fn reinspect_lock(&self) -> MutexGuard<'_, HashSet<PodUid>> {
        // Single-operation updates: a poisoned lock is still consistent.
        self.reinspect.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn work_lock(&self) -> MutexGuard<'_, evented::WorkMap> {
        self.work.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A runtime that cannot be reached makes the agent unhealthy until
    /// the next successful relist.
    fn note_runtime_error(&self, e: &CriError) {
        if e.is_unavailable() {
            self.health.set_runtime_error(Some(e.to_string()));
        }
    }
}

/// The PLEG. Cheap to clone (shared state inside).
#[derive(Clone)]
pub struct Pleg {
    inner: Arc<Inner>,
}

impl Pleg {
    /// Creates the PLEG; its lifecycle events go to `sink` (no channel, no
    /// bound: the agent's sink is the work queue, which keeps one entry
    /// per pod, so `kubelet_pleg_discard_events` stays 0).
    pub fn new(
        runtime: Arc<dyn RuntimeObserver>,
        cache: Arc<PodCache>,
        health: Arc<Health>,
        metrics: AgentMetrics,
        config: PlegConfig,
        sink: EventSink,
    ) -> Self {
        let inner = Inner {
            runtime,
            cache,
            health,
            emitter: events::Emitter::new(sink),
            metrics,
            permits: Semaphore::new(config.inspect_concurrency.max(1)),
            config,
            seen: seen::Seen::default(),
            ids: ids::IdMap::default(),
            relist: tokio::sync::Mutex::new(relist::RelistState::default()),
            reinspect: Mutex::new(HashSet::new()),
            work: Mutex::new(evented::WorkMap::new()),
            relist_wanted: Notify::new(),
            ready: watch::Sender::new(None),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Runs until aborted (the caller aborts the task on shutdown; the
    /// inspections it started are aborted with it).
    pub async fn run(self) {
        self.run_loop().await;
    }

    /// Inspects one pod now (a single-pod relist) and writes the result to
    /// the cache with a timestamp taken before the inspection began. Used
    /// by pod workers that need status newer than their last action. A
    /// failure is cached too (waiters wake and see it) and returned. The
    /// lifecycle events of any change found are emitted after the write.
    pub async fn inspect(&self, uid: &str) -> Result<(), CriError> {
        let permit = self.inner.permits.acquire().await;
        let ts = now_ns();
        let (events, result) = self.inspect_at(uid, ts).await;
        drop(permit);
        for ev in events {
            self.inner.emitter.emit(ev);
        }
        result
    }

    /// The mode in use, once decided and the first relist succeeded
    /// (adoption may start then): `Some(Events)` or `Some(Relist)`. In auto
    /// mode with the runtime unreachable at start it may read `Relist`
    /// first and turn to `Events` when the stream connects.
    pub fn mode_in_use(&self) -> Option<PlegMode> {
        *self.inner.ready.borrow()
    }

    /// Waits until the first relist succeeded; returns the mode in use
    /// then (see [`Pleg::mode_in_use`]).
    pub async fn wait_ready(&self) -> PlegMode {
        let mut rx = self.inner.ready.subscribe();
        let mode = match rx.wait_for(Option::is_some).await {
            Ok(mode) => *mode,
            // The sender lives in `self`: it cannot be gone.
            Err(_) => None,
        };
        mode.unwrap_or(PlegMode::Relist)
    }

    /// The first relist succeeded.
    fn is_ready(&self) -> bool {
        self.inner.ready.borrow().is_some()
    }

    /// Publishes the mode in use (the first time: the first relist
    /// succeeded).
    fn set_ready(&self, mode: PlegMode) {
        self.inner.ready.send_replace(Some(mode));
    }

    /// Lists and inspects `uid` (only what this node made), caches the
    /// result stamped `ts` and records the listing. Returns the lifecycle
    /// events of the changes found (for the caller to emit) and the
    /// outcome.
    async fn inspect_at(
        &self,
        uid: &str,
        ts: i64,
    ) -> (Vec<PodLifecycleEvent>, Result<(), CriError>) {
        let inner = &self.inner;
        let rt = inner.runtime.as_ref();
        let mut events = Vec::new();
        let result = match inspect::list_pod(rt, &inner.config.node_name, uid).await {
            Ok(listing) => {
                inner.ids.insert(uid, listing.ids());
                let now_seen = seen::PodSeen::of(ts, Some(&listing));
                if let seen::Observed::Fresh { events: e, .. } = inner.seen.observe(uid, now_seen) {
                    events = e;
                    self.record_gauges();
                }
                inspect::inspect_listed(rt, uid, &listing).await
            }
            Err(e) => Err(e),
        };
        let result = match result {
            Ok(status) => {
                inner.cache.set(uid, Ok(Arc::new(status)), ts);
                Ok(())
            }
            Err(e) => {
                inner.note_runtime_error(&e);
                inner.cache.set(uid, Err(e.to_string()), ts);
                inner.reinspect_lock().insert(uid.to_string());
                Err(e)
            }
        };
        (events, result)
    }
}
