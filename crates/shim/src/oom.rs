//! The container's OOM kills, seen from its own cgroup while it runs.
//!
//! On cgroup v2 the kernel counts, in the `oom_kill` field of a cgroup's
//! `memory.events`, the processes the OOM killer killed in it, and notifies
//! a change of the file to inotify watchers (`IN_MODIFY`). The shim, which
//! lives as long as the container, reads the count when the container is
//! created, on every change, and once more as soon as it reaps init: the
//! container was OOM-killed when the count grew. This cannot be left to the
//! runtime: with the systemd cgroup driver, systemd removes a container's
//! scope (and its cgroup, with the count) as soon as its last process is
//! gone, and the runtime may not even be running then.
//!
//! The counts are read at the exit before anything else, and the kernel
//! increments `oom_kill` before the victim dies, so the last read
//! normally sees the kill. When that read fails (systemd removed the
//! scope first) the changes read before decide: a growth is a kill; a
//! container that never reached its limit and whose every notified change
//! was read was not killed; otherwise the shim says nothing
//! ([`OomWatch::verdict`] is `None`) rather than guess.
//!
//! On cgroup v1 (or with no memory controller on v2) there is no such file:
//! the watch is not made, and the runtime keeps its own checks.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where cgroup v2 is mounted.
const CGROUP2_ROOT: &str = "/sys/fs/cgroup";
/// `statfs(2)`'s `f_type` of a cgroup2 mount.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// The counts of `memory.events` the watch uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Times the cgroup's usage hit its limit (`max`).
    pub(crate) max: u64,
    /// Times an allocation was about to fail at the limit (`oom`).
    pub(crate) oom: u64,
    /// Processes the OOM killer killed in the cgroup (`oom_kill`).
    pub(crate) oom_kill: u64,
}

impl Counts {
    fn highest(self, other: Self) -> Self {
        Self {
            max: self.max.max(other.max),
            oom: self.oom.max(other.oom),
            oom_kill: self.oom_kill.max(other.oom_kill),
        }
    }
}

/// The reads the watch makes of the kernel; a fake in the tests.
pub(crate) trait MemoryEvents {
    /// The cgroup's current counts; an error when the file cannot be read
    /// (the cgroup is gone).
    fn read(&mut self) -> io::Result<Counts>;
}

/// The counts in `memory.events` content; `None` without `oom_kill`.
pub(crate) fn parse_counts(text: &str) -> Option<Counts> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|n| n.trim().parse::<u64>().ok())
    };
    Some(Counts {
        max: field("max").unwrap_or(0),
        oom: field("oom").unwrap_or(0),
        oom_kill: field("oom_kill")?,
    })
}

/// The cgroup v2 path in `/proc/<pid>/cgroup` content (its `0::` line).
pub(crate) fn unified_path(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/'))
}

/// Counts OOM kills in a container's cgroup; see the module's doc.
pub(crate) struct OomWatch<E> {
    events: E,
    /// The counts when the container was created.
    at_start: Counts,
    /// The highest counts read since.
    highest: Counts,
    /// A change was notified that no read has seen yet.
    unread_change: bool,
    /// Whether the read made when init exited succeeded.
    read_at_exit: Option<bool>,
}

impl<E: MemoryEvents> OomWatch<E> {
    /// Starts counting from the current counts; `None` when they cannot
    /// be read (no memory controller, not cgroup v2).
    pub(crate) fn start(mut events: E) -> Option<Self> {
        let at_start = events.read().ok()?;
        Some(Self {
            events,
            at_start,
            highest: at_start,
            unread_change: false,
            read_at_exit: None,
        })
    }

    fn read(&mut self) -> bool {
        match self.events.read() {
            Ok(counts) => {
                self.highest = self.highest.highest(counts);
                self.unread_change = false;
                true
            }
            Err(_) => false,
        }
    }

    /// The file changed: reads the counts. A failed read (the cgroup gone)
    /// leaves the change unread.
    pub(crate) fn changed(&mut self) {
        if !self.read() {
            self.unread_change = true;
        }
    }

    /// Init was reaped: the last read; `pending` says a change was
    /// notified and not read yet. Only the first call reads.
    pub(crate) fn exited(&mut self, pending: bool) {
        if self.read_at_exit.is_some() {
            return;
        }
        self.unread_change |= pending;
        let ok = self.read();
        self.read_at_exit = Some(ok);
    }

