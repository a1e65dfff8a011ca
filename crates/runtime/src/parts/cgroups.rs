//! The cgroup seam: the cgroup operations the runtime does itself (runc
//! makes and removes containers' own cgroups).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use petrel_oci::cgroups::{CgroupError, CgroupMetrics, CgroupStats, CgroupVersion, Cgroups};

use crate::container::migration_warmup::MigrationWarmup;

/// The cgroup operations of the runtime.
pub trait CgroupOps: Send + Sync + std::fmt::Debug {
    /// The host's cgroup version.
    fn version(&self) -> CgroupVersion;

    /// Makes `path` in every hierarchy where it is missing; returns the
    /// directories made, parents first.
    fn ensure_dirs(&self, path: &str) -> Result<Vec<PathBuf>, CgroupError>;

    /// The cgroup path of a directory inside a hierarchy.
    fn cgroup_of_dir(&self, dir: &Path) -> Option<String>;

    /// Removes directories made by [`CgroupOps::ensure_dirs`], deepest
    /// first; on failure, the ones left and the first error.
    fn remove_created(&self, dirs: &[PathBuf]) -> Result<(), (Vec<PathBuf>, CgroupError)>;

    /// Removes a cgroup in every hierarchy; missing is fine.
    fn remove(&self, path: &str) -> Result<(), CgroupError>;

    /// Uncharges what a dead container left charged to its cgroup.
    fn release_memory(&self, path: &str) -> Result<(), CgroupError>;

    /// How many times the OOM killer killed in the cgroup, if known.
    fn oom_kill_count(&self, path: &str) -> Option<u64>;

    /// CPU and memory usage of a cgroup.
    fn stats(&self, path: &str) -> Result<CgroupStats, CgroupError>;

    /// The fuller reading behind the metrics calls.
    fn metrics(&self, path: &str) -> Result<CgroupMetrics, CgroupError>;

    /// The processes in a cgroup.
    fn procs(&self, path: &str) -> Result<Vec<u32>, CgroupError>;

    /// A container whose cgroup will be `path` is about to be made: a
    /// driver whose cgroups vanish with their last process notes what it
    /// needs to tell an OOM kill afterwards.
    fn container_starting(&self, _path: &str) {}

    /// Starts warming the kernel's cgroup migration lock ahead of a create
    /// (see `container::migration_warmup`); returns at once.
    fn warm_up_migration(&self) {}
}

/// The host's cgroups (cgroupfs), with the migration warm-up of creates.
#[derive(Debug)]
pub struct HostCgroups {
    cgroups: Cgroups,
    warmup: Arc<MigrationWarmup>,
}

impl HostCgroups {
    /// The cgroups found mounted, and the runtime's own cgroup for the
    /// warm-up.
    pub fn new(cgroups: Cgroups) -> Self {
        let warmup = Arc::new(MigrationWarmup::new(&cgroups));
        Self { cgroups, warmup }
    }

    /// The hierarchies themselves.
    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }
}

impl CgroupOps for HostCgroups {
    fn version(&self) -> CgroupVersion {
        self.cgroups.version()
    }

    fn ensure_dirs(&self, path: &str) -> Result<Vec<PathBuf>, CgroupError> {
        self.cgroups.ensure_dirs(path)
    }

    fn cgroup_of_dir(&self, dir: &Path) -> Option<String> {
        self.cgroups.cgroup_of_dir(dir)
    }

    fn remove_created(&self, dirs: &[PathBuf]) -> Result<(), (Vec<PathBuf>, CgroupError)> {
        self.cgroups.remove_created(dirs)
    }

    fn remove(&self, path: &str) -> Result<(), CgroupError> {
        self.cgroups.remove(path)
    }

    fn release_memory(&self, path: &str) -> Result<(), CgroupError> {
        self.cgroups.release_memory(path)
    }

    fn oom_kill_count(&self, path: &str) -> Option<u64> {
        self.cgroups.oom_kill_count(path)
    }

    fn stats(&self, path: &str) -> Result<CgroupStats, CgroupError> {
        self.cgroups.stats(path)
    }

    fn metrics(&self, path: &str) -> Result<CgroupMetrics, CgroupError> {
        self.cgroups.metrics(path)
    }

    fn procs(&self, path: &str) -> Result<Vec<u32>, CgroupError> {
        self.cgroups.procs(path)
    }

    fn warm_up_migration(&self) {
        self.warmup.start();
    }
}
