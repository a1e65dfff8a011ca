//! Shims found running at start-up, by their command lines: recovery
//! waits for those still inside their create and removes the containers
//! of interrupted creates (`recovery::leftovers`).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use crate::parts::ShimSeen;
use crate::util;

/// The ids a shim's command line names: `--id ID --bundle <containers>/ID`.
fn shim_id(cmdline: &[u8], containers: &Path) -> Option<String> {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let after = |flag: &[u8]| {
        args.iter()
            .position(|a| *a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| std::str::from_utf8(v).ok())
    };
    let id = after(b"--id")?;
    let bundle = Path::new(after(b"--bundle")?);
    (util::is_id(id) && bundle.parent() == Some(containers) && bundle.file_name()? == id)
        .then(|| id.to_string())
}

/// The live shims of the bundles in `containers` (this runtime's
/// `<state>/containers`), by container id. A shim is recognised by its
/// command line, which names its bundle by full path: nothing another
/// runtime or test started can match. Zombies have no command line.
pub fn find_shims(containers: &Path) -> HashMap<String, u32> {
    let me = std::process::id();
    let mut found = HashMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if let Some(id) = shim_id(&cmdline, containers) {
            match found.entry(id) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(pid);
                }
                // A shim between fork and exec of runc has a child with its
                // own command line: the shim is the one that is not a child
                // of the other.
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    if parent_of(*o.get()) == Some(pid) {
                        o.insert(pid);
                    }
                }
            }
        }
    }
    found
}

/// The parent pid of `pid`, from `/proc/<pid>/stat` (None when it is gone).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command, which may hold spaces and parentheses: state, ppid.
    stat.get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A found shim, pinned by a pidfd.
#[derive(Debug)]
pub struct PinnedShim {
    pid: u32,
    pidfd: OwnedFd,
}

impl PinnedShim {
    /// Pins the shim `pid` found for `id`; `None` when it is gone or the
    /// pid now names another process (checked after the pidfd is open).
    pub fn pin(pid: u32, id: &str, containers: &Path) -> Option<Self> {
        let pidfd = util::pidfd_open(pid).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (shim_id(&cmdline, containers).as_deref() == Some(id)).then_some(Self { pid, pidfd })
    }

    /// Where the shim is: still in its create while its standard output is
    /// the pipe to the runtime that started it (it points it at /dev/null
    /// once it has answered).
    pub fn seen(&self) -> ShimSeen {
        if !matches!(crate::container::shim::has_exited(&self.pidfd), Ok(false)) {
            return ShimSeen::Gone;
        }
        match std::fs::read_link(format!("/proc/{}/fd/1", self.pid)) {
            Ok(out) if out.as_os_str().as_encoded_bytes().starts_with(b"pipe:") => {
                ShimSeen::InCreate
            }
            Ok(_) => ShimSeen::Serving,
            Err(_) => ShimSeen::Gone,
        }
    }

    /// Kills the shim and every process below it (`runc create`, an init
    /// runc has not handed over yet), each by pidfd.
    pub fn kill_tree(&self) {
        let mut pinned = Vec::new();
        let mut pending = vec![self.pid];
        while let Some(pid) = pending.pop() {
            for task in std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let children =
                    std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                for child in children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok())
                {
                    if let Ok(fd) = util::pidfd_open(child) {
                        // Still below the shim once pinned: not a reused pid.
                        if petrel_oci::proc_stat::read(child).is_some_and(|s| s.ppid == pid) {
                            pinned.push(fd);
                            pending.push(child);
                        }
                    }
                }
            }
        }
        for fd in std::iter::once(&self.pidfd).chain(&pinned) {
            if let Err(e) = util::pidfd_signal(fd, libc::SIGKILL) {
                tracing::warn!(shim.pid = self.pid, error = %e, "process of a shim's tree not killed");
            }
        }
    }
}

