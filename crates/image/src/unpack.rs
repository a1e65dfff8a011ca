//! Unpacks a layer tar stream into a directory in overlayfs lower-layer
//! format, without ever writing outside that directory.
//!
//! Containment rules (the layer is untrusted input):
//! - Entry names are cleaned lexically: empty and `.` components are
//!   dropped, a leading `/` is ignored (absolute names are taken relative to
//!   the layer root, as docker and containerd do), and `..` removes the
//!   previous component. A `..` that would climb above the root is refused
//!   with [`ImageError::UnsafeEntry`]. The same rules apply to hard link
//!   targets. Symlink targets are stored verbatim and never interpreted.
//! - Parent directories are resolved with `openat2(RESOLVE_IN_ROOT |
//!   RESOLVE_NO_MAGICLINKS)` against the layer root, so a symlink in the
//!   layer (`evil -> /etc`) is followed as if the layer root were `/`:
//!   `evil/passwd` lands in `<layer>/etc/passwd`, never in the host's /etc.
//! - The final component is created relative to its parent's fd with
//!   `O_CREAT | O_EXCL | O_NOFOLLOW`, `mkdirat`, `symlinkat`, `linkat` (which
//!   does not follow a symlink source) or `mknodat`, after removing whatever
//!   non-directory was there; an existing directory replaced by a
//!   non-directory is removed recursively without following symlinks.
//!   Existing files are never opened for writing, so a hard link in the
//!   layer cannot redirect data into another file.
//! - Whiteouts become overlay whiteouts: `.wh.<name>` a 0:0 character
//!   device `<name>`, `.wh..wh..opq` the xattr `trusted.overlay.opaque=y` on
//!   its directory. Overlay xattrs carried in the layer itself
//!   (`trusted.overlay.*`, `user.overlay.*`) are dropped so a layer cannot
//!   forge overlay metadata.
//!
//! The target directory must be private to the unpacker while it runs
//! (callers unpack into a fresh 0700 temp directory): chmod of device nodes
//! and the deferred directory times are applied by name, relying on nobody
//! else changing the tree. Unpacking needs root (chown, mknod, trusted.*
//! xattrs).

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use rustix::fs::{
    self as rfs, AtFlags, Dev, FileType, Gid, Mode, OFlags, ResolveFlags, Timespec, Timestamps,
    Uid, XattrFlags,
};
use rustix::io::Errno;
use tar::EntryType;

use crate::ImageError;

/// Disk usage of an unpacked layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct UnpackStats {
    /// Bytes allocated to the created inodes (`st_blocks * 512`).
    pub bytes: u64,
    /// Inodes created (hard links do not count).
    pub inodes: u64,
}

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
const PAX_XATTR_PREFIX: &str = "SCHILY.xattr.";

/// Unpacks the uncompressed layer tar `reader` into the existing, empty
/// directory `target`. The reader is read up to the tar end marker only.
pub(crate) fn unpack_layer(reader: impl Read, target: &Path) -> Result<UnpackStats, ImageError> {
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
    };
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| ImageError::io("read layer", target, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| ImageError::io("read layer entry", target, e))?;
        u.entry(&mut entry)?;
    }
    u.finish()
}

/// Metadata of one entry, with PAX records applied.
struct Meta {
    uid: Uid,
    gid: Gid,
    mode: u32,
    mtime: Timespec,
    xattrs: Vec<(String, Vec<u8>)>,
}

struct Unpacker {
    /// O_PATH fd of the layer root; every resolution starts here.
    root: OwnedFd,
    target: PathBuf,
    stats: UnpackStats,
    /// Directory mtimes, applied at the end because creating children
    /// changes them.
    dir_times: Vec<(Vec<Vec<u8>>, Timespec)>,
    dropped_xattrs: u64,
    skipped_entries: u64,
}

/// Cleans an entry name into components (see the module docs).
fn clean_path(raw: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err("path climbs out of the layer root".to_string());
                }
            }
            c => out.push(c.to_vec()),
        }
    }
    Ok(out)
}

fn join(comps: &[Vec<u8>]) -> OsString {
    OsString::from_vec(comps.join(&b'/'))
}

fn os(c: &[u8]) -> &OsStr {
    OsStr::from_bytes(c)
}

