//! OCI whiteouts turned into overlayfs whiteouts.
//!
//! `.wh.<name>` hides `<name>` of the lower layers: overlayfs wants a 0:0
//! character device named `<name>`. `.wh..wh..opq` hides everything of the
//! lower layers in its directory: overlayfs wants the directory to carry
//! `trusted.overlay.opaque=y`. The whiteout's directory is resolved like
//! any parent, so a whiteout can never name anything outside the layer.

use rustix::fs::{self as rfs, FileType, XattrFlags};

use super::path::unsafe_entry;
use super::Unpacker;
use crate::ImageError;

/// The prefix of every whiteout name.
pub(super) const PREFIX: &[u8] = b".wh.";
/// Marks its directory opaque.
pub(super) const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
/// The overlayfs xattr of an opaque directory.
pub(super) const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// aufs' own bookkeeping names (`.wh..wh.plnk`, `.wh..wh.aufs`).
const AUFS_META_PREFIX: &[u8] = b".wh..wh.";

impl Unpacker {
    /// Applies the whiteout `last` in the directory `parents`.
    pub(super) fn whiteout(
        &mut self,
        name: &str,
        parents: &[Vec<u8>],
        last: &[u8],
    ) -> Result<(), ImageError> {
        if last == OPAQUE_MARKER {
            let parent = self.parent_dir(parents, name)?;
            let dir = self.reopen(&parent, b".", parents)?;
            rfs::fsetxattr(&dir, OPAQUE_XATTR, b"y", XattrFlags::empty())
                .map_err(|e| ImageError::io("set opaque xattr", self.path_of(parents), e))?;
            return Ok(());
        }
        if last.starts_with(AUFS_META_PREFIX) {
            // Meaningless outside aufs; docker skips them too.
            self.skipped_entries += 1;
            return Ok(());
        }
        let hidden = &last[PREFIX.len()..];
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(unsafe_entry(name, "whiteout without a name"));
        }
        let parent = self.parent_dir(parents, name)?;
        let mut comps = parents.to_vec();
        comps.push(hidden.to_vec());
        self.make_node(
            &parent,
            hidden,
            &comps,
            FileType::CharacterDevice,
            rfs::makedev(0, 0),
        )?;
        self.count_at(&parent, hidden, &comps)
    }
}
