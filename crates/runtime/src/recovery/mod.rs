//! Start-up reconciliation of the store with the host.
//!
//! The store is the truth about what exists; shims, runc and the
//! directories are reconciled with it:
//! - a record left in `Creating` is a create that crashed midway: undone;
//! - a container whose shim still runs is watched again (pidfd);
//! - a container whose shim is gone exited while the runtime was down: its
//!   exit record (written by the shim) is read and committed;
//! - a sandbox whose namespaces vanished (a reboot) is marked NotReady;
//! - runc containers and per-object directories of ours that no record
//!   names are reported and removed. Only ids in our own directories are
//!   considered: nothing else on the host is touched.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use petrel_store::Table;

use crate::error::Result;
use crate::records::{ContainerRecord, ContainerState, SandboxRecord, SandboxState};
use crate::sandbox::namespaces;
use crate::server::sandbox_run::remove_dir;
use crate::service::Runtime;
use crate::state::{Container, Sandbox};
use crate::util;

fn is_id(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

fn ids_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| is_id(n))
                .collect()
        })
        .unwrap_or_default()
}

impl Runtime {
    /// Reconciles the store with the host. Runs before serving.
    pub(crate) async fn recover(self: &Arc<Self>) -> Result<()> {
        let mut sandboxes = 0usize;
        for (key, rec) in self.store.list::<SandboxRecord>(Table::Sandboxes)? {
            let mut rec = match rec {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(sandbox.id = %key, error = %e, "sandbox record unreadable; left in the store");
                    continue;
                }
            };
            if rec.state == SandboxState::Creating {
                tracing::warn!(sandbox.id = %rec.id, "undoing a RunPodSandbox interrupted by a crash");
                let _ = self.teardown_sandbox(&rec).await;
                self.store.delete(Table::Sandboxes, &rec.id)?;
                continue;
            }
            if rec.state == SandboxState::Ready && !sandbox_intact(&rec) {
                tracing::warn!(sandbox.id = %rec.id, "pod namespaces are gone (reboot?); sandbox is NotReady");
                rec.state = SandboxState::NotReady;
                // Address leases outlive a reboot (host-local keeps them on
                // disk): the network is released now, without a namespace.
                if let Some(net) = rec.network.clone() {
                    match self.networks.del(&rec, &net).await {
                        Ok(()) => rec.network = None,
                        Err(e) => {
                            tracing::warn!(sandbox.id = %rec.id, error = %e, "CNI DEL of a vanished pod failed; StopPodSandbox retries it")
                        }
                    }
                }
                self.store.put(Table::Sandboxes, &rec.id, &rec)?;
            } else if rec.state == SandboxState::Ready && rec.network.is_some() {
                self.check_network_later(&rec);
            }
            let _ = self.state.reserve_name(&rec.name, &rec.id);
            self.state.insert_sandbox(Arc::new(Sandbox::new(rec)));
            sandboxes += 1;
        }

