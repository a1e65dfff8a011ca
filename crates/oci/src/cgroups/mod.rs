//! Cgroups with the cgroupfs driver: v1 (including the hybrid layout) and v2.
//!
//! Cgroup paths are absolute, cgroupfs style (`/kubepods/burstable/pod123`), and are
//! the same in every hierarchy. They are validated before any filesystem access: no
//! `..` or `.` components, no NUL, must start with `/`.

mod metrics;
mod parse;
pub mod systemd;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use metrics::{CgroupMetrics, DeviceIo};
pub use parse::{cgroup_mounts, Mounted};
pub use parse::{Psi, PsiLine};

/// `CGROUP2_SUPER_MAGIC` from `linux/magic.h`.
const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;

/// Where cgroups are mounted on a normal host.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Hierarchies `procs` looks in (v1), in order.
const PROCS_PREFERENCE: &[&str] = &["memory", "pids", "cpu", "cpuacct", "freezer", "devices"];

/// Errors of cgroup operations. Each names the cgroup path or file concerned.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup path that is not absolute or contains `.`, `..` or NUL.
    #[error("invalid cgroup path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No usable cgroup mount was found.
    #[error("no cgroup hierarchy found: {0}")]
    NotMounted(String),
    /// The v1 controller is not mounted on this host.
    #[error("cgroup controller {controller:?} is not mounted")]
    NoController {
        /// The controller asked for.
        controller: String,
    },
    /// The cgroup does not exist.
    #[error("cgroup {path} does not exist")]
    NotFound {
        /// The cgroup path.
        path: String,
    },
    /// The cgroup still has processes or child cgroups.
    #[error("cgroup {path} is busy (it still has processes or children): {dir}")]
    Busy {
        /// The cgroup path.
        path: String,
        /// The directory that could not be removed.
        dir: PathBuf,
    },
    /// A cgroup file had unexpected contents.
    #[error("cannot parse {file}: {reason}")]
    Parse {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Any other I/O error.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// The cgroup version of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Legacy or hybrid: one hierarchy per controller (or group of controllers).
    V1,
    /// Unified hierarchy only.
    V2,
}

/// Resource usage of one cgroup, as kubelet's summary and eviction need it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// Cumulative CPU time, nanoseconds.
    pub cpu_usage_ns: u64,
    /// Memory usage including page cache, bytes.
    pub memory_usage_bytes: u64,
    /// Usage minus inactive file pages, bytes (never negative).
    pub memory_working_set_bytes: u64,
    /// Anonymous and swap-cache memory, bytes.
    pub memory_rss_bytes: u64,
    /// Page faults.
    pub page_faults: u64,
    /// Major page faults.
    pub major_page_faults: u64,
    /// The memory limit, `None` when unlimited.
    pub memory_limit_bytes: Option<u64>,
    /// Number of tasks, `None` when the pids controller is missing.
    pub pids_current: Option<u64>,
    /// Swap in use, bytes (`None` where the kernel does not account it).
    pub swap_usage_bytes: Option<u64>,
    /// The swap limit, bytes (`None` when unlimited or unknown).
    pub swap_limit_bytes: Option<u64>,
    /// CPU pressure (PSI), where the kernel reports it for the cgroup.
    pub cpu_psi: Option<Psi>,
    /// Memory pressure (PSI).
    pub memory_psi: Option<Psi>,
    /// I/O pressure (PSI).
    pub io_psi: Option<Psi>,
}

/// One v1 hierarchy.
#[derive(Debug)]
struct Hierarchy {
    controllers: Vec<String>,
    mountpoint: PathBuf,
}

#[derive(Debug)]
enum Layout {
    /// Every v1 hierarchy, plus the cgroup2 mount of a hybrid host (created and removed
    /// alongside, as runc does, but never read for stats).
    V1 {
        hierarchies: Vec<Hierarchy>,
        unified: Option<PathBuf>,
    },
    V2 {
        root: PathBuf,
    },
}

/// The host's cgroup hierarchies. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: Arc<Layout>,
}

