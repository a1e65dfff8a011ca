//! StartContainer.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::records::ContainerState;
use crate::service::Runtime;
use crate::util;

impl Runtime {
    /// StartContainer.
    pub(crate) async fn start_container(
        self: &Arc<Self>,
        req: api::StartContainerRequest,
    ) -> Result<api::StartContainerResponse> {
        let _sync = self.nri_block_sync().await;
        let c = self.container(&req.container_id)?;
        // Holding the container's lock orders this start before the exit
        // handling of a container that dies at once: STARTED precedes STOPPED.
        let _op = c.op.lock().await;
        let mut rec = c.record();
        if rec.state != ContainerState::Created {
            return Err(RuntimeError::FailedPrecondition(format!(
                "container {} is {:?}, not created",
                rec.id, rec.state
            )));
        }
        let sb = self.sandbox_of(&c).ok_or_else(|| {
            RuntimeError::Invariant(format!("container {} has no sandbox", rec.id))
        })?;
        self.nri_start(&rec, &sb).await?;
        // A pidfd on the init lets the start skip `runc start` (exec FIFO).
        let init = util::pidfd_of(rec.pid, rec.init_start_time)
            .ok()
            .flatten()
            .map(|fd| (fd, rec.pid));
        self.oci.start(&rec.id, init).await?;
        rec.state = ContainerState::Running;
        rec.started_at = util::now_ns();
        self.save_container(&c, rec)?;
        self.publish(&c.id, api::ContainerEventType::ContainerStartedEvent, &sb);
        drop(_op);
        self.nri_started(&c, &sb).await;
        Ok(api::StartContainerResponse {})
    }
}
