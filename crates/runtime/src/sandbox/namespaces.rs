//! Pod namespaces without a pause process.
//!
//! A pod's network, IPC and UTS namespaces are created by a short-lived
//! thread that unshares them, sets the hostname, brings up loopback, and
//! bind-mounts `/proc/thread-self/ns/<type>` onto files in the sandbox's
//! directory. The bind mounts keep the namespaces alive after the thread has
//! gone, so an idle pod costs no process at all. Containers join them by
//! path. Unpinning is a lazy unmount plus removal of the file.
//!
//! A pod with a user namespace of its own (CRI mode POD) gets it the same
//! way, pinned as `user`, and its network, IPC and UTS namespaces are made
//! in it, so that they belong to it: its containers' root may then set the
//! hostname, mount sysfs and mqueue, and configure the network. A thread
//! cannot do that (unshare(2) of a user namespace needs a single-threaded
//! process), so a forked child does: one unshare of every type (the kernel
//! makes the user namespace first, and the others owned by it), the
//! hostname and loopback, then it waits while the runtime writes its
//! uid_map and gid_map and pins its namespaces, and exits.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use petrel_oci::userns::UserMappings;

/// Errors while pinning or releasing namespaces.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// A system call failed.
    #[error("{op} {path}: {source}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The file or namespace concerned.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The pinning thread died.
    #[error("namespace thread failed")]
    Thread,
}

pub(crate) fn sys(op: &'static str, path: &Path, source: std::io::Error) -> NamespaceError {
    NamespaceError::Sys {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Which namespaces a pod needs of its own.
#[derive(Debug, Clone, Default)]
pub struct NamespaceRequest {
    /// A network namespace (with loopback up).
    pub net: bool,
    /// An IPC namespace.
    pub ipc: bool,
    /// A UTS namespace with this hostname.
    pub uts: Option<String>,
    /// A user namespace with these mappings, owning the others.
    pub user: Option<UserMappings>,
}

/// The files pinning a pod's namespaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pinned {
    /// The network namespace file.
    pub net: Option<PathBuf>,
    /// The IPC namespace file.
    pub ipc: Option<PathBuf>,
    /// The UTS namespace file.
    pub uts: Option<PathBuf>,
    /// The user namespace file.
    pub user: Option<PathBuf>,
}

impl Pinned {
    fn slot(&mut self, kind: &str) -> &mut Option<PathBuf> {
        match kind {
            "net" => &mut self.net,
            "ipc" => &mut self.ipc,
            "user" => &mut self.user,
            _ => &mut self.uts,
        }
    }

    /// Releases every pinned namespace (best effort; returns the first error).
    pub fn release(&self) -> Result<(), NamespaceError> {
        let mut first = None;
        for p in [&self.net, &self.ipc, &self.uts, &self.user]
            .into_iter()
            .flatten()
        {
            if let Err(e) = unpin(p) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Creates the requested namespaces and pins them as files `net`, `ipc` and
/// `uts` in `dir`. On failure nothing is left behind.
pub fn pin(dir: &Path, req: &NamespaceRequest) -> Result<Pinned, NamespaceError> {
    if let Some(mappings) = &req.user {
        return crate::sandbox::userns::pin(dir, req, mappings);
    }
    if !req.net && !req.ipc && req.uts.is_none() {
        return Ok(Pinned::default());
    }
    let dir = dir.to_path_buf();
    let req = req.clone();
    // A fresh thread: unshare(2) of these namespace types affects only the
    // calling thread, which then exits, leaving the process untouched.
    std::thread::Builder::new()
        .name("petrel-netns".into())
        .spawn(move || pin_in_this_thread(&dir, &req))
        .map_err(|e| sys("spawn thread for", Path::new("namespaces"), e))?
        .join()
        .map_err(|_| NamespaceError::Thread)?
}

fn pin_in_this_thread(dir: &Path, req: &NamespaceRequest) -> Result<Pinned, NamespaceError> {
    let mut flags = 0;
    if req.net {
        flags |= libc::CLONE_NEWNET;
    }
    if req.ipc {
        flags |= libc::CLONE_NEWIPC;
    }
    if req.uts.is_some() {
        flags |= libc::CLONE_NEWUTS;
    }
    // SAFETY: unshare only changes this thread's namespace membership; the
    // thread is dedicated to this call and exits right after.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(sys("unshare", dir, std::io::Error::last_os_error()));
    }
    if let Some(name) = &req.uts {
        rustix::system::sethostname(name.as_bytes())
            .map_err(|e| sys("sethostname", Path::new(name), e.into()))?;
    }
    if req.net {
        loopback_up().map_err(|e| sys("bring up loopback in", dir, e))?;
    }
    let mut pinned = Pinned::default();
    let wanted = [
        ("net", req.net),
        ("ipc", req.ipc),
        ("uts", req.uts.is_some()),
    ];
    for (kind, want) in wanted {
        if !want {
            continue;
        }
        match pin_one(dir, kind, &format!("/proc/thread-self/ns/{kind}")) {
            Ok(p) => *pinned.slot(kind) = Some(p),
            Err(e) => {
                if let Err(undo) = pinned.release() {
                    tracing::warn!(dir = %dir.display(), error = %undo, "namespaces pinned before a failure not released");
                }
                return Err(e);
            }
        }
    }
    Ok(pinned)
}

/// Pins namespace file `source` (`/proc/<task>/ns/<kind>`) as `<dir>/<kind>`.
pub(crate) fn pin_one(dir: &Path, kind: &str, source: &str) -> Result<PathBuf, NamespaceError> {
    let target = dir.join(kind);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&target)
        .map_err(|e| sys("create", &target, e))?;
    if let Err(e) = rustix::mount::mount_bind(source, &target) {
        crate::util::remove_file_logged(&target, "namespace pin file");
        return Err(sys("bind-mount namespace onto", &target, e.into()));
    }
    Ok(target)
}

/// Releases one pinned namespace: lazy unmount, then remove the file.
/// A file that is gone already is fine.
pub fn unpin(path: &Path) -> Result<(), NamespaceError> {
    match rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) => {}
        // EINVAL: not a mount point (already unmounted); ENOENT: gone.
        Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOENT => {}
        Err(e) => return Err(sys("unmount", path, e.into())),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(sys("remove", path, e)),
    }
}

