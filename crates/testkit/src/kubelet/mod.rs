//! The real kubelet (from the peers) driving a CRI runtime under test.
//!
//! Each [`Kubelet`] has a temporary directory of its own (root dir, static
//! pod manifests, pod logs, certificates, its config file and log), its own
//! ports on 127.0.0.1, its own cgroup root (`/petrel-kubelet-<random>`
//! unless [`KubeletOptions::cgroup_root`] names one) and node name, so
//! several run side by side; it runs in a mount namespace of its own
//! ([`mountns`]). Standalone it runs static pods only; joined
//! ([`KubeletOptions::joined`]) it registers with a [`crate::cluster::Cluster`].
//! [`Kubelet::restart`] stops the process and starts it again in the same
//! places (its pods keep running and are adopted), e.g. with the other PLEG.
//!
//! The runtime must be this kubelet's alone: dropping the [`Kubelet`]
//! stops it by pid, then removes every pod of the runtime through CRI
//! (kubelet does not stop its pods when it exits), unmounts whatever is
//! left under its root directory (the shared bind mount of the root itself,
//! volumes), removes its cgroup tree in every hierarchy and its directory.
//! So a test declares the runtime first and the kubelet after it: locals
//! drop in reverse order, and the runtime must still answer.

pub mod config;
pub mod mountns;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::cluster::NodeCredentials;
use crate::process::{free_port, random_suffix, spawn_logged, stop_child, tail};
use crate::KitError;
use config::{KubeletConfig, KubeletPorts, ServerAuth};

/// How long kubelet gets to answer `/healthz` after its start.
const HEALTHY_WITHIN: Duration = Duration::from_secs(120);

/// Why kubelet tests are left out, if `PETREL_PEERS_SKIP` says so: it
/// names `kubernetes` (the component) or `kubelet`. Otherwise a missing
/// kubelet fails the test.
pub fn left_out() -> Option<String> {
    ["kubernetes", "kubelet"]
        .into_iter()
        .find(|c| crate::peers::left_out(c))
        .map(|c| format!("{c} left out (PETREL_PEERS_SKIP)"))
}

/// How a kubelet is started.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// The node's name (`--hostname-override`).
    pub node_name: String,
    /// The runtime's CRI endpoint, `unix:///…`.
    pub runtime_endpoint: String,
    /// The `EventedPLEG` feature gate.
    pub evented_pleg: bool,
    /// Credentials in a cluster; None: standalone.
    pub join: Option<NodeCredentials>,
    /// `crashLoopBackOff.maxContainerRestartPeriod`.
    pub max_restart_period: Option<Duration>,
    /// The most pods kubelet admits (`maxPods`); None: kubelet's 110.
    pub max_pods: Option<u32>,
    /// kubelet's log verbosity (`-v`).
    pub verbosity: u8,
    /// The cgroup kubelet puts `kubepods` in (made, and removed with
    /// everything below it on drop); None: `/petrel-kubelet-<random>`.
    pub cgroup_root: Option<String>,
    /// kubelet's `cgroupDriver: systemd` (a host with systemd as PID 1 on
    /// v2, the systemd test VM): its cgroup root is `/`, pods go in
    /// `kubepods.slice`, which is stopped on drop; `cgroup_root` is
    /// ignored.
    pub systemd_cgroups: bool,
}

impl KubeletOptions {
    /// A standalone kubelet (static pods, no API server) named `node_name`
    /// on the runtime at `runtime_endpoint`.
    pub fn standalone(node_name: &str, runtime_endpoint: &str) -> KubeletOptions {
        KubeletOptions {
            node_name: node_name.to_string(),
            runtime_endpoint: runtime_endpoint.to_string(),
            evented_pleg: false,
            join: None,
            max_restart_period: None,
            max_pods: None,
            verbosity: 2,
            cgroup_root: None,
            systemd_cgroups: false,
        }
    }

