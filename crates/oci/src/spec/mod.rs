//! Building the OCI runtime spec (`config.json`) of a container from its CRI config.
//!
//! Pure logic apart from a few reads: the user database inside the rootfs, `stat` of
//! bind-mount sources and devices, and `/dev` for privileged containers. The rules follow
//! containerd's CRI plugin, so workloads see what they see there; the differences are
//! listed on [`build_container_spec`].

mod caps;
mod devices;
mod mounts;
mod process;
mod resources;
pub mod seccomp;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Linux, LinuxNamespace, LinuxNamespaceType, PosixRlimit, PosixRlimitBuilder, PosixRlimitType,
    Process, Root, Spec, User,
};
use petrel_cri::api;

use crate::user::UserError;
use crate::userns::UserMappings;

pub use caps::{capability_by_name, capability_name, caps_from_mask, DEFAULT_CAPS};
pub use mounts::{check_image_sub_path, check_mounts, container_path};
pub use process::DEFAULT_PATH;
pub use resources::{
    linux_resources, IdSet, CPU_PERIOD_US, CPU_QUOTA_US, CPU_SHARES, MAX_MEMORY, MIN_MEMORY,
};

/// The OCI runtime spec version we write.
const OCI_VERSION: &str = "1.0.2";

/// Paths hidden from non-privileged containers (containerd's defaults).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths made read-only in non-privileged containers (containerd's defaults).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Annotation keys containerd sets, which tools such as cAdvisor read.
pub mod annotations {
    /// `"container"` for application containers (`"sandbox"` for pause containers).
    pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
    /// The CRI container name (`metadata.name`).
    pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
    /// The image as the user named it.
    pub const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
    /// The pod's name.
    pub const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
    /// The pod's namespace.
    pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
    /// The pod's UID.
    pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
}

/// Errors while building a spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A CRI field has a value we cannot honour; `field` is its path in the request
    /// (e.g. `mounts[2].host_path`).
    #[error("{field}: {reason}")]
    Invalid {
        /// The CRI field, e.g. `mounts[2].container_path`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading host state failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Reading the user database of the rootfs failed.
    #[error(transparent)]
    User(#[from] UserError),
}

/// A client's value for an error message: quoted, and only its start when
/// it is long (a message quoting megabytes would not reach the client).
pub fn shown(s: &str) -> String {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return format!("{s:?}");
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &s[..end], s.len())
}

pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// How a container gets one of its namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceRef {
    /// The host's namespace: no namespace entry in the spec.
    Host,
    /// A new namespace of its own.
    New,
    /// Join the namespace at this path (e.g. `/proc/<pause pid>/ns/net` or a bind mount).
    Path(PathBuf),
}

/// What the pod sandbox provides to its containers (paths are on the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxContext {
    /// The pod's network namespace.
    pub network: NamespaceRef,
    /// The pod's IPC namespace.
    pub ipc: NamespaceRef,
    /// The pod's UTS namespace.
    pub uts: NamespaceRef,
    /// The pod's PID namespace, joined by containers whose PID mode is `POD`.
    pub pid: NamespaceRef,
    /// The pod's hostname.
    pub hostname: String,
    /// Bind-mounted at `/etc/hostname` when set.
    pub etc_hostname: Option<PathBuf>,
    /// Bind-mounted at `/etc/hosts` when set.
    pub etc_hosts: Option<PathBuf>,
    /// Bind-mounted at `/etc/resolv.conf` when set.
    pub resolv_conf: Option<PathBuf>,
    /// Bind-mounted at `/dev/shm` when set (the pod-shared tmpfs), else a private tmpfs.
    pub shm: Option<PathBuf>,
    /// The pod's cgroup path, e.g. `/kubepods/burstable/pod123` or
    /// `/petrel/<sandbox id>`; with the systemd driver, its slice's
    /// expanded path (`/kubepods.slice/kubepods-pod123.slice`).
    pub cgroup_parent: String,
    /// Who manages the container's cgroup: with systemd, the spec names
    /// it as runc's `<pod slice>:petrel:<id>`.
    pub cgroup_driver: crate::cgroups::systemd::CgroupDriver,
    /// The pod's own user namespace, which every container joins; `None`:
    /// the host's.
    pub user: Option<PodUserNamespace>,
}

