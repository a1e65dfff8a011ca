//! The shared informer: one cache and one list/watch per resource type,
//! however many handlers listen; and the factory that hands out one per
//! (type, namespace, selectors).
//!
//! Every change reaches the store and the handlers under one lock (the
//! dispatch lock): a handler added late takes its snapshot of the cache
//! under the same lock, so it sees each object exactly once, as an
//! initial-list add, then every later event.

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::handler::{
    spawn_listener, Event, EventHandler, EventKind, Listener, ListenerState, Msg, QueueHandler,
    Registration, Replay, Replayed,
};
use super::index::Indexers;
use super::lister_watcher::{ApiLister, ListerWatcher, Selectors};
use super::reflector::{run_reflector, run_resync};
use super::slot::CacheForm;
use super::store::Store;
use crate::classify::{ClassPolicy, EventClass, EventSource};
use crate::queue::WorkQueue;

/// How an informer lists, watches, retries and resyncs.
#[derive(Debug, Clone)]
pub struct InformerConfig {
    /// The informer's name in logs (default: its resource).
    pub name: String,
    /// Objects per list page (default 500, client-go's page size).
    pub page_size: u32,
    /// How long a watch request lasts before it is renewed from the last
    /// resourceVersion (default 5 min; each watch draws a timeout in
    /// `[t, 2t)`, as client-go does, so informers do not renew in step).
    pub watch_timeout: Duration,
    /// Replay every cached object as a no-op update this often (default:
    /// never).
    pub resync_period: Option<Duration>,
    /// The first retry delay after a failed list or watch (default 800 ms,
    /// client-go's reflector backoff).
    pub backoff_initial: Duration,
    /// The longest retry delay (default 30 s, client-go's).
    pub backoff_max: Duration,
    /// Drop `metadata.managedFields` before caching (default: keep), for
    /// controllers that never read them: each entry's field set is held as
    /// a tree of JSON maps. client-go's transform and controller-runtime's
    /// `TransformStripManagedFields` do the same.
    pub strip_managed_fields: bool,
    /// How the cache keeps objects (default: shared decoded; see
    /// [`CacheForm`] for when encoded pays).
    pub cache_form: CacheForm,
}

impl Default for InformerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            page_size: 500,
            watch_timeout: Duration::from_secs(300),
            resync_period: None,
            backoff_initial: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            strip_managed_fields: false,
            cache_form: CacheForm::Shared,
        }
    }
}

impl InformerConfig {
    /// Drops `metadata.managedFields` before caching.
    #[must_use]
    pub fn strip_managed_fields(mut self, strip: bool) -> Self {
        self.strip_managed_fields = strip;
        self
    }

    /// Sets how the cache keeps objects.
    #[must_use]
    pub fn cache_form(mut self, form: CacheForm) -> Self {
        self.cache_form = form;
        self
    }

    /// Names the informer in logs.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the periodic resync (`None`: never).
    #[must_use]
    pub fn resync_period(mut self, period: Option<Duration>) -> Self {
        self.resync_period = period;
        self
    }

    /// Sets the list page size.
    #[must_use]
    pub fn page_size(mut self, n: u32) -> Self {
        self.page_size = n.max(1);
        self
    }

    /// Sets the watch timeout.
    #[must_use]
    pub fn watch_timeout(mut self, t: Duration) -> Self {
        self.watch_timeout = t;
        self
    }

    /// Sets the retry backoff's first and longest delays.
    #[must_use]
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max.max(initial);
        self
    }
}

/// The handlers and whether the first list is in.
struct Dispatch<K> {
    listeners: Vec<Listener<K>>,
    next_id: u64,
    synced: bool,
}

