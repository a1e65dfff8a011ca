//! The work queue: client-go's semantics, priority tiers and a starvation
//! bound.
//!
//! One `std::sync::Mutex` guards the whole state; every operation takes it
//! once, briefly, and never awaits while holding it. Waiting items live in
//! one FIFO per tier (a `VecDeque` of slots sorted by the time the item
//! became ready, then arrival) and delayed ones in a heap; a map from key to
//! entry says where each key is, so a slot or heap entry the key has moved
//! away from (its priority was raised, it was added again sooner) is
//! recognised as stale and skipped when it surfaces, instead of being
//! searched for and removed.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::registry::Registry;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::delay::DelayHeap;
use crate::metrics::{self, InFlight, Metrics};
use crate::ratelimit::{default_controller_rate_limiter, RateLimiter};
use crate::resync::spread_delay;

/// How urgent an item is. Ordered: `Background < Normal < Urgent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Work nobody waits for: the initial list of known objects after a
    /// restart, no-op resyncs, housekeeping.
    Background,
    /// Ordinary work: the controller's own re-queues.
    Normal,
    /// Work someone waits for: user-triggered changes, deletes, container
    /// deaths.
    Urgent,
}

impl Priority {
    /// Every tier, in the order they are served.
    pub const ALL: [Priority; 3] = [Priority::Urgent, Priority::Normal, Priority::Background];

    /// The tier's name as it appears in metric labels.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Urgent => "urgent",
            Self::Normal => "normal",
            Self::Background => "background",
        }
    }

    /// Position in [`Priority::ALL`].
    pub(crate) const fn index(self) -> usize {
        match self {
            Self::Urgent => 0,
            Self::Normal => 1,
            Self::Background => 2,
        }
    }
}

/// Upper bound of a delay (a hundred years): keeps `Instant` arithmetic
/// from overflowing on absurd inputs.
const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How a [`WorkQueue`] behaves. Build it from [`QueueConfig::default`] and
/// the setters.
#[must_use]
pub struct QueueConfig<K> {
    name: String,
    max_wait: Duration,
    resync_window: Duration,
    lower_tier_limit: Option<usize>,
    lower_tier_share: f64,
    rate_limiter: Box<dyn RateLimiter<K>>,
    seed: Option<u64>,
}

impl<K> fmt::Debug for QueueConfig<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueConfig")
            .field("name", &self.name)
            .field("max_wait", &self.max_wait)
            .field("resync_window", &self.resync_window)
            .field("lower_tier_limit", &self.lower_tier_limit)
            .field("lower_tier_share", &self.lower_tier_share)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl<K> Default for QueueConfig<K>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// Name `"default"`, starvation bound 5 s, resync window 5 s, no limit
    /// and no pacing of lower tiers, client-go's default rate limiter, RNG
    /// seeded from the operating system.
    fn default() -> Self {
        Self {
            name: "default".to_owned(),
            max_wait: Duration::from_secs(5),
            resync_window: Duration::from_secs(5),
            lower_tier_limit: None,
            lower_tier_share: 1.0,
            rate_limiter: Box::new(default_controller_rate_limiter::<K>()),
            seed: None,
        }
    }
}

impl<K> QueueConfig<K> {
    /// The queue's name: the `name` label of its metrics.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The starvation bound (default 5 s): once a lower tier's item has
    /// been ready this long, it gets every other turn from the higher
    /// tiers (oldest starved first) until none is starved.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The window [`WorkQueue::add_resync`] spreads its random delays over
    /// (default 5 s).
    pub fn resync_window(mut self, window: Duration) -> Self {
        self.resync_window = window;
        self
    }

    /// At most `limit` items below [`Priority::Urgent`] are processed at
    /// once (default: no limit; at least 1). With N workers, `N - 1` keeps a
    /// worker free for urgent items, so an urgent item never waits for a
    /// background reconcile to finish.
    pub fn lower_tier_limit(mut self, limit: usize) -> Self {
        self.lower_tier_limit = Some(limit.max(1));
        self
    }

