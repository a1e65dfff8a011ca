//! A publish/subscribe mailbox with one bounded queue per subscriber.
//!
//! Publishing never blocks and never waits for a subscriber: each event is
//! offered to every subscriber's queue with a non-blocking send. A subscriber
//! whose queue is full has fallen behind; it is cut off (it keeps what is
//! queued, then its stream ends with [`Lagged`]) so it knows it lost events and
//! must relist, and no other subscriber or lifecycle operation waits for it.
//! Publishing is serialised by one short lock, so every subscriber sees events
//! in the same order. With no subscriber, callers can skip building events
//! altogether ([`Mailbox::has_subscribers`]).
//!
//! A cut subscriber misses the event that did not fit and every event
//! published until its stream ends (it has drained its queue and seen
//! [`Lagged`], or dropped its [`Subscription`]): each of those is counted in
//! [`MailboxStats::dropped`] and in the [`Lagged`] it receives.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

/// Counters of a mailbox, shared with the metrics registry (cloning a
/// counter shares it).
#[derive(Debug, Default, Clone)]
pub struct MailboxStats {
    /// Events offered to at least one subscriber.
    pub published: Counter,
    /// Events a cut-off subscriber missed: the one that did not fit its
    /// queue and each one published until its stream ended (counted once
    /// per subscriber that missed it).
    pub dropped: Counter,
    /// Subscribers cut off because they fell behind.
    pub overflows: Counter,
}

/// Set in [`Shared::missed`] once the subscriber's stream has ended (it
/// received [`Lagged`] or was dropped): it misses nothing more.
const ENDED: u64 = 1 << 63;

/// What a subscriber and the mailbox share about its cut-off.
#[derive(Debug, Default)]
struct Shared {
    /// Cut off for falling behind; its stream ends with [`Lagged`].
    lagged: AtomicBool,
    /// Events missed since the cut-off, and [`ENDED`]. One atomic word, so
    /// an event is either counted in the subscriber's `Lagged` and in the
    /// mailbox's `dropped`, or in neither.
    missed: AtomicU64,
}

impl Shared {
    /// Counts one more missed event; false once the stream has ended.
    fn miss(&self) -> bool {
        self.missed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v & ENDED == 0).then_some(v + 1)
            })
            .is_ok()
    }

    /// Marks the stream ended; the events missed until now.
    fn end(&self) -> u64 {
        self.missed.fetch_or(ENDED, Ordering::AcqRel) & !ENDED
    }
}

struct Subscriber<T> {
    id: u64,
    tx: mpsc::Sender<T>,
    shared: Arc<Shared>,
}

struct Inner<T> {
    subscribers: Vec<Subscriber<T>>,
    /// Subscribers cut off whose stream has not ended yet: every event
    /// published meanwhile is one they missed.
    cut: Vec<Arc<Shared>>,
    next_id: u64,
}

impl<T> Inner<T> {
    /// Forgets cut subscribers whose stream has ended; whether any is left.
    fn prune_cut(&mut self) -> bool {
        self.cut
            .retain(|c| c.missed.load(Ordering::Acquire) & ENDED == 0);
        !self.cut.is_empty()
    }
}

/// The mailbox: publish once, deliver to every subscriber.
pub struct Mailbox<T> {
    inner: Mutex<Inner<T>>,
    capacity: usize,
    stats: MailboxStats,
}

impl<T> std::fmt::Debug for Mailbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("capacity", &self.capacity)
            .field("subscribers", &self.subscriber_count())
            .finish()
    }
}

impl<T> Mailbox<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        // A panic while holding this lock cannot leave the list inconsistent
        // (every mutation is a single push or retain), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number of live subscribers.
    pub fn subscriber_count(&self) -> usize {
        self.lock().subscribers.len()
    }
}

impl<T: Clone> Mailbox<T> {
    /// A mailbox whose subscribers each queue up to `capacity` events,
    /// counting into `stats`.
    pub fn new(capacity: usize, stats: MailboxStats) -> Self {
        Self {
            inner: Mutex::new(Inner {
                subscribers: Vec::new(),
                cut: Vec::new(),
                next_id: 0,
            }),
            capacity: capacity.max(1),
            stats,
        }
    }

