//! The agent's configuration: `[agent]` in Petrel's config file, overridden
//! by flags. Every default is kubelet's unless a comment says otherwise.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// How the PLEG learns about changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PlegMode {
    /// Events when the runtime serves GetContainerEvents, relisting
    /// otherwise (decided at start-up).
    #[default]
    Auto,
    /// The event stream (with a slow safety-net relist).
    Events,
    /// Relisting only, like kubelet's generic PLEG.
    Relist,
}

impl std::str::FromStr for PlegMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "events" => Ok(Self::Events),
            "relist" => Ok(Self::Relist),
            other => Err(format!(
                "invalid PLEG mode {other:?}: expected auto, events or relist"
            )),
        }
    }
}

/// Everything the agent needs to run.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The CRI endpoint, `unix:///path`.
    pub runtime_endpoint: String,
    /// The directory of pod manifests.
    pub manifests: PathBuf,
    /// Address of the TCP server. In plain HTTP (loopback only) it serves
    /// `/healthz` and `/metrics`, like kubelet's read-only port without
    /// the pods; with the three TLS files below (client-certificate
    /// authentication, required on a non-loopback address) it serves the
    /// whole API.
    pub listen: SocketAddr,
    /// The unix socket that serves the whole API (/pods, container logs,
    /// exec, attach, port-forward) to root and `socket_group`. Default
    /// `/run/petrel-agent/agent.sock`, in a directory of its own.
    pub socket: PathBuf,
    /// A group (name in /etc/group, or gid) whose members may use the
    /// socket too: the socket becomes `root:<group>` 0660 and its directory
    /// `root:<group>` 0750. None: root only.
    pub socket_group: Option<String>,
    /// The server's certificate (PEM): serve HTTPS.
    pub tls_cert_file: Option<PathBuf>,
    /// The server certificate's private key (PEM).
    pub tls_private_key_file: Option<PathBuf>,
    /// The CA whose signed client certificates are accepted (PEM).
    pub client_ca_file: Option<PathBuf>,
    /// The agent's own state (pod volumes, ...). Default /var/lib/petrel/agent.
    pub root: PathBuf,
    /// The node's name (labels, UIDs, status). Default: the host name.
    pub node_name: String,
    /// PLEG mode.
    pub pleg: PlegMode,
    /// Relist period in relist mode (1 s).
    #[serde(with = "humantime_secs")]
    pub relist_period: Duration,
    /// Safety-net relist period in event mode (5 min).
    #[serde(with = "humantime_secs")]
    pub event_relist_period: Duration,
    /// Unhealthy after this long without a successful relist (3 min).
    #[serde(with = "humantime_secs")]
    pub relist_threshold: Duration,
    /// Periodic resync of every pod (10 s).
    #[serde(with = "humantime_secs")]
    pub sync_period: Duration,
    /// Obsolete and ignored: every pod has its own worker (there is no pool
    /// to size any more). Still accepted so that older config files load;
    /// the agent warns when it is set.
    pub workers: Option<usize>,
    /// Concurrent pod inspections by the PLEG.
    pub inspect_concurrency: usize,
    /// The cgroup under which the kubepods hierarchy is made
    /// (`<cgroup_root>/kubepods/...`; with the systemd driver the slices
    /// named after it, or a slice itself). Default `/petrel`.
    pub cgroup_root: String,
    /// kubelet's `cgroupDriver` (`--cgroup-driver`): how QoS and pod
    /// cgroups are made, cgroupfs (the default) or systemd. As in kubelet,
    /// the runtime's own driver (CRI RuntimeConfig) wins when it answers
    /// one; this setting is for a runtime that does not.
    pub cgroup_driver: crate::qos_cgroups::CgroupDriver,
    /// Deadline of an ordinary CRI call.
    #[serde(with = "humantime_secs")]
    pub runtime_request_timeout: Duration,
    /// Initial crash-loop backoff (10 s).
    #[serde(with = "humantime_secs")]
    pub backoff_initial: Duration,
    /// Maximum crash-loop backoff (5 min).
    #[serde(with = "humantime_secs")]
    pub backoff_max: Duration,
    /// Node-pressure eviction (`[agent.eviction]`, the `--eviction-*`
    /// flags).
    pub eviction: crate::eviction::EvictionSettings,
    /// Drain on exit (`--drain-on-exit`): at shutdown, stop every pod of
    /// this node gracefully (grace periods, preStop hooks) and remove it
    /// (containers, sandboxes, volumes, logs) before exiting. Off by
    /// default: kubelet leaves containers running when it stops, and a new
    /// agent adopts them.
    pub drain_on_exit: bool,
    /// The cgroup that stands for the node (`--node-cgroup`): pods go under
    /// it instead of `cgroup_root`, and its memory and pids limits are the
    /// node's capacity for eviction. None: the whole machine.
    pub node_cgroup: Option<String>,
    /// kubelet's `podPidsLimit` (`--pod-max-pids`): the most process ids
    /// each pod's cgroup may hold (`pids.max`, written when the agent makes
    /// the pod's cgroup). -1 (the default) or 0: no limit.
    pub pod_max_pids: i64,
    /// kubelet's `seccompDefault` (`--seccomp-default`): containers and
    /// pods whose manifest sets no seccomp profile get `RuntimeDefault`
    /// instead of `Unconfined`. Off by default, as in kubelet.
    pub seccomp_default: bool,
    /// A kubeconfig (`--kubeconfig`): join that cluster as a node (register
    /// the Node, renew its Lease, run the pods bound to it, report their
    /// status). None: static pods only.
    pub kubeconfig: Option<PathBuf>,
    /// The kubelet API's port in cluster mode (`--port`, 10250): with
    /// `listen` left at its default, cluster mode serves on
    /// `0.0.0.0:<port>`.
    pub port: Option<u16>,
    /// A kubeconfig with bootstrap credentials (`--bootstrap-kubeconfig`):
    /// when `kubeconfig` has no valid client certificate, one is requested
    /// with these (TLS bootstrap) and `kubeconfig` written.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where client certificates are kept (`--cert-dir`). Default
    /// `<root>/pki`.
    pub cert_dir: Option<PathBuf>,
    /// Renew the client certificate before it expires
    /// (`--rotate-certificates`; on by default, unlike kubelet's flag).
    pub rotate_certificates: bool,
    /// The node's IP (`--node-ip`): its InternalIP, the pods' hostIP.
    /// Default: the source address of the default route.
    pub node_ip: Option<std::net::IpAddr>,
    /// Labels the node registers with (`--node-labels`, `k=v,k2=v2`).
    pub node_labels: String,
    /// Taints the node registers with (`--register-with-taints`,
    /// `key=value:Effect,...`).
    pub register_with_taints: String,
    /// The cluster's DNS servers (`--cluster-dns`, kubelet's `clusterDNS`):
    /// the nameservers of ClusterFirst pods. None: ClusterFirst pods get
    /// the host's resolver config, as kubelet's Default.
    pub cluster_dns: Vec<std::net::IpAddr>,
    /// The cluster's domain (`--cluster-domain`, kubelet's
    /// `clusterDomain`, e.g. `cluster.local`): the search paths of
    /// ClusterFirst pods, and the domain of pods with a subdomain.
    pub cluster_domain: String,
    /// The host's resolver config (`--resolv-conf`, kubelet's default
    /// `/etc/resolv.conf`), the base of Default pods. Empty: none; such
    /// pods get the local resolver only, as in kubelet.
    pub resolv_conf: PathBuf,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            runtime_endpoint: "unix:///run/petrel/petrel.sock".to_string(),
            manifests: PathBuf::from("/etc/petrel/manifests"),
            listen: SocketAddr::from(([127, 0, 0, 1], 10255)),
            socket: PathBuf::from(crate::server::socket::DEFAULT_SOCKET),
            socket_group: None,
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            root: PathBuf::from("/var/lib/petrel/agent"),
            node_name: String::new(),
            pleg: PlegMode::Auto,
            relist_period: Duration::from_secs(1),
            event_relist_period: Duration::from_secs(300),
            relist_threshold: Duration::from_secs(180),
            sync_period: Duration::from_secs(10),
            workers: None,
            inspect_concurrency: 8,
            cgroup_root: "/petrel".to_string(),
            cgroup_driver: crate::qos_cgroups::CgroupDriver::Cgroupfs,
            runtime_request_timeout: Duration::from_secs(120),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            eviction: crate::eviction::EvictionSettings::default(),
            drain_on_exit: false,
            node_cgroup: None,
            pod_max_pids: -1,
            seccomp_default: false,
            kubeconfig: None,
            port: None,
            bootstrap_kubeconfig: None,
            cert_dir: None,
            rotate_certificates: true,
            node_ip: None,
            node_labels: String::new(),
            register_with_taints: String::new(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
        }
    }
}

