//! Idmapped views of a container's image layers, for a pod with a user
//! namespace of its own.
//!
//! The image's files are owned on disk by host ids (root's by 0), which the
//! pod's user namespace does not map: its containers would see them owned
//! by nobody. Each lower layer is therefore cloned as a detached bind mount
//! (`open_tree`), idmapped with the pod's user namespace (`mount_setattr`,
//! `MOUNT_ATTR_IDMAP`: an id `i` on disk is seen as the host id that
//! container id `i` maps to) and attached on a directory of the container's
//! writable layer, where overlayfs (Linux 5.19+) takes it as a lower layer.
//! Once the overlay is mounted those attachments are let go: overlayfs
//! holds private clones of its layers. The writable layer's upper directory
//! is given to the container's root (its host ids), so that `/` and what
//! the container writes are owned as inside.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::mount::{MoveMountFlags, OpenTreeFlags};

use crate::error::{Result, RuntimeError};

/// The pod's user namespace as a rootfs needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerIdmap {
    /// The pinned user namespace file.
    pub userns: PathBuf,
    /// The host uid and gid of the container's root.
    pub host_root: (u32, u32),
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `MOUNT_ATTR_IDMAP`.
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Idmapped views of `lower` attached on numbered directories of `dir`
/// (created); returns their paths, in `lower`'s order. On failure what was
/// attached is let go.
pub fn attach(lower: &[PathBuf], idmap: &LayerIdmap, dir: &Path) -> Result<Vec<PathBuf>> {
    let userns = std::fs::File::open(&idmap.userns)
        .map_err(|e| RuntimeError::io("open user namespace", &idmap.userns, e))?;
    petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE)
        .map_err(|e| RuntimeError::dir("create idmapped layer directory", e))?;
    let mut attached = Vec::with_capacity(lower.len());
    for (i, src) in lower.iter().enumerate() {
        let target = dir.join(i.to_string());
        match attach_one(src, &userns, &target) {
            Ok(()) => attached.push(target),
            Err(e) => {
                detach(&attached);
                return Err(e);
            }
        }
    }
    Ok(attached)
}

fn attach_one(src: &Path, userns: &std::fs::File, target: &Path) -> Result<()> {
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        src,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| RuntimeError::io("clone layer mount", src, e.into()))?;
    set_idmap(&tree, userns).map_err(|e| RuntimeError::io("idmap layer", src, e))?;
    petrel_fs::create_private_dir_all(target, petrel_fs::PRIVATE)
        .map_err(|e| RuntimeError::dir("create idmapped layer mount point", e))?;
    rustix::mount::move_mount(
        &tree,
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| RuntimeError::io("attach idmapped layer at", target, e.into()))
}

fn set_idmap(tree: &OwnedFd, userns: &std::fs::File) -> std::io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr(2) on a detached mount we own, reading `attr`
    // (its size passed) for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Lets go of attached views (lazily: overlayfs keeps its own clones) and
/// removes their directories; best effort, logged.
pub fn detach(attached: &[PathBuf]) {
    for p in attached {
        if let Err(e) = crate::sandbox::files::unmount(p) {
            tracing::warn!(path = %p.display(), error = %e, "idmapped layer not unmounted");
            continue;
        }
        if let Err(e) = std::fs::remove_dir(p) {
            tracing::warn!(path = %p.display(), error = %e, "idmapped layer directory not removed");
        }
    }
}

/// Lets the container's init, an unmapped uid on the host until it is in
/// its user namespace, reach its rootfs in `bundle` (runc prepares the
/// rootfs from inside the namespace): the bundle and every directory from
/// it up to the `state` directory get search permission for others (not
/// read: nothing can be listed), and the directories above `state` must
/// have it already (FAILED_PRECONDITION naming the first that has not:
/// the runtime changes nothing outside its own directory).
pub fn make_reachable(bundle: &Path, state: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut dir = Some(bundle);
    while let Some(d) = dir {
        let meta = std::fs::metadata(d).map_err(|e| RuntimeError::io("stat", d, e))?;
        let mode = meta.permissions().mode();
        if mode & 0o001 == 0 {
            if !d.starts_with(state) {
                return Err(RuntimeError::FailedPrecondition(format!(
                    "{} (mode {:o}) is not searchable by others: a container in a user namespace \
                     cannot reach its rootfs below it (chmod o+x)",
                    d.display(),
                    mode & 0o7777
                )));
            }
            std::fs::set_permissions(d, std::fs::Permissions::from_mode((mode | 0o001) & 0o7777))
                .map_err(|e| RuntimeError::io("chmod o+x", d, e))?;
        }
        dir = d.parent();
    }
    Ok(())
}

/// Gives the writable layer's `upper` directory to the container's root.
pub fn own_upper(upper: &Path, idmap: &LayerIdmap) -> Result<()> {
    let (uid, gid) = idmap.host_root;
    std::os::unix::fs::chown(upper, Some(uid), Some(gid))
        .map_err(|e| RuntimeError::io("chown writable layer", upper, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn attach_should_show_layer_files_owned_by_the_mapped_ids_and_detach_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layer = dir.path().join("layer");
        std::fs::create_dir(&layer).expect("mkdir");
        std::fs::write(layer.join("root-file"), "x").expect("write");
        std::os::unix::fs::chown(layer.join("root-file"), Some(0), Some(0)).expect("chown");
        let req = crate::sandbox::namespaces::NamespaceRequest {
            user: Some(petrel_oci::userns::UserMappings {
                uids: petrel_oci::userns::IdRange {
                    container_id: 0,
                    host_id: 500_000,
                    size: 65536,
                },
                gids: petrel_oci::userns::IdRange {
                    container_id: 0,
                    host_id: 600_000,
                    size: 65536,
                },
            }),
            ..Default::default()
        };
        let pins = dir.path().join("pins");
        std::fs::create_dir(&pins).expect("mkdir");
        let pinned = crate::sandbox::namespaces::pin(&pins, &req).expect("pin");
        let idmap = LayerIdmap {
            userns: pinned.user.clone().expect("user"),
            host_root: (500_000, 600_000),
        };
        let views = dir.path().join("views");
        let attached = attach(std::slice::from_ref(&layer), &idmap, &views);
        let attached = match attached {
            Ok(a) => a,
            Err(e) => {
                let _ = pinned.release();
                panic!("attach: {e}");
            }
        };
        let meta = std::fs::metadata(attached[0].join("root-file")).expect("stat");
        detach(&attached);
        let _ = pinned.release();
        assert_eq!((meta.uid(), meta.gid()), (500_000, 600_000));
        assert!(!attached[0].exists(), "the view's directory must be gone");
        // The layer itself is untouched.
        let orig = std::fs::metadata(layer.join("root-file")).expect("stat");
        assert_eq!((orig.uid(), orig.gid()), (0, 0));
    }
}
