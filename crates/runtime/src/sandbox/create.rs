//! A pod sandbox's creation: namespaces pinned without a pause process,
//! shared files, the shm tmpfs, the pod cgroup, the CNI network, the
//! PID-namespace holder; then `Ready` committed. All or nothing: a failure
//! (a refusing NRI plugin among them) undoes every step
//! (`sandbox::teardown`), deletes the record and frees the name.

use std::sync::Arc;

use petrel_cni::NetworkList;
use petrel_cri::api;
use petrel_store::Table;

use crate::error::{Result, RuntimeError};
use crate::records::{NetworkRecord, SandboxRecord, SandboxState};
use crate::sandbox::files::{self, SandboxFiles};
use crate::sandbox::namespaces::{self, NamespaceRequest};
use crate::sandbox::{namespace_mode, network, Ns};
use crate::service::Runtime;
use crate::state::Sandbox;

impl Runtime {
    /// Makes the sandbox `rec` describes (in state `Creating`, its name not
    /// yet reserved): on the host's network when `host_network`, else on
    /// `network` (none: loopback only). Returns once it is `Ready`, or
    /// undone.
    pub(crate) async fn sandbox_create(
        self: &Arc<Self>,
        mut rec: SandboxRecord,
        hostname: &str,
        host_network: bool,
        network: Option<NetworkList>,
    ) -> Result<Arc<Sandbox>> {
        let (id, name) = (rec.id.clone(), rec.name.clone());
        self.state.reserve_name(&name, &id)?;
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
            .make_sandbox(&mut rec, hostname, host_network, network)
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
                if let Err(undo) = self.sandbox_teardown(&rec).await {
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
        Ok(sb)
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
}
