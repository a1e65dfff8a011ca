//! Notifications that run an eviction pass at once instead of at the next
//! periodic one.
//!
//! - cgroup v1: a memory threshold on `memory.usage_in_bytes` registered
//!   through `cgroup.event_control` with an eventfd, which the kernel
//!   signals when usage crosses it (either way). The threshold is the usage
//!   at which the signal's available amount reaches the eviction threshold,
//!   `capacity − threshold + inactive_file`, so it is recomputed (and
//!   re-registered) as the page cache moves.
//! - cgroup v2: a PSI trigger on the cgroup's `memory.pressure` (or
//!   `/proc/pressure/memory`), signalled with POLLPRI when memory stalls
//!   pass the trigger's share of its window. Windows must be multiples of
//!   2 s on kernels where the caller lacks CAP_SYS_RESOURCE.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Notify;

use super::observe::MemoryStats;

/// The usage of a memory cgroup at which `available` falls below
/// `threshold_bytes`: `capacity − threshold + inactive file pages`.
pub fn memcg_threshold(stats: &MemoryStats, threshold_bytes: i64) -> i64 {
    let inactive = (stats.usage - stats.working_set).max(0);
    (stats.capacity - threshold_bytes + inactive).max(0)
}

/// Why a notification could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct NotifyError {
    op: &'static str,
    path: PathBuf,
    source: std::io::Error,
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> NotifyError + 'a {
    move |source| NotifyError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// A thread blocked in poll(2) on one descriptor, waking `notify` on each
/// event, until it is dropped. A thread rather than the async reactor:
/// registering a raw descriptor there needs `unsafe`, and a blocked
/// thread costs nothing while nothing happens.
#[derive(Debug)]
struct Watcher {
    stop: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a watched descriptor's event means.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// An eventfd: readable, and its counter must be read.
    EventFd,
    /// A PSI trigger: POLLPRI.
    Psi,
}

impl Watcher {
    fn start(
        fd: OwnedFd,
        kind: Kind,
        notify: Arc<Notify>,
        what: &Path,
    ) -> Result<Self, NotifyError> {
        let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .map_err(|e| err("eventfd for", what)(e.into()))?;
        let stop_wait = stop.try_clone().map_err(err("dup eventfd for", what))?;
        let thread = std::thread::Builder::new()
            .name("petrel-evict-notify".into())
            .spawn(move || watch(fd, stop_wait, kind, notify))
            .map_err(err("spawn a watcher for", what))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(fd: OwnedFd, stop: OwnedFd, kind: Kind, notify: Arc<Notify>) {
    use rustix::event::{PollFd, PollFlags};
    let flags = match kind {
        Kind::EventFd => PollFlags::IN,
        Kind::Psi => PollFlags::PRI,
    };
    loop {
        let mut fds = [PollFd::new(&fd, flags), PollFd::new(&stop, PollFlags::IN)];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "memory notification failed; polling only");
                return;
            }
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        let ev = fds[0].revents();
        if ev.intersects(PollFlags::ERR | PollFlags::NVAL) {
            tracing::warn!("memory notification descriptor failed; polling only");
            return;
        }
        if ev.intersects(flags) {
            if let Kind::EventFd = kind {
                let mut buf = [0u8; 8];
                let _ = rustix::io::read(&fd, &mut buf);
            }
            notify.notify_one();
        }
    }
}

/// A registered v1 memory threshold; dropping it unregisters it (the
/// kernel drops the event when its eventfd is closed).
#[derive(Debug)]
pub struct MemcgThreshold {
    /// The usage, bytes, it fires at.
    pub bytes: i64,
    _watcher: Watcher,
    // Open as long as the registration.
    _usage: std::fs::File,
}

/// Registers a threshold of `bytes` on `memory.usage_in_bytes` of the v1
/// memory cgroup directory `dir`; each crossing wakes `notify`.
pub fn memcg_threshold_notifier(
    dir: &Path,
    bytes: i64,
    notify: Arc<Notify>,
) -> Result<MemcgThreshold, NotifyError> {
    let usage_path = dir.join("memory.usage_in_bytes");
    let control_path = dir.join("cgroup.event_control");
    let usage = std::fs::File::open(&usage_path).map_err(err("open", &usage_path))?;
    let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
        .map_err(|e| err("eventfd for", dir)(e.into()))?;
    let mut control = std::fs::OpenOptions::new()
        .write(true)
        .open(&control_path)
        .map_err(err("open", &control_path))?;
    let line = format!("{} {} {}", efd.as_raw_fd(), usage.as_raw_fd(), bytes.max(0));
    control
        .write_all(line.as_bytes())
        .map_err(err("write", &control_path))?;
    Ok(MemcgThreshold {
        bytes,
        _watcher: Watcher::start(efd, Kind::EventFd, notify, dir)?,
        _usage: usage,
    })
}

/// A registered PSI trigger; dropping it removes it.
#[derive(Debug)]
pub struct PsiTrigger {
    _watcher: Watcher,
}

/// Registers `some <stall_us> <window_us>` on the pressure file `path`
/// (`<cgroup>/memory.pressure` or `/proc/pressure/memory`); each trigger
/// wakes `notify`.
pub fn psi_trigger(
    path: &Path,
    stall_us: u64,
    window_us: u64,
    notify: Arc<Notify>,
) -> Result<PsiTrigger, NotifyError> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(err("open", path))?;
    let line = format!("some {stall_us} {window_us}\0");
    f.write_all(line.as_bytes()).map_err(err("write", path))?;
    Ok(PsiTrigger {
        _watcher: Watcher::start(OwnedFd::from(f), Kind::Psi, notify, path)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_should_be_where_available_meets_the_eviction_threshold() {
        let s = MemoryStats {
            capacity: 1000,
            usage: 700,
            working_set: 600,
        };
        // available = 1000 - (usage - 100); available < 150 when usage > 950.
        assert_eq!(memcg_threshold(&s, 150), 950);
        assert_eq!(memcg_threshold(&s, 2000), 0);
    }
}