    /// Paces the tiers below [`Priority::Urgent`] to `share` of the time
    /// (default 1: no pacing; clamped to 0.01..=1): after a lower-tier item
    /// is done, the next one starts no sooner than its processing time ×
    /// (1 − share) / share later, and these rests add up. Background
    /// reconciles that write to the API server then load it at most
    /// `share` of what they could, so a user's change meets a server with
    /// room to spare; the pace adapts by itself (a reconcile that writes
    /// and waits rests long, one that finds nothing to do barely at all).
    /// The starvation bound still orders turns; pacing caps how many lower
    /// turns there are. A queue shutting down does not pace.
    pub fn lower_tier_share(mut self, share: f64) -> Self {
        self.lower_tier_share = if share.is_nan() {
            1.0
        } else {
            share.clamp(0.01, 1.0)
        };
        self
    }

    /// The rate limiter of [`WorkQueue::add_rate_limited`] (default:
    /// client-go's, see [`default_controller_rate_limiter`]).
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<K> + 'static) -> Self {
        self.rate_limiter = Box::new(limiter);
        self
    }

    /// Seeds the RNG of [`WorkQueue::add_resync`], for reproducible delays.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

/// An item handed to a worker by [`WorkQueue::get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item<K> {
    /// The key; pass it to [`WorkQueue::done`] when finished.
    pub key: K,
    /// The tier it was served from.
    pub priority: Priority,
    /// How long it waited, ready, before this worker took it.
    pub waited: Duration,
}

/// A prioritized, delaying work queue with client-go's semantics.
///
/// A cheap handle: clones share one queue. See the crate documentation for
/// the rules it keeps.
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K> fmt::Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueue")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

struct Inner<K> {
    name: String,
    max_wait: Duration,
    resync_window: Duration,
    lower_tier_limit: usize,
    /// Rest per second of lower-tier processing: (1 − share) / share.
    lower_rest_ratio: f64,
    limiter: Box<dyn RateLimiter<K>>,
    state: Mutex<State<K>>,
    /// Items became ready, a lower-tier slot freed, or the queue shut down.
    ready: Notify,
    /// The earliest ready time changed (only the timer owner listens).
    timer: Notify,
    /// Nothing is processed and nothing ready any more (during shutdown).
    drained: Notify,
    metrics: Metrics,
}

/// Where a key waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Not waiting.
    No,
    /// In the FIFO of tier `prio`, ready since `since`.
    Ready {
        prio: Priority,
        since: Instant,
        seq: u64,
    },
    /// In the heap until `at`.
    Delayed {
        prio: Priority,
        at: Instant,
        seq: u64,
    },
    /// Being processed and added again meanwhile: ready again on `done`.
    Dirty { prio: Priority },
}

#[derive(Debug, Clone, Copy)]
struct Processing {
    started: Instant,
    tier: Priority,
    slot: usize,
}

#[derive(Debug)]
struct Entry {
    wait: Wait,
    processing: Option<Processing>,
}

/// A place in a tier's FIFO.
#[derive(Debug)]
struct Slot<K> {
    since: Instant,
    seq: u64,
    key: K,
}

struct State<K> {
    entries: HashMap<K, Entry>,
    tiers: [VecDeque<Slot<K>>; 3],
    /// Live (not stale) slots per tier.
    counts: [usize; 3],
    delayed: DelayHeap<K>,
    /// Start times of the items being processed; `None` is a free slot.
    in_flight: Vec<Option<Instant>>,
    free_slots: Vec<usize>,
    processing: usize,
    lower_processing: usize,
    /// Lower tiers rest (pacing) until then.
    lower_rest_until: Option<Instant>,
    next_seq: u64,
    shutting_down: bool,
    /// A getter sleeps until the earliest ready time; the others only wait
    /// for a notification (one timer, not one per idle worker).
    timer_owner: bool,
    /// The last item served was a starved one of a lower tier chosen over
    /// the highest tier's: the next turn goes to the highest tier.
    starved_turn: bool,
    rng: StdRng,
}

