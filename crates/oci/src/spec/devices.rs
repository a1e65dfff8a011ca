//! Device nodes of a container and the device cgroup rules that go with them.

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType};
use petrel_cri::api;

use super::{invalid, SpecError};

/// Directories of the host's `/dev` that never hold devices to pass to a container.
const SKIPPED_DEV_DIRS: &[&str] = &["pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev"];

/// How deep `/dev` is walked for a privileged container.
const MAX_DEV_DEPTH: usize = 8;

/// Devices and cgroup rules of a container.
#[derive(Debug, Default)]
pub(super) struct Devices {
    /// Device nodes runc creates in the container.
    pub devices: Vec<LinuxDevice>,
    /// Device cgroup rules, in order (the last matching rule wins).
    pub rules: Vec<LinuxDeviceCgroup>,
}

/// The CRI devices, plus every host device when privileged. Rules: deny everything,
/// then allow the standard nodes and the requested devices; privileged allows all.
pub(super) fn devices(
    config: &api::ContainerConfig,
    privileged: bool,
) -> Result<Devices, SpecError> {
    let mut out = Devices::default();
    if privileged {
        out.devices = host_devices(Path::new("/dev"));
        out.rules.push(rule(true, None, None, None, "rwm"));
    } else {
        out.rules = default_rules();
    }
    for (i, d) in config.devices.iter().enumerate() {
        let field = |f: &str| format!("devices[{i}].{f}");
        if d.host_path.is_empty() {
            return Err(invalid(field("host_path"), "must not be empty"));
        }
        let container_path = if d.container_path.is_empty() {
            d.host_path.as_str()
        } else {
            d.container_path.as_str()
        };
        if !container_path.starts_with('/') {
            return Err(invalid(
                field("container_path"),
                format!("{container_path} is not an absolute path"),
            ));
        }
        let access = if d.permissions.is_empty() {
            "rwm"
        } else {
            d.permissions.as_str()
        };
        if !access.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(invalid(
                field("permissions"),
                format!("{access:?} is not a combination of r, w and m"),
            ));
        }
        // The host path may be a symlink (e.g. /dev/disk/by-id/...): use its target.
        let host = std::fs::canonicalize(&d.host_path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => invalid(
                field("host_path"),
                format!("{} does not exist", d.host_path),
            ),
            _ => SpecError::Io {
                op: "resolve",
                path: PathBuf::from(&d.host_path),
                source: e,
            },
        })?;
        let meta = std::fs::metadata(&host).map_err(|e| SpecError::Io {
            op: "stat",
            path: host.clone(),
            source: e,
        })?;
        let found: Vec<LinuxDevice> = if meta.is_dir() {
            // A directory (e.g. /dev/snd) passes every device below it.
            walk(&host, 0)
                .into_iter()
                .filter_map(|(p, m)| {
                    let rel = p.strip_prefix(&host).ok()?;
                    device(&Path::new(container_path).join(rel), &m)
                })
                .collect()
        } else {
            let dev = device(Path::new(container_path), &meta).ok_or_else(|| {
                invalid(
                    field("host_path"),
                    format!("{} is not a device", d.host_path),
                )
            })?;
            vec![dev]
        };
        for dev in found {
            if !privileged {
                out.rules.push(rule(
                    true,
                    Some(dev.typ()),
                    Some(dev.major()),
                    Some(dev.minor()),
                    access,
                ));
            }
            out.devices.retain(|x| x.path() != dev.path());
            out.devices.push(dev);
        }
    }
    Ok(out)
}

/// Deny all, then allow mknod of anything and the nodes every container has:
/// null, zero, full, random, urandom, tty, console, ptmx and the pts devices.
fn default_rules() -> Vec<LinuxDeviceCgroup> {
    let c = Some(LinuxDeviceType::C);
    let mut rules = vec![
        rule(false, None, None, None, "rwm"),
        rule(true, c, None, None, "m"),
        rule(true, Some(LinuxDeviceType::B), None, None, "m"),
    ];
    for (major, minor) in [
        (1, 3),
        (1, 5),
        (1, 7),
        (1, 8),
        (1, 9),
        (5, 0),
        (5, 1),
        (5, 2),
    ] {
        rules.push(rule(true, c, Some(major), Some(minor), "rwm"));
    }
    rules.push(rule(true, c, Some(136), None, "rwm"));
    rules
}

fn rule(
    allow: bool,
    typ: Option<LinuxDeviceType>,
    major: Option<i64>,
    minor: Option<i64>,
    access: &str,
) -> LinuxDeviceCgroup {
    let mut r = LinuxDeviceCgroup::default();
    r.set_allow(allow)
        .set_typ(typ)
        .set_major(major)
        .set_minor(minor)
        .set_access(Some(access.to_string()));
    r
}

