//! subPath mounts that cannot leave their volume (the class of
//! CVE-2017-1002101). A container can plant symlinks in a volume it may
//! write; a subPath resolved by path on the host would follow them out.
//! So the subPath is opened beneath the volume's directory by the kernel
//! (`openat2` with `RESOLVE_BENEATH`: no absolute link, no `..` and no
//! magic link may leave it), missing directories are made one component
//! at a time in the directory already opened, and the opened file itself
//! (`/proc/self/fd/N`), not its path, is bind-mounted onto a mount point
//! of the agent's own. The runtime is handed that mount point: there is no
//! second lookup for a swap to win.
//!
//! A bind lives only while the runtime creates and starts the container
//! (its mount namespace keeps its own copy): [`Binds`] unmounts its mount
//! points when dropped, and [`remove_tree`] removes what a killed agent
//! left. Removal never recurses into a mount point: a mount point is
//! unmounted, then removed with `rmdir`/`unlink`, which fail on anything
//! still mounted or not empty.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use rustix::mount::UnmountFlags;

/// The directory under the agent's root that holds the mount points,
/// `<root>/volume-subpaths/<pod uid>/<volume>/<container>/<mount index>`
/// (kubelet's layout, outside the pod's directory so that disk-usage walks
/// and the pod directory's removal never meet a mount).
pub const DIR: &str = "volume-subpaths";

/// Levels below a pod's directory of mount points: volume, container,
/// mount index.
const POD_DEPTH: usize = 3;

/// `openat2` retries when a concurrent rename or mount made the kernel's
/// `..` check inconclusive (EAGAIN).
const EAGAIN_RETRIES: usize = 32;

/// Why a subPath cannot be mounted.
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// A symlink (absolute, or with `..` past the volume's top) leads
    /// outside the volume.
    #[error("subPath {sub:?} leads outside the volume")]
    Escapes {
        /// The subPath.
        sub: String,
    },
    /// A component is a symlink and this kernel cannot resolve one safely
    /// (no `openat2`): symlinks are refused.
    #[error("subPath {sub:?} passes through a symlink")]
    Symlink {
        /// The subPath.
        sub: String,
    },
    /// Too many symlinks, or a magic link (`/proc/.../fd/N`).
    #[error("subPath {sub:?} passes through a magic link or too many symlinks")]
    Loop {
        /// The subPath.
        sub: String,
    },
    /// A component before the last is not a directory.
    #[error("subPath {sub:?} passes through something that is not a directory")]
    NotDirectory {
        /// The subPath.
        sub: String,
    },
    /// A system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation, e.g. "bind-mount".
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// How each component is looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    /// `openat2(base, prefix, RESOLVE_BENEATH)`: symlinks that stay inside
    /// the volume are followed, as kubelet allows.
    Beneath,
    /// `openat(parent, component, O_NOFOLLOW)`: for kernels without
    /// `openat2`; every symlink is refused.
    NoSymlinks,
}

/// Lookups of one component tried again while a container races the
/// creation of a missing one.
const RACE_RETRIES: usize = 8;

