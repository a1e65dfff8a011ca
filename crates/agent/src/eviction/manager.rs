//! The eviction manager's loop: a pass every monitoring interval and on
//! every notification. A pass observes the node, re-applies node
//! allocatable on the pods' cgroup when the node's capacity moved,
//! evaluates the thresholds, publishes the node's conditions, re-arms the
//! memory notifications, and when a threshold calls for it evicts at most
//! one pod, then waits for that pod's containers to stop before the next
//! pass.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_controller::{Priority, WorkQueue};
use petrel_cri::api;
use petrel_oci::cgroups::CgroupVersion;
use tokio::sync::Notify;

use super::config::{EvictionConfigError, EvictionSettings, Threshold};
use super::local::{dir_usage, remove_container_with_log, violation as local_violation};
use super::local::{PodPaths, Usage};
use super::node::NodeState;
use super::notify::{
    events_watch, memcg_threshold, memcg_threshold_notifier, memory_usage_watch, pressure_file,
};
use super::notify::{psi_trigger, EventsWatch, MemcgThreshold, PsiTrigger};
use super::notify::{MEMORY_EVENTS, PSI_STALL_US, PSI_WINDOW_US};
use super::observe::{fs_stats, observations, AllocatableLimits, FsStats, MemoryStats};
use super::observe::{NodeObserver, NodeStats};
use super::rank::{rank, Candidate, SYSTEM_CRITICAL_PRIORITY};
use super::signals::{Resource, Signal};
use super::summary::{
    cgroup_memory as summary_memory, fs_summary, io as summary_io, node_memory, psi as summary_psi,
    usage_summary, ContainerSummary as SummaryContainer, CpuRates, NodeSummary, PodRef, PodSummary,
    ProcessStats, Rlimit, RuntimeSummary, Summary, VolumeStats,
};
use super::thresholds::{threshold_amount, ThresholdTracker};
use crate::cache::PodCache;
use crate::convert::{effective_request, qos_class};
use crate::cri::RuntimeActuator;
use crate::metrics::AgentMetrics;
use crate::source::PodSource;
use crate::types::{LABEL_CONTAINER_NAME, LABEL_MANAGED_BY, LABEL_POD_UID};

/// kubelet's grace period for pods evicted for a hard threshold.
const HARD_EVICTION_GRACE_SECS: i64 = 1;
/// Deadline of the runtime calls of a pass.
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the runtime's filesystems' mount points are asked for again.
const MOUNTS_REFRESH: Duration = Duration::from_secs(300);
/// How long after a request of `/stats/summary` passes keep building it.
const SUMMARY_INTEREST: Duration = Duration::from_secs(300);
/// How long node-level reclaim waits for removed files to be freed.
const RECLAIM_SETTLE: Duration = Duration::from_secs(2);
/// How often the node is observed meanwhile.
const RECLAIM_SETTLE_STEP: Duration = Duration::from_millis(100);
/// How long the server waits for a pass it asked for a summary.
pub const SUMMARY_WAIT: Duration = Duration::from_secs(3);
/// How long a pass waits for an evicted pod's containers to stop.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Who carries evictions out: the pod workers (the manager only asks, so
/// it does not depend on them).
pub trait Evictor: Send + Sync + 'static {
    /// Asks for pod `uid` to be evicted: its containers stopped with
    /// `grace_secs` by its next sync (which the caller queues), never
    /// started again unless its manifest changes, shown as Failed, reason
    /// Evicted, with `message`. False when the pod is not one that runs,
    /// or is already evicted.
    fn request_eviction(&self, uid: &str, grace_secs: i64, message: String) -> bool;
    /// Whether pod `uid` was evicted (and its manifest has not changed
    /// since).
    fn is_evicted(&self, uid: &str) -> bool;
}

/// What the manager works with.
pub struct ManagerParts {
    /// The runtime (image filesystem, node-level reclaim).
    pub runtime: Arc<dyn RuntimeActuator>,
    /// The node's name: the label value of what this agent made.
    pub node_name: String,
    /// The desired pods.
    pub source: PodSource,
    /// Who carries evictions out (the pod workers).
    pub evictor: Arc<dyn Evictor>,
    /// The pods' work queue.
    pub queue: WorkQueue<String>,
    /// The PLEG's cache (to see an evicted pod's containers stop).
    pub cache: Arc<PodCache>,
    /// Metrics.
    pub metrics: AgentMetrics,
    /// Where conditions are published.
    pub node: Arc<NodeState>,
    /// Where the pods' cgroups are.
    pub cgroups: crate::qos_cgroups::CgroupLayout,
    /// The agent's root (pods' emptyDirs and logs).
    pub root: std::path::PathBuf,
}