    /// Registers a new subscriber; it receives every event published from now on.
    pub fn subscribe(&self) -> Subscription<T> {
        let (tx, rx) = mpsc::channel(self.capacity);
        let shared = Arc::new(Shared::default());
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.subscribers.push(Subscriber {
            id,
            tx,
            shared: shared.clone(),
        });
        Subscription { id, rx, shared }
    }

    /// Whether anyone listens (events need not be built otherwise). A
    /// cut-off subscriber whose stream has not ended counts: the events it
    /// misses are counted.
    pub fn has_subscribers(&self) -> bool {
        let mut inner = self.lock();
        !inner.subscribers.is_empty() || inner.prune_cut()
    }

    /// The mailbox's counters.
    pub fn stats(&self) -> &MailboxStats {
        &self.stats
    }

    /// Ends every subscription (at shutdown): each stream delivers what is
    /// queued and then ends.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.subscribers.clear();
        inner.cut.clear();
    }

    /// Offers `event` to every subscriber without waiting. Subscribers that
    /// went away are forgotten; subscribers whose queue is full are cut off.
    pub fn publish(&self, event: T) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        // Those cut off before this event miss it too (O(1) when none is).
        if !inner.cut.is_empty() {
            let stats = &self.stats;
            inner.cut.retain(|c| {
                let missing = c.miss();
                if missing {
                    stats.dropped.inc();
                }
                missing
            });
        }
        if inner.subscribers.is_empty() {
            return;
        }
        self.stats.published.inc();
        let stats = &self.stats;
        let cut = &mut inner.cut;
        inner
            .subscribers
            .retain(|s| match s.tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    s.shared.lagged.store(true, Ordering::Release);
                    // Unless it was dropped meanwhile, this is the first
                    // event it misses.
                    if s.shared.miss() {
                        cut.push(s.shared.clone());
                        stats.dropped.inc();
                    }
                    stats.overflows.inc();
                    tracing::warn!(
                        subscriber = s.id,
                        "event subscriber fell behind; its stream ends so it can relist"
                    );
                    false
                }
            });
    }
}

/// The subscriber fell behind and lost events after the last one it received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagged {
    /// Events published after the last one it received, up to the end of
    /// its stream.
    pub missed: u64,
}

/// One subscriber's end: a stream of events, ending with `Err(Lagged)` if it
/// was cut off for falling behind.
#[derive(Debug)]
pub struct Subscription<T> {
    id: u64,
    rx: mpsc::Receiver<T>,
    shared: Arc<Shared>,
}

impl<T> Drop for Subscription<T> {
    fn drop(&mut self) {
        // Nobody misses events any more.
        self.shared.end();
    }
}

impl<T> Subscription<T> {
    /// The subscriber's id (for logs).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event; `None` when the mailbox is gone, `Some(Err(Lagged))`
    /// once when the subscriber was cut off.
    pub async fn recv(&mut self) -> Option<Result<T, Lagged>> {
        std::future::poll_fn(|cx| self.poll_next_event(cx)).await
    }

    fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, Lagged>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(ev)) => Poll::Ready(Some(Ok(ev))),
            Poll::Ready(None) => {
                if self.shared.lagged.swap(false, Ordering::AcqRel) {
                    // The stream ends here: what was missed is final.
                    let missed = self.shared.end();
                    Poll::Ready(Some(Err(Lagged { missed })))
                } else {
                    Poll::Ready(None)
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T> tokio_stream::Stream for Subscription<T> {
    type Item = Result<T, Lagged>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_next_event(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn mailbox_should_deliver_every_event_to_every_subscriber_in_order() {
        let mb = Mailbox::new(16, MailboxStats::default());
        let mut a = mb.subscribe();
        let mut b = mb.subscribe();
        for i in 0..10 {
            mb.publish(i);
        }
        for sub in [&mut a, &mut b] {
            for i in 0..10 {
                assert_eq!(sub.recv().await, Some(Ok(i)));
            }
        }
        assert_eq!(mb.stats().published.get(), 10);
    }

    #[tokio::test]
    async fn mailbox_should_skip_work_without_subscribers() {
        let mb = Mailbox::new(4, MailboxStats::default());
        assert!(!mb.has_subscribers());
        mb.publish(1);
        assert_eq!(mb.stats().published.get(), 0);
        let s = mb.subscribe();
        assert!(mb.has_subscribers());
        drop(s);
        mb.publish(2); // notices the closed queue and forgets it
        assert!(!mb.has_subscribers());
    }

    #[tokio::test]
    async fn mailbox_should_cut_off_a_slow_subscriber_without_hurting_others() {
        let mb = Mailbox::new(3, MailboxStats::default());
        let mut slow = mb.subscribe();
        let mut fast = mb.subscribe();
        for i in 0..3 {
            mb.publish(i);
            assert_eq!(fast.recv().await, Some(Ok(i)));
        }
        // The slow queue is full: the next publish cuts it off, fast keeps going.
        for i in 3..6 {
            mb.publish(i);
            assert_eq!(fast.recv().await, Some(Ok(i)));
        }
        assert_eq!(mb.subscriber_count(), 1);
        for i in 0..3 {
            assert_eq!(slow.recv().await, Some(Ok(i)));
        }
        // Events 3, 4 and 5 were missed: the one that did not fit, and the
        // two published before its stream ended.
        assert_eq!(slow.recv().await, Some(Err(Lagged { missed: 3 })));
        assert_eq!(slow.recv().await, None);
        assert_eq!(mb.stats().overflows.get(), 1);
        assert_eq!(mb.stats().dropped.get(), 3);
    }

    #[tokio::test]
    async fn mailbox_should_count_every_event_a_cut_subscriber_missed() {
        let mb = Mailbox::new(2, MailboxStats::default());
        let mut stalled = mb.subscribe();
        let mut fast = mb.subscribe();
        let n = 50u64;
        // Two fit the stalled queue; the next n it misses.
        for i in 0..2 + n {
            mb.publish(i);
            assert_eq!(fast.recv().await, Some(Ok(i)));
        }
        assert_eq!(mb.stats().overflows.get(), 1);
        assert_eq!(mb.stats().dropped.get(), n);
        assert_eq!(stalled.recv().await, Some(Ok(0)));
        assert_eq!(stalled.recv().await, Some(Ok(1)));
        assert_eq!(stalled.recv().await, Some(Err(Lagged { missed: n })));
        // Its stream has ended: later events are nobody's loss.
        mb.publish(1000);
        assert_eq!(fast.recv().await, Some(Ok(1000)));
        assert_eq!(mb.stats().dropped.get(), n);

        // A cut subscriber that goes away stops counting too.
        drop(fast);
        let gone = mb.subscribe();
        for i in 0..3 {
            mb.publish(i);
        }
        let dropped = mb.stats().dropped.get();
        assert_eq!(dropped, n + 1);
        drop(gone);
        mb.publish(7);
        assert_eq!(mb.stats().dropped.get(), dropped);
    }

    #[tokio::test]
    async fn mailbox_should_count_misses_of_a_cut_subscriber_left_alone() {
        let mb = Mailbox::new(1, MailboxStats::default());
        let stalled = mb.subscribe();
        mb.publish(0);
        mb.publish(1); // cut here
        assert_eq!(mb.subscriber_count(), 0);
        // Nobody else listens, but the cut one still misses what follows.
        assert!(mb.has_subscribers());
        for i in 2..10 {
            mb.publish(i);
        }
        assert_eq!(mb.stats().dropped.get(), 9);
        drop(stalled);
        assert!(!mb.has_subscribers());
    }

    #[test]
    fn mailbox_publish_should_never_block_on_a_stalled_subscriber() {
        let mb = Mailbox::new(1, MailboxStats::default());
        let _stalled = mb.subscribe();
        let start = std::time::Instant::now();
        for i in 0..100_000 {
            mb.publish(i);
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(mb.subscriber_count(), 0);
    }
}
