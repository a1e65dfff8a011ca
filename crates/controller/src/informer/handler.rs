//! Handlers: what a controller registers to hear an informer's events.
//!
//! Each registration gets its own unbounded channel and task (client-go's
//! `processorListener`), so a slow handler delays only itself, and each
//! call runs under `catch_unwind`, so a handler that panics loses that one
//! event, is counted, and keeps the informer and the other handlers going.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;

use crate::classify::{ClassPolicy, EventClass};
use crate::queue::WorkQueue;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// It appeared (created, or replayed by a list).
    Add,
    /// It changed (or a resync replayed it unchanged).
    Update,
    /// It went.
    Delete,
}

/// One event, classified where it arose.
#[derive(Debug)]
pub struct Event<K> {
    /// Add, update or delete.
    pub kind: EventKind,
    /// The object's key, `namespace/name` or `name`.
    pub key: String,
    /// The object before (updates and deletes).
    pub old: Option<Arc<K>>,
    /// The object after (adds and updates).
    pub new: Option<Arc<K>>,
    /// Initial list, no-op resync or user change.
    pub class: EventClass,
    /// A delete found by a re-list, not seen on the watch: `old` is the
    /// last state the cache knew, not the object's final state (client-go's
    /// `DeletedFinalStateUnknown`).
    pub final_state_unknown: bool,
}

/// Hears an informer's events. Called from the registration's own task,
/// one event at a time, in order.
pub trait EventHandler<K>: Send + Sync + 'static {
    /// One event.
    fn on_event(&self, event: &Event<K>);
}

impl<K, F> EventHandler<K> for F
where
    F: Fn(&Event<K>) + Send + Sync + 'static,
{
    fn on_event(&self, event: &Event<K>) {
        self(event);
    }
}

/// The handler most controllers want: each event's key into a
/// [`WorkQueue`], at the tier and after the delay its class maps to.
pub struct QueueHandler {
    queue: WorkQueue<String>,
    policy: ClassPolicy,
    rng: Mutex<StdRng>,
}

impl std::fmt::Debug for QueueHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueHandler")
            .field("queue", &self.queue.name())
            .field("policy", &self.policy)
            .finish()
    }
}

impl QueueHandler {
    /// Feeds `queue` by `policy`.
    pub fn new(queue: WorkQueue<String>, policy: ClassPolicy) -> Self {
        Self {
            queue,
            policy,
            rng: Mutex::new(StdRng::from_entropy()),
        }
    }

    /// Draws the spreading delays from a seeded RNG (reproducible tests).
    #[must_use]
    pub fn seed(self, seed: u64) -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            ..self
        }
    }
}

impl<K: 'static> EventHandler<K> for QueueHandler {
    fn on_event(&self, event: &Event<K>) {
        let decision = {
            // The RNG holds no invariant a panic could break.
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            self.policy.decide(event.class, &mut *rng)
        };
        match decision.delay {
            Some(d) if !d.is_zero() => {
                self.queue
                    .add_after(event.key.clone(), decision.priority, d);
            }
            _ => self.queue.add(event.key.clone(), decision.priority),
        }
    }
}

/// What a listener's task receives.
pub(crate) enum Msg<K> {
    /// An event.
    Event(Arc<Event<K>>),
    /// Every event of the initial list (or the snapshot given to a late
    /// handler) came before this.
    Synced,
}

/// The state a registration shares with its task.
#[derive(Debug, Default)]
pub(crate) struct ListenerState {
    pub(crate) synced: AtomicBool,
    pub(crate) panics: AtomicU64,
    pub(crate) handled: AtomicU64,
}

/// A registered handler, as the informer keeps it.
pub(crate) struct Listener<K> {
    pub(crate) id: u64,
    pub(crate) tx: mpsc::UnboundedSender<Msg<K>>,
}

/// Starts a handler's task; returns its sender and shared state.
pub(crate) fn spawn_listener<K, H>(
    handler: H,
    state: Arc<ListenerState>,
    informer: String,
) -> mpsc::UnboundedSender<Msg<K>>
where
    K: Send + Sync + 'static,
    H: EventHandler<K>,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg<K>>();
    tokio::spawn(async move {
        let mut panicked = false;
        while let Some(msg) = rx.recv().await {
            match msg {
                Msg::Synced => state.synced.store(true, Ordering::Release),
                Msg::Event(ev) => {
                    let outcome = catch_unwind(AssertUnwindSafe(|| handler.on_event(&ev)));
                    state.handled.fetch_add(1, Ordering::AcqRel);
                    if outcome.is_err() {
                        state.panics.fetch_add(1, Ordering::AcqRel);
                        // Once per handler: a handler that panics on every
                        // event must not flood the log.
                        if !panicked {
                            tracing::error!(
                                informer = %informer,
                                key = %ev.key,
                                "event handler panicked; the informer goes on"
                            );
                            panicked = true;
                        }
                    }
                }
            }
        }
    });
    tx
}

/// A handler's registration: its progress, and the means to remove it.
#[derive(Debug, Clone)]
pub struct Registration {
    pub(crate) id: u64,
    pub(crate) state: Arc<ListenerState>,
}

impl Registration {
    /// Whether this handler has handled every event of the initial list
    /// (or, registered late, of the snapshot it was given).
    pub fn has_synced(&self) -> bool {
        self.state.synced.load(Ordering::Acquire)
    }

    /// How many calls of this handler panicked.
    pub fn panics(&self) -> u64 {
        self.state.panics.load(Ordering::Acquire)
    }

    /// How many events this handler was called with.
    pub fn handled(&self) -> u64 {
        self.state.handled.load(Ordering::Acquire)
    }
}
