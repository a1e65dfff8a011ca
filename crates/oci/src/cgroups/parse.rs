//! Parsers of `/proc/self/mountinfo` and of cgroup interface files (pure functions).

use std::path::PathBuf;

/// v1 controllers we recognise among the super options of a `cgroup` mount.
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// A v1 memory limit at or above this means "unlimited" (the kernel reports
/// `PAGE_COUNTER_MAX` pages, about 2^63 bytes rounded down to a page).
const V1_UNLIMITED: u64 = 1 << 62;

/// A cgroup hierarchy mounted on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    /// Controllers attached to it (`name=systemd` for named hierarchies); empty for cgroup2.
    pub controllers: Vec<String>,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// True for a `cgroup2` mount.
    pub unified: bool,
}

/// Cgroup mounts of a `/proc/<pid>/mountinfo`, first mount of each hierarchy only.
pub fn cgroup_mounts(mountinfo: &str) -> Vec<Mounted> {
    let mut out: Vec<Mounted> = Vec::new();
    for line in mountinfo.lines() {
        // id parent major:minor root mountpoint options [optional...] - fstype source super
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(mountpoint), Some(fstype)) = (left.get(4), right.first()) else {
            continue;
        };
        let mountpoint = PathBuf::from(unescape(mountpoint));
        let m = match *fstype {
            "cgroup2" => Mounted {
                controllers: Vec::new(),
                mountpoint,
                unified: true,
            },
            "cgroup" => {
                let controllers: Vec<String> = right
                    .get(2)
                    .copied()
                    .unwrap_or_default()
                    .split(',')
                    .filter(|o| V1_CONTROLLERS.contains(o) || o.starts_with("name="))
                    .map(str::to_string)
                    .collect();
                if controllers.is_empty() {
                    continue;
                }
                Mounted {
                    controllers,
                    mountpoint,
                    unified: false,
                }
            }
            _ => continue,
        };
        // The same hierarchy may be mounted twice (bind mounts): keep the first.
        let dup = out
            .iter()
            .any(|o| o.unified == m.unified && (m.unified || o.controllers == m.controllers));
        if !dup {
            out.push(m);
        }
    }
    out
}

/// Undoes the octal escapes (`\040` for a space) of mountinfo paths.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = &b[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of `key` in a flat keyed file (`key value` per line: memory.stat,
/// cpu.stat, memory.events, memory.oom_control).
pub fn keyed(contents: &str, key: &str) -> Option<u64> {
    contents.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == key).then(|| f.next()?.parse().ok())?
    })
}

/// One line of a PSI file: the share of time stalled over the last 10,
/// 60 and 300 s (in hundredths of a percent, as the kernel prints them
/// with two decimals) and the cumulative stall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PsiLine {
    /// `avg10`, hundredths of a percent.
    pub avg10_centi: u32,
    /// `avg60`, hundredths of a percent.
    pub avg60_centi: u32,
    /// `avg300`, hundredths of a percent.
    pub avg300_centi: u32,
    /// `total`, µs.
    pub total_us: u64,
}

/// A PSI file (`cpu.pressure`, `memory.pressure`, `io.pressure`):
/// `some` (at least one task stalled) and `full` (every task stalled at
/// once; absent for cpu on kernels before 5.13).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Psi {
    /// The `some` line.
    pub some: PsiLine,
    /// The `full` line.
    pub full: Option<PsiLine>,
}

/// Parses a PSI file: lines `some|full avg10=A avg60=B avg300=C total=N`.
pub fn psi(contents: &str) -> Option<Psi> {
    let line = |kind: &str| {
        contents.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == kind).then(|| psi_line(f))?
        })
    };
    Some(Psi {
        some: line("some")?,
        full: line("full"),
    })
}

fn psi_line<'a>(fields: impl Iterator<Item = &'a str>) -> Option<PsiLine> {
    let mut out = PsiLine::default();
    let mut total = None;
    for kv in fields {
        let (k, v) = kv.split_once('=')?;
        match k {
            "avg10" => out.avg10_centi = centi(v)?,
            "avg60" => out.avg60_centi = centi(v)?,
            "avg300" => out.avg300_centi = centi(v)?,
            "total" => total = Some(v.parse().ok()?),
            _ => {}
        }
    }
    out.total_us = total?;
    Some(out)
}

/// `12.34` → 1234.
fn centi(v: &str) -> Option<u32> {
    let (whole, frac) = v.split_once('.').unwrap_or((v, "0"));
    let frac: String = frac.chars().chain("00".chars()).take(2).collect();
    whole
        .parse::<u32>()
        .ok()?
        .checked_mul(100)?
        .checked_add(frac.parse().ok()?)
}

/// A single-number file (`memory.usage_in_bytes`, `cpuacct.usage`, `pids.current`).
pub fn single(contents: &str) -> Option<u64> {
    contents.trim().parse().ok()
}

/// A v2 limit file (`memory.max`, `pids.max`): `max` is `None`.
pub fn v2_limit(contents: &str) -> Option<u64> {
    match contents.trim() {
        "max" => None,
        v => v.parse().ok(),
    }
}

