//! Creating an entry's final component relative to its resolved parent,
//! never following it, and setting its metadata.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

use rustix::fs::{self as rfs, AtFlags, Dev, FileType, Mode, OFlags, Timestamps, XattrFlags};
use rustix::io::Errno;

use super::meta::Meta;
use super::path::{clean_path, os, unsafe_entry};
use super::Unpacker;
use crate::ImageError;

impl Unpacker {
    /// Adds a new inode's allocation to the totals.
    pub(super) fn count(&mut self, fd: &impl AsFd, comps: &[Vec<u8>]) -> Result<(), ImageError> {
        let st = rfs::fstat(fd).map_err(|e| ImageError::io("stat", self.path_of(comps), e))?;
        self.stats.inodes += 1;
        self.stats.bytes += u64::try_from(st.st_blocks).unwrap_or(0) * 512;
        Ok(())
    }

    pub(super) fn count_at(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
    ) -> Result<(), ImageError> {
        let st = rfs::statat(parent, os(name), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| ImageError::io("stat", self.path_of(comps), e))?;
        self.stats.inodes += 1;
        self.stats.bytes += u64::try_from(st.st_blocks).unwrap_or(0) * 512;
        Ok(())
    }

    /// Removes whatever is at `name` in `parent` (a directory recursively,
    /// never following a symlink).
    pub(super) fn remove_existing(
        &self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
    ) -> Result<(), ImageError> {
        // Callers pass one cleaned component; a `..` here would remove the
        // parent's parent, so check again where it would do harm.
        if !is_single_component(name) {
            return Err(ImageError::io("remove", self.path_of(comps), Errno::INVAL));
        }
        match rfs::statat(parent, os(name), AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(ImageError::io("stat", self.path_of(comps), e)),
            Ok(st) => {
                let res = if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    remove_tree_at(parent, os(name))
                } else {
                    rfs::unlinkat(parent, os(name), AtFlags::empty()).map_err(io::Error::from)
                };
                res.map_err(|e| ImageError::io("remove", self.path_of(comps), e))
            }
        }
    }

    pub(super) fn make_node(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        file_type: FileType,
        dev: Dev,
    ) -> Result<(), ImageError> {
        self.remove_existing(parent, name, comps)?;
        rfs::mknodat(parent, os(name), file_type, Mode::empty(), dev)
            .map_err(|e| ImageError::io("create device node", self.path_of(comps), e))
    }

    pub(super) fn make_symlink(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        target: &[u8],
        meta: &Meta,
    ) -> Result<(), ImageError> {
        self.remove_existing(parent, name, comps)?;
        rfs::symlinkat(os(target), parent, os(name))
            .map_err(|e| ImageError::io("create symlink", self.path_of(comps), e))?;
        self.finish_by_name(parent, name, comps, meta, true)
    }

    pub(super) fn make_dir(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        meta: Meta,
    ) -> Result<(), ImageError> {
        // A directory entry for an existing directory updates its metadata
        // and keeps its content (tar writers may repeat directories).
        let exists = match rfs::statat(parent, os(name), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => true,
            Ok(_) => {
                rfs::unlinkat(parent, os(name), AtFlags::empty())
                    .map_err(|e| ImageError::io("remove", self.path_of(comps), e))?;
                false
            }
            Err(Errno::NOENT) => false,
            Err(e) => return Err(ImageError::io("stat", self.path_of(comps), e)),
        };
        if !exists {
            // 0700 until the entry's own mode is applied through the fd.
            rfs::mkdirat(parent, os(name), Mode::from_raw_mode(0o700))
                .map_err(|e| ImageError::io("create directory", self.path_of(comps), e))?;
        }
        let fd = self.reopen(parent, name, comps)?;
        if !exists {
            self.count(&fd, comps)?;
        }
        self.apply_fd_meta(&fd, &meta, comps)?;
        self.dir_times.push((comps.to_vec(), meta.mtime));
        Ok(())
    }

    /// A regular file; a GNU sparse one (`sparse`) is written with holes.
    pub(super) fn make_file<R: Read>(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        meta: Meta,
        data: &mut tar::Entry<'_, R>,
        sparse: bool,
    ) -> Result<(), ImageError> {
        self.remove_existing(parent, name, comps)?;
        let fd = rfs::openat(
            parent,
            os(name),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| ImageError::io("create file", self.path_of(comps), e))?;
        let mut file = std::fs::File::from(fd);
        if sparse {
            copy_sparse(data, &mut file)
        } else {
            io::copy(data, &mut file).map(|_| ())
        }
        .map_err(|e| ImageError::io("write file", self.path_of(comps), e))?;
        self.count(&file, comps)?;
        self.apply_fd_meta(&file, &meta, comps)?;
        let times = Timestamps {
            last_access: meta.mtime,
            last_modification: meta.mtime,
        };
        rfs::futimens(&file, &times)
            .map_err(|e| ImageError::io("set file times", self.path_of(comps), e))
    }

    /// A hard link to an earlier entry of this layer. The target's
    /// directory is resolved like any parent (no symlinks); the target
    /// itself is not followed, so a link to a symlink is a second name of
    /// that symlink, and a link to a directory fails.
    pub(super) fn hard_link(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        target: &[u8],
        entry_name: &str,
    ) -> Result<(), ImageError> {
        let tcomps = clean_path(target)
            .map_err(|r| unsafe_entry(entry_name, format!("hard link target: {r}")))?;
        let Some((tlast, tparents)) = tcomps.split_last() else {
            return Err(unsafe_entry(entry_name, "hard link to the layer root"));
        };
        if tcomps == comps {
            // A link to itself: nothing to do.
            return Ok(());
        }
        let tparent = self.open_in_root(tparents).map_err(|e| {
            self.unusable_dir(entry_name, "hard link target's directory", tparents, e)
        })?;
        match rfs::statat(&tparent, os(tlast), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(unsafe_entry(entry_name, "hard link to a directory"));
            }
            Ok(_) => {}
            Err(Errno::NOENT) => {
                return Err(unsafe_entry(
                    entry_name,
                    format!(
                        "hard link target {:?} is not in the layer",
                        String::from_utf8_lossy(target)
                    ),
                ));
            }
            Err(e) => return Err(ImageError::io("stat", self.path_of(&tcomps), e)),
        }
        self.remove_existing(parent, name, comps)?;
        // Flags 0: linkat links a symlink source itself, never its target.
        rfs::linkat(&tparent, os(tlast), parent, os(name), AtFlags::empty()).map_err(|e| {
            unsafe_entry(
                entry_name,
                format!(
                    "hard link to {:?} failed: {e}",
                    String::from_utf8_lossy(target)
                ),
            )
        })
    }

    /// Owner, mode and xattrs through an fd of a file or directory.
    pub(super) fn apply_fd_meta(
        &mut self,
        fd: &impl AsFd,
        meta: &Meta,
        comps: &[Vec<u8>],
    ) -> Result<(), ImageError> {
        // chown first: it clears setuid/setgid bits and file capabilities.
        rfs::fchown(fd, Some(meta.uid), Some(meta.gid))
            .map_err(|e| ImageError::io("chown", self.path_of(comps), e))?;
        rfs::fchmod(fd, Mode::from_raw_mode(meta.mode))
            .map_err(|e| ImageError::io("chmod", self.path_of(comps), e))?;
        for (k, v) in &meta.xattrs {
            let res = rfs::fsetxattr(fd, k.as_str(), v, XattrFlags::empty());
            self.xattr_set(res, k, comps, false)?;
        }
        Ok(())
    }

    /// The outcome of setting one xattr. Attributes the filesystem has no
    /// namespace for (`com.apple.*` from tars made on macOS, `user.*` on a
    /// filesystem without user xattrs) and `user.*` on a symlink (never
    /// allowed by Linux) are dropped with a warning, as containerd does;
    /// anything else fails the layer.
    fn xattr_set(
        &mut self,
        res: rustix::io::Result<()>,
        key: &str,
        comps: &[Vec<u8>],
        symlink: bool,
    ) -> Result<(), ImageError> {
        match res {
            Ok(()) => Ok(()),
            Err(Errno::OPNOTSUPP) => {
                self.dropped_xattrs += 1;
                Ok(())
            }
            Err(Errno::PERM) if symlink && key.starts_with("user.") => {
                self.dropped_xattrs += 1;
                Ok(())
            }
            Err(e) => Err(ImageError::io("set xattr", self.path_of(comps), e)),
        }
    }

    /// Owner, mode (unless `symlink`), xattrs and times of a symlink or
    /// node by name, never following the final component.
    pub(super) fn finish_by_name(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        meta: &Meta,
        symlink: bool,
    ) -> Result<(), ImageError> {
        rfs::chownat(
            parent,
            os(name),
            Some(meta.uid),
            Some(meta.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| ImageError::io("chown", self.path_of(comps), e))?;
        if !symlink {
            // The node was just created by us in a private tree, so the
            // name still refers to it (chmodat cannot refuse symlinks on
            // every kernel).
            rfs::chmodat(
                parent,
                os(name),
                Mode::from_raw_mode(meta.mode),
                AtFlags::empty(),
            )
            .map_err(|e| ImageError::io("chmod", self.path_of(comps), e))?;
        }
        if !meta.xattrs.is_empty() {
            // lsetxattr on /proc/self/fd/<parent>/<name>: the parent is our
            // resolved fd and the final component is not followed.
            let mut p = OsString::from(format!("/proc/self/fd/{}/", parent.as_raw_fd()));
            p.push(os(name));
            for (k, v) in &meta.xattrs {
                let res = rfs::lsetxattr(&p, k.as_str(), v, XattrFlags::empty());
                self.xattr_set(res, k, comps, symlink)?;
            }
        }
        let times = Timestamps {
            last_access: meta.mtime,
            last_modification: meta.mtime,
        };
        rfs::utimensat(parent, os(name), &times, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| ImageError::io("set times", self.path_of(comps), e))?;
        self.count_at(parent, name, comps)
    }
}

