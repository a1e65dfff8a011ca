//! Notifications that run an eviction pass at once instead of at the next
//! periodic one.
//!
//! - cgroup v1: a memory threshold on `memory.usage_in_bytes` registered
//!   through `cgroup.event_control` with an eventfd, which the kernel
//!   signals when usage crosses it (either way). The threshold is the usage
//!   at which the signal's available amount reaches the eviction threshold,
//!   `capacity − threshold + inactive_file`, so it is recomputed (and
//!   re-registered) as the page cache moves.
//! - cgroup v2: a PSI trigger on the node cgroup's `memory.pressure` in
//!   the cgroup2 hierarchy (also the `unified` mount of a hybrid v1 host,
//!   where PSI is accounted without the memory controller), or on
//!   `/proc/pressure/memory` for the whole machine, signalled with POLLPRI
//!   when memory stalls pass the trigger's share of its window. Windows
//!   must be multiples of 2 s when the caller lacks CAP_SYS_RESOURCE, so
//!   the window is rounded up to one.
//! - cgroup v2: no usage threshold exists, so `memory.current` is read
//!   by a thread instead, every 100 ms while usage is far from the
//!   threshold and every 50 ms within a quarter of it, waking a pass
//!   when usage crosses it (either way, as v1's threshold does).
//! - cgroup v2 with the memory controller: `memory.events`, whose `high`,
//!   `max`, `oom` and `oom_kill` counters the kernel announces through
//!   kernfs (POLLPRI on the open file); a counter that grows wakes a pass.

use std::collections::HashMap;
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
#[derive(Debug, Clone)]
enum Kind {
    /// An eventfd: readable, and its counter must be read.
    EventFd,
    /// A PSI trigger: POLLPRI.
    Psi,
    /// A kernfs file of `key value` lines (`memory.events`,
    /// `cgroup.events`): POLLPRI (with POLLERR) when the kernel announces
    /// a change; the file is read again to re-arm, and `notify` is woken
    /// only when one of `keys` changed.
    Events { keys: &'static [&'static str] },
    /// A v2 `memory.current`, read on a timer: the usage crossing
    /// `bytes` (either way) wakes `notify`.
    Usage { bytes: i64 },
}

/// How often a v2 usage watch reads `memory.current` far from its
/// threshold: one allocation can jump the whole way, so this bounds the
/// reaction (P39: p99 within 200 ms); a read costs a few microseconds...
const USAGE_POLL_FAR: std::time::Duration = std::time::Duration::from_millis(100);
/// ...and within a quarter of it, where a crossing may come at any time.
const USAGE_POLL_NEAR: std::time::Duration = std::time::Duration::from_millis(50);

/// The next read of a usage watch: sooner when `usage` is within a
/// quarter of `bytes` (or past it).
pub fn usage_poll_interval(usage: i64, bytes: i64) -> std::time::Duration {
    if usage >= bytes - bytes / 4 {
        USAGE_POLL_NEAR
    } else {
        USAGE_POLL_FAR
    }
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

/// The values of `keys` in a flat keyed file's text (`high 3`).
pub fn parse_events(text: &str, keys: &[&str]) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            keys.contains(&k)
                .then(|| Some((k.to_string(), v.trim().parse().ok()?)))?
        })
        .collect()
}

/// Reads the whole of a kernfs file from its start (which also re-arms
/// its notification).
fn read_from_start(fd: &OwnedFd) -> Option<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match rustix::io::pread(fd, &mut buf, out.len() as u64) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return None,
        }
    }
    String::from_utf8(out).ok()
}

