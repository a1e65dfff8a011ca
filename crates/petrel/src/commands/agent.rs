//! `petrel agent`: the node agent against any CRI runtime, and the agent
//! flags `petrel node` shares.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use petrel_agent::{AgentConfig, PlegMode};

use crate::config::FileConfig;

/// Agent flags shared by `petrel agent` and `petrel node`; each overrides
/// the config file's `[agent]` section.
#[derive(Debug, Args)]
pub struct AgentFlags {
    /// Directory of pod manifests (YAML or JSON) [default: /etc/petrel/manifests].
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Address of the agent's HTTP server (/healthz, /metrics, /pods,
    /// container logs, exec, attach, port-forward) [default: 127.0.0.1:10255].
    /// A non-loopback address requires the three TLS flags.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
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
    #[arg(long)]
    pub node_name: Option<String>,
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
        self.agent.apply(&mut c);
        Ok(c)
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn main(args: AgentArgs) -> ExitCode {
    crate::observability::init(&args.log_level, args.log_json);
    let config = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("petrel agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    super::run_daemon(
        "agent",
        petrel_agent::run(config, crate::commands::runtime::shutdown_signal()),
    )
}
