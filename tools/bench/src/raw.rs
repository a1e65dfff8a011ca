//! The reference: plain `runc` on the same rootfs, driven the way a
//! minimal runtime would (create, start, kill, wait, delete), with its own
//! `--root` and an explicit cgroups path.
//!
//! The bench process is a child subreaper, so each container's init is
//! reparented to it when `runc create` exits; the bench waits for the
//! init's exit through a pidfd and reaps it.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, PidfdFlags, WaitOptions};

/// Timings of one container's "up".
pub struct Up {
    /// `runc create`.
    pub create: Duration,
    /// `runc start`.
    pub start: Duration,
}

/// Timings of one container's "down".
pub struct Down {
    /// `runc kill <id> KILL`.
    pub kill: Duration,
    /// From the end of `runc kill` to the init's exit (pidfd readable) and
    /// reaping it.
    pub wait: Duration,
    /// `runc delete`.
    pub delete: Duration,
}

struct Live {
    id: String,
    pid: Pid,
    pidfd: OwnedFd,
}

/// Plain runc containers of this bench.
pub struct RawRunc {
    runc: PathBuf,
    /// runc's state directory (`runc --root`), private to the bench.
    root: PathBuf,
    dir: PathBuf,
    rootfs: PathBuf,
    cgroup_base: String,
    live: Vec<Live>,
}

impl RawRunc {
    /// Prepares `<dir>/rootfs` as a copy of an unpacked image layer.
    pub fn prepare(runc: &Path, dir: &Path, layer: &Path, cgroup_base: &str) -> Result<RawRunc> {
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let st = Command::new("cp")
            .arg("-a")
            .arg(layer)
            .arg(&rootfs)
            .status()
            .context("run cp")?;
        if !st.success() {
            bail!(
                "cp -a {} {} failed: {st}",
                layer.display(),
                rootfs.display()
            );
        }
        // runc's state on tmpfs, as its default /run/runc is on a standard host.
        let root = dir.join("runc-root");
        crate::sweep::volatile_dir(&root)?;
        Ok(RawRunc {
            runc: runc.to_path_buf(),
            root,
            dir: dir.to_path_buf(),
            rootfs,
            cgroup_base: cgroup_base.to_string(),
            live: vec![],
        })
    }

    fn runc(&self) -> Command {
        let mut c = Command::new(&self.runc);
        c.arg("--root").arg(&self.root);
        c
    }