impl Cgroups {
    /// Detects the host layout: v2 if `/sys/fs/cgroup` is a cgroup2 mount, else v1 with
    /// each controller's mount point taken from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Self, CgroupError> {
        let st = rustix::fs::statfs(CGROUP_ROOT).map_err(|e| CgroupError::Io {
            op: "statfs",
            path: CGROUP_ROOT.into(),
            source: e.into(),
        })?;
        // f_type's integer type differs between targets.
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        if st.f_type as u64 == CGROUP2_SUPER_MAGIC {
            return Ok(Self::v2_at(CGROUP_ROOT));
        }
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| CgroupError::Io {
                op: "read",
                path: "/proc/self/mountinfo".into(),
                source: e,
            })?;
        Self::v1_from_mountinfo(&mountinfo)
    }

    /// A v2 layout rooted at `root` (normally `/sys/fs/cgroup`).
    pub fn v2_at(root: impl Into<PathBuf>) -> Self {
        Self {
            layout: Arc::new(Layout::V2 { root: root.into() }),
        }
    }

    /// A v1 layout from the text of a mountinfo file.
    pub fn v1_from_mountinfo(mountinfo: &str) -> Result<Self, CgroupError> {
        let mut hierarchies = Vec::new();
        let mut unified = None;
        for m in cgroup_mounts(mountinfo) {
            if m.unified {
                unified.get_or_insert(m.mountpoint);
            } else {
                hierarchies.push(Hierarchy {
                    controllers: m.controllers,
                    mountpoint: m.mountpoint,
                });
            }
        }
        if hierarchies.is_empty() {
            return Err(CgroupError::NotMounted(
                "no cgroup v1 hierarchy in mountinfo".into(),
            ));
        }
        Ok(Self {
            layout: Arc::new(Layout::V1 {
                hierarchies,
                unified,
            }),
        })
    }

    /// The cgroup version.
    pub fn version(&self) -> CgroupVersion {
        match *self.layout {
            Layout::V1 { .. } => CgroupVersion::V1,
            Layout::V2 { .. } => CgroupVersion::V2,
        }
    }

    /// Whether containers' cgroups get controller `name`. v1: a hierarchy of its own
    /// holds it (a hybrid host's cgroup2 mount does not count: runc in v1 mode never
    /// sets limits there). v2: the root's `cgroup.controllers` lists it.
    pub fn has_controller(&self, name: &str) -> bool {
        match &*self.layout {
            Layout::V1 { hierarchies, .. } => hierarchies
                .iter()
                .any(|h| h.controllers.iter().any(|c| c == name)),
            Layout::V2 { root } => std::fs::read_to_string(root.join("cgroup.controllers"))
                .map(|s| s.split_whitespace().any(|c| c == name))
                .unwrap_or(false),
        }
    }

    /// The directory of cgroup `path` in the cgroup2 hierarchy: the only one on v2, the
    /// `unified` mount of a hybrid v1 host (where PSI files live without the memory
    /// controller). None on a pure v1 host or for an invalid path.
    pub fn unified_dir(&self, path: &str) -> Option<PathBuf> {
        let comps = components(path).ok()?;
        match &*self.layout {
            Layout::V2 { root } => Some(join(root, &comps)),
            Layout::V1 { unified, .. } => unified.as_deref().map(|u| join(u, &comps)),
        }
    }

    /// The directory of cgroup `path` in the hierarchy of `controller` (v2 ignores it).
    pub fn dir(&self, controller: &str, path: &str) -> Result<PathBuf, CgroupError> {
        let comps = components(path)?;
        let base = match &*self.layout {
            Layout::V2 { root } => root,
            Layout::V1 { hierarchies, .. } => {
                &hierarchies
                    .iter()
                    .find(|h| h.controllers.iter().any(|c| c == controller))
                    .ok_or_else(|| CgroupError::NoController {
                        controller: controller.to_string(),
                    })?
                    .mountpoint
            }
        };
        Ok(join(base, &comps))
    }

    /// Creates cgroup `path` and its missing ancestors in every hierarchy.
    ///
    /// v1: every mounted hierarchy (and the cgroup2 mount of a hybrid host); new cpuset
    /// directories get `cpuset.cpus`/`cpuset.mems` from their parent. v2: the controllers
    /// available to each ancestor are enabled in its `cgroup.subtree_control`
    /// (best effort), never in `path` itself, so that processes may still join it.
    ///
    /// Returns the cgroup paths it created, parents first, so the caller can remove
    /// exactly those (in reverse). On error, what it created is removed again.
    pub fn ensure(&self, path: &str) -> Result<Vec<String>, CgroupError> {
        let comps = components(path)?;
        let (_, mut created_depths) = self.ensure_comps(&comps)?;
        created_depths.sort_unstable();
        created_depths.dedup();
        Ok(created_depths
            .into_iter()
            .map(|d| cgroup_path(&comps[..d]))
            .collect())
    }

    /// Like [`Cgroups::ensure`], but returns the directories it created, each
    /// in its own hierarchy, parents first: a cgroup that already existed in
    /// some hierarchies and not in others is reported only where it was made,
    /// so that [`Cgroups::remove_created`] never removes one that was found.
    pub fn ensure_dirs(&self, path: &str) -> Result<Vec<PathBuf>, CgroupError> {
        let comps = components(path)?;
        self.ensure_comps(&comps).map(|(dirs, _)| dirs)
    }

    fn ensure_comps(&self, comps: &[&str]) -> Result<(Vec<PathBuf>, Vec<usize>), CgroupError> {
        let mut created_dirs: Vec<PathBuf> = Vec::new();
        let mut created_depths: Vec<usize> = Vec::new();
        let res = self.ensure_inner(comps, &mut created_dirs, &mut created_depths);
        if let Err(e) = res {
            for dir in created_dirs.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
            return Err(e);
        }
        Ok((created_dirs, created_depths))
    }

    /// The cgroup path of `dir`, a directory in one of the host's
    /// hierarchies (`/sys/fs/cgroup/memory/a/b` → `/a/b`); `None` for a
    /// directory outside them or a hierarchy's root.
    pub fn cgroup_of_dir(&self, dir: &Path) -> Option<String> {
        self.all_roots().iter().find_map(|r| {
            let rel = dir
                .strip_prefix(r)
                .ok()
                .filter(|rel| is_plain_relative(rel))?;
            let comps: Vec<&str> = rel
                .components()
                .map(|c| c.as_os_str().to_str())
                .collect::<Option<_>>()?;
            Some(cgroup_path(&comps))
        })
    }

    /// Removes cgroup directories reported by [`Cgroups::ensure_dirs`],
    /// deepest first, and nothing else: a directory outside the host's
    /// cgroup hierarchies (or a hierarchy's root) is refused. A directory
    /// already gone is fine. Returns the directories that are still there
    /// (busy: processes or child cgroups), with the first error.
    pub fn remove_created(&self, dirs: &[PathBuf]) -> Result<(), (Vec<PathBuf>, CgroupError)> {
        let roots = self.all_roots();
        let mut ordered: Vec<&PathBuf> = dirs.iter().collect();
        // Children before their parents, whatever the hierarchy.
        ordered.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        let mut left = Vec::new();
        let mut first_err = None;
        for dir in ordered {
            let inside = roots
                .iter()
                .any(|r| dir.strip_prefix(r).is_ok_and(is_plain_relative));
            if !inside {
                first_err.get_or_insert(CgroupError::InvalidPath {
                    path: dir.display().to_string(),
                    reason: "not a cgroup directory below a hierarchy's root",
                });
                continue;
            }
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    let busy = matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENOTEMPTY));
                    first_err.get_or_insert(if busy {
                        CgroupError::Busy {
                            path: dir.display().to_string(),
                            dir: dir.clone(),
                        }
                    } else {
                        CgroupError::Io {
                            op: "remove",
                            path: dir.clone(),
                            source: e,
                        }
                    });
                    left.push(dir.clone());
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err((left, e)),
        }
    }

    fn ensure_inner(
        &self,
        comps: &[&str],
        created_dirs: &mut Vec<PathBuf>,
        created_depths: &mut Vec<usize>,
    ) -> Result<(), CgroupError> {
        match &*self.layout {
            Layout::V1 {
                hierarchies,
                unified,
            } => {
                for h in hierarchies {
                    let cpuset = h.controllers.iter().any(|c| c == "cpuset");
                    mkdirs(&h.mountpoint, comps, cpuset, created_dirs, created_depths)?;
                }
                if let Some(u) = unified {
                    mkdirs(u, comps, false, created_dirs, created_depths)?;
                }
            }
            Layout::V2 { root } => {
                for depth in 0..comps.len() {
                    enable_subtree_controllers(&join(root, &comps[..depth]));
                    mkdirs(root, &comps[..=depth], false, created_dirs, created_depths)?;
                }
            }
        }
        Ok(())
    }

    /// Removes cgroup `path` (not its ancestors) from every hierarchy. A cgroup that is
    /// already gone is fine; a busy one is [`CgroupError::Busy`], after the other
    /// hierarchies were tried.
    pub fn remove(&self, path: &str) -> Result<(), CgroupError> {
        let comps = components(path)?;
        if comps.is_empty() {
            return Err(CgroupError::InvalidPath {
                path: path.to_string(),
                reason: "the root cgroup cannot be removed",
            });
        }
        let mut first_err = None;
        for base in self.all_roots() {
            let dir = join(base, &comps);
            let res = match std::fs::remove_dir(&dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(CgroupError::Busy {
                    path: path.to_string(),
                    dir,
                }),
                // rmdir of a non-empty cgroup is EBUSY, but be tolerant of ENOTEMPTY too.
                Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => Err(CgroupError::Busy {
                    path: path.to_string(),
                    dir,
                }),
                Err(e) => Err(CgroupError::Io {
                    op: "remove",
                    path: dir,
                    source: e,
                }),
            };
            if let Err(e) = res {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => {
                tracing::debug!(cgroup.path = %path, "cgroup removed");
                Ok(())
            }
        }
    }

    /// Reads `file` of cgroup `path` in the hierarchy of `controller` (v2 ignores it),
    /// e.g. `("memory", "/pod", "memory.limit_in_bytes")`.
    pub fn read(&self, controller: &str, path: &str, file: &str) -> Result<String, CgroupError> {
        check_file_name(file)?;
        let dir = self.dir(controller, path)?;
        read_file(path, &dir.join(file))
    }

    /// Writes `value` to `file` of cgroup `path` in the hierarchy of `controller`.
    pub fn write(
        &self,
        controller: &str,
        path: &str,
        file: &str,
        value: &str,
    ) -> Result<(), CgroupError> {
        check_file_name(file)?;
        let f = self.dir(controller, path)?.join(file);
        std::fs::write(&f, value).map_err(|e| io_error(path, "write", f, e))
    }

    /// The processes in cgroup `path` (v1: of the memory hierarchy, else the first of
    /// pids, cpu, cpuacct, freezer, devices, else any).
    pub fn procs(&self, path: &str) -> Result<Vec<u32>, CgroupError> {
        let controller = match &*self.layout {
            Layout::V2 { .. } => "",
            Layout::V1 { hierarchies, .. } => PROCS_PREFERENCE
                .iter()
                .copied()
                .find(|c| {
                    hierarchies
                        .iter()
                        .any(|h| h.controllers.iter().any(|x| x == c))
                })
                .or_else(|| {
                    hierarchies
                        .first()
                        .and_then(|h| h.controllers.first())
                        .map(|s| s.as_str())
                })
                .unwrap_or_default(),
        };
        Ok(parse::procs(&self.read(
            controller,
            path,
            "cgroup.procs",
        )?))
    }

    /// Reclaims the memory still charged to cgroup `path`, whose processes are gone,
    /// before it is removed. Page cache (and the slab it pins) stays charged to a removed
    /// memory cgroup, which then lives on as a "dying" cgroup the kernel walks on every
    /// reclaim and stat: thousands of short-lived containers leave thousands of them and
    /// slow the whole machine. v1 writes `memory.force_empty`; v2 asks `memory.reclaim`
    /// for what `memory.current` says is charged. A cgroup that is gone is fine.
    pub fn release_memory(&self, path: &str) -> Result<(), CgroupError> {
        let res = match self.version() {
            CgroupVersion::V1 => self.write("memory", path, "memory.force_empty", "0"),
            CgroupVersion::V2 => {
                let current = self.read("memory", path, "memory.current")?;
                match current.trim() {
                    "0" | "" => Ok(()),
                    bytes => match self.write("memory", path, "memory.reclaim", bytes) {
                        // EAGAIN: less than asked for could be reclaimed; that is all there is.
                        Err(CgroupError::Io { source, .. })
                            if source.raw_os_error() == Some(libc::EAGAIN) =>
                        {
                            Ok(())
                        }
                        r => r,
                    },
                }
            }
        };
        match res {
            Err(CgroupError::NotFound { .. }) => Ok(()),
            r => r,
        }
    }

    /// How often the OOM killer killed a process in cgroup `path`; `None` if unknown
    /// (no memory controller, cgroup gone, or a kernel without the counter).
    pub fn oom_kill_count(&self, path: &str) -> Option<u64> {
        let file = match self.version() {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        parse::keyed(&self.read("memory", path, file).ok()?, "oom_kill")
    }

    /// CPU, memory and pids usage of cgroup `path`.
    pub fn stats(&self, path: &str) -> Result<CgroupStats, CgroupError> {
        match self.version() {
            CgroupVersion::V1 => self.stats_v1(path),
            CgroupVersion::V2 => self.stats_v2(path),
        }
    }

    fn stats_v1(&self, path: &str) -> Result<CgroupStats, CgroupError> {
        let num = |controller: &str, file: &str| -> Result<u64, CgroupError> {
            let text = self.read(controller, path, file)?;
            parse::single(&text).ok_or_else(|| self.parse_error(controller, path, file))
        };
        let stat = self.read("memory", path, "memory.stat")?;
        let usage = num("memory", "memory.usage_in_bytes")?;
        let inactive = parse::v1_memory_stat(&stat, "inactive_file").unwrap_or(0);
        Ok(CgroupStats {
            cpu_usage_ns: num("cpuacct", "cpuacct.usage")?,
            memory_usage_bytes: usage,
            memory_working_set_bytes: parse::working_set(usage, inactive),
            memory_rss_bytes: parse::v1_memory_stat(&stat, "rss").unwrap_or(0),
            page_faults: parse::v1_memory_stat(&stat, "pgfault").unwrap_or(0),
            major_page_faults: parse::v1_memory_stat(&stat, "pgmajfault").unwrap_or(0),
            memory_limit_bytes: self
                .read("memory", path, "memory.limit_in_bytes")
                .ok()
                .and_then(|t| parse::v1_limit(&t)),
            pids_current: self
                .read("pids", path, "pids.current")
                .ok()
                .and_then(|t| parse::single(&t)),
            // v1 accounts memory + swap together (with swap accounting on).
            swap_usage_bytes: self
                .read("memory", path, "memory.memsw.usage_in_bytes")
                .ok()
                .and_then(|t| parse::single(&t))
                .map(|memsw| memsw.saturating_sub(usage)),
            swap_limit_bytes: None,
            cpu_psi: self.unified_pressure(path, "cpu.pressure"),
            memory_psi: self.unified_pressure(path, "memory.pressure"),
            io_psi: self.unified_pressure(path, "io.pressure"),
        })
    }

    fn stats_v2(&self, path: &str) -> Result<CgroupStats, CgroupError> {
        // cpu.stat exists even without the cpu controller enabled; memory files need it.
        let cpu = self.read("", path, "cpu.stat")?;
        let usage_usec = parse::keyed(&cpu, "usage_usec")
            .ok_or_else(|| self.parse_error("", path, "cpu.stat"))?;
        let (usage, stat) = match self.read("", path, "memory.current") {
            Ok(t) => (
                parse::single(&t).ok_or_else(|| self.parse_error("", path, "memory.current"))?,
                self.read("", path, "memory.stat")?,
            ),
            Err(CgroupError::NotFound { .. }) if self.dir("", path)?.is_dir() => (0, String::new()),
            Err(e) => return Err(e),
        };
        let inactive = parse::keyed(&stat, "inactive_file").unwrap_or(0);
        Ok(CgroupStats {
            cpu_usage_ns: usage_usec.saturating_mul(1000),
            memory_usage_bytes: usage,
            memory_working_set_bytes: parse::working_set(usage, inactive),
            memory_rss_bytes: parse::keyed(&stat, "anon").unwrap_or(0),
            page_faults: parse::keyed(&stat, "pgfault").unwrap_or(0),
            major_page_faults: parse::keyed(&stat, "pgmajfault").unwrap_or(0),
            memory_limit_bytes: self
                .read("", path, "memory.max")
                .ok()
                .and_then(|t| parse::v2_limit(&t)),
            pids_current: self
                .read("", path, "pids.current")
                .ok()
                .and_then(|t| parse::single(&t)),
            swap_usage_bytes: self
                .read("", path, "memory.swap.current")
                .ok()
                .and_then(|t| parse::single(&t)),
            swap_limit_bytes: self
                .read("", path, "memory.swap.max")
                .ok()
                .and_then(|t| parse::v2_limit(&t)),
            cpu_psi: self.unified_pressure(path, "cpu.pressure"),
            memory_psi: self.unified_pressure(path, "memory.pressure"),
            io_psi: self.unified_pressure(path, "io.pressure"),
        })
    }

    fn parse_error(&self, controller: &str, path: &str, file: &str) -> CgroupError {
        CgroupError::Parse {
            file: self
                .dir(controller, path)
                .map(|d| d.join(file))
                .unwrap_or_else(|_| PathBuf::from(file)),
            reason: "not a number".into(),
        }
    }

    /// Every hierarchy root: each v1 mount point (once) and the cgroup2 mount.
    fn all_roots(&self) -> Vec<&Path> {
        match &*self.layout {
            Layout::V2 { root } => vec![root.as_path()],
            Layout::V1 {
                hierarchies,
                unified,
            } => hierarchies
                .iter()
                .map(|h| h.mountpoint.as_path())
                .chain(unified.as_deref())
                .collect(),
        }
    }
}

/// Validates a cgroup path and splits it into components (empty for `/`).
fn components(path: &str) -> Result<Vec<&str>, CgroupError> {
    let bad = |reason| CgroupError::InvalidPath {
        path: path.to_string(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(bad("it must start with /"));
    }
    if path.contains('\0') {
        return Err(bad("it contains NUL"));
    }
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if comps.iter().any(|c| *c == ".." || *c == ".") {
        return Err(bad("it contains . or .. components"));
    }
    Ok(comps)
}

/// Interface file names are single components.
fn check_file_name(file: &str) -> Result<(), CgroupError> {
    if file.is_empty() || file.contains('/') || file == "." || file == ".." || file.contains('\0') {
        return Err(CgroupError::InvalidPath {
            path: file.to_string(),
            reason: "a cgroup file name must be a single component",
        });
    }
    Ok(())
}

fn join(base: &Path, comps: &[&str]) -> PathBuf {
    let mut p = base.to_path_buf();
    p.extend(comps);
    p
}

/// A non-empty relative path of plain components (no `.`, `..` or root).
fn is_plain_relative(rel: &Path) -> bool {
    rel.components().next().is_some()
        && rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

fn cgroup_path(comps: &[&str]) -> String {
    format!("/{}", comps.join("/"))
}

fn io_error(cgroup: &str, op: &'static str, path: PathBuf, e: io::Error) -> CgroupError {
    if e.kind() == io::ErrorKind::NotFound {
        CgroupError::NotFound {
            path: cgroup.to_string(),
        }
    } else {
        CgroupError::Io {
            op,
            path,
            source: e,
        }
    }
}

fn read_file(cgroup: &str, file: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(file).map_err(|e| io_error(cgroup, "read", file.to_path_buf(), e))
}

/// Creates `base/comps[0]/.../comps[n-1]` one level at a time, recording what it made.
fn mkdirs(
    base: &Path,
    comps: &[&str],
    cpuset: bool,
    created_dirs: &mut Vec<PathBuf>,
    created_depths: &mut Vec<usize>,
) -> Result<(), CgroupError> {
    let mut dir = base.to_path_buf();
    for (i, c) in comps.iter().enumerate() {
        let parent = dir.clone();
        dir.push(c);
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                created_dirs.push(dir.clone());
                created_depths.push(i + 1);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(CgroupError::Io {
                    op: "create",
                    path: dir,
                    source: e,
                })
            }
        }
        if cpuset {
            inherit_cpuset(&parent, &dir)?;
        }
    }
    Ok(())
}

/// A new v1 cpuset cgroup starts with empty cpus and mems, and no task can join it
/// until they are set: copy the parent's when empty.
fn inherit_cpuset(parent: &Path, dir: &Path) -> Result<(), CgroupError> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(file);
        let current = std::fs::read_to_string(&own).unwrap_or_default();
        if !current.trim().is_empty() {
            continue;
        }
        let from = parent.join(file);
        let value = std::fs::read_to_string(&from).map_err(|e| CgroupError::Io {
            op: "read",
            path: from,
            source: e,
        })?;
        std::fs::write(&own, value.trim()).map_err(|e| CgroupError::Io {
            op: "write",
            path: own,
            source: e,
        })?;
    }
    Ok(())
}

