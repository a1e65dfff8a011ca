//! Starting a created runc container through its exec FIFO, without
//! running `runc start`.
//!
//! `runc create` leaves the container's init blocked opening
//! `<runc root>/<id>/exec.fifo` for writing. `runc start` does nothing but
//! open that FIFO for reading, read the byte the init writes, wait for the
//! init to close it (it is close-on-exec: the init is exec'ing the
//! container's process) and remove the FIFO, which is how runc tells a
//! created container from a running one. Starting runc for that costs a Go
//! process start-up (4 ms here, most of StartContainer); doing the same
//! from the runtime costs a few system calls. runc runs no hooks in `start`
//! (poststart hooks run at create), so nothing is skipped. Only for runc:
//! other OCI runtimes keep their own `start`.

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{FileType, Mode, OFlags};

/// The FIFO's name in the container's runc state directory.
pub const EXEC_FIFO: &str = "exec.fifo";

/// Why a start through the FIFO did not happen.
#[derive(Debug, thiserror::Error)]
pub enum FifoStartError {
    /// There is no exec FIFO (runc does not know the container, or it was
    /// started already): `runc start` gives the precise answer.
    #[error("no exec fifo at {0}")]
    NoFifo(PathBuf),
    /// The container's init exited before it was started.
    #[error("container process is already dead")]
    InitDead,
    /// The init did not hand over within the deadline.
    #[error("the container's init did not open {path} within {within:?}")]
    Timeout {
        /// The FIFO.
        path: PathBuf,
        /// How long was waited.
        within: Duration,
    },
    /// A system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The FIFO.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// How long a start waits for the init's byte before it looks whether the
/// init still waits at all (see [`init_awaits_start`]), and how often after.
const LOOK_AFTER: Duration = Duration::from_millis(100);
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Whether the init process `pid` of the container whose runc state
/// directory is `state_dir` still waits for its start. runc's init holds a
/// descriptor on the exec FIFO from its creation until just before it execs
/// the container's process (it closes it then), so an init without one has
/// been started already, even if the FIFO is still there (a start whose
/// caller died before removing it). `Ok(false)` too when the init is gone.
pub fn init_awaits_start(pid: u32, state_dir: &Path) -> io::Result<bool> {
    let fifo = state_dir.join(EXEC_FIFO);
    let fds = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(fds) => fds,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for fd in fds {
        let Ok(target) = std::fs::read_link(fd?.path()) else {
            continue;
        };
        // A FIFO removed meanwhile reads as "<path> (deleted)".
        let target = target.as_os_str().as_encoded_bytes();
        if target.starts_with(fifo.as_os_str().as_encoded_bytes()) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// When the container of runc state directory `state_dir`, found started,
/// was started, as near as the files tell: the last write to the exec FIFO
/// (the init's byte) while the FIFO is there, else the last change of the
/// directory (the FIFO's removal). `None` when neither can be read.
pub fn started_at(state_dir: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(state_dir.join(EXEC_FIFO))
        .or_else(|_| std::fs::metadata(state_dir))
        .and_then(|m| m.modified())
        .ok()
}

/// Starts the created container whose runc state directory is `state_dir`
/// and whose init (process `init_pid`) is watched by `init`, a pidfd.
/// Blocking: call it where blocking is allowed. Returns once the init has
/// exec'd the container's process (closed the FIFO) and the FIFO is
/// removed, or, when the init was found started already (a start that
/// stopped half-way: the FIFO left behind), once the FIFO is removed.
pub fn start(
    state_dir: &Path,
    init: &OwnedFd,
    init_pid: u32,
    within: Duration,
) -> Result<(), FifoStartError> {
    start_with(state_dir, init, within, || {
        init_awaits_start(init_pid, state_dir).unwrap_or(true)
    })
}

/// [`start`] with `awaits` telling whether the init still waits.
fn start_with(
    state_dir: &Path,
    init: &OwnedFd,
    within: Duration,
    awaits: impl Fn() -> bool,
) -> Result<(), FifoStartError> {
    let path = state_dir.join(EXEC_FIFO);
    let io_err = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |e: rustix::io::Errno| FifoStartError::Io {
            op,
            path,
            source: e.into(),
        }
    };
    // Non-blocking: opening for reading must not wait for a writer that a
    // dead init will never be.
    let fifo = match rustix::fs::open(
        &path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Err(FifoStartError::NoFifo(path)),
        Err(e) => return Err(io_err("open", &path)(e)),
    };
    let st = rustix::fs::fstat(&fifo).map_err(io_err("stat", &path))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Fifo {
        return Err(FifoStartError::NoFifo(path));
    }
    let got = read_until_closed(&fifo, init, &path, within, awaits)?;
    if got == Some(0) {
        return Err(FifoStartError::InitDead);
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FifoStartError::Io {
            op: "remove",
            path,
            source,
        }),
    }
}

/// Reads the FIFO until its writer has come and gone; returns the bytes
/// read, or `None` when `awaits`, asked after [`LOOK_AFTER`] without a
/// writer and every [`LOOK_EVERY`] after, says that the init started
/// already. Stops early with `InitDead` when the init exits before writing.
fn read_until_closed(
    fifo: &OwnedFd,
    init: &OwnedFd,
    path: &Path,
    within: Duration,
    awaits: impl Fn() -> bool,
) -> Result<Option<usize>, FifoStartError> {
    let started = Instant::now();
    let deadline = started + within;
    let mut next_look = started + LOOK_AFTER;
    let mut file = std::fs::File::from(fifo.try_clone().map_err(|e| FifoStartError::Io {
        op: "dup",
        path: path.to_path_buf(),
        source: e,
    })?);
    let mut total = 0usize;
    let mut buf = [0u8; 16];
    loop {
        let now = Instant::now();
        if total == 0 && now >= next_look {
            if !awaits() {
                return Ok(None);
            }
            next_look = now + LOOK_EVERY;
        }
        let left = deadline.saturating_duration_since(now);
        if left.is_zero() {
            return Err(FifoStartError::Timeout {
                path: path.to_path_buf(),
                within,
            });
        }
        let wait = if total == 0 {
            left.min(next_look.saturating_duration_since(now))
        } else {
            left
        };
        let timeout = Timespec::try_from(wait).unwrap_or(Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        });
        let mut fds = [
            PollFd::new(fifo, PollFlags::IN),
            PollFd::new(init, PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                return Err(FifoStartError::Io {
                    op: "poll",
                    path: path.to_path_buf(),
                    source: e.into(),
                })
            }
        }
        let fifo_ready = !fds[0].revents().is_empty();
        let init_gone = !fds[1].revents().is_empty();
        if fifo_ready {
            // Until a writer has connected, reading gives EOF too; poll
            // reports HUP only once a writer has been and gone, so the
            // end is a read of 0 after data or after HUP.
            let hup = fds[0].revents().contains(PollFlags::HUP);
            match file.read(&mut buf) {
                Ok(0) if total > 0 || hup => return Ok(Some(total)),
                Ok(0) => {}
                Ok(n) => {
                    total += n;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(FifoStartError::Io {
                        op: "read",
                        path: path.to_path_buf(),
                        source,
                    })
                }
            }
        }
        if init_gone {
            // Whatever it wrote before dying is in the pipe already.
            return match file.read(&mut buf) {
                Ok(n) if total + n > 0 => Ok(Some(total + n)),
                _ => Err(FifoStartError::InitDead),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn mkfifo(path: &Path) -> io::Result<()> {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .map_err(io::Error::from)
    }

    /// A child process (the stand-in for a container's init) and its pidfd.
    fn sleeper() -> io::Result<(std::process::Child, OwnedFd)> {
        let child = std::process::Command::new("sleep").arg("30").spawn()?;
        let pid = rustix::process::Pid::from_raw(child.id() as i32)
            .ok_or_else(|| io::Error::other("pid 0"))?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
        Ok((child, pidfd))
    }

    #[test]
    fn a_writer_that_writes_and_closes_should_start_and_remove_the_fifo() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(EXEC_FIFO);
        mkfifo(&path)?;
        let (mut child, pidfd) = sleeper()?;
        let writer_path = path.clone();
        // The init's side: blocks opening until the reader is there.
        let writer = std::thread::spawn(move || -> io::Result<()> {
            let mut f = std::fs::OpenOptions::new().write(true).open(&writer_path)?;
            std::thread::sleep(Duration::from_millis(20));
            f.write_all(b"0")?;
            Ok(())
        });
        let started = start_with(dir.path(), &pidfd, Duration::from_secs(5), || true);
        let _ = child.kill();
        let _ = child.wait();
        writer
            .join()
            .map_err(|_| io::Error::other("writer panicked"))??;
        assert!(started.is_ok(), "{started:?}");
        assert!(!path.exists(), "the fifo should be removed");
        Ok(())
    }

    #[test]
    fn a_dead_init_should_be_reported_without_waiting_for_the_deadline() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        mkfifo(&dir.path().join(EXEC_FIFO))?;
        let (mut child, pidfd) = sleeper()?;
        child.kill()?;
        child.wait()?;
        let t = Instant::now();
        let r = start_with(dir.path(), &pidfd, Duration::from_secs(10), || true);
        assert!(matches!(r, Err(FifoStartError::InitDead)), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(2));
        // The FIFO stays: runc still sees a created (dead) container.
        assert!(dir.path().join(EXEC_FIFO).exists());
        Ok(())
    }

    #[test]
    fn no_fifo_or_a_plain_file_should_say_so() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let (mut child, pidfd) = sleeper()?;
        let missing = start_with(dir.path(), &pidfd, Duration::from_secs(1), || true);
        std::fs::write(dir.path().join(EXEC_FIFO), b"")?;
        let plain = start_with(dir.path(), &pidfd, Duration::from_secs(1), || true);
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            matches!(missing, Err(FifoStartError::NoFifo(_))),
            "{missing:?}"
        );
        assert!(matches!(plain, Err(FifoStartError::NoFifo(_))), "{plain:?}");
        Ok(())
    }

    #[test]
    fn a_silent_live_init_should_time_out() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        mkfifo(&dir.path().join(EXEC_FIFO))?;
        let (mut child, pidfd) = sleeper()?;
        let r = start_with(dir.path(), &pidfd, Duration::from_millis(300), || true);
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(r, Err(FifoStartError::Timeout { .. })), "{r:?}");
        Ok(())
    }

    #[test]
    fn an_init_found_started_should_have_its_fifo_removed_without_waiting() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(EXEC_FIFO);
        mkfifo(&path)?;
        let (mut child, pidfd) = sleeper()?;
        let t = Instant::now();
        let r = start_with(dir.path(), &pidfd, Duration::from_secs(10), || false);
        let _ = child.kill();
        let _ = child.wait();
        assert!(r.is_ok(), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(!path.exists(), "the fifo should be removed");
        Ok(())
    }

    #[test]
    fn init_awaits_start_should_see_whether_the_process_holds_the_fifo() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(EXEC_FIFO);
        mkfifo(&path)?;
        let me = std::process::id();
        assert!(!init_awaits_start(me, dir.path())?);
        // As runc's init does: a path descriptor on the FIFO until it execs.
        let held = rustix::fs::open(&path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
        assert!(init_awaits_start(me, dir.path())?);
        drop(held);
        assert!(!init_awaits_start(me, dir.path())?);
        assert!(!init_awaits_start(u32::MAX, dir.path())?);
        Ok(())
    }

    #[test]
    fn started_at_should_be_the_fifo_write_else_the_directory_change() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(EXEC_FIFO);
        mkfifo(&path)?;
        // File times come from a coarse clock (a tick behind at most): the
        // write must move the time well past the FIFO's creation.
        std::thread::sleep(Duration::from_millis(200));
        let before = std::time::SystemTime::now() - Duration::from_millis(50);
        {
            let _reader = rustix::fs::open(
                &path,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let mut w = std::fs::OpenOptions::new().write(true).open(&path)?;
            w.write_all(b"0")?;
        }
        let at = started_at(dir.path()).ok_or_else(|| io::Error::other("no time"))?;
        assert!(at >= before, "{at:?} < {before:?}");
        std::fs::remove_file(&path)?;
        let at2 = started_at(dir.path()).ok_or_else(|| io::Error::other("no time"))?;
        assert!(at2 >= at);
        Ok(())
    }
}