/// A v1 limit (`memory.limit_in_bytes`): the huge "unlimited" value is `None`.
pub fn v1_limit(contents: &str) -> Option<u64> {
    single(contents).filter(|v| *v < V1_UNLIMITED)
}

/// The process ids of a `cgroup.procs` file.
pub fn procs(contents: &str) -> Vec<u32> {
    contents
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Working set as kubelet computes it: usage minus inactive file pages, never negative.
pub fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

/// The v1 hierarchical value of `memory.stat` (`total_<key>`), else the local one.
pub fn v1_memory_stat(contents: &str, key: &str) -> Option<u64> {
    keyed(contents, &format!("total_{key}")).or_else(|| keyed(contents, key))
}

#[cfg(test)]
mod tests {
    #[test]
    fn psi_should_read_some_and_full_lines() {
        use super::{psi, Psi, PsiLine};
        let text = "some avg10=1.50 avg60=0.12 avg300=10.00 total=1234\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=56\n";
        assert_eq!(
            psi(text),
            Some(Psi {
                some: PsiLine {
                    avg10_centi: 150,
                    avg60_centi: 12,
                    avg300_centi: 1000,
                    total_us: 1234
                },
                full: Some(PsiLine {
                    total_us: 56,
                    ..PsiLine::default()
                }),
            })
        );
        let some_only = "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n";
        assert_eq!(
            psi(some_only).map(|p| (p.some.total_us, p.full)),
            Some((7, None))
        );
        assert_eq!(psi(""), None);
        assert_eq!(psi("some avg10=1 total=x\n"), None);
        assert_eq!(psi("some avg10=1.5\n"), None, "no total");
    }

    use super::*;

    const HYBRID: &str = "\
23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset,clone_children
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
99 23 0:32 / /mnt/mem\\040copy rw,relatime - cgroup cgroup rw,memory
";

    #[test]
    fn cgroup_mounts_should_find_v1_controllers_and_the_unified_mount() {
        let m = cgroup_mounts(HYBRID);
        let got: Vec<(Vec<String>, String, bool)> = m
            .iter()
            .map(|m| {
                (
                    m.controllers.clone(),
                    m.mountpoint.display().to_string(),
                    m.unified,
                )
            })
            .collect();
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            got,
            vec![
                (s(&["cpu"]), "/sys/fs/cgroup/cpu".into(), false),
                (s(&["cpuacct"]), "/sys/fs/cgroup/cpuacct".into(), false),
                (s(&["cpuset"]), "/sys/fs/cgroup/cpuset".into(), false),
                (s(&["memory"]), "/sys/fs/cgroup/memory".into(), false),
                (s(&["name=systemd"]), "/sys/fs/cgroup/systemd".into(), false),
                (vec![], "/sys/fs/cgroup/unified".into(), true),
            ]
        );
    }

    #[test]
    fn cgroup_mounts_should_keep_co_mounted_controllers_together() {
        let m = cgroup_mounts(
            "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        );
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].controllers, ["cpu", "cpuacct"]);
        assert_eq!(m[0].mountpoint, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
    }

    #[test]
    fn cgroup_mounts_should_find_a_pure_v2_mount() {
        let m = cgroup_mounts(
            "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
        );
        assert_eq!(m.len(), 1);
        assert!(m[0].unified);
    }

    #[test]
    fn unescape_should_decode_octal_escapes() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/trailing\\"), "/trailing\\");
        assert_eq!(unescape("/short\\04"), "/short\\04");
    }

    #[test]
    fn keyed_should_read_v1_and_v2_stat_files() {
        let v1 = "cache 100\nrss 200\ntotal_rss 300\ntotal_inactive_file 40\n";
        assert_eq!(keyed(v1, "rss"), Some(200));
        assert_eq!(v1_memory_stat(v1, "rss"), Some(300));
        assert_eq!(v1_memory_stat(v1, "inactive_file"), Some(40));
        assert_eq!(v1_memory_stat(v1, "pgfault"), None);
        let cpu = "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n";
        assert_eq!(keyed(cpu, "usage_usec"), Some(1234));
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed(oom, "oom_kill"), Some(3));
        let events = "low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(2));
        assert_eq!(keyed(events, "oom_kil"), None);
    }

    #[test]
    fn limits_should_map_unlimited_to_none() {
        assert_eq!(v2_limit("max\n"), None);
        assert_eq!(v2_limit("1048576\n"), Some(1_048_576));
        assert_eq!(v1_limit("9223372036854771712\n"), None);
        assert_eq!(v1_limit("104857600\n"), Some(104_857_600));
    }

    #[test]
    fn working_set_should_never_be_negative() {
        assert_eq!(working_set(100, 30), 70);
        assert_eq!(working_set(10, 30), 0);
    }

    #[test]
    fn procs_should_parse_one_pid_per_line() {
        assert_eq!(procs("12\n345\n\n"), [12, 345]);
        assert!(procs("").is_empty());
    }
}
