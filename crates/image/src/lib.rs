//! Petrel's image store.
//!
//! Images are pulled from registries ([`registry`]) or imported from local
//! archives (an OCI image layout or a `docker save` archive), verified
//! blob by blob, and their layers unpacked once each into
//! `<root>/layers/<diff id hex>/` in overlayfs lower-layer format, shared by
//! every image that uses them. Image and layer metadata
//! lives in `<root>/meta.redb` (see `petrel-store`) and is committed before
//! an import or removal returns.
//!
//! ```text
//! <root>/meta.redb              images and layers tables
//! <root>/layers/<hex>/          one unpacked layer per diff id
//! <root>/tmp/import-<rand>/     an import in progress (extracted archive)
//! <root>/tmp/layer-<rand>/      a layer being unpacked, renamed into layers/
//! <root>/tmp/gc-<rand>/         a layer being deleted
//! <root>/tmp/blob-<rand>        a blob being pulled (removed once committed)
//! ```

mod archive;
mod diff;
mod digest;
mod error;
mod export;
mod limits;
mod mounts;
mod reference;
pub mod registry;
mod store;
mod tar_guard;
mod unpack;

use std::path::PathBuf;

pub use diff::{apply_diff, archive_diff};
pub use error::ImageError;
pub use export::Exported;
pub use limits::{
    Limits, DEFAULT_MAX_LAYER_BYTES, MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, MAX_TAR_EXTENSION_BYTES,
};
pub use oci_spec;
pub use reference::normalize_reference;
pub use store::{DiskStats, GcReport, ImageStore, Removal, GC_MIN_AGE, PRUNE_USE_GUARD};

/// An image in the store.
#[derive(Clone, Debug)]
pub struct Image {
    /// `sha256:<hex>` of the image's config blob.
    pub id: String,
    /// Normalised references (`docker.io/library/busybox:latest`).
    pub repo_tags: Vec<String>,
    /// `name@sha256:<manifest digest>` for each name, when known (images
    /// imported from a docker archive have no manifest digest).
    pub repo_digests: Vec<String>,
    /// Sum of the layer blob sizes as stored in the archive (compressed when
    /// the layers were), as `crictl images` shows.
    pub size: u64,
    /// The image configuration (entrypoint, env, user, ...).
    pub config: oci_spec::image::ImageConfiguration,
    /// `sha256:<hex>` of each uncompressed layer, base layer first.
    pub diff_ids: Vec<String>,
}

/// Disk use of the image store, for CRI `ImageFsInfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsUsage {
    /// Mount point of the filesystem holding the store's root.
    pub mountpoint: PathBuf,
    /// Bytes allocated to the unpacked layers.
    pub used_bytes: u64,
    /// Inodes of the unpacked layers.
    pub inodes_used: u64,
}
