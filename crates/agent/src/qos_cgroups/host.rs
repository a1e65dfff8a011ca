//! The cgroup calls the QoS cgroup manager makes, behind a trait so its
//! logic is tested without a kernel; and their implementation over
//! [`Cgroups`] (cgroupfs driver), which maps a [`ResourceConfig`] to v1 or
//! v2 interface files as kubelet (through runc's libcontainer) does. The
//! systemd driver's is in [`super::systemd`].

use petrel_oci::cgroups::{CgroupError, CgroupVersion, Cgroups};

use super::config::{ResourceConfig, MAX_SHARES, MIN_SHARES};

/// Why a cgroup could not be made, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A cgroup file or directory (cgroupfs driver).
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// A call on systemd (systemd driver); names the unit.
    #[error(transparent)]
    Systemd(#[from] super::systemd::SystemdError),
    /// The cgroup still has processes or children.
    #[error("cgroup {0} still has processes or children")]
    Busy(String),
    /// The systemd driver was handed a path that is no slice's.
    #[error("cgroup {0} is not a systemd slice")]
    NotASlice(String),
}

/// What the manager does to cgroups. Paths are cgroupfs paths
/// (`/petrel/kubepods/burstable/pod<uid>`, or a slice's expanded path).
pub trait CgroupHost: Send + Sync {
    /// Whether cgroup `path` exists (in any hierarchy the manager writes).
    fn exists(&self, path: &str) -> bool;
    /// Creates `path` and its missing ancestors in every hierarchy; on v2
    /// the ancestors' controllers are enabled for their children.
    fn create(&self, path: &str) -> Result<(), HostError>;
    /// Writes `config` on `path`: every value it sets whose controller the
    /// host has; the first error after trying them all.
    fn apply(&self, path: &str, config: &ResourceConfig) -> Result<(), HostError>;
    /// Removes `path` (not its ancestors) from every hierarchy; an error
    /// while it has processes or children.
    fn remove(&self, path: &str) -> Result<(), HostError>;
}

/// cpu shares to cgroup v2's `cpu.weight` (1..10000), the linear mapping
/// kubelet and runc use: 2 → 1, 1024 → 39, 262144 → 10000.
pub fn shares_to_weight(shares: u64) -> u64 {
    let s = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((s - MIN_SHARES) * 9999) / (MAX_SHARES - MIN_SHARES)
}

/// One interface file to write: controller (for the v1 hierarchy), file
/// name, value.
pub type FileWrite = (&'static str, &'static str, String);

/// The interface files `config` becomes on a host of `version`, in the
/// order they must be written (v1: the CFS period before the quota, which
/// the kernel checks against it).
pub fn files(version: CgroupVersion, config: &ResourceConfig) -> Vec<FileWrite> {
    let mut out: Vec<FileWrite> = Vec::new();
    match version {
        CgroupVersion::V1 => {
            if let Some(s) = config.cpu_shares {
                out.push(("cpu", "cpu.shares", s.to_string()));
            }
            if let Some(p) = config.cpu_period {
                out.push(("cpu", "cpu.cfs_period_us", p.to_string()));
            }
            if let Some(q) = config.cpu_quota {
                out.push(("cpu", "cpu.cfs_quota_us", q.to_string()));
            }
            if let Some(m) = config.memory {
                out.push(("memory", "memory.limit_in_bytes", m.to_string()));
            }
        }
        CgroupVersion::V2 => {
            if let Some(s) = config.cpu_shares {
                out.push(("cpu", "cpu.weight", shares_to_weight(s).to_string()));
            }
            if config.cpu_quota.is_some() || config.cpu_period.is_some() {
                // One file holds both; a quota of -1 (or none) is "max".
                let quota = match config.cpu_quota {
                    Some(q) if q > 0 => q.to_string(),
                    _ => "max".to_string(),
                };
                let value = match config.cpu_period {
                    Some(p) => format!("{quota} {p}"),
                    None => quota,
                };
                out.push(("cpu", "cpu.max", value));
            }
            if let Some(m) = config.memory {
                out.push(("memory", "memory.max", m.to_string()));
            }
        }
    }
    if let Some(p) = config.pids {
        let value = if p > 0 {
            p.to_string()
        } else {
            "max".to_string()
        };
        out.push(("pids", "pids.max", value));
    }
    out
}

/// [`CgroupHost`] over the host's hierarchies.
#[derive(Debug, Clone)]
pub struct HostCgroups {
    cgroups: Cgroups,
}

impl HostCgroups {
    /// The calls made on `cgroups`.
    pub fn new(cgroups: Cgroups) -> Self {
        Self { cgroups }
    }

