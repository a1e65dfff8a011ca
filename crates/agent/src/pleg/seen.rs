//! What the PLEG last saw of each pod: the newest listing of it (from a
//! relist, a targeted inspection or an event's payload) with the time it
//! was taken. Lifecycle events are the transitions between a pod's
//! successive newest listings, so whichever path sees a change first
//! reports it and the others do not repeat it, and a listing older than
//! the recorded one is ignored (it would report a dead container as
//! started again).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::events::{transition_events, ObjState};
use super::inspect::PodListing;
use super::PodLifecycleEvent;
use crate::types::{PodRuntimeStatus, PodUid};

/// One pod's newest listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodSeen {
    /// When the listing began (ns, the cache's clock).
    pub(crate) ts: i64,
    pub(crate) sandboxes: HashMap<String, ObjState>,
    pub(crate) containers: HashMap<String, ObjState>,
}

impl PodSeen {
    /// The states of a listing taken at `ts` (None: the pod is gone).
    pub(crate) fn of(ts: i64, listing: Option<&PodListing>) -> Self {
        let Some(l) = listing else {
            return Self {
                ts,
                ..Default::default()
            };
        };
        Self {
            ts,
            sandboxes: l
                .sandboxes
                .iter()
                .map(|s| (s.id.clone(), ObjState::of_sandbox(s.state)))
                .collect(),
            containers: l
                .containers
                .iter()
                .map(|c| (c.id.clone(), ObjState::of_container(c.state)))
                .collect(),
        }
    }

    /// The states of a pod status taken at `ts` (an event's payload).
    pub(crate) fn of_status(ts: i64, status: &PodRuntimeStatus) -> Self {
        Self {
            ts,
            sandboxes: status
                .sandboxes
                .iter()
                .map(|s| (s.id.clone(), ObjState::of_sandbox(s.state)))
                .collect(),
            containers: status
                .containers
                .iter()
                .map(|c| (c.id.clone(), ObjState::of_container(c.state)))
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }

    fn same_states(&self, other: &Self) -> bool {
        self.sandboxes == other.sandboxes && self.containers == other.containers
    }
}

/// Outcome of recording a listing.
#[derive(Debug)]
pub(crate) enum Observed {
    /// A newer listing was already recorded: this one says nothing new.
    Stale,
    /// Recorded; `changed` when any state differs from the previous one.
    Fresh {
        changed: bool,
        events: Vec<PodLifecycleEvent>,
    },
}

/// Every pod's newest listing.
#[derive(Default)]
pub(crate) struct Seen {
    pods: Mutex<HashMap<PodUid, PodSeen>>,
}

impl Seen {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<PodUid, PodSeen>> {
        // Updates are single map operations: a poisoned lock is usable.
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `new` for `uid` unless a newer listing is recorded.
    pub(crate) fn observe(&self, uid: &str, new: PodSeen) -> Observed {
        observe_locked(&mut self.lock(), uid, new)
    }

    /// kubelet_running_pods (pods with a ready sandbox) and container
    /// counts per state (running, exited, created, unknown).
    pub(crate) fn gauges(&self) -> (i64, [i64; 4]) {
        let g = self.lock();
        let mut pods = 0;
        let mut states = [0i64; 4];
        for p in g.values() {
            if p.sandboxes.values().any(|s| *s == ObjState::Running) {
                pods += 1;
            }
            for s in p.containers.values() {
                let i = match s {
                    ObjState::Running => 0,
                    ObjState::Exited => 1,
                    ObjState::Created => 2,
                    ObjState::Unknown | ObjState::NonExistent => 3,
                };
                states[i] += 1;
            }
        }
        (pods, states)
    }
}

/// [`Seen::observe`] with the lock held (a relist records every pod at
/// once).
pub(crate) fn observe_locked(
    pods: &mut HashMap<PodUid, PodSeen>,
    uid: &str,
    new: PodSeen,
) -> Observed {
    let empty = PodSeen::default();
    let old = pods.get(uid).unwrap_or(&empty);
    if old.ts > new.ts {
        return Observed::Stale;
    }
    let changed = !old.same_states(&new);
    let mut events = diff(uid, &old.sandboxes, &new.sandboxes);
    events.extend(diff(uid, &old.containers, &new.containers));
    if new.is_empty() {
        // Kept (empty) so an older listing of the pod arriving late is
        // recognised as stale; a relist that no longer sees it drops it.
        if pods.contains_key(uid) {
            pods.insert(uid.to_string(), new);
        }
    } else {
        pods.insert(uid.to_string(), new);
    }
    Observed::Fresh { changed, events }
}

/// The lifecycle events between two listings of one kind of object.
fn diff(
    uid: &str,
    old: &HashMap<String, ObjState>,
    new: &HashMap<String, ObjState>,
) -> Vec<PodLifecycleEvent> {
    let mut ids: Vec<&String> = old.keys().chain(new.keys()).collect();
    ids.sort();
    ids.dedup();
    let mut out = Vec::new();
    for id in ids {
        let o = old.get(id).copied().unwrap_or(ObjState::NonExistent);
        let n = new.get(id).copied().unwrap_or(ObjState::NonExistent);
        for kind in transition_events(o, n) {
            out.push(PodLifecycleEvent {
                uid: uid.to_string(),
                kind: *kind,
                container_id: id.clone(),
            });
        }
    }
    out
}
