//! `petrel agent`: the node agent against any CRI runtime, and the agent
//! flags `petrel node` shares.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use petrel_agent::eviction::config::{
    GracePeriod, MapSyntax, MinReclaim, Reserved, SignalMap, ThresholdSpec,
};
use petrel_agent::{AgentConfig, PlegMode};

use crate::config::FileConfig;

/// Agent flags shared by `petrel agent` and `petrel node`; each overrides
/// the config file's `[agent]` section.
#[derive(Debug, Args)]
pub struct AgentFlags {
    /// Directory of pod manifests (YAML or JSON) [default: /etc/petrel/manifests].
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Address of the agent's TCP server [default: 127.0.0.1:10255]. Plain
    /// HTTP on loopback serves /healthz and /metrics only; with the three
    /// TLS flags (required on a non-loopback address) it serves the whole
    /// API to clients with certificates.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// The unix socket serving the whole API (/pods, container logs,
    /// exec, attach, port-forward) to root and --agent-socket-group
    /// [default: /run/petrel-agent/agent.sock].
    #[arg(long)]
    pub agent_socket: Option<PathBuf>,
    /// A group (name or gid) whose members may use the agent socket too
    /// (socket root:GROUP 0660 in a root:GROUP 0750 directory).
    #[arg(long)]
    pub agent_socket_group: Option<String>,
    /// Server certificate (PEM): serve HTTPS.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of the server certificate (PEM).
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA (PEM) whose client certificates are accepted; every client must
    /// present one.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// How the agent learns about container changes [default: auto].
    #[arg(long, value_parser = parse_pleg)]
    pub pleg: Option<PlegMode>,
    /// The node's name [default: the host name].
    #[arg(long, alias = "hostname-override")]
    pub node_name: Option<String>,
    /// Join the cluster this kubeconfig names as a node: register the
    /// Node, renew its Lease, run the pods bound to it and report their
    /// status (static pods keep running beside them).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// TLS bootstrap: when --kubeconfig has no valid client certificate,
    /// request one with these credentials and write --kubeconfig.
    #[arg(long)]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the client certificates are kept [default: <root>/pki].
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,
    /// Cluster mode: the kubelet API's port on 0.0.0.0 when --listen is not
    /// given [default: 10250].
    #[arg(long)]
    pub port: Option<u16>,
    /// Renew the client certificate before it expires [default: true].
    #[arg(long)]
    pub rotate_certificates: Option<bool>,
    /// The node's IP: its InternalIP and the pods' hostIP [default: the
    /// source address of the default route].
    #[arg(long)]
    pub node_ip: Option<std::net::IpAddr>,
    /// Labels to register the node with, e.g. disk=ssd,zone=a.
    #[arg(long)]
    pub node_labels: Option<String>,
    /// Taints to register the node with, e.g. dedicated=db:NoSchedule.
    #[arg(long)]
    pub register_with_taints: Option<String>,
    /// Relist period in relist mode, e.g. 1s or 500ms [default: 1s].
    #[arg(long, value_parser = petrel_agent::config::parse_duration)]
    pub relist_period: Option<std::time::Duration>,
    /// Safety-net relist period in event mode [default: 5m].
    #[arg(long, value_parser = petrel_agent::config::parse_duration)]
    pub event_relist_period: Option<std::time::Duration>,
    /// Periodic resync of every pod [default: 10s].
    #[arg(long, value_parser = petrel_agent::config::parse_duration)]
    pub sync_period: Option<std::time::Duration>,
    /// Initial crash-loop backoff [default: 10s].
    #[arg(long, value_parser = petrel_agent::config::parse_duration)]
    pub backoff_initial: Option<std::time::Duration>,
    /// At SIGTERM or SIGINT, stop every pod of this node gracefully (grace
    /// periods, preStop hooks) and remove it before exiting; a second
    /// signal exits at once. Without it pods keep running, as kubelet's
    /// do, and the next agent adopts them.
    #[arg(long)]
    pub drain_on_exit: bool,
    /// The most process ids each pod may hold (its cgroup's pids.max), as
    /// kubelet's --pod-max-pids; -1: no limit [default: -1].
    #[arg(long, allow_negative_numbers = true)]
    pub pod_max_pids: Option<i64>,
    /// kubelet's --seccomp-default: containers whose pod sets no seccomp
    /// profile run with the runtime's default profile (RuntimeDefault)
    /// instead of unconfined. Localhost profiles are read from
    /// <root>/seccomp.
    #[arg(long)]
    pub seccomp_default: bool,
    /// kubelet's --cluster-dns: the cluster's DNS servers, comma-separated
    /// (e.g. 10.96.0.10), the nameservers of ClusterFirst pods. Without
    /// it ClusterFirst pods get the host's resolver config.
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Option<Vec<std::net::IpAddr>>,
    /// kubelet's --cluster-domain, e.g. cluster.local: the search paths of
    /// ClusterFirst pods.
    #[arg(long)]
    pub cluster_domain: Option<String>,
    /// kubelet's --resolv-conf: the resolver config pods with dnsPolicy
    /// Default get ("" for none) [default: /etc/resolv.conf].
    // A string, not a path: clap refuses an empty path, and "" is
    // kubelet's way of saying none.
    #[arg(long)]
    pub resolv_conf: Option<String>,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

/// kubelet's eviction flags, in kubelet's syntax; each overrides
/// `[agent.eviction]` of the config file.
#[derive(Debug, Args)]
pub struct EvictionFlags {
    /// Hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10%
    /// (replaces the default memory.available<100Mi,nodefs.available<10%,
    /// nodefs.inodesFree<5%,imagefs.available<15%; "" for none).
    #[arg(long, value_parser = parse_map::<ThresholdSpec>)]
    pub eviction_hard: Option<SignalMap<ThresholdSpec>>,
    /// Soft eviction thresholds, e.g. memory.available<1Gi (each needs a
    /// grace period).
    #[arg(long, value_parser = parse_map::<ThresholdSpec>)]
    pub eviction_soft: Option<SignalMap<ThresholdSpec>>,
    /// Grace period of each soft threshold, e.g. memory.available=1m30s.
    #[arg(long, value_parser = parse_map::<GracePeriod>)]
    pub eviction_soft_grace_period: Option<SignalMap<GracePeriod>>,
    /// Minimum reclaim once a threshold is met, e.g. memory.available=0Mi,nodefs.available=500Mi.
    #[arg(long, value_parser = parse_map::<MinReclaim>)]
    pub eviction_minimum_reclaim: Option<SignalMap<MinReclaim>>,
    /// How long a pressure condition stays after its threshold was last met [default: 5m0s].
    #[arg(long, value_parser = parse_go_duration)]
    pub eviction_pressure_transition_period: Option<std::time::Duration>,
    /// Longest grace period (seconds) of a pod evicted for a soft threshold;
    /// 0 or less: the pod's own [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Eviction pass period when no notification comes [default: 10s].
    #[arg(long, value_parser = parse_go_duration)]
    pub eviction_monitoring_interval: Option<std::time::Duration>,
    /// React to memory threshold notifications (cgroup v1 eventfd, v2 PSI),
    /// not only to the periodic pass [default: true].
    #[arg(long)]
    pub eviction_notifications: Option<bool>,
    /// Resources reserved for Kubernetes daemons, e.g. cpu=100m,memory=256Mi,pid=1000.
    #[arg(long, value_parser = parse_reserved)]
    pub kube_reserved: Option<Reserved>,
    /// Resources reserved for the system, e.g. memory=512Mi.
    #[arg(long, value_parser = parse_reserved)]
    pub system_reserved: Option<Reserved>,
    /// The cgroup that stands for the node: pods are placed under it and
    /// its memory and pids limits are the node's capacity [default: the
    /// whole machine].
    #[arg(long)]
    pub node_cgroup: Option<String>,
}

fn parse_map<T: MapSyntax>(s: &str) -> Result<SignalMap<T>, String> {
    s.parse()
}

fn parse_reserved(s: &str) -> Result<Reserved, String> {
    s.parse()
}

fn parse_go_duration(s: &str) -> Result<std::time::Duration, String> {
    petrel_agent::eviction::config::parse_go_duration(s)
}

impl EvictionFlags {
    /// Applies the flags given over `c`.
    pub fn apply(&self, c: &mut AgentConfig) {
        let e = &mut c.eviction;
        if let Some(v) = &self.eviction_hard {
            e.hard = v.clone();
        }
        if let Some(v) = &self.eviction_soft {
            e.soft = v.clone();
        }
        if let Some(v) = &self.eviction_soft_grace_period {
            e.soft_grace_period = v.clone();
        }
        if let Some(v) = &self.eviction_minimum_reclaim {
            e.minimum_reclaim = v.clone();
        }
        if let Some(v) = self.eviction_pressure_transition_period {
            e.pressure_transition_period = v;
        }
        if let Some(v) = self.eviction_max_pod_grace_period {
            e.max_pod_grace_period = v;
        }
        if let Some(v) = self.eviction_monitoring_interval {
            e.monitoring_interval = v;
        }
        if let Some(v) = self.eviction_notifications {
            e.notifications = v;
        }
        if let Some(v) = self.kube_reserved {
            e.kube_reserved = v;
        }
        if let Some(v) = self.system_reserved {
            e.system_reserved = v;
        }
        if let Some(v) = &self.node_cgroup {
            c.node_cgroup = Some(v.clone());
        }
    }
}

fn parse_pleg(s: &str) -> Result<PlegMode, String> {
    s.parse()
}

impl AgentFlags {
    /// Applies the flags given over `c`.
    pub fn apply(&self, c: &mut AgentConfig) {
        if let Some(v) = &self.manifests {
            c.manifests = v.clone();
        }
        if let Some(v) = self.listen {
            c.listen = v;
        }
        if let Some(v) = &self.agent_socket {
            c.socket = v.clone();
        }
        if let Some(v) = &self.agent_socket_group {
            c.socket_group = Some(v.clone());
        }
        if let Some(v) = &self.tls_cert_file {
            c.tls_cert_file = Some(v.clone());
        }
        if let Some(v) = &self.tls_private_key_file {
            c.tls_private_key_file = Some(v.clone());
        }
        if let Some(v) = &self.client_ca_file {
            c.client_ca_file = Some(v.clone());
        }
        if let Some(v) = self.pleg {
            c.pleg = v;
        }
        if let Some(v) = &self.node_name {
            c.node_name = v.clone();
        }
        if let Some(v) = &self.kubeconfig {
            c.kubeconfig = Some(v.clone());
        }
        if let Some(v) = &self.bootstrap_kubeconfig {
            c.bootstrap_kubeconfig = Some(v.clone());
        }
        if let Some(v) = &self.cert_dir {
            c.cert_dir = Some(v.clone());
        }
        if let Some(v) = self.port {
            c.port = Some(v);
        }
        if let Some(v) = self.rotate_certificates {
            c.rotate_certificates = v;
        }
        if let Some(v) = self.node_ip {
            c.node_ip = Some(v);
        }
        if let Some(v) = &self.node_labels {
            c.node_labels = v.clone();
        }
        if let Some(v) = &self.register_with_taints {
            c.register_with_taints = v.clone();
        }
        if let Some(v) = self.relist_period {
            c.relist_period = v;
        }
        if let Some(v) = self.event_relist_period {
            c.event_relist_period = v;
        }
        if let Some(v) = self.sync_period {
            c.sync_period = v;
        }
        if let Some(v) = self.backoff_initial {
            c.backoff_initial = v;
        }
        if self.drain_on_exit {
            c.drain_on_exit = true;
        }
        if let Some(v) = self.pod_max_pids {
            c.pod_max_pids = v;
        }
        if self.seccomp_default {
            c.seccomp_default = true;
        }
        if let Some(v) = &self.cluster_dns {
            c.cluster_dns = v.clone();
        }
        if let Some(v) = &self.cluster_domain {
            c.cluster_domain = v.clone();
        }
        if let Some(v) = &self.resolv_conf {
            c.resolv_conf = PathBuf::from(v);
        }
        self.eviction.apply(c);
    }
}

/// Flags of `petrel agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Configuration file (TOML, section [agent]).
    #[arg(long, env = "PETREL_CONFIG")]
    pub config: Option<PathBuf>,
    /// The CRI runtime's endpoint [default: unix:///run/petrel/petrel.sock].
    #[arg(long)]
    pub runtime_endpoint: Option<String>,
    /// The agent's state directory [default: /var/lib/petrel/agent].
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Cgroup under which kubepods/ is made [default: /petrel].
    #[arg(long)]
    pub cgroup_root: Option<String>,
    /// How QoS and pod cgroups are made, as kubelet's --cgroup-driver:
    /// cgroupfs (directories) or systemd (slices through systemd's D-Bus
    /// API). The runtime's own driver (CRI RuntimeConfig) wins when it
    /// names one; under `petrel node` the runtime's --cgroup-driver is
    /// the agent's too [default: cgroupfs].
    #[arg(long)]
    pub cgroup_driver: Option<petrel_agent::qos_cgroups::CgroupDriver>,
    #[command(flatten)]
    pub agent: AgentFlags,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
}

