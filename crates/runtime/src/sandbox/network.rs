//! Pod networks through CNI: which network a pod joins, ADD when it is
//! made, DEL when it is stopped or removed (also after a restart, and when
//! its namespace is gone), CHECK on demand. The runtime reaches it through
//! [`PodNetworking`], the seam unit tests replace.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use petrel_cni::{Attachment, DnsCapability, NetworkList, PluginRunner, PortMapping};
use petrel_cri::api;

use crate::config::{PodNetworkMode, RuntimeConfig};
use crate::error::{Result, RuntimeError};
use crate::parts::PodNetworking;
use crate::records::{NetworkRecord, SandboxRecord};

/// The interface a pod's network appears as inside it.
pub const POD_IFNAME: &str = "eth0";

/// Whether pods can be networked now, as Status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// NetworkReady.
    pub ready: bool,
    /// Why not (`NetworkPluginNotReady`), empty when ready.
    pub reason: String,
    /// Details for people.
    pub message: String,
}

/// Pod networking through the CNI plugins and the network configuration
/// of `[cri.cni]` (or loopback only, as `pod_network` says).
#[derive(Debug)]
pub struct CniNetworks {
    mode: PodNetworkMode,
    conf_dir: PathBuf,
    bin_dirs: Vec<PathBuf>,
    runner: PluginRunner,
}

impl CniNetworks {
    /// From the runtime's configuration.
    pub fn new(config: &RuntimeConfig) -> Self {
        Self {
            mode: config.pod_network,
            conf_dir: config.cni.conf_dir.clone(),
            bin_dirs: config.cni.bin_dirs.clone(),
            runner: PluginRunner::new(
                config.cni.bin_dirs.clone(),
                Duration::from_secs(config.cni.plugin_timeout_secs.max(1)),
            ),
        }
    }

    fn usable_list(&self) -> std::result::Result<NetworkList, String> {
        let list = petrel_cni::load_dir(&self.conf_dir)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "no network config found in {} (.conf, .conflist or .json)",
                    self.conf_dir.display()
                )
            })?;
        for ty in list.plugin_types() {
            if !self.bin_dirs.iter().any(|d| d.join(ty).is_file()) {
                return Err(format!(
                    "{}: plugin {ty:?} not found in {}",
                    list.source.display(),
                    self.bin_dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(":")
                ));
            }
        }
        Ok(list)
    }
}

#[async_trait::async_trait]
impl PodNetworking for CniNetworks {
    /// The network new pods join: `Ok(None)` in loopback mode; an error
    /// (FAILED_PRECONDITION) when CNI is used but not usable. Read afresh
    /// each time, so that a configuration installed after start-up (as a
    /// network add-on does) is picked up without a restart.
    fn current(&self) -> Result<Option<NetworkList>> {
        match self.mode {
            PodNetworkMode::Loopback => Ok(None),
            PodNetworkMode::Cni => self.usable_list().map(Some).map_err(|msg| {
                RuntimeError::FailedPrecondition(format!("pod network is not ready: {msg}"))
            }),
        }
    }

    /// NetworkReady as Status reports it.
    fn readiness(&self) -> Readiness {
        match self.mode {
            PodNetworkMode::Loopback => Readiness {
                ready: true,
                reason: String::new(),
                message: "pod_network = loopback: pods get a private network namespace with loopback only".into(),
            },
            PodNetworkMode::Cni => match self.usable_list() {
                Ok(list) => Readiness {
                    ready: true,
                    reason: String::new(),
                    message: format!("CNI network {:?} from {}", list.name, list.source.display()),
                },
                Err(msg) => Readiness {
                    ready: false,
                    reason: "NetworkPluginNotReady".into(),
                    message: format!("cni config uninitialized: {msg}"),
                },
            },
        }
    }