/// The eviction manager.
pub struct EvictionManager {
    settings: EvictionSettings,
    thresholds: Vec<Threshold>,
    observer: NodeObserver,
    parts: ManagerParts,
    tracker: ThresholdTracker,
    notify: Arc<Notify>,
    memcg: HashMap<(Signal, bool), MemcgThreshold>,
    psi: Option<PsiTrigger>,
    /// Whether arming the PSI trigger failed (said once, not every pass).
    psi_failed: bool,
    /// `memory.events` watches (cgroup v2), by cgroup.
    events: HashMap<String, Option<EventsWatch>>,
    /// The node allocatable limits last written on the pods' cgroup.
    allocatable: Option<AllocatableLimits>,
    /// Whether the runtime's writable layers live on the agent root's
    /// filesystem (then they count for nodefs, as kubelet does without a
    /// separate image filesystem).
    containerfs_on_nodefs: bool,
    cpu_rates: CpuRates,
    /// The runtime's image and container filesystems' mount points, and
    /// when they were asked for.
    fs_mounts: Option<(
        Instant,
        Option<std::path::PathBuf>,
        Option<std::path::PathBuf>,
    )>,
}

impl EvictionManager {
    /// A manager enforcing `settings` on what `observer` sees.
    pub fn new(
        settings: EvictionSettings,
        observer: NodeObserver,
        parts: ManagerParts,
    ) -> Result<Self, EvictionConfigError> {
        let thresholds = settings.thresholds()?;
        Ok(Self {
            tracker: ThresholdTracker::new(settings.pressure_transition_period),
            settings,
            thresholds,
            observer,
            parts,
            notify: Arc::new(Notify::new()),
            memcg: HashMap::new(),
            psi: None,
            psi_failed: false,
            events: HashMap::new(),
            allocatable: None,
            containerfs_on_nodefs: true,
            cpu_rates: CpuRates::default(),
            fs_mounts: None,
        })
    }

    /// A handle that runs a pass at once when notified.
    pub fn notifier(&self) -> Arc<Notify> {
        Arc::clone(&self.notify)
    }

    /// Runs passes forever.
    pub async fn run(mut self) {
        self.parts.node.set_pass_trigger(self.notifier());
        tracing::info!(
            thresholds = ?self.thresholds.iter().map(|t| format!("{}<{}{}", t.signal, t.value, if t.hard { "" } else { " (soft)" })).collect::<Vec<_>>(),
            interval = ?self.settings.monitoring_interval,
            notifications = self.settings.notifications,
            "eviction manager started"
        );
        match self.observer.current_allocatable_limits() {
            Ok(limits) => self.apply_allocatable(limits),
            Err(e) => tracing::warn!(error = %e, "node allocatable not enforced"),
        }
        if self.settings.notifications {
            self.arm_pressure_notifications();
        }
        loop {
            if let Some(uid) = self.pass().await {
                self.wait_for_cleanup(&uid).await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(self.settings.monitoring_interval) => {}
                () = self.notify.notified() => {
                    tracing::debug!("eviction pass on notification");
                }
            }
        }
    }

    /// One pass; returns the UID of the pod evicted, if any.
    pub async fn pass(&mut self) -> Option<String> {
        let mut stats = self.observe().await?;
        // The node's capacity moved (its cgroup's limit changed): node
        // allocatable follows, and the pods' cgroup is observed again.
        let limits = self
            .observer
            .allocatable_limits(stats.memory.capacity, stats.pids_capacity);
        if self.allocatable != Some(limits) {
            self.apply_allocatable(limits);
            stats = self.observe().await?;
        }
        let obs = observations(&stats);
        // The summary costs a read of every pod's and container's cgroup
        // and a walk of their files: built only while someone asks for it.
        if self.parts.node.summary_wanted_within(SUMMARY_INTEREST) {
            let layers = self.writable_layers().await;
            let summary = self.summary(&stats, &layers);
            self.parts.node.set_summary(summary);
        }
        let eval = self
            .tracker
            .evaluate(&self.thresholds, &obs, Instant::now());
        self.parts
            .node
            .update(eval.conditions.clone(), Some(stats.clone()));
        if self.settings.notifications {
            self.rearm_memcg(&stats);
            self.arm_pressure_notifications();
        }
        // Local storage limits first, as kubelet does: such a pod is
        // evicted at once, whatever the node's thresholds.
        if let Some(uid) = self.local_storage_eviction(&stats).await {
            return Some(uid);
        }
        let threshold = *eval.actionable.first()?;
        let observed = obs.get(&threshold.signal).copied()?;
        let resource = threshold.signal.resource();
        // Node-level reclaim first (disk signals): enough reclaimed, with
        // minimum reclaim, means no pod is evicted.
        if let Some(removed) = self.reclaim_node_level(threshold.signal).await {
            if self.relieved_after_reclaim(removed).await {
                tracing::info!(signal = %threshold.signal, "node-level reclaim relieved the pressure; no eviction");
                return None;
            }
        }
        let layers = if matches!(resource, Resource::Disk | Resource::Inodes) {
            self.writable_layers().await
        } else {
            Layers::default()
        };
        let mut candidates = self.candidates(threshold.signal, &layers);
        rank(&mut candidates, resource);
        for c in candidates {
            let grace = self.grace_for(&threshold, &c.uid);
            let (usage, request) = c.usage(resource);
            let message = format!(
                "The node was low on resource: {}. Threshold quantity: {}, available: {}. Signal {}: the pod was using {} (request {}).",
                resource_name(resource),
                threshold_amount(&threshold, observed.capacity, false),
                observed.available,
                threshold.signal,
                usage.map_or_else(|| "unknown".to_string(), |u| u.to_string()),
                request,
            );
            if !self
                .parts
                .evictor
                .request_eviction(&c.uid, grace, message.clone())
            {
                continue;
            }
            self.parts.queue.add(c.uid.clone(), Priority::Urgent);
            let labels = crate::metrics::EvictionLabels {
                eviction_signal: threshold.signal.as_str().to_string(),
            };
            self.parts.metrics.evictions.get_or_create(&labels).inc();
            self.parts
                .metrics
                .eviction_stats_age
                .get_or_create(&labels)
                .observe(stats.time.elapsed().as_secs_f64());
            tracing::warn!(uid = %c.uid, pod = %c.name, signal = %threshold.signal, grace, %message, "evicting pod");
            return Some(c.uid);
        }
        tracing::warn!(signal = %threshold.signal, "eviction manager: no pod could be evicted");
        None
    }

