//! Mounts of a container: the runtime's defaults, the sandbox's files, the CRI mounts.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Mount;
use petrel_cri::api;

use super::{invalid, SandboxContext, SpecError};

/// Mounts and the rootfs propagation they need.
#[derive(Debug)]
pub(super) struct Mounts {
    /// In mount order.
    pub mounts: Vec<Mount>,
    /// `rshared`/`rslave` when a bind mount needs it, else runc's default.
    pub rootfs_propagation: Option<String>,
}

/// A bind mount to add, before conversion.
struct Bind {
    destination: String,
    source: PathBuf,
    readonly: bool,
    /// Read-only submounts too (`rro`); only with `readonly`.
    recursive: bool,
    propagation: api::MountPropagation,
    /// A volume of a pod in a user namespace: idmapped with the pod's
    /// mappings (the `idmap` option; see [`super::config_json`]).
    idmapped: bool,
}

/// Builds all mounts of a container.
///
/// Order: the default filesystems (`/proc`, `/dev`, `/dev/pts`, `/dev/shm`,
/// `/dev/mqueue`, `/sys`, `/sys/fs/cgroup`) minus those a bind mount replaces (and
/// everything under `/dev` when `/dev` itself is bound), then the CRI mounts and the
/// sandbox's `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf` and `/dev/shm`
/// (CRI mounts win over those), sorted by depth so that parents come first.
/// `recursive_read_only` says whether the host can make a bind mount
/// read-only with its submounts ([`HostLimits::recursive_read_only`](super::HostLimits)).
/// In a pod with a user namespace the CRI mounts of host paths (volumes)
/// are idmapped, so that host files keep their owners inside; the
/// sandbox's own files and image volumes are not (they are read-only to
/// the container, or world-writable like shm).
pub(super) fn mounts_with_images(
    config: &api::ContainerConfig,
    sandbox: &SandboxContext,
    privileged: bool,
    readonly_rootfs: bool,
    recursive_read_only: bool,
    image_volumes: &super::ImageVolumeSources,
) -> Result<Mounts, SpecError> {
    let mut binds = cri_binds(
        &config.mounts,
        privileged,
        recursive_read_only,
        Some(image_volumes),
        sandbox.user.is_some(),
    )?;
    let cri_dests: HashSet<String> = binds.iter().map(|b| b.destination.clone()).collect();
    let extras = [
        (
            "/etc/hostname",
            &sandbox.etc_hostname,
            readonly_rootfs,
            "etc_hostname",
        ),
        (
            "/etc/hosts",
            &sandbox.etc_hosts,
            readonly_rootfs,
            "etc_hosts",
        ),
        (
            "/etc/resolv.conf",
            &sandbox.resolv_conf,
            readonly_rootfs,
            "resolv_conf",
        ),
        ("/dev/shm", &sandbox.shm, false, "shm"),
    ];
    for (dest, source, readonly, name) in extras {
        let Some(source) = source else { continue };
        if cri_dests.contains(dest) {
            continue;
        }
        let source = std::fs::canonicalize(source).map_err(|e| SpecError::Io {
            op: "resolve",
            path: source.clone(),
            source: io::Error::new(e.kind(), format!("sandbox {name}: {e}")),
        })?;
        binds.push(Bind {
            destination: dest.to_string(),
            source,
            readonly,
            recursive: false,
            propagation: api::MountPropagation::PropagationPrivate,
            idmapped: false,
        });
    }
    // Stable: among equal depths the CRI order (then the extras) is kept.
    binds.sort_by_key(|b| depth(&b.destination));

    let bound: HashSet<&str> = binds.iter().map(|b| b.destination.as_str()).collect();
    let dev_bound = bound.contains("/dev");
    let mut out: Vec<Mount> = default_mounts(privileged)
        .into_iter()
        .filter(|m| {
            let d = m.destination().to_string_lossy();
            let replaced = bound.contains(d.as_ref()) || (dev_bound && d.starts_with("/dev/"));
            !replaced
        })
        .collect();

    let mut rootfs_propagation: Option<&str> = None;
    for b in &binds {
        let prop = match b.propagation {
            api::MountPropagation::PropagationPrivate => "rprivate",
            api::MountPropagation::PropagationHostToContainer => {
                if rootfs_propagation.is_none() {
                    rootfs_propagation = Some("rslave");
                }
                "rslave"
            }
            api::MountPropagation::PropagationBidirectional => {
                rootfs_propagation = Some("rshared");
                "rshared"
            }
        };
        // `rro` alone: runc makes the mount and every submount read-only
        // with one recursive mount_setattr(2).
        let rw = match (b.readonly, b.recursive) {
            (true, true) => "rro",
            (true, false) => "ro",
            (false, _) => "rw",
        };
        let mut options = vec!["rbind", prop, rw];
        if b.idmapped {
            options.push(super::IDMAP_OPTION);
        }
        out.push(mount(
            &b.destination,
            "bind",
            &b.source.to_string_lossy(),
            &options,
        ));
    }
    Ok(Mounts {
        mounts: out,
        rootfs_propagation: rootfs_propagation.map(str::to_string),
    })
}

