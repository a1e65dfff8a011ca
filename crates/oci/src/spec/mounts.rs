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
    propagation: api::MountPropagation,
}

/// Builds all mounts of a container.
///
/// Order: the default filesystems (`/proc`, `/dev`, `/dev/pts`, `/dev/shm`,
/// `/dev/mqueue`, `/sys`, `/sys/fs/cgroup`) minus those a bind mount replaces (and
/// everything under `/dev` when `/dev` itself is bound), then the CRI mounts and the
/// sandbox's `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf` and `/dev/shm`
/// (CRI mounts win over those), sorted by depth so that parents come first.
pub(super) fn mounts(
    config: &api::ContainerConfig,
    sandbox: &SandboxContext,
    privileged: bool,
    readonly_rootfs: bool,
) -> Result<Mounts, SpecError> {
    let mut binds = cri_binds(&config.mounts)?;
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
            propagation: api::MountPropagation::PropagationPrivate,
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
        let rw = if b.readonly { "ro" } else { "rw" };
        out.push(mount(
            &b.destination,
            "bind",
            &b.source.to_string_lossy(),
            &["rbind", prop, rw],
        ));
    }
    Ok(Mounts {
        mounts: out,
        rootfs_propagation: rootfs_propagation.map(str::to_string),
    })
}

/// Validates the CRI mounts and resolves their host paths.
fn cri_binds(mounts: &[api::Mount]) -> Result<Vec<Bind>, SpecError> {
    let mut out = Vec::with_capacity(mounts.len());
    for (i, m) in mounts.iter().enumerate() {
        let field = |f: &str| format!("mounts[{i}].{f}");
        if m.container_path.is_empty() {
            return Err(invalid(field("container_path"), "must not be empty"));
        }
        if !m.container_path.starts_with('/') {
            return Err(invalid(
                field("container_path"),
                format!("{} is not an absolute path", m.container_path),
            ));
        }
        if m.image.is_some() {
            return Err(invalid(
                field("image"),
                "image volume mounts are not supported",
            ));
        }
        if m.host_path.is_empty() {
            return Err(invalid(field("host_path"), "must not be empty"));
        }
        if m.recursive_read_only {
            return Err(invalid(
                field("recursive_read_only"),
                "recursive read-only mounts are not supported by the OCI runtime",
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
        // Like kubelet and containerd, follow a symlinked host path to its target.
        let source = match std::fs::canonicalize(&m.host_path) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(invalid(
                    field("host_path"),
                    format!("{} does not exist", m.host_path),
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
            destination: clean(&m.container_path),
            source,
            readonly: m.readonly,
            propagation,
        });
    }
    Ok(out)
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
        let m = mounts(&config(vec![]), &sandbox(), false, false).expect("mounts");
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
        let m = mounts(&config(vec![]), &sandbox(), true, false).expect("mounts");
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
        let m = mounts(&config(vec![]), &sb, false, true).expect("mounts");
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
        let m = mounts(&cfg, &sb, false, false).expect("mounts");
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
        let m = mounts(&cfg, &sandbox(), false, false).expect("mounts");
        assert_eq!(dests(&m)[7..], ["/z", "/a", "/y", "/a/b", "/a/b/c"]);
    }

    #[test]
    fn mounts_should_map_readonly_and_propagation_to_options() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut ro = cri_mount("/ro", tmp.path());
        ro.readonly = true;
        let mut slave = cri_mount("/slave", tmp.path());
        slave.propagation = api::MountPropagation::PropagationHostToContainer as i32;
        let m = mounts(&config(vec![ro, slave]), &sandbox(), false, false).expect("mounts");
        assert_eq!(opts(find(&m, "/ro")), ["rbind", "rprivate", "ro"]);
        assert_eq!(opts(find(&m, "/slave")), ["rbind", "rslave", "rw"]);
        assert_eq!(find(&m, "/ro").typ().as_deref(), Some("bind"));
        assert_eq!(m.rootfs_propagation.as_deref(), Some("rslave"));

        let mut shared = cri_mount("/shared", tmp.path());
        shared.propagation = api::MountPropagation::PropagationBidirectional as i32;
        let mut slave = cri_mount("/slave", tmp.path());
        slave.propagation = api::MountPropagation::PropagationHostToContainer as i32;
        let m = mounts(&config(vec![shared, slave]), &sandbox(), false, false).expect("mounts");
        assert_eq!(opts(find(&m, "/shared")), ["rbind", "rshared", "rw"]);
        assert_eq!(m.rootfs_propagation.as_deref(), Some("rshared"));
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
        )
        .expect("mounts");
        assert_eq!(
            find(&m, "/data").source().as_deref(),
            Some(target.as_path())
        );
    }

    fn invalid_field(cfg: api::ContainerConfig) -> (String, String) {
        match mounts(&cfg, &sandbox(), false, false) {
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
        assert_eq!(r, format!("{} does not exist", missing.display()));

        let mut bad_prop = ok.clone();
        bad_prop.propagation = 7;
        assert_eq!(
            invalid_field(config(vec![bad_prop])).0,
            "mounts[0].propagation"
        );

        let mut rro = ok.clone();
        rro.readonly = true;
        rro.recursive_read_only = true;
        assert_eq!(
            invalid_field(config(vec![rro])).0,
            "mounts[0].recursive_read_only"
        );

        let mut img = ok;
        img.host_path.clear();
        img.image = Some(api::ImageSpec::default());
        assert_eq!(invalid_field(config(vec![img])).0, "mounts[0].image");
    }

    #[test]
    fn clean_should_normalise_paths() {
        assert_eq!(clean("/a//b/./c/"), "/a/b/c");
        assert_eq!(clean("/a/../../b"), "/b");
        assert_eq!(clean("/"), "/");
    }
}
