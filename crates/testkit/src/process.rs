//! Processes, mounts and cgroups of a run: start a peer with its log, stop
//! it by pid, and sweep what it left in places that are the run's own.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

use crate::KitError;

/// Twelve random hex digits, for names no other run picks.
pub fn random_suffix() -> String {
    let mut b = [0u8; 6];
    // Without randomness the time is unique enough for names of a run.
    if getrandom::getrandom(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b.copy_from_slice(&t.to_le_bytes()[..6]);
    }
    hex::encode(b)
}

/// Where the kit makes the temporary directories of the peers it starts
/// (runtimes, kubelets, networks, registries): `PETREL_KIT_TMPDIR`, else
/// `/tmp`. `make bench` points it into its own work directory, so that its
/// trap can sweep whatever a bench that died hard left there. Keep it short:
/// unix socket paths inside are limited to 108 bytes.
pub fn kit_tmp_dir() -> PathBuf {
    std::env::var_os("PETREL_KIT_TMPDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// A new temporary directory `<prefix>XXXXXX` in [`kit_tmp_dir`] (created
/// if missing), removed on drop, with an owner file naming this process
/// ([`crate::stale`]). `prefix` is `petrel-…`, `pcd.`, `pkp.` or `pkc.`:
/// the names a sweep of stale runs looks at. The first call of a process
/// sweeps the directories of runs that died without cleaning up.
pub fn kit_tempdir(prefix: &str) -> Result<tempfile::TempDir, KitError> {
    crate::stale::sweep_stale_runs_once();
    let base = kit_tmp_dir();
    std::fs::create_dir_all(&base).map_err(|e| KitError::io("create directory", &base, e))?;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .map_err(|e| KitError::io("create", &base, e))?;
    crate::stale::claim(dir.path())?;
    Ok(dir)
}

/// Writes `pid` to `<dir>/<name>.pid`: what a sweep outside this process
/// (scripts/bench.sh's trap) stops, after checking that the process's
/// command line names its directory. Best effort: a missing pid file only
/// costs that sweep.
pub fn write_pid_file(dir: &Path, name: &str, pid: u32) {
    let _ = std::fs::write(dir.join(format!("{name}.pid")), pid.to_string());
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16, KitError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| KitError::io("bind", "127.0.0.1:0", e))
}

/// A command line as one string, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Starts `cmd` with stdin closed and stdout and stderr appended to `log`.
pub fn spawn_logged(component: &str, cmd: &mut Command, log: &Path) -> Result<Child, KitError> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| KitError::io("open", log, e))?;
    let err = out.try_clone().map_err(|e| KitError::io("open", log, e))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| KitError::Start {
            component: component.to_string(),
            command: describe(cmd),
            log: log.to_path_buf(),
            detail: e.to_string(),
        })
}

