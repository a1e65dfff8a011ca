//! Unpacks a layer tar stream into a directory in overlayfs lower-layer
//! format, without ever writing outside that directory.
//!
//! The layer is untrusted input. Invariants:
//! - **Names are cleaned lexically** (`path.rs`): empty and `.` components
//!   are dropped, a leading `/` is ignored (absolute names are taken
//!   relative to the layer root, as docker and containerd do), and `..`
//!   removes the previous component. A `..` that would climb above the root
//!   is refused with [`ImageError::UnsafeEntry`]. Hard link targets follow
//!   the same rules; symlink targets are stored verbatim and never
//!   interpreted.
//! - **No symlink is ever followed while writing.** Every directory on the
//!   way to an entry (and to a hard link's target) is resolved from the
//!   layer root's fd with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`, so an entry below a symlink
//!   (`a/b` after `a -> /etc`, `a -> ../..` or `a -> sub`, including a
//!   directory replaced by a symlink earlier in the layer) is refused,
//!   whatever the link points at. A symlink is only ever a value. Layer
//!   writers walk a real filesystem and never put an entry below a symlink
//!   of the same layer, so only crafted layers are refused.
//! - **The final component is never followed** (`create.rs`): it is created
//!   relative to its parent's fd with `O_CREAT | O_EXCL | O_NOFOLLOW`,
//!   `mkdirat`, `symlinkat`, `linkat` without `AT_SYMLINK_FOLLOW` (a hard
//!   link to a symlink links the symlink itself) or `mknodat`, after
//!   removing whatever non-directory was there; an existing directory
//!   replaced by a non-directory is removed recursively without following
//!   symlinks. Existing files are never opened for writing, so a hard link
//!   in the layer cannot redirect data into another file.
//! - **Whiteouts become overlay whiteouts** (`whiteout.rs`): `.wh.<name>` a
//!   0:0 character device `<name>`, `.wh..wh..opq` the xattr
//!   `trusted.overlay.opaque=y` on its directory; a whiteout of `.`, `..` or
//!   of nothing is refused. Overlay xattrs carried in the layer itself
//!   (`trusted.overlay.*`, `user.overlay.*`) are dropped so a layer cannot
//!   forge overlay metadata.
//! - **Hostile sizes cost nothing.** The entries' sizes (a sparse file's
//!   full size) are added up as each header is read, and the entry that
//!   takes the layer past [`Limits::max_layer_bytes`] is refused with
//!   [`ImageError::TooLarge`] before it is written. A GNU sparse file is
//!   written sparse: its holes (and any run of zeros) become holes of the
//!   file (`lseek` past them, `ftruncate` to its size), so a layer
//!   claiming a 10 GiB file of holes takes the disk space of its data.
//!   Tar extension records (long names, PAX headers) over
//!   [`MAX_TAR_EXTENSION_BYTES`](crate::limits::MAX_TAR_EXTENSION_BYTES)
//!   are refused unread (`tar_guard.rs`).
//! - **A failed unpack is the caller's to remove.** [`unpack_layer`] stops
//!   at the first error and leaves what it made; the store unpacks into a
//!   fresh directory under its private `tmp/` and renames it into `layers/`
//!   only after success and diff id verification, removing it otherwise.
//!
//! The target directory must be private to the unpacker while it runs:
//! chmod of device nodes and the deferred directory times are applied by
//! name, relying on nobody else changing the tree. Unpacking needs root
//! (chown, mknod, trusted.* xattrs).

mod compression;
mod create;
mod meta;
mod path;
mod whiteout;

#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use tar::EntryType;

use crate::limits::{Limits, MAX_TAR_EXTENSION_BYTES};
use crate::tar_guard::TarGuard;
use crate::ImageError;

pub(crate) use compression::decompress;
use path::{clean_path, os, unsafe_entry, Comps};

/// Disk usage of an unpacked layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct UnpackStats {
    /// Bytes allocated to the created inodes (`st_blocks * 512`).
    pub bytes: u64,
    /// Inodes created (hard links do not count).
    pub inodes: u64,
}

/// Unpacks the uncompressed layer tar `reader` into the existing, empty
/// directory `target`, within `limits`. The reader is read up to the tar
/// end marker only.
pub(crate) fn unpack_layer(
    reader: impl Read,
    target: &Path,
    limits: &Limits,
) -> Result<UnpackStats, ImageError> {
    let root = rfs::open(
        target,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ImageError::io("open layer directory", target, e))?;
    let mut u = Unpacker {
        root,
        target: target.to_path_buf(),
        stats: UnpackStats::default(),
        dir_times: Vec::new(),
        dropped_xattrs: 0,
        skipped_entries: 0,
        claimed: 0,
        max_bytes: limits.max_layer_bytes,
    };
    let refused = Cell::new(None);
    let mut archive = tar::Archive::new(TarGuard::new(reader, &refused));
    let read_err = |op, e| match refused.get() {
        Some(r) => ImageError::TooLarge {
            what: format!("layer {}: {}", target.display(), r.describe()),
            limit: MAX_TAR_EXTENSION_BYTES,
        },
        None => ImageError::io(op, target, e),
    };
    let entries = archive.entries().map_err(|e| read_err("read layer", e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| read_err("read layer entry", e))?;
        u.entry(&mut entry)?;
    }
    u.finish()
}