/// A pod's user namespace as its containers join it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUserNamespace {
    /// The file pinning it.
    pub path: PathBuf,
    /// Its mappings (given again in the spec: runc checks them against the
    /// namespace and idmaps mounts with them).
    pub mappings: UserMappings,
}

/// The mount option marking a bind mount to be idmapped with the pod's
/// mappings (runc 1.2 and later know it); [`config_json`] adds the
/// mappings, which this crate's `oci-spec` cannot hold on a mount.
pub const IDMAP_OPTION: &str = "idmap";

/// The `config.json` of `spec`: its JSON, with the pod's `mappings` as
/// `uidMappings`/`gidMappings` on every mount carrying [`IDMAP_OPTION`].
pub fn config_json(spec: &Spec, mappings: Option<&UserMappings>) -> serde_json::Result<Vec<u8>> {
    let Some(m) = mappings else {
        return serde_json::to_vec(spec);
    };
    let mut value = serde_json::to_value(spec)?;
    let idmapped = |mount: &serde_json::Value| {
        mount
            .get("options")
            .and_then(|o| o.as_array())
            .is_some_and(|o| o.iter().any(|x| x.as_str() == Some(IDMAP_OPTION)))
    };
    if let Some(mounts) = value.get_mut("mounts").and_then(|v| v.as_array_mut()) {
        for mount in mounts.iter_mut().filter(|mount| idmapped(mount)) {
            if let Some(obj) = mount.as_object_mut() {
                obj.insert("uidMappings".into(), serde_json::to_value([m.uids.oci()])?);
                obj.insert("gidMappings".into(), serde_json::to_value([m.gids.oci()])?);
            }
        }
    }
    serde_json::to_vec(&value)
}

/// What this host lets us grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLimits {
    /// Our bounding capability set (`CAP_CHOWN`, ...): runc fails on anything outside it.
    pub bounding_caps: Vec<String>,
    /// Our own `oom_score_adj`: without `CAP_SYS_RESOURCE` nothing lower can be set.
    pub min_oom_score_adj: i32,
    /// The open-file limit containers get (`RLIMIT_NOFILE`); `None`: they inherit
    /// runc's. The runtime raises its own soft limit and passes the one it started with.
    pub open_files: Option<OpenFileLimit>,
    /// The CPUs the host has (`/sys/devices/system/cpu/online`); `None`:
    /// unknown, cpusets are then only checked for their form.
    pub online_cpus: Option<IdSet>,
    /// The memory nodes the host has (`/sys/devices/system/node/online`, or
    /// node 0 alone on a kernel without NUMA).
    pub online_mems: Option<IdSet>,
    /// Whether containers' cgroups have the hugetlb controller (runc fails to create a
    /// container with hugepage limits where they do not: a hybrid host keeps hugetlb on
    /// its cgroup2 mount only). Hugepage limits are left out where it is missing, as
    /// containerd does (`tolerate_missing_hugetlb_controller`, on by default): kubelet
    /// asks limits (0) for every page size the kernel offers on every container.
    pub hugetlb: bool,
    /// Whether a bind mount can be made read-only recursively (the `rro`
    /// option): the kernel has `mount_setattr(2)` and the OCI runtime knows
    /// the option (see [`crate::features`]). CRI mounts asking for it are
    /// refused where it is false.
    pub recursive_read_only: bool,
    /// Whether pods may have user namespaces: the OCI runtime joins them
    /// and makes idmapped mounts, and overlayfs takes idmapped layers (see
    /// [`crate::features::user_namespaces`]).
    pub user_namespaces: bool,
    /// Whether containers get a cgroup namespace of their own: on cgroup v2,
    /// as containerd does there, so a container sees its own cgroup as the
    /// root of `/sys/fs/cgroup`. Privileged containers keep the host's.
    pub cgroup_namespaces: bool,
}