/// What an add changed, for the notifications sent after unlocking.
#[derive(Debug, Default, Clone, Copy)]
struct Wake {
    ready: bool,
    timer: bool,
}

impl<K> WorkQueue<K>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// A new, empty queue.
    #[must_use]
    pub fn new(config: QueueConfig<K>) -> Self {
        let rng = match config.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_entropy(),
        };
        Self {
            inner: Arc::new(Inner {
                name: config.name,
                max_wait: config.max_wait,
                resync_window: config.resync_window,
                lower_tier_limit: config.lower_tier_limit.unwrap_or(usize::MAX),
                lower_rest_ratio: (1.0 - config.lower_tier_share) / config.lower_tier_share,
                limiter: config.rate_limiter,
                state: Mutex::new(State {
                    entries: HashMap::new(),
                    tiers: Default::default(),
                    counts: [0; 3],
                    delayed: DelayHeap::default(),
                    in_flight: Vec::new(),
                    free_slots: Vec::new(),
                    processing: 0,
                    lower_processing: 0,
                    lower_rest_until: None,
                    next_seq: 0,
                    shutting_down: false,
                    timer_owner: false,
                    starved_turn: false,
                    rng,
                }),
                ready: Notify::new(),
                timer: Notify::new(),
                drained: Notify::new(),
                metrics: Metrics::new(),
            }),
        }
    }

    /// The queue's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Registers the queue's metrics (client-go's names, label `name`) in
    /// `registry`.
    pub fn register(&self, registry: &mut Registry) {
        self.inner
            .metrics
            .register(registry, &self.inner.name, metrics::downgrade(&self.inner));
    }

    /// Adds `key` now at `priority`.
    ///
    /// A key already waiting is not queued twice: it keeps the higher of the
    /// two priorities and the earlier ready time (a delayed key becomes
    /// ready now). A key being processed is marked dirty and queued again
    /// when its worker calls [`done`](Self::done). Ignored after shutdown.
    pub fn add(&self, key: K, priority: Priority) {
        self.add_after(key, priority, Duration::ZERO);
    }

    /// Adds `key` at `priority` once `delay` has passed (a zero delay is
    /// [`add`](Self::add)). Merged with a waiting copy as `add` does.
    pub fn add_after(&self, key: K, priority: Priority, delay: Duration) {
        let wake = {
            let mut st = self.inner.lock();
            let now = Instant::now();
            self.inner.enqueue(&mut st, key, priority, delay, now)
        };
        self.inner.wake(wake);
    }

    /// Adds `key` at `priority` after the rate limiter's delay for it, and
    /// counts a retry.
    pub fn add_rate_limited(&self, key: K, priority: Priority) {
        let delay = self.inner.limiter.when(&key);
        self.inner.metrics.retry();
        self.add_after(key, priority, delay);
    }

    /// Adds `key` at [`Priority::Background`] after a random delay uniform
    /// in `[0, resync_window)`, so a periodic resync of many keys arrives as
    /// a trickle rather than a burst.
    pub fn add_resync(&self, key: K) {
        let wake = {
            let mut st = self.inner.lock();
            let now = Instant::now();
            let delay = spread_delay(self.inner.resync_window, &mut st.rng);
            self.inner
                .enqueue(&mut st, key, Priority::Background, delay, now)
        };
        self.inner.wake(wake);
    }

    /// Forgets `key` in the rate limiter: its next failure starts from the
    /// first backoff step again. Call it when the key succeeded.
    pub fn forget(&self, key: &K) {
        self.inner.limiter.forget(key);
    }

    /// How many times `key` was re-added by the rate limiter since it was
    /// last forgotten.
    #[must_use]
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.inner.limiter.retries(key)
    }

    /// Waits for the next item. Returns `None` only once the queue is shut
    /// down and nothing ready remains.
    ///
    /// Ready items are served by tier (urgent first), then in the order they
    /// became ready; while a lower tier's item has been ready for longer
    /// than the starvation bound, every other item served is the oldest
    /// such item, whatever the higher tiers hold. The caller owns the
    /// key until it calls [`done`](Self::done). Cancelling the future loses
    /// nothing.
    pub async fn get(&self) -> Option<Item<K>> {
        let inner = &*self.inner;
        let mut owner = TimerOwner {
            inner,
            active: false,
        };
        loop {
            let mut ready = pin!(inner.ready.notified());
            let mut timer = pin!(inner.timer.notified());
            let deadline = {
                let mut st = inner.lock();
                if owner.active {
                    st.timer_owner = false;
                    owner.active = false;
                }
                let now = Instant::now();
                if let Some((item, more)) = inner.pop(&mut st, now) {
                    drop(st);
                    inner.metrics.queued(item.priority, item.waited);
                    if more {
                        // Keep the chain going: another getter takes the next
                        // ready item, or the timer over.
                        inner.ready.notify_one();
                    }
                    return Some(item);
                }
                if st.shutting_down && st.ready_len() == 0 {
                    return None;
                }
                let deadline = if st.timer_owner {
                    None
                } else {
                    let d = earliest(st.next_deadline(), inner.lower_resume(&st, now));
                    if d.is_some() {
                        st.timer_owner = true;
                        owner.active = true;
                        timer.as_mut().enable();
                    }
                    d
                };
                ready.as_mut().enable();
                deadline
            };
            match deadline {
                Some(at) => {
                    tokio::select! {
                        () = &mut ready => {}
                        () = &mut timer => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => ready.await,
            }
        }
    }

    /// The next item if one is ready now, without waiting (for benchmarks
    /// and synchronous users). `None` when nothing is ready.
    #[must_use]
    pub fn try_get(&self) -> Option<Item<K>> {
        let (item, more) = {
            let mut st = self.inner.lock();
            let now = Instant::now();
            self.inner.pop(&mut st, now)?
        };
        self.inner.metrics.queued(item.priority, item.waited);
        if more {
            self.inner.ready.notify_one();
        }
        Some(item)
    }

    /// Marks `key` as processed. If it was added while being processed, it
    /// is queued again now (at the highest priority it was given meanwhile).
    /// A key not being processed is ignored.
    pub fn done(&self, key: &K) {
        let inner = &*self.inner;
        let (worked, wake_ready, drained) = {
            let mut st = inner.lock();
            let now = Instant::now();
            // A delayed add of this key that fell due while it was being
            // processed makes it dirty first.
            let promoted = inner.promote_due(&mut st, now);
            let st = &mut *st;
            let Some(e) = st.entries.get_mut(key) else {
                return;
            };
            let Some(p) = e.processing.take() else {
                return;
            };
            st.in_flight[p.slot] = None;
            st.free_slots.push(p.slot);
            st.processing -= 1;
            let lower_freed = p.tier != Priority::Urgent;
            if lower_freed {
                st.lower_processing -= 1;
            }
            let mut requeued = false;
            match e.wait {
                Wait::Dirty { prio } => {
                    let seq = bump(&mut st.next_seq);
                    e.wait = Wait::Ready {
                        prio,
                        since: now,
                        seq,
                    };
                    push_slot(&mut st.tiers[prio.index()], now, seq, key.clone());
                    st.counts[prio.index()] += 1;
                    inner.metrics.depth_inc(prio);
                    requeued = true;
                }
                Wait::No => {
                    st.entries.remove(key);
                }
                Wait::Delayed { .. } | Wait::Ready { .. } => {}
            }
            if lower_freed {
                inner.rest_lower(st, now, now.saturating_duration_since(p.started));
            }
            let mut wake = Wake {
                ready: promoted || requeued,
                timer: false,
            };
            if lower_freed && st.lower_waiting() {
                // A freed lower slot that rests is a new deadline.
                let resting = inner.lower_resume(st, now).is_some();
                inner.new_deadline(st, resting, &mut wake);
                wake.ready |= !resting;
            }
            let drained = st.shutting_down && st.processing == 0 && st.ready_len() == 0;
            (now.saturating_duration_since(p.started), wake, drained)
        };
        inner.metrics.worked(worked);
        inner.wake(wake_ready);
        if drained {
            inner.drained.notify_waiters();
        }
    }

    /// Ready items waiting for a worker, all tiers.
    #[must_use]
    pub fn len(&self) -> usize {
        let mut st = self.inner.lock();
        self.promote_now(&mut st);
        st.ready_len()
    }

    /// Whether no item is ready.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ready items waiting in one tier.
    #[must_use]
    pub fn depth(&self, priority: Priority) -> usize {
        let mut st = self.inner.lock();
        self.promote_now(&mut st);
        st.counts[priority.index()]
    }

    /// Moves delayed items that are due now into their tiers (and lets a
    /// getter know).
    fn promote_now(&self, st: &mut State<K>) {
        if self.inner.promote_due(st, Instant::now()) {
            self.inner.ready.notify_one();
        }
    }

    /// Whether [`shut_down`](Self::shut_down) or
    /// [`shut_down_with_drain`](Self::shut_down_with_drain) was called.
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        self.inner.lock().shutting_down
    }

    /// Shuts down now: new adds are ignored, every waiting item (ready,
    /// delayed, or a dirty mark) is dropped, and every getter returns
    /// `None`. Items being processed stay so until their `done`, which
    /// queues nothing.
    pub fn shut_down(&self) {
        {
            let mut st = self.inner.lock();
            st.shutting_down = true;
            st.tiers.iter_mut().for_each(VecDeque::clear);
            st.counts = [0; 3];
            st.delayed.clear();
            st.entries.retain(|_, e| {
                e.wait = Wait::No;
                e.processing.is_some()
            });
            self.inner.metrics.depth_reset();
        }
        self.inner.ready.notify_waiters();
        self.inner.timer.notify_waiters();
        self.inner.drained.notify_waiters();
    }

    /// Shuts down gracefully: new adds are ignored and delayed items are
    /// dropped (their time has not come), but workers go on getting the
    /// ready items and finishing the ones in hand (a key added while being
    /// processed is still queued again); returns once nothing is being
    /// processed and nothing is ready. Workers must be running for it to
    /// return.
    pub async fn shut_down_with_drain(&self) {
        {
            let mut st = self.inner.lock();
            st.shutting_down = true;
            st.delayed.clear();
            st.entries.retain(|_, e| {
                if matches!(e.wait, Wait::Delayed { .. }) {
                    e.wait = Wait::No;
                }
                e.wait != Wait::No || e.processing.is_some()
            });
        }
        self.inner.ready.notify_waiters();
        self.inner.timer.notify_waiters();
        loop {
            let mut drained = pin!(self.inner.drained.notified());
            {
                let st = self.inner.lock();
                if st.processing == 0 && st.ready_len() == 0 {
                    return;
                }
                drained.as_mut().enable();
            }
            drained.await;
        }
    }
}

