//! CPU time of a set of processes from a cgroup of their own: the kernel's
//! nanosecond accounting of every thread in it, threads that exit and
//! children forked meanwhile (a `runc` the runtime starts) included. The
//! `/proc/<pid>/stat` figures count in clock ticks (10 ms here), too coarse
//! for an idle agent's 10-20 ms a minute.
//!
//! The processes are moved in for a measurement only and moved back to
//! where they were afterwards. On cgroup v1 the group lives in the cpuacct
//! hierarchy alone where that hierarchy is mounted on its own (as here),
//! so no scheduling setting changes; on v2 it is a leaf of the unified
//! hierarchy without controllers (`cpu.stat` is always there).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

const ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// `cpuacct.usage` in nanoseconds.
    V1,
    /// `cpu.stat`'s `usage_usec`.
    V2,
}

/// A cgroup made to account the CPU time of the processes moved into it.
#[derive(Debug)]
pub struct CpuGroup {
    version: Version,
    /// The hierarchy's mount point.
    hierarchy: PathBuf,
    dir: PathBuf,
    /// Each process moved in and the cgroup it came from.
    moved: Vec<(u32, PathBuf)>,
}

impl CpuGroup {
    /// Creates cgroup `path` (absolute within the hierarchy, e.g.
    /// `/petrel-bench-<id>/idle-cpu`) in the cpuacct hierarchy, or in the
    /// unified one on a v2 host.
    pub fn create(path: &str) -> Result<CpuGroup> {
        let rel = path.trim_start_matches('/');
        let (version, hierarchy) = if Path::new(ROOT).join("cpuacct/cpuacct.usage").exists() {
            (Version::V1, Path::new(ROOT).join("cpuacct"))
        } else if Path::new(ROOT).join("cgroup.controllers").exists() {
            (Version::V2, PathBuf::from(ROOT))
        } else {
            bail!("neither a cpuacct hierarchy nor cgroup v2 at {ROOT}");
        };
        let dir = hierarchy.join(rel);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(CpuGroup {
            version,
            hierarchy,
            dir,
            moved: vec![],
        })
    }

    /// Moves each of `pids` (with all its threads) into the group,
    /// remembering its cgroup to move it back to.
    pub fn enter(&mut self, pids: &[u32]) -> Result<()> {
        for &pid in pids {
            let from = self.cgroup_of(pid)?;
            write_procs(&self.dir, pid)?;
            self.moved.push((pid, from));
        }
        Ok(())
    }

    /// CPU time used in the group since it was made.
    pub fn usage(&self) -> Result<Duration> {
        match self.version {
            Version::V1 => {
                let f = self.dir.join("cpuacct.usage");
                let text =
                    std::fs::read_to_string(&f).with_context(|| format!("read {}", f.display()))?;
                let ns: u64 = text
                    .trim()
                    .parse()
                    .with_context(|| format!("parse {}", f.display()))?;
                Ok(Duration::from_nanos(ns))
            }
            Version::V2 => {
                let f = self.dir.join("cpu.stat");
                let text =
                    std::fs::read_to_string(&f).with_context(|| format!("read {}", f.display()))?;
                parse_usage_usec(&text)
                    .map(Duration::from_micros)
                    .ok_or_else(|| anyhow!("no usage_usec in {}", f.display()))
            }
        }
    }

    /// Moves every process back where it came from (processes that exited
    /// meanwhile are skipped, ones forked inside go to the hierarchy's root)
    /// and removes the group.
    pub fn leave(mut self) -> Result<()> {
        self.restore()
    }

    fn restore(&mut self) -> Result<()> {
        let mut first_err = None;
        for (pid, from) in std::mem::take(&mut self.moved) {
            if let Err(e) = write_procs(&from, pid) {
                if Path::new(&format!("/proc/{pid}")).exists() {
                    first_err.get_or_insert(e);
                }
            }
        }
        let left = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in left.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            // Exits race with the write; what is still here must go.
            let _ = write_procs(&self.hierarchy, pid);
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                first_err.get_or_insert(anyhow!("remove {}: {e}", self.dir.display()));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The directory of `pid`'s cgroup in this group's hierarchy.
    fn cgroup_of(&self, pid: u32) -> Result<PathBuf> {
        let f = format!("/proc/{pid}/cgroup");
        let text = std::fs::read_to_string(&f).with_context(|| format!("read {f}"))?;
        let rel = own_path(&text, self.version)
            .ok_or_else(|| anyhow!("{f} names no {:?} cgroup", self.version))?;
        Ok(self.hierarchy.join(rel.trim_start_matches('/')))
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        if !self.moved.is_empty() || self.dir.exists() {
            if let Err(e) = self.restore() {
                eprintln!("petrel-bench: {e:#}");
            }
        }
    }
}

fn write_procs(dir: &Path, pid: u32) -> Result<()> {
    let f = dir.join("cgroup.procs");
    std::fs::write(&f, pid.to_string()).with_context(|| format!("move {pid} into {}", f.display()))
}

/// The path of the cpuacct (v1) or unified (v2) line of a
/// `/proc/<pid>/cgroup` text.
fn own_path(text: &str, version: Version) -> Option<&str> {
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match version {
            Version::V1 => ctrls.split(',').any(|c| c == "cpuacct"),
            Version::V2 => ctrls.is_empty(),
        };
        wanted.then_some(path)
    })
}

fn parse_usage_usec(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    const HYBRID: &str = "9:name=systemd:/\n4:memory:/a/b\n2:cpuacct:/x\n1:cpu:/\n0::/u\n";

    #[test]
    fn own_path_should_pick_the_cpuacct_line_on_v1_and_the_unified_on_v2() {
        assert_eq!(own_path(HYBRID, Version::V1), Some("/x"));
        assert_eq!(own_path(HYBRID, Version::V2), Some("/u"));
        let comounted = "3:cpu,cpuacct:/y\n";
        assert_eq!(own_path(comounted, Version::V1), Some("/y"));
        assert_eq!(own_path("4:memory:/a\n", Version::V1), None);
    }

    #[test]
    fn usage_usec_should_be_read_from_cpu_stat() {
        let stat = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n";
        assert_eq!(parse_usage_usec(stat), Some(123456));
        assert_eq!(parse_usage_usec("user_usec 1\n"), None);
    }

    #[test]
    fn a_group_should_count_the_cpu_of_a_process_moved_in_and_give_it_back() {
        if !rustix::process::getuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let name = format!("/petrel-bench-unit-{}", std::process::id());
        let mut g = CpuGroup::create(&name).expect("create");
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .spawn()
            .expect("spawn");
        g.enter(&[child.id()]).expect("enter");
        child.wait().expect("wait");
        let used = g.usage().expect("usage");
        assert!(used > Duration::from_millis(1), "{used:?}");
        let dir = g.dir.clone();
        g.leave().expect("leave");
        assert!(!dir.exists());
    }
}
