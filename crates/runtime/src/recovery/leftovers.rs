//! Containers a crash left half-made, found from their ids alone, and
//! removed once no shim is inside their create any more.
//!
//! A CreateContainer killed midway can leave, named by the container's id
//! only: a writable layer (`<root>/containers/<id>`), a bundle with its
//! rootfs mount (`<state>/containers/<id>`), a shim (whose command line
//! names the bundle), a runc container and its cgroups (`<pod
//! cgroup>/<id>`, named in the bundle's `config.json` and runc's state).
//! Its intent record may be there or not (it is written without an fsync).
//! A shim still inside `runc create` finishes it (and, finding its runtime
//! gone when it answers, undoes it and exits): recovery waits for that,
//! bounded, before touching anything, or a runc container would appear
//! after the sweep, without a bundle.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use petrel_store::Table;

use super::decide::ShimSeen;
use crate::records::ContainerRecord;
use crate::service::Runtime;
use crate::util;

/// How long recovery waits for shims still inside their create; past it
/// they (and what they started) are killed. runc create takes ~40 ms here,
/// seconds under heavy load.
const CREATE_WAIT: Duration = Duration::from_secs(10);
/// How long a shim may take to exit once its container is deleted (it
/// drains output for up to a second after the init's exit).
const EXIT_WAIT: Duration = Duration::from_secs(5);
/// How often shims inside their create are looked at.
const LOOK_EVERY: Duration = Duration::from_millis(10);
/// How many leftovers are removed at once (each starts runc).
const REMOVALS_AT_ONCE: usize = 8;

/// A half-made container: its record, if one survived.
pub(crate) type Leftovers = HashMap<String, Option<ContainerRecord>>;

/// Whether `name` is a container or sandbox id (64 hex characters).
pub(crate) fn is_id(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

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
    (is_id(id) && bundle.parent() == Some(containers) && bundle.file_name()? == id)
        .then(|| id.to_string())
}

/// The live shims of the bundles in `containers` (this runtime's
/// `<state>/containers`), by container id. A shim is recognised by its
/// command line, which names its bundle by full path: nothing another
/// runtime or test started can match. Zombies have no command line.
pub(crate) fn find_shims(containers: &Path) -> HashMap<String, u32> {
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
            found.insert(id, pid);
        }
    }
    found
}

/// A found shim, pinned by a pidfd.
pub(crate) struct FoundShim {
    pid: u32,
    pidfd: OwnedFd,
}

impl FoundShim {
    /// Pins the shim `pid` found for `id`; `None` when it is gone or the
    /// pid now names another process (checked after the pidfd is open).
    fn pin(pid: u32, id: &str, containers: &Path) -> Option<Self> {
        let pidfd = util::pidfd_open(pid).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (shim_id(&cmdline, containers).as_deref() == Some(id)).then_some(Self { pid, pidfd })
    }