/// Granularity of holes in sparse files: a filesystem block.
const HOLE_BLOCK: usize = 4096;
/// Bytes of a sparse file looked at per read.
const SPARSE_CHUNK: usize = 1 << 20;
static ZERO_BLOCK: [u8; HOLE_BLOCK] = [0; HOLE_BLOCK];

/// Copies a sparse file's data into the new, empty `file`, leaving a hole
/// for every block of zeros (the tar crate hands a sparse entry's holes
/// out as zeros) and giving the file its full size at the end. The zeros
/// are compared a block at a time with `memcmp`, never written.
pub(super) fn copy_sparse(data: &mut impl Read, file: &mut std::fs::File) -> io::Result<()> {
    let mut buf = vec![0u8; SPARSE_CHUNK];
    // Logical offset of buf[0]; where the file's offset is.
    let mut pos: u64 = 0;
    let mut file_pos: u64 = 0;
    loop {
        let n = read_full(data, &mut buf)?;
        if n == 0 {
            break;
        }
        let mut blocks = buf[..n].chunks(HOLE_BLOCK).peekable();
        let mut off = pos;
        while let Some(b) = blocks.next() {
            if b == &ZERO_BLOCK[..b.len()] {
                off += b.len() as u64;
                continue;
            }
            // A run of data blocks, written at once.
            let start = off;
            let run_start = usize::try_from(start - pos).unwrap_or(0);
            let mut run_end = run_start + b.len();
            while let Some(next) = blocks.peek() {
                if *next == &ZERO_BLOCK[..next.len()] {
                    break;
                }
                run_end += next.len();
                blocks.next();
            }
            if start != file_pos {
                file.seek(SeekFrom::Start(start))?;
            }
            file.write_all(&buf[run_start..run_end])?;
            off = start + (run_end - run_start) as u64;
            file_pos = off;
        }
        pos += n as u64;
    }
    if file_pos != pos {
        // Trailing hole: the file's size is its logical size.
        file.set_len(pos)?;
    }
    Ok(())
}

