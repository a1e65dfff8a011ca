//! The runtime's configuration (the `[cri]` section of Petrel's config file).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use petrel_oci::cgroups::systemd::CgroupDriver;

/// Configuration of `petrel runtime`. Every field has a default; the file
/// and the command line override them in that order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Persistent data: metadata, images, container writable layers.
    /// Default `/var/lib/petrel`, like containerd's `/var/lib/containerd`.
    pub root: PathBuf,
    /// Volatile data: sockets, runc state, namespaces, bundles.
    /// Default `/run/petrel`.
    pub state: PathBuf,
    /// The CRI socket. Default `<state>/petrel.sock`, so several instances
    /// with different state directories never collide.
    pub socket: Option<PathBuf>,
    /// Permission bits of the CRI socket (0660: root and its group).
    pub socket_mode: u32,
    /// The OCI runtime binary (runc or a compatible one).
    pub runtime_binary: PathBuf,
    /// The shim binary. Default: `petrel-shim` beside the running executable,
    /// then on `PATH`.
    pub shim_binary: Option<PathBuf>,
    /// The CRIU binary runc runs for CheckpointContainer and for a restore
    /// from a checkpoint archive. A bare name is looked up on `PATH` when a
    /// checkpoint is asked for; without one, those calls fail
    /// (FAILED_PRECONDITION) and nothing else is affected. Default `criu`.
    pub criu_binary: PathBuf,
    /// Runtime handlers accepted in RunPodSandbox besides the default ("").
    pub runtime_handlers: Vec<String>,
    /// Who manages pod and container cgroups: `cgroupfs` (the default:
    /// the runtime and runc make the directories) or `systemd` (slices
    /// and scopes through systemd, runc `--systemd-cgroup`; needs cgroup
    /// v2 and systemd as the host's init). The kubelet's `cgroupDriver`
    /// must agree: RuntimeConfig tells it.
    pub cgroup_driver: petrel_oci::cgroups::systemd::CgroupDriver,
    /// The cgroup under which pods without a `cgroup_parent` are placed
    /// (`<it>/<sandbox id>`). With the systemd driver a slice, and the
    /// cgroupfs default `/petrel` means `petrel.slice` (pods in
    /// `petrel-<sandbox id>.slice`).
    pub default_cgroup_parent: String,
    /// Events each `GetContainerEvents` subscriber may have queued before it
    /// is considered stalled and cut off (kubelet's channel holds 1000).
    pub event_queue_capacity: usize,
    /// Size of each pod's shared `/dev/shm` tmpfs, in bytes (64 MiB, like
    /// Docker and containerd).
    pub shm_size: u64,
    /// Largest size an image layer may unpack to, in bytes: the sum of its
    /// files' sizes, a sparse file counted at its full size. A layer
    /// claiming more is refused (RESOURCE_EXHAUSTED) before the file that
    /// crosses it is written. 0: no bound. Default 64 GiB.
    pub max_layer_bytes: u64,
    /// `[cri.registry]`: where images are pulled from.
    pub registry: RegistryConfig,
    /// How pods get their network: `cni` (the default) or `loopback`.
    pub pod_network: PodNetworkMode,
    /// `[cri.cni]`: where CNI plugins and the network configuration are.
    pub cni: CniConfig,
    /// Where the streaming server (the URLs of Exec, Attach and
    /// PortForward) listens. Default `127.0.0.1:0`: loopback, a free port.
    pub stream_address: std::net::SocketAddr,
    /// How long an Exec/Attach/PortForward URL stays valid before its
    /// client connects, in seconds (kubelet: 60).
    pub stream_token_ttl_secs: u64,
    /// The measured fast paths, one switch for all three (default on):
    /// ListPodSandbox and ListContainers answered from cached encodings
    /// framed by hand (`server::fast_list`), and, with a runc version they
    /// were checked against, the start through runc's exec FIFO and the
    /// runc-free delete of stopped containers (`parts::RuncFastPaths`).
    /// Off: every List builds and encodes typed messages, runc starts and
    /// deletes every container. The answers are the same either way.
    pub fast_paths: bool,
    /// NRI: the config file's top-level `[nri]` section (not part of
    /// `[cri]`), with containerd's keys. On by default.
    #[serde(skip)]
    pub nri: crate::nri::NriConfig,
}

/// How pods that do not use the host's network get one.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PodNetworkMode {
    /// Through the CNI network configured in `[cri.cni]`, as containerd
    /// and CRI-O do. Without a configuration the network is not ready and
    /// such pods are refused.
    #[default]
    Cni,
    /// A private network namespace with loopback only (no CNI): pods reach
    /// nothing outside themselves. For isolated workloads and tests.
    Loopback,
}

/// CNI settings (`[cri.cni]`), with containerd's defaults.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CniConfig {
    /// Directories searched for plugin binaries, in order.
    pub bin_dirs: Vec<PathBuf>,
    /// The directory whose first `.conf`/`.conflist`/`.json` file (by
    /// name) is the pod network.
    pub conf_dir: PathBuf,
    /// How long one plugin may run before it is killed, in seconds.
    pub plugin_timeout_secs: u64,
}

