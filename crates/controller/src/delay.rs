//! Delayed adds: a binary heap of (ready time, arrival) → key.
//!
//! The queue never ticks: a getter sleeps only until the earliest ready
//! time the heap holds, so an idle queue costs nothing. Entries are never
//! removed from the middle; an entry the queue no longer wants (the key was
//! added again sooner, or the queue shut down) stays until it surfaces and
//! is then skipped, its sequence number no longer matching the key's.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use tokio::time::Instant;

/// One delayed add.
#[derive(Debug)]
pub(crate) struct Delayed<K> {
    /// When the key becomes ready.
    pub(crate) at: Instant,
    /// Arrival order, for equal ready times and to recognise stale entries.
    pub(crate) seq: u64,
    pub(crate) key: K,
}

impl<K> PartialEq for Delayed<K> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<K> Eq for Delayed<K> {}

impl<K> PartialOrd for Delayed<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Delayed<K> {
    // Reversed: BinaryHeap is a max-heap and we want the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Delayed keys, earliest ready time first, then arrival.
#[derive(Debug)]
pub(crate) struct DelayHeap<K> {
    heap: BinaryHeap<Delayed<K>>,
}

impl<K> Default for DelayHeap<K> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
        }
    }
}

impl<K> DelayHeap<K> {
    pub(crate) fn push(&mut self, at: Instant, seq: u64, key: K) {
        self.heap.push(Delayed { at, seq, key });
    }

    /// The earliest entry, stale or not.
    pub(crate) fn peek(&self) -> Option<&Delayed<K>> {
        self.heap.peek()
    }

    /// Removes and returns the earliest entry if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Delayed<K>> {
        if self.heap.peek()?.at <= now {
            self.heap.pop()
        } else {
            None
        }
    }

    /// Removes the earliest entry.
    pub(crate) fn pop(&mut self) -> Option<Delayed<K>> {
        self.heap.pop()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn delay_heap_should_pop_by_ready_time_then_arrival() {
        let t = Instant::now();
        let mut h = DelayHeap::default();
        h.push(t + Duration::from_millis(20), 0, "late");
        h.push(t + Duration::from_millis(10), 2, "second");
        h.push(t + Duration::from_millis(10), 1, "first");
        assert!(h.pop_due(t).is_none());
        let order: Vec<&str> = std::iter::from_fn(|| h.pop_due(t + Duration::from_secs(1)))
            .map(|d| d.key)
            .collect();
        assert_eq!(order, ["first", "second", "late"]);
        assert!(h.is_empty());
    }

    #[test]
    fn delay_heap_should_not_pop_before_the_ready_time() {
        let t = Instant::now();
        let mut h = DelayHeap::default();
        h.push(t + Duration::from_millis(5), 0, 1u8);
        assert!(h.pop_due(t + Duration::from_millis(4)).is_none());
        assert_eq!(h.peek().map(|d| d.key), Some(1));
        assert_eq!(
            h.pop_due(t + Duration::from_millis(5)).map(|d| d.key),
            Some(1)
        );
    }
}