/// Why a walk stopped, before it is given the subPath's words.
enum WalkError {
    Escapes,
    Symlink,
    Loop,
    NotDirectory,
    Errno(&'static str, Errno),
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SubPathError {
    let path = path.to_path_buf();
    move |source| SubPathError::Io { op, path, source }
}

/// Opens `rel` beneath the volume directory `base` (an `O_PATH`
/// descriptor), creating missing directories on the way with the mode of
/// `base` (kubelet makes a missing subPath a directory). `rel` must hold
/// only normal components (no `..`, not absolute: checked by the caller);
/// `sub` is the subPath as written, for messages.
pub fn open_beneath(base: &Path, rel: &Path, sub: &str) -> Result<OwnedFd, SubPathError> {
    open_beneath_with(base, rel, sub, None)
}

fn open_beneath_with(
    base: &Path,
    rel: &Path,
    sub: &str,
    forced: Option<Lookup>,
) -> Result<OwnedFd, SubPathError> {
    let base_fd = rustix::fs::open(
        base,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("open volume", base)(e.into()))?;
    let st = rustix::fs::fstat(&base_fd).map_err(|e| io("stat volume", base)(e.into()))?;
    let mode = Mode::from_raw_mode(st.st_mode & 0o777);
    let comps: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    if comps.len() != rel.components().filter(|c| *c != Component::CurDir).count() {
        return Err(SubPathError::Escapes {
            sub: sub.to_string(),
        });
    }
    let lookup = forced.unwrap_or(Lookup::Beneath);
    let walked = match walk(base_fd.as_fd(), &comps, mode, lookup) {
        // A kernel without openat2 (before 5.6, or a seccomp filter that
        // hides it): the strict walk that refuses every symlink.
        Err(WalkError::Errno(_, Errno::NOSYS | Errno::PERM)) if lookup == Lookup::Beneath => {
            walk(base_fd.as_fd(), &comps, mode, Lookup::NoSymlinks)
        }
        other => other,
    };
    walked.map_err(|e| {
        let sub = sub.to_string();
        match e {
            WalkError::Escapes => SubPathError::Escapes { sub },
            WalkError::Symlink => SubPathError::Symlink { sub },
            WalkError::Loop => SubPathError::Loop { sub },
            WalkError::NotDirectory => SubPathError::NotDirectory { sub },
            WalkError::Errno(op, errno) => SubPathError::Io {
                op,
                path: base.join(rel),
                source: errno.into(),
            },
        }
    })
}

/// Walks `comps` from `base`, one component at a time, creating missing
/// ones as directories of `mode`. Returns an `O_PATH` descriptor of the
/// last (or of `base` when `comps` is empty).
fn walk(
    base: BorrowedFd<'_>,
    comps: &[&std::ffi::OsStr],
    mode: Mode,
    lookup: Lookup,
) -> Result<OwnedFd, WalkError> {
    let mut cur = rustix::io::fcntl_dupfd_cloexec(base, 0)
        .map_err(|e| WalkError::Errno("dup volume descriptor", e))?;
    let mut prefix = PathBuf::new();
    for name in comps {
        prefix.push(name);
        let mut tries = 0;
        cur = loop {
            match step(base, cur.as_fd(), &prefix, name, lookup) {
                Ok(fd) => break fd,
                Err(WalkError::Errno(_, Errno::NOENT)) if tries < RACE_RETRIES => {
                    tries += 1;
                    match make_dir(cur.as_fd(), name, mode)? {
                        Some(fd) => break fd,
                        // Something else took the name meanwhile: looked
                        // up again like any entry.
                        None => continue,
                    }
                }
                Err(e) => return Err(e),
            }
        };
    }
    Ok(cur)
}

/// Opens the next component `name` (whose path from `base` is `prefix`)
/// as an `O_PATH` descriptor.
fn step(
    base: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    prefix: &Path,
    name: &std::ffi::OsStr,
    lookup: Lookup,
) -> Result<OwnedFd, WalkError> {
    let flags = OFlags::PATH | OFlags::CLOEXEC;
    match lookup {
        Lookup::Beneath => {
            let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
            for _ in 0..EAGAIN_RETRIES {
                match rustix::fs::openat2(base, prefix, flags, Mode::empty(), how) {
                    Err(Errno::AGAIN) => continue,
                    Err(Errno::XDEV) => return Err(WalkError::Escapes),
                    Err(Errno::LOOP) => return Err(WalkError::Loop),
                    Err(Errno::NOTDIR) => return Err(WalkError::NotDirectory),
                    Err(e) => return Err(WalkError::Errno("open subPath", e)),
                    Ok(fd) => return Ok(fd),
                }
            }
            Err(WalkError::Errno("open subPath", Errno::AGAIN))
        }
        Lookup::NoSymlinks => {
            let fd = match rustix::fs::openat(parent, name, flags | OFlags::NOFOLLOW, Mode::empty())
            {
                Err(Errno::NOTDIR) => return Err(WalkError::NotDirectory),
                Err(e) => return Err(WalkError::Errno("open subPath", e)),
                Ok(fd) => fd,
            };
            // O_PATH|O_NOFOLLOW opens a symlink itself: refuse it.
            let st = rustix::fs::fstat(&fd).map_err(|e| WalkError::Errno("stat subPath", e))?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                return Err(WalkError::Symlink);
            }
            Ok(fd)
        }
    }
}

/// Creates directory `name` in the directory `parent` already opened and
/// opens it without following anything, to give it `mode` (mkdirat's went
/// through the umask). None when the name was taken, or our directory
/// swapped for something else, before it was opened: the caller looks the
/// name up again, and a symlink found then is judged like any other.
fn make_dir(
    parent: BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    mode: Mode,
) -> Result<Option<OwnedFd>, WalkError> {
    match rustix::fs::mkdirat(parent, name, mode) {
        Ok(()) => {}
        Err(Errno::EXIST) => return Ok(None),
        Err(e) => return Err(WalkError::Errno("create subPath directory", e)),
    }
    let fd = match rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => return Ok(None),
        Err(e) => return Err(WalkError::Errno("open created subPath directory", e)),
    };
    rustix::fs::fchmod(&fd, mode).map_err(|e| WalkError::Errno("chmod subPath directory", e))?;
    Ok(Some(fd))
}