/// A soft and hard `RLIMIT_NOFILE`; `u64::MAX` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The limit in force.
    pub soft: u64,
    /// The ceiling the soft limit may be raised to.
    pub hard: u64,
}

impl OpenFileLimit {
    /// This process's limit now.
    pub fn current() -> Self {
        let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        Self {
            soft: l.current.unwrap_or(u64::MAX),
            hard: l.maximum.unwrap_or(u64::MAX),
        }
    }
}

impl HostLimits {
    /// Reads `CapBnd` from `/proc/self/status`, `/proc/self/oom_score_adj` and the
    /// open-file limit.
    pub fn detect() -> Result<Self, SpecError> {
        let read = |p: &str| {
            std::fs::read_to_string(p).map_err(|e| SpecError::Io {
                op: "read",
                path: p.into(),
                source: e,
            })
        };
        let parse_err = |p: &str, what: &str| SpecError::Io {
            op: "parse",
            path: p.into(),
            source: io::Error::new(io::ErrorKind::InvalidData, what.to_string()),
        };
        let status = read("/proc/self/status")?;
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("CapBnd:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .ok_or_else(|| parse_err("/proc/self/status", "no CapBnd line"))?;
        let min_oom_score_adj = read("/proc/self/oom_score_adj")?
            .trim()
            .parse()
            .map_err(|_| parse_err("/proc/self/oom_score_adj", "not a number"))?;
        let ids = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| IdSet::parse(&s))
        };
        let online_mems = if Path::new("/sys/devices/system/node").exists() {
            ids("/sys/devices/system/node/online")
        } else {
            IdSet::parse("0")
        };
        Ok(Self {
            bounding_caps: caps_from_mask(mask),
            min_oom_score_adj,
            open_files: Some(OpenFileLimit::current()),
            online_cpus: ids("/sys/devices/system/cpu/online"),
            online_mems,
            // The runtime knows its cgroups and OCI runtime and corrects these.
            hugetlb: true,
            recursive_read_only: false,
            user_namespaces: false,
            cgroup_namespaces: false,
        })
    }
}

/// Everything needed to build the spec of one container.
#[derive(Debug, Clone, Copy)]
pub struct ContainerSpecInput<'a> {
    /// The container id.
    pub id: &'a str,
    /// The CRI container config.
    pub config: &'a api::ContainerConfig,
    /// The CRI config of its pod sandbox.
    pub sandbox_config: &'a api::PodSandboxConfig,
    /// The image's config, if known.
    pub image_config: Option<&'a oci_spec::image::Config>,
    /// The container's root filesystem: mounted already, unless `users` is given.
    pub rootfs: &'a Path,
    /// The user and group databases of the rootfs when the caller holds them (they are
    /// the image's, as a new container's writable layer is empty); `None`: read from the
    /// mounted `rootfs`.
    pub users: Option<&'a crate::user::UserDb>,
    /// What the sandbox provides.
    pub sandbox: &'a SandboxContext,
    /// What the host allows.
    pub host: &'a HostLimits,
    /// The host directories of the container's image volumes, mounted
    /// already, by index in `config.mounts` (the image's root, or its
    /// `image_sub_path` resolved in it).
    pub image_volumes: &'a ImageVolumeSources,
}

/// Host directories of image volume mounts, by index in the CRI mounts.
pub type ImageVolumeSources = std::collections::BTreeMap<usize, PathBuf>;

/// The cgroup path of a container (from the hierarchy's root) under the
/// pod's: `<cgroup_parent>/<container id>` with cgroupfs, the scope
/// `<cgroup_parent>/petrel-<container id>.scope` with systemd.
pub fn driver_cgroup_path(
    driver: crate::cgroups::systemd::CgroupDriver,
    cgroup_parent: &str,
    container_id: &str,
) -> String {
    match driver {
        crate::cgroups::systemd::CgroupDriver::Cgroupfs => {
            container_cgroup_path(cgroup_parent, container_id)
        }
        crate::cgroups::systemd::CgroupDriver::Systemd => {
            crate::cgroups::systemd::container_cgroup(cgroup_parent, container_id)
        }
    }
}

