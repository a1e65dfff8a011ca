//! Runs that died without cleaning up. A test process killed with SIGKILL
//! runs no `Drop`: its temporary directory, the mounts below it, its runc
//! containers and its cgroup parent would stay forever. Every directory the
//! kit makes ([`crate::process::kit_tempdir`]) therefore carries an owner
//! file naming the process that made it (pid, its start time and the boot,
//! so that a reused pid is not mistaken for the owner) and what to sweep
//! beyond the directory (runc roots, cgroups). The first launcher of a test
//! process sweeps, once, every directory of the kit's naming whose owner is
//! dead ([`sweep_stale_runs_once`]); a directory whose owner lives, or that
//! has no owner file of this format, is never touched.

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::process::{mounts_under, remove_cgroup_tree, runc_sweep, unmount_under};
use crate::KitError;

/// The owner file's name inside a kit directory.
pub const OWNER_FILE: &str = ".petrel-kit-owner";

/// The owner file's first line: a file without it is not the kit's.
const MAGIC: &str = "petrel-testkit owner v1";

/// How the kit's directories are named (the prefixes given to
/// [`crate::process::kit_tempdir`]): `petrel-*`, and the short `pcd.`,
/// `pkp.`, `pkc.` that keep socket paths below 108 bytes.
const DIR_PREFIXES: [&str; 4] = ["petrel-", "pcd.", "pkp.", "pkc."];

/// How the kit names the cgroups it makes (`/<prefix><random>`).
const CGROUP_PREFIXES: [&str; 3] = ["petrel-test-", "petrel-kubelet-", "petrel-conformance-"];

/// The process that made a kit directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The kernel's boot id when it was written (pids restart at boot).
    pub boot_id: String,
    /// Its pid.
    pub pid: u32,
    /// Its start time, in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start_time: u64,
}

impl Owner {
    /// This process.
    pub fn current() -> Option<Owner> {
        let pid = std::process::id();
        Some(Owner {
            boot_id: boot_id(),
            pid,
            start_time: process_start_time(pid)?,
        })
    }

    /// Process `pid` as it is now (None when there is none).
    pub fn of_pid(pid: u32) -> Option<Owner> {
        Some(Owner {
            boot_id: boot_id(),
            pid,
            start_time: process_start_time(pid)?,
        })
    }

    /// Whether this owner is still running: same boot, a process with its
    /// pid that started when it did and has not exited (a zombie has).
    pub fn is_alive(&self) -> bool {
        self.boot_id == boot_id()
            && process_stat(self.pid).is_some_and(|(state, start)| {
                state != 'Z' && state != 'X' && start == self.start_time
            })
    }
}

/// What an owner file records: the owner, and what to sweep beyond the
/// directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Who made the directory.
    pub owner: Owner,
    /// Cgroups of the run (kit-named only are swept).
    pub cgroups: Vec<String>,
    /// runc roots of the run, inside the directory: (runc binary, root).
    pub runc_roots: Vec<(PathBuf, PathBuf)>,
}

impl Record {
    fn render(&self) -> String {
        let mut s = format!(
            "{MAGIC}\nboot\t{}\npid\t{}\nstart\t{}\n",
            self.owner.boot_id, self.owner.pid, self.owner.start_time
        );
        for c in &self.cgroups {
            s.push_str(&format!("cgroup\t{c}\n"));
        }
        for (runc, root) in &self.runc_roots {
            s.push_str(&format!("runc\t{}\t{}\n", runc.display(), root.display()));
        }
        s
    }

    /// Parses an owner file; None for anything not exactly of its format.
    fn parse(text: &str) -> Option<Record> {
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let (mut boot, mut pid, mut start) = (None, None, None);
        let mut rec = Record {
            owner: Owner {
                boot_id: String::new(),
                pid: 0,
                start_time: 0,
            },
            cgroups: vec![],
            runc_roots: vec![],
        };
        for l in lines {
            let f: Vec<&str> = l.split('\t').collect();
            match f.as_slice() {
                ["boot", b] => boot = Some(b.to_string()),
                ["pid", p] => pid = Some(p.parse().ok()?),
                ["start", t] => start = Some(t.parse().ok()?),
                ["cgroup", c] => rec.cgroups.push(c.to_string()),
                ["runc", bin, root] => rec.runc_roots.push((bin.into(), root.into())),
                _ => return None,
            }
        }
        rec.owner = Owner {
            boot_id: boot?,
            pid: pid?,
            start_time: start?,
        };
        Some(rec)
    }
}