/// The subPath binds of one container being created; dropping it unmounts
/// and removes them (the container's mount namespace keeps its copies).
#[derive(Debug, Default)]
pub struct Binds {
    mount_points: Vec<PathBuf>,
}

impl Binds {
    /// No binds yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bind-mounts the file `fd` (from [`open_beneath`]) onto
    /// `mount_point`, made a directory or an empty file to match (mode
    /// 0700/0600; its missing parents 0700). Whatever a previous bind left
    /// there is unmounted first.
    pub fn bind(&mut self, fd: BorrowedFd<'_>, mount_point: &Path) -> Result<(), SubPathError> {
        let st = rustix::fs::fstat(fd).map_err(|e| io("stat subPath", mount_point)(e.into()))?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        release(mount_point).map_err(io("remove stale mount point", mount_point))?;
        if let Some(parent) = mount_point.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(io("create mount point directory", parent))?;
        }
        if is_dir {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(mount_point)
                .map_err(io("create mount point", mount_point))?;
        } else {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(mount_point)
                .map_err(io("create mount point", mount_point))?;
        }
        // The magic link names the open file: nothing a container does to
        // the volume's paths changes what it refers to.
        let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Err(e) = rustix::mount::mount_bind(&source, mount_point) {
            let _ = release(mount_point);
            return Err(io("bind-mount subPath onto", mount_point)(e.into()));
        }
        self.mount_points.push(mount_point.to_path_buf());
        Ok(())
    }

    /// The mount points bound so far.
    pub fn mount_points(&self) -> &[PathBuf] {
        &self.mount_points
    }
}

impl Drop for Binds {
    fn drop(&mut self) {
        for mp in self.mount_points.drain(..) {
            if let Err(e) = release(&mp) {
                tracing::warn!(mount_point = %mp.display(), error = %e, "removing a subPath mount failed");
                continue;
            }
            // Empty container, volume and pod directories go too.
            for dir in mp.ancestors().skip(1).take(POD_DEPTH) {
                if fs::remove_dir(dir).is_err() {
                    break;
                }
            }
        }
    }
}

