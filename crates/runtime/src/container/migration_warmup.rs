//! Starts the kernel's wait for a cgroup migration before `runc create`
//! needs it.
//!
//! Moving a process into a cgroup (a write to `cgroup.procs`, which runc
//! does for the container's init, once per v1 hierarchy) takes the kernel's
//! global `cgroup_threadgroup_rwsem` for writing. Its write side first waits
//! for a full RCU grace period unless another writer left it less than a
//! grace period ago: the first migration after a quiet spell blocks for a
//! grace period (4-20 ms on the 250 Hz test VM), and that wait sat on every
//! create's critical path, most of CreateContainer's excess over plain runc
//! (measured with `perf sched` stacks: `percpu_down_write` ←
//! `cgroup_procs_write_start`).
//!
//! At the start of a create the runtime moves itself into the cgroup it is
//! already in (a no-op migration) on a blocking thread. Its wait for the
//! grace period then overlaps the rootfs, the spec, the shim and runc's own
//! start-up, and runc's write finds the lock warm. At most one such write is
//! in flight; concurrent creates share it. Nothing else changes: the
//! runtime's membership is the same before and after. A host where the write
//! is refused (no writable `cgroup.procs` of our own) simply goes without.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use petrel_oci::cgroups::Cgroups;

/// Warms the cgroup migration lock ahead of a `runc create`.
#[derive(Debug)]
pub struct MigrationWarmup {
    /// `cgroup.procs` of the runtime's own cgroup; None when unknown.
    procs: Option<PathBuf>,
    /// Contents written: the runtime's pid.
    pid: String,
    in_flight: AtomicBool,
    /// Set after the first refused write; later creates skip the warm-up.
    disabled: AtomicBool,
}

impl MigrationWarmup {
    /// Finds the runtime's own cgroup from `/proc/self/cgroup`.
    pub fn new(cgroups: &Cgroups) -> Self {
        let procs = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|text| own_procs_file(cgroups, &text));
        Self {
            procs,
            pid: std::process::id().to_string(),
            in_flight: AtomicBool::new(false),
            disabled: AtomicBool::new(false),
        }
    }

    /// Starts a no-op migration of the runtime on a blocking thread, unless
    /// one is already under way. Returns at once.
    pub fn start(self: &Arc<Self>) {
        if self.procs.is_none()
            || self.disabled.load(Ordering::Relaxed)
            || self.in_flight.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(procs) = &this.procs {
                if let Err(e) = std::fs::write(procs, &this.pid) {
                    this.disabled.store(true, Ordering::Relaxed);
                    tracing::debug!(path = %procs.display(), error = %e, "cgroup migration warm-up refused; creates go without it");
                }
            }
            this.in_flight.store(false, Ordering::Release);
        });
    }
}

/// The `cgroup.procs` file of the cgroup `/proc/self/cgroup` names: the
/// cgroup2 entry where there is a cgroup2 mount (v2, or hybrid v1), else the
/// first v1 hierarchy found mounted.
fn own_procs_file(cgroups: &Cgroups, proc_self_cgroup: &str) -> Option<PathBuf> {
    let entries: Vec<(&str, &str)> = proc_self_cgroup
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            Some((parts.next()?, parts.next()?))
        })
        .collect();
    let unified = entries
        .iter()
        .find(|(controllers, _)| controllers.is_empty())
        .and_then(|(_, path)| cgroups.unified_dir(path));
    let dir = unified.or_else(|| {
        entries.iter().find_map(|(controllers, path)| {
            controllers
                .split(',')
                .filter(|c| !c.is_empty() && !c.starts_with("name="))
                .find_map(|c| cgroups.dir(c, path).ok())
        })
    })?;
    let procs = dir.join("cgroup.procs");
    procs.is_file().then_some(procs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_entry_should_be_preferred_and_v1_used_without_one() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let unified = dir.path().join("unified");
        let pids = dir.path().join("pids");
        for d in [unified.join("a/b"), pids.join("x")] {
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join("cgroup.procs"), "")?;
        }
        let mountinfo = format!(
            "30 25 0:26 / {} rw shared:5 - cgroup2 cgroup2 rw\n\
             31 25 0:27 / {} rw shared:6 - cgroup cgroup rw,pids\n",
            unified.display(),
            pids.display()
        );
        let cg = Cgroups::v1_from_mountinfo(&mountinfo).map_err(std::io::Error::other)?;
        assert_eq!(
            own_procs_file(&cg, "8:pids:/x\n0::/a/b\n"),
            Some(unified.join("a/b/cgroup.procs"))
        );
        assert_eq!(
            own_procs_file(&cg, "9:name=systemd:/\n8:pids:/x\n"),
            Some(pids.join("x/cgroup.procs"))
        );
        // A cgroup that is not there (or not ours to find) gives nothing.
        assert_eq!(own_procs_file(&cg, "8:pids:/gone\n"), None);
        Ok(())
    }

    #[tokio::test]
    async fn the_warm_up_should_leave_the_process_where_it_was() -> std::io::Result<()> {
        let before = std::fs::read_to_string("/proc/self/cgroup")?;
        let cgroups = Cgroups::detect().map_err(std::io::Error::other)?;
        let warm = Arc::new(MigrationWarmup::new(&cgroups));
        assert!(warm.procs.is_some(), "no cgroup.procs found for {before:?}");
        warm.start();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while warm.in_flight.load(Ordering::Acquire) {
            assert!(
                std::time::Instant::now() < deadline,
                "warm-up still running"
            );
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        assert!(
            !warm.disabled.load(Ordering::Relaxed),
            "the write was refused"
        );
        assert_eq!(std::fs::read_to_string("/proc/self/cgroup")?, before);
        Ok(())
    }
}
