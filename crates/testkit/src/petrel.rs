//! Petrel under test as a process, the one launcher of `petrel runtime` and
//! `petrel node`: a temporary directory of its own with root, state,
//! socket, cgroup parent and NRI directories ([`PetrelConfig`] says what
//! else goes into the config file), the process started with its log and
//! pid file, ready once its socket accepts. On drop: pods removed through
//! CRI (a runtime a test killed is started again for that), the process
//! stopped by pid, then a sweep of its runc root, mounts and cgroup parent.
//!
//! [`PetrelRuntime::start`] runs it the way the conformance kit and the
//! bench compare runtimes (on a CNI network, pulling through a registry
//! mirror, optionally as a node with [`NodeAgent`]); the end-to-end suite's
//! [`crate::node::Node`] is built on it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use crate::network::PodNetwork;
use crate::process::{
    self, describe, free_port, kit_tempdir, random_suffix, spawn_logged, stop_child, write_pid_file,
};
use crate::KitError;

/// How long a runtime may take to serve its socket.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// The runtime's cgroup driver (`[cri] cgroup_driver`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CgroupDriver {
    /// `cgroupfs` (Petrel's default): pod cgroups are directories.
    #[default]
    Cgroupfs,
    /// `systemd` (cgroup v2 with systemd as PID 1): pods are slices,
    /// containers scopes; RuntimeConfig answers SYSTEMD, so critest gives
    /// its pods the parent `/test.slice`.
    Systemd,
}

