//! The fuller reading of one cgroup behind the CRI metrics RPCs (the
//! cAdvisor-named metrics): CPU split and throttling, memory breakdown,
//! failures, OOM kills, tasks, and the limits in force. Every field is
//! `None` when its file is missing (a controller not mounted, an older
//! kernel, a cgroup v2 controller not enabled), so a caller reports only
//! what the host really has.

use super::parse::Psi;
use super::{parse, CgroupError, CgroupVersion, Cgroups};

/// USER_HZ: `cpuacct.stat` counts in these ticks (100 on every Linux ABI).
const NS_PER_USER_HZ_TICK: u64 = 10_000_000;

/// One reading of a cgroup's counters and limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMetrics {
    /// Cumulative CPU time, ns.
    pub cpu_usage_ns: Option<u64>,
    /// Cumulative CPU time in user mode, ns.
    pub cpu_user_ns: Option<u64>,
    /// Cumulative CPU time in kernel mode, ns.
    pub cpu_system_ns: Option<u64>,
    /// CFS enforcement periods elapsed.
    pub cfs_periods: Option<u64>,
    /// CFS periods in which the cgroup was throttled.
    pub cfs_throttled_periods: Option<u64>,
    /// Time throttled, ns.
    pub cfs_throttled_ns: Option<u64>,
    /// Memory usage including page cache, bytes.
    pub memory_usage: Option<u64>,
    /// The highest usage recorded, bytes (v1 always; v2 with `memory.peak`).
    pub memory_max_usage: Option<u64>,
    /// Usage minus inactive file pages, bytes.
    pub memory_working_set: Option<u64>,
    /// Anonymous and swap-cache memory, bytes.
    pub memory_rss: Option<u64>,
    /// Page cache, bytes.
    pub memory_cache: Option<u64>,
    /// Memory-mapped files, bytes.
    pub memory_mapped_file: Option<u64>,
    /// Swap in use, bytes.
    pub memory_swap: Option<u64>,
    /// Kernel memory charged to the cgroup, bytes.
    pub memory_kernel: Option<u64>,
    /// Times usage hit the limit (v1 `memory.failcnt`; v2 the `max`
    /// events of `memory.events`, the nearest counter it has).
    pub memory_failcnt: Option<u64>,
    /// Page faults.
    pub pgfault: Option<u64>,
    /// Major page faults.
    pub pgmajfault: Option<u64>,
    /// Processes the OOM killer killed in the cgroup.
    pub oom_kills: Option<u64>,
    /// Tasks (threads) in the cgroup.
    pub tasks: Option<u64>,
    /// The task limit, `Some(0)` when unlimited.
    pub tasks_max: Option<u64>,
    /// CPU shares (v2: converted back from `cpu.weight`).
    pub cpu_shares: Option<u64>,
    /// CFS quota per period, µs; `None` when unlimited.
    pub cpu_quota_us: Option<u64>,
    /// CFS period, µs.
    pub cpu_period_us: Option<u64>,
    /// The memory limit, `Some(0)` when unlimited.
    pub memory_limit: Option<u64>,
    /// The memory reservation (v1 soft limit, v2 `memory.low`), `Some(0)`
    /// when none.
    pub memory_reservation: Option<u64>,
    /// The swap limit (v1: memory + swap, as cAdvisor reports it),
    /// `Some(0)` when unlimited.
    pub memory_swap_limit: Option<u64>,
    /// Block I/O per device, in device order (empty without blkio/io).
    pub io: Vec<DeviceIo>,
    /// CPU pressure (PSI), where the kernel reports it for the cgroup.
    pub cpu_pressure: Option<Psi>,
    /// Memory pressure (PSI).
    pub memory_pressure: Option<Psi>,
    /// I/O pressure (PSI).
    pub io_pressure: Option<Psi>,
}

/// Block I/O of a cgroup on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIo {
    /// The device's major number.
    pub major: u64,
    /// The device's minor number.
    pub minor: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
}

impl Cgroups {
    /// Reads the counters and limits of cgroup `path`. Fails only when the
    /// cgroup does not exist (or its path is invalid); each missing file
    /// leaves its fields `None`.
    pub fn metrics(&self, path: &str) -> Result<CgroupMetrics, CgroupError> {
        match self.version() {
            CgroupVersion::V1 => self.metrics_v1(path),
            CgroupVersion::V2 => self.metrics_v2(path),
        }
    }

