//! `petrel runtime`: serve CRI on a unix socket.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::FileConfig;

/// Flags of `petrel runtime`; each overrides the config file.
#[derive(Debug, Args)]
pub struct RuntimeArgs {
    /// Configuration file (TOML, section [cri]).
    #[arg(long, env = "PETREL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Persistent data directory [default: /var/lib/petrel].
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Volatile state directory [default: /run/petrel].
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// CRI socket [default: <state>/petrel.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// OCI runtime binary [default: runc].
    #[arg(long)]
    pub runtime_binary: Option<PathBuf>,
    /// Shim binary [default: petrel-shim beside this binary].
    #[arg(long)]
    pub shim_binary: Option<PathBuf>,
    /// CRIU binary for CheckpointContainer and restores [default: criu
    /// on PATH].
    #[arg(long)]
    pub criu_binary: Option<PathBuf>,
    /// Who manages pod and container cgroups: `cgroupfs` (the runtime
    /// and runc) or `systemd` (slices and scopes; runc --systemd-cgroup;
    /// cgroup v2 only). The kubelet's cgroupDriver must match
    /// [default: cgroupfs].
    #[arg(long, value_enum)]
    pub cgroup_driver: Option<CgroupDriverArg>,
    /// Cgroup for pods that name none [default: /petrel; with the systemd
    /// driver, the slice petrel.slice].
    #[arg(long)]
    pub default_cgroup_parent: Option<String>,
    /// Directory of per-registry `<host>/hosts.toml` files (mirrors,
    /// TLS, headers), as containerd's config_path.
    #[arg(long)]
    pub registry_config_dir: Option<PathBuf>,
    /// A registry (`host[:port]`) that may be reached over plain HTTP;
    /// repeatable. Loopback registries always may.
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// How pods get a network: `cni` (the CNI config in --cni-conf-dir) or
    /// `loopback` (a private namespace with loopback only) [default: cni].
    #[arg(long, value_enum)]
    pub pod_network: Option<PodNetworkArg>,
    /// CNI plugin directories, colon-separated
    /// [default: /usr/lib/cni:/opt/cni/bin].
    #[arg(long)]
    pub cni_bin_dir: Option<String>,
    /// CNI configuration directory; its first .conf/.conflist/.json file
    /// is the pod network [default: /etc/cni/net.d].
    #[arg(long)]
    pub cni_conf_dir: Option<PathBuf>,
    /// Where the streaming server (exec, attach, port-forward URLs)
    /// listens [default: 127.0.0.1:0, loopback on a free port].
    #[arg(long)]
    pub stream_address: Option<std::net::SocketAddr>,
    /// Socket NRI plugins dial [default: /var/run/nri/nri.sock].
    #[arg(long)]
    pub nri_socket: Option<PathBuf>,
    /// Directory of pre-registered NRI plugins (`NN-name` executables)
    /// [default: /opt/nri/plugins].
    #[arg(long)]
    pub nri_plugin_path: Option<PathBuf>,
    /// Directory of their configuration (`NN-name.conf` or `name.conf`)
    /// [default: /etc/nri/conf.d].
    #[arg(long)]
    pub nri_plugin_config_path: Option<PathBuf>,
    /// Turn NRI off (it is on by default).
    #[arg(long)]
    pub disable_nri: bool,
    /// Turn the measured fast paths off (hand-framed List answers, runc's
    /// exec-FIFO start and runc-free delete; on by default, `[cri]
    /// fast_paths`): every List is built typed, runc starts and deletes
    /// every container.
    #[arg(long, env = "PETREL_DISABLE_FAST_PATHS")]
    pub disable_fast_paths: bool,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
}

/// `--cgroup-driver` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CgroupDriverArg {
    /// cgroup directories made by the runtime and runc.
    Cgroupfs,
    /// systemd slices and scopes.
    Systemd,
}

/// `--pod-network` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PodNetworkArg {
    /// CNI plugins.
    Cni,
    /// Loopback only.
    Loopback,
}