/// Unmounts every mount stacked on `path`. False when nothing is there.
pub(crate) fn unmount_all(path: &Path) -> std::io::Result<bool> {
    // Bounded: each success removes one mount of the stack.
    for _ in 0..64 {
        match rustix::mount::unmount(path, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            Ok(()) => continue,
            // Not a mount point (any more).
            Err(Errno::INVAL) => return Ok(true),
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Err(std::io::Error::other(format!(
        "{}: still mounted after 64 unmounts",
        path.display()
    )))
}

/// Unmounts whatever is mounted on `mount_point`, then removes it with
/// `rmdir` or `unlink`, never recursively: a mount still there or content
/// makes it fail instead of deleting anything of a volume. Nothing there
/// is fine.
pub fn release(mount_point: &Path) -> std::io::Result<()> {
    if !unmount_all(mount_point)? {
        return Ok(());
    }
    match fs::symlink_metadata(mount_point) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(md) if md.is_dir() => fs::remove_dir(mount_point),
        Ok(_) => fs::remove_file(mount_point),
    }
}

/// Removes the tree of mount points `dir`, whose mount points are `depth`
/// levels below it (3 for a pod's, 4 for all pods'), and its directories,
/// `dir` included. Every entry is unmounted before it is listed or
/// removed, so the walk only ever sees the agent's own directories, never
/// a volume's content; symlinks are not followed. The first error is
/// returned after the rest was tried.
pub fn remove_tree(dir: &Path, depth: usize) -> std::io::Result<()> {
    if depth == 0 {
        return release(dir);
    }
    if !unmount_all(dir)? {
        return Ok(());
    }
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut first = None;
    for entry in entries {
        let res = entry.and_then(|e| {
            if e.file_type()?.is_dir() {
                remove_tree(&e.path(), depth - 1)
            } else {
                // A file mount point, or debris: unmounted, then unlinked.
                release(&e.path())
            }
        });
        if let Err(e) = res {
            first.get_or_insert(e);
        }
    }
    let res = fs::remove_dir(dir);
    match first {
        Some(e) => Err(e),
        None => res,
    }
}

/// The mount points of pod `uid` under the agent's `root`.
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join(DIR).join(uid)
}

/// Removes the mount points of pod `uid`'s directory `dir` (see
/// [`pod_dir`]).
pub fn remove_pod(dir: &Path) -> std::io::Result<()> {
    remove_tree(dir, POD_DEPTH)
}