    /// A kubelet registering as `creds.node` with the cluster `creds` come
    /// from.
    pub fn joined(creds: NodeCredentials, runtime_endpoint: &str) -> KubeletOptions {
        KubeletOptions {
            node_name: creds.node.clone(),
            join: Some(creds),
            ..KubeletOptions::standalone("", runtime_endpoint)
        }
    }

    /// With the `EventedPLEG` feature gate on or off.
    #[must_use]
    pub fn evented_pleg(mut self, on: bool) -> KubeletOptions {
        self.evented_pleg = on;
        self
    }

    /// With `cgroupDriver: systemd` (see [`KubeletOptions::systemd_cgroups`]).
    #[must_use]
    pub fn systemd_cgroups(mut self, on: bool) -> KubeletOptions {
        self.systemd_cgroups = on;
        self
    }

    /// With crashed containers restarted after at most `max`.
    #[must_use]
    pub fn max_restart_period(mut self, max: Duration) -> KubeletOptions {
        self.max_restart_period = Some(max);
        self
    }
}

/// A running kubelet.
pub struct Kubelet {
    dir: tempfile::TempDir,
    node_name: String,
    root_dir: PathBuf,
    cgroup_root: String,
    systemd_cgroups: bool,
    address: IpAddr,
    ports: KubeletPorts,
    runtime_endpoint: String,
    /// The binary, its configuration and arguments, for restarts.
    bin: PathBuf,
    config: KubeletConfig,
    args: Vec<String>,
    child: Option<Child>,
}