/// Clears the timer ownership of a getter whose future is dropped while
/// it owns the timer, and hands it on.
struct TimerOwner<'a, K> {
    inner: &'a Inner<K>,
    active: bool,
}

impl<K> Drop for TimerOwner<'_, K> {
    fn drop(&mut self) {
        if self.active {
            self.inner.lock().timer_owner = false;
            self.inner.ready.notify_one();
        }
    }
}

impl<K> Inner<K> {
    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // The state is consistent between statements that can panic (only
        // allocation can, inside this module), so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(&self, wake: Wake) {
        if wake.ready {
            self.ready.notify_one();
        }
        if wake.timer {
            self.timer.notify_one();
        }
    }
}

impl<K: Eq + Hash + Clone> Inner<K> {
    /// Queues `key` (merging with a waiting copy); the caller notifies.
    fn enqueue(
        &self,
        st: &mut State<K>,
        key: K,
        prio: Priority,
        delay: Duration,
        now: Instant,
    ) -> Wake {
        if st.shutting_down {
            return Wake::default();
        }
        // Due items first, so that every tier's FIFO stays sorted by the
        // time its items became ready.
        let mut wake = Wake {
            ready: self.promote_due(st, now),
            timer: false,
        };
        let at = (!delay.is_zero()).then(|| now + delay.min(MAX_DELAY));
        let st = &mut *st;
        match st.entries.entry(key) {
            MapEntry::Vacant(v) => {
                let seq = bump(&mut st.next_seq);
                match at {
                    None => {
                        push_slot(&mut st.tiers[prio.index()], now, seq, v.key().clone());
                        v.insert(Entry {
                            wait: Wait::Ready {
                                prio,
                                since: now,
                                seq,
                            },
                            processing: None,
                        });
                        st.counts[prio.index()] += 1;
                        self.metrics.depth_inc(prio);
                        self.metrics.add(prio);
                        wake.ready = true;
                    }
                    Some(at) => {
                        let earliest = st.delayed.peek().is_none_or(|d| at < d.at);
                        st.delayed.push(at, seq, v.key().clone());
                        v.insert(Entry {
                            wait: Wait::Delayed { prio, at, seq },
                            processing: None,
                        });
                        self.new_deadline(st, earliest, &mut wake);
                    }
                }
            }
            MapEntry::Occupied(mut o) => {
                let processing = o.get().processing.is_some();
                match (o.get().wait, at) {
                    (
                        Wait::Ready {
                            prio: q,
                            since,
                            seq,
                        },
                        _,
                    ) => {
                        if prio > q {
                            o.get_mut().wait = Wait::Ready { prio, since, seq };
                            insert_slot(&mut st.tiers[prio.index()], since, seq, o.key().clone());
                            st.counts[q.index()] -= 1;
                            st.counts[prio.index()] += 1;
                            self.metrics.depth_dec(q);
                            self.metrics.depth_inc(prio);
                            // A getter held back by the lower-tier limit
                            // may take it now.
                            wake.ready = true;
                        }
                    }
                    (Wait::Dirty { prio: q }, _) => {
                        o.get_mut().wait = Wait::Dirty { prio: prio.max(q) };
                    }
                    (Wait::No, None) if processing => {
                        o.get_mut().wait = Wait::Dirty { prio };
                        self.metrics.add(prio);
                    }
                    (Wait::No, Some(at)) => {
                        let seq = bump(&mut st.next_seq);
                        let earliest = st.delayed.peek().is_none_or(|d| at < d.at);
                        st.delayed.push(at, seq, o.key().clone());
                        o.get_mut().wait = Wait::Delayed { prio, at, seq };
                        self.new_deadline(st, earliest, &mut wake);
                    }
                    (Wait::Delayed { prio: q, .. }, None) if processing => {
                        o.get_mut().wait = Wait::Dirty { prio: prio.max(q) };
                        self.metrics.add(prio.max(q));
                    }
                    (w @ (Wait::Delayed { .. } | Wait::No), None) => {
                        // Ready now; the heap entry, if any, is stale.
                        let p = match w {
                            Wait::Delayed { prio: q, .. } => prio.max(q),
                            _ => prio,
                        };
                        let seq = bump(&mut st.next_seq);
                        push_slot(&mut st.tiers[p.index()], now, seq, o.key().clone());
                        o.get_mut().wait = Wait::Ready {
                            prio: p,
                            since: now,
                            seq,
                        };
                        st.counts[p.index()] += 1;
                        self.metrics.depth_inc(p);
                        self.metrics.add(p);
                        wake.ready = true;
                    }
                    (
                        Wait::Delayed {
                            prio: q,
                            at: at0,
                            seq: seq0,
                        },
                        Some(at),
                    ) => {
                        let p = prio.max(q);
                        if at < at0 {
                            let seq = bump(&mut st.next_seq);
                            let earliest = st.delayed.peek().is_none_or(|d| at < d.at);
                            st.delayed.push(at, seq, o.key().clone());
                            o.get_mut().wait = Wait::Delayed { prio: p, at, seq };
                            self.new_deadline(st, earliest, &mut wake);
                        } else {
                            o.get_mut().wait = Wait::Delayed {
                                prio: p,
                                at: at0,
                                seq: seq0,
                            };
                        }
                    }
                }
            }
        }
        wake
    }