struct Unpacker {
    /// O_PATH fd of the layer root; every resolution starts here.
    root: OwnedFd,
    target: PathBuf,
    stats: UnpackStats,
    /// Directory mtimes, applied at the end because creating children
    /// changes them.
    dir_times: Vec<(Comps, Timespec)>,
    /// Overlay xattrs carried by the layer and xattrs the filesystem
    /// cannot hold, dropped with one warning per layer.
    dropped_xattrs: u64,
    skipped_entries: u64,
    /// Sum of the sizes of the entries so far (sparse files at full size).
    claimed: u64,
    /// Bound on `claimed`; 0 for none.
    max_bytes: u64,
}

impl Unpacker {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) {
            return Ok(());
        }
        // Old (v7) archives mark directories only by a trailing slash.
        let kind = if kind == EntryType::Regular && raw.ends_with(b"/") {
            EntryType::Directory
        } else {
            kind
        };
        if !matches!(
            kind,
            EntryType::Directory
                | EntryType::Regular
                | EntryType::Continuous
                | EntryType::GNUSparse
                | EntryType::Symlink
                | EntryType::Link
                | EntryType::Char
                | EntryType::Block
                | EntryType::Fifo
        ) {
            // Volume labels, multi-volume continuations and the like.
            self.skipped_entries += 1;
            return Ok(());
        }
        let comps = clean_path(&raw).map_err(|r| unsafe_entry(&name, r))?;
        if matches!(
            kind,
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse
        ) {
            // From the header, before any data is read or written.
            self.claimed = self.claimed.saturating_add(entry.size());
            if self.max_bytes > 0 && self.claimed > self.max_bytes {
                return Err(ImageError::TooLarge {
                    what: format!(
                        "layer entry {name:?} of {} bytes makes the layer {} bytes unpacked",
                        entry.size(),
                        self.claimed
                    ),
                    limit: self.max_bytes,
                });
            }
        }
        let meta = self.meta(entry, &name)?;
        let Some((last, parents)) = comps.split_last() else {
            // The layer root itself ("./").
            if kind != EntryType::Directory {
                return Err(unsafe_entry(
                    &name,
                    "a non-directory cannot replace the layer root",
                ));
            }
            let fd = self.reopen(&self.root, b".", &comps)?;
            self.apply_fd_meta(&fd, &meta, &comps)?;
            self.dir_times.push((comps, meta.mtime));
            return Ok(());
        };
        if last.starts_with(whiteout::PREFIX) {
            return self.whiteout(&name, parents, last);
        }
        let parent = self.parent_dir(parents, &name)?;
        match kind {
            EntryType::Directory => self.make_dir(&parent, last, &comps, meta),
            EntryType::Regular | EntryType::Continuous => {
                self.make_file(&parent, last, &comps, meta, entry, false)
            }
            EntryType::GNUSparse => self.make_file(&parent, last, &comps, meta, entry, true),
            EntryType::Symlink => {
                let Some(target) = entry.link_name_bytes() else {
                    return Err(unsafe_entry(&name, "symlink without a target"));
                };
                let target = target.into_owned();
                self.make_symlink(&parent, last, &comps, &target, &meta)
            }
            EntryType::Link => {
                let Some(target) = entry.link_name_bytes() else {
                    return Err(unsafe_entry(&name, "hard link without a target"));
                };
                let target = target.into_owned();
                self.hard_link(&parent, last, &comps, &target, &name)
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let (file_type, dev) = match kind {
                    EntryType::Fifo => (FileType::Fifo, 0),
                    k => {
                        let h = entry.header();
                        let bad = || unsafe_entry(&name, "invalid device number in header");
                        let major = h.device_major().map_err(|_| bad())?.unwrap_or(0);
                        let minor = h.device_minor().map_err(|_| bad())?.unwrap_or(0);
                        let t = if k == EntryType::Char {
                            FileType::CharacterDevice
                        } else {
                            FileType::BlockDevice
                        };
                        (t, rfs::makedev(major, minor))
                    }
                };
                self.make_node(&parent, last, &comps, file_type, dev)?;
                self.finish_by_name(&parent, last, &comps, &meta, false)
            }
            _ => Ok(()),
        }
    }

    /// Applies the deferred directory times and reports the totals.
    fn finish(self) -> Result<UnpackStats, ImageError> {
        for (comps, mtime) in &self.dir_times {
            let times = Timestamps {
                last_access: *mtime,
                last_modification: *mtime,
            };
            let res = match comps.split_last() {
                None => rfs::utimensat(&self.root, ".", &times, AtFlags::empty()),
                Some((last, parents)) => self.open_in_root(parents).and_then(|parent| {
                    let st = rfs::statat(&parent, os(last), AtFlags::SYMLINK_NOFOLLOW)?;
                    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                        return Err(Errno::NOTDIR);
                    }
                    rfs::utimensat(&parent, os(last), &times, AtFlags::SYMLINK_NOFOLLOW)
                }),
            };
            // A directory replaced later in the same layer is simply gone,
            // or something else now, which got its own times when made.
            match res {
                Ok(()) | Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {}
                Err(e) => {
                    return Err(ImageError::io(
                        "set directory times",
                        self.path_of(comps),
                        e,
                    ))
                }
            }
        }
        if self.dropped_xattrs > 0 || self.skipped_entries > 0 {
            tracing::warn!(
                layer = %self.target.display(),
                dropped_xattrs = self.dropped_xattrs,
                skipped_entries = self.skipped_entries,
                "layer entries ignored while unpacking"
            );
        }
        Ok(self.stats)
    }
}
