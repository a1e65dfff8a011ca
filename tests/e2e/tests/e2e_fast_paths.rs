//! The runc fast paths against runc itself, with every runc at hand (root
//! only): the host's `runc` and the peers' (`make peers`, runc ≥ 1.2). For
//! each, two containers made alike by `runc create`: one started by
//! `runc start`, the other through its exec FIFO; once stopped, one
//! deleted by `runc delete`, the other by removals. Both must end the same
//! (runc's state, its state directory, the cgroups). This is what
//! `runc_fast::verified` rests on: a runc version it admits must pass here.
//!
//! Each test has its own temporary bundle and runc root, its own container
//! ids and cgroup parent (`/petrel-test-<random>`), all removed on every
//! path (a Drop guard).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use petrel_oci::runc::Runc;
use petrel_runtime::parts::runc_fast::{verified, version_line, RuncFastPaths, RuncVersion};
use petrel_runtime::parts::OciRuntime;

const BUSYBOX: &str = "/bin/busybox";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

fn random() -> String {
    let mut b = [0u8; 6];
    getrandom::getrandom(&mut b).expect("random bytes");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every runc to check: the host's, and the peers' when built.
fn runcs() -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Ok(out) = Command::new("sh").args(["-c", "command -v runc"]).output() {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !p.is_empty() {
            found.push(PathBuf::from(p));
        }
    }
    match petrel_testkit::peers::peer_binary("runc") {
        Ok(p) => found.push(p),
        // `make test` builds the peers first: a missing one is a failure,
        // never a silent skip.
        Err(e) => panic!("the peers' runc is missing (run `make peers`): {e}"),
    }
    found
}

/// Fails, naming what is missing, when not root or without busybox
/// (`make deps` installs it): these tests never skip silently.
fn prerequisites() -> bool {
    assert!(
        rustix::process::geteuid().is_root(),
        "the runc fast-path tests need root"
    );
    assert!(
        Path::new(BUSYBOX).exists(),
        "{BUSYBOX} is missing (Debian package busybox; `make deps` installs it)"
    );
    true
}

/// A bundle, a runc root and a cgroup parent; removes the containers it
/// made and their cgroups when dropped.
struct Scene {
    runc: PathBuf,
    tmp: tempfile::TempDir,
    cgroup_parent: String,
    ids: Vec<String>,
}

impl Scene {
    fn new(runc: &Path) -> Scene {
        let tmp = tempfile::tempdir().expect("tempdir");
        let rootfs = tmp.path().join("bundle/rootfs");
        for d in ["bin", "proc", "sys", "dev", "tmp"] {
            std::fs::create_dir_all(rootfs.join(d)).expect("mkdir rootfs");
        }
        std::fs::copy(BUSYBOX, rootfs.join("bin/busybox")).expect("copy busybox");
        for applet in ["sh", "sleep"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))
                .expect("symlink");
        }
        Scene {
            runc: runc.to_path_buf(),
            tmp,
            cgroup_parent: format!("petrel-test-{}", random()),
            ids: Vec::new(),
        }
    }

    fn root(&self) -> PathBuf {
        self.tmp.path().join("runc")
    }

    fn typed(&self) -> Runc {
        Runc::new(&self.runc, self.root())
    }

    fn fast(&self) -> RuncFastPaths {
        let line = version_line(&self.runc).unwrap_or_default();
        let version = RuncVersion::parse(&line).expect("a runc version");
        assert!(verified(version), "{line}: not admitted by verified()");
        RuncFastPaths::new(self.typed(), version).expect("verified")
    }

    /// `runc create`s a container running `args`; returns its id.
    fn create(&mut self, name: &str, args: &[&str]) -> String {
        let id = format!("{name}-{}", random());
        self.ids.push(id.clone());
        let bundle = self.tmp.path().join("bundle");
        std::fs::remove_file(bundle.join("config.json")).ok();
        let out = Command::new(&self.runc)
            .args(["spec", "--bundle"])
            .arg(&bundle)
            .output()
            .expect("runc spec");
        assert!(out.status.success(), "runc spec: {out:?}");
        let path = bundle.join("config.json");
        let mut spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read spec")).expect("spec json");
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = serde_json::json!(args);
        spec["linux"]["cgroupsPath"] = format!("/{}/{id}", self.cgroup_parent).into();
        std::fs::write(&path, spec.to_string()).expect("write spec");
        // The init inherits runc's stdio and keeps it: a file, not a pipe
        // that would never close.
        let log = self.tmp.path().join(format!("{id}.stderr"));
        let stderr = std::fs::File::create(&log).expect("create stderr file");
        let status = Command::new(&self.runc)
            .arg("--root")
            .arg(self.root())
            .args(["create", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .status()
            .expect("runc create");
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(status.success(), "runc create: {status}: {said}");
        id
    }

    /// Every file name in the container's state directory.
    fn state_files(&self, id: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root().join(id))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The cgroup directories runc recorded for the container.
    fn cgroups(&self, id: &str) -> Vec<PathBuf> {
        let text = std::fs::read(self.root().join(id).join("state.json")).expect("state.json");
        let state: serde_json::Value = serde_json::from_slice(&text).expect("state json");
        let mut paths: Vec<PathBuf> = state["cgroup_paths"]
            .as_object()
            .map(|m| {
                m.values()
                    .filter_map(|v| v.as_str().map(PathBuf::from))
                    .collect()
            })
            .unwrap_or_default();
        paths.sort();
        paths.dedup();
        paths
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        for id in &self.ids {
            let out = Command::new(&self.runc)
                .arg("--root")
                .arg(self.root())
                .args(["delete", "--force", id])
                .stderr(Stdio::null())
                .status();
            if let Err(e) = out {
                eprintln!("cleanup: runc delete {id}: {e}");
            }
        }
        // runc leaves the parent cgroups behind: remove this scene's.
        let Ok(controllers) = std::fs::read_dir(CGROUP_ROOT) else {
            return;
        };
        for c in controllers.filter_map(|e| e.ok()) {
            let parent = c.path().join(&self.cgroup_parent);
            for id in &self.ids {
                std::fs::remove_dir(parent.join(id)).ok();
            }
            std::fs::remove_dir(&parent).ok();
        }
    }
}

fn pidfd(pid: u32) -> std::os::fd::OwnedFd {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).expect("pidfd_open")
}