impl Default for CniConfig {
    fn default() -> Self {
        Self {
            bin_dirs: vec![PathBuf::from("/usr/lib/cni"), PathBuf::from("/opt/cni/bin")],
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            plugin_timeout_secs: 60,
        }
    }
}

/// Registry configuration (`[cri.registry]`), as containerd's CRI plugin
/// has it: a directory of per-registry `hosts.toml` files and the
/// registries that may be reached over plain HTTP.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// `<config_path>/<registry host>/hosts.toml` (and `_default/`):
    /// mirrors and per-host settings. None: each registry is its own
    /// server (docker.io is `registry-1.docker.io`).
    pub config_path: Option<PathBuf>,
    /// `host[:port]` names that may be reached over plain HTTP. Loopback
    /// addresses always may.
    pub insecure: Vec<String>,
    /// Credentials per registry host (`[cri.registry.auths."docker.io"]`),
    /// used when a PullImage request carries none. Keyed by the registry
    /// of the reference (the upstream name, also when a mirror serves it).
    pub auths: BTreeMap<String, RegistryAuth>,
}

/// Credentials for one registry in the config file.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryAuth {
    /// User name (Basic auth, or at the token server).
    pub username: String,
    /// Password.
    pub password: String,
    /// An identity (refresh) token instead of a password.
    pub identity_token: String,
}

impl std::fmt::Debug for RegistryAuth {
    // Secrets stay out of logs and error messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The default `default_cgroup_parent` of the cgroupfs driver.
pub const DEFAULT_CGROUP_PARENT: &str = "/petrel";

/// The default `default_cgroup_parent` of the systemd driver.
pub const DEFAULT_SYSTEMD_SLICE: &str = "petrel.slice";

impl RuntimeConfig {
    /// The default parent in the driver's form: `default_cgroup_parent`,
    /// or with systemd [`DEFAULT_SYSTEMD_SLICE`] in place of the cgroupfs
    /// default.
    pub fn default_parent(&self) -> &str {
        use petrel_oci::cgroups::systemd::CgroupDriver;
        match self.cgroup_driver {
            CgroupDriver::Systemd if self.default_cgroup_parent == DEFAULT_CGROUP_PARENT => {
                DEFAULT_SYSTEMD_SLICE
            }
            _ => &self.default_cgroup_parent,
        }
    }

    /// Checks the cgroup settings together: the default parent in the
    /// driver's form.
    pub fn check_cgroups(&self) -> Result<(), petrel_oci::cgroups::systemd::NameError> {
        use petrel_oci::cgroups::systemd::{self, CgroupDriver};
        match self.cgroup_driver {
            CgroupDriver::Systemd => {
                systemd::default_pod_slice(self.default_parent(), "x").map(drop)
            }
            CgroupDriver::Cgroupfs => {
                systemd::pod_cgroup(CgroupDriver::Cgroupfs, self.default_parent()).map(drop)
            }
        }
    }

    /// The cgroup path of a pod that names no parent: `<default>/<id>`
    /// with cgroupfs, the expanded path of `<default stem>-<id>.slice`
    /// with systemd.
    pub fn default_pod_cgroup(
        &self,
        sandbox_id: &str,
    ) -> Result<String, petrel_oci::cgroups::systemd::NameError> {
        use petrel_oci::cgroups::systemd::{self, CgroupDriver};
        match self.cgroup_driver {
            CgroupDriver::Cgroupfs => Ok(format!(
                "{}/{sandbox_id}",
                self.default_cgroup_parent.trim_end_matches('/')
            )),
            CgroupDriver::Systemd => systemd::expand_slice(&systemd::default_pod_slice(
                self.default_parent(),
                sandbox_id,
            )?),
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/var/lib/petrel"),
            state: PathBuf::from("/run/petrel"),
            socket: None,
            socket_mode: 0o660,
            runtime_binary: PathBuf::from("runc"),
            shim_binary: None,
            criu_binary: PathBuf::from("criu"),
            runtime_handlers: vec!["runc".to_string()],
            cgroup_driver: Default::default(),
            default_cgroup_parent: DEFAULT_CGROUP_PARENT.to_string(),
            event_queue_capacity: 1000,
            shm_size: 64 * 1024 * 1024,
            max_layer_bytes: petrel_image::DEFAULT_MAX_LAYER_BYTES,
            registry: RegistryConfig::default(),
            pod_network: PodNetworkMode::default(),
            cni: CniConfig::default(),
            stream_address: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            stream_token_ttl_secs: 60,
            fast_paths: true,
            nri: crate::nri::NriConfig::default(),
        }
    }
}

impl RuntimeConfig {
    /// The CRI socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.state.join("petrel.sock"))
    }
}