    /// Whether the OOM killer killed in the cgroup since the start: yes
    /// when `oom_kill` grew. No when the read at the exit saw it
    /// unchanged, or, the cgroup gone by then, when every change notified
    /// was read and the container never even reached its limit (`max` and
    /// `oom` unchanged: the kernel notifies each count's change, so a
    /// kill would have been seen). Unknown otherwise.
    pub(crate) fn verdict(&self) -> Option<bool> {
        if self.highest.oom_kill > self.at_start.oom_kill {
            return Some(true);
        }
        match self.read_at_exit {
            Some(true) => Some(false),
            Some(false)
                if !self.unread_change
                    && self.highest.max == self.at_start.max
                    && self.highest.oom == self.at_start.oom =>
            {
                Some(false)
            }
            _ => None,
        }
    }
}

/// Whether a buffer of inotify events holds a modification.
pub(crate) fn has_modify(mut buf: &[u8]) -> bool {
    // struct inotify_event: wd, mask, cookie, len (4 bytes each), name.
    const HEADER: usize = 16;
    while buf.len() >= HEADER {
        let word = |at: usize| u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        if word(4) & libc::IN_MODIFY != 0 {
            return true;
        }
        let next = HEADER + word(12) as usize;
        if next > buf.len() {
            break;
        }
        buf = &buf[next..];
    }
    false
}

/// A cgroup's `memory.events` on the host.
pub(crate) struct CgroupMemoryEvents {
    path: PathBuf,
}

impl MemoryEvents for CgroupMemoryEvents {
    fn read(&mut self) -> io::Result<Counts> {
        // The file is a few short lines; no allocation per read.
        let mut buf = [0u8; 512];
        let mut file = File::open(&self.path)?;
        let mut len = 0;
        loop {
            match file.read(&mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => {
                    len += n;
                    if len == buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        std::str::from_utf8(&buf[..len])
            .ok()
            .and_then(parse_counts)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("no oom_kill count in {}", self.path.display()),
                )
            })
    }
}

/// The watch on a live container's cgroup: the count and the inotify
/// descriptor whose readiness means the file changed.
pub(crate) struct HostOomWatch {
    pub(crate) watch: OomWatch<CgroupMemoryEvents>,
    pub(crate) inotify: File,
}

impl HostOomWatch {
    /// Watches the cgroup of process `pid` (the container's init); `None`
    /// (with a diagnostic when unexpected) where there is nothing to watch.
    pub(crate) fn start(pid: libc::pid_t) -> Option<Self> {
        if !is_cgroup2(Path::new(CGROUP2_ROOT)) {
            return None;
        }
        let text = match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
            Ok(t) => t,
            Err(e) => {
                diag!("read the cgroup of {pid}: {e}; OOM kills not watched");
                return None;
            }
        };
        let cgroup = unified_path(&text)?;
        let path = Path::new(CGROUP2_ROOT)
            .join(cgroup.trim_start_matches('/'))
            .join("memory.events");
        // Watched before the first read: no change falls between the two.
        let inotify = match watch_modify(&path) {
            Ok(fd) => File::from(fd),
            Err(e) => {
                // No memory controller in the container's cgroup.
                if e.kind() != io::ErrorKind::NotFound {
                    diag!("watch {}: {e}; OOM kills not watched", path.display());
                }
                return None;
            }
        };
        let watch = OomWatch::start(CgroupMemoryEvents { path })?;
        Some(Self { watch, inotify })
    }

    /// The inotify descriptor is readable: reads the counts if the file
    /// changed.
    pub(crate) fn notified(&mut self) {
        if self.drain() {
            self.watch.changed();
        }
    }

    /// Init was reaped: the last read (see [`OomWatch::exited`]).
    pub(crate) fn exited(&mut self) {
        let pending = self.drain();
        self.watch.exited(pending);
    }

    /// Reads every queued event; whether one was a modification.
    fn drain(&mut self) -> bool {
        let mut buf = [0u8; 1024];
        let mut modified = false;
        loop {
            match (&self.inotify).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => modified |= has_modify(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock: drained.
                Err(_) => break,
            }
        }
        modified
    }
}

/// Whether `path` is a cgroup2 mount.
fn is_cgroup2(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs reads the nul-terminated path and writes the zeroed
    // struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    // f_type's type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    magic == CGROUP2_SUPER_MAGIC
}