    /// ADD: attaches the pod in `rec` (whose namespace is pinned) to `list`.
    async fn add(&self, list: &NetworkList, rec: &SandboxRecord) -> Result<NetworkRecord> {
        let att = attachment(rec, rec.netns.as_deref(), POD_IFNAME)?;
        let result = list.add(&self.runner, &att).await?;
        Ok(NetworkRecord {
            conflist: list.to_json(),
            ifname: POD_IFNAME.to_string(),
            ips: result
                .pod_ips(POD_IFNAME)
                .iter()
                .map(ToString::to_string)
                .collect(),
            result: Some(result.raw),
        })
    }

    /// DEL: releases the pod's network as recorded in `net`. The namespace
    /// may be gone; DEL still runs so that addresses, host-side interfaces
    /// and rules are released.
    async fn del(&self, rec: &SandboxRecord, net: &NetworkRecord) -> Result<()> {
        let list = stored_list(net)?;
        let att = attachment(rec, rec.netns.as_deref(), &net.ifname)?;
        list.del(&self.runner, &att, net.result.as_ref())
            .await
            .map_err(RuntimeError::from)
    }

    /// CHECK: whether the pod's network is still as ADD made it.
    /// `Ok(None)` when the network's CNI version or configuration has no
    /// CHECK.
    async fn check(&self, rec: &SandboxRecord, net: &NetworkRecord) -> Result<Option<()>> {
        let Some(prev) = net.result.as_ref() else {
            return Ok(None);
        };
        let list = stored_list(net)?;
        let att = attachment(rec, rec.netns.as_deref(), &net.ifname)?;
        match list.check(&self.runner, &att, prev).await {
            Ok(true) => Ok(Some(())),
            Ok(false) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

fn stored_list(net: &NetworkRecord) -> Result<NetworkList> {
    NetworkList::parse(Path::new("<stored with the pod>"), net.conflist.as_bytes())
        .map_err(RuntimeError::from)
}

/// The port mappings of a pod config, validated. Mappings without a host
/// port are not mappings (they only document the container port), as
/// with containerd.
pub fn port_mappings(config: &api::PodSandboxConfig) -> Result<Vec<PortMapping>> {
    let mut out = Vec::new();
    for (i, pm) in config.port_mappings.iter().enumerate() {
        let field = |f: &str| format!("config.port_mappings[{i}].{f}");
        let container_port = u16::try_from(pm.container_port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                RuntimeError::invalid(
                    field("container_port"),
                    format!("{} is not a port (1-65535)", pm.container_port),
                )
            })?;
        let host_port = u16::try_from(pm.host_port).map_err(|_| {
            RuntimeError::invalid(
                field("host_port"),
                format!("{} is not a port (0-65535)", pm.host_port),
            )
        })?;
        if !pm.host_ip.is_empty() && pm.host_ip.parse::<IpAddr>().is_err() {
            return Err(RuntimeError::invalid(
                field("host_ip"),
                format!("{:?} is not an IP address", pm.host_ip),
            ));
        }
        let protocol = match api::Protocol::try_from(pm.protocol) {
            Ok(api::Protocol::Tcp) => "tcp",
            Ok(api::Protocol::Udp) => "udp",
            Ok(api::Protocol::Sctp) => "sctp",
            Err(_) => {
                return Err(RuntimeError::invalid(
                    field("protocol"),
                    format!("{} is not a protocol", pm.protocol),
                ))
            }
        };
        if host_port == 0 {
            continue;
        }
        out.push(PortMapping {
            host_port,
            container_port,
            protocol: protocol.to_string(),
            host_ip: pm.host_ip.clone(),
        });
    }
    Ok(out)
}

/// What the plugins are told about a pod: its id, namespace, interface,
/// Kubernetes identity (`CNI_ARGS`, as kubelet's runtimes pass it) and
/// the capabilities: port mappings and DNS.
fn attachment(rec: &SandboxRecord, netns: Option<&Path>, ifname: &str) -> Result<Attachment> {
    let md = rec.config.metadata.clone().unwrap_or_default();
    let dns = rec.config.dns_config.as_ref().map(|d| DnsCapability {
        servers: d.servers.clone(),
        searches: d.searches.clone(),
        options: d.options.clone(),
    });
    Ok(Attachment {
        container_id: rec.id.clone(),
        netns: netns.map(Path::to_path_buf),
        ifname: ifname.to_string(),
        args: vec![
            ("K8S_POD_NAMESPACE".into(), md.namespace),
            ("K8S_POD_NAME".into(), md.name),
            ("K8S_POD_INFRA_CONTAINER_ID".into(), rec.id.clone()),
            ("K8S_POD_UID".into(), md.uid),
        ],
        port_mappings: port_mappings(&rec.config)?,
        dns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pm(container_port: i32, host_port: i32, protocol: i32, host_ip: &str) -> api::PortMapping {
        api::PortMapping {
            protocol,
            container_port,
            host_port,
            host_ip: host_ip.into(),
        }
    }

    #[test]
    fn port_mappings_should_validate_and_skip_unmapped_ports() {
        let config = api::PodSandboxConfig {
            port_mappings: vec![
                pm(80, 8080, 0, ""),
                pm(53, 0, 1, ""),
                pm(53, 5353, 1, "127.0.0.1"),
            ],
            ..Default::default()
        };
        let got = port_mappings(&config).unwrap_or_default();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (
                got[0].host_port,
                got[0].container_port,
                got[0].protocol.as_str()
            ),
            (8080, 80, "tcp")
        );
        assert_eq!(
            (got[1].protocol.as_str(), got[1].host_ip.as_str()),
            ("udp", "127.0.0.1")
        );
        for (bad, field) in [
            (pm(0, 1, 0, ""), "container_port"),
            (pm(70000, 1, 0, ""), "container_port"),
            (pm(80, -1, 0, ""), "host_port"),
            (pm(80, 8080, 9, ""), "protocol"),
            (pm(80, 8080, 0, "not-an-ip"), "host_ip"),
        ] {
            let config = api::PodSandboxConfig {
                port_mappings: vec![pm(1, 0, 0, ""), bad],
                ..Default::default()
            };
            let err = port_mappings(&config)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains(&format!("config.port_mappings[1].{field}")),
                "{err}"
            );
        }
    }

    #[test]
    fn readiness_should_say_why_cni_is_not_usable() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let bin = tempfile::tempdir()?;
        let mut config = RuntimeConfig::default();
        config.cni.conf_dir = dir.path().join("net.d");
        config.cni.bin_dirs = vec![bin.path().to_path_buf()];
        let nets = CniNetworks::new(&config);
        let r = nets.readiness();
        assert!(!r.ready);
        assert_eq!(r.reason, "NetworkPluginNotReady");
        assert!(
            r.message.contains("no network config found"),
            "{}",
            r.message
        );
        assert!(matches!(
            nets.current(),
            Err(RuntimeError::FailedPrecondition(_))
        ));

        std::fs::create_dir(&config.cni.conf_dir)?;
        std::fs::write(
            config.cni.conf_dir.join("10-x.conflist"),
            r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"bridge"}]}"#,
        )?;
        let r = nets.readiness();
        assert!(!r.ready);
        assert!(
            r.message.contains("plugin \"bridge\" not found"),
            "{}",
            r.message
        );

        std::fs::write(bin.path().join("bridge"), "")?;
        let r = nets.readiness();
        assert!(r.ready, "{r:?}");
        assert!(nets.current().is_ok_and(|l| l.is_some()));

        std::fs::write(config.cni.conf_dir.join("05-broken.conf"), "{")?;
        let r = nets.readiness();
        assert!(!r.ready);
        assert!(r.message.contains("05-broken.conf"), "{}", r.message);

        config.pod_network = PodNetworkMode::Loopback;
        let nets = CniNetworks::new(&config);
        assert!(nets.readiness().ready);
        assert!(nets.current().is_ok_and(|l| l.is_none()));
        Ok(())
    }
}
