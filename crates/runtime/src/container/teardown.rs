//! What a container has on the host, undone: its OCI runtime state (and
//! with it the init), the rootfs mount, the bundle, the writable layer and
//! an empty cgroup a failed create may have left.

use std::path::Path;

use crate::container::mount_ns::HeldNamespace;
use crate::error::{Result, RuntimeError};
use crate::parts::RootfsMounter;
use crate::records::{ContainerRecord, ImageVolume};
use crate::service::Runtime;

impl Runtime {
    /// Undoes whatever a container has on the host: runc state (killing
    /// its init, which makes the shim exit) unless `runc_deleted` says it is
    /// gone already, the rootfs mount, the bundle and the writable layer.
    /// Every step runs; the errors of those that failed are returned.
    pub(crate) async fn teardown_container(
        &self,
        rec: &ContainerRecord,
        runc_deleted: bool,
        mount_ns: Option<HeldNamespace>,
    ) -> Result<()> {
        let t0 = std::time::Instant::now();
        let runc = async {
            if runc_deleted {
                return Ok(());
            }
            self.oci
                .delete(&rec.id, true)
                .await
                .map_err(RuntimeError::from)
        };
        let (bundle, layer) = (rec.bundle.clone(), rec.layer_dir.clone());
        let (runc, files) = if rec.init_dead() {
            // Its init is dead, so runc's record and the files are
            // independent: `runc delete` (a process of its own) and the
            // unmount and removal of the rootfs run side by side.
            let mounter = self.rootfs.clone();
            let files = tokio::task::spawn_blocking(move || {
                // The namespace's teardown (its copy of the rootfs mount
                // among the rest) comes before the rootfs is removed.
                drop(mount_ns);
                remove_container_files(mounter.as_ref(), &bundle, &layer)
            });
            let (runc, files) = tokio::join!(runc, files);
            let files =
                files.unwrap_or_else(|e| vec![RuntimeError::task("remove container files", e)]);
            (runc, files)
        } else {
            // A live init is killed first: its files go once it is dead.
            let runc = runc.await;
            drop(mount_ns);
            (
                runc,
                remove_container_files(self.rootfs.as_ref(), &bundle, &layer),
            )
        };
        // runc removes the container's own cgroup; a container that never
        // reached runc may still have left an empty one (removing it fails
        // only when something still lives in it: runc's delete says why).
        if let Err(e) = self.cgroups.remove(&rec.cgroup_path) {
            tracing::debug!(container.id = %rec.id, cgroup = %rec.cgroup_path, error = %e, "container cgroup not removed");
        }
        tracing::debug!(
            container.id = %rec.id,
            teardown_us = t0.elapsed().as_micros() as u64,
            "container torn down"
        );
        let mut errors: Vec<RuntimeError> = runc.err().into_iter().collect();
        errors.extend(files);
        RuntimeError::all(errors)
    }
}

/// Unmounts a container's rootfs and image volumes and removes its bundle
/// and writable layer; every step runs, the errors of those that failed
/// are returned. The volumes are found on disk, not in the record: a create
/// that failed midway, or a leftover found at recovery, is undone alike.
pub(crate) fn remove_container_files(
    mounter: &dyn RootfsMounter,
    bundle: &Path,
    layer: &Path,
) -> Vec<RuntimeError> {
    let (volumes_unmounted, mut errors) = unmount_container(mounter, bundle);
    // Never walk into an image volume still mounted: its files are the
    // image's (read-only, but an error per file).
    if volumes_unmounted {
        errors.extend(crate::util::remove_dir(bundle).err());
    }
    errors.extend(crate::util::remove_dir(layer).err());
    errors
}

/// Unmounts (detaches) a container's image volumes and rootfs under
/// `bundle`; every step runs. Returns whether every image volume was
/// unmounted, and the errors.
pub(crate) fn unmount_container(
    mounter: &dyn RootfsMounter,
    bundle: &Path,
) -> (bool, Vec<RuntimeError>) {
    let mut errors: Vec<RuntimeError> = image_volume_dirs(bundle)
        .iter()
        .filter_map(|dir| mounter.unmount(dir).err())
        .collect();
    let unmounted = errors.is_empty();
    errors.extend(mounter.unmount(&bundle.join("rootfs")).err());
    (unmounted, errors)
}

/// The image volume mount points under `bundle` (none when it is missing).
fn image_volume_dirs(bundle: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(ImageVolume::parent(bundle)) else {
        return Vec::new();
    };
    entries.flatten().map(|e| e.path()).collect()
}
