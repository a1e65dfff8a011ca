//! RemovePodSandbox: stop, remove every container, undo the sandbox.
//! Removing a sandbox that is gone already succeeds, as CRI requires.

use std::sync::Arc;

use futures_util::future::join_all;

use petrel_cri::api;
use petrel_store::Table;

use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// RemovePodSandbox.
    pub(crate) async fn remove_pod_sandbox(
        self: &Arc<Self>,
        req: api::RemovePodSandboxRequest,
    ) -> Result<api::RemovePodSandboxResponse> {
        let _sync = self.nri_block_sync().await;
        let sb = match self.sandbox(&req.pod_sandbox_id) {
            Ok(sb) => sb,
            Err(crate::RuntimeError::NotFound { .. }) => {
                return Ok(api::RemovePodSandboxResponse {})
            }
            Err(e) => return Err(e),
        };
        let was_ready = sb.with(|r| r.state == crate::records::SandboxState::Ready);
        self.stop_sandbox(&sb).await?;
        if was_ready {
            self.nri_pod_gone(&sb, petrel_nri::api::Event::StopPodSandbox)
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
        let removals = containers.iter().map(|c| self.remove_container_inner(c));
        join_all(removals)
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
        let rec = sb.record();
        self.teardown_sandbox(&rec).await?;
        self.store.delete(Table::Sandboxes, &rec.id)?;
        // The DELETED event carries the pod's last status.
        self.publish(&rec.id, api::ContainerEventType::ContainerDeletedEvent, &sb);
        self.state.remove_sandbox(&rec.id);
        self.state.release_name(&rec.name, &rec.id);
        self.nri_pod_gone(&sb, petrel_nri::api::Event::RemovePodSandbox)
            .await;
        Ok(api::RemovePodSandboxResponse {})
    }
}
