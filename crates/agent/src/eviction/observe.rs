//! Observing the node: memory of the node's memory cgroup (or the
//! machine), of the pods' cgroup, the agent root's filesystem and process
//! ids; and each pod's memory and processes from its cgroup.
//!
//! "The node" is the machine by default; with `--node-cgroup` it is that
//! cgroup, whose memory and pids limits stand for the node's capacity.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use petrel_oci::cgroups::{CgroupVersion, Cgroups};

use super::config::Reserved;
use super::signals::Signal;
use super::thresholds::{Observation, Observations};

/// Capacity and free space of a filesystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsStats {
    /// Total bytes.
    pub capacity: i64,
    /// Bytes available to unprivileged users.
    pub available: i64,
    /// Total inodes.
    pub inodes: i64,
    /// Free inodes.
    pub inodes_free: i64,
}

/// Memory of one cgroup (or the machine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// What stands for the total: the cgroup's limit, else the machine's
    /// memory.
    pub capacity: i64,
    /// Usage, page cache included.
    pub usage: i64,
    /// Usage minus inactive file pages.
    pub working_set: i64,
}

impl MemoryStats {
    /// Capacity minus working set.
    pub fn available(&self) -> i64 {
        (self.capacity - self.working_set).max(0)
    }
}

/// What node allocatable limits on the pods' cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatableLimits {
    /// Memory limit, bytes (None: nothing reserved).
    pub memory: Option<i64>,
    /// Process-id limit (None: nothing reserved).
    pub pids: Option<i64>,
}

/// One observation of the node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStats {
    /// When it was taken (monotonic).
    pub time: Instant,
    /// When it was taken (wall clock, for the summary).
    pub timestamp: SystemTime,
    /// The node's memory.
    pub memory: MemoryStats,
    /// The pods' cgroup (`<root>/kubepods`); capacity is its limit, else
    /// the node's capacity minus the reservations.
    pub allocatable_memory: MemoryStats,
    /// The agent root's filesystem.
    pub nodefs: Option<FsStats>,
    /// The runtime's image filesystem (from the runtime).
    pub imagefs: Option<FsStats>,
    /// The runtime's container filesystem (writable layers), when the
    /// runtime names one.
    pub containerfs: Option<FsStats>,
    /// Process-id capacity of the node.
    pub pids_capacity: i64,
    /// Processes (threads included) on the node.
    pub pids_used: i64,
}

/// Builds the observations of every signal from node statistics.
pub fn observations(s: &NodeStats) -> Observations {
    let at = |available: i64, capacity: i64| Observation {
        available,
        capacity,
        time: s.time,
    };
    let mut o = Observations::new();
    o.insert(
        Signal::MemoryAvailable,
        at(s.memory.available(), s.memory.capacity),
    );
    o.insert(
        Signal::AllocatableMemoryAvailable,
        at(
            s.allocatable_memory.available(),
            s.allocatable_memory.capacity,
        ),
    );
    if let Some(fs) = s.nodefs {
        o.insert(Signal::NodeFsAvailable, at(fs.available, fs.capacity));
        o.insert(Signal::NodeFsInodesFree, at(fs.inodes_free, fs.inodes));
    }
    // Without a separate image filesystem the node's stands for it, as
    // kubelet does when both are the same.
    if let Some(fs) = s.imagefs.or(s.nodefs) {
        o.insert(Signal::ImageFsAvailable, at(fs.available, fs.capacity));
        o.insert(Signal::ImageFsInodesFree, at(fs.inodes_free, fs.inodes));
    }
    if let Some(fs) = s.containerfs.or(s.imagefs).or(s.nodefs) {
        o.insert(Signal::ContainerFsAvailable, at(fs.available, fs.capacity));
        o.insert(Signal::ContainerFsInodesFree, at(fs.inodes_free, fs.inodes));
    }
    if s.pids_capacity > 0 {
        o.insert(
            Signal::PidAvailable,
            at((s.pids_capacity - s.pids_used).max(0), s.pids_capacity),
        );
    }
    o
}