    /// A new earliest ready time: the timer owner re-arms, or, with no
    /// owner, a waiting getter becomes one.
    fn new_deadline(&self, st: &State<K>, earliest: bool, wake: &mut Wake) {
        if earliest {
            if st.timer_owner {
                wake.timer = true;
            } else {
                wake.ready = true;
            }
        }
    }

    /// Moves delayed items that are due into their tier (or marks them dirty
    /// if being processed). Returns whether any became ready.
    fn promote_due(&self, st: &mut State<K>, now: Instant) -> bool {
        let mut any = false;
        while let Some(d) = st.delayed.pop_due(now) {
            let Some(e) = st.entries.get_mut(&d.key) else {
                continue;
            };
            let Wait::Delayed { prio, seq, .. } = e.wait else {
                continue;
            };
            if seq != d.seq {
                continue;
            }
            self.metrics.add(prio);
            if e.processing.is_some() {
                e.wait = Wait::Dirty { prio };
            } else {
                e.wait = Wait::Ready {
                    prio,
                    since: d.at,
                    seq,
                };
                push_slot(&mut st.tiers[prio.index()], d.at, seq, d.key);
                st.counts[prio.index()] += 1;
                self.metrics.depth_inc(prio);
                any = true;
            }
        }
        any
    }

    /// Whether a lower-tier item may start now: a slot is free and the
    /// lower tiers are not resting (pacing; not while shutting down).
    fn lower_may_start(&self, st: &State<K>, now: Instant) -> bool {
        st.lower_processing < self.lower_tier_limit
            && (st.shutting_down || st.lower_rest_until.is_none_or(|t| now >= t))
    }

