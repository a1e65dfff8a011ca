//! Small helpers: ids, clocks, process identity, pidfds.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A new random 64-hex-character id (like containerd's and Docker's).
pub fn new_id() -> Result<String, io::Error> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).map_err(io::Error::other)?;
    Ok(hex::encode(b))
}

/// Wall-clock time in nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A process's start time in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), or `None` when the process does not exist.
pub fn process_start_time(pid: u32) -> Option<u64> {
    petrel_oci::proc_stat::read(pid).map(|s| s.start_time)
}

/// Whether the process `pid` still exists with the given start time
/// (a different start time means the pid was reused).
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    pid != 0 && process_start_time(pid) == Some(start_time)
}

/// Opens a pidfd for `pid`: readable once the process has exited, whether
/// or not it is our child. This is how exits are noticed without polling.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a new, owned file descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reaps the child behind `pidfd` if it has exited.
pub fn try_reap(pidfd: &OwnedFd) -> io::Result<Option<i32>> {
    // SAFETY: siginfo_t is plain data; waitid fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waitid on a pidfd we own, writing into `info`.
        let r = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG,
            )
        };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    // SAFETY: after a successful waitid the pid and status fields are set
    // (pid 0: the child has not exited yet).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(if info.si_code == libc::CLD_EXITED {
        status
    } else {
        128 + status
    }))
}

/// A pidfd on process `pid` if it is still the one that started at
/// `start_time` (clock ticks since boot); None when it is gone, was
/// replaced, or its start time is unknown (0).
pub fn pidfd_of(pid: u32, start_time: u64) -> io::Result<Option<OwnedFd>> {
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(e),
    };
    // Checked after opening: the pidfd names the process whose start time
    // is read, even if the pid is reused afterwards.
    if start_time == 0 || process_start_time(pid) != Some(start_time) {
        return Ok(None);
    }
    Ok(Some(fd))
}

/// Sends `signal` to the process `pid` if it is still the one that started
/// at `start_time`. Returns `Ok(false)` when that process is gone. The
/// pidfd pins the process between the identity check and the signal, so a
/// reused pid is never signalled.
pub fn signal_process(pid: u32, start_time: u64, signal: i32) -> io::Result<bool> {
    let Some(fd) = pidfd_of(pid, start_time)? else {
        return Ok(false);
    };
    pidfd_signal(&fd, signal)
}

/// Sends `signal` to the process behind `pidfd`. Returns `Ok(false)` when
/// it has exited already.
pub fn pidfd_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<bool> {
    let raw = pidfd.as_raw_fd();
    // SAFETY: pidfd_send_signal on a pidfd we own, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            raw,
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Removes a file the runtime made; a failure (but its absence) is logged
/// with `what` the file is, for cleanups that have no caller to report to.
pub fn remove_file_logged(path: &std::path::Path, what: &str) {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            tracing::warn!(path = %path.display(), error = %e, "{what} not removed")
        }
        _ => {}
    }
}

/// Removes a directory tree the runtime owns; missing is fine. Callers
/// unmount what they mounted inside it first.
pub fn remove_dir(dir: &std::path::Path) -> Result<(), crate::RuntimeError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(crate::RuntimeError::io("remove", dir, e)),
    }
}

/// Whether `name` is a container or sandbox id (64 hex characters).
pub fn is_id(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_id_should_be_64_hex_and_unique() -> io::Result<()> {
        let a = new_id()?;
        let b = new_id()?;
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        Ok(())
    }

    #[test]
    fn signal_process_should_refuse_a_process_with_another_start_time() -> io::Result<()> {
        let mut child = std::process::Command::new("sleep").arg("100").spawn()?;
        let pid = child.id();
        let st = process_start_time(pid).unwrap_or_default();
        assert!(!signal_process(pid, st + 1, libc::SIGKILL)?);
        assert!(signal_process(pid, st, libc::SIGKILL)?);
        let status = child.wait()?;
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(!signal_process(pid, st, libc::SIGKILL)?);
        Ok(())
    }

    #[test]
    fn process_start_time_should_identify_this_process() {
        let me = std::process::id();
        let t = process_start_time(me);
        assert!(t.is_some());
        assert!(process_alive(me, t.unwrap_or_default()));
        assert!(!process_alive(me, t.unwrap_or_default() + 1));
        assert!(!process_alive(0, 0));
    }
}
