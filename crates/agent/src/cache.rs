//! The pod status cache: for each pod, the newest inspection of it in the
//! runtime, stamped with the time (nanoseconds since the epoch) at which
//! that inspection began.
//!
//! Two rules keep the pod workers honest (kubelet's cache, minus the bugs
//! its evented PLEG ran into):
//! * **Never backwards.** [`PodCache::set`] ignores a status older than the
//!   one cached, so a slow relist finishing after a fast event-triggered
//!   inspection cannot bring back a container that already died. Deleting
//!   a pod leaves a tombstone for the same reason ([`PodCache::delete`]).
//! * **Never stale.** [`PodCache::get_newer_than`] blocks until the pod's
//!   entry, or the cache's global timestamp, is newer than the time the
//!   caller last acted; a worker that just created a container never reads
//!   a status from before the create (which would make it create again).
//!
//! The global timestamp says "every pod not updated since was inspected
//! and found unchanged at this time": each successful relist advances it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::types::{PodRuntimeStatus, PodUid};

/// One pod's cached inspection.
#[derive(Debug, Clone, Default)]
pub struct CacheEntry {
    /// The status found (None when the inspection failed or never ran).
    pub status: Option<Arc<PodRuntimeStatus>>,
    /// Why the last inspection failed, if it did.
    pub error: Option<String>,
    /// When the inspection began (ns since the epoch); 0 if never.
    pub timestamp: i64,
}

#[derive(Default)]
struct Inner {
    pods: HashMap<PodUid, CacheEntry>,
    global: i64,
}

/// The cache. Share it as `Arc<PodCache>`.
#[derive(Default)]
pub struct PodCache {
    inner: Mutex<Inner>,
    changed: Notify,
}

impl PodCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map half-updated
        // (every update is a single insert), so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores an inspection of `uid` that began at `timestamp`. Returns
    /// false (and changes nothing) if the cached entry is newer.
    pub fn set(
        &self,
        uid: &str,
        result: Result<Arc<PodRuntimeStatus>, String>,
        timestamp: i64,
    ) -> bool {
        {
            let mut g = self.lock();
            if let Some(old) = g.pods.get(uid) {
                if old.timestamp > timestamp {
                    return false;
                }
            }
            let entry = match result {
                Ok(s) => CacheEntry {
                    status: Some(s),
                    error: None,
                    timestamp,
                },
                // A failed inspection keeps the last good status for
                // display but records the error and the time.
                Err(e) => CacheEntry {
                    status: g.pods.get(uid).and_then(|o| o.status.clone()),
                    error: Some(e),
                    timestamp,
                },
            };
            g.pods.insert(uid.to_string(), entry);
        }
        self.changed.notify_waiters();
        true
    }

    /// The cached entry of `uid` (an empty one, timestamp 0, if none).
    pub fn get(&self, uid: &str) -> CacheEntry {
        self.lock().pods.get(uid).cloned().unwrap_or_default()
    }

    /// Waits until the entry of `uid` or the global timestamp is newer than
    /// `min_timestamp`, then returns the entry. When only the global
    /// timestamp is newer, the entry is as fresh as that relist (the pod
    /// was seen unchanged) and is returned as it is.
    pub async fn get_newer_than(&self, uid: &str, min_timestamp: i64) -> CacheEntry {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Register before checking, so a set between the check and the
            // wait still wakes us.
            notified.as_mut().enable();
            {
                let g = self.lock();
                let entry = g.pods.get(uid);
                let ts = entry.map_or(0, |e| e.timestamp);
                if ts > min_timestamp || g.global > min_timestamp {
                    return entry.cloned().unwrap_or_default();
                }
            }
            notified.await;
        }
    }

    /// Advances the global timestamp (never backwards) and wakes waiters.
    pub fn update_time(&self, timestamp: i64) {
        {
            let mut g = self.lock();
            if timestamp <= g.global {
                return;
            }
            g.global = timestamp;
        }
        self.changed.notify_waiters();
    }

    /// The global timestamp.
    pub fn global_timestamp(&self) -> i64 {
        self.lock().global
    }

    /// Forgets `uid`'s status: its pod is gone from the runtime (the caller
    /// removed everything of it). The entry stays as a tombstone, no status
    /// stamped now: an inspection that began before the removal and ends
    /// after it would otherwise find no entry to be older than and bring
    /// the dead pod's status back; a pod re-created under the same UID
    /// (static pods keep theirs) would then be taken as still running.
    pub fn delete(&self, uid: &str) {
        let now = now_ns();
        let mut g = self.lock();
        let timestamp = g.pods.get(uid).map_or(now, |e| e.timestamp.max(now));
        g.pods.insert(
            uid.to_string(),
            CacheEntry {
                status: None,
                error: None,
                timestamp,
            },
        );
    }

    /// The UIDs with an entry (not counting deleted pods' tombstones).
    pub fn uids(&self) -> Vec<PodUid> {
        self.lock()
            .pods
            .iter()
            .filter(|(_, e)| e.status.is_some() || e.error.is_some())
            .map(|(uid, _)| uid.clone())
            .collect()
    }
}

