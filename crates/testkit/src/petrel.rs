//! Petrel's runtime under test: `petrel runtime` with its own root, state,
//! socket, cgroup parent and NRI socket in a temporary directory, on a
//! given CNI network and registry mirror directory; or `petrel node`, the
//! same runtime with the agent in its process ([`PetrelOptions::node`]).
//! On drop: pods removed through CRI, the process stopped by pid, then a
//! sweep of its runc root, mounts and cgroup parent.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use crate::network::PodNetwork;
use crate::process::{
    self, describe, free_port, kit_tempdir, random_suffix, spawn_logged, stop_child, write_pid_file,
};
use crate::KitError;

/// How `petrel` is started, beyond the network and mirrors.
#[derive(Debug, Clone, Default)]
pub struct PetrelOptions {
    /// The shim binary (`--shim-binary`); None: the one beside `petrel`.
    pub shim: Option<PathBuf>,
    /// The cgroup pods go under by default; None:
    /// `/petrel-conformance-<random>`. Removed (with everything below it)
    /// on drop.
    pub cgroup_parent: Option<String>,
    /// Run `petrel node` (runtime and agent in one process) instead of
    /// `petrel runtime`.
    pub node: Option<NodeAgent>,
}

/// The agent of a `petrel node`.
#[derive(Debug, Clone)]
pub struct NodeAgent {
    /// `--node-name`.
    pub node_name: String,
    /// `--pleg`: `events` or `relist`.
    pub pleg: String,
    /// `--eviction-hard`, as the agent parses it (kubelet's syntax); None:
    /// the agent's defaults.
    pub eviction_hard: Option<String>,
}

/// A running `petrel runtime` (or `petrel node`).
pub struct PetrelRuntime {
    dir: tempfile::TempDir,
    /// The CRI socket.
    pub socket: PathBuf,
    /// NRI's socket (for critest's `-nri-socket`).
    pub nri_socket: PathBuf,
    /// The cgroup every pod of this runtime goes under by default.
    pub cgroup_parent: String,
    runc: PathBuf,
    /// Node mode: the agent's plain-HTTP address (`/healthz`, `/metrics`).
    agent_listen: Option<std::net::SocketAddr>,
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
        Self::start_with(petrel, runc, net, mirrors, &PetrelOptions::default())
    }

    /// Like [`PetrelRuntime::start`], with `opts`. In node mode the agent's
    /// static pod directory is [`PetrelRuntime::manifest_dir`] and its API
    /// socket [`PetrelRuntime::agent_socket`].
    pub fn start_with(
        petrel: &Path,
        runc: &Path,
        net: &PodNetwork,
        mirrors: &Path,
        opts: &PetrelOptions,
    ) -> Result<PetrelRuntime, KitError> {
        if !petrel.is_file() {
            return Err(KitError::Missing {
                component: "petrel".into(),
                path: petrel.to_path_buf(),
                hint: "cargo build --bins".into(),
            });
        }
        // Short: unix socket paths are limited to 108 bytes.
        let dir = kit_tempdir("pkp.")?;
        let d = dir.path();
        let state = d.join("state");
        let nri = d.join("nri");
        let config = d.join("config.toml");
        let cgroup_parent = opts
            .cgroup_parent
            .clone()
            .unwrap_or_else(|| format!("/petrel-conformance-{}", random_suffix()));
        let mut text = format!(
            "[cri]\nroot = {root:?}\nstate = {state:?}\nruntime_binary = {runc:?}\n\
             default_cgroup_parent = {cgroup_parent:?}\npod_network = \"cni\"\n",
            root = d.join("root"),
        );
        if let Some(shim) = &opts.shim {
            text.push_str(&format!("shim_binary = {shim:?}\n"));
        }
        text.push_str(&format!(
            "[cri.cni]\nconf_dir = {conf:?}\nbin_dirs = [{bin:?}]\n\
             [cri.registry]\nconfig_path = {mirrors:?}\n\
             [nri]\nsocket_path = {nri_sock:?}\nplugin_path = {plugins:?}\nplugin_config_path = {confd:?}\n",
            conf = net.conf_dir,
            bin = net.bin_dir,
            nri_sock = nri.join("nri.sock"),
            plugins = nri.join("plugins"),
            confd = nri.join("conf.d"),
        ));
        std::fs::write(&config, text).map_err(|e| KitError::io("write", &config, e))?;
        let log = d.join("runtime.log");
        let mut cmd = Command::new(petrel);
        let mut agent_listen = None;
        match &opts.node {
            None => {
                cmd.arg("runtime");
            }
            Some(agent) => {
                let listen = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?));
                agent_listen = Some(listen);
                let manifests = d.join("manifests");
                std::fs::create_dir_all(&manifests)
                    .map_err(|e| KitError::io("create directory", &manifests, e))?;
                cmd.arg("node")
                    .arg("--manifests")
                    .arg(&manifests)
                    .arg("--agent-socket")
                    .arg(d.join("agent.sock"))
                    .args(["--node-name", &agent.node_name])
                    .args(["--listen", &listen.to_string()])
                    .args(["--pleg", &agent.pleg]);
                if let Some(e) = &agent.eviction_hard {
                    cmd.args(["--eviction-hard", e]);
                }
            }
        }
        cmd.arg("--config")
            .arg(&config)
            .args(["--log-level", "info"]);
        let command = describe(&cmd);
        let child = spawn_logged("petrel runtime", &mut cmd, &log)?;
        write_pid_file(d, "runtime", child.id());
        let mut rt = PetrelRuntime {
            socket: state.join("petrel.sock"),
            nri_socket: nri.join("nri.sock"),
            cgroup_parent,
            runc: runc.to_path_buf(),
            agent_listen,
            dir,
            child: Some(child),
        };
        let agent_socket = rt.agent_socket();
        if let Some(c) = rt.child.as_mut() {
            process::wait_for_socket(
                "petrel runtime",
                c,
                &rt.socket,
                Duration::from_secs(30),
                &command,
                &log,
            )?;
            if opts.node.is_some() {
                process::wait_for_socket(
                    "petrel node's agent",
                    c,
                    &agent_socket,
                    Duration::from_secs(30),
                    &command,
                    &log,
                )?;
            }
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

    /// The runtime's state directory (its shims name bundles below it).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The process's pid (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Node mode: the agent's static pod directory.
    pub fn manifest_dir(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Node mode: the agent's API socket (`/pods`, `/metrics`, ...).
    pub fn agent_socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    /// Node mode: the agent's plain-HTTP address (`/healthz`, `/metrics`).
    pub fn agent_listen(&self) -> Option<std::net::SocketAddr> {
        self.agent_listen
    }
}

impl Drop for PetrelRuntime {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.agent_listen.is_some() {
                // The agent would start the pods again from their
                // manifests: without them it stops them itself.
                if let Ok(it) = std::fs::read_dir(self.manifest_dir()) {
                    for e in it.flatten() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            let _ = crate::cri::remove_all_pods(&self.endpoint());
            stop_child(&mut c, Duration::from_secs(15));
        }
        process::runc_sweep(&self.runc, &self.dir.path().join("state/runc"));
        process::unmount_under(self.dir.path());
        process::remove_cgroup_tree(&self.cgroup_parent);
    }
}