/// A non-blocking inotify descriptor watching `path` for modifications.
fn watch_modify(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a nul byte"))?;
    // SAFETY: inotify_init1 takes flags only.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just returned by the kernel; nothing else
    // owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: reads the nul-terminated path we own, on our descriptor.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_MODIFY) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// Counts served in turn; an exhausted list reads as a removed cgroup.
    struct Reads(VecDeque<Counts>);

    impl MemoryEvents for Reads {
        fn read(&mut self) -> io::Result<Counts> {
            self.0
                .pop_front()
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))
        }
    }

    fn kills(oom_kill: u64) -> Counts {
        Counts {
            oom_kill,
            ..Counts::default()
        }
    }

    fn watch(reads: &[Counts]) -> OomWatch<Reads> {
        OomWatch::start(Reads(reads.iter().copied().collect())).unwrap_or_else(|| {
            panic!("the first read is there");
        })
    }

    #[test]
    fn oom_watch_should_say_killed_when_the_count_grew_by_the_exit() {
        let mut w = watch(&[kills(0), kills(1)]);
        w.exited(false);
        assert_eq!(w.verdict(), Some(true));
    }

    #[test]
    fn oom_watch_should_say_killed_when_a_change_saw_growth_and_the_cgroup_went_first() {
        // The kill read on its change; the cgroup gone at the exit.
        let mut w = watch(&[kills(2), kills(2), kills(3)]);
        w.changed();
        w.changed();
        w.exited(true);
        assert_eq!(w.verdict(), Some(true));
    }

    #[test]
    fn oom_watch_should_say_not_killed_when_the_exit_read_saw_no_growth() {
        let mut w = watch(&[kills(4), kills(4)]);
        w.exited(false);
        assert_eq!(w.verdict(), Some(false));
        // A second exit does not read again.
        w.exited(true);
        assert_eq!(w.verdict(), Some(false));
    }

    #[test]
    fn oom_watch_should_say_not_killed_for_a_container_gone_quietly_with_its_cgroup() {
        // Killed otherwise, never at its limit, nothing notified: the
        // scope removed before the exit read changes nothing.
        let mut w = watch(&[kills(0)]);
        w.exited(false);
        assert_eq!(w.verdict(), Some(false));
    }

    #[test]
    fn oom_watch_should_not_guess_when_the_cgroup_went_with_a_change_unread() {
        let mut w = watch(&[kills(0)]);
        w.exited(true);
        assert_eq!(w.verdict(), None);
        // A change whose read failed is unread too.
        let mut w = watch(&[kills(0)]);
        w.changed();
        w.exited(false);
        assert_eq!(w.verdict(), None);
    }

    #[test]
    fn oom_watch_should_not_guess_when_the_cgroup_went_after_the_limit_was_reached() {
        let at_limit = Counts {
            max: 5,
            oom: 1,
            oom_kill: 0,
        };
        let mut w = watch(&[kills(0), at_limit]);
        w.changed();
        w.exited(false);
        assert_eq!(w.verdict(), None);
    }

    #[test]
    fn oom_watch_should_not_start_without_counts() {
        assert!(OomWatch::start(Reads(VecDeque::new())).is_none());
    }

    #[test]
    fn memory_events_should_give_the_counts() {
        let text = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(
            parse_counts(text),
            Some(Counts {
                max: 12,
                oom: 1,
                oom_kill: 1
            })
        );
        assert_eq!(parse_counts("oom 3\n"), None);
    }

    #[test]
    fn inotify_events_should_be_told_modified_or_not() {
        let event = |mask: u32, name_len: u32| {
            let mut e = Vec::new();
            for word in [1u32, mask, 0, name_len] {
                e.extend_from_slice(&word.to_ne_bytes());
            }
            e.extend(std::iter::repeat_n(0u8, name_len as usize));
            e
        };
        let mut buf = event(libc::IN_IGNORED, 0);
        assert!(!has_modify(&buf));
        buf.extend(event(libc::IN_MODIFY, 16));
        assert!(has_modify(&buf));
        assert!(!has_modify(&buf[..10]));
    }

    #[test]
    fn proc_cgroup_should_give_the_unified_path() {
        let v2 = "0::/petrel.slice/petrel-p.slice/petrel-c1.scope\n";
        assert_eq!(
            unified_path(v2),
            Some("/petrel.slice/petrel-p.slice/petrel-c1.scope")
        );
        let hybrid = "12:memory:/petrel/c1\n1:name=systemd:/petrel/c1\n0::/petrel/c1\n";
        assert_eq!(unified_path(hybrid), Some("/petrel/c1"));
        assert_eq!(unified_path("4:memory:/x\n"), None);
    }
}
