//! A pod sandbox's lifecycle after its creation (`sandbox::create`): each
//! transition is one function here; a record changes through
//! `Runtime::save_sandbox` (the store first, then memory, or neither).
//! Callers need no lock: each takes the pod's `op` lock for writing.
//!
//! ```text
//!  sandbox_create        sandbox_stop           sandbox_remove
//! ────────────────▶ Ready ───────────▶ NotReady ──────────────▶ (gone)
//! ```

use std::sync::Arc;

use futures_util::future::join_all;
use petrel_cri::api;
use petrel_store::Table;

use crate::error::{Result, RuntimeError};
use crate::records::SandboxState;
use crate::service::Runtime;
use crate::state::Sandbox;

impl Runtime {
    /// Stops a pod (StopPodSandbox, and RemovePodSandbox first): its
    /// containers killed, the PID-namespace holder gone, the CNI network
    /// released (committed at once), the network namespace released, then
    /// `NotReady` committed and STOPPED published. Idempotent.
    pub(crate) async fn sandbox_stop(self: &Arc<Self>, sb: &Arc<Sandbox>) -> Result<()> {
        let _op = sb.op.write().await;
        // Containers first: they die with SIGKILL, as CRI asks of a pod stop.
        let containers: Vec<_> = sb
            .container_ids()
            .iter()
            .filter_map(|id| self.state.container(id))
            .collect();
        self.containers_kill(&containers).await?;
        let mut rec = sb.record();
        if let Some(h) = rec.pid_holder.take() {
            self.pods.kill_pid_holder(&h);
        }
        // CNI DEL before the namespace goes (also for a pod already
        // NotReady whose network a restart could not release). A failure
        // fails the stop and the pod keeps its record of the network, so
        // that the client's retry releases it (CRI: stop until it succeeds).
        if let Some(net) = &rec.network {
            self.networks.del(&rec, net).await?;
            rec.network = None;
            // Committed at once: the network is gone whatever fails next.
            self.save_sandbox(sb, rec.clone())?;
        }
        if rec.state == SandboxState::NotReady {
            return Ok(());
        }
        if let Some(netns) = rec.netns.take() {
            self.pods
                .unpin_namespace(&netns)
                .map_err(|source| RuntimeError::Namespace {
                    op: "release network namespace",
                    source,
                })?;
        }
        rec.state = SandboxState::NotReady;
        self.save_sandbox(sb, rec)?;
        self.publish(&sb.id, api::ContainerEventType::ContainerStoppedEvent, sb);
        Ok(())
    }

    /// Removes a pod (RemovePodSandbox): stopped, every container removed,
    /// everything it has on the host undone, its record deleted, DELETED
    /// published, its name freed.
    pub(crate) async fn sandbox_remove(self: &Arc<Self>, sb: &Arc<Sandbox>) -> Result<()> {
        let was_ready = sb.with(|r| r.state == crate::records::SandboxState::Ready);
        self.sandbox_stop(sb).await?;
        if was_ready {
            self.nri_pod_gone(sb, petrel_nri::api::Event::StopPodSandbox)
                .await;
        }
        let _op = sb.op.write().await;
        // The stop above killed every container, so what is left is teardown
        // (runc delete, unmounts, cgroups) that overlaps well: all at once,
        // each to its end, the first failure reported.
        let containers: Vec<_> = sb
            .container_ids()
            .iter()
            .filter_map(|id| self.state.container(id))
            .collect();
        let removals = containers.iter().map(|c| self.container_remove(c));
        join_all(removals)
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
        let rec = sb.record();
        self.sandbox_teardown(&rec).await?;
        self.store.delete(Table::Sandboxes, &rec.id)?;
        // The DELETED event carries the pod's last status.
        self.publish(&rec.id, api::ContainerEventType::ContainerDeletedEvent, sb);
        self.state.remove_sandbox(&rec.id);
        self.state.release_name(&rec.name, &rec.id);
        self.nri_pod_gone(sb, petrel_nri::api::Event::RemovePodSandbox)
            .await;
        Ok(())
    }
}
