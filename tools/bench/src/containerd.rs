//! containerd 1.7 for the agent figures against another CRI runtime:
//! the binaries `make containerd` unpacked under build/containerd-1.7,
//! started with its own root, state, socket, runc root and config inside
//! the bench's work directory, with the busybox and pause test images
//! imported with `ctr`. Stopped on drop: pods removed through CRI,
//! containerd stopped by its pid, then its shims (found by their
//! `-address <our socket>` argument) killed by pid and runc's containers
//! in our runc root deleted. Without a CNI network (`start`), pods run in
//! the host network; `start_with_cni` gives it the bench's network, whose
//! bridge the caller removes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use petrel_cri::api;
use rustix::process::{Pid, Signal};

use crate::node::{Clients, BUSYBOX};

/// The sandbox image of the test images (`pause-oci.tar`).
pub const PAUSE: &str = "docker.io/petrel/pause:latest";

/// A containerd started by the bench.
pub struct Containerd {
    /// The CRI socket.
    pub socket: PathBuf,
    /// runc's `--root` for its containers.
    pub runc_root: PathBuf,
    /// `containerd --version`.
    pub version: String,
    /// containerd's volatile state directory (a tmpfs).
    state: PathBuf,
    bin_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// Where `make containerd` puts containerd 1.7's binaries.
pub fn bin_dir(workspace_build: &Path) -> PathBuf {
    workspace_build.join("containerd-1.7/usr/bin")
}

/// Why containerd 1.7 cannot run here, if it cannot.
pub fn unavailable(bin_dir: &Path, images: &Path) -> Option<String> {
    for b in ["containerd", "containerd-shim-runc-v2", "ctr"] {
        if !bin_dir.join(b).is_file() {
            return Some(format!(
                "{} is missing (run `make containerd`)",
                bin_dir.join(b).display()
            ));
        }
    }
    if !images.join("pause-oci.tar").is_file() {
        return Some(format!(
            "{} is missing (run `make image`)",
            images.join("pause-oci.tar").display()
        ));
    }
    None
}

impl Containerd {
    /// Starts containerd in `dir` (created) and imports the images from
    /// `images` (busybox-oci.tar, pause-oci.tar). Its CNI configuration
    /// directory is empty: only host-network pods can run.
    pub async fn start(bin_dir: &Path, dir: &Path, images: &Path) -> Result<Containerd> {
        let cni = (dir.join("cni"), PathBuf::from("/opt/cni/bin"));
        Self::start_with_cni(bin_dir, dir, images, &cni.0, &cni.1).await
    }

    /// Like `start`, with the CNI configuration in `cni_conf_dir` and the
    /// plugins in `cni_bin_dir`.
    pub async fn start_with_cni(
        bin_dir: &Path,
        dir: &Path,
        images: &Path,
        cni_conf_dir: &Path,
        cni_bin_dir: &Path,
    ) -> Result<Containerd> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let socket = dir.join("c.sock");
        let runc_root = dir.join("runc");
        // Volatile state on tmpfs, as Petrel's (see `sweep::volatile_dir`).
        let state = dir.join("state");
        crate::sweep::volatile_dir(&state)?;
        crate::sweep::volatile_dir(&runc_root)?;
        let config = dir.join("config.toml");
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        let text = format!(
            "version = 2\nroot = {root:?}\nstate = {state:?}\n\
             disabled_plugins = [\"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \"io.containerd.snapshotter.v1.devmapper\", \"io.containerd.snapshotter.v1.aufs\"]\n\
             [grpc]\n  address = {socket:?}\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = {opt:?}\n\
             [plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n  socket_path = {nri:?}\n\
             [{cri}]\n  sandbox_image = \"{PAUSE}\"\n  restrict_oom_score_adj = true\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n  enable_selinux = false\n\
             [{cri}.containerd]\n  snapshotter = \"overlayfs\"\n  default_runtime_name = \"runc\"\n\
             [{cri}.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\
             [{cri}.containerd.runtimes.runc.options]\n  SystemdCgroup = false\n  Root = {runc_root:?}\n\
             [{cri}.cni]\n  conf_dir = {cni:?}\n  bin_dir = {cni_bin:?}\n  max_conf_num = 1\n",
            root = dir.join("root"),
            state = state,
            opt = dir.join("opt"),
            nri = dir.join("nri.sock"),
            cni = cni_conf_dir,
            cni_bin = cni_bin_dir,
        );
        std::fs::write(&config, text).with_context(|| format!("write {}", config.display()))?;
        let log = dir.join("containerd.log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("open {}", log.display()))?;
        // containerd's own bin first, so that its shim is the one it runs.
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            bin_dir.display()
        );
        let version = Command::new(bin_dir.join("containerd"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let child = Command::new(bin_dir.join("containerd"))
            .arg("--config")
            .arg(&config)
            .args(["--log-level", "warn"])
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("start {}", bin_dir.join("containerd").display()))?;
        std::fs::write(dir.join("containerd.pid"), child.id().to_string())
            .with_context(|| format!("write {}", dir.join("containerd.pid").display()))?;
        let mut cd = Containerd {
            socket,
            runc_root,
            version,
            state,
            bin_dir: bin_dir.to_path_buf(),
            log,
            child: Some(child),
        };
        cd.wait_ready().await?;
        cd.import(images).await?;
        Ok(cd)
    }