impl RuntimeArgs {
    /// The effective configuration: defaults < file < flags.
    pub fn resolve(&self) -> anyhow::Result<petrel_runtime::RuntimeConfig> {
        let mut c = match &self.config {
            Some(p) => {
                let file = FileConfig::load(p)?;
                let mut c = file.cri;
                c.nri = file.nri;
                c
            }
            None => petrel_runtime::RuntimeConfig::default(),
        };
        if let Some(v) = &self.nri_socket {
            c.nri.socket_path = v.clone();
        }
        if let Some(v) = &self.nri_plugin_path {
            c.nri.plugin_path = v.clone();
        }
        if let Some(v) = &self.nri_plugin_config_path {
            c.nri.plugin_config_path = v.clone();
        }
        if self.disable_nri {
            c.nri.disable = true;
        }
        if self.disable_fast_paths {
            c.fast_paths = false;
        }
        if let Some(v) = &self.root {
            c.root = v.clone();
        }
        if let Some(v) = &self.state {
            c.state = v.clone();
        }
        if let Some(v) = &self.socket {
            c.socket = Some(v.clone());
        }
        if let Some(v) = &self.runtime_binary {
            c.runtime_binary = v.clone();
        }
        if let Some(v) = &self.shim_binary {
            c.shim_binary = Some(v.clone());
        }
        if let Some(v) = &self.criu_binary {
            c.criu_binary = v.clone();
        }
        if let Some(v) = self.cgroup_driver {
            c.cgroup_driver = match v {
                CgroupDriverArg::Cgroupfs => petrel_runtime::config::CgroupDriver::Cgroupfs,
                CgroupDriverArg::Systemd => petrel_runtime::config::CgroupDriver::Systemd,
            };
        }
        if let Some(v) = &self.default_cgroup_parent {
            c.default_cgroup_parent = v.clone();
        }
        c.check_cgroups()
            .map_err(|e| anyhow::anyhow!("default cgroup parent: {e}"))?;
        if let Some(v) = &self.registry_config_dir {
            c.registry.config_path = Some(v.clone());
        }
        c.registry
            .insecure
            .extend(self.insecure_registries.iter().cloned());
        if let Some(v) = self.pod_network {
            c.pod_network = match v {
                PodNetworkArg::Cni => petrel_runtime::config::PodNetworkMode::Cni,
                PodNetworkArg::Loopback => petrel_runtime::config::PodNetworkMode::Loopback,
            };
        }
        if let Some(v) = &self.cni_bin_dir {
            let dirs: Vec<PathBuf> = std::env::split_paths(v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
            if dirs.is_empty() {
                anyhow::bail!("--cni-bin-dir {v:?} names no directory");
            }
            c.cni.bin_dirs = dirs;
        }
        if let Some(v) = &self.cni_conf_dir {
            c.cni.conf_dir = v.clone();
        }
        if let Some(v) = self.stream_address {
            c.stream_address = v;
        }
        Ok(c)
    }
}

/// Runs the runtime until SIGTERM or SIGINT.
pub fn main(args: RuntimeArgs) -> ExitCode {
    crate::observability::init(&args.log_level, args.log_json);
    let config = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("petrel runtime: {e:#}");
            return ExitCode::from(2);
        }
    };
    super::run_daemon("runtime", petrel_runtime::serve(config, shutdown_signal()))
}

/// Completes on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the process still dies on the signals'
        // default action; nothing to wait for.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        runtime: RuntimeArgs,
    }

    #[test]
    fn disable_fast_paths_flag_should_turn_the_switch_off() -> anyhow::Result<()> {
        let on = Flags::try_parse_from(["runtime"])?.runtime.resolve()?;
        assert!(on.fast_paths);
        let off = Flags::try_parse_from(["runtime", "--disable-fast-paths"])?
            .runtime
            .resolve()?;
        assert!(!off.fast_paths);
        Ok(())
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn cgroup_driver_flag_should_pick_the_driver_and_its_default_slice() -> anyhow::Result<()> {
        use petrel_runtime::config::CgroupDriver;
        let fs = Flags::try_parse_from(["runtime"])?.runtime.resolve()?;
        assert_eq!(fs.cgroup_driver, CgroupDriver::Cgroupfs);
        assert_eq!(fs.default_parent(), "/petrel");
        let sd = Flags::try_parse_from(["runtime", "--cgroup-driver", "systemd"])?
            .runtime
            .resolve()?;
        assert_eq!(sd.cgroup_driver, CgroupDriver::Systemd);
        assert_eq!(sd.default_parent(), "petrel.slice");
        assert_eq!(
            sd.default_pod_cgroup("ab")?,
            "/petrel.slice/petrel-ab.slice"
        );
        // A default parent in the other driver's form is refused up front.
        let e = Flags::try_parse_from([
            "runtime",
            "--cgroup-driver",
            "systemd",
            "--default-cgroup-parent",
            "/pods",
        ])?
        .runtime
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("/pods") && e.contains("slice"), "{e}");
        let e = Flags::try_parse_from(["runtime", "--default-cgroup-parent", "pods.slice"])?
            .runtime
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("pods.slice") && e.contains("cgroupfs"), "{e}");
        Ok(())
    }
}
