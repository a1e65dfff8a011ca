//! A container's writable layer as a layer tar and back: what a checkpoint
//! archive's `rootfs-diff.tar` holds (the files a container changed over its
//! image), written and applied with the same code as image layers, so its
//! whiteouts and its hostile-input rules are theirs.

use std::io::Read;
use std::path::Path;

use crate::{ImageError, Limits};

/// Archives the overlay upper directory `upper` into the new file `out` as
/// an uncompressed layer tar (overlay whiteouts become OCI `.wh.` entries,
/// as in an image export). Returns the bytes written.
pub fn archive_diff(upper: &Path, out: &Path) -> Result<u64, ImageError> {
    crate::export::archive_layer(upper, out).map(|(_, size)| size)
}

/// Applies the layer tar `reader` to the existing, empty directory
/// `upper` (a new container's upper directory) with every rule image
/// layers are unpacked by: nothing written outside it, no symlink
/// followed, whiteouts made overlay whiteouts, sizes bounded by `limits`.
pub fn apply_diff(reader: impl Read, upper: &Path, limits: &Limits) -> Result<(), ImageError> {
    crate::unpack::unpack_layer(reader, upper, limits).map(drop)
}
