//! Handlers: what a controller registers to hear an informer's events.
//!
//! Each registration gets its own unbounded channel and task (client-go's
//! `processorListener`), so a slow handler delays only itself, and each
//! call runs under `catch_unwind`, so a handler that panics loses that one
//! event, is counted, and keeps the informer and the other handlers going.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;

use super::slot::{Delivery, Snapshot};
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
    /// The cache as a late handler found it: each object an initial-list
    /// add, decoded as it is delivered, one at a time while no event waits
    /// (an event for a key not delivered yet brings its add forward).
    Initial(Snapshot<K>),
    /// A resync round: these keys are replayed one at a time from the
    /// cache, each only when no event waits (a newer round replaces an
    /// unfinished one: it replays every key again).
    Resync(Arc<[String]>),
}

/// What a listener finds when it replays one key of a resync.
pub(crate) enum Replayed<K> {
    /// The cached object, as of the last event the listener received.
    Object(Arc<K>),
    /// The key is no longer cached: nothing to replay.
    Gone,
    /// An event waits in the listener's channel: handle it first (the
    /// cache is already ahead of what the handler has seen).
    Behind,
}

/// Where a listener's resync replays come from: the informer's cache,
/// read under the lock that orders the cache's changes with their events,
/// so a replay never shows a handler a state ahead of the events it has.
pub(crate) trait Replay<K>: Send + Sync {
    /// The cached `key` if `caught_up()` holds under that lock.
    fn replay(&self, key: &str, caught_up: &dyn Fn() -> bool) -> Replayed<K>;
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

/// Starts a handler's task; returns its sender. Events are handled in
/// order; a resync round's replays only between them, one at a time, so an
/// event never waits behind a whole round (10 000 replays take tens of
/// milliseconds of handler time).
pub(crate) fn spawn_listener<K, H>(
    handler: H,
    state: Arc<ListenerState>,
    informer: String,
    replay: Weak<dyn Replay<K>>,
) -> mpsc::UnboundedSender<Msg<K>>
where
    K: Send + Sync + 'static,
    H: EventHandler<K>,
{
    let (tx, rx) = mpsc::unbounded_channel::<Msg<K>>();
    let task = ListenerTask {
        handler,
        state,
        informer,
        panicked: false,
    };
    tokio::spawn(task.run(rx, replay));
    tx
}

/// A listener's task: its handler and what it counts.
/// A cached object's add for a handler that has not seen it.
fn initial_add<K>(key: String, obj: Arc<K>) -> Event<K> {
    Event {
        kind: EventKind::Add,
        key,
        old: None,
        class: EventClass::InitialList,
        new: Some(obj),
        final_state_unknown: false,
    }
}

struct ListenerTask<H> {
    handler: H,
    state: Arc<ListenerState>,
    informer: String,
    panicked: bool,
}

impl<H> ListenerTask<H> {
    async fn run<K>(mut self, mut rx: mpsc::UnboundedReceiver<Msg<K>>, replay: Weak<dyn Replay<K>>)
    where
        K: Send + Sync + 'static,
        H: EventHandler<K>,
    {
        // The round being replayed and the next key's index.
        let mut round: Option<(Arc<[String]>, usize)> = None;
        // The cache as this handler was added, being delivered, and
        // whether the informer's Synced came meanwhile.
        let mut initial: Option<Delivery<K>> = None;
        let mut synced_after = false;
        loop {
            let msg = match rx.try_recv() {
                Ok(msg) => msg,
                Err(mpsc::error::TryRecvError::Disconnected) => return,
                Err(mpsc::error::TryRecvError::Empty) if initial.is_some() => {
                    let next = initial.as_mut().and_then(Delivery::next);
                    if let Some((key, obj)) = next {
                        self.handle(&initial_add(key, obj));
                    }
                    if initial.as_ref().is_none_or(Delivery::is_done) {
                        initial = None;
                        if synced_after {
                            self.state.synced.store(true, Ordering::Release);
                        }
                    }
                    tokio::task::yield_now().await;
                    continue;
                }
                Err(mpsc::error::TryRecvError::Empty) if round.is_some() => {
                    self.replay_next(&mut round, &rx, &replay);
                    // Lets the watch that feeds this channel run between
                    // replays, on any runtime.
                    tokio::task::yield_now().await;
                    continue;
                }
                Err(mpsc::error::TryRecvError::Empty) => match rx.recv().await {
                    Some(msg) => msg,
                    None => return,
                },
            };
            match msg {
                Msg::Synced if initial.is_some() => synced_after = true,
                Msg::Synced => self.state.synced.store(true, Ordering::Release),
                Msg::Event(ev) => {
                    // The key's initial add first, if it is still to come.
                    if let Some((key, obj)) = initial.as_mut().and_then(|d| d.take(&ev.key)) {
                        self.handle(&initial_add(key, obj));
                    }
                    self.handle(&ev);
                }
                Msg::Initial(snapshot) => initial = Some(snapshot.into()),
                Msg::Resync(keys) => round = Some((keys, 0)),
            }
        }
    }

    /// Replays the round's next key, unless an event came in meanwhile.
    fn replay_next<K>(
        &mut self,
        round: &mut Option<(Arc<[String]>, usize)>,
        rx: &mpsc::UnboundedReceiver<Msg<K>>,
        replay: &Weak<dyn Replay<K>>,
    ) where
        H: EventHandler<K>,
    {
        let Some((keys, next)) = round.as_mut() else {
            return;
        };
        // The round is done, or the informer itself has gone.
        let (Some(key), Some(source)) = (keys.get(*next), replay.upgrade()) else {
            *round = None;
            return;
        };
        match source.replay(key, &|| rx.is_empty()) {
            Replayed::Object(obj) => {
                let ev = Event {
                    kind: EventKind::Update,
                    key: key.clone(),
                    old: Some(obj.clone()),
                    new: Some(obj),
                    // The cache's own object, replayed: equal by identity,
                    // no deep comparison needed.
                    class: EventClass::NoOpResync,
                    final_state_unknown: false,
                };
                *next += 1;
                self.handle(&ev);
            }
            Replayed::Gone => *next += 1,
            Replayed::Behind => {}
        }
    }

    /// Calls the handler with one event; a panic loses that event only.
    fn handle<K>(&mut self, ev: &Event<K>)
    where
        H: EventHandler<K>,
    {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.handler.on_event(ev)));
        self.state.handled.fetch_add(1, Ordering::AcqRel);
        if outcome.is_err() {
            self.state.panics.fetch_add(1, Ordering::AcqRel);
            // Once per handler: a handler that panics on every event must
            // not flood the log.
            if !self.panicked {
                tracing::error!(
                    informer = %self.informer,
                    key = %ev.key,
                    "event handler panicked; the informer goes on"
                );
                self.panicked = true;
            }
        }
    }
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
