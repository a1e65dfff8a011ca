//! The runtime service: every part of the runtime, and the operations the
//! CRI handlers (in `server/`) share.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use petrel_cri::api;
use petrel_image::registry::{Puller, RegistryHosts};
use petrel_image::ImageStore;
use petrel_oci::spec::HostLimits;
use petrel_store::{Store, Table};
use tokio::sync::Notify;

use crate::config::RuntimeConfig;
use crate::error::{non_empty, Result, RuntimeError};
use crate::events::Mailbox;
use crate::metrics::Metrics;
use crate::parts::{CgroupOps, OciRuntime, Parts, RootfsMounter, ShimLauncher};
use crate::records::{ContainerRecord, ContainerState, SandboxRecord, SandboxState};
use crate::state::{Container, Sandbox, State};
use crate::util;

/// Where the runtime keeps its files.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Persistent root.
    pub root: PathBuf,
    /// Volatile state.
    pub state: PathBuf,
}

impl Layout {
    /// The layout of a configuration's root and state directories.
    pub fn of(config: &RuntimeConfig) -> Self {
        Self {
            root: config.root.clone(),
            state: config.state.clone(),
        }
    }

    /// The metadata database.
    pub fn db(&self) -> PathBuf {
        self.root.join("meta.redb")
    }
    /// The image store's root.
    pub fn images(&self) -> PathBuf {
        self.root.join("images")
    }
    /// A container's writable layer directory (persistent).
    pub fn container_layer(&self, id: &str) -> PathBuf {
        self.root.join("containers").join(id)
    }
    /// An empty directory used as the lower layer of layerless images.
    pub fn empty_lower(&self) -> PathBuf {
        self.root.join("empty")
    }
    /// runc's state directory.
    pub fn runc_root(&self) -> PathBuf {
        self.state.join("runc")
    }
    /// A sandbox's volatile directory (namespace pins, /etc files, shm).
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.state.join("sandboxes").join(id)
    }
    /// A container's bundle (config.json, rootfs mount point, shim files).
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.state.join("containers").join(id)
    }
}

/// The runtime: stores, state, and the parts below it.
#[derive(Debug)]
pub struct Runtime {
    pub(crate) config: RuntimeConfig,
    pub(crate) layout: Layout,
    pub(crate) store: Store,
    pub(crate) state: State,
    pub(crate) images: ImageStore,
    pub(crate) puller: Puller,
    /// The OCI runtime (runc).
    pub(crate) oci: Arc<dyn OciRuntime>,
    /// The cgroup operations.
    pub(crate) cgroups: Arc<dyn CgroupOps>,
    /// The shims.
    pub(crate) shims: Arc<dyn ShimLauncher>,
    /// Containers' rootfs mounts.
    pub(crate) rootfs: Arc<dyn RootfsMounter>,
    /// Pod sandboxes' namespaces, shm mounts and PID-namespace holders.
    pub(crate) pods: Arc<dyn crate::parts::PodKernel>,
    /// The user and group databases of images, read from their first container.
    pub(crate) image_users: crate::container::image_users::ImageUsers,
    pub(crate) host: HostLimits,
    /// Serialises the making and the removal of pod cgroup directories
    /// (`sandbox::cgroup_owner`).
    pub(crate) cgroup_owners: std::sync::Mutex<()>,
    pub(crate) events: Mailbox<api::ContainerEventResponse>,
    pub(crate) metrics: Metrics,
    /// Pod networks (CNI, or loopback only).
    pub(crate) networks: Arc<dyn crate::parts::PodNetworking>,
    /// The streaming server (serving from the open on; URLs are only
    /// handed out by calls, which wait for recovery).
    pub(crate) streams: petrel_stream::StreamServer,
    /// NRI: idle until `serve_runtime` launches it after recovery.
    pub(crate) nri: Arc<crate::nri::host::RuntimeNri>,
    /// Removes removed containers' remains in the background.
    pub(crate) remover: crate::container::remover::Remover,
    initialized: AtomicBool,
    stopping: AtomicBool,
    calls: AtomicUsize,
    calls_done: Notify,
}

/// A CRI call under way; dropping it marks the call finished.
#[derive(Debug)]
pub(crate) struct CallGuard<'a>(&'a Runtime);

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if self.0.calls.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.calls_done.notify_waiters();
        }
    }
}

/// A directory of the runtime's own, 0700 (see `petrel_fs`).
fn mkdir_private(path: &Path) -> Result<()> {
    petrel_fs::create_private_dir_all(path, petrel_fs::PRIVATE)
        .map(drop)
        .map_err(|e| RuntimeError::dir("create runtime directory", e))
}

impl Runtime {
    /// Opens the runtime on the host's parts ([`Parts::host`]): its
    /// directories, store and image store. Nothing is served and nothing
    /// recovered yet.
    pub fn open(config: RuntimeConfig) -> Result<Arc<Self>> {
        // What the host must provide is checked before anything is created.
        let parts = Parts::host(&config)?;
        let rt = Self::with_parts(config, parts)?;
        crate::sandbox::pid_holder::become_subreaper();
        Ok(rt)
    }