    fn metrics_v1(&self, path: &str) -> Result<CgroupMetrics, CgroupError> {
        let read = |controller: &str, file: &str| self.read(controller, path, file).ok();
        let num =
            |controller: &str, file: &str| read(controller, file).and_then(|t| parse::single(&t));
        // The memory cgroup is the one every container has: its absence
        // means the cgroup is gone.
        let stat = self.read("memory", path, "memory.stat")?;
        let ms = |key: &str| parse::v1_memory_stat(&stat, key);
        let usage = num("memory", "memory.usage_in_bytes");
        let cpuacct_stat = read("cpuacct", "cpuacct.stat");
        let ticks = |key: &str| {
            cpuacct_stat
                .as_deref()
                .and_then(|s| parse::keyed(s, key))
                .map(|t| t.saturating_mul(NS_PER_USER_HZ_TICK))
        };
        let cpu_stat = read("cpu", "cpu.stat");
        let cs = |key: &str| cpu_stat.as_deref().and_then(|s| parse::keyed(s, key));
        let memsw_usage = num("memory", "memory.memsw.usage_in_bytes");
        let unlimited_v1 = |t: String| Some(parse::v1_limit(&t).unwrap_or(0));
        Ok(CgroupMetrics {
            cpu_usage_ns: num("cpuacct", "cpuacct.usage"),
            // The ns counters exist since Linux 4.7; the tick counts before.
            cpu_user_ns: num("cpuacct", "cpuacct.usage_user").or_else(|| ticks("user")),
            cpu_system_ns: num("cpuacct", "cpuacct.usage_sys").or_else(|| ticks("system")),
            cfs_periods: cs("nr_periods"),
            cfs_throttled_periods: cs("nr_throttled"),
            cfs_throttled_ns: cs("throttled_time"),
            memory_usage: usage,
            memory_max_usage: num("memory", "memory.max_usage_in_bytes"),
            memory_working_set: usage
                .map(|u| parse::working_set(u, ms("inactive_file").unwrap_or(0))),
            memory_rss: ms("rss"),
            memory_cache: ms("cache"),
            memory_mapped_file: ms("mapped_file"),
            memory_swap: match (memsw_usage, usage) {
                (Some(sw), Some(u)) => Some(sw.saturating_sub(u)),
                _ => ms("swap"),
            },
            memory_kernel: num("memory", "memory.kmem.usage_in_bytes"),
            memory_failcnt: num("memory", "memory.failcnt"),
            pgfault: ms("pgfault"),
            pgmajfault: ms("pgmajfault"),
            oom_kills: read("memory", "memory.oom_control")
                .and_then(|t| parse::keyed(&t, "oom_kill")),
            tasks: num("pids", "pids.current"),
            tasks_max: read("pids", "pids.max").map(|t| parse::v2_limit(&t).unwrap_or(0)),
            cpu_shares: num("cpu", "cpu.shares"),
            // -1 is unlimited.
            cpu_quota_us: read("cpu", "cpu.cfs_quota_us").and_then(|t| t.trim().parse().ok()),
            cpu_period_us: num("cpu", "cpu.cfs_period_us"),
            memory_limit: read("memory", "memory.limit_in_bytes").and_then(unlimited_v1),
            memory_reservation: read("memory", "memory.soft_limit_in_bytes").and_then(unlimited_v1),
            memory_swap_limit: read("memory", "memory.memsw.limit_in_bytes").and_then(unlimited_v1),
            // The throttle files count every I/O whatever the scheduler.
            io: v1_io(
                read("blkio", "blkio.throttle.io_service_bytes_recursive").as_deref(),
                read("blkio", "blkio.throttle.io_serviced_recursive").as_deref(),
            ),
            // A hybrid host keeps PSI in its cgroup2 mount, where runc
            // places the container too.
            cpu_pressure: self.unified_pressure(path, "cpu.pressure"),
            memory_pressure: self.unified_pressure(path, "memory.pressure"),
            io_pressure: self.unified_pressure(path, "io.pressure"),
        })
    }