impl AgentConfig {
    /// The server's TLS files.
    pub fn tls_files(&self) -> crate::server::tls::TlsFiles {
        crate::server::tls::TlsFiles {
            cert: self.tls_cert_file.clone(),
            key: self.tls_private_key_file.clone(),
            client_ca: self.client_ca_file.clone(),
        }
    }

    /// Checks what cannot be checked value by value: the eviction settings
    /// together, and the node cgroup's path. Called at start-up, so a bad
    /// configuration stops the agent with the flag and value named.
    pub fn validate(&self) -> Result<(), crate::eviction::EvictionConfigError> {
        self.eviction.thresholds()?;
        if let Some(p) = &self.node_cgroup {
            let bad = !p.starts_with('/')
                || p.contains('\0')
                || p.split('/').any(|c| c == "." || c == "..")
                || p.trim_matches('/').is_empty();
            if bad {
                return Err(crate::eviction::EvictionConfigError::NodeCgroup(p.clone()));
            }
        }
        Ok(())
    }

    /// The cgroup under which `kubepods` is made: the node cgroup when
    /// given, else `cgroup_root`.
    pub fn pods_cgroup_root(&self) -> &str {
        self.node_cgroup.as_deref().unwrap_or(&self.cgroup_root)
    }

    /// Where the pods' cgroups are with `driver` (the setting, or the
    /// runtime's).
    pub fn cgroup_layout(
        &self,
        driver: crate::qos_cgroups::CgroupDriver,
    ) -> Result<crate::qos_cgroups::CgroupLayout, crate::qos_cgroups::LayoutError> {
        crate::qos_cgroups::CgroupLayout::new(driver, self.pods_cgroup_root())
    }

