//! The mount seam: a container's overlay rootfs.

use std::path::{Path, PathBuf};

use crate::container::idmap::LayerIdmap;
use crate::container::rootfs::{self, WritableLayer};
use crate::error::Result;

/// Mounts and unmounts containers' root filesystems.
pub trait RootfsMounter: Send + Sync + std::fmt::Debug {
    /// Mounts the overlay of `lower` (topmost first; `empty_lower` for an
    /// image without layers) and `layer` at `target`, the layers idmapped
    /// with the pod's user namespace when `idmap` is given.
    fn mount(
        &self,
        lower: &[PathBuf],
        layer: &WritableLayer,
        empty_lower: &Path,
        target: &Path,
        idmap: Option<&LayerIdmap>,
    ) -> Result<()>;

    /// Mounts the image layers `lower` (topmost first) read-only at
    /// `target`, over `empty_lower`: an image volume.
    fn mount_read_only(&self, lower: &[PathBuf], empty_lower: &Path, target: &Path) -> Result<()>;

    /// Unmounts `target`; not mounted or missing is fine.
    fn unmount(&self, target: &Path) -> Result<()>;

    /// Whether something is mounted at `target` (false when it is missing).
    fn is_mounted(&self, target: &Path) -> bool;
}

/// Overlay mounts of the host's kernel.
#[derive(Debug, Default)]
pub struct OverlayMounter;

impl RootfsMounter for OverlayMounter {
    fn mount(
        &self,
        lower: &[PathBuf],
        layer: &WritableLayer,
        empty_lower: &Path,
        target: &Path,
        idmap: Option<&LayerIdmap>,
    ) -> Result<()> {
        rootfs::mount(lower, layer, empty_lower, target, idmap)
    }

    fn mount_read_only(&self, lower: &[PathBuf], empty_lower: &Path, target: &Path) -> Result<()> {
        rootfs::mount_read_only(lower, empty_lower, target)
    }

    fn unmount(&self, target: &Path) -> Result<()> {
        rootfs::unmount(target)
    }

    fn is_mounted(&self, target: &Path) -> bool {
        rootfs::is_mount_point(target)
    }
}