fn unsafe_entry(path: &str, reason: impl Into<String>) -> ImageError {
    ImageError::UnsafeEntry {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// A numeric header field: its parsed value, or 0 when the field is blank
/// (all NUL or spaces, as some writers leave unused fields).
fn numeric(raw: &[u8], parsed: io::Result<u64>) -> Option<u64> {
    match parsed {
        Ok(v) => Some(v),
        Err(_) if raw.iter().all(|b| *b == 0 || *b == b' ') => Some(0),
        Err(_) => None,
    }
}

/// Parses a PAX `mtime` ("1700000000" or "1700000000.25").
fn parse_pax_time(v: &str) -> Option<Timespec> {
    let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
    let tv_sec: i64 = secs.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    while digits.len() < 9 {
        digits.push('0');
    }
    let tv_nsec: i64 = digits.parse().ok()?;
    Some(Timespec { tv_sec, tv_nsec })
}

impl Unpacker {
    fn path_of(&self, comps: &[Vec<u8>]) -> PathBuf {
        self.target.join(join(comps))
    }

    fn meta<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        name: &str,
    ) -> Result<Meta, ImageError> {
        let h = entry.header();
        let bad = |what: &str| unsafe_entry(name, format!("invalid {what} in header"));
        let old = h.as_old();
        let mut uid = numeric(&old.uid, h.uid()).ok_or_else(|| bad("uid"))?;
        let mut gid = numeric(&old.gid, h.gid()).ok_or_else(|| bad("gid"))?;
        let mode = numeric(&old.mode, h.mode().map(u64::from)).ok_or_else(|| bad("mode"))?;
        let mode = u32::try_from(mode & 0o7777).map_err(|_| bad("mode"))?;
        let secs = numeric(&old.mtime, h.mtime()).ok_or_else(|| bad("mtime"))?;
        let mut mtime = Timespec {
            tv_sec: i64::try_from(secs).map_err(|_| bad("mtime"))?,
            tv_nsec: 0,
        };
        let mut xattrs = Vec::new();
        let pax = entry
            .pax_extensions()
            .map_err(|e| ImageError::io("read pax header", self.target.clone(), e))?;
        if let Some(pax) = pax {
            for ext in pax {
                let ext =
                    ext.map_err(|e| ImageError::io("read pax header", self.target.clone(), e))?;
                let Ok(key) = ext.key() else { continue };
                let value = ext.value_bytes();
                match key {
                    "uid" => {
                        uid = ext
                            .value()
                            .ok()
                            .and_then(|v| v.parse().ok())
                            .ok_or_else(|| bad("pax uid"))?
                    }
                    "gid" => {
                        gid = ext
                            .value()
                            .ok()
                            .and_then(|v| v.parse().ok())
                            .ok_or_else(|| bad("pax gid"))?
                    }
                    "mtime" => {
                        mtime = ext
                            .value()
                            .ok()
                            .and_then(parse_pax_time)
                            .ok_or_else(|| bad("pax mtime"))?
                    }
                    k => {
                        if let Some(attr) = k.strip_prefix(PAX_XATTR_PREFIX) {
                            if attr.starts_with("trusted.overlay.")
                                || attr.starts_with("user.overlay.")
                            {
                                self.dropped_xattrs += 1;
                            } else {
                                xattrs.push((attr.to_string(), value.to_vec()));
                            }
                        }
                    }
                }
            }
        }
        let uid = u32::try_from(uid)
            .ok()
            .filter(|u| *u != u32::MAX)
            .ok_or_else(|| bad("uid"))?;
        let gid = u32::try_from(gid)
            .ok()
            .filter(|g| *g != u32::MAX)
            .ok_or_else(|| bad("gid"))?;
        Ok(Meta {
            uid: Uid::from_raw(uid),
            gid: Gid::from_raw(gid),
            mode,
            mtime,
            xattrs,
        })
    }

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
        if last.starts_with(WHITEOUT_PREFIX) {
            return self.whiteout(&name, parents, last);
        }
        let parent = self.parent_dir(parents, &name)?;
        match kind {
            EntryType::Directory => self.make_dir(&parent, last, &comps, meta),
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.make_file(&parent, last, &comps, meta, entry)
            }
            EntryType::Symlink => {
                let Some(target) = entry.link_name_bytes() else {
                    return Err(unsafe_entry(&name, "symlink without a target"));
                };
                let target = target.into_owned();
                self.remove_existing(&parent, last, &comps)?;
                rfs::symlinkat(os(&target), &parent, os(last))
                    .map_err(|e| ImageError::io("create symlink", self.path_of(&comps), e))?;
                self.finish_by_name(&parent, last, &comps, &meta, false)
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
                        let major = h.device_major().ok().flatten().unwrap_or(0);
                        let minor = h.device_minor().ok().flatten().unwrap_or(0);
                        let t = if k == EntryType::Char {
                            FileType::CharacterDevice
                        } else {
                            FileType::BlockDevice
                        };
                        (t, rfs::makedev(major, minor))
                    }
                };
                self.make_node(&parent, last, &comps, file_type, dev)?;
                self.finish_by_name(&parent, last, &comps, &meta, true)
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
                Some((last, parents)) => match self.open_in_root(parents) {
                    Ok(parent) => {
                        rfs::utimensat(&parent, os(last), &times, AtFlags::SYMLINK_NOFOLLOW)
                    }
                    Err(e) => Err(e),
                },
            };
            // A directory replaced later in the same layer is simply gone.
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
                dropped_overlay_xattrs = self.dropped_xattrs,
                skipped_entries = self.skipped_entries,
                "layer entries ignored while unpacking"
            );
        }
        Ok(self.stats)
    }

    /// Opens a directory by its components, resolved inside the root.
    fn open_in_root(&self, comps: &[Vec<u8>]) -> rustix::io::Result<OwnedFd> {
        let rel = join(comps);
        let rel: &OsStr = if rel.is_empty() {
            OsStr::new(".")
        } else {
            &rel
        };
        let mut tries = 0;
        loop {
            match rfs::openat2(
                &self.root,
                rel,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            ) {
                // The kernel asks for a retry when a rename raced the lookup.
                Err(Errno::AGAIN) if tries < 16 => tries += 1,
                r => return r,
            }
        }
    }

    /// Resolves the parent directory of an entry, creating missing
    /// directories (mode 0755, root-owned) as `mkdir -p` would.
    fn parent_dir(&mut self, parents: &[Vec<u8>], name: &str) -> Result<OwnedFd, ImageError> {
        match self.open_in_root(parents) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(Errno::NOTDIR) => return Err(unsafe_entry(name, "a parent is not a directory")),
            Err(e) => return Err(ImageError::io("resolve parent", self.path_of(parents), e)),
        }
        let mut fd = self
            .open_in_root(&[])
            .map_err(|e| ImageError::io("open layer root", self.target.clone(), e))?;
        for i in 0..parents.len() {
            let prefix = &parents[..=i];
            match self.open_in_root(prefix) {
                Ok(next) => fd = next,
                Err(Errno::NOENT) => {
                    match rfs::mkdirat(&fd, os(&parents[i]), Mode::from_raw_mode(0o700)) {
                        Ok(()) => {}
                        Err(Errno::EXIST) => {
                            return Err(unsafe_entry(name, "a parent is a dangling symlink"));
                        }
                        Err(e) => {
                            return Err(ImageError::io("create directory", self.path_of(prefix), e))
                        }
                    }
                    let dir = self.reopen(&fd, &parents[i], prefix)?;
                    rfs::fchmod(&dir, Mode::from_raw_mode(0o755))
                        .map_err(|e| ImageError::io("chmod", self.path_of(prefix), e))?;
                    self.count(&dir, prefix)?;
                    fd = self
                        .open_in_root(prefix)
                        .map_err(|e| ImageError::io("resolve parent", self.path_of(prefix), e))?;
                }
                Err(Errno::NOTDIR) => {
                    return Err(unsafe_entry(name, "a parent is not a directory"))
                }
                Err(e) => return Err(ImageError::io("resolve parent", self.path_of(prefix), e)),
            }
        }
        Ok(fd)
    }

    /// Opens `name` in `dir` as a readable directory fd, never following a
    /// symlink.
    fn reopen(&self, dir: &OwnedFd, name: &[u8], comps: &[Vec<u8>]) -> Result<OwnedFd, ImageError> {
        rfs::openat(
            dir,
            os(name),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ImageError::io("open directory", self.path_of(comps), e))
    }

    /// Adds a new inode's allocation to the totals.
    fn count(&mut self, fd: &impl AsFd, comps: &[Vec<u8>]) -> Result<(), ImageError> {
        let st = rfs::fstat(fd).map_err(|e| ImageError::io("stat", self.path_of(comps), e))?;
        self.stats.inodes += 1;
        self.stats.bytes += u64::try_from(st.st_blocks).unwrap_or(0) * 512;
        Ok(())
    }

    fn count_at(
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

    /// Removes whatever is at `name` in `parent` (a directory recursively).
    fn remove_existing(
        &self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
    ) -> Result<(), ImageError> {
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

    fn whiteout(&mut self, name: &str, parents: &[Vec<u8>], last: &[u8]) -> Result<(), ImageError> {
        let parent = self.parent_dir(parents, name)?;
        if last == OPAQUE_MARKER {
            let dir = self.reopen(&parent, b".", parents)?;
            rfs::fsetxattr(&dir, OPAQUE_XATTR, b"y", XattrFlags::empty())
                .map_err(|e| ImageError::io("set opaque xattr", self.path_of(parents), e))?;
            return Ok(());
        }
        if last.starts_with(b".wh..wh.") {
            // aufs bookkeeping (.wh..wh.plnk and the like): meaningless here.
            self.skipped_entries += 1;
            return Ok(());
        }
        let hidden = &last[WHITEOUT_PREFIX.len()..];
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(unsafe_entry(name, "whiteout without a name"));
        }
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

    fn make_node(
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

    fn make_dir(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        meta: Meta,
    ) -> Result<(), ImageError> {
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

    fn make_file<R: Read>(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        meta: Meta,
        data: &mut tar::Entry<'_, R>,
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
        io::copy(data, &mut file)
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

    fn hard_link(
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
            unsafe_entry(
                entry_name,
                format!("hard link target directory unusable: {e}"),
            )
        })?;
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
    fn apply_fd_meta(
        &self,
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
            rfs::fsetxattr(fd, k.as_str(), v, XattrFlags::empty())
                .map_err(|e| ImageError::io("set xattr", self.path_of(comps), e))?;
        }
        Ok(())
    }

    /// Owner, mode (unless a symlink), xattrs and times of a symlink or
    /// node by name, never following the final component.
    fn finish_by_name(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
        meta: &Meta,
        chmod: bool,
    ) -> Result<(), ImageError> {
        rfs::chownat(
            parent,
            os(name),
            Some(meta.uid),
            Some(meta.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| ImageError::io("chown", self.path_of(comps), e))?;
        if chmod {
            // The node was just created by us in a private tree, so the
            // name still refers to it (chmodat cannot refuse symlinks).
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
                rfs::lsetxattr(&p, k.as_str(), v, XattrFlags::empty())
                    .map_err(|e| ImageError::io("set xattr", self.path_of(comps), e))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    /// One tar entry for a test archive; names are written raw so hostile
    /// ones (`..`, absolute) can be produced.
    #[derive(Clone, Debug)]
    enum E {
        Dir(String),
        File(String, Vec<u8>),
        Sym(String, String),
        Hard(String, String),
    }

    fn raw_header(kind: EntryType, name: &[u8], link: &[u8], size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_000_000);
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name);
        old.linkname[..link.len()].copy_from_slice(link);
        h.set_cksum();
        h
    }

    struct Tb(tar::Builder<Vec<u8>>);

    impl Tb {
        fn new() -> Self {
            Tb(tar::Builder::new(Vec::new()))
        }
        fn add(
            &mut self,
            kind: EntryType,
            name: &str,
            link: &str,
            data: &[u8],
            mode: u32,
        ) -> &mut Self {
            let h = raw_header(
                kind,
                name.as_bytes(),
                link.as_bytes(),
                data.len() as u64,
                mode,
            );
            self.0.append(&h, data).expect("append to in-memory tar");
            self
        }
        fn dir(&mut self, name: &str) -> &mut Self {
            self.add(EntryType::Directory, name, "", b"", 0o755)
        }
        fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
            self.add(EntryType::Regular, name, "", data, 0o644)
        }
        fn sym(&mut self, name: &str, target: &str) -> &mut Self {
            self.add(EntryType::Symlink, name, target, b"", 0o777)
        }
        fn hard(&mut self, name: &str, target: &str) -> &mut Self {
            self.add(EntryType::Link, name, target, b"", 0o644)
        }
        fn entry(&mut self, e: &E) -> &mut Self {
            match e {
                E::Dir(n) => self.dir(n),
                E::File(n, d) => self.file(n, d),
                E::Sym(n, t) => self.sym(n, t),
                E::Hard(n, t) => self.hard(n, t),
            }
        }
        fn bytes(self) -> Vec<u8> {
            self.0.into_inner().expect("finish in-memory tar")
        }
    }

    /// A sentinel directory with the layer root inside it and a file beside
    /// it that no layer may touch.
    struct Sandbox {
        dir: tempfile::TempDir,
    }

    impl Sandbox {
        fn new() -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            fs_create(&dir.path().join("root"));
            fs_create(&dir.path().join("outside"));
            std::fs::write(dir.path().join("outside/secret"), b"secret").expect("write sentinel");
            Sandbox { dir }
        }
        fn root(&self) -> PathBuf {
            self.dir.path().join("root")
        }
        fn outside(&self) -> PathBuf {
            self.dir.path().join("outside")
        }
        fn unpack(&self, tar: &[u8]) -> Result<UnpackStats, ImageError> {
            unpack_layer(tar, &self.root())
        }
        /// Everything outside the layer root: names, types, sizes, contents.
        fn snapshot_outside(&self) -> BTreeMap<PathBuf, (u32, u64, Vec<u8>)> {
            let mut out = BTreeMap::new();
            walk(self.dir.path(), &self.root(), &mut out);
            out
        }
    }

    fn fs_create(p: &Path) {
        std::fs::create_dir_all(p).expect("create dir");
    }

    fn walk(dir: &Path, skip: &Path, out: &mut BTreeMap<PathBuf, (u32, u64, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).expect("read dir") {
            let p = e.expect("dir entry").path();
            if p == skip {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).expect("lstat");
            let data = if m.is_file() {
                std::fs::read(&p).expect("read")
            } else {
                Vec::new()
            };
            out.insert(p.clone(), (m.mode(), m.nlink(), data));
            if m.is_dir() {
                walk(&p, skip, out);
            }
        }
    }

    fn xattr(p: &Path, name: &str) -> rustix::io::Result<Vec<u8>> {
        let mut buf = [0u8; 256];
        let n = rfs::lgetxattr(p, name, &mut buf)?;
        Ok(buf[..n].to_vec())
    }

    fn is_unsafe(r: &Result<UnpackStats, ImageError>) -> bool {
        matches!(r, Err(ImageError::UnsafeEntry { .. }))
    }

    #[test]
    fn unpack_should_create_every_entry_type_with_its_metadata() {
        let sb = Sandbox::new();
        let mut tb = Tb::new();
        let mut h = raw_header(EntryType::Directory, b"a/", b"", 0, 0o750);
        h.set_uid(1000);
        h.set_gid(1001);
        h.set_mtime(12345);
        h.set_cksum();
        tb.0.append(&h, &b""[..]).expect("append");
        tb.add(EntryType::Regular, "a/suid", "", b"#!/bin/sh\n", 0o4755);
        tb.0.append_pax_extensions([("SCHILY.xattr.user.petrel", &b"yes"[..])])
            .expect("pax");
        tb.file("a/xattr", b"x");
        tb.0.append_pax_extensions([
            ("uid", &b"70000"[..]),
            ("gid", &b"70001"[..]),
            ("mtime", &b"1700000000.5"[..]),
        ])
        .expect("pax");
        tb.file("a/pax", b"p");
        tb.sym("a/abs", "/etc/passwd")
            .sym("a/rel", "../../../x")
            .hard("a/hl", "a/suid");
        let mut c = raw_header(EntryType::Char, b"dev/null", b"", 0, 0o666);
        c.set_device_major(1).expect("major");
        c.set_device_minor(3).expect("minor");
        c.set_cksum();
        tb.0.append(&c, &b""[..]).expect("append");
        let mut b = raw_header(EntryType::Block, b"dev/sda", b"", 0, 0o660);
        b.set_device_major(8).expect("major");
        b.set_device_minor(0).expect("minor");
        b.set_cksum();
        tb.0.append(&b, &b""[..]).expect("append");
        tb.add(EntryType::Fifo, "run/fifo", "", b"", 0o600);
        let stats = sb.unpack(&tb.bytes()).expect("unpack");
        let r = sb.root();

        let a = std::fs::symlink_metadata(r.join("a")).expect("a");
        assert!(a.is_dir());
        assert_eq!(
            (a.uid(), a.gid(), a.mode() & 0o7777, a.mtime()),
            (1000, 1001, 0o750, 12345)
        );
        let s = std::fs::symlink_metadata(r.join("a/suid")).expect("suid");
        assert_eq!(s.mode() & 0o7777, 0o4755);
        assert_eq!(s.mtime(), 1_000_000);
        assert_eq!(
            std::fs::read(r.join("a/suid")).expect("read"),
            b"#!/bin/sh\n"
        );
        let hl = std::fs::symlink_metadata(r.join("a/hl")).expect("hl");
        assert_eq!(hl.ino(), s.ino());
        assert_eq!(s.nlink(), 2);
        let p = std::fs::symlink_metadata(r.join("a/pax")).expect("pax");
        assert_eq!(
            (p.uid(), p.gid(), p.mtime(), p.mtime_nsec()),
            (70000, 70001, 1_700_000_000, 500_000_000)
        );
        let x = xattr(&r.join("a/xattr"), "user.petrel").expect("xattr");
        assert_eq!(x, b"yes");
        assert_eq!(
            std::fs::read_link(r.join("a/abs")).expect("readlink"),
            Path::new("/etc/passwd")
        );
        assert_eq!(
            std::fs::read_link(r.join("a/rel")).expect("readlink"),
            Path::new("../../../x")
        );
        let n = std::fs::symlink_metadata(r.join("dev/null")).expect("null");
        assert!(n.file_type().is_char_device());
        assert_eq!(
            (rfs::major(n.rdev()), rfs::minor(n.rdev()), n.mode() & 0o777),
            (1, 3, 0o666)
        );
        let d = std::fs::symlink_metadata(r.join("dev/sda")).expect("sda");
        assert!(d.file_type().is_block_device());
        assert_eq!((rfs::major(d.rdev()), rfs::minor(d.rdev())), (8, 0));
        let f = std::fs::symlink_metadata(r.join("run/fifo")).expect("fifo");
        assert!(f.file_type().is_fifo());
        assert_eq!(f.mode() & 0o777, 0o600);
        // Implicit parents get 0755.
        assert_eq!(
            std::fs::metadata(r.join("dev")).expect("dev").mode() & 0o7777,
            0o755
        );
        // a, 3 files, 2 symlinks, dev, 2 devices, run, fifo (the hard link adds none).
        assert_eq!(stats.inodes, 11);
        assert!(stats.bytes > 0);
    }

    #[test]
    fn unpack_should_produce_overlay_whiteouts_and_opaque_dirs() {
        let sb = Sandbox::new();
        let mut tb = Tb::new();
        tb.dir("etc/")
            .file("etc/.wh.hosts", b"")
            .dir("var/cache/")
            .file("var/cache/.wh..wh..opq", b"");
        tb.file("var/cache/new", b"n").file("lib/.wh..wh.plnk", b"");
        tb.0.append_pax_extensions([("SCHILY.xattr.trusted.overlay.opaque", &b"y"[..])])
            .expect("pax");
        tb.dir("forged/");
        sb.unpack(&tb.bytes()).expect("unpack");
        let r = sb.root();
        let w = std::fs::symlink_metadata(r.join("etc/hosts")).expect("whiteout");
        assert!(w.file_type().is_char_device());
        assert_eq!(w.rdev(), 0);
        assert!(!r.join("etc/.wh.hosts").exists());
        let opq = xattr(&r.join("var/cache"), OPAQUE_XATTR).expect("opaque xattr");
        assert_eq!(opq, b"y");
        assert!(!r.join("var/cache/.wh..wh..opq").exists());
        assert!(r.join("var/cache/new").exists());
        assert!(!r.join("lib/.wh..wh.plnk").exists());
        // An overlay xattr carried by the layer itself is dropped.
        assert!(xattr(&r.join("forged"), OPAQUE_XATTR).is_err());
    }

    #[test]
    fn unpack_should_replace_entries_without_writing_through_them() {
        let sb = Sandbox::new();
        let mut tb = Tb::new();
        // A hard link to a file, then a new file at the link's name: the
        // original must keep its content.
        tb.file("orig", b"original")
            .hard("link", "orig")
            .file("link", b"replaced");
        // A directory tree replaced by a file, a file replaced by a dir.
        tb.dir("d/")
            .dir("d/sub/")
            .file("d/sub/f", b"f")
            .file("d", b"now a file");
        tb.file("e", b"file").dir("e/").file("e/child", b"c");
        sb.unpack(&tb.bytes()).expect("unpack");
        let r = sb.root();
        assert_eq!(std::fs::read(r.join("orig")).expect("orig"), b"original");
        assert_eq!(std::fs::read(r.join("link")).expect("link"), b"replaced");
        assert_eq!(std::fs::read(r.join("d")).expect("d"), b"now a file");
        assert!(r.join("e").is_dir());
        assert_eq!(std::fs::read(r.join("e/child")).expect("child"), b"c");
    }

    #[test]
    fn unpack_should_refuse_names_climbing_out_of_the_root() {
        for name in ["../x", "a/../../x", "./../x", "../outside/secret"] {
            let sb = Sandbox::new();
            let before = sb.snapshot_outside();
            let mut tb = Tb::new();
            tb.dir("a/").file(name, b"evil");
            let r = sb.unpack(&tb.bytes());
            assert!(is_unsafe(&r), "{name}: {r:?}");
            assert_eq!(sb.snapshot_outside(), before, "{name}");
        }
    }

    #[test]
    fn unpack_should_take_absolute_names_relative_to_the_root() {
        let sb = Sandbox::new();
        let before = sb.snapshot_outside();
        let abs = format!("{}/x", sb.outside().display());
        let mut tb = Tb::new();
        tb.file("/abs/x", b"1")
            .file(&abs, b"2")
            .file("a/../b", b"3");
        sb.unpack(&tb.bytes()).expect("unpack");
        assert_eq!(std::fs::read(sb.root().join("abs/x")).expect("abs"), b"1");
        let inside = sb.root().join(abs.trim_start_matches('/'));
        assert_eq!(std::fs::read(inside).expect("inside"), b"2");
        assert_eq!(std::fs::read(sb.root().join("b")).expect("b"), b"3");
        assert_eq!(sb.snapshot_outside(), before);
    }

    #[test]
    fn unpack_should_contain_writes_through_symlinks_pointing_outside() {
        // Symlinks to the real outside directory, absolute and relative,
        // whose targets exist inside the root too: followed as if the layer
        // root were `/`.
        let sb = Sandbox::new();
        let before = sb.snapshot_outside();
        let out = sb.outside().display().to_string();
        let inside_out = format!("{}/", out.trim_start_matches('/'));
        let mut tb = Tb::new();
        tb.dir(&inside_out).dir("outside/");
        tb.sym("evil", &out)
            .file("evil/secret", b"pwned")
            .file("evil/new", b"pwned");
        tb.sym("up", "../outside").file("up/secret", b"pwned");
        tb.sym("deep", "../../../../../../..")
            .dir("deep/tmp/")
            .file("deep/x", b"contained");
        tb.sym("fsym", &format!("{out}/secret"))
            .file("fsym", b"replaced the link");
        sb.unpack(&tb.bytes()).expect("unpack");
        assert_eq!(sb.snapshot_outside(), before);
        let r = sb.root();
        let inside = r.join(out.trim_start_matches('/'));
        assert_eq!(
            std::fs::read(inside.join("secret")).expect("in root"),
            b"pwned"
        );
        assert_eq!(
            std::fs::read(inside.join("new")).expect("in root"),
            b"pwned"
        );
        assert_eq!(
            std::fs::read(r.join("outside/secret")).expect("in root"),
            b"pwned"
        );
        assert_eq!(std::fs::read(r.join("x")).expect("x"), b"contained");
        assert!(r.join("tmp").is_dir());
        assert!(std::fs::symlink_metadata(r.join("fsym"))
            .expect("fsym")
            .is_file());
    }

    #[test]
    fn unpack_should_refuse_writes_through_symlinks_dangling_inside_the_root() {
        for link in ["abs", "rel", "parent"] {
            let sb = Sandbox::new();
            let before = sb.snapshot_outside();
            let target = match link {
                "abs" => sb.outside().display().to_string(),
                "rel" => "../outside".to_string(),
                _ => "../../outside".to_string(),
            };
            let mut tb = Tb::new();
            tb.sym("evil", &target).file("evil/secret", b"pwned");
            let r = sb.unpack(&tb.bytes());
            assert!(is_unsafe(&r), "{link}: {r:?}");
            assert_eq!(sb.snapshot_outside(), before, "{link}");
        }
    }

    #[test]
    fn unpack_should_refuse_or_contain_hard_links_to_outside() {
        let out = |sb: &Sandbox| sb.outside().display().to_string();
        // Climbing names are refused.
        for target in [
            "../outside/secret",
            "a/../../outside/secret",
            "../../etc/passwd",
        ] {
            let sb = Sandbox::new();
            let before = sb.snapshot_outside();
            let mut tb = Tb::new();
            tb.dir("a/").hard("a/hl", target);
            let r = sb.unpack(&tb.bytes());
            assert!(is_unsafe(&r), "{target}: {r:?}");
            assert_eq!(sb.snapshot_outside(), before);
        }
        // Absolute names and links through symlinks resolve inside the
        // root, where the target does not exist.
        let sb = Sandbox::new();
        let before = sb.snapshot_outside();
        let mut tb = Tb::new();
        tb.hard("hl", &format!("{}/secret", out(&sb)));
        assert!(is_unsafe(&sb.unpack(&tb.bytes())));
        let mut tb = Tb::new();
        tb.sym("evil", &out(&sb)).hard("hl", "evil/secret");
        assert!(is_unsafe(&sb.unpack(&tb.bytes())));
        assert_eq!(sb.snapshot_outside(), before);
        // A hard link to a symlink pointing outside links the symlink.
        let sb = Sandbox::new();
        let before = sb.snapshot_outside();
        let mut tb = Tb::new();
        tb.sym("lnk", &format!("{}/secret", out(&sb)))
            .hard("hl", "lnk")
            .file("hl2", b"x");
        sb.unpack(&tb.bytes()).expect("unpack");
        let hl = std::fs::symlink_metadata(sb.root().join("hl")).expect("hl");
        assert!(hl.file_type().is_symlink());
        assert_eq!(hl.nlink(), 2);
        assert_eq!(sb.snapshot_outside(), before);
    }

    #[test]
    fn unpack_should_contain_a_directory_replaced_by_a_symlink() {
        let sb = Sandbox::new();
        let before = sb.snapshot_outside();
        let out = sb.outside().display().to_string();
        let mut tb = Tb::new();
        tb.dir("d/")
            .file("d/keep", b"k")
            .sym("d", &out)
            .file("d/secret", b"pwned");
        let r = sb.unpack(&tb.bytes());
        // `d` now points at a directory that does not exist in the layer.
        assert!(is_unsafe(&r), "{r:?}");
        assert_eq!(sb.snapshot_outside(), before);
        let d = std::fs::symlink_metadata(sb.root().join("d")).expect("d");
        assert!(d.file_type().is_symlink());
        // Same with the target present inside the root: written there.
        let sb = Sandbox::new();
        let before = sb.snapshot_outside();
        let out = sb.outside().display().to_string();
        let mut tb = Tb::new();
        let inside = out.trim_start_matches('/').to_string() + "/";
        tb.dir(&inside)
            .dir("d/")
            .sym("d", &out)
            .file("d/secret", b"pwned");
        sb.unpack(&tb.bytes()).expect("unpack");
        assert_eq!(sb.snapshot_outside(), before);
        let written = sb.root().join(out.trim_start_matches('/')).join("secret");
        assert_eq!(std::fs::read(written).expect("inside"), b"pwned");
    }

    #[test]
    fn unpack_should_refuse_replacing_the_root_with_a_non_directory() {
        let sb = Sandbox::new();
        let mut tb = Tb::new();
        tb.sym("./", "/");
        assert!(is_unsafe(&sb.unpack(&tb.bytes())));
        assert!(sb.root().is_dir());
    }

    /// xorshift64*: reproducible without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[(self.next() % xs.len() as u64) as usize]
        }
    }

    #[test]
    fn unpack_should_never_write_outside_for_random_hostile_layers() {
        for seed in 1..=300u64 {
            let sb = Sandbox::new();
            let before = sb.snapshot_outside();
            let out = sb.outside().display().to_string();
            let abs_secret = format!("{out}/secret");
            let comps = ["a", "b", "..", ".", "", "evil", "outside", "secret", "x"];
            let link_targets = [
                "/",
                "..",
                "../..",
                "../outside",
                "../../outside/secret",
                "a",
                "evil/x",
                out.as_str(),
                abs_secret.as_str(),
                "/proc/self/root",
            ];
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut entries = Vec::new();
            for _ in 0..(1 + rng.next() % 12) {
                let n = 1 + rng.next() % 4;
                let mut name: String = (0..n)
                    .map(|_| rng.pick(&comps))
                    .collect::<Vec<_>>()
                    .join("/");
                if matches!(rng.next() % 5, 0) {
                    name.insert(0, '/');
                }
                if name.is_empty() {
                    name.push('x');
                }
                let e = match rng.next() % 5 {
                    0 => E::Dir(format!("{name}/")),
                    1 | 2 => E::File(name, b"pwned".to_vec()),
                    3 => E::Sym(name, rng.pick(&link_targets).to_string()),
                    _ => {
                        let t = (0..1 + rng.next() % 3)
                            .map(|_| rng.pick(&comps))
                            .collect::<Vec<_>>()
                            .join("/");
                        E::Hard(name, t)
                    }
                };
                entries.push(e);
            }
            let mut tb = Tb::new();
            for e in &entries {
                tb.entry(e);
            }
            // Errors are fine; escapes are not.
            let _ = sb.unpack(&tb.bytes());
            assert_eq!(sb.snapshot_outside(), before, "seed {seed}: {entries:?}");
        }
    }
}