impl CgroupDriver {
    /// Its name in the runtime's configuration.
    pub fn name(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

/// How `petrel` is started, beyond the network and mirrors.
#[derive(Debug, Clone, Default)]
pub struct PetrelOptions {
    /// The shim binary (`--shim-binary`); None: the one beside `petrel`.
    pub shim: Option<PathBuf>,
    /// The cgroup pods go under by default; None:
    /// `/petrel-conformance-<random>` with the cgroupfs driver, the slice
    /// `petrelconf<random>.slice` with the systemd one. Removed (with
    /// everything below it) on drop.
    pub cgroup_parent: Option<String>,
    /// The cgroup driver (`[cri] cgroup_driver`).
    pub cgroup_driver: CgroupDriver,
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
    /// More agent flags, last (e.g. `--kubeconfig` and `--node-ip` to join
    /// a cluster).
    pub extra: Vec<String>,
}

/// What goes into a runtime's config file, and how its directory is named.
#[derive(Debug, Clone)]
pub struct PetrelConfig {
    /// The directory's prefix (short: socket paths stay below 108 bytes).
    pub dir_prefix: &'static str,
    /// `runtime_binary`; None: Petrel's default (`runc` in PATH).
    pub runc: Option<PathBuf>,
    /// `shim_binary`; None: the one beside `petrel`.
    pub shim: Option<PathBuf>,
    /// `default_cgroup_parent`.
    pub cgroup_parent: String,
    /// A CNI network (`pod_network = "cni"`); None: loopback only, unless
    /// `extra_cri` sets `pod_network` itself.
    pub cni: Option<CniDirs>,
    /// `[cri.registry] config_path`: a hosts.toml mirror directory.
    pub mirrors: Option<PathBuf>,
    /// More `[cri]` settings (TOML lines).
    pub extra_cri: String,
    /// More `[nri]` settings (TOML lines; `[nri.…]` tables last).
    pub extra_nri: String,
    /// `--log-level`.
    pub log_level: &'static str,
}

/// A CNI network's configuration and plugin directories.
#[derive(Debug, Clone)]
pub struct CniDirs {
    /// `conf_dir`.
    pub conf_dir: PathBuf,
    /// The one entry of `bin_dirs`.
    pub bin_dir: PathBuf,
}

impl From<&PodNetwork> for CniDirs {
    fn from(net: &PodNetwork) -> CniDirs {
        CniDirs {
            conf_dir: net.conf_dir.clone(),
            bin_dir: net.bin_dir.clone(),
        }
    }
}

impl PetrelConfig {
    /// The config file's text for a runtime whose directory is `d`.
    pub fn render(&self, d: &Path) -> String {
        let nri = d.join("nri");
        let mut text = format!(
            "[cri]\nroot = {:?}\nstate = {:?}\ndefault_cgroup_parent = {:?}\n",
            d.join("root"),
            d.join("state"),
            self.cgroup_parent,
        );
        if let Some(runc) = &self.runc {
            text.push_str(&format!("runtime_binary = {runc:?}\n"));
        }
        if let Some(shim) = &self.shim {
            text.push_str(&format!("shim_binary = {shim:?}\n"));
        }
        if self.cni.is_some() {
            text.push_str("pod_network = \"cni\"\n");
        } else if !self.extra_cri.contains("pod_network") {
            // Pods get loopback only unless a test sets up a CNI network.
            text.push_str("pod_network = \"loopback\"\n");
        }
        text.push_str(&self.extra_cri);
        text.push('\n');
        if let Some(cni) = &self.cni {
            text.push_str(&format!(
                "[cri.cni]\nconf_dir = {:?}\nbin_dirs = [{:?}]\n",
                cni.conf_dir, cni.bin_dir
            ));
        }
        if let Some(m) = &self.mirrors {
            text.push_str(&format!("[cri.registry]\nconfig_path = {m:?}\n"));
        }
        text.push_str(&format!(
            "[nri]\nsocket_path = {:?}\nplugin_path = {:?}\nplugin_config_path = {:?}\n{}\n",
            nri.join("nri.sock"),
            nri.join("plugins"),
            nri.join("conf.d"),
            self.extra_nri,
        ));
        text
    }
}

/// The config of [`PetrelRuntime::start_with`]: OCI runtime `runc`, pods
/// on network `cni`, pulls through the hosts.toml directory `mirrors`, and
/// `opts`' shim, driver and default parent (a slice with systemd).
fn started_config(runc: &Path, cni: CniDirs, mirrors: &Path, opts: &PetrelOptions) -> PetrelConfig {
    let cgroup_parent = opts
        .cgroup_parent
        .clone()
        .unwrap_or_else(|| match opts.cgroup_driver {
            CgroupDriver::Cgroupfs => format!("/petrel-conformance-{}", random_suffix()),
            CgroupDriver::Systemd => format!("petrelconf{}.slice", random_suffix()),
        });
    let extra_cri = match opts.cgroup_driver {
        CgroupDriver::Cgroupfs => String::new(),
        d => format!("cgroup_driver = {:?}\n", d.name()),
    };
    PetrelConfig {
        dir_prefix: "pkp.",
        runc: Some(runc.to_path_buf()),
        shim: opts.shim.clone(),
        cgroup_parent,
        cni: Some(cni),
        mirrors: Some(mirrors.to_path_buf()),
        extra_cri,
        extra_nri: String::new(),
        log_level: "info",
    }
}

/// How the process runs: `petrel runtime`, or `petrel node` with the
/// agent's flags.
#[derive(Debug, Clone)]
pub enum Mode {
    /// `petrel runtime`.
    Runtime,
    /// `petrel node` with these agent flags.
    Node(Vec<String>),
}

/// A `petrel runtime` (or `petrel node`) under test.
pub struct PetrelRuntime {
    /// Everything of this runtime lives here.
    pub dir: tempfile::TempDir,
    /// Its `root`.
    pub root: PathBuf,
    /// Its `state`.
    pub state: PathBuf,
    /// The CRI socket.
    pub socket: PathBuf,
    /// NRI's socket (for critest's `-nri-socket`).
    pub nri_socket: PathBuf,
    /// Its config file.
    pub config_file: PathBuf,
    /// The cgroup every pod of this runtime goes under by default.
    pub cgroup_parent: String,
    petrel: PathBuf,
    runc: PathBuf,
    log_level: &'static str,
    /// Node mode with [`NodeAgent`]: the agent's plain-HTTP address.
    agent_listen: Option<SocketAddr>,
    /// The last command line started, for messages.
    command_line: String,
    child: Option<Child>,
    /// Set once [`PetrelRuntime::shutdown`] ran: nothing is left to do.
    shut_down: bool,
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
        let config = started_config(runc, net.into(), mirrors, opts);
        let mut rt = Self::prepare(petrel, &config)?;
        let mode = match &opts.node {
            None => Mode::Runtime,
            Some(agent) => {
                let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
                rt.agent_listen = Some(listen);
                let manifests = rt.manifest_dir();
                std::fs::create_dir_all(&manifests)
                    .map_err(|e| KitError::io("create directory", &manifests, e))?;
                let mut args = vec![
                    "--manifests".to_string(),
                    manifests.display().to_string(),
                    "--agent-socket".to_string(),
                    rt.agent_socket().display().to_string(),
                    "--node-name".to_string(),
                    agent.node_name.clone(),
                    "--listen".to_string(),
                    listen.to_string(),
                    "--pleg".to_string(),
                    agent.pleg.clone(),
                ];
                if let Some(e) = &agent.eviction_hard {
                    args.extend(["--eviction-hard".to_string(), e.clone()]);
                }
                args.extend(agent.extra.iter().cloned());
                Mode::Node(args)
            }
        };
        let cmd = rt.command();
        rt.spawn(cmd, &mode)?;
        if opts.node.is_some() {
            let agent_socket = rt.agent_socket();
            rt.wait_for("petrel node's agent", &agent_socket)?;
        }
        Ok(rt)
    }

    /// Makes the runtime's directory (a [`kit_tempdir`]) and writes its
    /// config; [`PetrelRuntime::spawn`] starts it.
    pub fn prepare(petrel: &Path, config: &PetrelConfig) -> Result<PetrelRuntime, KitError> {
        if !petrel.is_file() {
            return Err(KitError::Missing {
                component: "petrel".into(),
                path: petrel.to_path_buf(),
                hint: "cargo build --bins".into(),
            });
        }
        let dir = kit_tempdir(config.dir_prefix)?;
        let d = dir.path();
        // Searchable (not listable) by others: the init of a container in a
        // user namespace, an unmapped uid on the host, must reach its
        // rootfs below the state directory, as below /run in production.
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o711))
            .map_err(|e| KitError::io("chmod", d, e))?;
        let config_file = d.join("config.toml");
        std::fs::write(&config_file, config.render(d))
            .map_err(|e| KitError::io("write", &config_file, e))?;
        let runc = config.runc.clone().unwrap_or_else(|| PathBuf::from("runc"));
        // For the sweep after a hard death of this process.
        crate::stale::record_runc_root(d, &runc, &d.join("state/runc"));
        if crate::stale::is_kit_cgroup(&config.cgroup_parent) {
            crate::stale::record_cgroup(d, &config.cgroup_parent);
        }
        Ok(PetrelRuntime {
            root: d.join("root"),
            state: d.join("state"),
            socket: d.join("state/petrel.sock"),
            nri_socket: d.join("nri/nri.sock"),
            config_file,
            cgroup_parent: config.cgroup_parent.clone(),
            petrel: petrel.to_path_buf(),
            runc,
            log_level: config.log_level,
            agent_listen: None,
            command_line: String::new(),
            child: None,
            shut_down: false,
            dir,
        })
    }

    /// A command for the `petrel` binary, to give [`PetrelRuntime::spawn`]
    /// (with settings of the caller's, e.g. a resource limit).
    pub fn command(&self) -> Command {
        Command::new(&self.petrel)
    }

    /// Starts the prepared runtime with `cmd` (from
    /// [`PetrelRuntime::command`]) in `mode`, its output appended to its
    /// log, and waits until its socket accepts.
    pub fn spawn(&mut self, mut cmd: Command, mode: &Mode) -> Result<(), KitError> {
        match mode {
            Mode::Runtime => cmd.arg("runtime"),
            Mode::Node(_) => cmd.arg("node"),
        };
        cmd.arg("--config")
            .arg(&self.config_file)
            .args(["--log-level", self.log_level]);
        if let Mode::Node(args) = mode {
            cmd.args(args);
        }
        self.command_line = describe(&cmd);
        let child = spawn_logged("petrel runtime", &mut cmd, &self.log_path())?;
        write_pid_file(self.dir.path(), "runtime", child.id());
        self.child = Some(child);
        let socket = self.socket.clone();
        self.wait_for("petrel runtime", &socket)
    }

    /// Waits for a socket of the process (its CRI socket, its agent's).
    fn wait_for(&mut self, component: &str, socket: &Path) -> Result<(), KitError> {
        let log = self.log_path();
        let Some(c) = self.child.as_mut() else {
            return Ok(());
        };
        process::wait_for_socket(component, c, socket, READY_WITHIN, &self.command_line, &log)
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
        self.state.clone()
    }

    /// The process's pid (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The OCI runtime binary (`runc` in PATH unless configured).
    pub fn runc(&self) -> &Path {
        &self.runc
    }

    /// Whether the process was started and not stopped since.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
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
    pub fn agent_listen(&self) -> Option<SocketAddr> {
        self.agent_listen
    }

    /// SIGKILLs the process (containers keep running under their shims).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            process::kill_child(&mut c);
        }
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL: its exit status, and
    /// whether it had to be killed (None when it was not running).
    pub fn stop(&mut self, grace: Duration) -> Option<(ExitStatus, bool)> {
        let mut c = self.child.take()?;
        stop_child(&mut c, grace)
    }

    /// Removes every pod through the runtime (a runtime a test killed is
    /// started again for that), stops it, then sweeps its runc root,
    /// mounts and cgroup parent. Runs once: a later call (or the drop)
    /// does nothing. The directory stays until the drop.
    pub fn shutdown(&mut self) {
        if std::mem::replace(&mut self.shut_down, true) {
            return;
        }
        self.cleanup();
    }

    fn cleanup(&mut self) {
        // 1. Through the runtime: it knows every pod it made.
        if self.child.is_none() && self.root.join("meta.redb").exists() {
            // A test killed the runtime: start it again (without an agent
            // that would start pods again) to clean up.
            let cmd = self.command();
            if let Err(e) = self.spawn(cmd, &Mode::Runtime) {
                eprintln!("petrel-testkit: runtime not restarted for cleanup: {e}");
            }
        }
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
        // 2. Sweep what is left in this runtime's own places.
        process::runc_sweep(&self.runc, &self.state.join("runc"));
        process::unmount_under(self.dir.path());
        process::remove_cgroup_tree(&self.cgroup_parent);
    }
}