impl AgentArgs {
    /// The effective configuration: defaults < file < flags.
    pub fn resolve(&self) -> anyhow::Result<AgentConfig> {
        let mut c = match &self.config {
            Some(p) => FileConfig::load(p)?.agent,
            None => AgentConfig::default(),
        };
        if let Some(v) = &self.runtime_endpoint {
            c.runtime_endpoint = v.clone();
        }
        if let Some(v) = &self.root {
            c.root = v.clone();
        }
        if let Some(v) = &self.cgroup_root {
            c.cgroup_root = v.clone();
        }
        if let Some(v) = self.cgroup_driver {
            c.cgroup_driver = v;
        }
        self.agent.apply(&mut c);
        c.validate()?;
        Ok(c)
    }
}

/// Runs the agent until SIGTERM or SIGINT (with `--drain-on-exit`, until
/// its pods are gone too, or a second signal).
pub fn main(args: AgentArgs) -> ExitCode {
    crate::observability::init(&args.log_level, args.log_json);
    let config = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("petrel agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    super::run_daemon("agent", async move {
        let signals = super::StopSignals::install();
        tokio::select! {
            r = petrel_agent::run(config, signals.nth(1)) => r,
            () = signals.nth(2) => {
                tracing::warn!("second signal: exiting at once; pods are left as they are");
                Ok(())
            }
        }
    })
}
