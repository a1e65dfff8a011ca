//! Draining the node at exit ([`AgentConfig::drain_on_exit`]): every pod
//! of this node is stopped gracefully and removed before the agent exits,
//! through the pod workers' own termination (grace periods, preStop
//! hooks, then containers, sandboxes, volumes and logs removed), as if
//! every manifest had been deleted at once.
//!
//! [`AgentConfig::drain_on_exit`]: crate::AgentConfig

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use petrel_controller::{Priority, WorkQueue};
use tokio::time::Instant;

use crate::cache::PodCache;
use crate::source::PodSource;
use crate::types::PodUid;
use crate::worker::PodWorkers;

/// Added to the longest grace period for the drain's bound: the CRI calls
/// around the stops, and pods found late.
const MARGIN: Duration = Duration::from_secs(30);
/// A pod with no grace period in sight (one the manifests no longer
/// name) is given kubelet's default.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// How often the drain looks whether it is done.
const POLL: Duration = Duration::from_millis(100);
/// How often the pods left are queued again (a safety net: failed syncs
/// are retried by the queue anyway).
const REQUEUE: Duration = Duration::from_secs(2);

/// What the drain works with: the agent's own parts.
pub(crate) struct DrainParts<'a> {
    pub source: &'a PodSource,
    pub queue: &'a WorkQueue<String>,
    pub workers: &'a Arc<PodWorkers>,
    pub cache: &'a PodCache,
}

/// How long a drain of the pods `source` wants may take: their longest
/// grace period (at least kubelet's default), plus a margin.
pub(crate) fn bound(source: &PodSource) -> Duration {
    let longest = source
        .all()
        .iter()
        .filter_map(|d| d.pod.spec.as_ref()?.termination_grace_period_seconds)
        .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
        .max()
        .unwrap_or_default();
    longest.max(DEFAULT_GRACE) + MARGIN
}

/// Terminates and removes every pod of this node, waiting at most
/// `limit`. Ok when nothing of them is left in the runtime; Err with the
/// pods left otherwise (they keep running, as without a drain).
pub(crate) async fn drain(parts: DrainParts<'_>, limit: Duration) -> Result<(), Vec<PodUid>> {
    parts.source.withdraw_all();
    let deadline = Instant::now() + limit;
    let mut next_queue = Instant::now();
    loop {
        let left = remaining(&parts);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(left.into_iter().collect());
        }
        if Instant::now() >= next_queue {
            for uid in &left {
                parts.queue.add(uid.clone(), Priority::Urgent);
            }
            next_queue = Instant::now() + REQUEUE;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The pods still there: known to the workers, or with a sandbox or a
/// container in the runtime (as the PLEG last saw it).
fn remaining(parts: &DrainParts<'_>) -> BTreeSet<PodUid> {
    let mut left: BTreeSet<PodUid> = parts.workers.known_uids().into_iter().collect();
    for uid in parts.cache.uids() {
        let entry = parts.cache.get(&uid);
        let present = entry
            .status
            .as_ref()
            .is_some_and(|s| !s.sandboxes.is_empty() || !s.containers.is_empty());
        // A pod whose last inspection failed may still be there.
        if present || entry.error.is_some() {
            left.insert(uid);
        }
    }
    left
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bound_should_follow_the_longest_grace_period() {
        let dir = tempfile::tempdir().unwrap();
        let pod = |name: &str, grace: i64| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: {grace}\n  containers:\n  - name: c\n    image: busybox\n"
            )
        };
        let empty = PodSource::load(dir.path(), "n").unwrap();
        assert_eq!(bound(&empty), DEFAULT_GRACE + MARGIN);
        std::fs::write(dir.path().join("a.yaml"), pod("a", 5)).unwrap();
        std::fs::write(dir.path().join("b.yaml"), pod("b", 120)).unwrap();
        let source = PodSource::load(dir.path(), "n").unwrap();
        assert_eq!(bound(&source), Duration::from_secs(120) + MARGIN);
        source.withdraw_all();
        assert!(source.all().is_empty());
    }
}
