//! StopPodSandbox: kill every container, the pid holder, release the CNI
//! network and the network namespace. Idempotent.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::records::SandboxState;
use crate::sandbox::{namespaces, pid_holder};
use crate::service::Runtime;
use crate::state::Sandbox;

impl Runtime {
    /// StopPodSandbox.
    pub(crate) async fn stop_pod_sandbox(
        self: &Arc<Self>,
        req: api::StopPodSandboxRequest,
    ) -> Result<api::StopPodSandboxResponse> {
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        self.stop_sandbox(&sb).await?;
        self.nri_pod_gone(&sb, petrel_nri::api::Event::StopPodSandbox)
            .await;
        Ok(api::StopPodSandboxResponse {})
    }

    pub(crate) async fn stop_sandbox(self: &Arc<Self>, sb: &Arc<Sandbox>) -> Result<()> {
        let _op = sb.op.write().await;
        // Containers first: they die with SIGKILL, as CRI asks of a pod stop.
        let containers: Vec<_> = sb
            .container_ids()
            .iter()
            .filter_map(|id| self.state.container(id))
            .collect();
        self.kill_containers(&containers).await?;
        let mut rec = sb.record();
        if let Some(h) = rec.pid_holder.take() {
            pid_holder::kill(&h);
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
            namespaces::unpin(&netns).map_err(|source| RuntimeError::Namespace {
                op: "release network namespace",
                source,
            })?;
        }
        rec.state = SandboxState::NotReady;
        self.save_sandbox(sb, rec)?;
        self.publish(&sb.id, api::ContainerEventType::ContainerStoppedEvent, sb);
        Ok(())
    }
}