fn watch(fd: OwnedFd, stop: OwnedFd, kind: Kind, notify: Arc<Notify>) {
    use rustix::event::{PollFd, PollFlags};
    if let Kind::Usage { bytes } = kind {
        return watch_usage(&fd, &stop, bytes, &notify);
    }
    let flags = match kind {
        Kind::EventFd | Kind::Usage { .. } => PollFlags::IN,
        Kind::Psi | Kind::Events { .. } => PollFlags::PRI,
    };
    let mut last = match &kind {
        Kind::Events { keys } => read_from_start(&fd).map(|t| parse_events(&t, keys)),
        _ => None,
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
        if let Kind::Events { keys } = &kind {
            // kernfs flags a change with POLLPRI and POLLERR together.
            if ev.intersects(PollFlags::NVAL) {
                tracing::warn!("memory events descriptor failed; polling only");
                return;
            }
            if ev.intersects(PollFlags::PRI | PollFlags::ERR) {
                let Some(now) = read_from_start(&fd).map(|t| parse_events(&t, keys)) else {
                    tracing::warn!("memory events file unreadable; polling only");
                    return;
                };
                if last.as_ref() != Some(&now) {
                    last = Some(now);
                    notify.notify_one();
                }
            }
            continue;
        }
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

/// Reads `memory.current` (open as `fd`) until `stop` is readable, waking
/// `notify` whenever the usage crosses `bytes`.
fn watch_usage(fd: &OwnedFd, stop: &OwnedFd, bytes: i64, notify: &Notify) {
    use rustix::event::{PollFd, PollFlags};
    let read = || read_from_start(fd).and_then(|t| t.trim().parse::<i64>().ok());
    let Some(mut usage) = read() else {
        tracing::warn!("memory.current unreadable; polling only");
        return;
    };
    loop {
        let wait = usage_poll_interval(usage, bytes);
        let timeout = rustix::event::Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let mut fds = [PollFd::new(stop, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => {}
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "memory usage watch failed; polling only");
                return;
            }
        }
        let Some(now) = read() else {
            // The cgroup went: its watch is replaced at the next pass.
            return;
        };
        if (usage < bytes) != (now < bytes) {
            notify.notify_one();
        }
        usage = now;
    }
}

/// A registered v1 memory threshold, or its v2 stand-in (a usage watch);
/// dropping it unregisters it (the kernel drops the event when its eventfd
/// is closed) or stops the watch.
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

/// Watches `memory.current` of the v2 cgroup directory `dir` for usage
/// crossing `bytes` (v2 has no threshold notification); each crossing
/// wakes `notify`.
pub fn memory_usage_watch(
    dir: &Path,
    bytes: i64,
    notify: Arc<Notify>,
) -> Result<MemcgThreshold, NotifyError> {
    let path = dir.join("memory.current");
    let file = std::fs::File::open(&path).map_err(err("open", &path))?;
    let fd = OwnedFd::from(file.try_clone().map_err(err("dup", &path))?);
    Ok(MemcgThreshold {
        bytes,
        _watcher: Watcher::start(fd, Kind::Usage { bytes }, notify, dir)?,
        _usage: file,
    })
}

/// The eviction manager's PSI trigger: 100 ms of memory stalls...
pub const PSI_STALL_US: u64 = 100_000;
/// ...within a 2 s window.
pub const PSI_WINDOW_US: u64 = 2_000_000;
/// The kernel's unit for the windows of callers without
/// CAP_SYS_RESOURCE (any other window is EINVAL for them).
const PSI_WINDOW_STEP_US: u64 = 2_000_000;
/// The kernel's longest window.
const PSI_WINDOW_MAX_US: u64 = 10_000_000;

/// The trigger line the kernel accepts for `stall_us` in `window_us`
/// from any caller: the window rounded up to a multiple of 2 s (at most
/// 10 s), the stall within 1 µs and the window.
pub fn psi_trigger_line(stall_us: u64, window_us: u64) -> String {
    let window = window_us
        .div_ceil(PSI_WINDOW_STEP_US)
        .max(1)
        .saturating_mul(PSI_WINDOW_STEP_US)
        .min(PSI_WINDOW_MAX_US);
    let stall = stall_us.clamp(1, window);
    format!("some {stall} {window}")
}

/// The pressure file whose memory stalls stand for the node's: the node
/// cgroup's `memory.pressure` in the cgroup2 hierarchy (v2, or the
/// `unified` mount of a hybrid host) when it exists, else, without a node
/// cgroup, the machine's `/proc/pressure/memory`. None when there is
/// nothing to watch (a node cgroup absent from the cgroup2 hierarchy, a
/// kernel without PSI).
pub fn pressure_file(
    cgroups: &petrel_oci::cgroups::Cgroups,
    node_cgroup: Option<&str>,
) -> Option<PathBuf> {
    let path = match node_cgroup {
        Some(cg) => cgroups.unified_dir(cg)?.join("memory.pressure"),
        None => PathBuf::from("/proc/pressure/memory"),
    };
    path.exists().then_some(path)
}

/// A registered PSI trigger; dropping it removes it.
#[derive(Debug)]
pub struct PsiTrigger {
    /// The trigger as written.
    pub line: String,
    _watcher: Watcher,
}

/// Registers `some <stall_us> <window_us>` (as [`psi_trigger_line`] makes
/// it valid) on the pressure file `path` (`<cgroup>/memory.pressure` or
/// `/proc/pressure/memory`); each trigger wakes `notify`.
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
    let line = psi_trigger_line(stall_us, window_us);
    f.write_all(format!("{line}\0").as_bytes())
        .map_err(err("write", path))?;
    Ok(PsiTrigger {
        line,
        _watcher: Watcher::start(OwnedFd::from(f), Kind::Psi, notify, path)?,
    })
}