impl Drop for PetrelRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn config() -> PetrelConfig {
        PetrelConfig {
            dir_prefix: "petrel-e2e.",
            runc: None,
            shim: None,
            cgroup_parent: "/petrel-test-abc".into(),
            cni: None,
            mirrors: None,
            extra_cri: String::new(),
            extra_nri: String::new(),
            log_level: "debug",
        }
    }

    #[test]
    fn render_should_give_a_test_runtime_loopback_and_its_own_places() {
        let d = Path::new("/tmp/petrel-e2e.x");
        let mut c = config();
        c.extra_nri = "enable = true".into();
        let v: toml::Value = toml::from_str(&c.render(d)).expect("toml");
        let cri = &v["cri"];
        assert_eq!(cri["root"].as_str(), Some("/tmp/petrel-e2e.x/root"));
        assert_eq!(cri["state"].as_str(), Some("/tmp/petrel-e2e.x/state"));
        assert_eq!(
            cri["default_cgroup_parent"].as_str(),
            Some("/petrel-test-abc")
        );
        assert_eq!(cri["pod_network"].as_str(), Some("loopback"));
        assert!(cri.get("runtime_binary").is_none());
        assert_eq!(
            v["nri"]["socket_path"].as_str(),
            Some("/tmp/petrel-e2e.x/nri/nri.sock")
        );
        assert_eq!(v["nri"]["enable"].as_bool(), Some(true));
    }

    #[test]
    fn render_should_keep_a_tests_own_pod_network() {
        let mut c = config();
        c.extra_cri = "pod_network = \"host\"".into();
        let v: toml::Value = toml::from_str(&c.render(Path::new("/t"))).expect("toml");
        assert_eq!(v["cri"]["pod_network"].as_str(), Some("host"));
    }

    #[test]
    fn render_should_put_a_compared_runtime_on_cni_with_mirrors() {
        let mut c = config();
        c.runc = Some("/usr/sbin/runc".into());
        c.shim = Some("/b/petrel-shim".into());
        c.cni = Some(CniDirs {
            conf_dir: "/n/net.d".into(),
            bin_dir: "/usr/lib/cni".into(),
        });
        c.mirrors = Some("/m".into());
        let v: toml::Value = toml::from_str(&c.render(Path::new("/t"))).expect("toml");
        let cri = &v["cri"];
        assert_eq!(cri["pod_network"].as_str(), Some("cni"));
        assert_eq!(cri["runtime_binary"].as_str(), Some("/usr/sbin/runc"));
        assert_eq!(cri["shim_binary"].as_str(), Some("/b/petrel-shim"));
        assert_eq!(cri["cni"]["conf_dir"].as_str(), Some("/n/net.d"));
        assert_eq!(cri["cni"]["bin_dirs"][0].as_str(), Some("/usr/lib/cni"));
        assert_eq!(cri["registry"]["config_path"].as_str(), Some("/m"));
    }

    #[test]
    fn a_started_runtime_should_take_the_chosen_cgroup_driver_and_its_parent_form() {
        let cni = || CniDirs {
            conf_dir: "/n/net.d".into(),
            bin_dir: "/usr/lib/cni".into(),
        };
        let (runc, mirrors) = (Path::new("/r/runc"), Path::new("/m"));
        let render = |opts: &PetrelOptions| {
            let c = started_config(runc, cni(), mirrors, opts);
            let v: toml::Value = toml::from_str(&c.render(Path::new("/t"))).expect("toml");
            (c, v)
        };
        // cgroupfs: Petrel's default, a path for a parent.
        let (c, v) = render(&PetrelOptions::default());
        assert!(v["cri"].get("cgroup_driver").is_none());
        assert!(c.cgroup_parent.starts_with("/petrel-conformance-"));
        // systemd: said in the config, a slice name for a parent.
        let systemd = PetrelOptions {
            cgroup_driver: CgroupDriver::Systemd,
            ..PetrelOptions::default()
        };
        let (c, v) = render(&systemd);
        assert_eq!(v["cri"]["cgroup_driver"].as_str(), Some("systemd"));
        assert_eq!(
            v["cri"]["default_cgroup_parent"].as_str(),
            Some(c.cgroup_parent.as_str())
        );
        let stem = c
            .cgroup_parent
            .strip_prefix("petrelconf")
            .and_then(|s| s.strip_suffix(".slice"))
            .expect("a slice name");
        assert!(stem.chars().all(|ch| ch.is_ascii_alphanumeric()), "{stem}");
        assert_eq!(v["cri"]["pod_network"].as_str(), Some("cni"));
        assert_eq!(v["cri"]["runtime_binary"].as_str(), Some("/r/runc"));
        // A parent given is kept whatever the driver.
        let given = PetrelOptions {
            cgroup_parent: Some("own.slice".into()),
            ..systemd
        };
        assert_eq!(render(&given).0.cgroup_parent, "own.slice");
    }
}