    /// Opens the runtime's directories, store and image store, driving the
    /// host through `parts`, and binds the streaming server. Must be called
    /// within a tokio runtime.
    pub fn with_parts(config: RuntimeConfig, parts: Parts) -> Result<Arc<Self>> {
        let layout = Layout::of(&config);
        // Root and state are the runtime's own: created 0700, or narrowed
        // to 0700 if they exist wider (the agent of `petrel node` may have
        // made the root first; an older version made it 0755).
        for d in [&layout.root, &layout.state] {
            petrel_fs::ensure_private_root(d, petrel_fs::PRIVATE, None)
                .map_err(|e| RuntimeError::dir("open runtime root", e))?;
        }
        for d in [
            layout.root.join("containers"),
            layout.state.join("containers"),
            layout.state.join("sandboxes"),
            layout.runc_root(),
        ] {
            mkdir_private(&d)?;
        }
        let trash = crate::container::remover::Trash::of(&layout);
        for d in trash.dirs() {
            mkdir_private(d)?;
        }
        let store = Store::open(&layout.db())?;
        let images = ImageStore::open(&layout.images())
            .map_err(RuntimeError::from)?
            .with_limits(petrel_image::Limits {
                max_layer_bytes: config.max_layer_bytes,
            });
        let puller = Puller::new(
            RegistryHosts {
                config_dir: config.registry.config_path.clone(),
                insecure: config.registry.insecure.clone(),
            },
            &images,
        );
        let metrics = Metrics::new();
        let events = Mailbox::new(config.event_queue_capacity, metrics.events.clone());
        let Parts {
            oci,
            cgroups,
            shims,
            rootfs,
            pods,
            networks,
            host,
        } = parts;
        let remover = crate::container::remover::Remover::start(
            oci.clone(),
            cgroups.clone(),
            rootfs.clone(),
            trash,
        );
        let listening = petrel_stream::StreamServer::listen(petrel_stream::StreamConfig {
            address: config.stream_address,
            token_ttl: std::time::Duration::from_secs(config.stream_token_ttl_secs.max(1)),
            ..Default::default()
        })?;
        // The streaming backend and NRI's host hold the runtime weakly: both
        // are made with it, in one step.
        Ok(Arc::new_cyclic(|rt| Self {
            streams: listening.serve(Arc::new(crate::RuntimeStreams::of(rt.clone()))),
            nri: crate::nri::Nri::new(
                config.nri.clone(),
                Arc::new(crate::nri::host::RuntimeHost::of(rt.clone())),
                metrics.nri.clone(),
                "petrel",
                env!("CARGO_PKG_VERSION"),
            ),
            config,
            layout,
            store,
            state: State::default(),
            images,
            puller,
            oci,
            cgroups,
            shims,
            rootfs,
            pods,
            image_users: Default::default(),
            host,
            cgroup_owners: std::sync::Mutex::new(()),
            events,
            metrics,
            networks,
            remover,
            initialized: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            calls_done: Notify::new(),
        }))
    }