pub(crate) struct Shared<K> {
    pub(crate) store: Store<K>,
    dispatch: Mutex<Dispatch<K>>,
    synced_tx: watch::Sender<bool>,
    pub(crate) config: InformerConfig,
    pub(crate) lw: Arc<dyn ListerWatcher<K>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// One change to apply: the store first, then the handlers.
pub(crate) struct Change<K> {
    pub(crate) kind: EventKind,
    pub(crate) key: String,
    /// The object after (adds and updates) or as deleted (deletes).
    pub(crate) obj: Arc<K>,
    /// Where it arose: a list (initial or re-list) or the watch.
    pub(crate) source: EventSource,
    pub(crate) final_state_unknown: bool,
}

impl<K: Resource + PartialEq + Send + Sync + 'static> Shared<K> {
    fn lock(&self) -> MutexGuard<'_, Dispatch<K>> {
        // Nothing in the dispatch state can be left half-made by a panic.
        self.dispatch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies changes to the store and hands them to every handler, all
    /// under the dispatch lock; `then_synced` marks the first list done.
    pub(crate) fn apply(&self, changes: Vec<Change<K>>, then_synced: bool) {
        let mut d = self.lock();
        for c in changes {
            let old = match c.kind {
                EventKind::Delete => self.store.remove(&c.key).or(Some(c.obj.clone())),
                EventKind::Add | EventKind::Update => self.store.put(&c.key, c.obj.clone()),
            };
            let new = (c.kind != EventKind::Delete).then_some(c.obj.as_ref());
            // An add replayed by a list is known state; the classifier
            // tells a replay from news by that.
            let known = c.source == EventSource::InitialList;
            let class = EventClass::of(c.source, old.as_deref(), new, known);
            let ev = match c.kind {
                EventKind::Delete => Event {
                    kind: EventKind::Delete,
                    key: c.key,
                    // A watch delete carries the final state; a re-list's
                    // delete only the cache's last.
                    old: if c.final_state_unknown {
                        old
                    } else {
                        Some(c.obj)
                    },
                    new: None,
                    class,
                    final_state_unknown: c.final_state_unknown,
                },
                _ => Event {
                    kind: if old.is_some() {
                        EventKind::Update
                    } else {
                        EventKind::Add
                    },
                    key: c.key,
                    old,
                    new: Some(c.obj),
                    class,
                    final_state_unknown: false,
                },
            };
            send(&mut d, Msg::Event(Arc::new(ev)));
        }
        if then_synced && !d.synced {
            d.synced = true;
            send_synced(&mut d);
            self.synced_tx.send_replace(true);
        }
    }

    /// Starts a resync round: every handler replays each cached key as a
    /// no-op update, between its events (see [`spawn_listener`]).
    pub(crate) fn resync(&self) {
        let mut d = self.lock();
        if !d.synced {
            return;
        }
        let keys: Arc<[String]> = self.store.keys().into();
        send(&mut d, Msg::Resync(keys));
    }
}

impl<K: Resource + PartialEq + Send + Sync + 'static> Replay<K> for Shared<K> {
    fn replay(&self, key: &str, caught_up: &dyn Fn() -> bool) -> Replayed<K> {
        // Under the dispatch lock no change is half-applied: the cache and
        // what was sent to the listener agree once its channel is empty.
        let _d = self.lock();
        if !caught_up() {
            return Replayed::Behind;
        }
        match self.store.get(key) {
            Some(obj) => Replayed::Object(obj),
            None => Replayed::Gone,
        }
    }
}

fn send<K>(d: &mut Dispatch<K>, msg: Msg<K>) {
    match msg {
        Msg::Event(ev) => {
            // A listener whose task has gone (its runtime stopped) is dropped.
            d.listeners
                .retain(|l| l.tx.send(Msg::Event(ev.clone())).is_ok());
        }
        Msg::Resync(keys) => {
            d.listeners
                .retain(|l| l.tx.send(Msg::Resync(keys.clone())).is_ok());
        }
        Msg::Synced => send_synced(d),
        // Only ever sent to one new listener, never broadcast.
        Msg::Initial(_) => {}
    }
}

fn send_synced<K>(d: &mut Dispatch<K>) {
    d.listeners.retain(|l| l.tx.send(Msg::Synced).is_ok());
}