/// The spec's `linux.cgroupsPath` of a container: its cgroup path with
/// cgroupfs, runc's `<pod slice>:petrel:<container id>` with systemd.
pub fn spec_cgroups_path(
    driver: crate::cgroups::systemd::CgroupDriver,
    cgroup_parent: &str,
    container_id: &str,
) -> String {
    match driver {
        crate::cgroups::systemd::CgroupDriver::Cgroupfs => {
            container_cgroup_path(cgroup_parent, container_id)
        }
        crate::cgroups::systemd::CgroupDriver::Systemd => {
            crate::cgroups::systemd::spec_cgroups_path(cgroup_parent, container_id)
        }
    }
}

/// The cgroup path of a container: `<cgroup_parent>/<container id>`, cgroupfs style.
pub fn container_cgroup_path(cgroup_parent: &str, container_id: &str) -> String {
    let parent = cgroup_parent.trim_end_matches('/');
    if parent.is_empty() {
        format!("/{container_id}")
    } else if parent.starts_with('/') {
        format!("{parent}/{container_id}")
    } else {
        format!("/{parent}/{container_id}")
    }
}

/// Refuses, naming the field, what [`build_container_spec`] would refuse
/// about the request alone (no rootfs, no sandbox state): privileged
/// without a privileged sandbox, CDI devices, resources the kernel cannot
/// apply ([`linux_resources`]), an `oom_score_adj` outside -1000..1000, and
/// the mounts ([`check_mounts`]). CreateContainer calls it before it makes
/// anything.
pub fn check_container(
    config: &api::ContainerConfig,
    sandbox_config: &api::PodSandboxConfig,
    host: &HostLimits,
) -> Result<(), SpecError> {
    let sc = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let privileged = sc.is_some_and(|s| s.privileged);
    check_privileged(privileged, sandbox_config)?;
    if !config.cdi_devices.is_empty() {
        return Err(invalid("cdi_devices", "CDI devices are not supported"));
    }
    if let Some(r) = config.linux.as_ref().and_then(|l| l.resources.as_ref()) {
        linux_resources(r, host)?;
    }
    oom_score_adj(config, host)?;
    // Reads a Localhost profile, so a missing or malformed one is refused
    // before anything exists.
    seccomp::check_container_seccomp(sc)?;
    check_mounts(&config.mounts, privileged, host.recursive_read_only)
}

fn check_privileged(
    privileged: bool,
    sandbox_config: &api::PodSandboxConfig,
) -> Result<(), SpecError> {
    let sandbox_privileged = sandbox_config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|s| s.privileged);
    if privileged && !sandbox_privileged {
        return Err(invalid(
            "linux.security_context.privileged",
            "a privileged container needs a privileged pod sandbox",
        ));
    }
    Ok(())
}