/// The kernel's boot id ("" if unreadable).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Process `pid`'s state letter and start time, from `/proc/PID/stat`.
fn process_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ...: comm may hold spaces and ')', split after the last.
    let (_, tail) = stat.rsplit_once(')')?;
    let f: Vec<&str> = tail.split_whitespace().collect();
    // Field 3 (state) is f[0], so field 22 (starttime) is f[19].
    Some((f.first()?.chars().next()?, f.get(19)?.parse().ok()?))
}

/// Process `pid`'s start time in clock ticks after boot.
pub fn process_start_time(pid: u32) -> Option<u64> {
    process_stat(pid).map(|(_, t)| t)
}

/// Writes the owner file of `dir`: this process made it.
pub fn claim(dir: &Path) -> Result<(), KitError> {
    let owner = Owner::current().ok_or_else(|| {
        KitError::io(
            "read start time of this process",
            "/proc/self/stat",
            std::io::Error::other("unreadable"),
        )
    })?;
    write_record(
        dir,
        &Record {
            owner,
            cgroups: vec![],
            runc_roots: vec![],
        },
    )
}

/// Writes the owner file atomically: a reader sees the old or the new.
fn write_record(dir: &Path, rec: &Record) -> Result<(), KitError> {
    let tmp = dir.join(format!("{OWNER_FILE}.tmp"));
    std::fs::write(&tmp, rec.render()).map_err(|e| KitError::io("write", &tmp, e))?;
    let file = dir.join(OWNER_FILE);
    std::fs::rename(&tmp, &file).map_err(|e| KitError::io("rename", &file, e))
}

/// Adds to `dir`'s owner file (if it has one) with `f`.
fn amend(dir: &Path, f: impl FnOnce(&mut Record)) {
    let Some(mut rec) = read_record(dir) else {
        return;
    };
    f(&mut rec);
    // Best effort: a failure costs only the sweep after a hard death.
    let _ = write_record(dir, &rec);
}

/// Records in `dir`'s owner file that the run uses cgroup `path`, for the
/// sweep after a hard death (only kit-named cgroups are ever swept).
pub fn record_cgroup(dir: &Path, path: &str) {
    amend(dir, |r| r.cgroups.push(path.to_string()));
}

/// Records in `dir`'s owner file that the run keeps runc containers in
/// `root` (inside `dir`), managed with the binary `runc`.
pub fn record_runc_root(dir: &Path, runc: &Path, root: &Path) {
    amend(dir, |r| r.runc_roots.push((runc.into(), root.into())));
}

fn read_record(dir: &Path) -> Option<Record> {
    Record::parse(&std::fs::read_to_string(dir.join(OWNER_FILE)).ok()?)
}

/// Whether `name` is of the kit's directory naming.
fn is_kit_dir_name(name: &str) -> bool {
    DIR_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether `path` is a cgroup the kit names (`/petrel-test-…`, ...): the
/// only cgroups a sweep removes, whatever an owner file says.
pub fn is_kit_cgroup(path: &str) -> bool {
    let Some(name) = path.strip_prefix('/') else {
        return false;
    };
    CGROUP_PREFIXES.iter().any(|p| {
        name.strip_prefix(p)
            .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric()))
    })
}

/// What to do with a directory found in the kit's temporary directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not of the kit's naming, not a plain directory, or no owner file of
    /// the kit's format: never touched.
    NotOurs,
    /// Its owner is running: it is that run's.
    OwnerAlive,
    /// Its owner is gone: sweep it.
    Stale(Record),
}

/// Judges `dir`, asking `alive` whether an owner is running.
pub fn judge(dir: &Path, alive: impl Fn(&Owner) -> bool) -> Verdict {
    let named = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(is_kit_dir_name);
    // A symlink is never followed: the kit makes directories.
    let plain_dir = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
    if !named || !plain_dir {
        return Verdict::NotOurs;
    }
    match read_record(dir) {
        None => Verdict::NotOurs,
        Some(r) if alive(&r.owner) => Verdict::OwnerAlive,
        Some(r) => Verdict::Stale(r),
    }
}

/// Sweeps every directory in `base` whose owner is dead; returns those
/// removed.
pub fn sweep_stale_runs(base: &Path) -> Vec<PathBuf> {
    let mut removed = vec![];
    let Ok(it) = std::fs::read_dir(base) else {
        return removed;
    };
    for e in it.flatten() {
        let dir = e.path();
        if let Verdict::Stale(rec) = judge(&dir, Owner::is_alive) {
            if sweep_run(&dir, &rec) {
                removed.push(dir);
            }
        }
    }
    removed
}

