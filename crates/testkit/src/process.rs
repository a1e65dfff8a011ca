//! Processes, mounts and cgroups of a run: start a peer with its log, stop
//! it by pid, and sweep what it left in places that are the run's own.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
/// if missing), removed on drop.
pub fn kit_tempdir(prefix: &str) -> Result<tempfile::TempDir, KitError> {
    let base = kit_tmp_dir();
    std::fs::create_dir_all(&base).map_err(|e| KitError::io("create directory", &base, e))?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .map_err(|e| KitError::io("create", &base, e))
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
/// child is reaped either way.
pub fn stop_child(child: &mut Child, grace: Duration) {
    if let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, Signal::TERM);
    }
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Makes this process the reaper of the orphans of its descendants (the
/// shims containerd detaches): this VM's PID 1 reaps no orphans.
pub fn become_subreaper() {
    let _ = rustix::process::set_child_subreaper(rustix::process::getpid().into());
}

/// Our children in state Z whose name starts with `prefix` (`comm`).
fn zombie_children(prefix: &str) -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    let Ok(it) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in it.flatten() {
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
        if f.next() == Some("Z") && f.next() == Some(me.as_str()) && comm.starts_with(prefix) {
            out.push(pid);
        }
    }
    out
}

/// Reaps our exited children named `prefix*` (adopted orphans), leaving
/// every other child to whoever waits for it.
pub fn reap_zombies_named(prefix: &str) {
    for pid in zombie_children(prefix) {
        if let Some(p) = Pid::from_raw(pid) {
            let _ = rustix::process::waitpid(Some(p), WaitOptions::NOHANG);
        }
    }
}

/// Kills (SIGKILL) our live children whose command line holds `needle` as
/// one argument: the shims of a runtime instance, by its socket's path.
pub fn kill_children_with_arg(needle: &str) {
    let me = std::process::id().to_string();
    let Ok(it) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in it.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let ours = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                let (_, tail) = s.rsplit_once(')')?;
                let mut f = tail.split_whitespace();
                let state = f.next()?;
                Some(state != "Z" && f.next()? == me)
            })
            .unwrap_or(false);
        let matches = std::fs::read(e.path().join("cmdline"))
            .map(|c| c.split(|b| *b == 0).any(|a| a == needle.as_bytes()))
            .unwrap_or(false);
        if ours && matches {
            if let Some(p) = Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
    }
}

/// Mount points at or below `dir` (by path prefix), from
/// /proc/self/mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Unmounts (lazily, deepest first) every mount at or below `dir`.
pub fn unmount_under(dir: &Path) {
    let mut mounts = mounts_under(dir);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH);
    }
}

/// Removes cgroup `path` (e.g. `/petrel-conformance-…`) and everything
/// below it in every v1 hierarchy and the v2 one, deepest first.
pub fn remove_cgroup_tree(path: &str) {
    let Ok(ctrls) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for c in ctrls.flatten() {
        let top = c.path().join(path.trim_start_matches('/'));
        if !top.is_dir() {
            continue;
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        let mut stack = vec![top];
        while let Some(d) = stack.pop() {
            if let Ok(it) = std::fs::read_dir(&d) {
                for e in it.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        stack.push(e.path());
                    }
                }
            }
            dirs.push(d);
        }
        for d in dirs.into_iter().rev() {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

/// The directories of cgroup `path` that exist in any hierarchy: what a
/// test's cgroup parent left.
pub fn cgroup_leftovers(path: &str) -> Vec<PathBuf> {
    let mut out = vec![];
    if let Ok(ctrls) = std::fs::read_dir("/sys/fs/cgroup") {
        for c in ctrls.flatten() {
            let top = c.path().join(path.trim_start_matches('/'));
            if top.is_dir() {
                out.push(top);
            }
        }
    }
    out
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
    let start = Instant::now();
    while start.elapsed() < within {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
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
        detail: format!("no socket at {} within {within:?}", path.display()),
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