    /// The CRI endpoint.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// containerd's pid (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// The last lines of containerd's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if self.socket.exists() {
                if let Ok(mut c) = Clients::connect(&self.endpoint()).await {
                    if c.rt.version(api::VersionRequest::default()).await.is_ok() {
                        return Ok(());
                    }
                }
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait().context("wait for containerd")? {
                    bail!("containerd exited at start ({st}):\n{}", self.log_tail());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "containerd did not answer within 30 s:\n{}",
            self.log_tail()
        )
    }

    async fn import(&self, images: &Path) -> Result<()> {
        for tar in ["busybox-oci.tar", "pause-oci.tar"] {
            let out = Command::new(self.bin_dir.join("ctr"))
                .arg("--address")
                .arg(&self.socket)
                .args(["--namespace", "k8s.io", "images", "import"])
                .args(["--snapshotter", "overlayfs"])
                .arg(images.join(tar))
                .output()
                .context("run ctr images import")?;
            ensure!(
                out.status.success(),
                "ctr images import {tar}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // CRI learns of imported images from containerd's events, shortly.
        let mut c = Clients::connect(&self.endpoint()).await?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            let mut all = true;
            for image in [BUSYBOX, PAUSE] {
                let st = c
                    .img
                    .image_status(api::ImageStatusRequest {
                        image: Some(api::ImageSpec {
                            image: image.to_string(),
                            ..Default::default()
                        }),
                        verbose: false,
                    })
                    .await
                    .context("ImageStatus")?
                    .into_inner();
                all &= st.image.is_some();
            }
            if all {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("containerd's CRI does not see the imported images")
    }

    /// The live shims of this containerd: processes whose command line
    /// names our socket after `-address`.
    pub fn shims(&self) -> Vec<u32> {
        shims_with_address(&self.socket)
    }

    /// Removes every pod through CRI, stops containerd (SIGTERM, SIGKILL
    /// after 10 s), kills its remaining shims by pid and deletes what runc
    /// still holds in our runc root.
    pub fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            let endpoint = self.endpoint();
            let removed = std::thread::spawn(move || remove_all_pods(&endpoint)).join();
            if !matches!(removed, Ok(Ok(()))) {
                eprintln!("petrel-bench: removing containerd's pods failed: {removed:?}");
            }
            if let Some(pid) = Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process(pid, Signal::TERM);
            }
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Our own child, by its handle.
        let _ = child.kill();
        let _ = child.wait();
        for pid in self.shims() {
            if let Some(p) = Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
        if let Ok(out) = Command::new("runc")
            .arg("--root")
            .arg(&self.runc_root)
            .args(["list", "-q"])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&self.runc_root)
                    .args(["delete", "--force", id])
                    .output();
            }
        }
        // The shims were reparented to the bench (a subreaper).
        let start = Instant::now();
        while !self.shims().is_empty() && start.elapsed() < Duration::from_secs(3) {
            crate::sweep::reap_orphans();
            std::thread::sleep(Duration::from_millis(20));
        }
        crate::sweep::reap_orphans();
        if self.shims().is_empty() {
            petrel_testkit::process::unmount_under(&self.runc_root);
            petrel_testkit::process::unmount_under(&self.state);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Processes with `-address <socket>` (or `--address`) in their command
/// line, zombies excluded.
pub fn shims_with_address(socket: &Path) -> Vec<u32> {
    let want = socket.display().to_string();
    let mut pids = vec![];
    let Ok(it) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in it.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let argv = crate::procfs::cmdline(pid);
        let named = argv
            .windows(2)
            .any(|w| (w[0] == "-address" || w[0] == "--address") && w[1] == want);
        if named && !crate::procfs::is_zombie(pid) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}

fn remove_all_pods(endpoint: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("build a tokio runtime for clean-up")?;
    rt.block_on(async {
        let mut c = Clients::connect(endpoint).await?;
        let pods =
            c.rt.list_pod_sandbox(api::ListPodSandboxRequest::default())
                .await?
                .into_inner()
                .items;
        for p in pods {
            let stop = tokio::time::timeout(Duration::from_secs(15), c.stop_pod(&p.id)).await;
            let removed = tokio::time::timeout(Duration::from_secs(15), c.remove_pod(&p.id)).await;
            if !matches!((stop, removed), (Ok(Ok(())), Ok(Ok(())))) {
                eprintln!("petrel-bench: containerd pod {} not removed", p.id);
            }
        }
        Ok(())
    })
}