    /// The node's statistics, with the runtime's image and container
    /// filesystems (statvfs of the mount points it names).
    async fn observe(&mut self) -> Option<NodeStats> {
        let (imagefs, containerfs) = self.runtime_filesystems().await;
        match self.observer.node_stats(imagefs, containerfs) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "eviction pass: node not observed");
                None
            }
        }
    }

    /// statvfs of the runtime's image and container filesystems. Their
    /// mount points come from ImageFsInfo, asked once and again only every
    /// few minutes or when a mount point stops answering: ImageFsInfo makes
    /// a runtime measure its usage (a walk of its directories), which an
    /// idle node should not pay for every pass.
    async fn runtime_filesystems(&mut self) -> (Option<FsStats>, Option<FsStats>) {
        let stale = self
            .fs_mounts
            .as_ref()
            .is_none_or(|(at, _, _)| at.elapsed() >= MOUNTS_REFRESH);
        if stale {
            match tokio::time::timeout(RUNTIME_TIMEOUT, self.parts.runtime.image_fs_info()).await {
                Ok(Ok(info)) => {
                    let first = |list: &[api::FilesystemUsage]| {
                        list.iter()
                            .filter_map(|u| u.fs_id.as_ref())
                            .map(|id| std::path::PathBuf::from(&id.mountpoint))
                            .find(|p| !p.as_os_str().is_empty())
                    };
                    let image = first(&info.image_filesystems);
                    let container = first(&info.container_filesystems);
                    if let Some(layers) = container.as_ref().or(image.as_ref()) {
                        self.containerfs_on_nodefs = same_device(layers, &self.parts.root);
                    }
                    self.fs_mounts = Some((Instant::now(), image, container));
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "image filesystem not observed"),
                Err(_) => {
                    tracing::debug!("image filesystem not observed: the runtime did not answer")
                }
            }
        }
        let Some((_, image, container)) = &self.fs_mounts else {
            return (None, None);
        };
        let stat = |p: &Option<std::path::PathBuf>| p.as_deref().and_then(|p| fs_stats(p).ok());
        let (i, c) = (stat(image), stat(container));
        if (image.is_some() && i.is_none()) || (container.is_some() && c.is_none()) {
            // Ask the runtime again next pass.
            self.fs_mounts = None;
        }
        (i, c)
    }

    /// CPU statistics of cgroup `key` from its reading, pressure included.
    fn cpu_with_psi(
        &mut self,
        key: &str,
        s: &petrel_oci::cgroups::CgroupStats,
        now: std::time::Instant,
        at: std::time::SystemTime,
    ) -> super::summary::CpuStats {
        super::summary::CpuStats {
            psi: summary_psi(s.cpu_psi),
            ..self.cpu_rates.cpu(key, s.cpu_usage_ns, now, at)
        }
    }

    /// The summary of this pass: the node from `stats`, the pods and
    /// their running containers from their cgroups.
    fn summary(&mut self, stats: &NodeStats, layers: &Layers) -> Summary {
        let at = stats.timestamp;
        let now = stats.time;
        let cgroups = self.observer.cgroups().clone();
        let node_cgroup = self.observer.node_cgroup().unwrap_or("/").to_string();
        let mut keys = std::collections::HashSet::new();
        let node_stats = cgroups.stats(&node_cgroup).ok();
        let node_cpu = node_stats.as_ref().map(|s| {
            keys.insert(node_cgroup.clone());
            self.cpu_with_psi(&node_cgroup, s, now, at)
        });
        let pods_cgroup = self.observer.pods_cgroup().to_string();
        let mut system_containers = Vec::new();
        if let Ok(s) = cgroups.stats(&pods_cgroup) {
            keys.insert(pods_cgroup.clone());
            system_containers.push(SummaryContainer {
                name: "pods".to_string(),
                cpu: self.cpu_with_psi(&pods_cgroup, &s, now, at),
                memory: summary_memory(&s, Some(stats.allocatable_memory.capacity), at),
                io: summary_io(&s, at),
                rootfs: None,
                logs: None,
            });
        }
        let layers_fs = stats.containerfs.or(stats.imagefs).or(stats.nodefs);
        let root_dev = device(&self.parts.root);
        let mut pods = Vec::new();
        for d in self.parts.source.all() {
            let Some(spec) = d.pod.spec.as_ref() else {
                continue;
            };
            let cgroup = self.parts.cgroups.pod_cgroup(&d.uid, qos_class(spec));
            let Ok(ps) = cgroups.stats(&cgroup) else {
                continue;
            };
            keys.insert(cgroup.clone());
            let paths = PodPaths::new(&self.parts.root, &d.namespace, &d.name, &d.uid);
            let mut containers = Vec::new();
            if let Some(rt) = self.parts.cache.get(&d.uid).status.as_ref() {
                for c in rt
                    .containers
                    .iter()
                    .filter(|c| c.state == api::ContainerState::ContainerRunning as i32)
                {
                    let Some(path) = self.container_cgroup(&cgroup, &c.id) else {
                        continue;
                    };
                    let Ok(cs) = cgroups.stats(&path) else {
                        continue;
                    };
                    keys.insert(path.clone());
                    let name = c
                        .metadata
                        .as_ref()
                        .map(|m| m.name.clone())
                        .unwrap_or_default();
                    let rootfs = layers
                        .by_id
                        .get(&c.id)
                        .map(|u| usage_summary(u.bytes, u.inodes, layers_fs.as_ref(), at));
                    let logs = (!name.is_empty()).then(|| {
                        let u = dir_usage(&paths.log_dir.join(&name));
                        usage_summary(u.bytes, u.inodes, stats.nodefs.as_ref(), at)
                    });
                    containers.push(SummaryContainer {
                        name,
                        cpu: self.cpu_with_psi(&path, &cs, now, at),
                        memory: summary_memory(&cs, None, at),
                        io: summary_io(&cs, at),
                        rootfs,
                        logs,
                    });
                }
            }
            // Volumes (emptyDirs); those on the agent root's filesystem count
            // as ephemeral storage, with the pod's logs and writable layers.
            let mut volume = Vec::new();
            let mut ephemeral = dir_usage(&paths.log_dir)
                + layers
                    .by_pod
                    .get(&d.uid)
                    .map(|p| p.total)
                    .unwrap_or_default();
            for v in spec
                .volumes
                .iter()
                .flatten()
                .filter(|v| v.empty_dir.is_some())
            {
                let dir = paths.empty_dir(&v.name);
                let u = dir_usage(&dir);
                if root_dev.is_some() && device(&dir) == root_dev {
                    ephemeral = ephemeral + u;
                }
                volume.push(VolumeStats {
                    fs: usage_summary(u.bytes, u.inodes, fs_stats(&dir).ok().as_ref(), at),
                    name: v.name.clone(),
                });
            }
            pods.push(PodSummary {
                pod_ref: PodRef {
                    name: d.name.clone(),
                    namespace: d.namespace.clone(),
                    uid: d.uid.clone(),
                },
                containers,
                cpu: self.cpu_with_psi(&cgroup, &ps, now, at),
                memory: summary_memory(&ps, None, at),
                io: summary_io(&ps, at),
                volume,
                ephemeral_storage: Some(usage_summary(
                    ephemeral.bytes,
                    ephemeral.inodes,
                    stats.nodefs.as_ref(),
                    at,
                )),
                process_stats: ps.pids_current.map(|n| ProcessStats { process_count: n }),
            });
        }
        self.cpu_rates.retain(&keys);
        Summary {
            node: NodeSummary {
                node_name: self.parts.node_name.clone(),
                system_containers,
                cpu: node_cpu,
                memory: super::summary::MemoryStats {
                    psi: node_stats.as_ref().and_then(|s| summary_psi(s.memory_psi)),
                    ..node_memory(stats)
                },
                io: node_stats.as_ref().and_then(|s| summary_io(s, at)),
                fs: stats.nodefs.map(|f| fs_summary(&f, at)),
                runtime: RuntimeSummary {
                    image_fs: stats.imagefs.or(stats.nodefs).map(|f| fs_summary(&f, at)),
                    container_fs: stats
                        .containerfs
                        .or(stats.imagefs)
                        .or(stats.nodefs)
                        .map(|f| fs_summary(&f, at)),
                },
                rlimit: Rlimit {
                    time: crate::status::compute::time_from_system(at),
                    maxpid: stats.pids_capacity,
                    curproc: stats.pids_used,
                },
            },
            pods,
        }
    }

    /// Whether the node is relieved after node-level reclaim. A runtime
    /// may free a removed container's or image's files after the call
    /// returns (Petrel's and containerd's both do): when something was
    /// removed, the node is observed again until relieved or until
    /// [`RECLAIM_SETTLE`] has passed, so no pod is evicted for space that
    /// is on its way back.
    async fn relieved_after_reclaim(&mut self, removed: usize) -> bool {
        let deadline = tokio::time::Instant::now() + RECLAIM_SETTLE;
        loop {
            if let Some(after) = self.observe().await {
                if self.tracker.reclaimed(&observations(&after)) {
                    return true;
                }
            }
            if removed == 0 || tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(RECLAIM_SETTLE_STEP).await;
        }
    }

    /// kubelet's node-level reclaim for disk signals: every exited
    /// container this agent made, then (for the runtime's filesystems)
    /// every image no container uses. `None` for other signals, else how
    /// many containers and images were removed.
    async fn reclaim_node_level(&self, signal: Signal) -> Option<usize> {
        if !matches!(signal.resource(), Resource::Disk | Resource::Inodes) {
            return None;
        }
        let rt = &self.parts.runtime;
        let ours = HashMap::from([(LABEL_MANAGED_BY.to_string(), self.parts.node_name.clone())]);
        let mut removed_containers = 0;
        let mut freed_log_bytes = 0i64;
        let logs_root = self.parts.root.join("logs");
        match rt.list_containers(ours).await {
            Ok(list) => {
                for c in list
                    .iter()
                    .filter(|c| c.state == api::ContainerState::ContainerExited as i32)
                {
                    match remove_container_with_log(rt.as_ref(), &c.id, &logs_root).await {
                        Ok(bytes) => {
                            removed_containers += 1;
                            freed_log_bytes += bytes;
                        }
                        Err(e) if e.is_not_found() => {}
                        Err(e) => {
                            tracing::warn!(container = %c.id, error = %e, "reclaim: removing a dead container failed")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "reclaim: listing containers failed"),
        }
        let mut removed_images = 0;
        if !signal.is_nodefs() {
            match (rt.images_in_use().await, rt.list_images().await) {
                (Ok(used), Ok(images)) => {
                    for img in images {
                        let in_use = used.contains(&img.id)
                            || img.repo_tags.iter().any(|t| used.contains(t))
                            || img.repo_digests.iter().any(|d| used.contains(d));
                        if in_use || img.pinned {
                            continue;
                        }
                        match rt.remove_image(&img.id).await {
                            Ok(()) => removed_images += 1,
                            // The runtime refuses images it still needs.
                            Err(e) => {
                                tracing::debug!(image = %img.id, error = %e, "reclaim: image kept")
                            }
                        }
                    }
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "reclaim: listing images failed");
                }
            }
        }
        tracing::info!(
            %signal,
            removed_containers,
            freed_log_bytes,
            removed_images,
            "node-level reclaim"
        );
        Some(removed_containers + removed_images)
    }

    /// kubelet's local-storage eviction: the first live pod over an
    /// emptyDir sizeLimit or its ephemeral-storage limits is evicted with
    /// no grace period. Only pods that declare such limits are measured.
    async fn local_storage_eviction(&self, stats: &NodeStats) -> Option<String> {
        // Writable layers count toward containers' ephemeral-storage
        // limits: asked for only when some pod has such a limit.
        let mut layers: Option<Layers> = None;
        for d in self.parts.source.all() {
            let Some(spec) = d.pod.spec.as_ref() else {
                continue;
            };
            let limited = spec
                .volumes
                .iter()
                .flatten()
                .any(|v| v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some()))
                || spec.containers.iter().any(|c| {
                    c.resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .is_some_and(|l| l.contains_key("ephemeral-storage"))
                });
            if !limited || self.parts.evictor.is_evicted(&d.uid) {
                continue;
            }
            if !self
                .parts
                .cache
                .get(&d.uid)
                .status
                .as_ref()
                .is_some_and(|s| live(s))
            {
                continue;
            }
            let paths = PodPaths::new(&self.parts.root, &d.namespace, &d.name, &d.uid);
            let container_limits = spec.containers.iter().any(|c| {
                c.resources
                    .as_ref()
                    .and_then(|r| r.limits.as_ref())
                    .is_some_and(|l| l.contains_key("ephemeral-storage"))
            });
            let no_layers = HashMap::new();
            let rootfs = if container_limits {
                if layers.is_none() {
                    layers = Some(self.writable_layers().await);
                }
                layers
                    .as_ref()
                    .and_then(|l| l.by_pod.get(&d.uid))
                    .map_or(&no_layers, |p| &p.by_name)
            } else {
                &no_layers
            };
            let Some(v) = local_violation(spec, &paths, rootfs) else {
                continue;
            };
            if !self
                .parts
                .evictor
                .request_eviction(&d.uid, 0, v.message.clone())
            {
                continue;
            }
            self.parts.queue.add(d.uid.clone(), Priority::Urgent);
            let labels = crate::metrics::EvictionLabels {
                eviction_signal: v.signal.to_string(),
            };
            self.parts.metrics.evictions.get_or_create(&labels).inc();
            self.parts
                .metrics
                .eviction_stats_age
                .get_or_create(&labels)
                .observe(stats.time.elapsed().as_secs_f64());
            tracing::warn!(uid = %d.uid, pod = %format!("{}/{}", d.namespace, d.name), signal = v.signal, message = %v.message, "evicting pod over its local storage limit");
            return Some(d.uid);
        }
        None
    }

    /// kubelet's grace period: 1 s for a hard threshold; for a soft one
    /// the pod's own, capped by --eviction-max-pod-grace-period when that
    /// is positive.
    fn grace_for(&self, t: &Threshold, uid: &str) -> i64 {
        if t.hard {
            return HARD_EVICTION_GRACE_SECS;
        }
        let own = self
            .parts
            .source
            .get(uid)
            .and_then(|d| d.pod.spec.as_ref()?.termination_grace_period_seconds)
            .unwrap_or(30);
        match self.settings.max_pod_grace_period {
            m if m > 0 => own.min(m),
            _ => own,
        }
    }

    /// The pods that could be evicted: valid, not evicted yet, with a
    /// running container or ready sandbox; with their statistics.
    fn candidates(&self, signal: Signal, layers: &Layers) -> Vec<Candidate> {
        let resource = signal.resource();
        // What a pod's disk usage is for this signal, as kubelet measures
        // it: for nodefs its volumes and logs, for the runtime's
        // filesystems its writable layers; both when they share one
        // filesystem.
        let local_counts = signal.is_nodefs() || self.containerfs_on_nodefs;
        let layers_count = !signal.is_nodefs() || self.containerfs_on_nodefs;
        let mut out = Vec::new();
        for d in self.parts.source.all() {
            if d.invalid.is_some() || self.parts.evictor.is_evicted(&d.uid) {
                continue;
            }
            let entry = self.parts.cache.get(&d.uid);
            let Some(rt) = entry.status.as_ref() else {
                continue;
            };
            if !live(rt) {
                continue;
            }
            let Some(spec) = d.pod.spec.as_ref() else {
                continue;
            };
            let containers = || spec.containers.iter();
            let request = |name: &str| -> i64 {
                containers()
                    .filter_map(|c| effective_request(c, name))
                    .sum()
            };
            let priority = spec.priority.unwrap_or(0);
            let critical = priority >= SYSTEM_CRITICAL_PRIORITY
                || matches!(
                    spec.priority_class_name.as_deref(),
                    Some("system-node-critical" | "system-cluster-critical")
                );
            let cgroup = self.parts.cgroups.pod_cgroup(&d.uid, qos_class(spec));
            let stats = self.observer.cgroups().stats(&cgroup).ok();
            // Walking a pod's files is only worth it under disk pressure.
            let disk = matches!(resource, Resource::Disk | Resource::Inodes).then(|| {
                let mut u = Usage::default();
                if local_counts {
                    u = u + PodPaths::new(&self.parts.root, &d.namespace, &d.name, &d.uid).total();
                }
                if layers_count {
                    u = u + layers
                        .by_pod
                        .get(&d.uid)
                        .map(|p| p.total)
                        .unwrap_or_default();
                }
                u
            });
            out.push(Candidate {
                uid: d.uid.clone(),
                name: format!("{}/{}", d.namespace, d.name),
                priority,
                critical,
                // Every pod of the manifest directory is a static pod.
                static_pod: true,
                memory_request: request("memory"),
                disk_request: request("ephemeral-storage"),
                memory_usage: stats.as_ref().map(|s| s.memory_working_set_bytes as i64),
                disk_usage: disk.map(|u| u.bytes),
                inodes_usage: disk.map(|u| u.inodes),
                processes: stats
                    .as_ref()
                    .and_then(|s| s.pids_current)
                    .map(|p| p as i64),
            });
        }
        out
    }

    /// Waits until the evicted pod has nothing running (or 30 s).
    async fn wait_for_cleanup(&self, uid: &str) {
        let deadline = Instant::now() + CLEANUP_TIMEOUT;
        while Instant::now() < deadline {
            let entry = self.parts.cache.get(uid);
            if entry.status.as_ref().is_none_or(|s| !live(s)) {
                tracing::info!(uid, "evicted pod cleaned up");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tracing::warn!(uid, "evicted pod still running after 30s");
    }

    /// Registers a memory threshold per memory signal's threshold at the
    /// usage where it is met (v1: the kernel's; v2, which has none: a
    /// watch of `memory.current`), again whenever that usage moves.
    fn rearm_memcg(&mut self, stats: &NodeStats) {
        let v2 = self.observer.version() == CgroupVersion::V2;
        let node_cgroup = self.observer.node_cgroup().unwrap_or("/").to_string();
        let pods_cgroup = self.observer.pods_cgroup().to_string();
        for t in self.thresholds.clone() {
            let (path, capacity) = match t.signal {
                Signal::MemoryAvailable => (node_cgroup.as_str(), stats.memory.capacity),
                Signal::AllocatableMemoryAvailable => {
                    (pods_cgroup.as_str(), stats.allocatable_memory.capacity)
                }
                _ => continue,
            };
            // The cgroup's own usage, which is what the kernel compares.
            let Ok(cs) = self.observer.memcg(path, i64::MAX) else {
                continue;
            };
            let ms = MemoryStats { capacity, ..cs };
            let bytes = memcg_threshold(&ms, threshold_amount(&t, capacity, false));
            let key = (t.signal, t.hard);
            if self.memcg.get(&key).is_some_and(|m| m.bytes == bytes) {
                continue;
            }
            let Ok(dir) = self.observer.cgroups().dir("memory", path) else {
                continue;
            };
            let armed = if v2 {
                memory_usage_watch(&dir, bytes, self.notifier())
            } else {
                memcg_threshold_notifier(&dir, bytes, self.notifier())
            };
            match armed {
                Ok(n) => {
                    let how = if v2 { "usage watch" } else { "eventfd" };
                    tracing::debug!(signal = %t.signal, bytes, cgroup = path, how, "memory threshold armed");
                    self.memcg.insert(key, n);
                }
                Err(e) => {
                    tracing::warn!(error = %e, signal = %t.signal, "memory threshold notification unavailable; polling");
                    self.memcg.remove(&key);
                }
            }
        }
    }

    /// Arms what is not armed yet of the pressure notifications beside
    /// v1's memory thresholds: a PSI trigger on the node's memory pressure
    /// (cgroup v2, or the `unified` mount of a hybrid host, or the
    /// machine's), and on v2 a watch of `memory.events` of the node's and
    /// the pods' cgroups. Called at start and each pass, since those
    /// cgroups may appear later; a failure is said once and leaves
    /// polling.
    fn arm_pressure_notifications(&mut self) {
        if self.psi.is_none() && !self.psi_failed {
            if let Some(path) = pressure_file(self.observer.cgroups(), self.observer.node_cgroup())
            {
                match psi_trigger(&path, PSI_STALL_US, PSI_WINDOW_US, self.notifier()) {
                    Ok(t) => {
                        tracing::info!(path = %path.display(), trigger = %t.line, "memory pressure (PSI) trigger armed");
                        self.psi = Some(t);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "memory pressure notification unavailable; polling");
                        self.psi_failed = true;
                    }
                }
            }
        }
        if self.observer.version() != CgroupVersion::V2 {
            return;
        }
        let cgroups = self
            .observer
            .node_cgroup()
            .into_iter()
            .chain([self.observer.pods_cgroup()])
            .map(str::to_string)
            .collect::<Vec<_>>();
        for cg in cgroups {
            if self.events.contains_key(&cg) {
                continue;
            }
            let Some(path) = self
                .observer
                .cgroups()
                .unified_dir(&cg)
                .map(|d| d.join("memory.events"))
                .filter(|p| p.exists())
            else {
                continue;
            };
            match events_watch(&path, MEMORY_EVENTS, self.notifier()) {
                Ok(w) => {
                    tracing::info!(path = %path.display(), "memory events watched");
                    self.events.insert(cg, Some(w));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "memory events notification unavailable; polling");
                    // Not retried every pass.
                    self.events.insert(cg, None);
                }
            }
        }
    }

    /// Container `id`'s cgroup in pod cgroup `pod`: by its id (cgroupfs),
    /// or the child scope named after it (systemd).
    fn container_cgroup(&self, pod: &str, id: &str) -> Option<String> {
        let children: Vec<String> = match self.parts.cgroups.driver() {
            crate::qos_cgroups::CgroupDriver::Cgroupfs => Vec::new(),
            crate::qos_cgroups::CgroupDriver::Systemd => self
                .observer
                .cgroups()
                .dir("memory", pod)
                .ok()
                .and_then(|d| std::fs::read_dir(d).ok())
                .map(|it| {
                    it.flatten()
                        .filter_map(|e| e.file_name().into_string().ok())
                        .collect()
                })
                .unwrap_or_default(),
        };
        self.parts.cgroups.container_cgroup(pod, id, children)
    }

    /// Writes node allocatable's `limits` on the pods' cgroup (when they
    /// differ from what was written last) and says so.
    fn apply_allocatable(&mut self, limits: AllocatableLimits) {
        if self.allocatable == Some(limits) {
            return;
        }
        // Recorded even when refused (memory in use above a lower limit):
        // tried again when the capacity moves again, not every pass.
        let first = self.allocatable.replace(limits).is_none();
        if limits == AllocatableLimits::default() {
            return;
        }
        match self.observer.enforce_allocatable(limits) {
            Ok(()) if first => tracing::info!(
                cgroup = self.observer.pods_cgroup(),
                memory_limit = ?limits.memory,
                pids_limit = ?limits.pids,
                "node allocatable enforced on the pods' cgroup"
            ),
            Ok(()) => tracing::info!(
                cgroup = self.observer.pods_cgroup(),
                memory_limit = ?limits.memory,
                pids_limit = ?limits.pids,
                "node capacity changed: node allocatable re-applied on the pods' cgroup"
            ),
            Err(e) => tracing::warn!(error = %e, "node allocatable not enforced"),
        }
    }

    /// The writable layers of this agent's containers (ListContainerStats);
    /// empty when the runtime does not answer.
    async fn writable_layers(&self) -> Layers {
        let ours = HashMap::from([(LABEL_MANAGED_BY.to_string(), self.parts.node_name.clone())]);
        match tokio::time::timeout(
            RUNTIME_TIMEOUT,
            self.parts.runtime.list_container_stats(ours),
        )
        .await
        {
            Ok(Ok(list)) => Layers::from_stats(&list),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "writable layers not observed");
                Layers::default()
            }
            Err(_) => {
                tracing::debug!("writable layers not observed: the runtime did not answer");
                Layers::default()
            }
        }
    }
}