/// Builds the OCI runtime spec of a container.
///
/// Rules (containerd's unless stated): process arguments from the CRI command/args and
/// the image entrypoint/cmd; env = default `PATH`, `HOSTNAME`, image env, CRI envs;
/// cwd; user from `run_as_*` or the image `User`, resolved inside the rootfs;
/// `oom_score_adj` clamped up to [`HostLimits::min_oom_score_adj`]; capabilities
/// (default set, CRI add/drop, privileged = the host bounding set), clamped to the
/// host bounding set; mounts (see the `mounts` module); namespaces from the sandbox
/// (a new mount namespace always; PID per the container's PID mode); devices and
/// device cgroup rules; resources via [`linux_resources`]; masked and read-only paths;
/// the pod's sysctls; CRI annotations plus containerd's `io.kubernetes.cri.*` keys;
/// the seccomp filter (see the [`seccomp`] module: `RuntimeDefault` is Petrel's own
/// profile, `Localhost` a checked OCI profile file, privileged means unconfined).
///
/// A pod with a user namespace ([`SandboxContext::user`]): every container joins it,
/// with its mappings in `linux.uidMappings`/`gidMappings`, and its CRI mounts are
/// idmapped with them ([`IDMAP_OPTION`]; write the spec with [`config_json`]).
///
/// Not supported (documented gaps): AppArmor profiles, SELinux labels, user namespaces
/// other than the pod's, `TARGET` PID mode, image volumes, per-mount id mappings,
/// recursive read-only mounts
/// where the host cannot make them ([`HostLimits::recursive_read_only`]), CDI
/// devices, and the shared/slave check of bidirectional mount sources.
pub fn build_container_spec(input: &ContainerSpecInput) -> Result<Spec, SpecError> {
    let config = input.config;
    let linux_cfg = config.linux.as_ref();
    let sc = linux_cfg.and_then(|l| l.security_context.as_ref());
    let privileged = sc.is_some_and(|s| s.privileged);
    let readonly_rootfs = sc.is_some_and(|s| s.readonly_rootfs);
    check_privileged(privileged, input.sandbox_config)?;
    if !config.cdi_devices.is_empty() {
        return Err(invalid("cdi_devices", "CDI devices are not supported"));
    }

    let sandbox = input.sandbox;
    let hostname = if sandbox.hostname.is_empty() {
        rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned()
    } else {
        sandbox.hostname.clone()
    };

    // Process.
    let image = input.image_config;
    let user = process::user(sc, image, input.rootfs, input.users)?;
    let mut oci_user = User::default();
    oci_user
        .set_uid(user.uid)
        .set_gid(user.gid)
        .set_additional_gids(Some(user.additional_gids));
    let capabilities = caps::capabilities(sc, input.host)?;
    let seccomp = seccomp::container_seccomp(
        sc,
        capabilities
            .bounding()
            .as_ref()
            .unwrap_or(&Default::default()),
    )?;
    let mut proc = Process::default();
    proc.set_terminal(Some(config.tty))
        .set_user(oci_user)
        .set_args(Some(process::args(config, image)?))
        .set_env(Some(process::env(config, image, &hostname)?))
        .set_cwd(process::cwd(config, image)?)
        .set_capabilities(Some(capabilities))
        .set_rlimits(open_file_rlimits(input.host.open_files)?)
        .set_no_new_privileges(Some(sc.is_some_and(|s| s.no_new_privs)))
        .set_apparmor_profile(None)
        .set_selinux_label(None)
        .set_oom_score_adj(oom_score_adj(config, input.host)?);

    // Mounts and root.
    let mounts = mounts::mounts_with_images(
        config,
        sandbox,
        privileged,
        readonly_rootfs,
        input.host.recursive_read_only,
        input.image_volumes,
    )?;
    let mut root = Root::default();
    root.set_path(input.rootfs.to_path_buf())
        .set_readonly(Some(readonly_rootfs));

    // Linux.
    let mut namespaces = namespaces(sc, sandbox)?;
    if input.host.cgroup_namespaces && !privileged {
        let mut ns = LinuxNamespace::default();
        ns.set_typ(LinuxNamespaceType::Cgroup);
        namespaces.push(ns);
    }
    let resources = linux_cfg.and_then(|l| l.resources.as_ref());
    let mut res = match resources {
        Some(r) => linux_resources(r, input.host)?,
        None => Default::default(),
    };
    let devices = devices::devices(config, privileged)?;
    res.set_devices(Some(devices.rules));
    let (masked, readonly) = if privileged {
        (Vec::new(), Vec::new())
    } else {
        let pick = |given: Option<&Vec<String>>, default: &[&str]| match given {
            Some(v) if !v.is_empty() => v.clone(),
            _ => default.iter().map(|s| s.to_string()).collect(),
        };
        (
            pick(sc.map(|s| &s.masked_paths), DEFAULT_MASKED_PATHS),
            pick(sc.map(|s| &s.readonly_paths), DEFAULT_READONLY_PATHS),
        )
    };
    let mut linux = Linux::default();
    if let Some(user) = &sandbox.user {
        linux
            .set_uid_mappings(Some(vec![user.mappings.uids.oci()]))
            .set_gid_mappings(Some(vec![user.mappings.gids.oci()]));
    }
    linux
        .set_namespaces(Some(namespaces))
        .set_cgroups_path(Some(PathBuf::from(spec_cgroups_path(
            sandbox.cgroup_driver,
            &sandbox.cgroup_parent,
            input.id,
        ))))
        .set_resources(Some(res))
        .set_devices(Some(devices.devices))
        .set_masked_paths(Some(masked))
        .set_readonly_paths(Some(readonly))
        .set_rootfs_propagation(mounts.rootfs_propagation)
        .set_sysctl(sysctls(input.sandbox_config, sandbox)?)
        .set_seccomp(seccomp);

    let mut spec = Spec::default();
    spec.set_version(OCI_VERSION.to_string())
        .set_process(Some(proc))
        .set_root(Some(root))
        .set_hostname(
            (sandbox.uts != NamespaceRef::Host && !hostname.is_empty()).then_some(hostname),
        )
        .set_mounts(Some(mounts.mounts))
        .set_annotations(Some(spec_annotations(input)))
        .set_linux(Some(linux));
    Ok(spec)
}

