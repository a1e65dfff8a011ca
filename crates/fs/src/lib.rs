//! Petrel's filesystem helpers: the directories it creates under its root
//! and state are reachable by their owner (root) only, whatever the
//! umask and whichever part of Petrel (runtime, agent, image store)
//! happens to create a shared parent first.
//!
//! - [`create_private_dir_all`]: `mkdir -p` where every directory this
//!   call creates gets exactly the mode asked for; directories that exist
//!   (`/var/lib`, a hostPath's parents) are left as they are.
//! - [`ensure_private_root`]: the same for a directory Petrel was given as
//!   its own (`--root`, `--state`, the agent's socket directory), whose
//!   mode is also narrowed if it exists with more access for group or
//!   others (left so by an older version, say).

use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, RawMode};
use rustix::io::Errno;

/// Owner only: the mode of every directory Petrel creates.
pub const PRIVATE: u32 = 0o700;

/// Why a directory could not be made private.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A filesystem call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The path exists and is not a directory.
    #[error("{0} exists and is not a directory")]
    NotADirectory(PathBuf),
    /// A directory shared by design (`/`, or sticky like `/tmp`) named as
    /// one of Petrel's own: narrowing its mode would break the host.
    #[error(
        "{0} is a shared directory (the root or sticky like /tmp); give Petrel a directory of its own"
    )]
    Shared(PathBuf),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> DirError + 'a {
    move |e| DirError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// Creates `path` and its missing parents. Each directory created here
/// gets exactly `mode` (chmod after mkdir, so the umask cannot widen or
/// narrow it); existing directories keep theirs. Returns whether `path`
/// itself was created.
///
/// Two creators racing for the same parent both succeed, and the parent
/// has the mode of whichever made it: when both are Petrel, that is
/// private either way.
pub fn create_private_dir_all(path: &Path, mode: u32) -> Result<bool, DirError> {
    if path.as_os_str().is_empty() {
        return Ok(false);
    }
    match rustix::fs::mkdir(path, Mode::from_raw_mode(mode as RawMode)) {
        Ok(()) => {
            rustix::fs::chmod(path, Mode::from_raw_mode(mode as RawMode))
                .map_err(io_err("chmod", path))?;
            Ok(true)
        }
        Err(Errno::EXIST) => {
            if path.is_dir() {
                Ok(false)
            } else {
                Err(DirError::NotADirectory(path.to_path_buf()))
            }
        }
        Err(Errno::NOENT) => {
            let Some(parent) = path.parent() else {
                return Err(io_err("create directory", path)(Errno::NOENT));
            };
            create_private_dir_all(parent, mode)?;
            // The parent exists now; someone may have made `path` too.
            create_private_dir_all(path, mode)
        }
        Err(e) => Err(io_err("create directory", path)(e)),
    }
}

/// What [`ensure_private_root`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootState {
    /// The directory was created with the mode asked for.
    Created,
    /// It existed with no more access than the mode allows.
    Kept,
    /// It existed with more access for group or others; that was taken
    /// away (the old permission bits are given).
    Narrowed(u32),
}

