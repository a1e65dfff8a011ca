//! RunPodSandbox: the request checked and turned into a sandbox record,
//! then made by `sandbox::create` (all or nothing).

use std::sync::Arc;

use petrel_cri::api;

use petrel_oci::cgroups::systemd::pod_cgroup;

use crate::error::{required, Result, RuntimeError};
use crate::records::{SandboxRecord, SandboxState};
use crate::sandbox::{files, namespace_mode, network, Ns};
use crate::service::Runtime;
use crate::util;

fn validate_hostname(h: &str) -> Result<()> {
    let ok = !h.is_empty()
        && h.len() <= 64
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !h.starts_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::invalid(
            "config.hostname",
            format!("{h:?} is not a valid hostname"),
        ))
    }
}

fn host_hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

impl Runtime {
    /// RunPodSandbox.
    pub(crate) async fn run_pod_sandbox(
        self: &Arc<Self>,
        req: api::RunPodSandboxRequest,
    ) -> Result<api::RunPodSandboxResponse> {
        let _sync = self.nri_block_sync().await;
        let config = required(req.config, "config")?;
        // Before anything is made, and before anything is named from them.
        crate::validate::pod_sandbox(&config, self.config.cgroup_driver)?;
        // Never a pod in the host's user namespace when it asked for its own.
        crate::validate::userns::pod(&config, &self.host)?;
        let md = required(config.metadata.as_ref(), "config.metadata")?;
        if !req.runtime_handler.is_empty()
            && !self.config.runtime_handlers.contains(&req.runtime_handler)
        {
            return Err(RuntimeError::invalid(
                "runtime_handler",
                format!(
                    "unknown handler {:?} (configured: {:?})",
                    req.runtime_handler, self.config.runtime_handlers
                ),
            ));
        }
        let host_network = namespace_mode(&config, Ns::Network) == api::NamespaceMode::Node;
        let hostname = if config.hostname.is_empty() || host_network {
            host_hostname()
        } else {
            validate_hostname(&config.hostname)?;
            config.hostname.clone()
        };
        if let Some(dns) = &config.dns_config {
            files::validate_dns(dns)?;
        }
        // The network is resolved before anything is made: a pod that cannot
        // be networked is refused without debris.
        let network = if host_network {
            None
        } else {
            network::port_mappings(&config)?;
            self.networks.current()?
        };
        let id = util::new_id().map_err(RuntimeError::Id)?;
        // Kept as the path from the hierarchy's root whatever the driver
        // (a slice expanded): stats, metrics and OOM checks read it.
        let given = config
            .linux
            .as_ref()
            .map_or("", |l| l.cgroup_parent.as_str());
        let cgroup_parent = match pod_cgroup(self.config.cgroup_driver, given) {
            Ok(Some(p)) => p,
            Ok(None) => self
                .config
                .default_pod_cgroup(&id)
                .map_err(|e| RuntimeError::invalid("config.linux.cgroup_parent", e.to_string()))?,
            Err(e) => {
                return Err(RuntimeError::invalid(
                    "config.linux.cgroup_parent",
                    e.to_string(),
                ))
            }
        };
        let name = format!("{}_{}_{}_{}", md.name, md.namespace, md.uid, md.attempt);

        let rec = SandboxRecord {
            id: id.clone(),
            name: name.clone(),
            config,
            runtime_handler: req.runtime_handler,
            state: SandboxState::Creating,
            created_at: util::now_ns(),
            dir: self.layout.sandbox_dir(&id),
            netns: None,
            ipcns: None,
            utsns: None,
            userns: None,
            pid_holder: None,
            shm_mounted: false,
            cgroup_parent,
            created_cgroups: Vec::new(),
            created_cgroup_dirs: Vec::new(),
            network: None,
            released_ips: Vec::new(),
        };
        self.sandbox_create(rec, &hostname, host_network, network)
            .await?;
        Ok(api::RunPodSandboxResponse { pod_sandbox_id: id })
    }
}
