//! Start-up reconciliation of the store with the host.
//!
//! The store is the truth about what exists; shims, runc and the
//! directories are reconciled with it (the decision for each container is
//! [`decide::decide`]):
//! - a container no client was answered for (a record left in `Creating`,
//!   or no record at all: a bundle, writable layer, runc container or shim
//!   named by an id alone) is a create that crashed midway: once no shim is
//!   inside its create any more (bounded wait), it is removed completely
//!   ([`leftovers`]), which frees its name for the client's retry;
//! - a `Created` container without a shim (not started: a created
//!   container has no process) stays `Created`; what a StartContainer
//!   interrupted by the crash made before committing `Running` (a shim, a
//!   runc container, an exit record) is undone, the rootfs and bundle
//!   kept, so that the client's retry of the start works
//!   ([`leftovers`]); a rootfs mount a reboot took is made again by the
//!   start;
//! - a `Created` container with a shim (restored from a checkpoint, or
//!   created by an older version) whose init took its start (a
//!   StartContainer interrupted after the hand-over) is recorded
//!   `Running`, with the start time the exec FIFO tells, and the FIFO
//!   removed;
//! - a container whose shim still runs is watched again (pidfd);
//! - a container whose shim is gone exited while the runtime was down: its
//!   exit record (written by the shim) is read and committed;
//! - a `Ready` sandbox whose pinned namespaces or PID-namespace holder
//!   vanished (a reboot) is marked NotReady and its network released (CNI
//!   DEL; kept recorded when DEL fails, for StopPodSandbox to retry); an
//!   intact one stays Ready and its network is checked in the background;
//! - a container with a record and files in the trash is a removal
//!   interrupted before its deletion was committed: it is completed like
//!   an interrupted create; whatever the trash holds is removed in the
//!   background (`container::remover`);
//! - runc containers and per-object directories of ours that no record
//!   names are reported and removed. Only ids in our own directories are
//!   considered: nothing else on the host is touched.

mod decide;
mod leftovers;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use petrel_store::Table;

use crate::error::Result;
use crate::records::{ContainerRecord, ContainerState, SandboxRecord, SandboxState};
use crate::service::Runtime;
use crate::state::{Container, Sandbox};
use crate::util;
use crate::util::remove_dir;