/// What the node observer could not read.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// A cgroup file.
    #[error(transparent)]
    Cgroup(#[from] petrel_oci::cgroups::CgroupError),
    /// The pods' cgroup could not be made or limited (its unit, with the
    /// systemd driver).
    #[error(transparent)]
    Host(#[from] crate::qos_cgroups::HostError),
    /// A /proc file or statvfs.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Reads the node's statistics.
#[derive(Clone)]
pub struct NodeObserver {
    cgroups: Cgroups,
    node_cgroup: Option<String>,
    pods_cgroup: String,
    root: PathBuf,
    reserved: Reserved,
    /// How node allocatable's limits are set on the pods' cgroup (the
    /// cgroup driver's host); None: its files are written directly.
    host: Option<std::sync::Arc<dyn crate::qos_cgroups::CgroupHost>>,
}

impl std::fmt::Debug for NodeObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeObserver")
            .field("node_cgroup", &self.node_cgroup)
            .field("pods_cgroup", &self.pods_cgroup)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// The value of `key` (in kB) in /proc/meminfo's text, in bytes.
fn meminfo(text: &str, key: &str) -> Option<i64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: i64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb.saturating_mul(1024))
    })
}

/// The machine's memory from /proc/meminfo's text: capacity MemTotal,
/// usage MemTotal − MemFree, working set usage − Inactive(file).
pub fn machine_memory(text: &str) -> Option<MemoryStats> {
    let total = meminfo(text, "MemTotal")?;
    let free = meminfo(text, "MemFree")?;
    let inactive = meminfo(text, "Inactive(file)").unwrap_or(0);
    let usage = (total - free).max(0);
    Some(MemoryStats {
        capacity: total,
        usage,
        working_set: (usage - inactive).max(0),
    })
}