    /// A PSI file of cgroup `path` in the cgroup2 hierarchy (v2's only
    /// one, a hybrid host's `unified` mount).
    pub fn unified_pressure(&self, path: &str, file: &str) -> Option<Psi> {
        let dir = self.unified_dir(path)?;
        parse::psi(&std::fs::read_to_string(dir.join(file)).ok()?)
    }

    fn metrics_v2(&self, path: &str) -> Result<CgroupMetrics, CgroupError> {
        let read = |file: &str| self.read("", path, file).ok();
        let num = |file: &str| read(file).and_then(|t| parse::single(&t));
        let limit = |file: &str| read(file).map(|t| parse::v2_limit(&t).unwrap_or(0));
        // cpu.stat exists in every v2 cgroup, controller enabled or not.
        let cpu = self.read("", path, "cpu.stat")?;
        let us = |key: &str| parse::keyed(&cpu, key).map(|v| v.saturating_mul(1000));
        let stat = read("memory.stat");
        let ms = |key: &str| stat.as_deref().and_then(|s| parse::keyed(s, key));
        let events = read("memory.events");
        let ev = |key: &str| events.as_deref().and_then(|s| parse::keyed(s, key));
        let usage = num("memory.current");
        let (quota, period) = read("cpu.max")
            .map(|t| parse_cpu_max(&t))
            .unwrap_or((None, None));
        Ok(CgroupMetrics {
            cpu_usage_ns: us("usage_usec"),
            cpu_user_ns: us("user_usec"),
            cpu_system_ns: us("system_usec"),
            cfs_periods: parse::keyed(&cpu, "nr_periods"),
            cfs_throttled_periods: parse::keyed(&cpu, "nr_throttled"),
            cfs_throttled_ns: us("throttled_usec"),
            memory_usage: usage,
            memory_max_usage: num("memory.peak"),
            memory_working_set: usage
                .map(|u| parse::working_set(u, ms("inactive_file").unwrap_or(0))),
            memory_rss: ms("anon"),
            memory_cache: ms("file"),
            memory_mapped_file: ms("file_mapped"),
            memory_swap: num("memory.swap.current"),
            // `kernel` since Linux 5.18; its main parts before.
            memory_kernel: ms("kernel").or_else(|| {
                let parts = [ms("kernel_stack"), ms("pagetables"), ms("slab")];
                parts
                    .iter()
                    .any(Option::is_some)
                    .then(|| parts.iter().flatten().sum())
            }),
            memory_failcnt: ev("max"),
            pgfault: ms("pgfault"),
            pgmajfault: ms("pgmajfault"),
            oom_kills: ev("oom_kill"),
            tasks: num("pids.current"),
            tasks_max: limit("pids.max"),
            cpu_shares: num("cpu.weight").map(weight_to_shares),
            cpu_quota_us: quota,
            cpu_period_us: period,
            memory_limit: limit("memory.max"),
            memory_reservation: num("memory.low"),
            memory_swap_limit: limit("memory.swap.max"),
            io: read("io.stat").map(|t| v2_io(&t)).unwrap_or_default(),
            cpu_pressure: read("cpu.pressure").and_then(|t| parse::psi(&t)),
            memory_pressure: read("memory.pressure").and_then(|t| parse::psi(&t)),
            io_pressure: read("io.pressure").and_then(|t| parse::psi(&t)),
        })
    }
}

/// The device entry of `io` for `major:minor`, added when missing.
fn device<'a>(io: &'a mut Vec<DeviceIo>, dev: &str) -> Option<&'a mut DeviceIo> {
    let (major, minor) = dev.split_once(':')?;
    let (major, minor) = (major.parse().ok()?, minor.parse().ok()?);
    let i = match io.iter().position(|d| d.major == major && d.minor == minor) {
        Some(i) => i,
        None => {
            io.push(DeviceIo {
                major,
                minor,
                ..DeviceIo::default()
            });
            io.len() - 1
        }
    };
    io.get_mut(i)
}

/// v1 blkio files: `<major>:<minor> <Read|Write|Sync|Async|Discard|Total> <n>`
/// lines (and a final `Total <n>`).
fn v1_io(bytes: Option<&str>, ops: Option<&str>) -> Vec<DeviceIo> {
    let mut io = Vec::new();
    for (text, is_bytes) in [(bytes, true), (ops, false)] {
        for line in text.unwrap_or_default().lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [dev, op, n] = f[..] else { continue };
            let Ok(n) = n.parse::<u64>() else { continue };
            let Some(d) = device(&mut io, dev) else {
                continue;
            };
            match (op, is_bytes) {
                ("Read", true) => d.read_bytes = n,
                ("Write", true) => d.write_bytes = n,
                ("Read", false) => d.reads = n,
                ("Write", false) => d.writes = n,
                _ => {}
            }
        }
    }
    io
}

