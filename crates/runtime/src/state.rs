//! The in-memory view of pods and containers, always backed by the store.
//!
//! Records change only through [`Sandbox::set`] / [`Container::set`],
//! which the service calls after the store accepted the same change, so
//! memory never runs ahead of what a restart would find. Each object also
//! has an async `op` lock serialising its lifecycle operations (create, start,
//! exit handling, remove), while reads take only a short std lock.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use tokio::sync::watch;

use crate::error::{Result, RuntimeError};
use crate::records::{ContainerRecord, ContainerState, SandboxRecord};
use crate::sample::{Cached, ContainerSample, LayerUsage, PodSample};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Record updates are whole-value replacements: a panic elsewhere cannot
    // leave one half-written, so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An object's encoded CRI listing entry (`PodSandbox` or `Container`),
/// kept until its record changes.
#[derive(Debug, Default)]
struct Listing(Mutex<Option<bytes::Bytes>>);

impl Listing {
    /// The cached entry, else the one `build` makes, which is kept. The
    /// cache's lock is held while building, so a [`Listing::clear`] that
    /// follows a record change waits for (and drops) an entry built from
    /// the old record.
    fn get_or_build(&self, build: impl FnOnce() -> bytes::Bytes) -> bytes::Bytes {
        let mut cached = lock(&self.0);
        if let Some(b) = cached.as_ref() {
            return b.clone();
        }
        let b = build();
        *cached = Some(b.clone());
        b
    }

    /// Forgets the entry (the record changed).
    fn clear(&self) {
        *lock(&self.0) = None;
    }
}

/// A pod sandbox in memory.
#[derive(Debug)]
pub struct Sandbox {
    /// The sandbox id.
    pub id: String,
    record: Mutex<SandboxRecord>,
    listing: Listing,
    containers: Mutex<BTreeSet<String>>,
    cpu_sample: Mutex<Option<(i64, u64)>>,
    /// The last reading of its network, for the metrics calls.
    pub metrics_sample: Cached<PodSample>,
    /// The verdict of the last CNI CHECK of the pod's network (run once
    /// after a restart, never per status call), for verbose status.
    network_check: Mutex<Option<String>>,
    /// Lifecycle lock: container creation takes it shared, stopping and
    /// removing the pod take it exclusively.
    pub op: tokio::sync::RwLock<()>,
}

impl Sandbox {
    /// Wraps a record.
    pub fn new(record: SandboxRecord) -> Self {
        Self {
            id: record.id.clone(),
            record: Mutex::new(record),
            listing: Listing::default(),
            containers: Mutex::new(BTreeSet::new()),
            cpu_sample: Mutex::new(None),
            metrics_sample: Cached::default(),
            network_check: Mutex::new(None),
            op: tokio::sync::RwLock::new(()),
        }
    }

    /// A copy of the current record.
    pub fn record(&self) -> SandboxRecord {
        lock(&self.record).clone()
    }

    /// Reads the record without copying it.
    pub fn with<R>(&self, f: impl FnOnce(&SandboxRecord) -> R) -> R {
        f(&lock(&self.record))
    }

    /// Replaces the record (after the store accepted it).
    pub fn set(&self, record: SandboxRecord) {
        // The cache is cleared after the record is replaced (see
        // `Listing::get_or_build`).
        *lock(&self.record) = record;
        self.listing.clear();
    }

    /// The sandbox's encoded listing entry, built by `build` when the
    /// record changed since the last call.
    pub fn listing(&self, build: impl FnOnce(&SandboxRecord) -> bytes::Bytes) -> bytes::Bytes {
        self.listing.get_or_build(|| self.with(build))
    }

    /// Ids of the containers of this pod.
    pub fn container_ids(&self) -> Vec<String> {
        lock(&self.containers).iter().cloned().collect()
    }

    /// Adds a container to the pod.
    pub fn add_container(&self, id: &str) {
        lock(&self.containers).insert(id.to_string());
    }

    /// Removes a container from the pod.
    pub fn remove_container(&self, id: &str) {
        lock(&self.containers).remove(id);
    }

    /// Records a CPU usage sample of the pod and returns the previous one.
    pub fn swap_cpu_sample(&self, sample: (i64, u64)) -> Option<(i64, u64)> {
        lock(&self.cpu_sample).replace(sample)
    }

    /// Records the verdict of a CNI CHECK of the pod's network.
    pub fn set_network_check(&self, verdict: String) {
        *lock(&self.network_check) = Some(verdict);
    }

    /// The verdict of the last CNI CHECK, if one ran.
    pub fn network_check(&self) -> Option<String> {
        lock(&self.network_check).clone()
    }
}