/// Reads until `buf` is full or the stream ends; the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Whether `name` names an entry of its directory: not empty, `.`, `..`,
/// and without a `/`.
fn is_single_component(name: &[u8]) -> bool {
    !(name.is_empty() || name == b"." || name == b".." || name.contains(&b'/'))
}

/// Removes the directory `name` in `parent` and everything below it,
/// without following symlinks.
pub(crate) fn remove_tree_at(parent: &impl AsFd, name: &OsStr) -> io::Result<()> {
    let dir = rfs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut children = Vec::new();
    {
        let mut it = rfs::Dir::read_from(&dir)?;
        while let Some(e) = it.read() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n == b"." || n == b".." {
                continue;
            }
            children.push((OsString::from_vec(n.to_vec()), e.file_type()));
        }
    }
    for (child, ft) in children {
        let is_dir = match ft {
            FileType::Directory => true,
            FileType::Unknown => {
                FileType::from_raw_mode(
                    rfs::statat(&dir, &child, AtFlags::SYMLINK_NOFOLLOW)?.st_mode,
                ) == FileType::Directory
            }
            _ => false,
        };
        if is_dir {
            remove_tree_at(&dir, &child)?;
        } else {
            rfs::unlinkat(&dir, &child, AtFlags::empty())?;
        }
    }
    rfs::unlinkat(parent, name, AtFlags::REMOVEDIR)?;
    Ok(())
}
