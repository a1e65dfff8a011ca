//! containerd 1.7 for the agent and network figures against another CRI
//! runtime: the binaries `make containerd` unpacked under
//! build/containerd-1.7, run by the test kit's containerd launcher
//! ([`ContainerdProcess`], config version 2) in a directory of the bench's
//! with its volatile state and runc root on tmpfs (as Petrel's, see
//! `sweep::volatile_dir`), logging at `warn` (its CPU is measured), with
//! the busybox and pause test images imported with `ctr`. Stopped on drop:
//! the kit's sweep (pods removed through CRI, containerd stopped by pid,
//! its shims killed and reaped, runc's containers deleted, mounts
//! unmounted). Without a CNI network (`start`), pods run in the host
//! network; `start_with_cni` gives it the bench's network, whose bridge the
//! caller removes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use petrel_testkit::containerd::{import_archives, ContainerdConfig, ContainerdProcess, Nri};

use crate::node::BUSYBOX;

/// The sandbox image of the test images (`pause-oci.tar`).
pub const PAUSE: &str = "docker.io/petrel/pause:latest";

/// A containerd started by the bench.
pub struct Containerd {
    /// The CRI socket.
    pub socket: PathBuf,
    /// `containerd --version`.
    pub version: String,
    process: ContainerdProcess,
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
        let config = ContainerdConfig {
            sandbox_image: PAUSE.to_string(),
            runc: None,
            cni_bin_dir: cni_bin_dir.to_path_buf(),
            cni_conf_dir: cni_conf_dir.to_path_buf(),
            mirrors: None,
            nri: Nri::Disabled {
                socket: dir.join("nri.sock"),
            },
            netns_under_state: false,
        };
        let containerd = bin_dir.join("containerd");
        let process = ContainerdProcess::prepare(
            dir,
            &containerd,
            Path::new("runc"),
            &config.render_v2(dir),
        )?
        .with_log_level("warn");
        // Volatile state on tmpfs, as Petrel's.
        crate::sweep::volatile_dir(&dir.join("state"))?;
        crate::sweep::volatile_dir(&process.runc_root())?;
        // From here on a failure drops `cd`, which sweeps.
        let mut cd = Containerd {
            socket: process.socket(),
            version: petrel_testkit::containerd::version_of(&containerd),
            process,
        };
        cd.process.spawn()?;
        let archives = [images.join("busybox-oci.tar"), images.join("pause-oci.tar")];
        let socket = cd.socket.clone();
        let bin = bin_dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            import_archives(
                &bin,
                &socket,
                &archives,
                &[BUSYBOX, PAUSE],
                Duration::from_secs(20),
            )
        })
        .await
        .context("import the test images")??;
        Ok(cd)
    }

    /// The CRI endpoint.
    pub fn endpoint(&self) -> String {
        self.process.endpoint()
    }

    /// containerd's pid (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.process.pid().unwrap_or(0)
    }

    /// The live shims of this containerd: processes whose command line
    /// names our socket after `-address`.
    pub fn shims(&self) -> Vec<u32> {
        shims_with_address(&self.socket)
    }

    /// The kit's sweep: pods removed through CRI, containerd stopped
    /// (SIGTERM, SIGKILL after 15 s), its shims killed and reaped, what
    /// runc still holds in our runc root deleted, mounts (the tmpfs state)
    /// unmounted. Safe to call again.
    pub fn shutdown(&mut self) {
        self.process.sweep();
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
