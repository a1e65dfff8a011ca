//! A pod's own user namespace, made and pinned without a process left
//! behind (see `namespaces` for why a forked child makes it).
//!
//! The child unshares the user namespace and the pod's other namespaces in
//! one call, sets the hostname and brings up loopback, reports on a pipe
//! and then blocks reading a second pipe. The runtime writes the child's
//! `uid_map` and `gid_map` (root of the parent namespace may map any ids),
//! bind-mounts `/proc/<child>/ns/{user,net,ipc,uts}` onto files in the
//! sandbox directory, closes the second pipe (the child exits on EOF) and
//! reaps it. The pins keep every namespace alive, the user namespace
//! included.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use petrel_oci::userns::UserMappings;

use super::namespaces::{
    loopback_ifreq, loopback_up_raw, pin_one, sys, NamespaceError, NamespaceRequest, Pinned,
};

/// What the child reports: a stage (0: all done) and an errno.
const STAGE_UNSHARE: u8 = 1;
const STAGE_HOSTNAME: u8 = 2;
const STAGE_LOOPBACK: u8 = 3;

/// Makes the user namespace `mappings` describes with the namespaces `req`
/// asks for in it, pinned in `dir` as `user`, `net`, `ipc` and `uts`.
/// Nothing is left behind on failure.
pub(crate) fn pin(
    dir: &Path,
    req: &NamespaceRequest,
    mappings: &UserMappings,
) -> Result<Pinned, NamespaceError> {
    let pipe = |what| {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| sys(what, dir, e.into()))
    };
    let (ready_r, ready_w) = pipe("make a pipe for the user namespace of")?;
    let (release_r, release_w) = pipe("make a pipe for the user namespace of")?;
    // Everything the child uses is made before the fork: it must not allocate.
    let hostname = match &req.uts {
        Some(h) => Some(
            CString::new(h.as_str())
                .map_err(|e| sys("hostname for", dir, std::io::Error::other(e)))?,
        ),
        None => None,
    };
    let mut ifr = loopback_ifreq().map_err(|e| sys("name loopback for", dir, e))?;
    let mut flags = libc::CLONE_NEWUSER;
    if req.net {
        flags |= libc::CLONE_NEWNET;
    }
    if req.ipc {
        flags |= libc::CLONE_NEWIPC;
    }
    if req.uts.is_some() {
        flags |= libc::CLONE_NEWUTS;
    }
    // SAFETY: the child runs only `child`, which makes system calls and
    // never returns: nothing there allocates or takes a lock another thread
    // may hold.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(sys("fork for", dir, std::io::Error::last_os_error()));
    }
    if pid == 0 {
        child(
            flags,
            hostname.as_ref(),
            req.net.then_some(&mut ifr),
            &ready_w,
            &release_r,
            (&ready_r, &release_w),
        );
    }
    drop(ready_w);
    drop(release_r);
    let result = pin_child(dir, req, mappings, pid, &ready_r);
    // EOF lets the child go; it exits at once.
    drop(release_w);
    let mut status = 0;
    // SAFETY: waitpid on our own child, which exits on the EOF above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    result
}