/// A container in memory.
#[derive(Debug)]
pub struct Container {
    /// The container id.
    pub id: String,
    record: Mutex<ContainerRecord>,
    /// Serialises lifecycle operations on this container.
    pub op: tokio::sync::Mutex<()>,
    exited: watch::Sender<bool>,
    cpu_sample: Mutex<Option<(i64, u64)>>,
    /// The last reading of its cgroup and processes, for the metrics calls.
    pub metrics_sample: Cached<ContainerSample>,
    /// The last walk of its writable layer (stats and metrics calls).
    pub layer_usage: Cached<LayerUsage>,
    /// Whether runc's record of the container is gone; held while deleting
    /// it, so that exit handling and removal never both run `runc delete`.
    pub runc_deleted: tokio::sync::Mutex<bool>,
    /// Whether a stop was asked for (its exit's commit may wait for the
    /// removal that usually follows, see `container::exit`).
    stop_asked: AtomicBool,
    listing: Listing,
    /// The container generation of the [`State`] holding this container
    /// (set when it is inserted), bumped after each record change.
    generation: OnceLock<Arc<AtomicU64>>,
    /// The init's mount namespace, held open while the container runs (see
    /// [`Container::hold_mount_namespace`]).
    mount_ns: Mutex<Option<crate::container::mount_ns::HeldNamespace>>,
}

impl Container {
    /// Wraps a record.
    pub fn new(record: ContainerRecord) -> Self {
        let (exited, _) = watch::channel(record.state == ContainerState::Exited);
        Self {
            id: record.id.clone(),
            record: Mutex::new(record),
            op: tokio::sync::Mutex::new(()),
            exited,
            cpu_sample: Mutex::new(None),
            metrics_sample: Cached::default(),
            layer_usage: Cached::default(),
            runc_deleted: tokio::sync::Mutex::new(false),
            stop_asked: AtomicBool::new(false),
            listing: Listing::default(),
            generation: OnceLock::new(),
            mount_ns: Mutex::new(None),
        }
    }

    /// Keeps the init's mount namespace alive past the init's death, so
    /// that the kernel tears it down (unmounting the container's proc, its
    /// rootfs and the rest, an RCU grace period or more) when the runtime
    /// lets go of it, off the exit's path, instead of before the shim learns
    /// of the exit. Best effort: without it the kernel does it at the exit.
    pub fn hold_mount_namespace(&self, ns: crate::container::mount_ns::HeldNamespace) {
        *lock(&self.mount_ns) = Some(ns);
    }

    /// Notes that a stop was asked for (before the signal is sent).
    pub fn ask_stop(&self) {
        self.stop_asked.store(true, Ordering::Release);
    }

    /// Whether a stop was asked for.
    pub fn stop_asked(&self) -> bool {
        self.stop_asked.load(Ordering::Acquire)
    }

    /// Takes the held mount namespace, to be closed where the teardown may
    /// block (a blocking thread).
    pub fn release_mount_namespace(&self) -> Option<crate::container::mount_ns::HeldNamespace> {
        lock(&self.mount_ns).take()
    }

    /// The container's encoded listing entry, built by `build` when the
    /// record changed since the last call.
    pub fn listing(&self, build: impl FnOnce(&ContainerRecord) -> bytes::Bytes) -> bytes::Bytes {
        self.listing.get_or_build(|| self.with(build))
    }

    /// A copy of the current record.
    pub fn record(&self) -> ContainerRecord {
        lock(&self.record).clone()
    }

    /// Reads the record without copying it.
    pub fn with<R>(&self, f: impl FnOnce(&ContainerRecord) -> R) -> R {
        f(&lock(&self.record))
    }

    /// The current state.
    pub fn state(&self) -> ContainerState {
        lock(&self.record).state
    }

    /// Replaces the record (after the store accepted it) and wakes those
    /// waiting for the exit when it says the container exited.
    pub fn set(&self, record: ContainerRecord) {
        let exited = record.state == ContainerState::Exited;
        // The cache is cleared after the record is replaced (see
        // `Listing::get_or_build`).
        *lock(&self.record) = record;
        self.listing.clear();
        // After the record and its entry changed: a whole listing built
        // from the old record carries an older generation.
        if let Some(g) = self.generation.get() {
            g.fetch_add(1, Ordering::AcqRel);
        }
        if exited {
            self.exited.send_replace(true);
        }
    }

    /// A receiver that turns `true` once the container has exited.
    pub fn exit_watch(&self) -> watch::Receiver<bool> {
        self.exited.subscribe()
    }

    /// Records a CPU usage sample and returns the previous one, for rates.
    pub fn swap_cpu_sample(&self, sample: (i64, u64)) -> Option<(i64, u64)> {
        lock(&self.cpu_sample).replace(sample)
    }
}