/// [`sweep_stale_runs`] of the kit's temporary directory, once per process
/// (the first launcher calls it).
pub fn sweep_stale_runs_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for d in sweep_stale_runs(&crate::process::kit_tmp_dir()) {
            eprintln!("petrel-testkit: swept stale run {}", d.display());
        }
    });
}

/// Sweeps one dead run's directory: its processes (those whose executable
/// or command line names the directory), runc containers, mounts (deepest
/// first, lazily) and kit-named cgroups, then the directory itself, unless
/// a mount below it is still there. Returns whether it was removed.
fn sweep_run(dir: &Path, rec: &Record) -> bool {
    kill_processes_in(dir);
    for (runc, root) in &rec.runc_roots {
        if root.starts_with(dir) {
            runc_sweep(runc, root);
        }
    }
    unmount_under(dir);
    for c in rec.cgroups.iter().filter(|c| is_kit_cgroup(c)) {
        remove_cgroup_tree(c);
    }
    // Never remove through a mount that would not go: it may be a host
    // directory bound into a container.
    if !mounts_under(dir).is_empty() {
        return false;
    }
    std::fs::remove_dir_all(dir).is_ok()
}

/// SIGKILLs every process (but this one) whose executable lies in `dir` or
/// whose command line names `dir` or a path below it (the daemons and
/// shims of a dead run), and waits up to 2 s for them to be gone.
fn kill_processes_in(dir: &Path) {
    let me = std::process::id();
    let d = dir.display().to_string();
    let below = format!("{d}/");
    let mut killed = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let exe_in = std::fs::read_link(e.path().join("exe")).is_ok_and(|x| x.starts_with(dir));
        let names = std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            c.split(|b| *b == 0).any(|a| {
                let a = String::from_utf8_lossy(a);
                a == d || a.contains(&below)
            })
        });
        if exe_in || names {
            if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
                killed.push(pid);
            }
        }
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2)
        && killed
            .iter()
            .any(|p| process_stat(*p).is_some_and(|(s, _)| s != 'Z' && s != 'X'))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// An owner that ran and has exited: `true`, started and reaped.
    fn dead_owner() -> Owner {
        let mut c = std::process::Command::new("true").spawn().expect("spawn");
        // Unreaped, it keeps its /proc entry and start time.
        let start = Instant::now();
        let owner = loop {
            if let Some(o) = Owner::of_pid(c.id()) {
                break o;
            }
            assert!(start.elapsed() < Duration::from_secs(5));
        };
        c.wait().expect("wait");
        owner
    }

    fn kit_dir(base: &Path, name: &str, owner: Option<&Owner>) -> PathBuf {
        let d = base.join(name);
        std::fs::create_dir_all(d.join("state")).unwrap();
        if let Some(o) = owner {
            write_record(
                &d,
                &Record {
                    owner: o.clone(),
                    cgroups: vec![],
                    runc_roots: vec![],
                },
            )
            .unwrap();
        }
        d
    }

    #[test]
    fn owner_should_be_alive_for_this_process_and_dead_once_exited() {
        assert!(Owner::current().unwrap().is_alive());
        assert!(!dead_owner().is_alive());
    }

    #[test]
    fn owner_should_not_be_mistaken_for_a_reused_pid_or_another_boot() {
        let me = Owner::current().unwrap();
        let reused = Owner {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(!reused.is_alive(), "same pid, another start time");
        let other_boot = Owner {
            boot_id: "another-boot".into(),
            ..me
        };
        assert!(!other_boot.is_alive());
    }

    #[test]
    fn judge_should_tell_alive_dead_reused_and_foreign_dirs_apart() {
        let base = tempfile::tempdir().unwrap();
        let me = Owner::current().unwrap();
        let live = kit_dir(base.path(), "petrel-e2e.live", Some(&me));
        assert_eq!(judge(&live, Owner::is_alive), Verdict::OwnerAlive);

        let dead = dead_owner();
        let gone = kit_dir(base.path(), "pkp.gone", Some(&dead));
        assert!(matches!(judge(&gone, Owner::is_alive), Verdict::Stale(r) if r.owner == dead));

        let reused = Owner {
            start_time: me.start_time + 7,
            ..me.clone()
        };
        let r = kit_dir(base.path(), "pcd.reused", Some(&reused));
        assert!(matches!(judge(&r, Owner::is_alive), Verdict::Stale(_)));

        // No owner file, another format, or not the kit's naming: never ours.
        let none = kit_dir(base.path(), "petrel-e2e.none", None);
        assert_eq!(judge(&none, |_| false), Verdict::NotOurs);
        let other = kit_dir(base.path(), "petrel-e2e.other", None);
        std::fs::write(other.join(OWNER_FILE), "pid 1\n").unwrap();
        assert_eq!(judge(&other, |_| false), Verdict::NotOurs);
        let foreign = kit_dir(base.path(), "someone-else.x", Some(&dead));
        assert_eq!(judge(&foreign, |_| false), Verdict::NotOurs);
        // A symlink to a kit directory is not followed.
        let link = base.path().join("pkc.link");
        std::os::unix::fs::symlink(&gone, &link).unwrap();
        assert_eq!(judge(&link, |_| false), Verdict::NotOurs);
    }

    #[test]
    fn record_should_round_trip_and_keep_what_is_added() {
        let base = tempfile::tempdir().unwrap();
        let d = base.path().join("pkp.x");
        std::fs::create_dir(&d).unwrap();
        claim(&d).unwrap();
        record_cgroup(&d, "/petrel-test-abc");
        record_runc_root(&d, Path::new("/usr/sbin/runc"), &d.join("state/runc"));
        let r = read_record(&d).unwrap();
        assert_eq!(r.owner, Owner::current().unwrap());
        assert_eq!(r.cgroups, vec!["/petrel-test-abc".to_string()]);
        assert_eq!(
            r.runc_roots,
            vec![(PathBuf::from("/usr/sbin/runc"), d.join("state/runc"))]
        );
        // Truncated or extended: not the kit's format.
        assert_eq!(Record::parse(&r.render().replace("start", "begin")), None);
        assert_eq!(Record::parse("petrel-testkit owner v1\nboot\tb\n"), None);
    }

    #[test]
    fn is_kit_cgroup_should_accept_only_the_kits_names() {
        assert!(is_kit_cgroup("/petrel-test-3fa2b1c0d9e8"));
        assert!(is_kit_cgroup("/petrel-kubelet-3fa2"));
        assert!(is_kit_cgroup("/petrel-conformance-3fa2"));
        for bad in [
            "/petrel-test-",
            "petrel-test-3fa2",
            "/petrel-test-3fa2/../../x",
            "/petrel-bench-3fa2",
            "/kubepods",
            "/",
        ] {
            assert!(!is_kit_cgroup(bad), "{bad}");
        }
    }

    /// As root: a dead run's directory with a tmpfs mounted inside and a
    /// cgroup of its own is swept; a live run's and a foreign one stay.
    #[test]
    fn sweep_stale_runs_should_remove_a_dead_runs_mounts_cgroups_and_dir_only() {
        let base = tempfile::tempdir().unwrap();
        let dead = dead_owner();
        let stale = kit_dir(base.path(), "petrel-e2e.stale", Some(&dead));
        let me = Owner::current().unwrap();
        let live = kit_dir(base.path(), "petrel-e2e.live", Some(&me));
        let foreign = kit_dir(base.path(), "petrel-e2e.foreign", None);
        let tmpfs = |d: &Path| {
            let m = d.join("root/deep");
            std::fs::create_dir_all(&m).unwrap();
            for at in [d.join("root"), m] {
                rustix::mount::mount(
                    "tmpfs",
                    &at,
                    "tmpfs",
                    rustix::mount::MountFlags::empty(),
                    c"size=1m",
                )
                .unwrap();
                std::fs::create_dir_all(at.join("deep")).unwrap();
            }
        };
        tmpfs(&stale);
        tmpfs(&live);
        let cgroup = format!("/petrel-test-{}", crate::process::random_suffix());
        let memory = Path::new("/sys/fs/cgroup/memory").join(&cgroup[1..]);
        std::fs::create_dir_all(memory.join("pod")).unwrap();
        record_cgroup(&stale, &cgroup);
        record_runc_root(&stale, Path::new("runc"), &stale.join("state/runc"));

        let removed = sweep_stale_runs(base.path());

        let live_mounts = mounts_under(&live);
        unmount_under(&live);
        assert_eq!(removed, vec![stale.clone()]);
        assert!(!stale.exists(), "the stale run's directory is gone");
        assert!(mounts_under(&stale).is_empty(), "its mounts are gone");
        assert!(!memory.exists(), "its cgroup is gone");
        assert!(live.join(OWNER_FILE).is_file(), "the live run's stays");
        assert_eq!(live_mounts.len(), 2, "with its mounts: {live_mounts:?}");
        assert!(foreign.is_dir(), "a directory without owner file stays");
    }
}