async fn status(oci: &dyn OciRuntime, id: &str) -> (String, u32) {
    let s = oci.state(id).await.expect("runc state").expect("known");
    (s.status, u32::try_from(s.pid).unwrap_or_default())
}

async fn wait_status(oci: &dyn OciRuntime, id: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(oci, id).await.0 != want {
        assert!(Instant::now() < deadline, "{id} never {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn fifo_start_should_leave_the_container_as_runc_start_does() {
    if !prerequisites() {
        return;
    }
    for runc in runcs() {
        eprintln!("checking {}", runc.display());
        let mut scene = Scene::new(&runc);
        let typed = scene.typed();
        let fast = scene.fast();
        let by_runc = scene.create("by-runc", &["sleep", "600"]);
        let by_fifo = scene.create("by-fifo", &["sleep", "600"]);
        assert_eq!(scene.state_files(&by_runc), scene.state_files(&by_fifo));
        assert!(scene
            .state_files(&by_fifo)
            .contains(&"exec.fifo".to_string()));
        assert!(fast.start_pending(&by_fifo));

        OciRuntime::start(&typed, &by_runc, None)
            .await
            .expect("runc start");
        let (_, pid) = status(&typed, &by_fifo).await;
        let took = fast
            .fifo_start(&by_fifo, pidfd(pid), pid)
            .await
            .expect("fifo start");
        assert!(took, "{}: the start went to runc", runc.display());

        for id in [&by_runc, &by_fifo] {
            assert_eq!(status(&typed, id).await.0, "running", "{id}");
            assert!(!fast.start_pending(id), "{id}");
            assert!(fast.started_at(id).is_some(), "{id}");
        }
        assert_eq!(scene.state_files(&by_runc), scene.state_files(&by_fifo));
        // Started once is started: runc refuses a second start of either.
        for id in [&by_runc, &by_fifo] {
            assert!(OciRuntime::start(&fast, id, None).await.is_err(), "{id}");
        }
    }
}

#[tokio::test]
async fn removal_delete_should_leave_what_runc_delete_leaves() {
    if !prerequisites() {
        return;
    }
    for runc in runcs() {
        eprintln!("checking {}", runc.display());
        let mut scene = Scene::new(&runc);
        let typed = scene.typed();
        let fast = scene.fast();
        let by_runc = scene.create("by-runc", &["sh", "-c", "exit 0"]);
        let by_removal = scene.create("by-removal", &["sh", "-c", "exit 0"]);
        let mut cgroups = Vec::new();
        for id in [&by_runc, &by_removal] {
            OciRuntime::start(&typed, id, None).await.expect("start");
            wait_status(&typed, id, "stopped").await;
            let dirs = scene.cgroups(id);
            assert!(
                !dirs.is_empty() && dirs.iter().all(|d| d.is_dir()),
                "{dirs:?}"
            );
            cgroups.push(dirs);
        }

        typed.delete(&by_runc, false).await.expect("runc delete");
        let took = fast
            .removal_delete(&by_removal)
            .await
            .expect("removal delete");
        assert!(took, "{}: the delete went to runc", runc.display());

        for (id, dirs) in [&by_runc, &by_removal].into_iter().zip(&cgroups) {
            assert!(!scene.root().join(id).exists(), "{id}: state dir left");
            assert!(typed.state(id).await.expect("runc state").is_none(), "{id}");
            let left: Vec<_> = dirs.iter().filter(|d| d.exists()).collect();
            assert!(left.is_empty(), "{id}: cgroups left {left:?}");
        }
        assert!(typed.list().await.expect("runc list").is_empty());
        // Deleted is deleted, whichever way: deleting again is no error.
        for id in [&by_runc, &by_removal] {
            fast.delete(id, false).await.expect("delete again");
        }
    }
}