/// statvfs of `path`.
pub fn fs_stats(path: &Path) -> Result<FsStats, ObserveError> {
    let st = rustix::fs::statvfs(path).map_err(|e| ObserveError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let frsize = st.f_frsize as i64;
    Ok(FsStats {
        capacity: (st.f_blocks as i64).saturating_mul(frsize),
        available: (st.f_bavail as i64).saturating_mul(frsize),
        inodes: st.f_files as i64,
        inodes_free: st.f_ffree as i64,
    })
}

fn read_proc(path: &str) -> Result<String, ObserveError> {
    std::fs::read_to_string(path).map_err(|source| ObserveError::Io {
        path: path.into(),
        source,
    })
}

impl NodeObserver {
    /// An observer of `node_cgroup` (None: the machine) whose pods live
    /// in `pods_cgroup` (`<root>/kubepods`, or with systemd the expanded
    /// path of `kubepods.slice`), with the agent's state in `root`.
    pub fn new(
        cgroups: Cgroups,
        node_cgroup: Option<String>,
        pods_cgroup: &str,
        root: PathBuf,
        reserved: Reserved,
    ) -> Self {
        Self {
            cgroups,
            node_cgroup,
            pods_cgroup: pods_cgroup.to_string(),
            root,
            reserved,
            host: None,
        }
    }

    /// Node allocatable's limits go through `host` (the QoS cgroups'
    /// driver: with systemd, the slice's unit properties, which systemd
    /// would otherwise write over).
    pub fn with_host(mut self, host: std::sync::Arc<dyn crate::qos_cgroups::CgroupHost>) -> Self {
        self.host = Some(host);
        self
    }

    /// The cgroup hierarchies.
    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }

    /// The node's memory cgroup (None: the machine).
    pub fn node_cgroup(&self) -> Option<&str> {
        self.node_cgroup.as_deref()
    }

    /// The pods' cgroup.
    pub fn pods_cgroup(&self) -> &str {
        &self.pods_cgroup
    }

    /// The node's memory.
    pub fn node_memory(&self) -> Result<MemoryStats, ObserveError> {
        let machine =
            machine_memory(&read_proc("/proc/meminfo")?).ok_or_else(|| ObserveError::Io {
                path: "/proc/meminfo".into(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no MemTotal"),
            })?;
        let Some(cg) = &self.node_cgroup else {
            return Ok(machine);
        };
        Ok(self.memcg(cg, machine.capacity)?)
    }

    /// Memory of cgroup `path` from the memory controller's files only
    /// (other controllers' directories may not exist yet): usage, working
    /// set (usage − inactive file pages, hierarchical on v1) and the limit,
    /// capped by `capacity`, as capacity.
    pub fn memcg(
        &self,
        path: &str,
        capacity: i64,
    ) -> Result<MemoryStats, petrel_oci::cgroups::CgroupError> {
        let v1 = self.version() == CgroupVersion::V1;
        let (usage_file, limit_file, inactive_key) = if v1 {
            (
                "memory.usage_in_bytes",
                "memory.limit_in_bytes",
                "total_inactive_file",
            )
        } else {
            ("memory.current", "memory.max", "inactive_file")
        };
        let usage: i64 = self
            .cgroups
            .read("memory", path, usage_file)?
            .trim()
            .parse()
            .unwrap_or(0);
        let stat = self.cgroups.read("memory", path, "memory.stat")?;
        let inactive: i64 = stat
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == inactive_key).then(|| f.next()?.parse().ok())?
            })
            .unwrap_or(0);
        // "max" (v2) and v1's huge unlimited value both leave capacity.
        let limit = self
            .cgroups
            .read("memory", path, limit_file)
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .map_or(capacity, |l| l.min(capacity));
        Ok(MemoryStats {
            capacity: limit,
            usage,
            working_set: (usage - inactive).max(0),
        })
    }

    /// Memory of a cgroup below the node (zero when it does not exist
    /// yet), with `capacity` for an unlimited one.
    pub fn cgroup_memory(&self, path: &str, capacity: i64) -> MemoryStats {
        self.memcg(path, capacity).unwrap_or(MemoryStats {
            capacity,
            ..Default::default()
        })
    }

    /// Process ids: capacity and used.
    fn pids(&self) -> (i64, i64) {
        let machine_cap = {
            let num = |p: &str| -> Option<i64> { read_proc(p).ok()?.trim().parse().ok() };
            match (
                num("/proc/sys/kernel/pid_max"),
                num("/proc/sys/kernel/threads-max"),
            ) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => 0,
            }
        };
        if let Some(cg) = &self.node_cgroup {
            let limit = self
                .cgroups
                .read("pids", cg, "pids.max")
                .ok()
                .and_then(|t| t.trim().parse::<i64>().ok());
            let used = self
                .cgroups
                .read("pids", cg, "pids.current")
                .ok()
                .and_then(|t| t.trim().parse::<i64>().ok());
            if let Some(used) = used {
                return (limit.map_or(machine_cap, |l| l.min(machine_cap)), used);
            }
        }
        let used = rustix::system::sysinfo().procs as i64;
        (machine_cap, used)
    }

    /// One observation of the node; `imagefs` and `containerfs` come
    /// from the runtime.
    pub fn node_stats(
        &self,
        imagefs: Option<FsStats>,
        containerfs: Option<FsStats>,
    ) -> Result<NodeStats, ObserveError> {
        let time = Instant::now();
        let memory = self.node_memory()?;
        let allocatable_cap = (memory.capacity - self.reserved.memory).max(0);
        let allocatable_memory = self.cgroup_memory(&self.pods_cgroup, allocatable_cap);
        let nodefs = match fs_stats(&self.root) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "node filesystem not observed");
                None
            }
        };
        let (pids_capacity, pids_used) = self.pids();
        Ok(NodeStats {
            time,
            timestamp: SystemTime::now(),
            memory,
            allocatable_memory,
            nodefs,
            imagefs,
            containerfs,
            pids_capacity,
            pids_used,
        })
    }

    /// The limits node allocatable puts on the pods' cgroup for a node of
    /// `memory_capacity` bytes and `pids_capacity` process ids, as kubelet
    /// does with `--enforce-node-allocatable=pods`: the capacity minus the
    /// kube and system reservations, for each resource with a reservation
    /// (None for the others, whose limits are left as they are).
    pub fn allocatable_limits(
        &self,
        memory_capacity: i64,
        pids_capacity: i64,
    ) -> AllocatableLimits {
        AllocatableLimits {
            memory: (self.reserved.memory > 0)
                .then(|| (memory_capacity - self.reserved.memory).max(0)),
            pids: (self.reserved.pid > 0).then(|| (pids_capacity - self.reserved.pid).max(1)),
        }
    }

    /// The limits for the node as it is now.
    pub fn current_allocatable_limits(&self) -> Result<AllocatableLimits, ObserveError> {
        if self.reserved.memory <= 0 && self.reserved.pid <= 0 {
            return Ok(AllocatableLimits::default());
        }
        let memory = self.node_memory()?.capacity;
        let (pids, _) = self.pids();
        Ok(self.allocatable_limits(memory, pids))
    }

    /// Writes `limits` on the pods' cgroup. Nothing is written when
    /// nothing is reserved, so an agent without reservations leaves the
    /// cgroup tree as it found it.
    pub fn enforce_allocatable(&self, limits: AllocatableLimits) -> Result<(), ObserveError> {
        if limits == AllocatableLimits::default() {
            return Ok(());
        }
        if let Some(host) = &self.host {
            let config = crate::qos_cgroups::ResourceConfig {
                memory: limits.memory,
                pids: limits.pids,
                ..Default::default()
            };
            host.create(&self.pods_cgroup)?;
            host.apply(&self.pods_cgroup, &config)?;
            return Ok(());
        }
        self.cgroups.ensure(&self.pods_cgroup)?;
        if let Some(limit) = limits.memory {
            let file = match self.version() {
                CgroupVersion::V1 => "memory.limit_in_bytes",
                CgroupVersion::V2 => "memory.max",
            };
            self.cgroups
                .write("memory", &self.pods_cgroup, file, &limit.to_string())?;
        }
        if let Some(limit) = limits.pids {
            self.cgroups
                .write("pids", &self.pods_cgroup, "pids.max", &limit.to_string())?;
        }
        Ok(())
    }

    /// The cgroup version in use.
    pub fn version(&self) -> CgroupVersion {
        self.cgroups.version()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn machine_memory_should_subtract_inactive_file_pages() {
        let text = "MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    600 kB\n\
                    Active(file):     50 kB\nInactive(file):  300 kB\n";
        let m = machine_memory(text).unwrap();
        assert_eq!(m.capacity, 1_024_000);
        assert_eq!(m.usage, 800 * 1024);
        assert_eq!(m.working_set, 500 * 1024);
        assert_eq!(m.available(), 500 * 1024);
        assert!(machine_memory("MemFree: 1 kB\n").is_none());
    }

    #[test]
    fn observations_should_cover_every_observed_signal() {
        let s = NodeStats {
            time: Instant::now(),
            timestamp: SystemTime::now(),
            memory: MemoryStats {
                capacity: 100,
                usage: 80,
                working_set: 60,
            },
            allocatable_memory: MemoryStats {
                capacity: 90,
                usage: 10,
                working_set: 5,
            },
            nodefs: Some(FsStats {
                capacity: 1000,
                available: 100,
                inodes: 50,
                inodes_free: 5,
            }),
            imagefs: None,
            containerfs: None,
            pids_capacity: 100,
            pids_used: 90,
        };
        let o = observations(&s);
        assert_eq!(o[&Signal::MemoryAvailable].available, 40);
        assert_eq!(o[&Signal::AllocatableMemoryAvailable].available, 85);
        assert_eq!(o[&Signal::NodeFsInodesFree].available, 5);
        assert_eq!(o[&Signal::ImageFsAvailable].capacity, 1000);
        assert_eq!(o[&Signal::PidAvailable].available, 10);
    }

    #[test]
    fn allocatable_should_follow_the_capacity() {
        let cgroups = petrel_oci::cgroups::Cgroups::v2_at("/nonexistent");
        let reserved = Reserved {
            memory: 100,
            pid: 10,
            ..Default::default()
        };
        let o = NodeObserver::new(cgroups.clone(), None, "/kubepods", "/".into(), reserved);
        let l = o.allocatable_limits(1000, 50);
        assert_eq!(l.memory, Some(900));
        assert_eq!(l.pids, Some(40));
        assert_eq!(o.allocatable_limits(1500, 50).memory, Some(1400));
        assert_eq!(o.allocatable_limits(50, 5).memory, Some(0));
        assert_eq!(o.allocatable_limits(50, 5).pids, Some(1));
        let none = NodeObserver::new(cgroups, None, "/kubepods", "/".into(), Reserved::default());
        assert_eq!(
            none.allocatable_limits(1000, 50),
            AllocatableLimits::default()
        );
    }

    #[test]
    fn the_agent_root_filesystem_should_be_observed() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_stats(dir.path()).unwrap();
        assert!(fs.capacity > 0 && fs.available <= fs.capacity);
        assert!(fs_stats(&dir.path().join("missing")).is_err());
    }
}