/// Sets IFF_UP on `lo` in the current thread's network namespace.
fn loopback_up() -> std::io::Result<()> {
    let mut ifr = loopback_ifreq()?;
    match loopback_up_raw(&mut ifr) {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// The `ifreq` naming `lo`, made before a fork (the child must not allocate).
pub(crate) fn loopback_ifreq() -> std::io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = CString::new("lo").map_err(std::io::Error::other)?;
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.as_bytes_with_nul()) {
        *dst = *src as libc::c_char;
    }
    Ok(ifr)
}

/// Sets IFF_UP on the interface `ifr` names with system calls only (safe in
/// a child forked from a threaded process); returns 0 or the errno.
pub(crate) fn loopback_up_raw(ifr: &mut libc::ifreq) -> i32 {
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: a plain datagram socket used only for interface ioctls.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return errno();
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write `ifr`, which is valid
    // and properly sized for the duration of each call; `fd` is ours and
    // closed once.
    unsafe {
        let mut r = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut *ifr);
        if r >= 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(fd, libc::SIOCSIFFLAGS, &*ifr);
        }
        let e = if r < 0 { errno() } else { 0 };
        libc::close(fd);
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns_inode(path: &Path) -> Option<u64> {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).ok()?).into()
    }

    #[test]
    fn pin_should_create_distinct_namespaces_and_release_them() -> Result<(), NamespaceError> {
        let dir = tempfile::tempdir().map_err(|e| sys("tempdir", Path::new("/tmp"), e))?;
        let req = NamespaceRequest {
            net: true,
            ipc: true,
            uts: Some("petrel-ns-test".into()),
            user: None,
        };
        let pinned = pin(dir.path(), &req)?;
        let guard = scopeguard(pinned.clone());
        let host_net = ns_inode(Path::new("/proc/self/ns/net"));
        let net = pinned.net.as_deref().and_then(ns_inode);
        assert!(net.is_some());
        assert_ne!(net, host_net, "the pod must get its own network namespace");
        assert!(pinned.ipc.is_some() && pinned.uts.is_some());
        drop(guard);
        for p in [&pinned.net, &pinned.ipc, &pinned.uts]
            .into_iter()
            .flatten()
        {
            assert!(!p.exists(), "{} must be gone", p.display());
        }
        // Releasing twice is harmless.
        pinned.release()?;
        Ok(())
    }

    struct Guard(Pinned);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.release();
        }
    }
    fn scopeguard(p: Pinned) -> Guard {
        Guard(p)
    }
}