/// Makes `path` one of Petrel's own directories: created with `mode` if
/// missing (parents too, as [`create_private_dir_all`]), otherwise its
/// permission bits are narrowed to at most `mode` (never widened: a root
/// an administrator made 0700 stays 0700 when `mode` is 0750). With
/// `group`, the directory's group is set to it, so that `mode`'s group
/// bits apply to that group (the agent's socket directory).
///
/// `/` and sticky directories (`/tmp`) are refused rather than narrowed.
pub fn ensure_private_root(
    path: &Path,
    mode: u32,
    group: Option<u32>,
) -> Result<RootState, DirError> {
    if path.parent().is_none() {
        return Err(DirError::Shared(path.to_path_buf()));
    }
    let created = create_private_dir_all(path, mode)?;
    // Follow a symlink: a root may well be a link to other storage.
    let st = rustix::fs::stat(path).map_err(io_err("stat", path))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
        return Err(DirError::NotADirectory(path.to_path_buf()));
    }
    let perm = st.st_mode & 0o7777;
    if perm & 0o1000 != 0 {
        return Err(DirError::Shared(path.to_path_buf()));
    }
    if let Some(gid) = group {
        if st.st_gid != gid {
            rustix::fs::chown(path, None, Some(rustix::fs::Gid::from_raw(gid)))
                .map_err(io_err("chgrp", path))?;
        }
    }
    // chown(2) may clear setgid; the mode is (re)applied after it.
    let wanted = perm & !(0o777 & !mode);
    let after = rustix::fs::stat(path)
        .map_err(io_err("stat", path))?
        .st_mode
        & 0o7777;
    if after != wanted {
        rustix::fs::chmod(path, Mode::from_raw_mode(wanted as RawMode))
            .map_err(io_err("chmod", path))?;
    }
    Ok(if created {
        RootState::Created
    } else if wanted != perm {
        tracing::warn!(
            path = %path.display(),
            from = format_args!("{perm:04o}"),
            to = format_args!("{wanted:04o}"),
            "narrowed the mode of a directory of Petrel's own"
        );
        RootState::Narrowed(perm)
    } else {
        RootState::Kept
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn created_directories_should_get_the_mode_whatever_the_umask() {
        let d = tempfile::tempdir().unwrap();
        // The tempdir stands for an existing parent like /var/lib.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let deep = d.path().join("a/b/c");
        assert!(create_private_dir_all(&deep, PRIVATE).unwrap());
        for p in [d.path().join("a"), d.path().join("a/b"), deep.clone()] {
            assert_eq!(mode(&p), 0o700, "{}", p.display());
        }
        // 0750 is kept exactly, although the usual umask 022 would allow
        // it and 027 would not matter: chmod after mkdir.
        let g = d.path().join("g");
        create_private_dir_all(&g, 0o750).unwrap();
        assert_eq!(mode(&g), 0o750);
        // Existing directories are not touched.
        assert_eq!(mode(d.path()), 0o755);
        assert!(!create_private_dir_all(&deep, PRIVATE).unwrap());
    }

    #[test]
    fn an_existing_directory_should_be_left_as_it_is() {
        let d = tempfile::tempdir().unwrap();
        let shared = d.path().join("hostpath");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o775)).unwrap();
        create_private_dir_all(&shared.join("sub"), PRIVATE).unwrap();
        assert_eq!(mode(&shared), 0o775);
        assert_eq!(mode(&shared.join("sub")), 0o700);
        let file = d.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            create_private_dir_all(&file, PRIVATE),
            Err(DirError::NotADirectory(_))
        ));
    }

    #[test]
    fn a_root_should_be_narrowed_never_widened() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        assert_eq!(
            ensure_private_root(&root, PRIVATE, None).unwrap(),
            RootState::Created
        );
        assert_eq!(mode(&root), 0o700);
        // Left 0755 by an older version, or by a non-Petrel mkdir -p.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            ensure_private_root(&root, PRIVATE, None).unwrap(),
            RootState::Narrowed(0o755)
        );
        assert_eq!(mode(&root), 0o700);
        // 0700 stays 0700 when 0750 would be allowed.
        assert_eq!(
            ensure_private_root(&root, 0o750, None).unwrap(),
            RootState::Kept
        );
        assert_eq!(mode(&root), 0o700);
        // setgid on a directory is kept (group inheritance is a choice).
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o2775)).unwrap();
        ensure_private_root(&root, 0o750, None).unwrap();
        assert_eq!(mode(&root), 0o2750);
    }

    #[test]
    fn a_group_should_be_given_to_the_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("sock");
        // A group the test process surely may use: its own.
        let gid = rustix::process::getegid().as_raw();
        ensure_private_root(&root, 0o750, Some(gid)).unwrap();
        let md = std::fs::metadata(&root).unwrap();
        assert_eq!(md.gid(), gid);
        assert_eq!(md.mode() & 0o7777, 0o750);
    }

    #[test]
    fn shared_directories_should_be_refused() {
        assert!(matches!(
            ensure_private_root(Path::new("/"), PRIVATE, None),
            Err(DirError::Shared(_))
        ));
        let d = tempfile::tempdir().unwrap();
        let tmp = d.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(matches!(
            ensure_private_root(&tmp, PRIVATE, None),
            Err(DirError::Shared(_))
        ));
        assert_eq!(mode(&tmp), 0o1777);
    }
}
