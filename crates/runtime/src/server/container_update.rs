//! UpdateContainerResources: validated, applied live through runc, recorded.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::records::ContainerState;
use crate::service::Runtime;

impl Runtime {
    /// UpdateContainerResources.
    pub(crate) async fn update_container_resources(
        self: &Arc<Self>,
        req: api::UpdateContainerResourcesRequest,
    ) -> Result<api::UpdateContainerResourcesResponse> {
        let c = self.container(&req.container_id)?;
        let linux = req.linux.ok_or_else(|| {
            RuntimeError::invalid("linux", "missing (only Linux resources are supported)")
        })?;
        let oci = petrel_oci::spec::linux_resources(&linux, &self.host)?;
        let _op = c.op.lock().await;
        let mut rec = c.record();
        match rec.state {
            ContainerState::Created | ContainerState::Running => {
                self.runc.update(&rec.id, &oci).await?;
            }
            ContainerState::Exited => {
                return Err(RuntimeError::FailedPrecondition(format!(
                    "container {} has exited",
                    rec.id
                )));
            }
            ContainerState::Creating => {
                return Err(RuntimeError::FailedPrecondition(format!(
                    "container {} is being created",
                    rec.id
                )));
            }
        }
        rec.resources = Some(linux);
        self.save_container(&c, rec)?;
        Ok(api::UpdateContainerResourcesResponse {})
    }
}