/// The parent's side once the child runs: its report read, its maps
/// written, its namespaces pinned (undone on failure).
fn pin_child(
    dir: &Path,
    req: &NamespaceRequest,
    mappings: &UserMappings,
    pid: libc::pid_t,
    ready: &OwnedFd,
) -> Result<Pinned, NamespaceError> {
    let mut report = [0u8; 5];
    let n = rustix::io::read(ready, &mut report).map_err(|e| sys("read from", dir, e.into()))?;
    if n != report.len() {
        return Err(sys(
            "make the user namespace of",
            dir,
            std::io::Error::other("the child died"),
        ));
    }
    let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
    let op = match report[0] {
        0 => None,
        STAGE_UNSHARE => Some("unshare user namespace for"),
        STAGE_HOSTNAME => Some("sethostname in the user namespace of"),
        STAGE_LOOPBACK => Some("bring up loopback in the user namespace of"),
        _ => Some("make the user namespace of"),
    };
    if let Some(op) = op {
        return Err(sys(op, dir, std::io::Error::from_raw_os_error(errno)));
    }
    for (file, range) in [("uid_map", &mappings.uids), ("gid_map", &mappings.gids)] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, range.map_line()).map_err(|e| sys("write", Path::new(&path), e))?;
    }
    let wanted = [
        ("user", true),
        ("net", req.net),
        ("ipc", req.ipc),
        ("uts", req.uts.is_some()),
    ];
    let mut pinned = Pinned::default();
    for (kind, want) in wanted {
        if !want {
            continue;
        }
        match pin_one(dir, kind, &format!("/proc/{pid}/ns/{kind}")) {
            Ok(p) => match kind {
                "user" => pinned.user = Some(p),
                "net" => pinned.net = Some(p),
                "ipc" => pinned.ipc = Some(p),
                _ => pinned.uts = Some(p),
            },
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

/// The forked child: system calls only, then `_exit`.
fn child(
    flags: libc::c_int,
    hostname: Option<&CString>,
    loopback: Option<&mut libc::ifreq>,
    ready: &OwnedFd,
    release: &OwnedFd,
    parents: (&OwnedFd, &OwnedFd),
) -> ! {
    let report = |stage: u8, errno: i32| {
        let e = errno.to_ne_bytes();
        let msg = [stage, e[0], e[1], e[2], e[3]];
        // SAFETY: write(2) of a stack buffer to our pipe.
        unsafe { libc::write(ready.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
    };
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: only system calls on values made before the fork; the process
    // exits with _exit, running no destructor or atexit handler.
    unsafe {
        // The parent's ends: the release pipe must see EOF once the parent
        // closes its own.
        libc::close(parents.0.as_raw_fd());
        libc::close(parents.1.as_raw_fd());
        if libc::unshare(flags) != 0 {
            report(STAGE_UNSHARE, errno());
            libc::_exit(1);
        }
        if let Some(h) = hostname {
            if libc::sethostname(h.as_ptr(), h.as_bytes().len()) != 0 {
                report(STAGE_HOSTNAME, errno());
                libc::_exit(1);
            }
        }
        if let Some(ifr) = loopback {
            let e = loopback_up_raw(ifr);
            if e != 0 {
                report(STAGE_LOOPBACK, e);
                libc::_exit(1);
            }
        }
        report(0, 0);
        let mut byte = 0u8;
        libc::read(release.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
        libc::_exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_oci::userns::IdRange;

    fn ino(path: &Path) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).expect("stat"))
    }

    /// The user namespace owning the namespace pinned at `path`
    /// (`NS_GET_USERNS`), as an inode number.
    fn owner(path: &Path) -> u64 {
        const NS_GET_USERNS: libc::c_ulong = 0xb701;
        let f = std::fs::File::open(path).expect("open");
        // SAFETY: the ioctl returns a new fd or -1; it takes no argument.
        let fd = unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_USERNS) };
        assert!(
            fd >= 0,
            "NS_GET_USERNS: {}",
            std::io::Error::last_os_error()
        );
        let p = format!("/proc/self/fd/{fd}");
        let i = ino(Path::new(&p));
        // SAFETY: the fd the ioctl returned, closed once.
        unsafe { libc::close(fd) };
        i
    }

    #[test]
    fn pin_should_make_a_user_namespace_owning_the_pods_other_namespaces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let range = |host_id| IdRange {
            container_id: 0,
            host_id,
            size: 65536,
        };
        let mappings = UserMappings {
            uids: range(300_000),
            gids: range(400_000),
        };
        let req = NamespaceRequest {
            net: true,
            ipc: true,
            uts: Some("petrel-userns-test".into()),
            user: Some(mappings),
        };
        let pinned = super::super::namespaces::pin(dir.path(), &req).expect("pin");
        struct Release(Pinned);
        impl Drop for Release {
            fn drop(&mut self) {
                let _ = self.0.release();
            }
        }
        let guard = Release(pinned.clone());
        let user = pinned.user.clone().expect("user pinned");
        assert_ne!(ino(&user), ino(Path::new("/proc/self/ns/user")));
        for p in [&pinned.net, &pinned.ipc, &pinned.uts] {
            let p = p.as_ref().expect("pinned");
            assert_eq!(
                owner(p),
                ino(&user),
                "{} must belong to the pod's user namespace",
                p.display()
            );
        }
        // The mappings are the namespace's.
        let out = std::process::Command::new("nsenter")
            .arg(format!("--user={}", user.display()))
            .args(["cat", "/proc/self/uid_map", "/proc/self/gid_map"])
            .output()
            .expect("nsenter");
        let maps = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<Vec<&str>> = maps
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            [["0", "300000", "65536"], ["0", "400000", "65536"]],
            "{maps}"
        );
        drop(guard);
        for p in [&pinned.user, &pinned.net, &pinned.ipc, &pinned.uts]
            .into_iter()
            .flatten()
        {
            assert!(!p.exists(), "{} must be gone", p.display());
        }
    }
}
