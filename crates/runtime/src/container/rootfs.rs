//! A container's root filesystem: an overlay of the image's shared,
//! read-only layers with the container's own writable layer on top.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::idmap::LayerIdmap;
use crate::error::{Result, RuntimeError};

/// Directories of a container's writable layer.
#[derive(Debug, Clone)]
pub struct WritableLayer {
    /// overlayfs upperdir.
    pub upper: PathBuf,
    /// overlayfs workdir (same filesystem as upper).
    pub work: PathBuf,
}

impl WritableLayer {
    /// The writable layer kept in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            upper: dir.join("upper"),
            work: dir.join("work"),
        }
    }

    /// Creates the directories: the layer's own directory private, `work`
    /// 0700, and `upper` 0755 exactly, whatever the umask: overlayfs gives
    /// the container's `/` the mode of `upper`, and a container running as
    /// another user than root must be able to enter it.
    pub fn create(&self) -> Result<()> {
        let io = |e| RuntimeError::dir("create writable layer", e);
        if let Some(dir) = self.upper.parent() {
            petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE).map_err(io)?;
        }
        petrel_fs::create_private_dir_all(&self.work, petrel_fs::PRIVATE).map_err(io)?;
        petrel_fs::create_private_dir_all(&self.upper, 0o755).map_err(io)?;
        Ok(())
    }
}

/// Mounts the overlay at `target`. `lower` lists the image layers topmost
/// first; an image without layers gets an empty lower directory. With
/// `idmap` (a pod with its own user namespace) the layers are idmapped
/// views and the upper directory belongs to the container's root (see
/// [`super::idmap`]).
pub fn mount(
    lower: &[PathBuf],
    layer: &WritableLayer,
    empty_lower: &Path,
    target: &Path,
    idmap: Option<&LayerIdmap>,
) -> Result<()> {
    let Some(idmap) = idmap else {
        return mount_overlay_of(lower, layer, empty_lower, target);
    };
    super::idmap::own_upper(&layer.upper, idmap)?;
    if lower.is_empty() {
        return mount_overlay_of(lower, layer, empty_lower, target);
    }
    let views = layer.upper.parent().unwrap_or(&layer.upper).join("lower");
    let attached = super::idmap::attach(lower, idmap, &views)?;
    let mounted = mount_overlay_of(&attached, layer, empty_lower, target);
    super::idmap::detach(&attached);
    if let Err(e) = std::fs::remove_dir(&views) {
        tracing::debug!(path = %views.display(), error = %e, "idmapped layers directory not removed");
    }
    mounted
}

fn mount_overlay_of(
    lower: &[PathBuf],
    layer: &WritableLayer,
    empty_lower: &Path,
    target: &Path,
) -> Result<()> {
    let io = |e| RuntimeError::dir("create rootfs mount point", e);
    petrel_fs::create_private_dir_all(target, petrel_fs::PRIVATE).map_err(io)?;
    let lowers: Vec<String> = if lower.is_empty() {
        // With `upper` on top, the merged `/` takes upper's mode, not this one's.
        petrel_fs::create_private_dir_all(empty_lower, petrel_fs::PRIVATE).map_err(io)?;
        vec![empty_lower.display().to_string()]
    } else {
        lower.iter().map(|p| p.display().to_string()).collect()
    };
    for p in lowers.iter().chain([
        &layer.upper.display().to_string(),
        &layer.work.display().to_string(),
    ]) {
        // overlayfs splits its options on ',' and its lower dirs on ':'.
        if p.contains([',', ':']) {
            return Err(RuntimeError::Invariant(format!(
                "overlay path {p} contains ',' or ':'"
            )));
        }
    }
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lowers.join(":"),
        layer.upper.display(),
        layer.work.display()
    );
    // The options, `volatile` included, must fit in one page.
    if data.len() + VOLATILE_OPTION.len() >= 4096 {
        return Err(RuntimeError::Invariant(format!(
            "overlay options for {} exceed a page ({} layers)",
            target.display(),
            lowers.len()
        )));
    }
    // `volatile` (Linux 5.10+) drops overlayfs's syncs of the upper file
    // system: on every fsync in the container and on unmount, where the
    // sync of the whole ext4 file system under the layer made up most of
    // RemoveContainer's tail (p99 ~9 ms). Nothing durable is lost: a
    // writable layer never outlives its container, and after a crash of
    // the machine every container is dead and kubelet makes new ones.
    let mounted = if VOLATILE.load(Ordering::Relaxed) {
        match mount_overlay(&format!("{data}{VOLATILE_OPTION}"), target) {
            Err(rustix::io::Errno::INVAL) => {
                // Perhaps an older kernel: try without, and stop asking if
                // that works.
                let plain = mount_overlay(&data, target);
                if plain.is_ok() {
                    VOLATILE.store(false, Ordering::Relaxed);
                    tracing::info!("overlayfs refused volatile: container layers are synced");
                }
                plain
            }
            other => other,
        }
    } else {
        mount_overlay(&data, target)
    };
    mounted.map_err(|e| RuntimeError::io("mount overlay at", target, e.into()))
}

const VOLATILE_OPTION: &str = ",volatile";

/// Whether overlay mounts get the `volatile` option (cleared the first
/// time the kernel refuses it).
static VOLATILE: AtomicBool = AtomicBool::new(true);

