//! Thin wrappers over the system calls the shim needs and std lacks.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Turns a `-1` return into the `errno` error.
fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Wraps a descriptor the kernel just returned.
fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: the descriptor was just returned by the kernel and nothing
    // else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a nul byte"))
}

/// A close-on-exec pipe: (read end, write end). Both ends block; callers set
/// their own end non-blocking (the container's end must stay blocking).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets O_NONBLOCK on the open file description of `fd`.
pub fn set_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor we hold; F_GETFL/F_SETFL take no pointers.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// Duplicates `fd` onto exactly `target` (closing what was there), close-on-exec.
pub fn dup_to(fd: &impl AsRawFd, target: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: dup3 takes two descriptor numbers; `target` becomes ours.
    owned(unsafe { libc::dup3(fd.as_raw_fd(), target, libc::O_CLOEXEC) })
}

/// Duplicates `fd` to the lowest free descriptor at or above `min`, close-on-exec.
pub fn dup_above(fd: &impl AsRawFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl F_DUPFD_CLOEXEC takes a descriptor and an integer.
    owned(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) })
}

/// Makes `fd` this process's descriptor `target` (e.g. standard output).
pub fn replace_fd(fd: &impl AsRawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: dup2 onto a standard descriptor number; no memory involved.
    cvt(unsafe { libc::dup2(fd.as_raw_fd(), target) })?;
    Ok(())
}

/// Creates a FIFO with mode 0600 at `path`, replacing whatever stale file is
/// there.
pub fn mkfifo_fresh(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let c = c_path(path)?;
    // SAFETY: mkfifo reads the nul-terminated path we own.
    cvt(unsafe { libc::mkfifo(c.as_ptr(), 0o600) })?;
    Ok(())
}

/// Opens `path` with raw `open(2)` flags (close-on-exec is added).
pub fn open_raw(path: &Path, flags: libc::c_int) -> io::Result<File> {
    let c = c_path(path)?;
    // SAFETY: open reads the nul-terminated path; the result is a new descriptor.
    let fd = owned(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) })?;
    Ok(File::from(fd))
}

/// Writes all of `data` to a raw descriptor (standard output).
pub fn write_all_fd(fd: RawFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: write reads `data.len()` bytes from the slice we borrow.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// Leaves the caller's session and process group.
pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments.
    cvt(unsafe { libc::setsid() })?;
    Ok(())
}

/// Makes this process the reaper of its orphaned descendants.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) })?;
    Ok(())
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it fully.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is ours; the signal numbers are valid constants.
    unsafe {
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

/// Blocks `signals` and returns a non-blocking signalfd that reports them.
///
/// Blocked (not ignored) signals are not inherited as ignored by children:
/// std resets the mask of the processes it spawns, so runc and the
/// container start with default signal handling.
pub fn block_into_signalfd(signals: &[libc::c_int]) -> io::Result<File> {
    let set = sigset(signals);
    // SAFETY: sigprocmask reads the set we own; no old mask is requested.
    cvt(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) })?;
    // SAFETY: signalfd reads the set and returns a new descriptor.
    let fd = owned(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })?;
    Ok(File::from(fd))
}

/// Ignores `signal` (for SIGPIPE: a write to a closed pipe returns EPIPE).
pub fn ignore_signal(signal: libc::c_int) {
    // SAFETY: installs SIG_IGN; no handler code runs.
    unsafe { libc::signal(signal, libc::SIG_IGN) };
}

/// Reads one pending signal number from a signalfd, `None` when none is left.
pub fn read_signal(sigfd: &File) -> io::Result<Option<u32>> {
    use std::io::Read;
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    let mut reader = sigfd;
    loop {
        match reader.read(&mut info) {
            Ok(n) if n == info.len() => {
                // ssi_signo is the first field.
                let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
                return Ok(Some(signo));
            }
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// Reaps one exited child without blocking: its pid and wait status.
pub fn reap_any() -> Option<(libc::pid_t, libc::c_int)> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into our integer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            return Some((pid, status));
        }
        if pid == -1 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        // 0: children left but none exited; -1/ECHILD: no children.
        return None;
    }
}

/// Whether this process has any child left, exited or not.
pub fn has_children() -> bool {
    // SAFETY: waitid writes into the siginfo we own; WNOWAIT leaves any
    // exited child to be reaped later.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        ) == 0
    }
}

/// The exit code of a wait status as runc and containerd report it: the
/// status of a normal exit, 128 + N for a process killed by signal N.
pub fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// poll(2) with a timeout in milliseconds (-1: none); EINTR counts as no event.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: poll reads and writes `fds.len()` pollfd entries we own.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// Drops this process's mappings of machine code pages (executable,
/// file-backed, never written) so that only the code the idle loop runs
/// faults back in. Start-up touches code all over the binary and its C
/// library; a shim then lives for as long as its container, so the code it
/// no longer needs should not count in its resident set. The pages stay in
/// the page cache, shared by every shim; nothing is lost, they refault from
/// the file if ever run again.
pub fn drop_startup_code_pages() {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    for line in maps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(perms), Some(_), Some(_), Some(inode)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        // Executable, not writable, private, backed by a file (inode != 0):
        // text segments, which no relocation or write ever changes.
        if perms != "r-xp" || inode == "0" {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        // SAFETY: MADV_DONTNEED on an unmodified private file mapping only
        // discards page table entries; the next access reads the same bytes
        // from the file again. Writable or anonymous mappings are skipped.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_should_add_128_to_signals() {
        // Wait statuses as the kernel encodes them.
        assert_eq!(exit_code(3 << 8), 3);
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(libc::SIGKILL), 137);
        assert_eq!(exit_code(libc::SIGTERM | 0x80), 143); // with a core dump
    }

    #[test]
    fn mkfifo_fresh_should_replace_a_stale_file() -> io::Result<()> {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("ctl");
        std::fs::write(&path, "stale")?;
        mkfifo_fresh(&path)?;
        let meta = std::fs::symlink_metadata(&path)?;
        assert!(meta.file_type().is_fifo());
        mkfifo_fresh(&path)?;
        Ok(())
    }

    #[test]
    fn dup_to_should_place_the_descriptor_exactly() -> io::Result<()> {
        // High numbers, far from what other tests of this process open.
        let (r, w) = pipe()?;
        let high = dup_above(&w, 700)?;
        assert!(high.as_raw_fd() >= 700);
        let moved = dup_to(&r, 950)?;
        assert_eq!(moved.as_raw_fd(), 950);
        Ok(())
    }
}