/// The only paths under `/proc` a mount may cover (runc's own list: files
/// that lxcfs-style FUSE filesystems emulate per container).
const PROC_MOUNTABLE: &[&str] = &[
    "/proc/cpuinfo",
    "/proc/diskstats",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/swaps",
    "/proc/uptime",
    "/proc/loadavg",
    "/proc/slabinfo",
    "/proc/net/dev",
    "/proc/sys/kernel/ns_last_pid",
];

/// Linux's PATH_MAX: no longer path can be mounted on.
const PATH_MAX: usize = 4096;

/// Checks the CRI mounts of a container, and resolves nothing: what
/// CreateContainer refuses before it makes anything. See [`container_path`]
/// for the destinations; bidirectional propagation needs a privileged
/// container (kubelet's and the API server's rule); a host path must exist;
/// a recursive read-only mount must be read-only, of private propagation,
/// and `recursive_read_only` (the host's support) true.
pub fn check_mounts(
    mounts: &[api::Mount],
    privileged: bool,
    recursive_read_only: bool,
) -> Result<(), SpecError> {
    cri_binds(mounts, privileged, recursive_read_only, None, false).map(|_| ())
}

/// Checks an image volume's `image_sub_path` (`field`) as written: relative,
/// without `..` components (it must stay inside the image; symlinks in it
/// are resolved inside the image when it is mounted), no NUL, at most
/// PATH_MAX bytes. An empty path is the image's root. Returns the path
/// without `.` components and repeated slashes.
pub fn check_image_sub_path(field: &str, p: &str) -> Result<String, SpecError> {
    let bad = |why: &str| Err(invalid(field, format!("{} {why}", super::shown(p))));
    if p.len() > PATH_MAX || p.contains('\0') {
        return bad(&format!(
            "is not a path (NUL, or longer than {PATH_MAX} bytes)"
        ));
    }
    if p.starts_with('/') {
        return bad("is absolute: it must be relative to the image's root");
    }
    if p.split('/').any(|c| c == "..") {
        return bad("escapes the image: it has .. components");
    }
    Ok(p.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/"))
}

/// Checks an image volume mount (`field` names its fields): an image named,
/// and read-only (the CRI's rule: an image is never written).
fn check_image_volume(m: &api::Mount, field: &dyn Fn(&str) -> String) -> Result<(), SpecError> {
    let named = m.image.as_ref().is_some_and(|i| !i.image.is_empty());
    if !named {
        return Err(invalid(field("image.image"), "must not be empty"));
    }
    if !m.readonly {
        return Err(invalid(
            field("readonly"),
            "an image volume must be read-only",
        ));
    }
    Ok(())
}

/// Checks a mount destination: absolute, without `.` or `..` components
/// (repeated and trailing slashes are dropped: kubelet passes a pod's
/// `mountPath` as written), at most PATH_MAX bytes, and not `/`, `/proc` or
/// a path under it other than `PROC_MOUNTABLE`, `/sys`, or a path under
/// what runc masks there by default. Returns the clean path.
pub fn container_path(field: &str, p: &str) -> Result<String, SpecError> {
    let bad = |why: &str| Err(invalid(field, format!("{} {why}", super::shown(p))));
    if p.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if p.len() > PATH_MAX {
        return bad(&format!("is longer than {PATH_MAX} bytes"));
    }
    if p.contains('\0') {
        return bad("contains NUL");
    }
    if !p.starts_with('/') {
        return bad("is not an absolute path");
    }
    if p.split('/').any(|c| c == "." || c == "..") {
        return bad("is not clean: it has . or .. components");
    }
    let clean = clean(p);
    let under = |root: &str| clean == root || clean.starts_with(&format!("{root}/"));
    if clean == "/" {
        return bad("would replace the container's root filesystem");
    }
    if under("/proc") && !PROC_MOUNTABLE.contains(&clean.as_str()) {
        return bad("is /proc or under it: only runc's emulated files there may be mounted");
    }
    let sys_masked = super::DEFAULT_MASKED_PATHS
        .iter()
        .filter(|m| m.starts_with("/sys/"))
        .any(|m| under(m));
    if clean == "/sys" || sys_masked {
        return bad("is /sys or a path runc masks under it");
    }
    Ok(clean)
}

/// Validates the CRI mounts and resolves their host paths. An image volume
/// takes its source from `image_volumes` (by mount index); `None`: only
/// checking, nothing is resolved for it. `idmap` (a pod in a user
/// namespace): host-path binds are idmapped, image volumes are not.
fn cri_binds(
    mounts: &[api::Mount],
    privileged: bool,
    recursive_read_only: bool,
    image_volumes: Option<&super::ImageVolumeSources>,
    idmap: bool,
) -> Result<Vec<Bind>, SpecError> {
    let mut out = Vec::with_capacity(mounts.len());
    for (i, m) in mounts.iter().enumerate() {
        let field = |f: &str| format!("mounts[{i}].{f}");
        let destination = container_path(&field("container_path"), &m.container_path)?;
        // RuntimeFeatures.mount_options is false: kubelet sends none, and
        // any other client is told rather than ignored.
        if !m.mount_options.is_empty() {
            return Err(invalid(
                field("mount_options"),
                format!("{:?}: mount options are not supported", m.mount_options),
            ));
        }
        if m.image.is_none() && !m.image_sub_path.is_empty() {
            return Err(invalid(
                field("image_sub_path"),
                "is only for an image volume (a mount with image set)",
            ));
        }
        if m.image.is_some() {
            check_image_volume(m, &field)?;
            check_image_sub_path(&field("image_sub_path"), &m.image_sub_path)?;
            if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
                return Err(invalid(
                    field("uid_mappings"),
                    "id-mapped mounts are not supported",
                ));
            }
            // Read-only whatever else the request says: `rro` when asked
            // (and supported), private propagation.
            if m.recursive_read_only && !recursive_read_only {
                return Err(invalid(
                    field("recursive_read_only"),
                    "recursive read-only mounts are not supported here",
                ));
            }
            let Some(sources) = image_volumes else {
                continue;
            };
            let source = sources
                .get(&i)
                .ok_or_else(|| invalid(field("image"), "the image volume was not mounted"))?;
            out.push(Bind {
                destination,
                source: source.clone(),
                readonly: true,
                recursive: m.recursive_read_only,
                propagation: api::MountPropagation::PropagationPrivate,
                // Read-only and not idmapped in a user-namespaced pod: its
                // files show as the overflow id there, readable by mode.
                idmapped: false,
            });
            continue;
        }
        if m.host_path.is_empty() {
            return Err(invalid(field("host_path"), "must not be empty"));
        }
        if m.host_path.len() > PATH_MAX || m.host_path.contains('\0') {
            return Err(invalid(
                field("host_path"),
                format!(
                    "{} is not a path (NUL, or longer than {PATH_MAX} bytes)",
                    super::shown(&m.host_path)
                ),
            ));
        }
        if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
            return Err(invalid(
                field("uid_mappings"),
                "id-mapped mounts are not supported",
            ));
        }
        let propagation = api::MountPropagation::try_from(m.propagation).map_err(|_| {
            invalid(
                field("propagation"),
                format!("unknown propagation {}", m.propagation),
            )
        })?;
        if m.recursive_read_only {
            check_recursive_read_only(m, propagation, recursive_read_only)
                .map_err(|why| invalid(field("recursive_read_only"), why))?;
        }
        if propagation == api::MountPropagation::PropagationBidirectional && !privileged {
            return Err(invalid(
                field("propagation"),
                "bidirectional propagation is only for privileged containers",
            ));
        }
        // Like kubelet and containerd, follow a symlinked host path to its target.
        let source = match std::fs::canonicalize(&m.host_path) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(invalid(
                    field("host_path"),
                    format!("{} does not exist", super::shown(&m.host_path)),
                ))
            }
            Err(e) => {
                return Err(SpecError::Io {
                    op: "resolve",
                    path: PathBuf::from(&m.host_path),
                    source: e,
                })
            }
        };
        out.push(Bind {
            destination,
            source,
            readonly: m.readonly,
            recursive: m.recursive_read_only,
            propagation,
            idmapped: idmap,
        });
    }
    Ok(out)
}