/// A shared informer: a cache of one resource type kept by one list/watch,
/// and the handlers it feeds. Cloning shares it.
///
/// The intended use (warm standby): create it (or get it from an
/// [`InformerFactory`]), [`start`](Self::start) it at once so the cache
/// fills, gate readiness on [`has_synced`](Self::has_synced), and register
/// the event handlers only when this replica leads: a handler added late
/// gets every cached object as an initial-list add.
pub struct SharedInformer<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for SharedInformer<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K> std::fmt::Debug for SharedInformer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedInformer")
            .field("name", &self.shared.config.name)
            .finish()
    }
}

impl<K> SharedInformer<K>
where
    K: Resource + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// An informer over `lw` with these indexes (not started).
    pub fn new(
        lw: Arc<dyn ListerWatcher<K>>,
        indexers: Indexers<K>,
        config: InformerConfig,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                store: Store::with_form(indexers, config.cache_form),
                dispatch: Mutex::new(Dispatch {
                    listeners: Vec::new(),
                    next_id: 0,
                    synced: false,
                }),
                synced_tx: watch::channel(false).0,
                config,
                lw,
                tasks: Mutex::new(Vec::new()),
            }),
        }
    }
}

impl<K> SharedInformer<K>
where
    K: Resource + Clone + PartialEq + Send + Sync + 'static,
{
    /// Starts the list/watch (and the resync timer) on the current tokio
    /// runtime; a second call does nothing.
    pub fn start(&self) {
        let mut tasks = self.shared.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if !tasks.is_empty() {
            return;
        }
        tasks.push(tokio::spawn(run_reflector(self.shared.clone())));
        if let Some(period) = self.shared.config.resync_period {
            tasks.push(tokio::spawn(run_resync(self.shared.clone(), period)));
        }
    }

    /// Stops the list/watch and the resync timer; the cache stays as it was.
    pub fn stop(&self) {
        let mut tasks = self.shared.tasks.lock().unwrap_or_else(|p| p.into_inner());
        for t in tasks.drain(..) {
            t.abort();
        }
    }

    /// The cache (cheap to clone; reads share the cached objects).
    pub fn store(&self) -> Store<K> {
        self.shared.store.clone()
    }

    /// Adds indexes to the cache (computed at once over what it holds).
    pub fn add_indexers(&self, indexers: Indexers<K>) {
        self.shared.store.add_indexers(indexers);
    }

    /// Whether the first list is in the cache and handed to the handlers.
    pub fn has_synced(&self) -> bool {
        *self.shared.synced_tx.borrow()
    }

    /// Waits until [`has_synced`](Self::has_synced).
    pub async fn wait_for_sync(&self) {
        let mut rx = self.shared.synced_tx.subscribe();
        // The sender lives in `shared`, which `self` holds: never closed.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Registers a handler. If the informer has listed already, the handler
    /// first gets every cached object as an initial-list add.
    pub fn add_handler<H: EventHandler<K>>(&self, handler: H) -> Registration {
        let state = Arc::new(ListenerState::default());
        let replay: Weak<dyn Replay<K>> = Arc::downgrade(&self.shared) as Weak<Shared<K>>;
        let tx = spawn_listener(
            handler,
            state.clone(),
            self.shared.config.name.clone(),
            replay,
        );
        let mut d = self.shared.lock();
        // The snapshot is taken under the dispatch lock, as kept (an
        // encoded cache is decoded one object at a time as the listener
        // delivers it).
        let _ = tx.send(Msg::Initial(self.shared.store.snapshot()));
        if d.synced {
            let _ = tx.send(Msg::Synced);
        }
        let id = d.next_id;
        d.next_id += 1;
        d.listeners.push(Listener { id, tx });
        Registration { id, state }
    }

    /// Registers a [`QueueHandler`]: each event's key into `queue`, at the
    /// tier and delay `policy` gives its class.
    pub fn add_queue_handler(&self, queue: WorkQueue<String>, policy: ClassPolicy) -> Registration {
        self.add_handler(QueueHandler::new(queue, policy))
    }

    /// Removes a handler (its task ends once it has handled what it holds).
    pub fn remove_handler(&self, registration: &Registration) {
        self.shared
            .lock()
            .listeners
            .retain(|l| l.id != registration.id);
    }
}

/// An informer the factory holds, whatever its type.
trait AnyInformer: Send + Sync {
    fn start(&self);
    fn stop(&self);
    fn has_synced(&self) -> bool;
    fn as_any(&self) -> &dyn Any;
}

impl<K> AnyInformer for SharedInformer<K>
where
    K: Resource + Clone + PartialEq + Send + Sync + 'static,
{
    fn start(&self) {
        SharedInformer::start(self);
    }
    fn stop(&self) {
        SharedInformer::stop(self);
    }
    fn has_synced(&self) -> bool {
        SharedInformer::has_synced(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Hands out one [`SharedInformer`] per resource type, namespace and
/// selectors, however many controllers ask: one watch each.
pub struct InformerFactory {
    config: InformerConfig,
    informers: Mutex<HashMap<String, Box<dyn AnyInformer>>>,
}

impl std::fmt::Debug for InformerFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.lock().len();
        f.debug_struct("InformerFactory")
            .field("informers", &n)
            .finish()
    }
}

impl InformerFactory {
    /// A factory whose informers use `config` (their names are set to
    /// their keys when `config.name` is empty).
    pub fn new(config: InformerConfig) -> Self {
        Self {
            config,
            informers: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Box<dyn AnyInformer>>> {
        self.informers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The informer of what `api` addresses (its resource and namespace)
    /// with `selectors`: typed (`Api<Pod>`) or dynamic
    /// (`Api<DynamicObject>` made with an `ApiResource`).
    pub fn informer<K>(&self, api: Api<K>, selectors: Selectors) -> SharedInformer<K>
    where
        K: Resource
            + Clone
            + PartialEq
            + Serialize
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let key = format!(
            "{}?labels={}&fields={}",
            api.resource_url(),
            selectors.labels.as_deref().unwrap_or(""),
            selectors.fields.as_deref().unwrap_or("")
        );
        self.informer_with(&key, Indexers::standard(), || {
            Arc::new(ApiLister::new(api, selectors))
        })
    }

    /// The informer under `key`, made with `make` and `indexers` if there
    /// is none yet; an existing one gets those of `indexers` whose names it
    /// lacks (an index name means one function per informer, as in
    /// client-go).
    pub fn informer_with<K, F>(
        &self,
        key: &str,
        indexers: Indexers<K>,
        make: F,
    ) -> SharedInformer<K>
    where
        K: Resource + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static,
        F: FnOnce() -> Arc<dyn ListerWatcher<K>>,
    {
        // The type is part of the key: two types never share an entry.
        let full = format!("{}|{key}", std::any::type_name::<K>());
        let mut map = self.lock();
        if let Some(existing) = map.get(&full) {
            if let Some(inf) = existing.as_any().downcast_ref::<SharedInformer<K>>() {
                let store = inf.store();
                inf.add_indexers(indexers.retain(|n| !store.has_index(n)));
                return inf.clone();
            }
        }
        let mut config = self.config.clone();
        if config.name.is_empty() {
            config.name = key.to_string();
        }
        let inf = SharedInformer::new(make(), indexers, config);
        map.insert(full, Box::new(inf.clone()));
        inf
    }

    /// Starts every informer made so far (on the current tokio runtime).
    pub fn start(&self) {
        for inf in self.lock().values() {
            inf.start();
        }
    }

    /// Stops every informer.
    pub fn stop(&self) {
        for inf in self.lock().values() {
            inf.stop();
        }
    }

    /// Whether every informer made so far has synced (a readiness gate).
    pub fn has_synced(&self) -> bool {
        self.lock().values().all(|i| i.has_synced())
    }
}