fn mount_overlay(data: &str, target: &Path) -> rustix::io::Result<()> {
    let data = std::ffi::CString::new(data).map_err(|_| rustix::io::Errno::INVAL)?;
    rustix::mount::mount(
        "overlay",
        target,
        "overlay",
        rustix::mount::MountFlags::empty(),
        data.as_c_str(),
    )
}

/// Resolves `sub_path` (relative, clean) inside the image mounted at
/// `root` as if `root` were `/`: a symlink in the image, even an absolute
/// one or one with `..`, never leads out of it. Returns the host path of
/// what it names; `NotFound` when nothing does.
pub fn resolve_in_image(root: &Path, sub_path: &str) -> std::io::Result<PathBuf> {
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};
    use std::os::fd::AsRawFd;
    let root_fd = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let fd = openat2(
        &root_fd,
        sub_path,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
    )?;
    // The kernel's name for what was opened: inside `root` by construction.
    let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if !path.starts_with(root) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} resolved outside the image, to {}",
                sub_path,
                path.display()
            ),
        ));
    }
    Ok(path)
}

/// Mounts an image's layers (`lower`, topmost first) read-only at `target`:
/// an overlay of lower directories only, with `empty_lower` at the bottom
/// (overlayfs without an upper directory wants two lower ones; an image
/// without layers is then that empty directory alone, bound read-only).
pub fn mount_read_only(lower: &[PathBuf], empty_lower: &Path, target: &Path) -> Result<()> {
    let io = |e| RuntimeError::dir("create image volume mount point", e);
    petrel_fs::create_private_dir_all(target, petrel_fs::PRIVATE).map_err(io)?;
    petrel_fs::create_private_dir_all(empty_lower, petrel_fs::PRIVATE).map_err(io)?;
    let lowers: Vec<String> = lower
        .iter()
        .chain([&empty_lower.to_path_buf()])
        .map(|p| p.display().to_string())
        .collect();
    if let Some(p) = lowers.iter().find(|p| p.contains([',', ':'])) {
        return Err(RuntimeError::Invariant(format!(
            "overlay path {p} contains ',' or ':'"
        )));
    }
    let mounted = if lower.is_empty() {
        bind_read_only(empty_lower, target)
    } else {
        let data = format!("lowerdir={}", lowers.join(":"));
        if data.len() >= 4096 {
            return Err(RuntimeError::Invariant(format!(
                "overlay options for {} exceed a page ({} layers)",
                target.display(),
                lowers.len()
            )));
        }
        let data = std::ffi::CString::new(data).map_err(|_| {
            RuntimeError::Invariant(format!("overlay options for {} hold NUL", target.display()))
        })?;
        rustix::mount::mount(
            "overlay",
            target,
            "overlay",
            rustix::mount::MountFlags::RDONLY,
            data.as_c_str(),
        )
    };
    mounted.map_err(|e| RuntimeError::io("mount image volume at", target, e.into()))
}

fn bind_read_only(source: &Path, target: &Path) -> rustix::io::Result<()> {
    use rustix::mount::MountFlags;
    rustix::mount::mount_bind(source, target)?;
    let remounted =
        rustix::mount::mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, c"");
    if remounted.is_err() {
        // Never leave it writable.
        let _ = rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH);
    }
    remounted
}

/// Unmounts the rootfs; not mounted or missing is fine.
pub fn unmount(target: &Path) -> Result<()> {
    crate::sandbox::files::unmount(target)
}

/// Whether `target` is a mount point: its device differs from its
/// parent's (an overlay has a device of its own). False when it or its
/// parent is missing.
pub fn is_mount_point(target: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(parent) = target.parent() else {
        return false;
    };
    match (std::fs::metadata(target), std::fs::metadata(parent)) {
        (Ok(t), Ok(p)) => t.dev() != p.dev(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::resolve_in_image;

    #[test]
    fn is_mount_point_should_tell_a_mount_from_a_plain_directory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let plain = tmp.path().join("plain");
        std::fs::create_dir(&plain).expect("mkdir");
        assert!(!super::is_mount_point(&plain));
        assert!(!super::is_mount_point(&tmp.path().join("missing")));
        // /proc is a mount of its own on every Linux host.
        assert!(super::is_mount_point(std::path::Path::new("/proc")));
    }

    #[test]
    fn resolve_in_image_should_follow_symlinks_inside_the_image_only() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("image");
        std::fs::create_dir_all(root.join("etc/conf"))?;
        std::fs::create_dir_all(tmp.path().join("etc/conf"))?;
        // Absolute and climbing links resolve against the image's root.
        std::os::unix::fs::symlink("/etc", root.join("abs"))?;
        std::os::unix::fs::symlink("../../../../etc", root.join("climb"))?;
        let root = std::fs::canonicalize(&root)?;
        assert_eq!(resolve_in_image(&root, "etc/conf")?, root.join("etc/conf"));
        assert_eq!(resolve_in_image(&root, "abs/conf")?, root.join("etc/conf"));
        assert_eq!(
            resolve_in_image(&root, "climb/conf")?,
            root.join("etc/conf")
        );
        let missing = resolve_in_image(&root, "no/such").expect_err("missing");
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        Ok(())
    }
}