    /// Whether start-up recovery is done and calls are accepted.
    pub fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::Acquire)
    }

    pub(crate) fn set_initialized(&self) {
        self.initialized.store(true, Ordering::Release);
    }

    /// Admits a call: `None` before recovery is done or once shutdown began.
    pub(crate) fn enter_call(&self) -> Option<CallGuard<'_>> {
        if !self.is_initialized() || self.stopping.load(Ordering::Acquire) {
            return None;
        }
        self.calls.fetch_add(1, Ordering::AcqRel);
        // Re-check: a shutdown that began meanwhile must not miss this call.
        if self.stopping.load(Ordering::Acquire) {
            drop(CallGuard(self));
            return None;
        }
        Some(CallGuard(self))
    }

    /// Refuses every new call from now on.
    pub(crate) fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Completes when no call is under way.
    pub(crate) async fn calls_drained(&self) {
        loop {
            let notified = self.calls_done.notified();
            if self.calls.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    // ---- lookups ------------------------------------------------------

    /// A sandbox visible to clients (not one being created).
    pub(crate) fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>> {
        non_empty(id, "pod_sandbox_id")?;
        self.state
            .sandbox(id)
            .filter(|s| s.with(|r| r.state != SandboxState::Creating))
            .ok_or_else(|| RuntimeError::NotFound {
                kind: "pod sandbox",
                id: id.to_string(),
            })
    }

    /// A container visible to clients (not one being created).
    pub(crate) fn container(&self, id: &str) -> Result<Arc<Container>> {
        non_empty(id, "container_id")?;
        self.state
            .container(id)
            .filter(|c| c.state() != ContainerState::Creating)
            .ok_or_else(|| RuntimeError::NotFound {
                kind: "container",
                id: id.to_string(),
            })
    }

    /// The sandbox a container belongs to (it always exists while the
    /// container does).
    pub(crate) fn sandbox_of(&self, c: &Container) -> Option<Arc<Sandbox>> {
        self.state.sandbox(&c.with(|r| r.sandbox_id.clone()))
    }

    // ---- durable updates ------------------------------------------------

    /// Commits a sandbox record, then shows it in memory.
    pub(crate) fn save_sandbox(&self, sb: &Sandbox, record: SandboxRecord) -> Result<()> {
        self.store.put(Table::Sandboxes, &record.id, &record)?;
        sb.set(record);
        Ok(())
    }

    /// Commits a container record, then shows it in memory.
    pub(crate) fn save_container(&self, c: &Container, record: ContainerRecord) -> Result<()> {
        self.store.put(Table::Containers, &record.id, &record)?;
        c.set(record);
        Ok(())
    }

    // ---- statuses -------------------------------------------------------

    /// The CRI status of a sandbox.
    pub(crate) fn sandbox_status(&self, sb: &Sandbox) -> api::PodSandboxStatus {
        sb.with(|r| {
            let host_network =
                crate::sandbox::namespace_mode(&r.config, crate::sandbox::Ns::Network)
                    == api::NamespaceMode::Node;
            api::PodSandboxStatus {
                id: r.id.clone(),
                metadata: r.config.metadata.clone(),
                state: match r.state {
                    SandboxState::Ready => api::PodSandboxState::SandboxReady,
                    _ => api::PodSandboxState::SandboxNotready,
                } as i32,
                created_at: r.created_at,
                // Only for a pod the runtime attached to a network. A loopback-only
                // pod has no address, and kubelet reads an empty one as a broken pod
                // network: it replaced such sandboxes at every sync, forever.
                network: r.network.as_ref().filter(|_| !host_network).map(|n| {
                    let mut ips = n.ips.iter();
                    api::PodSandboxNetworkStatus {
                        ip: ips.next().cloned().unwrap_or_default(),
                        additional_ips: ips.map(|ip| api::PodIp { ip: ip.clone() }).collect(),
                    }
                }),
                linux: Some(api::LinuxPodSandboxStatus {
                    namespaces: Some(api::Namespace {
                        options: r
                            .config
                            .linux
                            .as_ref()
                            .and_then(|l| l.security_context.as_ref())
                            .and_then(|s| s.namespace_options.clone()),
                    }),
                }),
                labels: r.config.labels.clone(),
                annotations: r.config.annotations.clone(),
                runtime_handler: r.runtime_handler.clone(),
            }
        })
    }

    /// The CRI status of a container.
    pub(crate) fn container_status(&self, c: &Container) -> api::ContainerStatus {
        c.with(|r| api::ContainerStatus {
            id: r.id.clone(),
            metadata: r.config.metadata.clone(),
            state: r.state.to_cri() as i32,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            exit_code: r.exit_code,
            image: r.config.image.clone(),
            image_ref: r.image_id.clone(),
            reason: r.reason.clone(),
            message: r.message.clone(),
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            mounts: r.status_mounts(),
            log_path: r
                .log_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            resources: r.resources.clone().map(|l| api::ContainerResources {
                linux: Some(l),
                windows: None,
            }),
            image_id: r.image_id.clone(),
            user: r
                .user
                .clone()
                .map(|linux| api::ContainerUser { linux: Some(linux) }),
            // The image's or SIGTERM (container/stop.rs); ContainerConfig's
            // stop_signal is not applied yet.
            stop_signal: api::Signal::RuntimeDefault as i32,
        })
    }

    /// Statuses of every visible container of a sandbox.
    ///
    /// Newest first, as kubelet orders the statuses it gathers itself: with
    /// EventedPLEG, kubelet takes this list (PodSandboxStatus, events) as its
    /// pod status and picks the first status of each container name. In id
    /// order, an exited older attempt came first about half the time and
    /// kubelet created the attempt that already existed again (refused as
    /// AlreadyExists, the restart delayed by a sync).
    pub(crate) fn pod_container_statuses(&self, sb: &Sandbox) -> Vec<api::ContainerStatus> {
        let mut statuses: Vec<api::ContainerStatus> = sb
            .container_ids()
            .iter()
            .filter_map(|id| self.state.container(id))
            .filter(|c| c.state() != ContainerState::Creating)
            .map(|c| self.container_status(&c))
            .collect();
        statuses.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        statuses
    }

    // ---- events -------------------------------------------------------

    /// Publishes a lifecycle event of `object_id` (a container, or the
    /// sandbox itself) with the pod's current status. Nothing is built when
    /// nobody subscribes.
    pub(crate) fn publish(&self, object_id: &str, kind: api::ContainerEventType, sb: &Sandbox) {
        if !self.events.has_subscribers() {
            return;
        }
        let ev = api::ContainerEventResponse {
            container_id: object_id.to_string(),
            container_event_type: kind as i32,
            created_at: util::now_ns(),
            pod_sandbox_status: Some(self.sandbox_status(sb)),
            containers_statuses: self.pod_container_statuses(sb),
        };
        self.events.publish(ev);
    }
}
