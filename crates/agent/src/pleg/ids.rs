//! Which pod a container or sandbox id belongs to, so an event naming only
//! an id can be routed to its pod without asking the runtime.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::types::PodUid;

#[derive(Default)]
struct Inner {
    /// id → (pod, generation in which it was last seen).
    ids: HashMap<String, (PodUid, u64)>,
    generation: u64,
}

/// The id → pod map, refreshed by every relist and inspection.
#[derive(Default)]
pub(crate) struct IdMap {
    inner: Mutex<Inner>,
}

impl IdMap {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update is a single map operation: a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pod of `id`, if known.
    pub(crate) fn get(&self, id: &str) -> Option<PodUid> {
        self.lock().ids.get(id).map(|(uid, _)| uid.clone())
    }

    /// Records ids seen (by an inspection or a relist).
    pub(crate) fn insert<'a>(&self, uid: &str, ids: impl IntoIterator<Item = &'a str>) {
        let mut g = self.lock();
        let generation = g.generation;
        for id in ids {
            g.ids.insert(id.to_string(), (uid.to_string(), generation));
        }
    }

    /// Starts a relist: returns the generation its listing belongs to.
    /// Ids recorded from now on survive [`IdMap::replace`] of this relist.
    pub(crate) fn begin(&self) -> u64 {
        let mut g = self.lock();
        g.generation += 1;
        g.generation
    }

    /// Ends a relist that began in `generation` and listed `ids`: forgets
    /// the ids it did not list unless an inspection saw them after the
    /// listing began (they may be newer than the listing).
    pub(crate) fn replace(&self, generation: u64, ids: HashMap<String, PodUid>) {
        let mut g = self.lock();
        g.ids
            .retain(|id, (_, gen)| *gen >= generation || ids.contains_key(id));
        for (id, uid) in ids {
            g.ids.insert(id, (uid, generation));
        }
    }
}
