//! Entry names and their resolution inside the layer root.
//!
//! Names are cleaned lexically into components; directories are then
//! opened from the root's fd with `openat2` flags that refuse any symlink,
//! `..`, magic link or mount crossing on the way, so a resolution can only
//! end at a real directory below the root.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::Unpacker;
use crate::ImageError;

/// A cleaned entry name: no empty, `.` or `..` components.
pub(super) type Comps = Vec<Vec<u8>>;

/// Cleans an entry name into components (see the module docs of
/// `unpack`): a leading `/` is ignored and `..` may not climb above the
/// root.
pub(super) fn clean_path(raw: &[u8]) -> Result<Comps, String> {
    let mut out: Comps = Vec::new();
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

pub(super) fn join(comps: &[Vec<u8>]) -> OsString {
    OsString::from_vec(comps.join(&b'/'))
}

pub(super) fn os(c: &[u8]) -> &OsStr {
    OsStr::from_bytes(c)
}

pub(super) fn display(comps: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&comps.join(&b'/')).into_owned()
}

pub(super) fn unsafe_entry(path: &str, reason: impl Into<String>) -> ImageError {
    ImageError::UnsafeEntry {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// The flags of every resolution below the root: nothing but real
/// directories below it may be traversed. `..` never reaches the kernel
/// (names are cleaned first), but BENEATH refuses it anyway.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

impl Unpacker {
    /// The host path of an entry, for error messages only.
    pub(super) fn path_of(&self, comps: &[Vec<u8>]) -> PathBuf {
        self.target.join(join(comps))
    }

    /// Opens a directory by its components below the root (O_PATH).
    /// `ELOOP` means a component is a symlink, `ENOTDIR` that one is not a
    /// directory.
    pub(super) fn open_in_root(&self, comps: &[Vec<u8>]) -> rustix::io::Result<OwnedFd> {
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
                // No O_NOFOLLOW: with it the kernel would hand out the
                // final symlink itself (then ENOTDIR); without it,
                // NO_SYMLINKS makes every symlink ELOOP.
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            ) {
                // The kernel asks for a retry when a rename raced the lookup.
                Err(Errno::AGAIN) if tries < 16 => tries += 1,
                r => return r,
            }
        }
    }

    /// Why a directory on the way to an entry cannot be used, as the
    /// entry's error.
    pub(super) fn unusable_dir(
        &self,
        name: &str,
        what: &str,
        comps: &[Vec<u8>],
        e: Errno,
    ) -> ImageError {
        match e {
            Errno::LOOP => unsafe_entry(
                name,
                format!("{what} {:?} is or passes a symlink", display(comps)),
            ),
            Errno::NOTDIR => unsafe_entry(
                name,
                format!("{what} {:?} is not a directory", display(comps)),
            ),
            Errno::NOENT => unsafe_entry(
                name,
                format!("{what} {:?} is not in the layer", display(comps)),
            ),
            Errno::XDEV => unsafe_entry(
                name,
                format!("{what} {:?} crosses a mount point", display(comps)),
            ),
            e => ImageError::io("resolve directory", self.path_of(comps), e),
        }
    }

    /// Resolves the parent directory of an entry, creating missing
    /// directories (mode 0755, root-owned) as `mkdir -p` would.
    pub(super) fn parent_dir(
        &mut self,
        parents: &[Vec<u8>],
        name: &str,
    ) -> Result<OwnedFd, ImageError> {
        match self.open_in_root(parents) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(self.unusable_dir(name, "parent", parents, e)),
        }
        // Walk from the root, one component at a time, creating what is
        // missing; each step is resolved by the same rules.
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
                        // NOENT above and EEXIST here: something raced us
                        // in a tree that must be private.
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
                Err(e) => return Err(self.unusable_dir(name, "parent", prefix, e)),
            }
        }
        Ok(fd)
    }

    /// Opens `name` in `dir` as a readable directory fd, never following a
    /// symlink.
    pub(super) fn reopen(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        comps: &[Vec<u8>],
    ) -> Result<OwnedFd, ImageError> {
        rfs::openat(
            dir,
            os(name),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ImageError::io("open directory", self.path_of(comps), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comps(v: &[&str]) -> Comps {
        v.iter().map(|c| c.as_bytes().to_vec()).collect()
    }

    #[test]
    fn clean_path_should_drop_dots_and_leading_slashes_and_refuse_climbing() {
        assert_eq!(clean_path(b"./a//b/").ok(), Some(comps(&["a", "b"])));
        assert_eq!(
            clean_path(b"/etc/passwd").ok(),
            Some(comps(&["etc", "passwd"]))
        );
        assert_eq!(clean_path(b"a/../b").ok(), Some(comps(&["b"])));
        assert_eq!(clean_path(b"a/..").ok(), Some(comps(&[])));
        assert_eq!(clean_path(b"/").ok(), Some(comps(&[])));
        for bad in [&b".."[..], b"../x", b"a/../../x", b"/../x", b"./.."] {
            assert!(
                clean_path(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
