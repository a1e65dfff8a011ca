//! The durable records of pods and containers, and their state machines.

use std::path::{Path, PathBuf};

use petrel_cri::api;
use serde::{Deserialize, Serialize};

/// A pod sandbox's state.
///
/// ```text
///   RunPodSandbox                 StopPodSandbox            RemovePodSandbox
///  ─────────────▶ Creating ──ok──▶ Ready ─────────────▶ NotReady ─────────────▶ (gone)
///                    │ failure: everything made is undone, the record deleted
///                    └─────────▶ (gone)
/// ```
/// A record found in `Creating` at start-up belongs to a create that crashed
/// midway: recovery undoes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being created; not visible to CRI clients.
    Creating,
    /// Namespaces and cgroup are in place.
    Ready,
    /// Stopped: containers killed, pid holder gone, network released.
    NotReady,
}

/// A process the runtime watches across restarts: the pid and its start time
/// (field 22 of `/proc/<pid>/stat`), which guards against pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRef {
    /// The process id.
    pub pid: u32,
    /// Its start time in clock ticks since boot.
    pub start_time: u64,
}

/// A pod sandbox as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// The sandbox id (64 hex characters).
    pub id: String,
    /// The name reserved for it (`name_namespace_uid_attempt`).
    pub name: String,
    /// The configuration it was created with.
    pub config: api::PodSandboxConfig,
    /// The runtime handler asked for.
    #[serde(default)]
    pub runtime_handler: String,
    /// Its state.
    pub state: SandboxState,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
    /// The sandbox's directory in the state dir (namespace pins, /etc files, shm).
    pub dir: PathBuf,
    /// Pinned network namespace, unless the pod uses the host's.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// Pinned IPC namespace, unless the pod uses the host's.
    #[serde(default)]
    pub ipcns: Option<PathBuf>,
    /// Pinned UTS namespace, unless the pod uses the host network.
    #[serde(default)]
    pub utsns: Option<PathBuf>,
    /// Pinned user namespace of a pod with one of its own (CRI mode POD;
    /// its mappings are the config's): it owns the pod's network, IPC, UTS
    /// and PID namespaces, and every container joins it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userns: Option<PathBuf>,
    /// The process holding the pod's shared PID namespace (PID mode POD only).
    #[serde(default)]
    pub pid_holder: Option<ProcessRef>,
    /// Whether `<dir>/shm` is a tmpfs mounted by the runtime.
    #[serde(default)]
    pub shm_mounted: bool,
    /// The pod's cgroup.
    pub cgroup_parent: String,
    /// Cgroup paths the runtime created for this pod, as written by
    /// versions before `created_cgroup_dirs` (a path counted as created when
    /// it was made in any hierarchy); removed with the pod. New records
    /// leave it empty.
    #[serde(default)]
    pub created_cgroups: Vec<String>,
    /// The cgroup directories the runtime created for this pod, each in its
    /// own hierarchy, parents first: removed with the pod, or kept (and
    /// their ownership moved to the store's `CgroupDirs` table) while
    /// another pod's cgroup is at or below them. A directory it found is
    /// never listed, so never removed (`sandbox::cgroup_owner`).
    #[serde(default)]
    pub created_cgroup_dirs: Vec<PathBuf>,
    /// The pod's CNI network, from just before ADD until DEL succeeded.
    #[serde(default)]
    pub network: Option<NetworkRecord>,
    /// The addresses the pod had when its network was released (DEL):
    /// NRI's StopPodSandbox and RemovePodSandbox events still name them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released_ips: Vec<String>,
}

/// A pod's attachment to a CNI network, kept so that it is torn down with
/// the configuration it was set up with, whatever the configuration
/// directory holds by then, and after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkRecord {
    /// The network configuration list (`.conflist` JSON).
    pub conflist: String,
    /// The interface inside the pod.
    pub ifname: String,
    /// The result of ADD; `None` while ADD runs or when it failed.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    /// The pod's addresses (IPv4 first), from the result.
    #[serde(default)]
    pub ips: Vec<String>,
}

/// A container's state.
///
/// ```text
///  CreateContainer             StartContainer            exit (shim)            RemoveContainer
/// ───────────────▶ Creating ─▶ Created ─────────────▶ Running ─────────────▶ Exited ────────────▶ (gone)
///                     │           │ start failed: shim and runc undone,        ▲
///                     │           │ reason StartError, exit code 128           │
///                     │           └────────────────────────────────────────────┘
///                     └─ failure: rootfs, bundle and record are undone
/// ```
/// A `Created` container has no process (its shim and `runc create` come
/// with StartContainer), so StopContainer leaves it `Created`; a restored
/// one is the exception (its shim ran `runc restore` at its create), and
/// exits like a running one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    /// Being created; not visible to CRI clients.
    Creating,
    /// Recorded, its files made; no process until StartContainer (except
    /// a restored container, whose process runs since its create).
    Created,
    /// Started.
    Running,
    /// Its init process exited (exit code recorded).
    Exited,
}