/// Enables in `dir`'s `cgroup.subtree_control` every controller it has available.
/// Best effort: a cgroup with processes of its own cannot delegate (EBUSY), and some
/// controllers may be refused; runc reports what it then cannot set.
fn enable_subtree_controllers(dir: &Path) {
    let Ok(available) = std::fs::read_to_string(dir.join("cgroup.controllers")) else {
        return;
    };
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    let enabled: Vec<&str> = enabled.split_whitespace().collect();
    for c in available
        .split_whitespace()
        .filter(|c| !enabled.contains(c))
    {
        let file = dir.join("cgroup.subtree_control");
        if let Err(e) = std::fs::write(&file, format!("+{c}")) {
            tracing::debug!(cgroup.dir = %dir.display(), controller = c, error = %e,
                "cannot enable cgroup controller");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A fake v1 tree in a temp dir: cpuset (with cpus/mems), memory and cpuacct.
    fn fake_v1() -> (tempfile::TempDir, Cgroups) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = tmp.path();
        for c in ["cpuset", "memory", "cpuacct", "unified"] {
            fs::create_dir(p.join(c)).expect("mkdir");
        }
        fs::write(p.join("cpuset/cpuset.cpus"), "0-1\n").expect("write");
        fs::write(p.join("cpuset/cpuset.mems"), "0\n").expect("write");
        let mountinfo = format!(
            "1 0 0:1 / {d}/cpuset rw - cgroup cgroup rw,cpuset\n\
             2 0 0:2 / {d}/memory rw - cgroup cgroup rw,memory\n\
             3 0 0:3 / {d}/cpuacct rw - cgroup cgroup rw,cpuacct\n\
             4 0 0:4 / {d}/unified rw - cgroup2 cgroup2 rw\n",
            d = p.display()
        );
        let cg = Cgroups::v1_from_mountinfo(&mountinfo).expect("layout");
        (tmp, cg)
    }

    #[test]
    fn has_controller_should_count_v1_hierarchies_and_v2_controllers_only() {
        let (_tmp, cg) = fake_v1();
        assert!(cg.has_controller("memory"));
        // A hybrid host's hugetlb lives on the cgroup2 mount: not usable by runc.
        assert!(!cg.has_controller("hugetlb"));
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(
            tmp.path().join("cgroup.controllers"),
            "cpu memory hugetlb\n",
        )
        .expect("write");
        let v2 = Cgroups::v2_at(tmp.path());
        assert!(v2.has_controller("hugetlb"));
        assert!(!v2.has_controller("rdma"));
    }

    #[test]
    fn components_should_reject_relative_and_dotted_paths() {
        for bad in ["a/b", "", "/a/../b", "/a/./b", "/..", "/a\0b"] {
            assert!(
                matches!(components(bad), Err(CgroupError::InvalidPath { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(components("/a//b/").expect("valid"), ["a", "b"]);
        assert!(components("/").expect("valid").is_empty());
    }

    #[test]
    fn ensure_should_create_missing_dirs_in_every_hierarchy_and_report_them() {
        let (tmp, cg) = fake_v1();
        fs::create_dir(tmp.path().join("memory/pre")).expect("mkdir");
        let created = cg.ensure("/pre/a/b").expect("ensure");
        // /pre existed in memory only: it was created in the others, so it is reported.
        assert_eq!(created, ["/pre", "/pre/a", "/pre/a/b"]);
        for c in ["cpuset", "memory", "cpuacct", "unified"] {
            assert!(tmp.path().join(c).join("pre/a/b").is_dir(), "{c}");
        }
        // A second call creates nothing.
        assert!(cg.ensure("/pre/a/b").expect("ensure").is_empty());
    }

    #[test]
    fn ensure_should_copy_cpuset_from_the_parent() {
        let (tmp, cg) = fake_v1();
        cg.ensure("/x/y").expect("ensure");
        let read = |p: &str| fs::read_to_string(tmp.path().join(p)).expect("read");
        assert_eq!(read("cpuset/x/cpuset.cpus"), "0-1");
        assert_eq!(read("cpuset/x/y/cpuset.cpus"), "0-1");
        assert_eq!(read("cpuset/x/y/cpuset.mems"), "0");
        assert!(!tmp.path().join("memory/x/cpuset.cpus").exists());
    }

    #[test]
    fn ensure_should_remove_what_it_created_on_error() {
        let (tmp, cg) = fake_v1();
        // A file where a cgroup directory must go makes the cpuacct hierarchy fail.
        fs::write(tmp.path().join("cpuacct/x"), "").expect("write");
        let err = cg.ensure("/x/y").expect_err("should fail");
        assert!(err.to_string().contains("cpuacct/x"), "{err}");
        // (The fake cpuset dirs hold real files, so only memory shows the rollback.)
        assert!(!tmp.path().join("memory/x").exists());
    }

    #[test]
    fn remove_should_delete_in_every_hierarchy_and_accept_missing() {
        let (tmp, cg) = fake_v1();
        cg.ensure("/r/s").expect("ensure");
        fs::remove_dir(tmp.path().join("memory/r/s")).expect("rmdir");
        // The fake cpuset dirs hold the copied files: empty them as cgroupfs would.
        for f in ["cpuset.cpus", "cpuset.mems"] {
            fs::remove_file(tmp.path().join("cpuset/r/s").join(f)).expect("rm");
        }
        cg.remove("/r/s").expect("remove");
        for c in ["cpuset", "memory", "cpuacct", "unified"] {
            assert!(!tmp.path().join(c).join("r/s").exists(), "{c}");
            assert!(tmp.path().join(c).join("r").exists(), "{c}");
        }
        cg.remove("/r/s").expect("remove again");
    }

    #[test]
    fn remove_should_report_a_busy_cgroup_by_path() {
        let (tmp, cg) = fake_v1();
        cg.ensure("/busy/child").expect("ensure");
        // A child cgroup makes the parent busy (ENOTEMPTY on a plain filesystem).
        let err = cg.remove("/busy").expect_err("should fail");
        assert!(
            matches!(&err, CgroupError::Busy { path, .. } if path == "/busy"),
            "{err}"
        );
        assert!(tmp.path().join("memory/busy").exists());
        assert!(matches!(
            cg.remove("/"),
            Err(CgroupError::InvalidPath { .. })
        ));
    }

    #[test]
    fn ensure_dirs_should_report_each_hierarchy_where_it_created() {
        let (tmp, cg) = fake_v1();
        fs::create_dir(tmp.path().join("memory/pre")).expect("mkdir");
        let created = cg.ensure_dirs("/pre/a").expect("ensure");
        // /pre was found in memory: reported only where it was made.
        assert!(!created.contains(&tmp.path().join("memory/pre")));
        for c in ["cpuset", "cpuacct", "unified"] {
            assert!(created.contains(&tmp.path().join(c).join("pre")), "{c}");
        }
        for c in ["cpuset", "memory", "cpuacct", "unified"] {
            assert!(created.contains(&tmp.path().join(c).join("pre/a")), "{c}");
        }
        assert_eq!(created.len(), 7, "{created:?}");
        assert!(cg.ensure_dirs("/pre/a").expect("ensure").is_empty());
    }

    #[test]
    fn remove_created_should_leave_every_cgroup_it_found() {
        let (tmp, cg) = fake_v1();
        fs::create_dir(tmp.path().join("memory/pre")).expect("mkdir");
        fs::create_dir(tmp.path().join("cpuacct/pre")).expect("mkdir");
        let created = cg.ensure_dirs("/pre/pod").expect("ensure");
        // The fake cpuset dirs hold the copied files: empty them as cgroupfs would.
        for d in ["cpuset/pre", "cpuset/pre/pod"] {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                fs::remove_file(tmp.path().join(d).join(f)).expect("rm");
            }
        }
        cg.remove_created(&created).expect("remove");
        for c in ["cpuset", "memory", "cpuacct", "unified"] {
            assert!(!tmp.path().join(c).join("pre/pod").exists(), "{c}");
        }
        assert!(tmp.path().join("memory/pre").is_dir());
        assert!(tmp.path().join("cpuacct/pre").is_dir());
        assert!(!tmp.path().join("cpuset/pre").exists());
        assert!(!tmp.path().join("unified/pre").exists());
        // Gone already is fine.
        cg.remove_created(&created).expect("remove again");
    }

    #[test]
    fn cgroup_of_dir_should_name_the_cgroup_in_any_hierarchy() {
        let (tmp, cg) = fake_v1();
        let p = tmp.path();
        assert_eq!(
            cg.cgroup_of_dir(&p.join("memory/a/b")).as_deref(),
            Some("/a/b")
        );
        assert_eq!(
            cg.cgroup_of_dir(&p.join("unified/a")).as_deref(),
            Some("/a")
        );
        assert_eq!(cg.cgroup_of_dir(&p.join("memory")), None);
        assert_eq!(cg.cgroup_of_dir(&p.join("elsewhere/a")), None);
        assert_eq!(cg.cgroup_of_dir(&p.join("memory/../x")), None);
    }

    #[test]
    fn remove_created_should_refuse_foreign_dirs_and_return_busy_ones() {
        let (tmp, cg) = fake_v1();
        let outside = tmp.path().join("elsewhere");
        fs::create_dir(&outside).expect("mkdir");
        let root = tmp.path().join("memory");
        let dotted = tmp.path().join("memory/../elsewhere");
        for bad in [&outside, &root, &dotted] {
            let r = cg.remove_created(std::slice::from_ref(bad));
            assert!(
                matches!(&r, Err((left, CgroupError::InvalidPath { .. })) if left.is_empty()),
                "{bad:?}: {r:?}"
            );
        }
        assert!(outside.is_dir() && root.is_dir());
        let created = cg.ensure_dirs("/busy").expect("ensure");
        fs::create_dir(tmp.path().join("memory/busy/child")).expect("mkdir");
        let Err((left, e)) = cg.remove_created(&created) else {
            panic!("a cgroup with a child should stay");
        };
        assert!(left.contains(&tmp.path().join("memory/busy")), "{left:?}");
        assert!(matches!(e, CgroupError::Busy { .. }), "{e}");
    }

    #[test]
    fn ensure_should_enable_controllers_in_v2_ancestors_only() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").expect("write");
        fs::write(root.join("cgroup.subtree_control"), "memory\n").expect("write");
        let cg = Cgroups::v2_at(root);
        assert_eq!(cg.version(), CgroupVersion::V2);
        // Pretend the kernel populated /a when it was created.
        fs::create_dir(root.join("a")).expect("mkdir");
        fs::write(root.join("a/cgroup.controllers"), "cpu memory\n").expect("write");
        let created = cg.ensure("/a/b").expect("ensure");
        assert_eq!(created, ["/a/b"]);
        // A plain file keeps only the last write; the order is that of cgroup.controllers.
        assert_eq!(
            fs::read_to_string(root.join("cgroup.subtree_control")).expect("read"),
            "+pids"
        );
        assert_eq!(
            fs::read_to_string(root.join("a/cgroup.subtree_control")).expect("read"),
            "+memory"
        );
        assert!(!root.join("a/b/cgroup.subtree_control").exists());
    }

    #[test]
    fn stats_should_read_v2_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path().join("pod");
        fs::create_dir(&d).expect("mkdir");
        let w = |f: &str, s: &str| fs::write(d.join(f), s).expect("write");
        w(
            "cpu.stat",
            "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n",
        );
        w("memory.current", "1000000\n");
        w(
            "memory.stat",
            "anon 300000\nfile 600000\ninactive_file 250000\npgfault 42\npgmajfault 3\n",
        );
        w("memory.max", "max\n");
        w("pids.current", "4\n");
        w("memory.events", "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n");
        w("memory.swap.current", "4096\n");
        w("memory.swap.max", "1048576\n");
        w(
            "memory.pressure",
            "some avg10=2.50 avg60=0.00 avg300=0.00 total=700\n\
             full avg10=0.00 avg60=0.00 avg300=0.00 total=300\n",
        );
        let cg = Cgroups::v2_at(tmp.path());
        let s = cg.stats("/pod").expect("stats");
        assert_eq!(
            s,
            CgroupStats {
                cpu_usage_ns: 2_500_000,
                memory_usage_bytes: 1_000_000,
                memory_working_set_bytes: 750_000,
                memory_rss_bytes: 300_000,
                page_faults: 42,
                major_page_faults: 3,
                memory_limit_bytes: None,
                pids_current: Some(4),
                swap_usage_bytes: Some(4096),
                swap_limit_bytes: Some(1_048_576),
                cpu_psi: None,
                memory_psi: Some(Psi {
                    some: PsiLine {
                        avg10_centi: 250,
                        total_us: 700,
                        ..PsiLine::default()
                    },
                    full: Some(PsiLine {
                        total_us: 300,
                        ..PsiLine::default()
                    }),
                }),
                io_psi: None,
            }
        );
        assert_eq!(cg.oom_kill_count("/pod"), Some(1));
        assert!(matches!(
            cg.stats("/gone"),
            Err(CgroupError::NotFound { .. })
        ));
    }

    #[test]
    fn stats_should_read_v1_files() {
        let (tmp, cg) = fake_v1();
        cg.ensure("/pod").expect("ensure");
        let w = |f: &str, s: &str| fs::write(tmp.path().join(f), s).expect("write");
        w("cpuacct/pod/cpuacct.usage", "123456789\n");
        w("memory/pod/memory.usage_in_bytes", "5000\n");
        w(
            "memory/pod/memory.stat",
            "rss 10\ninactive_file 1\ntotal_rss 2000\ntotal_inactive_file 6000\n\
             total_pgfault 7\ntotal_pgmajfault 1\n",
        );
        w("memory/pod/memory.limit_in_bytes", "9223372036854771712\n");
        w(
            "memory/pod/memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        let s = cg.stats("/pod").expect("stats");
        assert_eq!(s.cpu_usage_ns, 123_456_789);
        assert_eq!(s.memory_usage_bytes, 5000);
        assert_eq!(s.memory_working_set_bytes, 0, "clamped at zero");
        assert_eq!(s.memory_rss_bytes, 2000);
        assert_eq!((s.page_faults, s.major_page_faults), (7, 1));
        assert_eq!(s.memory_limit_bytes, None);
        assert_eq!(s.pids_current, None, "no pids hierarchy");
        assert_eq!(cg.oom_kill_count("/pod"), Some(2));
        assert_eq!(cg.oom_kill_count("/nope"), None);
    }

    #[test]
    fn read_should_reject_unknown_controllers_and_bad_file_names() {
        let (_tmp, cg) = fake_v1();
        assert!(matches!(
            cg.read("hugetlb", "/x", "hugetlb.2MB.limit_in_bytes"),
            Err(CgroupError::NoController { .. })
        ));
        assert!(matches!(
            cg.read("memory", "/", "../../etc/passwd"),
            Err(CgroupError::InvalidPath { .. })
        ));
    }

    #[test]
    fn procs_should_read_the_memory_hierarchy() {
        let (tmp, cg) = fake_v1();
        cg.ensure("/p").expect("ensure");
        fs::write(tmp.path().join("memory/p/cgroup.procs"), "10\n20\n").expect("write");
        assert_eq!(cg.procs("/p").expect("procs"), [10, 20]);
    }
}
