//! Descriptor-level helpers of the streaming backend: sockets named inside a
//! directory without spelling its path, waiting for a child by pidfd, and a
//! terminal master driven by tokio.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// `/proc/self/fd/<dir fd>/<name>`: a short path to `name` in `dir`, valid
/// while `dir_fd` is open. A unix socket's address is limited to 108 bytes;
/// bundle paths can be longer (a long state directory plus a 64-character
/// id), so sockets in a bundle are always bound and reached this way.
fn short_path(dir_fd: &OwnedFd, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir_fd.as_raw_fd()))
}

fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        dir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// Binds a listening unix socket `name` in `dir` (non-blocking), replacing
/// a stale one.
pub fn bind_in(dir: &Path, name: &str) -> io::Result<UnixListener> {
    match std::fs::remove_file(dir.join(name)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let dir_fd = open_dir(dir)?;
    let listener = UnixListener::bind(short_path(&dir_fd, name))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Connects to the unix socket `name` in `dir`.
pub async fn connect_in(dir: &Path, name: &str) -> io::Result<tokio::net::UnixStream> {
    let dir_fd = open_dir(dir)?;
    tokio::net::UnixStream::connect(short_path(&dir_fd, name)).await
}

/// Waits for our child behind `pidfd` to exit and reaps it: its exit code,
/// 128 + N when killed by signal N.
pub async fn wait_child(pidfd: &AsyncFd<OwnedFd>) -> io::Result<i32> {
    loop {
        let mut guard = pidfd.readable().await?;
        if let Some(code) = crate::util::try_reap(pidfd.get_ref())? {
            return Ok(code);
        }
        guard.clear_ready();
    }
}

/// Registers a descriptor with tokio.
fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the OwnedFd is a valid open descriptor that AsyncFd owns (and
    // so keeps open and unchanged) for its whole lifetime.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

/// Registers a pidfd with tokio.
pub fn async_pidfd(pidfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    register(pidfd, Interest::READABLE)
}

/// Sends SIGKILL through a pidfd (no effect on a process that is gone).
pub fn kill(pidfd: &OwnedFd) {
    // SAFETY: pidfd_send_signal on a pidfd we own, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// A terminal's master side, non-blocking, driven by tokio.
#[derive(Debug)]
pub struct Terminal {
    fd: AsyncFd<OwnedFd>,
}

impl Terminal {
    /// Wraps a master received from runc.
    pub fn new(master: OwnedFd) -> io::Result<Self> {
        let flags = rustix::fs::fcntl_getfl(&master)?;
        rustix::fs::fcntl_setfl(&master, flags | rustix::fs::OFlags::NONBLOCK)?;
        Ok(Self {
            fd: register(master, Interest::READABLE | Interest::WRITABLE)?,
        })
    }

    /// Reads output; `Ok(0)` once the terminal is hung up (every process
    /// holding it has exited: Linux reads EIO then).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut *buf).map_err(Into::into)) {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(r) => return r,
                Err(_would_block) => {}
            }
        }
    }

    /// Writes all of `data` (input typed by the client).
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), data).map_err(Into::into)) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// Sets the terminal's size.
    pub fn resize(&self, width: u16, height: u16) -> io::Result<()> {
        let size = libc::winsize {
            ws_row: height,
            ws_col: width,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads the winsize we pass, on a master we own.
        if unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_in_should_reach_a_directory_whose_path_is_too_long_for_a_socket() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut deep = dir.path().to_path_buf();
        for _ in 0..4 {
            deep = deep.join("d".repeat(40));
        }
        std::fs::create_dir_all(&deep)?;
        assert!(deep.join("x.sock").as_os_str().len() > 108);
        let listener = bind_in(&deep, "x.sock")?;
        assert!(deep.join("x.sock").exists());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let _conn = connect_in(&deep, "x.sock").await?;
            let (_peer, _) = listener.accept()?;
            Ok::<_, io::Error>(())
        })?;
        Ok(())
    }

    #[test]
    fn try_reap_should_report_exit_codes_and_signals() -> io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            // A std child is never reaped behind our back (tokio's is).
            let exit3 = std::process::Command::new("sh")
                .args(["-c", "exit 3"])
                .spawn()?;
            let fd = async_pidfd(crate::util::pidfd_open(exit3.id())?)?;
            assert_eq!(wait_child(&fd).await?, 3);

            let sleeper = std::process::Command::new("sleep").arg("100").spawn()?;
            let fd = async_pidfd(crate::util::pidfd_open(sleeper.id())?)?;
            assert_eq!(crate::util::try_reap(fd.get_ref())?, None);
            kill(fd.get_ref());
            assert_eq!(wait_child(&fd).await?, 128 + libc::SIGKILL);
            Ok(())
        })
    }
}
