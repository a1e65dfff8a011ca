//! The pod lifecycle event generator (PLEG): learns what changed in the
//! runtime, keeps the [`PodCache`] fresh and tells the pod workers.
//!
//! Work in progress: the signatures are final, the body lands next.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::cache::PodCache;
use crate::config::PlegMode;
use crate::cri::{CriError, RuntimeApi};
use crate::health::Health;
use crate::metrics::AgentMetrics;
use crate::types::PodUid;

/// Capacity of the lifecycle event channel (kubelet's).
pub const EVENT_CHANNEL_CAPACITY: usize = 1000;

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

/// One lifecycle event for the pod workers.
#[derive(Debug, Clone)]
pub struct PodLifecycleEvent {
    /// The pod.
    pub uid: PodUid,
    /// What happened.
    pub kind: PodLifecycleEventType,
    /// The container (or sandbox) id it happened to.
    pub container_id: String,
}

/// The PLEG's settings.
#[derive(Debug, Clone)]
pub struct PlegConfig {
    /// Auto, events or relist.
    pub mode: PlegMode,
    /// Relist period in relist mode.
    pub relist_period: Duration,
    /// Safety-net relist period in event mode.
    pub event_relist_period: Duration,
    /// Concurrent pod inspections.
    pub inspect_concurrency: usize,
    /// Only sandboxes and containers labelled with this node are ours.
    pub node_name: String,
}

struct Inner {
    #[allow(dead_code)]
    runtime: Arc<dyn RuntimeApi>,
    #[allow(dead_code)]
    cache: Arc<PodCache>,
    #[allow(dead_code)]
    health: Arc<Health>,
    #[allow(dead_code)]
    metrics: AgentMetrics,
    #[allow(dead_code)]
    config: PlegConfig,
    #[allow(dead_code)]
    events: mpsc::Sender<PodLifecycleEvent>,
}

/// The PLEG. Cheap to clone (shared state inside).
#[derive(Clone)]
pub struct Pleg {
    #[allow(dead_code)]
    inner: Arc<Inner>,
}

impl Pleg {
    /// Creates the PLEG. The receiver gets lifecycle events (a bounded
    /// channel of 1000; when full, the event is dropped and
    /// `kubelet_pleg_discard_events` counted).
    pub fn new(
        runtime: Arc<dyn RuntimeApi>,
        cache: Arc<PodCache>,
        health: Arc<Health>,
        metrics: AgentMetrics,
        config: PlegConfig,
    ) -> (Self, mpsc::Receiver<PodLifecycleEvent>) {
        let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        let inner = Inner {
            runtime,
            cache,
            health,
            metrics,
            config,
            events: tx,
        };
        (
            Self {
                inner: Arc::new(inner),
            },
            rx,
        )
    }

    /// Runs until aborted (the caller aborts the task on shutdown).
    pub async fn run(self) {
        std::future::pending::<()>().await;
    }

    /// Inspects one pod now (a single-pod relist) and writes the result to
    /// the cache with a timestamp taken before the inspection began. Used
    /// by pod workers that need status newer than their last action.
    pub async fn inspect(&self, _uid: &str) -> Result<(), CriError> {
        Ok(())
    }

    /// The mode in use, once decided and the first relist succeeded
    /// (adoption may start then): `Some(Events)` or `Some(Relist)`.
    pub fn mode_in_use(&self) -> Option<PlegMode> {
        None
    }
}