/// Why a mount asking to be read-only recursively cannot be (the CRI's
/// rules, as containerd and CRI-O apply them): it must be read-only, its
/// propagation private (a submount propagated in later could not be made
/// read-only), and the host must support it (`supported`).
fn check_recursive_read_only(
    m: &api::Mount,
    propagation: api::MountPropagation,
    supported: bool,
) -> Result<(), String> {
    if !m.readonly {
        return Err("a recursive read-only mount must also be readonly".into());
    }
    if propagation != api::MountPropagation::PropagationPrivate {
        return Err(format!(
            "a recursive read-only mount needs propagation PROPAGATION_PRIVATE, not {}",
            propagation.as_str_name()
        ));
    }
    if !supported {
        return Err(format!(
            "recursive read-only mounts are not supported here (they need Linux {}.{} \
             or later and an OCI runtime that knows the rro mount option)",
            crate::features::RRO_KERNEL.0,
            crate::features::RRO_KERNEL.1
        ));
    }
    Ok(())
}

/// The filesystems every container gets.
fn default_mounts(privileged: bool) -> Vec<Mount> {
    let sys_mode = if privileged { "rw" } else { "ro" };
    vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", sys_mode],
        ),
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", sys_mode],
        ),
    ]
}

fn mount(destination: &str, typ: &str, source: &str, options: &[&str]) -> Mount {
    let mut m = Mount::default();
    m.set_destination(PathBuf::from(destination))
        .set_typ(Some(typ.to_string()))
        .set_source(Some(PathBuf::from(source)))
        .set_options(Some(options.iter().map(|s| s.to_string()).collect()));
    m
}