/// The writable layers of the agent's containers.
#[derive(Debug, Default)]
struct Layers {
    /// By container id.
    by_id: HashMap<String, Usage>,
    /// By pod UID.
    by_pod: HashMap<String, PodLayers>,
}

/// A pod's writable layers.
#[derive(Debug, Default)]
struct PodLayers {
    /// Bytes by container name (every instance of it).
    by_name: HashMap<String, i64>,
    /// All of them.
    total: Usage,
}

impl Layers {
    fn from_stats(list: &[api::ContainerStats]) -> Self {
        let mut out = Layers::default();
        for s in list {
            let (Some(attr), Some(layer)) = (s.attributes.as_ref(), s.writable_layer.as_ref())
            else {
                continue;
            };
            let u = Usage {
                bytes: layer.used_bytes.as_ref().map_or(0, |v| v.value as i64),
                inodes: layer.inodes_used.as_ref().map_or(0, |v| v.value as i64),
            };
            out.by_id.insert(attr.id.clone(), u);
            let Some(uid) = attr.labels.get(LABEL_POD_UID) else {
                continue;
            };
            let pod = out.by_pod.entry(uid.clone()).or_default();
            pod.total = pod.total + u;
            let name = attr
                .labels
                .get(LABEL_CONTAINER_NAME)
                .cloned()
                .or_else(|| attr.metadata.as_ref().map(|m| m.name.clone()))
                .unwrap_or_default();
            *pod.by_name.entry(name).or_default() += u.bytes;
        }
        out
    }
}

/// The device of the filesystem holding `path`.
fn device(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.dev())
}

/// Whether `a` and `b` are on one filesystem (true when unknown, which
/// counts everything against the node's filesystem).
fn same_device(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (device(a), device(b)) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    }
}

/// A pod with a running (or unknown) container or a ready sandbox.
fn live(s: &crate::types::PodRuntimeStatus) -> bool {
    s.containers.iter().any(|c| {
        c.state == api::ContainerState::ContainerRunning as i32
            || c.state == api::ContainerState::ContainerUnknown as i32
    }) || s
        .sandboxes
        .iter()
        .any(|sb| sb.state == api::PodSandboxState::SandboxReady as i32)
}

fn resource_name(r: Resource) -> &'static str {
    match r {
        Resource::Memory => "memory",
        Resource::Disk => "ephemeral-storage",
        Resource::Inodes => "inodes",
        Resource::Pids => "pids",
    }
}
