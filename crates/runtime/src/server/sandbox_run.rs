//! RunPodSandbox: namespaces pinned without a pause process, shared files,
//! the pod cgroup, the CNI network. All or nothing.

use std::path::Path;
use std::sync::Arc;

use petrel_cri::api;
use petrel_store::Table;

use crate::error::{required, Result, RuntimeError};
use petrel_cni::NetworkList;

use crate::records::{NetworkRecord, SandboxRecord, SandboxState};
use crate::sandbox::files::{self, SandboxFiles};
use crate::sandbox::namespaces::{self, NamespaceRequest};
use crate::sandbox::network;
use crate::sandbox::pid_holder;
use crate::service::{Ns, Runtime};
use crate::state::Sandbox;
use crate::util;

/// The namespace mode a pod asks for (POD when unset).
pub(crate) fn namespace_mode(config: &api::PodSandboxConfig, ns: Ns) -> api::NamespaceMode {
    let opts = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    let raw = opts.map_or(0, |o| match ns {
        Ns::Network => o.network,
        Ns::Pid => o.pid,
        Ns::Ipc => o.ipc,
    });
    api::NamespaceMode::try_from(raw).unwrap_or(api::NamespaceMode::Pod)
}

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
        crate::validate::pod_sandbox(&config)?;
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
        let cgroup_parent = match config.linux.as_ref().map(|l| l.cgroup_parent.as_str()) {
            Some(p) if !p.is_empty() => p.trim_end_matches('/').to_string(),
            _ => format!(
                "{}/{id}",
                self.config.default_cgroup_parent.trim_end_matches('/')
            ),
        };
        let name = format!("{}_{}_{}_{}", md.name, md.namespace, md.uid, md.attempt);
        self.state.reserve_name(&name, &id)?;

        let mut rec = SandboxRecord {
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
            pid_holder: None,
            shm_mounted: false,
            cgroup_parent,
            created_cgroups: Vec::new(),
            created_cgroup_dirs: Vec::new(),
            network: None,
        };
        // Recorded before anything is made, so that a crash midway is undone
        // at the next start. Without an fsync: if the crash also loses this
        // intent, recovery's sweep of unnamed sandbox directories undoes the
        // namespaces and mounts; the holder process (the one thing the layout
        // cannot find) is committed durably as soon as it exists.
        if let Err(e) = self.store.put_unsynced(Table::Sandboxes, &id, &rec) {
            self.state.release_name(&name, &id);
            return Err(e.into());
        }
        let sb = Arc::new(Sandbox::new(rec.clone()));
        self.state.insert_sandbox(sb.clone());

        let made = match self
            .make_sandbox(&mut rec, &hostname, host_network, network)
            .await
        {
            // A plugin may still refuse the pod: it is undone like a failure.
            Ok(()) => self.nri_run_pod(&sb).await,
            Err(e) => Err(e),
        };
        match made {
            Ok(()) => {}
            Err(e) => {
                let mut cleanup = Vec::new();
                if let Err(undo) = self.teardown_sandbox(&rec).await {
                    cleanup.extend(undo.into_list());
                }
                if let Err(undo) = self.store.delete(Table::Sandboxes, &id) {
                    cleanup.push(undo.into());
                }
                if !cleanup.is_empty() {
                    tracing::error!(sandbox.id = %id, errors = cleanup.len(), "rollback of a failed RunPodSandbox incomplete");
                }
                self.state.remove_sandbox(&id);
                self.state.release_name(&name, &id);
                return Err(e.with_cleanup(cleanup));
            }
        }
        self.publish(&id, api::ContainerEventType::ContainerCreatedEvent, &sb);
        self.publish(&id, api::ContainerEventType::ContainerStartedEvent, &sb);
        Ok(api::RunPodSandboxResponse { pod_sandbox_id: id })
    }

    async fn make_sandbox(
        self: &Arc<Self>,
        rec: &mut SandboxRecord,
        hostname: &str,
        host_network: bool,
        network: Option<NetworkList>,
    ) -> Result<()> {
        let dir = rec.dir.clone();
        petrel_fs::create_private_dir_all(&dir, petrel_fs::PRIVATE)
            .map_err(|e| RuntimeError::dir("create pod directory", e))?;
        let f = SandboxFiles::new(&dir);
        files::write_etc_files(&f, hostname, &rec.config, host_network)?;

        let host_ipc = namespace_mode(&rec.config, Ns::Ipc) == api::NamespaceMode::Node;
        let req = NamespaceRequest {
            net: !host_network,
            ipc: !host_ipc,
            uts: (!host_network).then(|| hostname.to_string()),
        };
        // Creating a network namespace is the slowest step; it runs on its
        // own thread while the shm mount and the pod cgroup are made.
        let pin_dir = dir.clone();
        let pinning = tokio::task::spawn_blocking(move || namespaces::pin(&pin_dir, &req));
        let rest = self.make_sandbox_shm_and_cgroup(rec, &f, host_ipc);
        let pinned = pinning
            .await
            .map_err(|e| RuntimeError::task("pin pod namespaces", e))?
            .map_err(|source| RuntimeError::Namespace {
                op: "pin pod namespaces",
                source,
            });
        // Record whatever was made before reporting any failure, so that the
        // rollback undoes all of it.
        if let Ok(p) = &pinned {
            rec.netns = p.net.clone();
            rec.ipcns = p.ipc.clone();
            rec.utsns = p.uts.clone();
        }
        rest?;
        pinned?;
        if let Some(list) = network {
            self.attach_network(rec, &list, &f, hostname).await?;
        }

        if namespace_mode(&rec.config, Ns::Pid) == api::NamespaceMode::Pod {
            let holder = self.shims.spawn_pid_holder().await?;
            rec.pid_holder = Some(holder);
            // Recorded at once: the holder is the one resource that the
            // layout alone cannot find again after a crash.
            self.store.put(Table::Sandboxes, &rec.id, &*rec)?;
        }
        rec.state = SandboxState::Ready;
        let sb = self.state.sandbox(&rec.id).ok_or_else(|| {
            RuntimeError::Invariant(format!("sandbox {} vanished while created", rec.id))
        })?;
        self.save_sandbox(&sb, rec.clone())
    }

    /// CNI ADD. The intent (which network) is committed first, so that a
    /// crash during ADD is undone by a DEL at the next start.
    async fn attach_network(
        &self,
        rec: &mut SandboxRecord,
        list: &NetworkList,
        f: &SandboxFiles,
        hostname: &str,
    ) -> Result<()> {
        rec.network = Some(NetworkRecord {
            conflist: list.to_json(),
            ifname: network::POD_IFNAME.to_string(),
            result: None,
            ips: Vec::new(),
        });
        self.store.put(Table::Sandboxes, &rec.id, &*rec)?;
        let attached = self.networks.add(list, rec).await?;
        let pod_ip = attached.ips.first().and_then(|ip| ip.parse().ok());
        rec.network = Some(attached);
        files::write_hosts(&f.hosts, hostname, pod_ip)
    }

    fn make_sandbox_shm_and_cgroup(
        &self,
        rec: &mut SandboxRecord,
        f: &SandboxFiles,
        host_ipc: bool,
    ) -> Result<()> {
        if !host_ipc {
            files::mount_shm(&f.shm, self.config.shm_size)?;
            rec.shm_mounted = true;
        }
        rec.created_cgroup_dirs = self.make_pod_cgroup(&rec.cgroup_parent)?;
        Ok(())
    }

    /// Undoes everything a sandbox may have made, in reverse order, from
    /// what its record says and what its directory holds. Every step runs;
    /// the errors of those that failed are returned.
    pub(crate) async fn teardown_sandbox(&self, rec: &SandboxRecord) -> Result<()> {
        let mut errors: Vec<RuntimeError> = Vec::new();
        if let Some(h) = &rec.pid_holder {
            pid_holder::kill(h);
        }
        // CNI DEL while the namespace still exists (plugins may look in it).
        if let Some(net) = &rec.network {
            if let Err(e) = self.networks.del(rec, net).await {
                errors.push(e);
            }
        }
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                errors.push(e);
            }
        };
        let dir = &rec.dir;
        for kind in ["net", "ipc", "uts"] {
            let p = dir.join(kind);
            note(
                namespaces::unpin(&p).map_err(|source| RuntimeError::Namespace {
                    op: "release namespace",
                    source,
                }),
            );
        }
        note(files::unmount(&dir.join("shm")));
        // Only what this pod made, and not what other pods still live in
        // (the runtime's default parent among them): see `cgroup_owner`.
        note(self.release_pod_cgroups(rec));
        note(remove_dir(dir));
        RuntimeError::all(errors)
    }
}

/// Removes a directory tree the runtime owns; missing is fine. Callers
/// unmount what they mounted inside it first.
pub(crate) fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::io("remove", dir, e)),
    }
}