    /// When lower-tier items waiting only for the end of a rest may start:
    /// the rest's end if it is after `now`, lower items wait and a slot is
    /// free.
    fn lower_resume(&self, st: &State<K>, now: Instant) -> Option<Instant> {
        if st.shutting_down || !st.lower_waiting() || st.lower_processing >= self.lower_tier_limit {
            return None;
        }
        st.lower_rest_until.filter(|t| *t > now)
    }

    /// Adds the rest a lower-tier item that took `worked` earns (pacing).
    fn rest_lower(&self, st: &mut State<K>, now: Instant, worked: Duration) {
        if self.lower_rest_ratio <= 0.0 || st.shutting_down {
            return;
        }
        let rest = Duration::try_from_secs_f64(worked.as_secs_f64() * self.lower_rest_ratio)
            .unwrap_or(MAX_DELAY)
            .min(MAX_DELAY);
        let from = st.lower_rest_until.filter(|t| *t > now).unwrap_or(now);
        st.lower_rest_until = Some(from + rest);
    }

    /// Takes the next item to serve, if any may be served now; also says
    /// whether another getter could be served too.
    fn pop(&self, st: &mut State<K>, now: Instant) -> Option<(Item<K>, bool)> {
        self.promote_due(st, now);
        let st = &mut *st;
        let allow_lower = self.lower_may_start(st, now);
        // Drop stale slots at the fronts, then choose among the fronts: the
        // highest tier's, or every other time the oldest starved front of a
        // lower tier (alternating keeps the bound without letting a starved
        // backlog go before every newer urgent item at once).
        let mut best: Option<(usize, Instant)> = None;
        let mut starved: Option<(usize, Instant, u64)> = None;
        for (i, tier) in Priority::ALL.iter().enumerate() {
            if i > 0 && !allow_lower {
                break;
            }
            let q = &mut st.tiers[i];
            while let Some(front) = q.front() {
                if is_live(&st.entries, front, *tier) {
                    break;
                }
                q.pop_front();
            }
            let Some(front) = q.front() else { continue };
            if best.is_none() {
                best = Some((i, front.since));
            }
            let is_starved = now.saturating_duration_since(front.since) >= self.max_wait;
            if is_starved
                && starved.is_none_or(|(_, since, seq)| (front.since, front.seq) < (since, seq))
            {
                starved = Some((i, front.since, front.seq));
            }
        }
        let (i, since) = match (best, starved) {
            (Some((b, _)), Some((s, since, _))) if s != b && !st.starved_turn => {
                st.starved_turn = true;
                (s, since)
            }
            (Some(b), _) => {
                st.starved_turn = false;
                b
            }
            (None, _) => return None,
        };
        let tier = Priority::ALL[i];
        let slot = st.tiers[i].pop_front()?;
        let e = st.entries.get_mut(&slot.key)?;
        let idx = match st.free_slots.pop() {
            Some(idx) => {
                st.in_flight[idx] = Some(now);
                idx
            }
            None => {
                st.in_flight.push(Some(now));
                st.in_flight.len() - 1
            }
        };
        e.wait = Wait::No;
        e.processing = Some(Processing {
            started: now,
            tier,
            slot: idx,
        });
        st.counts[i] -= 1;
        self.metrics.depth_dec(tier);
        st.processing += 1;
        if tier != Priority::Urgent {
            st.lower_processing += 1;
        }
        let lower_ok = self.lower_may_start(st, now);
        // Items that will be ready later need a getter to own the timer.
        let later = !st.delayed.is_empty() || self.lower_resume(st, now).is_some();
        let more =
            st.counts[0] > 0 || (lower_ok && st.lower_waiting()) || (!st.timer_owner && later);
        Some((
            Item {
                key: slot.key,
                priority: tier,
                waited: now.saturating_duration_since(since),
            },
            more,
        ))
    }
}