/// Now, in nanoseconds since the epoch (the runtime's event clock).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn status(name: &str) -> Arc<PodRuntimeStatus> {
        Arc::new(PodRuntimeStatus {
            uid: "u".into(),
            name: name.into(),
            ..Default::default()
        })
    }

    #[test]
    fn set_should_never_go_backwards() {
        let c = PodCache::new();
        assert!(c.set("u", Ok(status("new")), 20));
        assert!(!c.set("u", Ok(status("old")), 10));
        assert_eq!(
            c.get("u").status.map(|s| s.name.clone()),
            Some("new".into())
        );
        assert!(c.set("u", Err("boom".into()), 30));
        let e = c.get("u");
        assert_eq!(e.error.as_deref(), Some("boom"));
        assert_eq!(e.status.map(|s| s.name.clone()), Some("new".into()));
    }

    #[test]
    fn delete_should_not_let_an_older_inspection_bring_the_pod_back() {
        let c = PodCache::new();
        // An inspection begins (the pod still runs), the pod is removed and
        // deleted, then the inspection ends.
        let began = now_ns();
        c.set("u", Ok(status("older")), began - 1);
        std::thread::sleep(Duration::from_millis(1));
        c.delete("u");
        assert!(!c.set("u", Ok(status("running")), began));
        let e = c.get("u");
        assert!(e.status.is_none() && e.error.is_none() && e.timestamp > began);
        assert!(c.uids().is_empty());
        // Inspections begun after the removal are taken.
        assert!(c.set("u", Ok(status("new")), now_ns()));
        assert_eq!(c.uids(), vec!["u".to_string()]);
    }

    #[tokio::test(start_paused = true)]
    async fn get_newer_than_should_block_until_a_newer_status() {
        let c = Arc::new(PodCache::new());
        c.set("u", Ok(status("a")), 10);
        let e = c.get_newer_than("u", 5).await;
        assert_eq!(e.timestamp, 10);
        let c2 = Arc::clone(&c);
        let waiter = tokio::spawn(async move { c2.get_newer_than("u", 10).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        // An older status does not wake it for good.
        c.set("u", Ok(status("stale")), 9);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        c.set("u", Ok(status("b")), 11);
        let e = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .map_err(|_| "timed out")
            .and_then(|r| r.map_err(|_| "join"));
        assert_eq!(e.ok().map(|e| e.timestamp), Some(11));
    }

    #[tokio::test(start_paused = true)]
    async fn global_timestamp_should_release_waiters() {
        let c = Arc::new(PodCache::new());
        let c2 = Arc::clone(&c);
        let waiter = tokio::spawn(async move { c2.get_newer_than("absent", 100).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.update_time(50);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        c.update_time(101);
        let e = tokio::time::timeout(Duration::from_secs(2), waiter).await;
        assert!(matches!(e, Ok(Ok(ref e)) if e.timestamp == 0 && e.status.is_none()));
        c.update_time(90);
        assert_eq!(c.global_timestamp(), 101);
    }
}