/// At the agent's start: every mount point is stale (binds live only
/// while a container is created), so all go.
pub fn sweep(root: &Path) {
    let dir = root.join(DIR);
    if let Err(e) = remove_tree(&dir, POD_DEPTH + 1) {
        tracing::warn!(dir = %dir.display(), error = %e, "removing stale subPath mounts failed");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::{symlink, PermissionsExt};

    use super::*;

    /// A volume `vol` and an outside directory `host` with a file in it.
    struct Fixture {
        tmp: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            fs::create_dir(tmp.path().join("vol")).unwrap();
            fs::set_permissions(tmp.path().join("vol"), fs::Permissions::from_mode(0o777)).unwrap();
            fs::create_dir(tmp.path().join("host")).unwrap();
            fs::write(tmp.path().join("host/secret"), b"host").unwrap();
            Self { tmp }
        }
        fn vol(&self) -> PathBuf {
            self.tmp.path().join("vol")
        }
        fn host(&self) -> PathBuf {
            self.tmp.path().join("host")
        }
    }

    /// The path an O_PATH descriptor refers to.
    fn path_of(fd: &OwnedFd) -> PathBuf {
        fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap()
    }

    fn both(f: impl Fn(Option<Lookup>)) {
        f(None);
        f(Some(Lookup::NoSymlinks));
    }

    #[test]
    fn open_beneath_should_open_plain_dirs_and_files() {
        both(|lookup| {
            let fx = Fixture::new();
            fs::create_dir_all(fx.vol().join("a/b")).unwrap();
            fs::write(fx.vol().join("a/f"), b"x").unwrap();
            let fd = open_beneath_with(&fx.vol(), Path::new("a/b"), "a/b", lookup).unwrap();
            assert_eq!(path_of(&fd), fx.vol().join("a/b"));
            let fd = open_beneath_with(&fx.vol(), Path::new("a/f"), "a/f", lookup).unwrap();
            assert_eq!(path_of(&fd), fx.vol().join("a/f"));
            // An empty subPath ("." ) is the volume itself.
            let fd = open_beneath_with(&fx.vol(), Path::new(""), ".", lookup).unwrap();
            assert_eq!(path_of(&fd), fx.vol());
        });
    }

    #[test]
    fn open_beneath_should_refuse_links_leading_out() {
        let fx = Fixture::new();
        // Absolute link, relative link climbing out, link in the middle.
        symlink(fx.host(), fx.vol().join("abs")).unwrap();
        symlink("../host", fx.vol().join("rel")).unwrap();
        symlink("/", fx.vol().join("root")).unwrap();
        fs::create_dir(fx.vol().join("d")).unwrap();
        symlink("../../host", fx.vol().join("d/up")).unwrap();
        for sub in [
            "abs",
            "rel",
            "root",
            "d/up",
            "abs/secret",
            "root/etc",
            "d/up/new",
        ] {
            let err = open_beneath(&fx.vol(), Path::new(sub), sub).unwrap_err();
            assert!(matches!(err, SubPathError::Escapes { .. }), "{sub}: {err}");
            assert!(err.to_string().contains(sub), "{err}");
        }
        // Nothing was created outside.
        assert!(!fx.host().join("new").exists());
        assert!(!Path::new("/etc/new").exists());
    }

    #[test]
    fn open_beneath_should_follow_links_that_stay_inside() {
        let fx = Fixture::new();
        fs::create_dir_all(fx.vol().join("real/inner")).unwrap();
        symlink("real", fx.vol().join("link")).unwrap();
        fs::create_dir(fx.vol().join("d")).unwrap();
        symlink("../real/inner", fx.vol().join("d/back")).unwrap();
        let fd = open_beneath(&fx.vol(), Path::new("link/inner"), "link/inner").unwrap();
        assert_eq!(path_of(&fd), fx.vol().join("real/inner"));
        let fd = open_beneath(&fx.vol(), Path::new("d/back"), "d/back").unwrap();
        assert_eq!(path_of(&fd), fx.vol().join("real/inner"));
        // A missing directory behind an inside link is made inside.
        let fd = open_beneath(&fx.vol(), Path::new("link/new"), "link/new").unwrap();
        assert_eq!(path_of(&fd), fx.vol().join("real/new"));
    }

    #[test]
    fn open_beneath_without_openat2_should_refuse_every_symlink() {
        let fx = Fixture::new();
        fs::create_dir(fx.vol().join("real")).unwrap();
        symlink("real", fx.vol().join("inside")).unwrap();
        symlink(fx.host(), fx.vol().join("out")).unwrap();
        for sub in ["inside", "out", "out/secret", "out/new"] {
            let err = open_beneath_with(&fx.vol(), Path::new(sub), sub, Some(Lookup::NoSymlinks))
                .unwrap_err();
            assert!(matches!(err, SubPathError::Symlink { .. }), "{sub}: {err}");
        }
        assert!(!fx.host().join("new").exists());
    }

    #[test]
    fn open_beneath_should_refuse_dot_dot_and_absolute_paths() {
        let fx = Fixture::new();
        for sub in ["..", "../host", "a/../../host", "/etc"] {
            let err = open_beneath(&fx.vol(), Path::new(sub), sub).unwrap_err();
            assert!(matches!(err, SubPathError::Escapes { .. }), "{sub}: {err}");
        }
    }

    #[test]
    fn open_beneath_should_create_missing_dirs_with_the_volume_mode() {
        both(|lookup| {
            let fx = Fixture::new();
            let fd = open_beneath_with(&fx.vol(), Path::new("x/y/z"), "x/y/z", lookup).unwrap();
            assert_eq!(path_of(&fd), fx.vol().join("x/y/z"));
            for d in ["x", "x/y", "x/y/z"] {
                let m = fs::metadata(fx.vol().join(d)).unwrap();
                assert!(m.is_dir());
                assert_eq!(m.permissions().mode() & 0o777, 0o777, "{d}");
            }
            // A file in the middle is not a directory.
            fs::write(fx.vol().join("file"), b"x").unwrap();
            let err = open_beneath_with(&fx.vol(), Path::new("file/sub"), "file/sub", lookup)
                .unwrap_err();
            assert!(matches!(err, SubPathError::NotDirectory { .. }), "{err}");
        });
    }

    #[test]
    fn open_beneath_should_refuse_a_dangling_link_to_the_outside() {
        let fx = Fixture::new();
        symlink(fx.host().join("missing"), fx.vol().join("dangling")).unwrap();
        let err = open_beneath(&fx.vol(), Path::new("dangling"), "dangling").unwrap_err();
        assert!(matches!(err, SubPathError::Escapes { .. }), "{err}");
        assert!(!fx.host().join("missing").exists());
    }

    #[test]
    fn make_dir_should_leave_a_taken_name_to_a_new_lookup() {
        let fx = Fixture::new();
        let base =
            rustix::fs::open(fx.vol(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        // A link planted between the lookup and the mkdir is not opened
        // here (the next lookup judges it), nor made a directory.
        symlink(fx.host(), fx.vol().join("taken")).unwrap();
        let made = make_dir(base.as_fd(), "taken".as_ref(), Mode::from_raw_mode(0o777));
        assert!(matches!(made, Ok(None)));
        assert!(fs::symlink_metadata(fx.vol().join("taken"))
            .unwrap()
            .is_symlink());
        let made = make_dir(base.as_fd(), "fresh".as_ref(), Mode::from_raw_mode(0o751));
        assert!(matches!(made, Ok(Some(_))));
        let m = fs::metadata(fx.vol().join("fresh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o777, 0o751);
    }

    #[test]
    fn binds_should_mount_the_opened_file_and_remove_it_when_dropped() {
        let fx = Fixture::new();
        fs::create_dir(fx.vol().join("dir")).unwrap();
        fs::write(fx.vol().join("dir/in"), b"in").unwrap();
        fs::write(fx.vol().join("file"), b"file").unwrap();
        let points = fx.tmp.path().join("points/uid");
        let (dmp, fmp) = (points.join("vol/c/0"), points.join("vol/c/1"));
        {
            let mut binds = Binds::new();
            let d = open_beneath(&fx.vol(), Path::new("dir"), "dir").unwrap();
            // The path is swapped for a link to the outside after the
            // open: the bind still shows what was opened.
            fs::rename(fx.vol().join("dir"), fx.vol().join("moved")).unwrap();
            symlink(fx.host(), fx.vol().join("dir")).unwrap();
            binds.bind(d.as_fd(), &dmp).unwrap();
            let f = open_beneath(&fx.vol(), Path::new("file"), "file").unwrap();
            binds.bind(f.as_fd(), &fmp).unwrap();
            assert_eq!(fs::read(dmp.join("in")).unwrap(), b"in");
            assert!(!dmp.join("secret").exists());
            assert_eq!(fs::read(&fmp).unwrap(), b"file");
            assert_eq!(binds.mount_points(), [dmp.clone(), fmp.clone()]);
            let mode = fs::metadata(points.join("vol"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        // Unmounted and removed up to the pod's directory; the volume's
        // content is untouched.
        assert!(!points.exists(), "pod directory of mount points left");
        assert_eq!(fs::read(fx.vol().join("moved/in")).unwrap(), b"in");
        assert_eq!(fs::read(fx.vol().join("file")).unwrap(), b"file");
    }

    #[test]
    fn remove_tree_should_unmount_without_deleting_volume_content() {
        let fx = Fixture::new();
        fs::write(fx.vol().join("keep"), b"k").unwrap();
        let root = fx.tmp.path().join("root");
        let mp = pod_dir(&root, "uid").join("vol/c/0");
        let mut binds = Binds::new();
        let fd = open_beneath(&fx.vol(), Path::new(""), ".").unwrap();
        binds.bind(fd.as_fd(), &mp).unwrap();
        // A killed agent: its binds are never dropped.
        std::mem::forget(binds);
        assert!(mp.join("keep").exists());
        sweep(&root);
        assert!(!root.join(DIR).exists());
        assert_eq!(fs::read(fx.vol().join("keep")).unwrap(), b"k");
        // remove_pod on nothing is fine.
        remove_pod(&pod_dir(&root, "uid")).unwrap();
    }

    #[test]
    fn release_should_refuse_to_delete_a_directory_with_content() {
        let fx = Fixture::new();
        fs::write(fx.vol().join("keep"), b"k").unwrap();
        // Not a mount point, but not empty: rmdir fails, nothing goes.
        assert!(release(&fx.vol()).is_err());
        assert!(fx.vol().join("keep").exists());
    }
}