impl ContainerState {
    /// The CRI state.
    pub fn to_cri(self) -> api::ContainerState {
        match self {
            Self::Creating | Self::Created => api::ContainerState::ContainerCreated,
            Self::Running => api::ContainerState::ContainerRunning,
            Self::Exited => api::ContainerState::ContainerExited,
        }
    }
}

/// A container as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// The container id (64 hex characters).
    pub id: String,
    /// The sandbox it belongs to.
    pub sandbox_id: String,
    /// The name reserved for it (`name_pod_namespace_uid_attempt`).
    pub name: String,
    /// The configuration it was created with.
    pub config: api::ContainerConfig,
    /// The image id (`sha256:<hex>`) it runs.
    pub image_id: String,
    /// Its state.
    pub state: ContainerState,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
    /// Start time, ns since the epoch (0 before the start).
    #[serde(default)]
    pub started_at: i64,
    /// Exit time, ns since the epoch (0 before the exit).
    #[serde(default)]
    pub finished_at: i64,
    /// The exit code (128 + signal when killed).
    #[serde(default)]
    pub exit_code: i32,
    /// Why it exited: `Completed`, `Error`, `OOMKilled`, or a runtime reason.
    #[serde(default)]
    pub reason: String,
    /// Details of the exit, when the runtime knows more.
    #[serde(default)]
    pub message: String,
    /// The init process id (host namespace), 0 when unknown.
    #[serde(default)]
    pub pid: u32,
    /// The init process's start time (guards signals against pid reuse),
    /// 0 when unknown.
    #[serde(default)]
    pub init_start_time: u64,
    /// Whether the container has a PID namespace of its own, so that
    /// killing its init kills every process in it.
    #[serde(default)]
    pub own_pid_ns: bool,
    /// The shim watching the container.
    #[serde(default)]
    pub shim: Option<ProcessRef>,
    /// The bundle directory (config.json, rootfs mount point, shim files).
    pub bundle: PathBuf,
    /// The directory holding the writable layer (upper and work dirs).
    pub layer_dir: PathBuf,
    /// The log file, absolute (log_directory of the pod + log_path).
    #[serde(default)]
    pub log_path: Option<PathBuf>,
    /// The container's cgroup.
    pub cgroup_path: String,
    /// The resources currently applied (after UpdateContainerResources).
    #[serde(default)]
    pub resources: Option<api::LinuxContainerResources>,
    /// The identity its process runs with (uid, gid, supplementary groups
    /// with the primary one), from its final OCI spec; `None` before the
    /// spec is made (and for records written before it was kept).
    #[serde(default)]
    pub user: Option<api::LinuxContainerUser>,
    /// The checkpoint the container was restored from, `None` for one
    /// created from its image: its shim ran `runc restore`, so its process
    /// runs from its create on and StartContainer only records the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<RestoredFrom>,
    /// Its image volumes: the CRI mounts naming an image, resolved.
    #[serde(default)]
    pub image_volumes: Vec<ImageVolume>,
}

impl ContainerRecord {
    /// Whether the OCI runtime was given the container (its init's pid is
    /// known): false for a created container before its start, and once a
    /// failed start was undone.
    pub fn in_oci_runtime(&self) -> bool {
        self.pid != 0
    }

    /// Its CRI mounts as ContainerStatus reports them: an image volume's
    /// image is the id it was resolved to (what the request named kept as
    /// `user_specified_image` when that was empty).
    pub fn status_mounts(&self) -> Vec<api::Mount> {
        let mut mounts = self.config.mounts.clone();
        for v in &self.image_volumes {
            let Some(spec) = mounts.get_mut(v.mount).and_then(|m| m.image.as_mut()) else {
                continue;
            };
            if spec.user_specified_image.is_empty() {
                spec.user_specified_image = spec.image.clone();
            }
            spec.image = v.image_id.clone();
            // The digest kubelet shows as the volume's image (what
            // PullImage answered: the image's id).
            spec.image_ref = v.image_id.clone();
        }
        mounts
    }
}

/// A CRI mount naming an image (KEP-4639): the image's layers mounted
/// read-only at [`ImageVolume::dir`] under the bundle, bound into the
/// container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageVolume {
    /// Its index in `config.mounts`.
    pub mount: usize,
    /// The id of the image, resolved when the container was created.
    pub image_id: String,
    /// The directory or file inside the image that is mounted, relative
    /// and clean (`petrel_oci::spec::check_image_sub_path`); empty: the
    /// image's root.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_path: String,
}

impl ImageVolume {
    /// The directory under `bundle` holding every image volume's mount.
    pub fn parent(bundle: &Path) -> PathBuf {
        bundle.join("image-volumes")
    }

    /// Where this volume's image is mounted on the host.
    pub fn dir(&self, bundle: &Path) -> PathBuf {
        Self::parent(bundle).join(self.mount.to_string())
    }
}

/// Where a restored container came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoredFrom {
    /// The checkpoint archive CreateContainer was given.
    pub archive: PathBuf,
    /// When the checkpoint was taken (RFC 3339, from its `config.dump`).
    pub checkpointed_at: String,
}