    /// Where the shim is: still in its create while its standard output is
    /// the pipe to the runtime that started it (it points it at /dev/null
    /// once it has answered).
    pub(crate) fn seen(&self) -> ShimSeen {
        if !alive(&self.pidfd) {
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
    fn kill_tree(&self) {
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
        let _ = util::pidfd_signal(&self.pidfd, libc::SIGKILL);
        for fd in &pinned {
            let _ = util::pidfd_signal(fd, libc::SIGKILL);
        }
    }
}

/// Whether the process behind `pidfd` still runs (a pidfd polls readable
/// once its process has exited).
fn alive(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
}

/// The container cgroup a bundle's `config.json` names, if it is the
/// container's own (its last component is the id).
fn cgroup_from_config(bundle: &Path, id: &str) -> Option<String> {
    let text = std::fs::read(bundle.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let path = v.get("linux")?.get("cgroupsPath")?.as_str()?;
    (path.starts_with('/') && path.rsplit('/').next() == Some(id)).then(|| path.to_string())
}

impl Runtime {
    /// Removes every half-made container: waits (bounded) for shims still
    /// inside their create, then removes each completely.
    pub(crate) async fn remove_leftovers(self: &Arc<Self>, mut leftovers: Leftovers) {
        let containers = self.layout.state.join("containers");
        let shims = find_shims(&containers);
        // A shim of a bundle no record names is a leftover too.
        for id in shims.keys() {
            if self.state.container(id).is_none() {
                leftovers.entry(id.clone()).or_insert(None);
            }
        }
        if leftovers.is_empty() {
            return;
        }
        let mut pinned: HashMap<String, FoundShim> = leftovers
            .keys()
            .filter_map(|id| {
                let pid = *shims.get(id)?;
                Some((id.clone(), FoundShim::pin(pid, id, &containers)?))
            })
            .collect();
        self.wait_out_of_create(&pinned).await;
        tracing::warn!(
            count = leftovers.len(),
            shims = pinned.len(),
            "removing containers left half-made by a crash"
        );
        let removals = leftovers.into_iter().map(|(id, rec)| {
            let shim = pinned.remove(&id);
            let rt = self.clone();
            async move { rt.remove_leftover(&id, rec.as_ref(), shim).await }
        });
        futures_util::stream::iter(removals)
            .for_each_concurrent(REMOVALS_AT_ONCE, |f| f)
            .await;
    }

    /// Waits until no shim is inside its create, at most [`CREATE_WAIT`];
    /// past it, kills those that still are (with what they started).
    async fn wait_out_of_create(&self, shims: &HashMap<String, FoundShim>) {
        let t0 = Instant::now();
        let mut first = None;
        loop {
            let in_create: Vec<(&String, &FoundShim)> = shims
                .iter()
                .filter(|(_, s)| s.seen() == ShimSeen::InCreate)
                .collect();
            let first = *first.get_or_insert(in_create.len());
            if in_create.is_empty() {
                if first > 0 {
                    tracing::info!(
                        shims = first,
                        waited_ms = t0.elapsed().as_millis() as u64,
                        "waited for shims inside their create"
                    );
                }
                return;
            }
            if t0.elapsed() >= CREATE_WAIT {
                for (id, s) in in_create {
                    tracing::error!(container.id = %id, shim.pid = s.pid, "shim still inside its create after {CREATE_WAIT:?}: killed");
                    s.kill_tree();
                }
                return;
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Removes one half-made container completely: runc's container (which
    /// kills its init, so its shim exits), the shim (bounded wait, then
    /// killed), its cgroup, rootfs mount, bundle, writable layer and record.
    async fn remove_leftover(
        &self,
        id: &str,
        rec: Option<&ContainerRecord>,
        shim: Option<FoundShim>,
    ) {
        if let Err(e) = self.runc.delete(id, true).await {
            tracing::error!(container.id = %id, error = %e, "runc container of an interrupted create not removed");
        }
        if let Some(shim) = shim {
            if !crate::container::shim::exited_within(&shim.pidfd, EXIT_WAIT).await {
                tracing::warn!(container.id = %id, shim.pid = shim.pid, "shim of an interrupted create did not exit: killed");
                shim.kill_tree();
                let _ = crate::container::shim::exited_within(&shim.pidfd, EXIT_WAIT).await;
                // What the kill may have cut short.
                let _ = self.runc.delete(id, true).await;
            }
        }
        let bundle = self.layout.bundle(id);
        let cgroup = rec
            .map(|r| r.cgroup_path.clone())
            .or_else(|| cgroup_from_config(&bundle, id));
        if let Some(cg) = cgroup {
            let _ = self.cgroups.remove(&cg);
        }
        let layer = self.layout.container_layer(id);
        let files = tokio::task::spawn_blocking(move || {
            crate::server::container_create::remove_container_files(&bundle, &layer)
        })
        .await;
        match files {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(container.id = %id, error = %e, "files of an interrupted create not removed")
            }
            Err(e) => {
                tracing::error!(container.id = %id, error = %e, "files of an interrupted create not removed")
            }
        }
        if rec.is_some() {
            if let Err(e) = self.store.delete(Table::Containers, id) {
                tracing::error!(container.id = %id, error = %e, "record of an interrupted create not deleted");
            }
        }
        tracing::info!(container.id = %id, "interrupted create removed");
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
    fn cgroup_from_config_should_take_only_the_containers_own_cgroup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |path: &str| {
            std::fs::write(
                dir.path().join("config.json"),
                format!(r#"{{"linux":{{"cgroupsPath":"{path}"}}}}"#),
            )
            .expect("write")
        };
        write(&format!("/pods/p1/{ID}"));
        assert_eq!(
            cgroup_from_config(dir.path(), ID),
            Some(format!("/pods/p1/{ID}"))
        );
        write("/pods/p1");
        assert_eq!(cgroup_from_config(dir.path(), ID), None);
        std::fs::remove_file(dir.path().join("config.json")).expect("rm");
        assert_eq!(cgroup_from_config(dir.path(), ID), None);
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
        let found = find_shims(containers.path());
        let a = FoundShim::pin(piped.id(), ID, containers.path());
        let b = FoundShim::pin(null.id(), ID2, containers.path());
        let wrong = FoundShim::pin(null.id(), ID, containers.path()).is_some();
        let seen = (
            a.as_ref().map(FoundShim::seen),
            b.as_ref().map(FoundShim::seen),
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