/// Every pod and container, and the names they reserve.
#[derive(Debug, Default)]
pub struct State {
    sandboxes: RwLock<HashMap<String, Arc<Sandbox>>>,
    containers: RwLock<HashMap<String, Arc<Container>>>,
    names: Mutex<HashMap<String, String>>,
    /// Bumped after every change of a container: insertion, removal, record.
    containers_generation: Arc<AtomicU64>,
    /// The encoded unfiltered ListContainers answer and the generation it
    /// was built at.
    all_containers: Mutex<Option<(u64, bytes::Bytes)>>,
}

fn resolve<T>(map: &HashMap<String, Arc<T>>, id: &str) -> Option<Arc<T>> {
    if let Some(v) = map.get(id) {
        return Some(v.clone());
    }
    // A unique prefix also names an object, as with crictl and containerd.
    if id.is_empty() {
        return None;
    }
    let mut found = map.iter().filter(|(k, _)| k.starts_with(id));
    match (found.next(), found.next()) {
        (Some((_, v)), None) => Some(v.clone()),
        _ => None,
    }
}

impl State {
    /// Reserves `name` for `id`. Reserving the same name for the same id again
    /// succeeds; for another id it fails with AlreadyExists.
    pub fn reserve_name(&self, name: &str, id: &str) -> Result<()> {
        let mut names = lock(&self.names);
        match names.get(name) {
            Some(owner) if owner != id => Err(RuntimeError::AlreadyExists {
                name: name.to_string(),
                owner: owner.clone(),
            }),
            _ => {
                names.insert(name.to_string(), id.to_string());
                Ok(())
            }
        }
    }

    /// Releases `name` if `id` holds it.
    pub fn release_name(&self, name: &str, id: &str) {
        let mut names = lock(&self.names);
        if names.get(name).is_some_and(|owner| owner == id) {
            names.remove(name);
        }
    }

    /// Adds a sandbox.
    pub fn insert_sandbox(&self, sb: Arc<Sandbox>) {
        self.sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sb.id.clone(), sb);
    }

    /// Removes a sandbox.
    pub fn remove_sandbox(&self, id: &str) {
        self.sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Finds a sandbox by id or unique id prefix.
    pub fn sandbox(&self, id: &str) -> Option<Arc<Sandbox>> {
        resolve(
            &self.sandboxes.read().unwrap_or_else(|p| p.into_inner()),
            id,
        )
    }

    /// Every sandbox.
    pub fn sandboxes(&self) -> Vec<Arc<Sandbox>> {
        self.sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Adds a container.
    pub fn insert_container(&self, c: Arc<Container>) {
        let _ = c.generation.set(self.containers_generation.clone());
        self.containers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(c.id.clone(), c);
        self.containers_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Removes a container.
    pub fn remove_container(&self, id: &str) {
        self.containers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.containers_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The encoded answer to an unfiltered ListContainers (a kubelet relist
    /// asks for exactly that every second): rebuilt by `build` only when a
    /// container was added, removed or changed since it was last built.
    pub fn all_containers_listing(&self, build: impl FnOnce() -> bytes::Bytes) -> bytes::Bytes {
        // Read before building: a change during the build bumps the
        // generation past the one stored with the answer.
        let generation = self.containers_generation.load(Ordering::Acquire);
        if let Some((g, b)) = lock(&self.all_containers).as_ref() {
            if *g == generation {
                return b.clone();
            }
        }
        let b = build();
        *lock(&self.all_containers) = Some((generation, b.clone()));
        b
    }

    /// Finds a container by id or unique id prefix.
    pub fn container(&self, id: &str) -> Option<Arc<Container>> {
        resolve(
            &self.containers.read().unwrap_or_else(|p| p.into_inner()),
            id,
        )
    }

    /// Every container.
    pub fn containers(&self) -> Vec<Arc<Container>> {
        self.containers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_should_be_reserved_once() {
        let s = State::default();
        assert!(s.reserve_name("a", "1").is_ok());
        assert!(s.reserve_name("a", "1").is_ok());
        assert!(matches!(
            s.reserve_name("a", "2"),
            Err(RuntimeError::AlreadyExists { .. })
        ));
        s.release_name("a", "2"); // not the owner: no effect
        assert!(s.reserve_name("a", "2").is_err());
        s.release_name("a", "1");
        assert!(s.reserve_name("a", "2").is_ok());
    }

    #[test]
    fn names_should_hold_under_concurrent_reservation() {
        let s = Arc::new(State::default());
        let winners: usize = (0..16)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || s.reserve_name("same", &i.to_string()).is_ok())
            })
            .map(|h| h.join().unwrap_or(false) as usize)
            .sum();
        assert_eq!(winners, 1);
    }
}
