//! What /proc says about a process: memory, CPU time, command line.

use std::path::Path;

use anyhow::{anyhow, Context, Result};

/// Resident and proportional set size of a process, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mem {
    /// Resident set size.
    pub rss_kib: u64,
    /// Proportional set size: shared pages divided among their users.
    pub pss_kib: u64,
    /// Unique set size: pages no other process maps (Private_Clean +
    /// Private_Dirty), what the process alone costs.
    pub uss_kib: u64,
    /// Anonymous memory (heap, stacks, dirtied data).
    pub anon_kib: u64,
}

/// Reads `Rss` and `Pss` from `/proc/<pid>/smaps_rollup`.
pub fn mem(pid: u32) -> Result<Mem> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    parse_smaps_rollup(&text).ok_or_else(|| anyhow!("no Rss/Pss in {path}"))
}

fn parse_smaps_rollup(text: &str) -> Option<Mem> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    Some(Mem {
        rss_kib: field("Rss")?,
        pss_kib: field("Pss")?,
        uss_kib: field("Private_Clean")? + field("Private_Dirty")?,
        anon_kib: field("Anonymous")?,
    })
}

/// CPU time of a process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cpu {
    /// utime + stime from `/proc/<pid>/stat`, in clock ticks (includes
    /// threads that have exited).
    pub ticks: u64,
    /// Sum of the first field of `/proc/<pid>/task/*/schedstat`: on-CPU
    /// nanoseconds of the live threads (finer than ticks).
    pub sched_ns: u64,
}

impl Cpu {
    /// The difference `self - before`, saturating at zero.
    pub fn since(self, before: Cpu) -> Cpu {
        Cpu {
            ticks: self.ticks.saturating_sub(before.ticks),
            sched_ns: self.sched_ns.saturating_sub(before.sched_ns),
        }
    }

    /// The sum of two readings.
    pub fn plus(self, other: Cpu) -> Cpu {
        Cpu {
            ticks: self.ticks + other.ticks,
            sched_ns: self.sched_ns + other.sched_ns,
        }
    }
}

/// Reads a process's CPU time.
pub fn cpu(pid: u32) -> Result<Cpu> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let ticks = parse_stat_cpu(&text).ok_or_else(|| anyhow!("cannot parse {path}"))?;
    let mut sched_ns = 0;
    let tasks = format!("/proc/{pid}/task");
    for t in std::fs::read_dir(&tasks).with_context(|| format!("read {tasks}"))? {
        let t = t.with_context(|| format!("read {tasks}"))?;
        // A thread may exit between the listing and the read.
        if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
            sched_ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(Cpu { ticks, sched_ns })
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
fn parse_stat_cpu(text: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses: fields are counted
    // from after the last ')'. Field 3 (state) is the first one after it.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (USER_HZ).
pub fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

/// The NUL-separated arguments of a process, or nothing if it is gone.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The shims of the runtime whose state directory is `state`: processes
/// whose command line has `--bundle <state>/containers/...`. Other
/// runtimes' shims on the same host (tests, demos) are never matched.
pub fn shims_of(state: &Path) -> Result<Vec<u32>> {
    let prefix = format!("{}/containers/", state.display());
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc").context("read /proc")? {
        let Ok(e) = e else { continue };
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if is_shim_of(&cmdline(pid), &prefix) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

fn is_shim_of(argv: &[String], bundle_prefix: &str) -> bool {
    argv.windows(2)
        .any(|w| w[0] == "--bundle" && w[1].starts_with(bundle_prefix))
}

/// Whether a process has exited and waits to be reaped (or is gone).
pub fn is_zombie(pid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = text
        .rfind(')')
        .and_then(|i| text[i + 1..].split_whitespace().next());
    matches!(state, Some("Z" | "X") | None)
}

/// Threads alive on the machine (every pid is a task) and the kernel's
/// limit on pids.
pub fn tasks_and_pid_max() -> (usize, usize) {
    let mut n = 0;
    if let Ok(it) = std::fs::read_dir("/proc") {
        for e in it.flatten() {
            if e.file_name()
                .to_str()
                .is_some_and(|s| s.parse::<u32>().is_ok())
            {
                n += std::fs::read_dir(e.path().join("task"))
                    .map(|t| t.count())
                    .unwrap_or(0);
            }
        }
    }
    let max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    (n, max)
}

/// The parent pid of a process.
pub fn ppid(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_rollup_should_yield_rss_and_pss() {
        let text = "00400000-7ffc r--p 00000000 00:00 0 [rollup]\n\
                    Rss:                 812 kB\n\
                    Pss:                 301 kB\n\
                    Pss_Dirty:           120 kB\n\
                    Shared_Clean:        700 kB\n\
                    Private_Clean:        12 kB\n\
                    Private_Dirty:       100 kB\n\
                    Anonymous:           104 kB\n";
        assert_eq!(
            parse_smaps_rollup(text),
            Some(Mem {
                rss_kib: 812,
                pss_kib: 301,
                uss_kib: 112,
                anon_kib: 104,
            })
        );
        assert_eq!(parse_smaps_rollup("Rss: 1 kB\n"), None);
    }

    #[test]
    fn stat_should_count_fields_after_the_last_parenthesis() {
        let text = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 9 0 0";
        assert_eq!(parse_stat_cpu(text), Some(12));
    }

    #[test]
    fn shim_should_be_recognised_by_its_bundle_only() {
        let argv = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        let prefix = "/tmp/b.1/state/containers/";
        assert!(is_shim_of(
            &argv("/x/petrel-shim --id a --bundle /tmp/b.1/state/containers/a --runc runc"),
            prefix
        ));
        assert!(!is_shim_of(
            &argv("/x/petrel-shim --id a --bundle /tmp/other/state/containers/a"),
            prefix
        ));
        assert!(!is_shim_of(&argv("/x/petrel-shim --pid-holder"), prefix));
    }
}