/// `RLIMIT_NOFILE` of the container's process (and of exec'd ones, whose process is
/// the spec's with other arguments).
fn open_file_rlimits(limit: Option<OpenFileLimit>) -> Result<Option<Vec<PosixRlimit>>, SpecError> {
    let Some(l) = limit else {
        return Ok(None);
    };
    let rlimit = PosixRlimitBuilder::default()
        .typ(PosixRlimitType::RlimitNofile)
        .soft(l.soft)
        .hard(l.hard)
        .build()
        .map_err(|e| invalid("process.rlimits", e.to_string()))?;
    Ok(Some(vec![rlimit]))
}

/// The requested `oom_score_adj`, raised to what we may set; `None` without resources.
fn oom_score_adj(
    config: &api::ContainerConfig,
    host: &HostLimits,
) -> Result<Option<i32>, SpecError> {
    let Some(r) = config.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
        return Ok(None);
    };
    let adj = i32::try_from(r.oom_score_adj)
        .ok()
        .filter(|a| (-1000..=1000).contains(a))
        .ok_or_else(|| {
            invalid(
                "linux.resources.oom_score_adj",
                format!("{} is outside -1000..1000", r.oom_score_adj),
            )
        })?;
    if adj < host.min_oom_score_adj {
        tracing::debug!(
            requested = adj,
            applied = host.min_oom_score_adj,
            "oom_score_adj raised to our own"
        );
    }
    Ok(Some(adj.max(host.min_oom_score_adj)))
}