/// The counters of `memory.events` that mean the cgroup ran into its
/// limits.
pub const MEMORY_EVENTS: &[&str] = &["high", "max", "oom", "oom_kill"];

/// A watch on a kernfs events file; dropping it ends it.
#[derive(Debug)]
pub struct EventsWatch {
    _watcher: Watcher,
}

/// Watches the flat keyed kernfs file `path` (a v2 cgroup's
/// `memory.events`, with [`MEMORY_EVENTS`]); `notify` is woken whenever
/// one of `keys` changes.
pub fn events_watch(
    path: &Path,
    keys: &'static [&'static str],
    notify: Arc<Notify>,
) -> Result<EventsWatch, NotifyError> {
    let f = std::fs::File::open(path).map_err(err("open", path))?;
    Ok(EventsWatch {
        _watcher: Watcher::start(OwnedFd::from(f), Kind::Events { keys }, notify, path)?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn psi_windows_should_be_what_the_kernel_accepts_without_cap_sys_resource() {
        assert_eq!(
            psi_trigger_line(PSI_STALL_US, PSI_WINDOW_US),
            "some 100000 2000000"
        );
        assert_eq!(psi_trigger_line(150_000, 1_000_000), "some 150000 2000000");
        assert_eq!(psi_trigger_line(500_000, 3_000_000), "some 500000 4000000");
        assert_eq!(psi_trigger_line(0, 0), "some 1 2000000");
        assert_eq!(
            psi_trigger_line(u64::MAX, 60_000_000),
            "some 10000000 10000000"
        );
    }

    #[test]
    fn memory_events_should_parse_the_limit_counters() {
        let text = "low 0\nhigh 3\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        let e = parse_events(text, MEMORY_EVENTS);
        assert_eq!(e.len(), 4);
        assert_eq!(e["max"], 12);
        assert_eq!(e["high"], 3);
        assert!(!e.contains_key("low"));
        assert!(parse_events("populated x\n", &["populated"]).is_empty());
    }

    /// A cgroup made for a test in the cgroup2 hierarchy (and, on a hybrid
    /// host, in the v1 memory hierarchy), with the processes it started;
    /// all removed on drop, also when the test fails.
    struct TestCgroup {
        name: String,
        dirs: Vec<PathBuf>,
        children: Vec<std::process::Child>,
    }

    impl TestCgroup {
        fn new(prefix: &str) -> Self {
            let name = format!("/petrel-{prefix}-{}-{}", std::process::id(), rand_u32());
            Self {
                name,
                dirs: Vec::new(),
                children: Vec::new(),
            }
        }

        fn make(&mut self, dir: PathBuf) -> PathBuf {
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            self.dirs.push(dir.clone());
            dir
        }
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
            for d in self.dirs.iter().rev() {
                // A killed task leaves its cgroup a moment later.
                for _ in 0..100 {
                    if std::fs::remove_dir(d).is_ok() || !d.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    fn rand_u32() -> u32 {
        rand::random()
    }

    /// The PSI path for real: a node cgroup in the cgroup2 hierarchy
    /// (hybrid here: `/sys/fs/cgroup/unified`, no memory controller) and a
    /// process in it thrashing its page cache under a small memory limit
    /// (here set in the v1 memory hierarchy: memory stalls are accounted
    /// per task, so they show in its cgroup2 group's memory.pressure). The
    /// manager's own trigger (path, stall, window) must fire.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_psi_trigger_should_fire_when_the_node_cgroup_stalls_on_memory() {
        let cgroups = petrel_oci::cgroups::Cgroups::detect().unwrap();
        let mut cg = TestCgroup::new("psi");
        let name = cg.name.clone();
        let unified = cgroups
            .unified_dir(&name)
            .expect("a cgroup2 hierarchy (v2, or hybrid with a unified mount)");
        let v2 = cgroups.version() == petrel_oci::cgroups::CgroupVersion::V2;
        let unified = cg.make(unified);
        // The limit: v2's own memory.max; v1's memory hierarchy.
        let memcg = if v2 {
            std::fs::write(unified.join("memory.max"), "16777216").unwrap();
            unified.clone()
        } else {
            let d = cg.make(cgroups.dir("memory", &name).unwrap());
            std::fs::write(d.join("memory.limit_in_bytes"), "16777216").unwrap();
            d
        };
        let path = pressure_file(&cgroups, Some(&name)).expect("memory.pressure");
        assert_eq!(path, unified.join("memory.pressure"));
        assert!(pressure_file(&cgroups, Some("/petrel-no-such-cgroup-h28")).is_none());

        let notify = Arc::new(Notify::new());
        let trigger = psi_trigger(&path, PSI_STALL_US, PSI_WINDOW_US, Arc::clone(&notify))
            .expect("the manager's PSI trigger is accepted");
        assert_eq!(trigger.line, "some 100000 2000000");
        // Quiet: no stalls, no trigger.
        assert!(
            tokio::time::timeout(Duration::from_secs(3), notify.notified())
                .await
                .is_err(),
            "a trigger without stalls"
        );

        let scratch = tempfile::tempdir().unwrap();
        let file = scratch.path().join("big");
        let script = format!(
            "echo $$ > {procs2}; echo $$ > {procs1}; head -c 67108864 /dev/urandom > {f}; \
             while :; do cat {f} > /dev/null; done",
            procs2 = unified.join("cgroup.procs").display(),
            procs1 = memcg.join("cgroup.procs").display(),
            f = file.display(),
        );
        cg.children.push(
            std::process::Command::new("sh")
                .args(["-c", &script])
                .spawn()
                .unwrap(),
        );
        let fired = tokio::time::timeout(Duration::from_secs(20), notify.notified()).await;
        let pressure = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            fired.is_ok(),
            "no PSI trigger; {}: {pressure}",
            path.display()
        );
        drop(trigger);
    }

    /// kernfs events (the mechanism behind `memory.events`, which needs the
    /// memory controller in the cgroup2 hierarchy): watched here on
    /// `cgroup.events`, which every cgroup2 group has; `populated` moves
    /// when a process joins and leaves.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_kernfs_events_watch_should_fire_when_a_counter_moves() {
        let cgroups = petrel_oci::cgroups::Cgroups::detect().unwrap();
        let mut cg = TestCgroup::new("events");
        let dir = cg.make(cgroups.unified_dir(&cg.name.clone()).expect("cgroup2"));
        let notify = Arc::new(Notify::new());
        let watch = events_watch(
            &dir.join("cgroup.events"),
            &["populated"],
            Arc::clone(&notify),
        )
        .unwrap();
        // A write that changes nothing watched does not wake it.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), notify.notified())
                .await
                .is_err()
        );
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        cg.children.push(child);
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), notify.notified())
            .await
            .expect("populated 1 announced");
        for c in &mut cg.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        tokio::time::timeout(Duration::from_secs(5), notify.notified())
            .await
            .expect("populated 0 announced");
        drop(watch);
        assert!(events_watch(&dir.join("memory.no-such-file"), MEMORY_EVENTS, notify).is_err());
    }

    /// On cgroup v2 with the memory controller: a task over its cgroup's
    /// `memory.max` moves `max` (and the OOM counters) in `memory.events`,
    /// which the watch announces.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "cgroup v2 with the memory controller: runs inside the VM (e2e_cgroup_v2)"]
    async fn a_memory_events_watch_should_fire_when_a_task_hits_memory_max() {
        let cgroups = petrel_oci::cgroups::Cgroups::detect().unwrap();
        assert_eq!(
            cgroups.version(),
            petrel_oci::cgroups::CgroupVersion::V2,
            "not a cgroup v2 host"
        );
        let mut cg = TestCgroup::new("memevents");
        let dir = cg.make(cgroups.unified_dir(&cg.name.clone()).expect("cgroup2"));
        std::fs::write(dir.join("memory.max"), (16u64 << 20).to_string()).unwrap();
        std::fs::write(dir.join("memory.swap.max"), "0").unwrap();
        let notify = Arc::new(Notify::new());
        let watch = events_watch(
            &dir.join("memory.events"),
            MEMORY_EVENTS,
            Arc::clone(&notify),
        )
        .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(500), notify.notified())
                .await
                .is_err(),
            "nothing happened yet"
        );
        // A shell that joins the cgroup, then grows a string past the limit.
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && a=x && while true; do a=$a$a; done",
                dir.display()
            ))
            .spawn()
            .unwrap();
        cg.children.push(child);
        tokio::time::timeout(Duration::from_secs(30), notify.notified())
            .await
            .expect("memory.events announced a limit event");
        let text = std::fs::read_to_string(dir.join("memory.events")).unwrap();
        let counts = parse_events(&text, MEMORY_EVENTS);
        assert!(counts.get("max").is_some_and(|n| *n > 0), "{text}");
        drop(watch);
    }

    #[test]
    fn a_usage_watch_should_read_often_only_near_its_threshold() {
        assert_eq!(usage_poll_interval(100, 1000), USAGE_POLL_FAR);
        assert_eq!(usage_poll_interval(749, 1000), USAGE_POLL_FAR);
        assert_eq!(usage_poll_interval(750, 1000), USAGE_POLL_NEAR);
        assert_eq!(usage_poll_interval(5000, 1000), USAGE_POLL_NEAR);
    }

    /// A plain file stands in for `memory.current`: the watch reads it
    /// again from the start each time. Values are overwritten in place at
    /// one width, as the kernel's file never reads empty (a truncating
    /// write could be read between its truncation and its bytes).
    #[tokio::test]
    async fn a_usage_watch_should_fire_when_usage_crosses_its_threshold_either_way() {
        use std::os::unix::fs::FileExt as _;
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("memory.current");
        std::fs::write(&current, "0900\n").unwrap();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&current)
            .unwrap();
        let set = |v: &str| file.write_all_at(v.as_bytes(), 0).unwrap();
        let notify = Arc::new(Notify::new());
        let watch = memory_usage_watch(dir.path(), 1000, Arc::clone(&notify)).unwrap();
        assert_eq!(watch.bytes, 1000);
        let fired = |within| {
            let n = Arc::clone(&notify);
            async move { tokio::time::timeout(within, n.notified()).await.is_ok() }
        };
        assert!(!fired(Duration::from_millis(300)).await, "no crossing yet");
        set("1100\n");
        assert!(fired(Duration::from_secs(5)).await, "up across");
        set("1200\n");
        assert!(!fired(Duration::from_millis(300)).await, "still above");
        set("0500\n");
        assert!(fired(Duration::from_secs(5)).await, "down across");
        drop(watch);
    }

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
