//! Readings of a container's or pod's figures, kept in memory with the time
//! they were taken, so that metrics calls close together (kubelet's
//! `/metrics/cadvisor` scraped by several clients, a stats call then a
//! metrics call) read the cgroups and `/proc` once. Nothing samples in the
//! background: a reading is taken by the call that finds none fresh enough.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use petrel_oci::cgroups::CgroupMetrics;
use petrel_oci::dir_usage::DirUsage;
use petrel_oci::proc_usage::{InterfaceCounters, ProcCounts};

/// How old a cgroup and `/proc` reading may be to answer a metrics call.
pub const SAMPLE_MAX_AGE: Duration = Duration::from_secs(1);

/// How old a walk of a writable layer may be to answer a metrics call
/// (the stats calls walk afresh and leave their result here). A walk costs
/// one `stat` per file, so it is refreshed at kubelet's housekeeping pace.
pub const WALK_MAX_AGE: Duration = Duration::from_secs(10);

/// One reading of a container's cgroup and processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSample {
    /// When it was taken, ns since the epoch.
    pub timestamp: i64,
    /// The cgroup's figures, `None` when the cgroup could not be read.
    pub cgroup: Option<CgroupMetrics>,
    /// Its processes' threads, descriptors and sockets.
    pub procs: ProcCounts,
}

/// One reading of a pod's network interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSample {
    /// When it was taken, ns since the epoch.
    pub timestamp: i64,
    /// Its interfaces but loopback; empty for a pod on the host network.
    pub interfaces: Vec<InterfaceCounters>,
}

/// A writable layer's usage and when it was measured, ns since the epoch.
pub type LayerUsage = (i64, DirUsage);

/// A value kept with the time it was taken.
#[derive(Debug)]
pub struct Cached<T>(Mutex<Option<(Instant, T)>>);

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Self(Mutex::new(None))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Whole-value replacements only: a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Clone> Cached<T> {
    /// The kept value if younger than `max_age`, else the one `take`
    /// makes, which is kept. The lock is held while taking, so callers
    /// arriving together take one reading.
    pub fn get_or_take(&self, max_age: Duration, take: impl FnOnce() -> T) -> T {
        let mut kept = lock(&self.0);
        if let Some((at, v)) = kept.as_ref() {
            if at.elapsed() < max_age {
                return v.clone();
            }
        }
        let v = take();
        *kept = Some((Instant::now(), v.clone()));
        v
    }

    /// Keeps `v`, taken now.
    pub fn put(&self, v: T) {
        *lock(&self.0) = Some((Instant::now(), v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_should_reuse_a_fresh_value_and_retake_an_old_one() {
        let c = Cached::default();
        assert_eq!(c.get_or_take(Duration::from_secs(60), || 1), 1);
        assert_eq!(c.get_or_take(Duration::from_secs(60), || 2), 1);
        assert_eq!(c.get_or_take(Duration::ZERO, || 3), 3);
        c.put(4);
        assert_eq!(c.get_or_take(Duration::from_secs(60), || 5), 4);
    }
}