    /// The directory `Localhost` seccomp profiles are relative to:
    /// `<root>/seccomp`, as kubelet's `<root-dir>/seccomp`.
    pub fn seccomp_root(&self) -> std::path::PathBuf {
        self.root.join("seccomp")
    }

    /// Where the TCP server listens: `listen`, except in cluster mode with
    /// `listen` at its default, where it is kubelet's `0.0.0.0:<port>`
    /// (10250 unless `port` says otherwise), so the API server reaches it.
    pub fn effective_listen(&self) -> SocketAddr {
        if self.kubeconfig.is_some() && self.listen == Self::default().listen {
            return SocketAddr::from(([0, 0, 0, 0], self.port.unwrap_or(10250)));
        }
        self.listen
    }

    /// The pods' DNS settings from `cluster_dns`, `cluster_domain` and
    /// `resolv_conf`.
    pub fn dns_settings(&self) -> crate::convert::DnsSettings {
        crate::convert::DnsSettings {
            cluster_dns: self.cluster_dns.iter().map(ToString::to_string).collect(),
            // A trailing dot (`cluster.local.`) names the same domain.
            cluster_domain: self.cluster_domain.trim_end_matches('.').to_string(),
            resolv_conf: self.resolv_conf.clone(),
        }
    }

    /// The node name, or the host name when unset.
    pub fn effective_node_name(&self) -> String {
        if !self.node_name.is_empty() {
            return self.node_name.to_lowercase();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_lowercase())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "localhost".to_string())
    }
}

