//! Petrel's runtime under test: `petrel runtime` with its own root, state,
//! socket, cgroup parent and NRI socket in a temporary directory, on a
//! given CNI network and registry mirror directory. On drop: pods removed
//! through CRI, the runtime stopped by pid, then a sweep of its runc root,
//! mounts and cgroup parent.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use crate::network::PodNetwork;
use crate::process::{self, describe, random_suffix, spawn_logged, stop_child};
use crate::KitError;

/// A running `petrel runtime`.
pub struct PetrelRuntime {
    dir: tempfile::TempDir,
    /// The CRI socket.
    pub socket: PathBuf,
    /// NRI's socket (for critest's `-nri-socket`).
    pub nri_socket: PathBuf,
    /// The cgroup every pod of this runtime goes under by default.
    pub cgroup_parent: String,
    runc: PathBuf,
    child: Option<Child>,
}

impl PetrelRuntime {
    /// Starts `petrel` (the binary) as a runtime using OCI runtime `runc`,
    /// pods on `net`, pulls through the hosts.toml directory `mirrors`.
    pub fn start(
        petrel: &Path,
        runc: &Path,
        net: &PodNetwork,
        mirrors: &Path,
    ) -> Result<PetrelRuntime, KitError> {
        if !petrel.is_file() {
            return Err(KitError::Missing {
                component: "petrel".into(),
                path: petrel.to_path_buf(),
                hint: "cargo build --bins".into(),
            });
        }
        // Short, under /tmp: unix socket paths are limited to 108 bytes.
        let dir = tempfile::Builder::new()
            .prefix("pkp.")
            .tempdir_in("/tmp")
            .map_err(|e| KitError::io("create", "/tmp", e))?;
        let d = dir.path();
        let state = d.join("state");
        let nri = d.join("nri");
        let config = d.join("config.toml");
        let cgroup_parent = format!("/petrel-conformance-{}", random_suffix());
        let text = format!(
            "[cri]\nroot = {root:?}\nstate = {state:?}\nruntime_binary = {runc:?}\n\
             default_cgroup_parent = {cgroup_parent:?}\npod_network = \"cni\"\n\
             [cri.cni]\nconf_dir = {conf:?}\nbin_dirs = [{bin:?}]\n\
             [cri.registry]\nconfig_path = {mirrors:?}\n\
             [nri]\nsocket_path = {nri_sock:?}\nplugin_path = {plugins:?}\nplugin_config_path = {confd:?}\n",
            root = d.join("root"),
            conf = net.conf_dir,
            bin = net.bin_dir,
            nri_sock = nri.join("nri.sock"),
            plugins = nri.join("plugins"),
            confd = nri.join("conf.d"),
        );
        std::fs::write(&config, text).map_err(|e| KitError::io("write", &config, e))?;
        let log = d.join("runtime.log");
        let mut cmd = Command::new(petrel);
        cmd.arg("runtime")
            .arg("--config")
            .arg(&config)
            .args(["--log-level", "info"]);
        let command = describe(&cmd);
        let child = spawn_logged("petrel runtime", &mut cmd, &log)?;
        let mut rt = PetrelRuntime {
            socket: state.join("petrel.sock"),
            nri_socket: nri.join("nri.sock"),
            cgroup_parent,
            runc: runc.to_path_buf(),
            dir,
            child: Some(child),
        };
        if let Some(c) = rt.child.as_mut() {
            process::wait_for_socket(
                "petrel runtime",
                c,
                &rt.socket,
                Duration::from_secs(30),
                &command,
                &log,
            )?;
        }
        Ok(rt)
    }

    /// The CRI endpoint, `unix:///tmp/pkp.…/state/petrel.sock`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The runtime's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("runtime.log")
    }
}

impl Drop for PetrelRuntime {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = crate::cri::remove_all_pods(&self.endpoint());
            stop_child(&mut c, Duration::from_secs(15));
        }
        process::runc_sweep(&self.runc, &self.dir.path().join("state/runc"));
        process::unmount_under(self.dir.path());
        process::remove_cgroup_tree(&self.cgroup_parent);
    }
}