use crate::parts::{InitSeen, PodKernel, ShimSeen};
use crate::records::ProcessRef;
use crate::util::is_id;
use decide::{decide, Action, Seen};
use leftovers::Leftovers;

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
        let mut interrupted_pods = Vec::new();
        for (key, rec) in self.store.list::<SandboxRecord>(Table::Sandboxes)? {
            let mut rec = match rec {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(sandbox.id = %key, error = %e, "sandbox record unreadable; left in the store");
                    continue;
                }
            };
            if rec.state == SandboxState::Creating {
                // Undone once every pod is known (its cgroups may be shared)
                // and its containers are gone.
                interrupted_pods.push(rec);
                continue;
            }
            if rec.state == SandboxState::Ready && !sandbox_intact(self.pods.as_ref(), &rec) {
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
            self.reserve_recovered_name(&rec.name, &rec.id);
            self.state.insert_sandbox(Arc::new(Sandbox::new(rec)));
            sandboxes += 1;
        }

        let mut containers = 0usize;
        let mut leftovers = Leftovers::new();
        let mut not_started = Vec::new();
        // What removals moved to the trash; a record of one of them is a
        // removal interrupted before its deletion was committed.
        let trashed = self.remover.trash().ids();
        for (key, rec) in self.store.list::<ContainerRecord>(Table::Containers)? {
            let rec = match rec {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(container.id = %key, error = %e, "container record unreadable; left in the store");
                    continue;
                }
            };
            if trashed.contains(&rec.id) {
                tracing::warn!(container.id = %rec.id, "container left by an interrupted removal");
                leftovers.insert(rec.id.clone(), Some(rec));
                continue;
            }
            let sb = self
                .state
                .sandbox(&rec.sandbox_id)
                .filter(|s| s.id == rec.sandbox_id);
            let Some(sb) = sb.filter(|_| rec.state != ContainerState::Creating) else {
                tracing::warn!(container.id = %rec.id, state = ?rec.state, "container left by an interrupted create or removal");
                leftovers.insert(rec.id.clone(), Some(rec));
                continue;
            };
            let c = Arc::new(Container::new(rec.clone()));
            self.reserve_recovered_name(&rec.name, &rec.id);
            self.state.insert_container(c.clone());
            sb.add_container(&rec.id);
            containers += 1;
            if rec.state == ContainerState::Created && rec.shim.is_none() {
                // Not started: nothing to watch; what a start interrupted
                // by the crash made is undone below.
                not_started.push(rec.id.clone());
            } else if matches!(rec.state, ContainerState::Created | ContainerState::Running) {
                self.readopt(&c, &rec).await;
            }
        }
        // What a create can leave without a record, found by its id alone.
        let unrecorded = ids_in(&self.layout.state.join("containers"))
            .into_iter()
            .chain(ids_in(&self.layout.root.join("containers")));
        let in_runc: HashSet<String> = match self.oci.list().await {
            Ok(list) => list.into_iter().map(|st| st.id).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list runc containers");
                HashSet::new()
            }
        };
        for id in unrecorded.chain(in_runc.iter().cloned()) {
            if self.state.container(&id).is_none() {
                leftovers.entry(id).or_insert(None);
            }
        }
        self.remove_leftovers(leftovers, not_started, &in_runc)
            .await;
        if !trashed.is_empty() {
            tracing::info!(
                count = trashed.len(),
                "removing what removals left in the trash"
            );
        }
        for id in trashed {
            self.remover.sweep(id);
        }

        for rec in interrupted_pods {
            tracing::warn!(sandbox.id = %rec.id, "undoing a RunPodSandbox interrupted by a crash");
            if let Err(e) = self.sandbox_teardown(&rec).await {
                for e in e.into_list() {
                    tracing::warn!(sandbox.id = %rec.id, error = %e, "part of an interrupted RunPodSandbox not undone");
                }
            }
            self.store.delete(Table::Sandboxes, &rec.id)?;
        }
        self.remove_orphans().await;
        tracing::info!(sandboxes, containers, "state recovered");
        Ok(())
    }

    /// Holds a recovered object's name again; two records with one name
    /// (a store edited by hand) are logged, the first keeps it.
    fn reserve_recovered_name(&self, name: &str, id: &str) {
        if let Err(e) = self.state.reserve_name(name, id) {
            tracing::warn!(id, error = %e, "recovered object's name is held by another");
        }
    }

    /// CNI CHECK of a pod that survived a restart, off the start-up path:
    /// what the plugins say is logged and kept for verbose status (the pod
    /// stays as it is; its containers tell whether they can still work).
    fn check_network_later(self: &Arc<Self>, rec: &SandboxRecord) {
        let rt = self.clone();
        let rec = rec.clone();
        tokio::spawn(async move {
            let Some(net) = rec.network.as_ref() else {
                return;
            };
            let verdict = match rt.networks.check(&rec, net).await {
                Ok(Some(())) => {
                    tracing::debug!(sandbox.id = %rec.id, "CNI CHECK passed");
                    "ok".to_string()
                }
                Ok(None) => "not supported by the network's CNI version or config".to_string(),
                Err(e) => {
                    tracing::warn!(sandbox.id = %rec.id, error = %e, "CNI CHECK failed");
                    format!("failed: {e}")
                }
            };
            if let Some(sb) = rt.state.sandbox(&rec.id) {
                sb.set_network_check(verdict);
            }
        });
    }

    /// Watches a live container's shim again, records the exit that
    /// happened while the runtime was down, or records the start that a
    /// crash interrupted after the init had taken it.
    async fn readopt(self: &Arc<Self>, c: &Arc<Container>, rec: &ContainerRecord) {
        let watch = match rec.shim.map(|s| self.shims.adopt(&s)) {
            Some(Ok(w)) => w,
            Some(Err(e)) => {
                tracing::warn!(container.id = %rec.id, error = %e, "cannot watch shim");
                None
            }
            None => None,
        };
        let init = ProcessRef {
            pid: rec.pid,
            start_time: rec.init_start_time,
        };
        let seen = Seen {
            record: Some(rec.state),
            pod_known: true,
            shim: if watch.is_some() {
                ShimSeen::Serving
            } else {
                ShimSeen::Gone
            },
            init: if rec.pid == 0 {
                InitSeen::Gone
            } else {
                self.oci
                    .init_seen(&rec.id, init, rec.state == ContainerState::Created)
            },
            fifo: self.oci.start_pending(&rec.id),
        };
        match decide(&seen) {
            Action::MarkRunning { remove_fifo } => self.record_started(c, remove_fifo),
            Action::Watch => {}
            Action::RecordExit | Action::Keep | Action::Remove | Action::WaitForShim => {
                // The shim is gone: the exit happened while we were down.
                self.record_exit(c).await;
                return;
            }
        }
        match watch {
            Some(watch) => self.watch_exit(c.clone(), watch),
            None => self.record_exit(c).await,
        }
    }

    /// Records `Running` a container whose init took its start while the
    /// runtime died in StartContainer; removes the FIFO runc still sees.
    fn record_started(&self, c: &Container, remove_fifo: bool) {
        let mut rec = c.record();
        // Read before the FIFO goes: the init's write is its start.
        let at = self
            .oci
            .started_at(&rec.id)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_nanos()).ok())
            .unwrap_or_else(util::now_ns);
        if remove_fifo {
            if let Err(e) = self.oci.clear_start(&rec.id) {
                tracing::warn!(container.id = %rec.id, error = %e, "exec fifo of a started container not removed");
            }
        }
        if rec.state == ContainerState::Created {
            tracing::warn!(container.id = %rec.id, "a StartContainer interrupted by a crash had started the container: recorded running");
            rec.state = ContainerState::Running;
            rec.started_at = at;
            if let Err(e) = self.save_container(c, rec) {
                tracing::error!(container.id = %c.id, error = %e, "start of a container not recorded");
            }
        }
    }

    /// Removes runc containers and sandbox directories that no record
    /// names, after the leftovers of interrupted creates are gone. They can
    /// only come from a crash between a teardown and the deletion of its
    /// record, or from a store restored from backup.
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
        match self.oci.list().await {
            Ok(list) => {
                for st in list.into_iter().filter(|s| !known_c.contains(&s.id)) {
                    tracing::warn!(container.id = %st.id, status = %st.status, "removing runc container unknown to the store");
                    if let Err(e) = self.oci.delete(&st.id, true).await {
                        tracing::error!(container.id = %st.id, error = %e, "orphan not removed");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list runc containers"),
        }
        for id in ids_in(&self.layout.state.join("sandboxes")) {
            if !known_s.contains(&id) {
                let dir = self.layout.sandbox_dir(&id);
                tracing::warn!(sandbox.id = %id, "removing orphan sandbox directory");
                for kind in ["net", "ipc", "uts", "user"] {
                    if let Err(e) = self.pods.unpin_namespace(&dir.join(kind)) {
                        tracing::warn!(sandbox.id = %id, error = %e, "namespace of an orphan sandbox not released");
                    }
                }
                let removed = self
                    .pods
                    .unmount_shm(&dir.join("shm"))
                    .and_then(|()| remove_dir(&dir));
                if let Err(e) = removed {
                    tracing::warn!(sandbox.id = %id, error = %e, "orphan sandbox directory not removed");
                }
                // A pod cgroup of ours is named after the sandbox id.
                let Ok(cg) = self.config.default_pod_cgroup(&id) else {
                    continue;
                };
                // Absent when the pod had a cgroup parent of its own.
                if let Err(e) = self.cgroups.remove(&cg) {
                    tracing::debug!(sandbox.id = %id, cgroup = %cg, error = %e, "cgroup of an orphan sandbox not removed");
                }
            }
        }
    }
}

/// Whether a Ready sandbox still has what it was created with: every
/// namespace pinned and its PID-namespace holder, if it has one.
fn sandbox_intact(pods: &dyn PodKernel, rec: &SandboxRecord) -> bool {
    let pins_ok = [&rec.netns, &rec.ipcns, &rec.utsns, &rec.userns]
        .into_iter()
        .flatten()
        .all(|p| pods.namespace_pinned(p));
    let holder_ok = rec.pid_holder.is_none_or(|h| pods.pid_holder_alive(&h));
    pins_ok && holder_ok
}