impl Kubelet {
    /// Starts kubelet and waits until `/healthz` answers `ok`.
    pub fn start(opts: KubeletOptions) -> Result<Kubelet, KitError> {
        let bin = crate::peers::peer_binary("kubelet")?;
        let dir = crate::process::kit_tempdir("petrel-kubelet.")?;
        let d = dir.path();
        let root_dir = d.join("root");
        for sub in ["root", "manifests", "pod-logs", "volume-plugins", "pki"] {
            let p = d.join(sub);
            std::fs::create_dir_all(&p).map_err(|e| KitError::io("create directory", &p, e))?;
        }
        // kubelet refuses a loopback node IP; joined, it listens there for
        // the API server, standalone on loopback only.
        let node_ip = match &opts.join {
            Some(c) => c.node_ip,
            None => node_ip()?,
        };
        let address = match &opts.join {
            Some(_) => node_ip,
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let cgroup_root = match (&opts.cgroup_root, opts.systemd_cgroups) {
            (_, true) => "/".to_string(),
            (Some(r), false) => r.clone(),
            (None, false) => format!("/petrel-kubelet-{}", random_suffix()),
        };
        let ports = KubeletPorts {
            api: free_port()?,
            // Unauthenticated: never on the node's IP.
            read_only: match &opts.join {
                Some(_) => None,
                None => Some(free_port()?),
            },
            healthz: free_port()?,
        };
        let config = KubeletConfig {
            runtime_endpoint: opts.runtime_endpoint.clone(),
            static_pod_path: d.join("manifests"),
            pod_logs_dir: d.join("pod-logs"),
            volume_plugin_dir: d.join("volume-plugins"),
            cgroup_root: cgroup_root.clone(),
            address,
            ports,
            auth: match &opts.join {
                None => ServerAuth::Standalone,
                Some(c) => ServerAuth::Cluster {
                    client_ca: c.client_ca.clone(),
                    tls_cert: c.serving.cert.clone(),
                    tls_key: c.serving.key.clone(),
                },
            },
            evented_pleg: opts.evented_pleg,
            max_open_files: rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .maximum
                .unwrap_or(1_000_000),
            max_restart_period: opts.max_restart_period,
            max_pods: opts.max_pods,
            cgroup_v1_host: config::host_is_cgroup_v1(),
            systemd_cgroups: opts.systemd_cgroups,
        };
        let mut args = vec![
            format!("--config={}", d.join("config.json").display()),
            format!("--root-dir={}", root_dir.display()),
            // The default is /var/lib/kubelet/pki, whatever --root-dir says.
            format!("--cert-dir={}", d.join("pki").display()),
            format!("--hostname-override={}", opts.node_name),
            // The API server reaches kubelets by InternalIP.
            format!("--node-ip={node_ip}"),
            format!("-v={}", opts.verbosity),
        ];
        if let Some(c) = &opts.join {
            args.push(format!("--kubeconfig={}", c.kubeconfig.display()));
        }
        let mut kubelet = Kubelet {
            systemd_cgroups: opts.systemd_cgroups,
            node_name: opts.node_name.clone(),
            root_dir,
            cgroup_root,
            address,
            ports,
            runtime_endpoint: opts.runtime_endpoint.clone(),
            bin,
            config,
            args,
            child: None,
            dir,
        };
        if !opts.systemd_cgroups {
            if opts.cgroup_root.is_none() {
                // Ours: swept after a hard death of this process too.
                crate::stale::record_cgroup(kubelet.dir.path(), &kubelet.cgroup_root);
            }
            create_cgroup_root(&kubelet.cgroup_root)?;
        }
        share_root_dir(&kubelet.root_dir)?;
        mountns::prepare(&kubelet.dir.path().join("mountns"))?;
        kubelet.spawn()?;
        Ok(kubelet)
    }

    /// Writes the configuration, starts the process and waits until
    /// `/healthz` answers `ok`.
    fn spawn(&mut self) -> Result<(), KitError> {
        let config_path = self.dir.path().join("config.json");
        let text = serde_json::to_string_pretty(&self.config.render()).unwrap_or_default();
        std::fs::write(&config_path, text).map_err(|e| KitError::io("write", &config_path, e))?;
        let mut cmd = mountns::command(&self.dir.path().join("mountns"), &self.bin);
        cmd.args(&self.args);
        // The kubelet part only: the namespace set-up is a page of shell.
        let command = format!(
            "{} {} (in its own mount namespace)",
            self.bin.display(),
            self.args.join(" ")
        );
        let log = self.log_path();
        let child = spawn_logged("kubelet", &mut cmd, &log)?;
        crate::process::write_pid_file(self.dir.path(), "kubelet", child.id());
        self.child = Some(child);
        self.wait_healthy(&command)
    }

    /// Stops kubelet (its pods keep running) and starts it again in the
    /// same directories, on the same ports and cgroup root, with the
    /// `EventedPLEG` feature gate set to `evented`; waits for `/healthz`.
    pub fn restart(&mut self, evented: bool) -> Result<(), KitError> {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        self.config.evented_pleg = evented;
        self.spawn()
    }

    /// Whether the `EventedPLEG` feature gate is on.
    pub fn evented_pleg(&self) -> bool {
        self.config.evented_pleg
    }

    fn wait_healthy(&mut self, command: &str) -> Result<(), KitError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.ports.healthz));
        let start = Instant::now();
        let log = self.log_path();
        let fail = |detail: String| KitError::Start {
            component: "kubelet".into(),
            command: command.to_string(),
            log: log.clone(),
            detail: format!("{detail}; last lines:\n{}", tail(&log, 15)),
        };
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(fail(format!("exited at start ({st})")));
                }
            }
            if let Ok(r) = crate::http::get(addr, "/healthz", Duration::from_secs(2)) {
                if r.status == 200 && r.body.trim() == "ok" {
                    return Ok(());
                }
            }
            if start.elapsed() > HEALTHY_WITHIN {
                return Err(fail(format!("/healthz not ok within {HEALTHY_WITHIN:?}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Where static pod manifests go (`staticPodPath`).
    pub fn manifest_dir(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Writes static pod manifest `<name>.yaml` whole: into a dot-file first
    /// (kubelet skips those), then renamed, so kubelet never reads it half
    /// written ("couldn't parse as pod").
    pub fn write_manifest(&self, name: &str, yaml: &str) -> Result<(), KitError> {
        let dir = self.manifest_dir();
        let tmp = dir.join(format!(".{name}.yaml.tmp"));
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&tmp, yaml).map_err(|e| KitError::io("write", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| KitError::io("rename", &path, e))
    }

    /// Removes static pod manifest `<name>.yaml`: kubelet stops the pod.
    pub fn remove_manifest(&self, name: &str) -> Result<(), KitError> {
        let path = self.manifest_dir().join(format!("{name}.yaml"));
        std::fs::remove_file(&path).map_err(|e| KitError::io("remove", &path, e))
    }

    /// kubelet's `--root-dir`.
    pub fn root_dir(&self) -> &Path {
        &self.root_dir
    }

    /// The cgroup kubelet puts `kubepods` in.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// The ports kubelet listens on.
    pub fn ports(&self) -> KubeletPorts {
        self.ports
    }

    /// kubelet's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// kubelet's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("kubelet.log")
    }

    /// kubelet's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The address kubelet's API listens on (loopback standalone, the node's
    /// IP joined).
    pub fn address(&self) -> IpAddr {
        self.address
    }

    /// `GET path` on the read-only port (`/pods`, `/metrics`, ...); fails
    /// unless the answer is 200. Standalone kubelets only: joined, the port
    /// is off and the API server's node proxy serves the same paths
    /// (`kubectl get --raw /api/v1/nodes/<node>/proxy/metrics`).
    pub fn read_only(&self, path: &str) -> Result<String, KitError> {
        let Some(port) = self.ports.read_only else {
            return Err(KitError::Run {
                component: "kubelet".into(),
                detail: format!(
                    "GET {path}: the read-only port is off on a joined kubelet; \
                     ask the API server's node proxy"
                ),
                log: self.log_path(),
            });
        };
        let addr = SocketAddr::from((self.address, port));
        let r =
            crate::http::get(addr, path, Duration::from_secs(10)).map_err(|e| KitError::Run {
                component: "kubelet".into(),
                detail: format!("GET http://{addr}{path}: {e}"),
                log: self.log_path(),
            })?;
        if r.status != 200 {
            return Err(KitError::Run {
                component: "kubelet".into(),
                detail: format!("GET http://{addr}{path}: status {}: {}", r.status, r.body),
                log: self.log_path(),
            });
        }
        Ok(r.body)
    }

    /// kubelet's pods as it serves them on `/pods` (a PodList).
    pub fn pods(&self) -> Result<serde_json::Value, KitError> {
        let body = self.read_only("/pods")?;
        serde_json::from_str(&body).map_err(|e| KitError::Run {
            component: "kubelet".into(),
            detail: format!("/pods is not JSON: {e}"),
            log: self.log_path(),
        })
    }

    /// kubelet's `/metrics` (Prometheus text).
    pub fn metrics(&self) -> Result<String, KitError> {
        self.read_only("/metrics")
    }
}

/// The host's IPv4 address a node is known by: the source address of the
/// default route, else the first global one. kubelet refuses loopback.
pub fn node_ip() -> Result<IpAddr, KitError> {
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let routed = ip(&["-4", "-o", "route", "get", "192.0.2.255"]);
    let from_route = routed
        .split_whitespace()
        .skip_while(|w| *w != "src")
        .nth(1)
        .and_then(|a| a.parse::<IpAddr>().ok());
    let global = || {
        ip(&["-4", "-o", "addr", "show", "scope", "global"])
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse::<IpAddr>().ok())
    };
    from_route
        .or_else(global)
        .filter(|a| !a.is_loopback())
        .ok_or_else(|| KitError::Missing {
            component: "a non-loopback IPv4 address".into(),
            path: "ip -4 route get / ip -4 addr show scope global".into(),
            hint: "kubelet refuses a loopback node IP: the host needs an address on an interface"
                .into(),
        })
}

/// The sum of the samples of metric `name` (any labels) in Prometheus
/// text `text`; None when there is none.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // `name value` or `name{labels} value`, never a longer name.
        let value = if let Some(r) = rest.strip_prefix(' ') {
            r
        } else if rest.starts_with('{') {
            match rest.rsplit_once("} ") {
                Some((_, v)) => v,
                None => continue,
            }
        } else {
            continue;
        };
        if let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

pub use crate::process::cgroup_dirs;

/// Whether cgroup `path` exists in any hierarchy.
pub fn cgroup_exists(path: &str) -> bool {
    cgroup_dirs(path).iter().any(|d| d.is_dir())
}

/// Makes cgroup `path` in every hierarchy: kubelet refuses a cgroup root
/// that is missing in any of its subsystems. Each new v1 cpuset cgroup on
/// the way (the root may be nested, e.g. under a bench's own cgroup) gets
/// its parent's cpus and mems (v1 leaves them empty, and nothing could run
/// in it).
fn create_cgroup_root(path: &str) -> Result<(), KitError> {
    let levels: Vec<&str> = path
        .trim_start_matches('/')
        .split('/')
        .filter(|l| !l.is_empty())
        .collect();
    for top in cgroup_dirs("/") {
        let mut dir = top;
        for level in &levels {
            let parent = dir.clone();
            dir = dir.join(level);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(KitError::io("create cgroup", &dir, e)),
            }
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let target = dir.join(f);
                if !target.exists()
                    || !std::fs::read_to_string(&target).is_ok_and(|v| v.trim().is_empty())
                {
                    continue;
                }
                if let Ok(v) = std::fs::read_to_string(parent.join(f)) {
                    std::fs::write(&target, v.trim())
                        .map_err(|e| KitError::io("write", &target, e))?;
                }
            }
        }
    }
    Ok(())
}

