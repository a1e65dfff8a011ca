//! CreateContainer from a checkpoint archive: what the request becomes, and
//! the archive unpacked into the new container's directories.

use std::path::{Path, PathBuf};

use petrel_cri::api;

use super::archive::{self, ArchiveError, Metadata};
use crate::container::shim::ShimRestore;
use crate::error::{Result, RuntimeError};
use crate::records::RestoredFrom;
use crate::service::Runtime;

/// The field a restore is asked for by.
const IMAGE_FIELD: &str = "config.image.image";
/// Where a restoring container's CRIU images are unpacked, in its layer
/// directory (removed with it; emptied once the restore is done).
pub(crate) const IMAGES_DIR: &str = "checkpoint";

/// Whether CreateContainer's image names a checkpoint archive: an absolute
/// path to a file, as containerd and CRI-O take it (an image reference is
/// never absolute).
pub(crate) fn names_archive(image: &str) -> bool {
    image.starts_with('/') && Path::new(image).is_file()
}

/// A checkpoint archive's errors as answers about CreateContainer's image.
fn as_request_error(e: ArchiveError) -> RuntimeError {
    match e {
        ArchiveError::NotCheckpoint { .. } => RuntimeError::invalid(IMAGE_FIELD, e.to_string()),
        other => other.into(),
    }
}

/// What a restore takes from its archive before anything is made.
#[derive(Debug)]
pub(crate) struct RestorePlan {
    /// The container's configuration: the request's, with the archive's
    /// base image and the annotations of a restore.
    pub config: api::ContainerConfig,
    /// The base image, from the image store.
    pub image: petrel_image::Image,
    /// Recorded in the container's record.
    pub from: RestoredFrom,
}

impl Runtime {
    /// Reads the archive `path` and plans the restore of `config` from it:
    /// INVALID_ARGUMENT naming `config.image.image` when it is not a
    /// checkpoint or its base image is not in the store, `config.tty` for a
    /// container with a terminal; FAILED_PRECONDITION without CRIU.
    pub(crate) async fn plan_restore(
        &self,
        path: &Path,
        mut config: api::ContainerConfig,
    ) -> Result<RestorePlan> {
        if config.tty {
            return Err(RuntimeError::invalid(
                "config.tty",
                "a container with a terminal cannot be restored from a checkpoint",
            ));
        }
        self.criu_binary()?;
        let archive = path.to_path_buf();
        let meta: Metadata = tokio::task::spawn_blocking(move || archive::read_metadata(&archive))
            .await
            .map_err(|e| RuntimeError::task("read checkpoint archive", e))?
            .map_err(as_request_error)?;
        let c = &meta.config;
        let image = [&c.rootfs_image_ref, &c.rootfs_image_name, &c.rootfs_image]
            .into_iter()
            .filter(|r| !r.is_empty())
            .find_map(|r| self.images.get(r))
            .ok_or_else(|| {
                RuntimeError::invalid(
                    IMAGE_FIELD,
                    format!(
                        "checkpoint archive {} was taken from image {:?} ({}), which is not present: pull it first",
                        path.display(),
                        c.rootfs_image_name,
                        c.rootfs_image_ref
                    ),
                )
            })?;
        let name = if c.rootfs_image_name.is_empty() {
            image.id.clone()
        } else {
            c.rootfs_image_name.clone()
        };
        // The container shows its base image; the archive is in its
        // annotations, under the keys containerd uses.
        let spec = config.image.get_or_insert_with(Default::default);
        spec.image = name;
        spec.user_specified_image = String::new();
        config
            .annotations
            .insert("restored".to_string(), "true".to_string());
        config
            .annotations
            .insert("checkpointedAt".to_string(), c.checkpointed_at.clone());
        config
            .annotations
            .insert("checkpointImage".to_string(), path.display().to_string());
        Ok(RestorePlan {
            config,
            image,
            from: RestoredFrom {
                archive: path.to_path_buf(),
                checkpointed_at: meta.config.checkpointed_at.clone(),
            },
        })
    }

    /// Unpacks the archive `from` names for the container whose writable
    /// layer is in `layer_dir` (its upper directory made, empty, not yet
    /// mounted): CRIU's images into `<layer_dir>/checkpoint`, the rootfs
    /// diff into the upper directory. Returns what the shim needs.
    pub(crate) async fn unpack_restore(
        &self,
        from: &RestoredFrom,
        layer_dir: &Path,
    ) -> Result<ShimRestore> {
        let criu = self.criu_binary()?;
        let images: PathBuf = layer_dir.join(IMAGES_DIR);
        let upper = crate::container::rootfs::WritableLayer::new(layer_dir).upper;
        let limits = petrel_image::Limits {
            max_layer_bytes: self.config.max_layer_bytes,
        };
        let (archive, dir) = (from.archive.clone(), images.clone());
        tokio::task::spawn_blocking(move || {
            archive::unpack_for_restore(&archive, &dir, &upper, &limits)
        })
        .await
        .map_err(|e| RuntimeError::task("unpack checkpoint archive", e))?
        .map_err(as_request_error)?;
        Ok(ShimRestore { images, criu })
    }
}