impl PinnedShim {
    /// The shim's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the shim exits within `within` (it is not reaped: it is not
    /// this process's child).
    pub async fn exited_within(&self, within: Duration) -> bool {
        crate::container::shim::exited_within(&self.pidfd, within).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn cmdline(args: &[&str]) -> Vec<u8> {
        let mut v = args.join("\0").into_bytes();
        v.push(0);
        v
    }

    #[test]
    fn shim_id_should_match_only_shims_of_this_runtimes_bundles() {
        let containers = Path::new("/run/petrel/containers");
        let bundle = format!("/run/petrel/containers/{ID}");
        let ok = cmdline(&[
            "petrel-shim",
            "--id",
            ID,
            "--bundle",
            &bundle,
            "--runc",
            "runc",
        ]);
        assert_eq!(shim_id(&ok, containers).as_deref(), Some(ID));
        let other_root = format!("/run/other/containers/{ID}");
        for bad in [
            cmdline(&["petrel-shim", "--id", ID, "--bundle", &other_root]),
            cmdline(&[
                "petrel-shim",
                "--id",
                "x",
                "--bundle",
                "/run/petrel/containers/x",
            ]),
            cmdline(&["petrel-shim", "--bundle", &bundle]),
            cmdline(&["sleep", "--id", ID]),
            Vec::new(),
        ] {
            assert_eq!(shim_id(&bad, containers), None, "{bad:?}");
        }
    }

    #[test]
    fn find_shims_should_take_the_shim_not_its_forked_child() {
        let containers = tempfile::tempdir().expect("tempdir");
        // The subshell is a forked child with the parent's command line, as
        // a shim's child is between fork and exec of runc.
        use std::os::unix::process::CommandExt;
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "(sleep 30; :); :", "--id", ID, "--bundle"])
            .process_group(0)
            .arg(containers.path().join(ID))
            .spawn()
            .expect("spawn");
        let mut found = HashMap::new();
        let mut twins = 0;
        for _ in 0..200 {
            twins = std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline"))
                        .is_ok_and(|c| shim_id(&c, containers.path()).as_deref() == Some(ID))
                })
                .count();
            if twins == 2 {
                found = find_shims(containers.path());
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let pid = sh.id();
        // The shell, its subshell and their sleep: one process group.
        if let Some(group) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = sh.kill();
        let _ = sh.wait();
        assert_eq!(twins, 2, "the subshell never showed");
        assert_eq!(found.get(ID), Some(&pid), "{found:?}");
    }

    #[test]
    fn a_found_shim_should_be_seen_in_its_create_while_its_stdout_is_a_pipe() {
        const ID2: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
        let containers = tempfile::tempdir().expect("tempdir");
        let spawn = |id: &str, stdout: std::process::Stdio| {
            // Not the last command, so the shell does not exec it.
            std::process::Command::new("sh")
                .args(["-c", "sleep 30; :", "--id", id, "--bundle"])
                .arg(containers.path().join(id))
                .stdout(stdout)
                .spawn()
                .expect("spawn")
        };
        let mut piped = spawn(ID, std::process::Stdio::piped());
        let mut null = spawn(ID2, std::process::Stdio::null());
        // The spawn returns once the child's exec began; its new command
        // line is readable a moment later (the kernel wakes the parent
        // before it lays out the new arguments).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while [piped.id(), null.id()].iter().any(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map_or(true, |c| !c.windows(8).any(|w| w == b"--bundle"))
        }) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let found = find_shims(containers.path());
        let a = PinnedShim::pin(piped.id(), ID, containers.path());
        let b = PinnedShim::pin(null.id(), ID2, containers.path());
        let wrong = PinnedShim::pin(null.id(), ID, containers.path()).is_some();
        let seen = (
            a.as_ref().map(PinnedShim::seen),
            b.as_ref().map(PinnedShim::seen),
        );
        for s in [&a, &b].into_iter().flatten() {
            s.kill_tree();
        }
        let _ = piped.wait();
        let _ = null.wait();
        assert_eq!(found.get(ID), Some(&piped.id()), "{found:?}");
        assert_eq!(found.get(ID2), Some(&null.id()), "{found:?}");
        assert!(!wrong, "a pid pinned for another id");
        assert_eq!(seen, (Some(ShimSeen::InCreate), Some(ShimSeen::Serving)));
        assert_eq!(a.map(|a| a.seen()), Some(ShimSeen::Gone));
    }
}