/// Lexically cleans an absolute path: no `.`, `..` or repeated slashes.
pub(super) fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in Path::new(path).components() {
        match c {
            std::path::Component::Normal(s) => parts.push(s.to_str().unwrap_or_default()),
            std::path::Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    format!("/{}", parts.join("/"))
}

/// Number of components of a clean absolute path (`/` is 0).
fn depth(path: &str) -> usize {
    path.split('/').filter(|c| !c.is_empty()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mounts of a container without image volumes.
    fn mounts(
        config: &api::ContainerConfig,
        sandbox: &SandboxContext,
        privileged: bool,
        readonly_rootfs: bool,
        recursive_read_only: bool,
    ) -> Result<Mounts, SpecError> {
        mounts_with_images(
            config,
            sandbox,
            privileged,
            readonly_rootfs,
            recursive_read_only,
            &Default::default(),
        )
    }
    use crate::spec::NamespaceRef;

    fn sandbox() -> SandboxContext {
        SandboxContext {
            network: NamespaceRef::New,
            ipc: NamespaceRef::New,
            uts: NamespaceRef::New,
            pid: NamespaceRef::New,
            hostname: "pod".into(),
            etc_hostname: None,
            etc_hosts: None,
            resolv_conf: None,
            shm: None,
            cgroup_parent: "/petrel/sb".into(),
            cgroup_driver: Default::default(),
            user: None,
        }
    }

    fn cri_mount(container: &str, host: &Path) -> api::Mount {
        api::Mount {
            container_path: container.into(),
            host_path: host.display().to_string(),
            ..Default::default()
        }
    }

    fn config(mounts: Vec<api::Mount>) -> api::ContainerConfig {
        api::ContainerConfig {
            mounts,
            ..Default::default()
        }
    }

    fn dests(m: &Mounts) -> Vec<String> {
        m.mounts
            .iter()
            .map(|m| m.destination().display().to_string())
            .collect()
    }

    fn find<'a>(m: &'a Mounts, dest: &str) -> &'a Mount {
        m.mounts
            .iter()
            .find(|m| m.destination() == Path::new(dest))
            .expect("mount present")
    }

    fn opts(m: &Mount) -> Vec<String> {
        m.options().clone().unwrap_or_default()
    }

    #[test]
    fn mounts_should_start_with_the_default_filesystems() {
        let m = mounts(&config(vec![]), &sandbox(), false, false, true).expect("mounts");
        assert_eq!(
            dests(&m),
            [
                "/proc",
                "/dev",
                "/dev/pts",
                "/dev/shm",
                "/dev/mqueue",
                "/sys",
                "/sys/fs/cgroup"
            ]
        );
        assert!(opts(find(&m, "/sys")).contains(&"ro".to_string()));
        assert!(opts(find(&m, "/sys/fs/cgroup")).contains(&"ro".to_string()));
        assert_eq!(find(&m, "/dev/shm").typ().as_deref(), Some("tmpfs"));
        assert!(m.rootfs_propagation.is_none());
    }

    #[test]
    fn mounts_should_make_sys_writable_when_privileged() {
        let m = mounts(&config(vec![]), &sandbox(), true, false, true).expect("mounts");
        assert!(opts(find(&m, "/sys")).contains(&"rw".to_string()));
        assert!(!opts(find(&m, "/sys")).contains(&"ro".to_string()));
        assert!(opts(find(&m, "/sys/fs/cgroup")).contains(&"rw".to_string()));
    }

    #[test]
    fn mounts_should_bind_sandbox_files_and_shm() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let f = |n: &str| {
            let p = tmp.path().join(n);
            std::fs::write(&p, "x").expect("write");
            p
        };
        let shm = tmp.path().join("shm");
        std::fs::create_dir(&shm).expect("mkdir");
        let mut sb = sandbox();
        sb.etc_hostname = Some(f("hostname"));
        sb.etc_hosts = Some(f("hosts"));
        sb.resolv_conf = Some(f("resolv.conf"));
        sb.shm = Some(shm.clone());
        let m = mounts(&config(vec![]), &sb, false, true, true).expect("mounts");
        let shm_mount = find(&m, "/dev/shm");
        assert_eq!(shm_mount.typ().as_deref(), Some("bind"));
        assert_eq!(shm_mount.source().as_deref(), Some(shm.as_path()));
        assert_eq!(opts(shm_mount), ["rbind", "rprivate", "rw"]);
        // readonly_rootfs makes the sandbox's /etc files read-only.
        assert_eq!(opts(find(&m, "/etc/hosts")), ["rbind", "rprivate", "ro"]);
        assert_eq!(dests(&m).iter().filter(|d| *d == "/dev/shm").count(), 1);
    }

    #[test]
    fn mounts_should_let_cri_mounts_override_sandbox_and_default_mounts() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mine = tmp.path().join("my-hosts");
        std::fs::write(&mine, "x").expect("write");
        let theirs = tmp.path().join("hosts");
        std::fs::write(&theirs, "x").expect("write");
        let mut sb = sandbox();
        sb.etc_hosts = Some(theirs);
        let cfg = config(vec![
            cri_mount("/etc/hosts/", &mine),
            cri_mount("/dev", tmp.path()),
        ]);
        let m = mounts(&cfg, &sb, false, false, true).expect("mounts");
        assert_eq!(
            find(&m, "/etc/hosts").source().as_deref(),
            Some(mine.as_path())
        );
        assert_eq!(dests(&m).iter().filter(|d| *d == "/etc/hosts").count(), 1);
        // Binding /dev replaces the default /dev and everything below it.
        assert_eq!(
            dests(&m),
            ["/proc", "/sys", "/sys/fs/cgroup", "/dev", "/etc/hosts"]
        );
    }

    #[test]
    fn mounts_should_sort_parents_before_children_stably() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cfg = config(vec![
            cri_mount("/a/b/c", tmp.path()),
            cri_mount("/z", tmp.path()),
            cri_mount("/a/b", tmp.path()),
            cri_mount("/a", tmp.path()),
            cri_mount("/y", tmp.path()),
        ]);
        let m = mounts(&cfg, &sandbox(), false, false, true).expect("mounts");
        assert_eq!(dests(&m)[7..], ["/z", "/a", "/y", "/a/b", "/a/b/c"]);
    }

    #[test]
    fn mounts_should_map_readonly_and_propagation_to_options() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut ro = cri_mount("/ro", tmp.path());
        ro.readonly = true;
        let mut slave = cri_mount("/slave", tmp.path());
        slave.propagation = api::MountPropagation::PropagationHostToContainer as i32;
        let m = mounts(&config(vec![ro, slave]), &sandbox(), false, false, true).expect("mounts");
        assert_eq!(opts(find(&m, "/ro")), ["rbind", "rprivate", "ro"]);
        assert_eq!(opts(find(&m, "/slave")), ["rbind", "rslave", "rw"]);
        assert_eq!(find(&m, "/ro").typ().as_deref(), Some("bind"));
        assert_eq!(m.rootfs_propagation.as_deref(), Some("rslave"));

        let mut shared = cri_mount("/shared", tmp.path());
        shared.propagation = api::MountPropagation::PropagationBidirectional as i32;
        let mut slave = cri_mount("/slave", tmp.path());
        slave.propagation = api::MountPropagation::PropagationHostToContainer as i32;
        let both = config(vec![shared, slave]);
        // Bidirectional propagation is for privileged containers only.
        assert_eq!(invalid_field(both.clone()).0, "mounts[0].propagation");
        let m = mounts(&both, &sandbox(), true, false, true).expect("mounts");
        assert_eq!(opts(find(&m, "/shared")), ["rbind", "rshared", "rw"]);
        assert_eq!(m.rootfs_propagation.as_deref(), Some("rshared"));
    }

    #[test]
    fn mounts_should_map_recursive_read_only_to_the_rro_option() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut rro = cri_mount("/rro", tmp.path());
        rro.readonly = true;
        rro.recursive_read_only = true;
        let mut ro = cri_mount("/ro", tmp.path());
        ro.readonly = true;
        let m = mounts(&config(vec![rro, ro]), &sandbox(), false, false, true).expect("mounts");
        assert_eq!(opts(find(&m, "/rro")), ["rbind", "rprivate", "rro"]);
        assert_eq!(opts(find(&m, "/ro")), ["rbind", "rprivate", "ro"]);
        assert!(m.rootfs_propagation.is_none());
    }

    #[test]
    fn mounts_should_refuse_recursive_read_only_where_the_cri_does() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut rro = cri_mount("/rro", tmp.path());
        rro.readonly = true;
        rro.recursive_read_only = true;
        let refused = |m: api::Mount, privileged: bool, supported: bool| match mounts(
            &config(vec![m]),
            &sandbox(),
            privileged,
            false,
            supported,
        ) {
            Err(SpecError::Invalid { field, reason }) => (field, reason),
            other => panic!("expected Invalid, got {other:?}"),
        };
        let mut writable = rro.clone();
        writable.readonly = false;
        let (f, r) = refused(writable, false, true);
        assert_eq!(f, "mounts[0].recursive_read_only");
        assert!(r.contains("readonly"), "{r}");
        for (prop, name) in [
            (
                api::MountPropagation::PropagationHostToContainer,
                "PROPAGATION_HOST_TO_CONTAINER",
            ),
            (
                api::MountPropagation::PropagationBidirectional,
                "PROPAGATION_BIDIRECTIONAL",
            ),
        ] {
            let mut m = rro.clone();
            m.propagation = prop as i32;
            // Privileged too: the propagation itself is allowed there.
            for privileged in [false, true] {
                let (f, r) = refused(m.clone(), privileged, true);
                assert_eq!(f, "mounts[0].recursive_read_only");
                assert!(r.contains(name), "{r}");
            }
        }
        let (f, r) = refused(rro.clone(), false, false);
        assert_eq!(f, "mounts[0].recursive_read_only");
        assert!(r.contains("not supported"), "{r}");
        // check_mounts, CreateContainer's early check, refuses the same.
        assert!(check_mounts(&[rro.clone()], false, false).is_err());
        assert!(check_mounts(&[rro], false, true).is_ok());
    }

    #[test]
    fn check_mounts_should_refuse_bad_sub_paths_and_mount_options_naming_the_field() {
        let mut escaping = image_mount("/v");
        escaping.image_sub_path = "../etc".into();
        assert_eq!(
            refused_field(check_mounts(&[escaping], false, false)),
            "mounts[0].image_sub_path"
        );
        let mut inside = image_mount("/v");
        inside.image_sub_path = "etc".into();
        assert!(check_mounts(&[inside], false, false).is_ok());
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut host = cri_mount("/h", tmp.path());
        host.image_sub_path = "etc".into();
        assert_eq!(
            refused_field(check_mounts(&[host], false, false)),
            "mounts[0].image_sub_path"
        );
        let mut opts = cri_mount("/h", tmp.path());
        opts.mount_options = vec!["noexec".into()];
        assert_eq!(
            refused_field(check_mounts(&[opts], false, false)),
            "mounts[0].mount_options"
        );
    }

    #[test]
    fn mounts_should_resolve_symlinked_host_paths() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let m = mounts(
            &config(vec![cri_mount("/data", &link)]),
            &sandbox(),
            false,
            false,
            true,
        )
        .expect("mounts");
        assert_eq!(
            find(&m, "/data").source().as_deref(),
            Some(target.as_path())
        );
    }

    fn invalid_field(cfg: api::ContainerConfig) -> (String, String) {
        match mounts(&cfg, &sandbox(), false, false, true) {
            Err(SpecError::Invalid { field, reason }) => (field, reason),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn mounts_should_reject_invalid_cri_mounts_naming_the_field() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ok = cri_mount("/ok", tmp.path());

        let (f, _) = invalid_field(config(vec![ok.clone(), cri_mount("rel/path", tmp.path())]));
        assert_eq!(f, "mounts[1].container_path");

        let mut empty = cri_mount("/x", tmp.path());
        empty.host_path.clear();
        let (f, _) = invalid_field(config(vec![ok.clone(), ok.clone(), empty]));
        assert_eq!(f, "mounts[2].host_path");

        let missing = tmp.path().join("missing");
        let (f, r) = invalid_field(config(vec![
            ok.clone(),
            ok.clone(),
            cri_mount("/x", &missing),
        ]));
        assert_eq!(f, "mounts[2].host_path");
        assert_eq!(
            r,
            format!("{:?} does not exist", missing.display().to_string())
        );

        let mut bad_prop = ok.clone();
        bad_prop.propagation = 7;
        assert_eq!(
            invalid_field(config(vec![bad_prop])).0,
            "mounts[0].propagation"
        );

        let mut img = ok;
        img.host_path.clear();
        img.image = Some(api::ImageSpec::default());
        assert_eq!(invalid_field(config(vec![img])).0, "mounts[0].image.image");
    }

    #[test]
    fn container_path_should_refuse_unclean_and_kernel_paths() {
        let f = "mounts[0].container_path";
        for ok in [
            "/data",
            "/data/",
            "//data//x",
            "/proc/cpuinfo",
            "/proc/net/dev",
            "/sys/fs/cgroup/x",
            "/system",
            "/procfs",
        ] {
            container_path(f, ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        assert_eq!(container_path(f, "/data/").expect("clean"), "/data");
        let long = format!("/{}", "a".repeat(5000));
        for bad in [
            "",
            "data",
            "./data",
            "/",
            "//",
            "/a/../b",
            "/a/./b",
            "/a/..",
            "/proc",
            "/proc/",
            "/proc/sys",
            "/proc/sysrq-trigger",
            "/proc/1/root",
            "/sys",
            "/sys/",
            "/sys/firmware",
            "/sys/firmware/efi",
            "/sys/devices/virtual/powercap",
            "/a\0b",
            long.as_str(),
        ] {
            match container_path(f, bad) {
                Err(SpecError::Invalid { field, reason }) => {
                    assert_eq!(field, f);
                    assert!(reason.len() < 200, "{reason}");
                }
                other => panic!("{bad:?}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn clean_should_normalise_paths() {
        assert_eq!(clean("/a//b/./c/"), "/a/b/c");
        assert_eq!(clean("/a/../../b"), "/b");
        assert_eq!(clean("/"), "/");
    }

    fn image_mount(dest: &str) -> api::Mount {
        api::Mount {
            container_path: dest.into(),
            readonly: true,
            image: Some(api::ImageSpec {
                image: "sha256:abc".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn refused_field(r: Result<(), SpecError>) -> String {
        match r {
            Err(SpecError::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn check_mounts_should_refuse_writable_or_unnamed_image_volumes() {
        assert!(check_mounts(&[image_mount("/v")], false, false).is_ok());
        let mut rw = image_mount("/v");
        rw.readonly = false;
        assert_eq!(
            refused_field(check_mounts(&[rw], false, false)),
            "mounts[0].readonly"
        );
        let mut unnamed = image_mount("/v");
        unnamed.image = Some(api::ImageSpec::default());
        assert_eq!(
            refused_field(check_mounts(&[unnamed], false, false)),
            "mounts[0].image.image"
        );
        let mut rro = image_mount("/v");
        rro.recursive_read_only = true;
        assert_eq!(
            refused_field(check_mounts(&[rro.clone()], false, false)),
            "mounts[0].recursive_read_only"
        );
        assert!(check_mounts(&[rro], false, true).is_ok());
    }

    #[test]
    fn check_image_sub_path_should_refuse_paths_that_escape_the_image() {
        for bad in ["/etc", "..", "a/../../b", "etc/..", "a\0b"] {
            let r = check_image_sub_path("mounts[0].image_sub_path", bad);
            assert!(
                matches!(&r, Err(SpecError::Invalid { field, .. }) if field == "mounts[0].image_sub_path"),
                "{bad:?}: {r:?}"
            );
        }
        let ok = |p: &str| check_image_sub_path("f", p).expect("valid");
        assert_eq!(ok(""), "");
        assert_eq!(ok("etc"), "etc");
        assert_eq!(ok("./usr//share/."), "usr/share");
        assert_eq!(ok("a..b"), "a..b");
    }

    #[test]
    fn mounts_should_bind_image_volumes_read_only_from_their_mounted_source() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut cfg = config(vec![image_mount("/v"), cri_mount("/h", tmp.path())]);
        // Whatever the request says about propagation: private.
        cfg.mounts[0].propagation = api::MountPropagation::PropagationHostToContainer as i32;
        let mut sources = super::super::ImageVolumeSources::new();
        sources.insert(0, tmp.path().join("vol"));
        let m = mounts_with_images(&cfg, &sandbox(), false, false, true, &sources).expect("mounts");
        let v = find(&m, "/v");
        assert_eq!(
            v.source().as_deref(),
            Some(tmp.path().join("vol").as_path())
        );
        assert_eq!(opts(v), ["rbind", "rprivate", "ro"]);
        assert!(m.rootfs_propagation.is_none());
        // A volume the runtime did not mount is never bound from anywhere else.
        let r = mounts_with_images(&cfg, &sandbox(), false, false, true, &Default::default());
        assert!(
            matches!(&r, Err(SpecError::Invalid { field, .. }) if field == "mounts[0].image"),
            "{r:?}"
        );
    }
}