/// v2 `io.stat`: `<major>:<minor> rbytes=N wbytes=N rios=N wios=N ...`.
fn v2_io(text: &str) -> Vec<DeviceIo> {
    let mut io = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(d) = f.next().and_then(|dev| device(&mut io, dev)) else {
            continue;
        };
        for kv in f {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let Ok(v) = v.parse() else { continue };
            match k {
                "rbytes" => d.read_bytes = v,
                "wbytes" => d.write_bytes = v,
                "rios" => d.reads = v,
                "wios" => d.writes = v,
                _ => {}
            }
        }
    }
    io
}

/// `cpu.max`: `"<quota|max> <period>"`.
fn parse_cpu_max(text: &str) -> (Option<u64>, Option<u64>) {
    let mut f = text.split_whitespace();
    let quota = f.next().and_then(|q| q.parse().ok());
    let period = f.next().and_then(|p| p.parse().ok());
    (quota, period)
}

/// The CPU shares a v2 `cpu.weight` stands for: the inverse of the
/// shares→weight mapping runc and kubelet use (2..262144 onto 1..10000).
fn weight_to_shares(weight: u64) -> u64 {
    2 + weight.saturating_sub(1) * 262_142 / 9_999
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // fixture set-up: a failure is the test's failure
mod tests {
    use std::path::Path;

    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    /// A v1 layout whose controllers are directories of `root`.
    /// PSI with these totals (the averages zero, as the fixtures write).
    fn psi(some_us: u64, full_us: Option<u64>) -> Psi {
        let line = |total_us| parse::PsiLine {
            total_us,
            ..parse::PsiLine::default()
        };
        Psi {
            some: line(some_us),
            full: full_us.map(line),
        }
    }

    fn v1_tree(root: &Path) -> Cgroups {
        let mut mountinfo = String::new();
        for (i, c) in ["cpu", "cpuacct", "memory", "pids", "blkio"]
            .iter()
            .enumerate()
        {
            let dir = root.join(c);
            std::fs::create_dir_all(&dir).unwrap();
            mountinfo.push_str(&format!(
                "{} 1 0:{} / {} rw - cgroup cgroup rw,{c}\n",
                40 + i,
                60 + i,
                dir.display()
            ));
        }
        // A hybrid host's cgroup2 mount, where PSI lives.
        let unified = root.join("unified");
        std::fs::create_dir_all(&unified).unwrap();
        mountinfo.push_str(&format!(
            "50 1 0:70 / {} rw - cgroup2 cgroup2 rw\n",
            unified.display()
        ));
        Cgroups::v1_from_mountinfo(&mountinfo).unwrap()
    }

    #[test]
    fn v1_metrics_should_read_every_controller_file() {
        let d = tempfile::tempdir().unwrap();
        let cg = v1_tree(d.path());
        let at = |c: &str| d.path().join(c).join("pod/ctr");
        write(
            &at("cpuacct"),
            &[
                ("cpuacct.usage", "3000000000\n"),
                ("cpuacct.usage_user", "2000000000\n"),
                ("cpuacct.usage_sys", "1000000000\n"),
            ],
        );
        write(
            &at("cpu"),
            &[
                (
                    "cpu.stat",
                    "nr_periods 50\nnr_throttled 7\nthrottled_time 900000\n",
                ),
                ("cpu.shares", "1024\n"),
                ("cpu.cfs_quota_us", "20000\n"),
                ("cpu.cfs_period_us", "100000\n"),
            ],
        );
        write(
            &at("memory"),
            &[
                (
                    "memory.stat",
                    "cache 1\nrss 2\ntotal_cache 4096\ntotal_rss 8192\ntotal_mapped_file 512\n\
                     total_inactive_file 1000\ntotal_pgfault 77\ntotal_pgmajfault 3\ntotal_swap 9\n",
                ),
                ("memory.usage_in_bytes", "20000\n"),
                ("memory.max_usage_in_bytes", "30000\n"),
                ("memory.memsw.usage_in_bytes", "20100\n"),
                ("memory.kmem.usage_in_bytes", "640\n"),
                ("memory.failcnt", "5\n"),
                ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
                ("memory.limit_in_bytes", "67108864\n"),
                ("memory.soft_limit_in_bytes", "9223372036854771712\n"),
                ("memory.memsw.limit_in_bytes", "67108864\n"),
            ],
        );
        write(
            &at("pids"),
            &[("pids.current", "4\n"), ("pids.max", "max\n")],
        );
        write(
            &at("blkio"),
            &[
                (
                    "blkio.throttle.io_service_bytes_recursive",
                    "254:0 Read 4096\n254:0 Write 8192\n254:0 Sync 0\n254:0 Total 12288\nTotal 12288\n",
                ),
                ("blkio.throttle.io_serviced_recursive", "254:0 Read 1\n254:0 Write 2\nTotal 3\n"),
            ],
        );
        write(
            &at("unified"),
            &[(
                "io.pressure",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=40\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=30\n",
            )],
        );
        let m = cg.metrics("/pod/ctr").unwrap();
        assert_eq!(
            m,
            CgroupMetrics {
                cpu_usage_ns: Some(3_000_000_000),
                cpu_user_ns: Some(2_000_000_000),
                cpu_system_ns: Some(1_000_000_000),
                cfs_periods: Some(50),
                cfs_throttled_periods: Some(7),
                cfs_throttled_ns: Some(900_000),
                memory_usage: Some(20000),
                memory_max_usage: Some(30000),
                memory_working_set: Some(19000),
                memory_rss: Some(8192),
                memory_cache: Some(4096),
                memory_mapped_file: Some(512),
                memory_swap: Some(100),
                memory_kernel: Some(640),
                memory_failcnt: Some(5),
                pgfault: Some(77),
                pgmajfault: Some(3),
                oom_kills: Some(2),
                tasks: Some(4),
                tasks_max: Some(0),
                cpu_shares: Some(1024),
                cpu_quota_us: Some(20000),
                cpu_period_us: Some(100_000),
                memory_limit: Some(67_108_864),
                memory_reservation: Some(0),
                memory_swap_limit: Some(67_108_864),
                io: vec![DeviceIo {
                    major: 254,
                    minor: 0,
                    read_bytes: 4096,
                    write_bytes: 8192,
                    reads: 1,
                    writes: 2,
                }],
                cpu_pressure: None,
                memory_pressure: None,
                io_pressure: Some(psi(40, Some(30))),
            }
        );
    }

    #[test]
    fn v1_metrics_should_fall_back_to_ticks_and_leave_missing_files_out() {
        let d = tempfile::tempdir().unwrap();
        let cg = v1_tree(d.path());
        write(
            &d.path().join("cpuacct/c"),
            &[
                ("cpuacct.usage", "5\n"),
                ("cpuacct.stat", "user 150\nsystem 20\n"),
            ],
        );
        write(
            &d.path().join("memory/c"),
            &[
                ("memory.stat", "total_rss 1\n"),
                ("memory.usage_in_bytes", "10\n"),
            ],
        );
        let m = cg.metrics("/c").unwrap();
        assert_eq!(m.cpu_user_ns, Some(1_500_000_000));
        assert_eq!(m.cpu_system_ns, Some(200_000_000));
        assert_eq!((m.cfs_periods, m.tasks, m.memory_limit), (None, None, None));
        assert_eq!(m.memory_swap, None);
        // No memory cgroup: the cgroup is gone.
        assert!(matches!(
            cg.metrics("/gone"),
            Err(CgroupError::NotFound { .. })
        ));
    }

    #[test]
    fn v2_metrics_should_read_the_unified_files() {
        let d = tempfile::tempdir().unwrap();
        let cg = Cgroups::v2_at(d.path());
        write(
            &d.path().join("pod/ctr"),
            &[
                (
                    "cpu.stat",
                    "usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n\
                     nr_periods 50\nnr_throttled 7\nthrottled_usec 900\n",
                ),
                ("cpu.weight", "100\n"),
                ("cpu.max", "20000 100000\n"),
                (
                    "memory.stat",
                    "anon 8192\nfile 4096\nkernel 640\nfile_mapped 512\ninactive_file 1000\n\
                     pgfault 77\npgmajfault 3\n",
                ),
                ("memory.current", "20000\n"),
                ("memory.peak", "30000\n"),
                ("memory.swap.current", "100\n"),
                ("memory.events", "low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n"),
                ("memory.max", "67108864\n"),
                ("memory.low", "0\n"),
                ("memory.swap.max", "max\n"),
                ("pids.current", "4\n"),
                ("pids.max", "1024\n"),
                (
                    "io.stat",
                    "254:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n8:0 rbytes=1 wbytes=0 rios=1 wios=0\n",
                ),
                (
                    "cpu.pressure",
                    "some avg10=0.00 avg60=0.00 avg300=0.00 total=300\n\
                     full avg10=0.00 avg60=0.00 avg300=0.00 total=100\n",
                ),
                (
                    "memory.pressure",
                    "some avg10=0.00 avg60=0.00 avg300=0.00 total=20\n\
                     full avg10=0.00 avg60=0.00 avg300=0.00 total=10\n",
                ),
            ],
        );
        let m = cg.metrics("/pod/ctr").unwrap();
        assert_eq!(
            m,
            CgroupMetrics {
                cpu_usage_ns: Some(3_000_000_000),
                cpu_user_ns: Some(2_000_000_000),
                cpu_system_ns: Some(1_000_000_000),
                cfs_periods: Some(50),
                cfs_throttled_periods: Some(7),
                cfs_throttled_ns: Some(900_000),
                memory_usage: Some(20000),
                memory_max_usage: Some(30000),
                memory_working_set: Some(19000),
                memory_rss: Some(8192),
                memory_cache: Some(4096),
                memory_mapped_file: Some(512),
                memory_swap: Some(100),
                memory_kernel: Some(640),
                memory_failcnt: Some(5),
                pgfault: Some(77),
                pgmajfault: Some(3),
                oom_kills: Some(2),
                tasks: Some(4),
                tasks_max: Some(1024),
                // runc maps 1024 shares to weight 39; 100 is 2597 shares.
                cpu_shares: Some(2597),
                cpu_quota_us: Some(20000),
                cpu_period_us: Some(100_000),
                memory_limit: Some(67_108_864),
                memory_reservation: Some(0),
                memory_swap_limit: Some(0),
                io: vec![
                    DeviceIo {
                        major: 254,
                        minor: 0,
                        read_bytes: 4096,
                        write_bytes: 8192,
                        reads: 1,
                        writes: 2,
                    },
                    DeviceIo {
                        major: 8,
                        minor: 0,
                        read_bytes: 1,
                        reads: 1,
                        ..DeviceIo::default()
                    },
                ],
                cpu_pressure: Some(psi(300, Some(100))),
                memory_pressure: Some(psi(20, Some(10))),
                io_pressure: None,
            }
        );
    }

    #[test]
    fn v2_metrics_should_cope_without_the_memory_controller() {
        let d = tempfile::tempdir().unwrap();
        let cg = Cgroups::v2_at(d.path());
        write(
            &d.path().join("c"),
            &[
                ("cpu.stat", "usage_usec 10\nuser_usec 6\nsystem_usec 4\n"),
                ("cpu.max", "max 100000\n"),
                ("memory.stat", "kernel_stack 10\npagetables 20\n"),
            ],
        );
        let m = cg.metrics("/c").unwrap();
        assert_eq!(m.cpu_usage_ns, Some(10_000));
        assert_eq!((m.cpu_quota_us, m.cpu_period_us), (None, Some(100_000)));
        assert_eq!((m.memory_usage, m.memory_working_set), (None, None));
        assert_eq!(m.memory_kernel, Some(30));
        assert_eq!(m.cfs_periods, None);
        assert!(matches!(
            cg.metrics("/gone"),
            Err(CgroupError::NotFound { .. })
        ));
    }

    #[test]
    fn weight_to_shares_should_invert_runcs_mapping() {
        // runc: weight = 1 + (shares - 2) * 9999 / 262142.
        for shares in [2u64, 1024, 262_144] {
            let weight = 1 + (shares - 2) * 9999 / 262_142;
            let back = weight_to_shares(weight);
            assert!(
                back.abs_diff(shares) <= 27,
                "{shares} -> {weight} -> {back}"
            );
        }
    }
}