/// Bind-mounts `dir` on itself with shared propagation, in the host's
/// mount namespace: kubelet's mounts under it (made in its own namespace)
/// then show here, where the runtime mounts them into containers. kubelet
/// would make the same mount itself if `dir` were not one already.
fn share_root_dir(dir: &Path) -> Result<(), KitError> {
    use rustix::mount::{mount_bind, mount_change, MountPropagationFlags};
    mount_bind(dir, dir).map_err(|e| KitError::io("bind-mount", dir, e.into()))?;
    mount_change(dir, MountPropagationFlags::SHARED)
        .map_err(|e| KitError::io("make shared", dir, e.into()))
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- last lines of {}:\n{}",
                self.log_path().display(),
                tail(&self.log_path(), 40)
            );
        }
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        // kubelet leaves its pods running when it exits.
        let _ = crate::cri::remove_all_pods(&self.runtime_endpoint);
        crate::process::unmount_under(&self.root_dir);
        if self.systemd_cgroups {
            // systemd's: kubepods.slice and everything in it, stopped.
            let _ = std::process::Command::new("systemctl")
                .args(["stop", "--", "kubepods.slice"])
                .status();
            return;
        }
        // A cgroup whose last process just exited may be busy a moment.
        let start = Instant::now();
        loop {
            crate::process::remove_cgroup_tree(&self.cgroup_root);
            if !cgroup_exists(&self.cgroup_root) || start.elapsed() > Duration::from_secs(5) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_value_should_sum_samples_of_exactly_that_name() {
        let text = "# HELP x\n\
                    kubelet_evented_pleg_connection_success_count 2\n\
                    kubelet_evented_pleg_connection_success_count_other 7\n\
                    kubelet_running_containers{container_state=\"running\"} 3\n\
                    kubelet_running_containers{container_state=\"exited\"} 1\n";
        assert_eq!(
            metric_value(text, "kubelet_evented_pleg_connection_success_count"),
            Some(2.0)
        );
        assert_eq!(metric_value(text, "kubelet_running_containers"), Some(4.0));
        assert_eq!(metric_value(text, "kubelet_missing"), None);
    }
}