/// Durations in the file are written as seconds (floats allowed) or as
/// strings with a unit: "300ms", "10s", "5m", "1h".
mod humantime_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Secs(s) if s >= 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
            Raw::Secs(s) => Err(serde::de::Error::custom(format!("invalid duration {s}"))),
            Raw::Text(t) => super::parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// Parses "300ms", "10s", "5m", "1h" or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 10s, 5m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration {s:?}: unit must be ms, s, m or h"
            ))
        }
    };
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cluster_mode_should_serve_kubelets_port_unless_told_where() {
        let mut c = AgentConfig::default();
        assert_eq!(c.effective_listen(), c.listen);
        c.kubeconfig = Some("/k".into());
        assert_eq!(c.effective_listen().to_string(), "0.0.0.0:10250");
        c.port = Some(11250);
        assert_eq!(c.effective_listen().to_string(), "0.0.0.0:11250");
        c.listen = "10.0.0.5:9999".parse().unwrap();
        assert_eq!(c.effective_listen().to_string(), "10.0.0.5:9999");
    }

    #[test]
    fn dns_settings_should_come_from_the_file_with_kubelets_defaults() {
        let c = AgentConfig::default();
        let d = c.dns_settings();
        assert!(d.cluster_dns.is_empty() && d.cluster_domain.is_empty());
        assert_eq!(d.resolv_conf, PathBuf::from("/etc/resolv.conf"));
        let c: AgentConfig = toml::from_str(
            "cluster_dns = [\"10.96.0.10\", \"fd00::a\"]\ncluster_domain = \"cluster.local.\"\nresolv_conf = \"\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let d = c.dns_settings();
        assert_eq!(d.cluster_dns, vec!["10.96.0.10", "fd00::a"]);
        assert_eq!(d.cluster_domain, "cluster.local");
        assert_eq!(d.resolv_conf, PathBuf::new());
    }

    #[test]
    fn durations_should_parse_units_and_reject_nonsense() {
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn config_should_read_toml_with_defaults() {
        let c: AgentConfig =
            toml::from_str("relist_period = \"500ms\"\npleg = \"relist\"\nworkers = 2\n")
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.relist_period, Duration::from_millis(500));
        assert_eq!(c.pleg, PlegMode::Relist);
        assert_eq!(c.workers, Some(2));
        assert_eq!(c.sync_period, Duration::from_secs(10));
        assert_eq!(c.cgroup_driver, crate::qos_cgroups::CgroupDriver::Cgroupfs);
    }

    #[test]
    fn the_cgroup_driver_should_be_read_and_its_layout_checked() {
        use crate::qos_cgroups::CgroupDriver;
        let c: AgentConfig = toml::from_str("cgroup_driver = \"systemd\"\ncgroup_root = \"/\"\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.cgroup_driver, CgroupDriver::Systemd);
        let layout = c
            .cgroup_layout(c.cgroup_driver)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(layout.pods_cgroup(), "/kubepods.slice");
        assert!(toml::from_str::<AgentConfig>("cgroup_driver = \"sd\"\n").is_err());
        let mixed = AgentConfig {
            cgroup_root: "/a.slice/b".into(),
            ..Default::default()
        };
        let err = mixed.cgroup_layout(CgroupDriver::Systemd).map(|_| ());
        assert!(err.is_err_and(|e| e.to_string().contains("/a.slice/b")));
        assert!(mixed.cgroup_layout(CgroupDriver::Cgroupfs).is_ok());
    }
}