/// Namespaces: user (the pod's, if it has one), then runc's order: pid,
/// network, ipc, uts, mount. A container's own `userns_options`, when
/// given, must ask for the pod's user namespace (kubelet repeats the
/// pod's): a container cannot have one of its own, nor leave the pod's.
fn namespaces(
    sc: Option<&api::LinuxContainerSecurityContext>,
    sandbox: &SandboxContext,
) -> Result<Vec<LinuxNamespace>, SpecError> {
    const FIELD: &str = "linux.security_context.namespace_options";
    let options = sc.and_then(|s| s.namespace_options.as_ref());
    if let Some(userns) = options.and_then(|o| o.userns_options.as_ref()) {
        let field = format!("{FIELD}.userns_options");
        let asked = crate::userns::requested(Some(userns), &field)?;
        let pods = sandbox.user.as_ref().map(|u| u.mappings);
        if asked != pods {
            return Err(invalid(
                field,
                match pods {
                    Some(_) => "must be the pod's user namespace (mode POD, the pod's mappings)",
                    None => "the pod has no user namespace of its own (mode NODE)",
                },
            ));
        }
    }
    // The CRI default PID mode is POD; kubelet sends CONTAINER unless the pod shares it.
    let pid_mode = options.map_or(api::NamespaceMode::Pod as i32, |o| o.pid);
    let pid = match api::NamespaceMode::try_from(pid_mode) {
        Ok(api::NamespaceMode::Pod) => sandbox.pid.clone(),
        Ok(api::NamespaceMode::Container) => NamespaceRef::New,
        Ok(api::NamespaceMode::Node) => NamespaceRef::Host,
        Ok(api::NamespaceMode::Target) => {
            return Err(invalid(
                format!("{FIELD}.pid"),
                "TARGET PID mode is not supported",
            ))
        }
        Err(_) => {
            return Err(invalid(
                format!("{FIELD}.pid"),
                format!("unknown mode {pid_mode}"),
            ))
        }
    };
    let user = match &sandbox.user {
        Some(u) => NamespaceRef::Path(u.path.clone()),
        None => NamespaceRef::Host,
    };
    let wanted = [
        (LinuxNamespaceType::User, &user),
        (LinuxNamespaceType::Pid, &pid),
        (LinuxNamespaceType::Network, &sandbox.network),
        (LinuxNamespaceType::Ipc, &sandbox.ipc),
        (LinuxNamespaceType::Uts, &sandbox.uts),
        (LinuxNamespaceType::Mount, &NamespaceRef::New),
    ];
    Ok(wanted
        .into_iter()
        .filter_map(|(typ, r)| {
            let mut ns = LinuxNamespace::default();
            ns.set_typ(typ);
            match r {
                NamespaceRef::Host => return None,
                NamespaceRef::New => {}
                NamespaceRef::Path(p) => {
                    ns.set_path(Some(p.clone()));
                }
            }
            Some(ns)
        })
        .collect())
}

/// The pod's sysctls, which its containers apply again in the namespaces they share.
/// Namespaced sysctls of a namespace shared with the host are refused (runc would too).
fn sysctls(
    sandbox_config: &api::PodSandboxConfig,
    sandbox: &SandboxContext,
) -> Result<Option<HashMap<String, String>>, SpecError> {
    let Some(sysctls) = sandbox_config.linux.as_ref().map(|l| &l.sysctls) else {
        return Ok(None);
    };
    if sysctls.is_empty() {
        return Ok(None);
    }
    for key in sysctls.keys() {
        let net = key.starts_with("net.");
        let ipc = key.starts_with("fs.mqueue.")
            || [
                "kernel.msgmax",
                "kernel.msgmnb",
                "kernel.msgmni",
                "kernel.sem",
            ]
            .contains(&key.as_str())
            || key.starts_with("kernel.shm");
        if (net && sandbox.network == NamespaceRef::Host)
            || (ipc && sandbox.ipc == NamespaceRef::Host)
        {
            return Err(invalid(
                format!("linux.sysctls[{key}]"),
                "a namespaced sysctl cannot be set in a namespace shared with the host",
            ));
        }
    }
    Ok(Some(sysctls.clone()))
}

fn spec_annotations(input: &ContainerSpecInput) -> HashMap<String, String> {
    let config = input.config;
    let mut out = config.annotations.clone();
    out.insert(annotations::CONTAINER_TYPE.into(), "container".into());
    if let Some(m) = &config.metadata {
        out.insert(annotations::CONTAINER_NAME.into(), m.name.clone());
    }
    if let Some(img) = &config.image {
        let name = if img.user_specified_image.is_empty() {
            &img.image
        } else {
            &img.user_specified_image
        };
        out.insert(annotations::IMAGE_NAME.into(), name.clone());
    }
    if let Some(m) = &input.sandbox_config.metadata {
        out.insert(annotations::SANDBOX_NAME.into(), m.name.clone());
        out.insert(annotations::SANDBOX_NAMESPACE.into(), m.namespace.clone());
        out.insert(annotations::SANDBOX_UID.into(), m.uid.clone());
    }
    out
}

#[cfg(test)]
mod tests;