/// Sends `sig` to process `pid` (our child), ignoring a process gone.
pub fn signal(pid: u32, sig: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// SIGTERM to our child, up to `grace` for it to exit, then SIGKILL; the
/// child is reaped either way. Returns its exit status and whether it had
/// to be killed (None if it could not be waited for).
pub fn stop_child(child: &mut Child, grace: Duration) -> Option<(ExitStatus, bool)> {
    signal(child.id(), Signal::TERM);
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(st)) = child.try_wait() {
            return Some((st, false));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_child(child).map(|st| (st, true))
}

/// SIGKILL to our child, and reaps it.
pub fn kill_child(child: &mut Child) -> Option<ExitStatus> {
    let _ = child.kill();
    child.wait().ok()
}

/// Waits up to `within` for `ready` to hold, failing early (with the
/// command and log in the error) when `child` exits.
pub fn wait_until_ready(
    component: &str,
    child: &mut Child,
    within: Duration,
    command: &str,
    log: &Path,
    mut ready: impl FnMut() -> bool,
) -> Result<(), KitError> {
    let start = Instant::now();
    while start.elapsed() < within {
        if ready() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(KitError::Start {
                component: component.into(),
                command: command.into(),
                log: log.to_path_buf(),
                detail: format!("exited at start ({st})"),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(KitError::Start {
        component: component.into(),
        command: command.into(),
        log: log.to_path_buf(),
        detail: format!("not ready within {within:?}"),
    })
}

/// Makes this process the reaper of the orphans of its descendants (the
/// shims containerd detaches): this VM's PID 1 reaps no orphans.
pub fn become_subreaper() {
    let _ = rustix::process::set_child_subreaper(rustix::process::getpid().into());
}

/// A process of `/proc` whose parent is a given process.
#[derive(Debug, Clone)]
pub struct ProcChild {
    /// Its pid.
    pub pid: i32,
    /// Its name (`comm`, at most 15 bytes).
    pub comm: String,
    /// Its state letter (`R`, `S`, `Z`, ...).
    pub state: char,
}

impl ProcChild {
    /// Whether its command line holds `arg` as one argument (a zombie's
    /// holds none).
    pub fn has_arg(&self, arg: &str) -> bool {
        std::fs::read(format!("/proc/{}/cmdline", self.pid))
            .map(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
            .unwrap_or(false)
    }

    /// Whether its executable lies in `dir` (a zombie has none).
    pub fn runs_from(&self, dir: &Path) -> bool {
        std::fs::read_link(format!("/proc/{}/exe", self.pid))
            .map(|x| x.starts_with(dir))
            .unwrap_or(false)
    }
}

/// The children of process `parent`, from `/proc/*/stat`.
pub fn children_of(parent: u32) -> Vec<ProcChild> {
    let parent = parent.to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, split after ')'.
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map(|(_, c)| c).unwrap_or("");
        let mut f = tail.split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        if f.next() == Some(parent.as_str()) {
            out.push(ProcChild {
                pid,
                comm: comm.to_string(),
                state,
            });
        }
    }
    out
}

/// This process's children (its own and adopted orphans).
pub fn our_children() -> Vec<ProcChild> {
    children_of(std::process::id())
}

/// Reaps our exited children named `prefix*` (adopted orphans), leaving
/// every other child to whoever waits for it.
pub fn reap_zombies_named(prefix: &str) {
    for c in our_children() {
        if c.state == 'Z' && c.comm.starts_with(prefix) {
            if let Some(p) = Pid::from_raw(c.pid) {
                let _ = rustix::process::waitpid(Some(p), WaitOptions::NOHANG);
            }
        }
    }
}

/// Kills (SIGKILL) our live children whose command line holds `needle` as
/// one argument: the shims of a runtime instance, by its socket's path.
pub fn kill_children_with_arg(needle: &str) {
    for c in our_children() {
        if c.state != 'Z' && c.has_arg(needle) {
            if let Some(p) = Pid::from_raw(c.pid) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
    }
}

/// Kills (SIGKILL) and reaps our children whose executable lies in `dir`
/// (e.g. plugins a daemon of the run started from its directory, adopted
/// when it died). A zombie has no executable any more: it is left to
/// whoever waits for it.
pub fn kill_children_from(dir: &Path) {
    for c in our_children() {
        if c.runs_from(dir) {
            if let Some(p) = Pid::from_raw(c.pid) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
                let _ = rustix::process::waitpid(Some(p), WaitOptions::empty());
            }
        }
    }
}

/// Mount points at or below `dir`, from /proc/self/mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let d = dir.display().to_string();
    let below = format!("{}/", d.trim_end_matches('/'));
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // Not a mere prefix: /tmp/pcd.ab is not below /tmp/pcd.a.
        .filter(|m| *m == d || m.starts_with(&below))
        .map(str::to_string)
        .collect()
}

/// Unmounts (lazily, deepest first) every mount at or below `dir`; a
/// failure is reported on stderr and the rest still unmounted.
pub fn unmount_under(dir: &Path) {
    let mut mounts = mounts_under(dir);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        if let Err(e) = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH) {
            eprintln!("testkit: unmount {m}: {e}");
        }
    }
}

/// Cgroup `path` in every hierarchy of this host: under
/// `/sys/fs/cgroup` itself on a pure v2 host, else under each mounted
/// hierarchy (v1 controllers and a hybrid host's `unified`). The
/// directories need not exist.
pub fn cgroup_dirs(path: &str) -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let rel = path.trim_start_matches('/');
    if base.join("cgroup.controllers").exists() {
        return vec![base.join(rel)];
    }
    std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|h| h.join("cgroup.procs").exists())
        .map(|h| h.join(rel))
        .collect()
}