    /// Whether cgroup `path` holds processes or child cgroups (read in
    /// the memory hierarchy, or the unified one; a missing cgroup is not
    /// busy).
    pub fn busy(&self, path: &str) -> bool {
        let children = self
            .cgroups
            .dir("memory", path)
            .ok()
            .and_then(|d| std::fs::read_dir(d).ok())
            .is_some_and(|mut it| it.any(|e| e.is_ok_and(|e| e.path().is_dir())));
        children || self.cgroups.procs(path).is_ok_and(|p| !p.is_empty())
    }
}

/// The controllers whose directories stand for a cgroup's existence (v1:
/// whichever of them is mounted).
const PROBE_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

impl CgroupHost for HostCgroups {
    fn exists(&self, path: &str) -> bool {
        match self.cgroups.version() {
            CgroupVersion::V2 => self.cgroups.dir("", path).is_ok_and(|d| d.is_dir()),
            CgroupVersion::V1 => PROBE_CONTROLLERS
                .iter()
                .any(|c| self.cgroups.dir(c, path).is_ok_and(|d| d.is_dir())),
        }
    }

    fn create(&self, path: &str) -> Result<(), HostError> {
        Ok(self.cgroups.ensure(path).map(|_| ())?)
    }

    fn apply(&self, path: &str, config: &ResourceConfig) -> Result<(), HostError> {
        let mut first = None;
        for (controller, file, value) in files(self.cgroups.version(), config) {
            // A controller the host lacks is not an error: kubelet sets
            // only what the mounted subsystems have.
            if !self.cgroups.has_controller(controller) {
                continue;
            }
            if let Err(e) = self.cgroups.write(controller, path, file, &value) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), |e| Err(e.into()))
    }

    fn remove(&self, path: &str) -> Result<(), HostError> {
        // Page cache charged to a removed memory cgroup keeps it alive as
        // a dying cgroup: hand it back first (best effort), but never
        // reclaim from processes still there (the removal fails anyway).
        let no_children = self
            .cgroups
            .dir("memory", path)
            .and_then(|d| {
                std::fs::read_dir(&d).map_err(|source| CgroupError::Io {
                    op: "read",
                    path: d,
                    source,
                })
            })
            .is_ok_and(|mut it| !it.any(|e| e.is_ok_and(|e| e.path().is_dir())));
        if no_children && self.cgroups.procs(path).is_ok_and(|p| p.is_empty()) {
            let _ = self.cgroups.release_memory(path);
        }
        Ok(self.cgroups.remove(path)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use super::*;

    /// Every field set (the systemd driver's tests use it too).
    pub(in crate::qos_cgroups) fn full() -> ResourceConfig {
        ResourceConfig {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory: Some(64 << 20),
            pids: Some(100),
        }
    }

    #[test]
    fn weight_should_follow_the_linear_mapping() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(0), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(2048), 79);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(1 << 30), 10_000);
    }

    #[test]
    fn v1_files_should_be_runcs_with_the_period_before_the_quota() {
        let f = files(CgroupVersion::V1, &full());
        let names: Vec<&str> = f.iter().map(|(_, n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "cpu.shares",
                "cpu.cfs_period_us",
                "cpu.cfs_quota_us",
                "memory.limit_in_bytes",
                "pids.max"
            ]
        );
        assert_eq!(f[0], ("cpu", "cpu.shares", "1024".to_string()));
        assert_eq!(f[2].2, "50000");
        assert_eq!(f[3], ("memory", "memory.limit_in_bytes", "67108864".into()));
        let unlimited = ResourceConfig {
            cpu_quota: Some(-1),
            ..Default::default()
        };
        assert_eq!(files(CgroupVersion::V1, &unlimited)[0].2, "-1");
    }

    #[test]
    fn v2_files_should_be_weight_max_and_memory_max() {
        let f = files(CgroupVersion::V2, &full());
        assert_eq!(
            f,
            vec![
                ("cpu", "cpu.weight", "39".to_string()),
                ("cpu", "cpu.max", "50000 100000".to_string()),
                ("memory", "memory.max", "67108864".to_string()),
                ("pids", "pids.max", "100".to_string()),
            ]
        );
        let unlimited = ResourceConfig {
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            ..Default::default()
        };
        assert_eq!(
            files(CgroupVersion::V2, &unlimited),
            vec![("cpu", "cpu.max", "max 100000".to_string())]
        );
        assert!(files(CgroupVersion::V2, &ResourceConfig::default()).is_empty());
    }

    /// A v2 tree in a temporary directory: the root lists its controllers,
    /// and interface files are plain files made beforehand (cgroupfs makes
    /// them; a temp dir does not).
    fn v2_tree(controllers: &str) -> (tempfile::TempDir, HostCgroups) {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("cgroup.controllers"), controllers).unwrap();
        let h = HostCgroups::new(Cgroups::v2_at(d.path()));
        (d, h)
    }

    #[test]
    fn v2_host_should_create_write_and_remove() {
        let (d, h) = v2_tree("cpu memory pids");
        assert!(!h.exists("/k/kubepods/podu"));
        h.create("/k/kubepods/podu").unwrap();
        assert!(h.exists("/k/kubepods/podu"));
        h.apply("/k/kubepods/podu", &full()).unwrap();
        let read =
            |f: &str| std::fs::read_to_string(d.path().join("k/kubepods/podu").join(f)).unwrap();
        assert_eq!(read("cpu.weight"), "39");
        assert_eq!(read("cpu.max"), "50000 100000");
        assert_eq!(read("memory.max"), "67108864");
        assert_eq!(read("pids.max"), "100");
        // The root's controllers were enabled for its children (a temp
        // dir keeps only the last write, and only the root lists
        // controllers).
        assert!(d.path().join("cgroup.subtree_control").exists());
        // A temp dir is not cgroupfs: files make a directory non-empty.
        for f in ["cpu.weight", "cpu.max", "memory.max", "pids.max"] {
            std::fs::remove_file(d.path().join("k/kubepods/podu").join(f)).unwrap();
        }
        h.remove("/k/kubepods/podu").unwrap();
        assert!(!h.exists("/k/kubepods/podu"));
        assert!(h.exists("/k/kubepods"), "ancestors stay");
    }

    #[test]
    fn v2_host_should_skip_controllers_the_host_lacks() {
        let (d, h) = v2_tree("memory");
        h.create("/p").unwrap();
        h.apply("/p", &full()).unwrap();
        assert!(!d.path().join("p/cpu.weight").exists());
        assert!(!d.path().join("p/pids.max").exists());
        assert!(d.path().join("p/memory.max").exists());
    }

    #[test]
    fn v1_host_should_write_each_file_in_its_hierarchy() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().display().to_string();
        let mut mountinfo = String::new();
        for (i, c) in ["cpu,cpuacct", "memory", "pids"].iter().enumerate() {
            std::fs::create_dir_all(d.path().join(c)).unwrap();
            mountinfo.push_str(&format!(
                "{n} 1 0:{n} / {root}/{c} rw - cgroup cgroup rw,{c}\n",
                n = 30 + i
            ));
        }
        let h = HostCgroups::new(Cgroups::v1_from_mountinfo(&mountinfo).unwrap());
        h.create("/k/kubepods/burstable/podu").unwrap();
        assert!(h.exists("/k/kubepods/burstable/podu"));
        h.apply("/k/kubepods/burstable/podu", &full()).unwrap();
        let read = |c: &str, f: &str| {
            std::fs::read_to_string(d.path().join(c).join("k/kubepods/burstable/podu").join(f))
                .unwrap()
        };
        assert_eq!(read("cpu,cpuacct", "cpu.shares"), "1024");
        assert_eq!(read("cpu,cpuacct", "cpu.cfs_period_us"), "100000");
        assert_eq!(read("cpu,cpuacct", "cpu.cfs_quota_us"), "50000");
        assert_eq!(read("memory", "memory.limit_in_bytes"), "67108864");
        assert_eq!(read("pids", "pids.max"), "100");
        assert!(!d
            .path()
            .join("memory/k/kubepods/burstable/podu/cpu.shares")
            .exists());
    }

    #[test]
    fn v1_host_should_report_a_failed_write_after_trying_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().display().to_string();
        std::fs::create_dir_all(d.path().join("memory")).unwrap();
        std::fs::create_dir_all(d.path().join("cpu")).unwrap();
        let mountinfo = format!(
            "30 1 0:30 / {root}/cpu rw - cgroup cgroup rw,cpu\n31 1 0:31 / {root}/memory rw - cgroup cgroup rw,memory\n"
        );
        let h = HostCgroups::new(Cgroups::v1_from_mountinfo(&mountinfo).unwrap());
        h.create("/p").unwrap();
        // cpu.shares cannot be written: a directory stands in its place.
        std::fs::create_dir(d.path().join("cpu/p/cpu.shares")).unwrap();
        let err = h.apply("/p", &full()).unwrap_err();
        assert!(err.to_string().contains("cpu.shares"), "{err}");
        assert!(d.path().join("memory/p/memory.limit_in_bytes").exists());
        assert!(
            !d.path().join("cpu/p/pids.max").exists(),
            "no pids hierarchy"
        );
    }
}