    /// Creates and starts container `id` running `sleep 3600`; the bundle
    /// is written before the clock starts.
    pub fn up(&mut self, id: &str) -> Result<Up> {
        let bundle = self.dir.join("bundles").join(id);
        std::fs::create_dir_all(&bundle).with_context(|| format!("create {}", bundle.display()))?;
        let config = spec(&self.rootfs, id, &format!("{}/{id}", self.cgroup_base));
        let config_path = bundle.join("config.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&config)?)
            .with_context(|| format!("write {}", config_path.display()))?;
        let stderr_path = bundle.join("runc.stderr");
        let stderr = File::create(&stderr_path)
            .with_context(|| format!("create {}", stderr_path.display()))?;
        let pid_file = bundle.join("init.pid");

        let t0 = Instant::now();
        // The container's stdio is runc's: /dev/null and a file, never a
        // pipe the init would hold open.
        let st = self
            .runc()
            .arg("create")
            .arg("--bundle")
            .arg(&bundle)
            .arg("--pid-file")
            .arg(&pid_file)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .status()
            .context("run runc create")?;
        let create = t0.elapsed();
        if !st.success() {
            bail!(
                "runc create {id}: {st}: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        let pid = read_pid(&pid_file)?;
        // The init is our child now (we are its subreaper), so the pid
        // cannot be reused before we reap it.
        let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty())
            .with_context(|| format!("pidfd_open {}", pid.as_raw_nonzero()))?;
        self.live.push(Live {
            id: id.to_string(),
            pid,
            pidfd,
        });

        let t1 = Instant::now();
        run_ok(self.runc().arg("start").arg(id), "runc start")?;
        let start = t1.elapsed();
        Ok(Up { create, start })
    }

    /// Kills container `id` with SIGKILL, waits for its init to exit,
    /// reaps it and deletes the container.
    pub fn down(&mut self, id: &str) -> Result<Down> {
        let idx = self
            .live
            .iter()
            .position(|l| l.id == id)
            .with_context(|| format!("raw container {id} is not running"))?;
        let live = self.live.swap_remove(idx);

        let t0 = Instant::now();
        run_ok(self.runc().arg("kill").arg(id).arg("KILL"), "runc kill")?;
        let kill = t0.elapsed();

        let t1 = Instant::now();
        wait_readable(&live.pidfd, Duration::from_secs(10))
            .with_context(|| format!("raw container {id} did not exit"))?;
        let _ = rustix::process::waitpid(Some(live.pid), WaitOptions::empty());
        let wait = t1.elapsed();

        let t2 = Instant::now();
        run_ok(self.runc().arg("delete").arg(id), "runc delete")?;
        let delete = t2.elapsed();
        Ok(Down { kill, wait, delete })
    }

    /// Deletes every container of this runc root by force and reaps the
    /// inits. Safe to call more than once.
    pub fn sweep(&mut self) {
        if self.root.is_dir() {
            if let Ok(out) = self.runc().args(["list", "-q"]).output() {
                for id in String::from_utf8_lossy(&out.stdout).lines() {
                    let _ = self
                        .runc()
                        .args(["delete", "--force", id])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                }
            }
        }
        for l in self.live.drain(..) {
            let _ = wait_readable(&l.pidfd, Duration::from_secs(5));
            let _ = rustix::process::waitpid(Some(l.pid), WaitOptions::NOHANG);
        }
    }
}

impl Drop for RawRunc {
    fn drop(&mut self) {
        self.sweep();
    }
}

fn read_pid(path: &Path) -> Result<Pid> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    text.trim()
        .parse::<i32>()
        .ok()
        .and_then(Pid::from_raw)
        .with_context(|| format!("{} holds no pid: {text:?}", path.display()))
}

fn run_ok(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Waits until a pidfd is readable (its process has exited).
pub fn wait_readable(fd: &OwnedFd, within: Duration) -> Result<()> {
    let timeout = rustix::event::Timespec::try_from(within).context("timeout")?;
    loop {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => bail!("not readable within {within:?}"),
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e).context("poll pidfd"),
        }
    }
}

/// An OCI runtime spec like `runc spec` makes (same namespaces, mounts,
/// capabilities and masked paths), running `sleep 3600` in `rootfs`.
fn spec(rootfs: &Path, hostname: &str, cgroups_path: &str) -> serde_json::Value {
    let caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"];
    let ns = ["pid", "network", "ipc", "uts", "mount"];
    let mount = |dst: &str, ty: &str, src: &str, opts: &[&str]| serde_json::json!({"destination": dst, "type": ty, "source": src, "options": opts});
    serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": ["sleep", "3600"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps, "ambient": caps
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": rootfs, "readonly": true},
        "hostname": hostname,
        "mounts": [
            mount("/proc", "proc", "proc", &[]),
            mount("/dev", "tmpfs", "tmpfs", &["nosuid", "strictatime", "mode=755", "size=65536k"]),
            mount("/dev/pts", "devpts", "devpts",
                  &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]),
            mount("/dev/shm", "tmpfs", "shm", &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
            mount("/dev/mqueue", "mqueue", "mqueue", &["nosuid", "noexec", "nodev"]),
            mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", "ro"]),
            mount("/sys/fs/cgroup", "cgroup", "cgroup", &["nosuid", "noexec", "nodev", "relatime", "ro"]),
        ],
        "linux": {
            "cgroupsPath": cgroups_path,
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": ns.iter().map(|t| serde_json::json!({"type": t})).collect::<Vec<_>>(),
            "maskedPaths": [
                "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                "/proc/scsi"
            ],
            "readonlyPaths": [
                "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"
            ]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_should_name_the_cgroup_and_rootfs() {
        let s = spec(Path::new("/b/rootfs"), "c1", "/petrel-bench-x/raw/c1");
        assert_eq!(s["linux"]["cgroupsPath"], "/petrel-bench-x/raw/c1");
        assert_eq!(s["root"]["path"], "/b/rootfs");
        assert_eq!(s["process"]["args"][0], "sleep");
        assert_eq!(s["linux"]["namespaces"].as_array().map(Vec::len), Some(5));
    }
}