/// Removes cgroup `path` (e.g. `/petrel-conformance-…`) and everything
/// below it in every hierarchy ([`cgroup_dirs`]), deepest first. Returns
/// the directories that could not be removed (a cgroup with a process
/// still in it).
pub fn remove_cgroup_tree(path: &str) -> Vec<PathBuf> {
    let mut left = vec![];
    for top in cgroup_dirs(path) {
        let mut dirs: Vec<PathBuf> = Vec::new();
        let mut stack = vec![top];
        while let Some(d) = stack.pop() {
            if let Ok(it) = std::fs::read_dir(&d) {
                for e in it.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
                dirs.push(d);
            }
        }
        // Children were pushed after their parents: reversed, depth first.
        for d in dirs.into_iter().rev() {
            if std::fs::remove_dir(&d).is_err() && d.exists() {
                left.push(d);
            }
        }
    }
    left
}

/// The directories of cgroup `path` that exist in any hierarchy: what a
/// test's cgroup parent left.
pub fn cgroup_leftovers(path: &str) -> Vec<PathBuf> {
    cgroup_dirs(path)
        .into_iter()
        .filter(|d| d.is_dir())
        .collect()
}

/// `runc --root ROOT delete --force` of every container runc lists there.
pub fn runc_sweep(runc: &Path, root: &Path) {
    let Ok(out) = Command::new(runc)
        .arg("--root")
        .arg(root)
        .args(["list", "-q"])
        .output()
    else {
        return;
    };
    for id in String::from_utf8_lossy(&out.stdout).lines() {
        let _ = Command::new(runc)
            .arg("--root")
            .arg(root)
            .args(["delete", "--force", id])
            .output();
    }
}

/// Waits up to `within` for a unix socket at `path` to accept a connection,
/// failing early when `child` exits.
pub fn wait_for_socket(
    component: &str,
    child: &mut Child,
    path: &Path,
    within: Duration,
    command: &str,
    log: &Path,
) -> Result<(), KitError> {
    wait_until_ready(component, child, within, command, log, || {
        std::os::unix::net::UnixStream::connect(path).is_ok()
    })
    .map_err(|e| match e {
        KitError::Start {
            component,
            command,
            log,
            detail,
        } if detail.starts_with("not ready") => KitError::Start {
            component,
            command,
            log,
            detail: format!("no socket at {} within {within:?}", path.display()),
        },
        e => e,
    })
}

/// The last `n` lines of file `path` (for failure messages).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn stop_child_should_end_a_process_that_ignores_sigterm() {
        let mut c = Command::new("sh")
            .args(["-c", "trap '' TERM; sleep 30"])
            .spawn()
            .expect("spawn sh");
        let start = Instant::now();
        stop_child(&mut c, Duration::from_millis(300));
        assert!(
            matches!(c.try_wait(), Ok(Some(_))),
            "the child is gone and reaped"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn tail_should_keep_the_last_lines() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("log");
        std::fs::write(&f, "a\nb\nc\n").expect("write");
        assert_eq!(tail(&f, 2), "b\nc");
        assert_eq!(tail(&d.path().join("none"), 2), "");
    }
}