        let mut containers = 0usize;
        for (key, rec) in self.store.list::<ContainerRecord>(Table::Containers)? {
            let rec = match rec {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(container.id = %key, error = %e, "container record unreadable; left in the store");
                    continue;
                }
            };
            let sb = self
                .state
                .sandbox(&rec.sandbox_id)
                .filter(|s| s.id == rec.sandbox_id);
            if rec.state == ContainerState::Creating || sb.is_none() {
                tracing::warn!(container.id = %rec.id, "undoing a container left by an interrupted create or removal");
                let _ = self.teardown_container(&rec, false, None).await;
                self.store.delete(Table::Containers, &rec.id)?;
                continue;
            }
            let c = Arc::new(Container::new(rec.clone()));
            let _ = self.state.reserve_name(&rec.name, &rec.id);
            self.state.insert_container(c.clone());
            if let Some(sb) = sb {
                sb.add_container(&rec.id);
            }
            containers += 1;
            if matches!(rec.state, ContainerState::Created | ContainerState::Running) {
                self.readopt(&c, &rec).await;
            }
        }

        self.remove_orphans().await;
        tracing::info!(sandboxes, containers, "state recovered");
        Ok(())
    }

    /// CNI CHECK of a pod that survived a restart, off the start-up path:
    /// what the plugins say is logged (the pod stays as it is; its
    /// containers tell whether they can still work).
    fn check_network_later(self: &Arc<Self>, rec: &SandboxRecord) {
        let rt = self.clone();
        let rec = rec.clone();
        tokio::spawn(async move {
            let Some(net) = rec.network.as_ref() else {
                return;
            };
            match rt.networks.check(&rec, net).await {
                Ok(Some(())) => tracing::debug!(sandbox.id = %rec.id, "CNI CHECK passed"),
                Ok(None) => {}
                Err(e) => tracing::warn!(sandbox.id = %rec.id, error = %e, "CNI CHECK failed"),
            }
        });
    }

    /// Watches a live container's shim again, or records the exit that
    /// happened while the runtime was down.
    async fn readopt(self: &Arc<Self>, c: &Arc<Container>, rec: &ContainerRecord) {
        if let Some(shim) = rec
            .shim
            .filter(|s| util::process_alive(s.pid, s.start_time))
        {
            match util::pidfd_open(shim.pid) {
                Ok(pidfd) => {
                    self.watch_exit(c.clone(), pidfd);
                    return;
                }
                Err(e) => tracing::warn!(container.id = %rec.id, error = %e, "cannot watch shim"),
            }
        }
        // The shim is gone: the exit happened while we were down.
        self.handle_exit(c).await;
    }

    /// Removes runc containers and per-object directories that no record
    /// names. They can only come from a crash between a teardown and the
    /// deletion of its record, or from a store restored from backup.
    async fn remove_orphans(&self) {
        let known_c: HashSet<String> = self
            .state
            .containers()
            .iter()
            .map(|c| c.id.clone())
            .collect();
        let known_s: HashSet<String> = self
            .state
            .sandboxes()
            .iter()
            .map(|s| s.id.clone())
            .collect();
        match self.runc.list().await {
            Ok(list) => {
                for st in list.into_iter().filter(|s| !known_c.contains(&s.id)) {
                    tracing::warn!(container.id = %st.id, status = %st.status, "removing runc container unknown to the store");
                    if let Err(e) = self.runc.delete(&st.id, true).await {
                        tracing::error!(container.id = %st.id, error = %e, "orphan not removed");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list runc containers"),
        }
        for id in ids_in(&self.layout.state.join("containers")) {
            if !known_c.contains(&id) {
                let bundle = self.layout.bundle(&id);
                tracing::warn!(container.id = %id, "removing orphan bundle");
                let _ = crate::container::rootfs::unmount(&bundle.join("rootfs"));
                let _ = remove_dir(&bundle);
            }
        }
        for id in ids_in(&self.layout.root.join("containers")) {
            if !known_c.contains(&id) {
                tracing::warn!(container.id = %id, "removing orphan writable layer");
                let _ = remove_dir(&self.layout.container_layer(&id));
            }
        }
        for id in ids_in(&self.layout.state.join("sandboxes")) {
            if !known_s.contains(&id) {
                let dir = self.layout.sandbox_dir(&id);
                tracing::warn!(sandbox.id = %id, "removing orphan sandbox directory");
                for kind in ["net", "ipc", "uts"] {
                    let _ = namespaces::unpin(&dir.join(kind));
                }
                let _ = crate::sandbox::files::unmount(&dir.join("shm"));
                let _ = remove_dir(&dir);
                // A pod cgroup of ours is named after the sandbox id.
                let cg = format!(
                    "{}/{id}",
                    self.config.default_cgroup_parent.trim_end_matches('/')
                );
                let _ = self.cgroups.remove(&cg);
            }
        }
    }
}

/// Whether a Ready sandbox still has what it was created with.
fn sandbox_intact(rec: &SandboxRecord) -> bool {
    let pins_ok = [&rec.netns, &rec.ipcns, &rec.utsns]
        .into_iter()
        .flatten()
        .all(|p| p.exists());
    let holder_ok = rec
        .pid_holder
        .is_none_or(|h| util::process_alive(h.pid, h.start_time));
    pins_ok && holder_ok
}