/// A device node entry for `path` in the container, if `meta` is a device.
fn device(path: &Path, meta: &Metadata) -> Option<LinuxDevice> {
    let ft = meta.file_type();
    let typ = if ft.is_char_device() {
        LinuxDeviceType::C
    } else if ft.is_block_device() {
        LinuxDeviceType::B
    } else {
        return None;
    };
    let rdev = meta.rdev();
    let mut d = LinuxDevice::default();
    d.set_path(path.to_path_buf())
        .set_typ(typ)
        .set_major(i64::from(rustix::fs::major(rdev)))
        .set_minor(i64::from(rustix::fs::minor(rdev)))
        .set_file_mode(Some(meta.mode() & 0o777))
        .set_uid(Some(meta.uid()))
        .set_gid(Some(meta.gid()));
    Some(d)
}

/// Every device of the host under `root` (same paths in the container), for
/// privileged containers. Unreadable entries are skipped.
fn host_devices(root: &Path) -> Vec<LinuxDevice> {
    walk(root, 0)
        .into_iter()
        .filter(|(p, _)| p != Path::new("/dev/console"))
        .filter_map(|(p, m)| device(&p, &m))
        .collect()
}

/// Device files below `dir` (symlinks are not followed), sorted by path.
fn walk(dir: &Path, depth: usize) -> Vec<(PathBuf, Metadata)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        let path = e.path();
        if meta.is_dir() {
            let skip = e
                .file_name()
                .to_str()
                .is_some_and(|n| SKIPPED_DEV_DIRS.contains(&n));
            if !skip && depth < MAX_DEV_DEPTH {
                out.extend(walk(&path, depth + 1));
            }
        } else if meta.file_type().is_char_device() || meta.file_type().is_block_device() {
            out.push((path, meta));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(devices: Vec<api::Device>) -> api::ContainerConfig {
        api::ContainerConfig {
            devices,
            ..Default::default()
        }
    }

    fn dev(host: &str, container: &str, perms: &str) -> api::Device {
        api::Device {
            host_path: host.into(),
            container_path: container.into(),
            permissions: perms.into(),
        }
    }

    #[test]
    fn devices_should_deny_all_then_allow_the_standard_nodes() {
        let d = devices(&cfg(vec![]), false).expect("devices");
        assert!(d.devices.is_empty());
        let first = &d.rules[0];
        assert!(!first.allow());
        assert_eq!(first.access().as_deref(), Some("rwm"));
        let allowed = |maj: i64, min: Option<i64>| {
            d.rules.iter().any(|r| {
                r.allow()
                    && r.major() == Some(maj)
                    && r.minor() == min
                    && r.access().as_deref() == Some("rwm")
            })
        };
        for (maj, min) in [
            (1, 3),
            (1, 5),
            (1, 7),
            (1, 8),
            (1, 9),
            (5, 0),
            (5, 1),
            (5, 2),
        ] {
            assert!(allowed(maj, Some(min)), "{maj}:{min}");
        }
        assert!(allowed(136, None), "pts");
    }

    #[test]
    fn devices_should_add_a_cri_device_with_its_numbers() {
        let d = devices(&cfg(vec![dev("/dev/null", "/dev/mynull", "rw")]), false).expect("devices");
        assert_eq!(d.devices.len(), 1);
        let n = &d.devices[0];
        assert_eq!(n.path(), Path::new("/dev/mynull"));
        assert_eq!(n.typ(), LinuxDeviceType::C);
        assert_eq!((n.major(), n.minor()), (1, 3));
        let last = d.rules.last().expect("rule");
        assert!(last.allow());
        assert_eq!((last.major(), last.minor()), (Some(1), Some(3)));
        assert_eq!(last.access().as_deref(), Some("rw"));
    }

    #[test]
    fn devices_should_reject_missing_or_non_device_paths_naming_the_field() {
        let err = devices(
            &cfg(vec![
                dev("/dev/null", "", ""),
                dev("/dev/nope-petrel", "", ""),
            ]),
            false,
        )
        .expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, .. } if field == "devices[1].host_path"),
            "{err}"
        );
        let err =
            devices(&cfg(vec![dev("/etc/hostname", "/x", "")]), false).expect_err("should fail");
        assert!(err.to_string().contains("not a device"), "{err}");
        let err =
            devices(&cfg(vec![dev("/dev/null", "/x", "rwx")]), false).expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, .. } if field == "devices[0].permissions"),
            "{err}"
        );
        let err = devices(&cfg(vec![dev("/dev/null", "x", "")]), false).expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, .. } if field == "devices[0].container_path"),
            "{err}"
        );
    }

    #[test]
    fn devices_should_allow_everything_and_pass_host_devices_when_privileged() {
        let d = devices(&cfg(vec![]), true).expect("devices");
        assert_eq!(d.rules.len(), 1);
        assert!(d.rules[0].allow());
        assert_eq!(d.rules[0].typ(), None);
        assert!(d.devices.iter().any(|x| x.path() == Path::new("/dev/null")));
        assert!(!d.devices.iter().any(|x| x.path().starts_with("/dev/pts")));
        assert!(!d
            .devices
            .iter()
            .any(|x| x.path() == Path::new("/dev/console")));
    }
}