impl<K: Eq + Hash> State<K> {
    fn ready_len(&self) -> usize {
        self.counts.iter().sum()
    }

    /// Whether items of the tiers below urgent are ready.
    fn lower_waiting(&self) -> bool {
        self.counts[1] + self.counts[2] > 0
    }

    /// The earliest live ready time in the heap (stale tops are dropped).
    fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(d) = self.delayed.peek() {
            let live = matches!(
                self.entries.get(&d.key),
                Some(Entry { wait: Wait::Delayed { seq, .. }, .. }) if *seq == d.seq
            );
            if live {
                return Some(d.at);
            }
            self.delayed.pop();
        }
        None
    }
}

impl<K: Eq + Hash + Send + Sync> InFlight for Inner<K> {
    fn in_flight(&self) -> (Duration, Duration) {
        let st = self.lock();
        let now = Instant::now();
        let mut sum = Duration::ZERO;
        let mut longest = Duration::ZERO;
        for started in st.in_flight.iter().flatten() {
            let d = now.saturating_duration_since(*started);
            sum += d;
            longest = longest.max(d);
        }
        (sum, longest)
    }
}

/// The earlier of two optional times.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    a.into_iter().chain(b).min()
}

fn bump(seq: &mut u64) -> u64 {
    let s = *seq;
    *seq += 1;
    s
}

fn is_live<K: Eq + Hash>(entries: &HashMap<K, Entry>, slot: &Slot<K>, tier: Priority) -> bool {
    matches!(
        entries.get(&slot.key),
        Some(Entry { wait: Wait::Ready { prio, seq, .. }, .. }) if *prio == tier && *seq == slot.seq
    )
}

/// Appends a slot, keeping the FIFO sorted by (ready time, arrival); the
/// common case is a push at the back.
fn push_slot<K>(q: &mut VecDeque<Slot<K>>, since: Instant, seq: u64, key: K) {
    match q.back() {
        Some(b) if (b.since, b.seq) > (since, seq) => insert_slot(q, since, seq, key),
        _ => q.push_back(Slot { since, seq, key }),
    }
}

/// Inserts a slot at its sorted place (a raised priority keeps the time the
/// item became ready, so it goes where that time belongs).
fn insert_slot<K>(q: &mut VecDeque<Slot<K>>, since: Instant, seq: u64, key: K) {
    let at = q.partition_point(|s| (s.since, s.seq) < (since, seq));
    q.insert(at, Slot { since, seq, key });
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests;
