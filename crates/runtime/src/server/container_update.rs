//! UpdateContainerResources: validated, shown to NRI plugins (which may
//! change it), applied live through runc, recorded.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::records::ContainerState;
use crate::service::Runtime;
use crate::state::Container;

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
        // Refused before any plugin sees it.
        petrel_oci::spec::linux_resources(&linux, &self.host)?;
        let (linux, updates) = self.nri_update(&c, &linux).await?;
        self.set_container_resources(&c, linux).await?;
        self.nri_updated(&c, updates).await;
        Ok(api::UpdateContainerResourcesResponse {})
    }

    /// Applies resources to a created or running container and records
    /// them (UpdateContainerResources, and updates NRI plugins ask for).
    pub(crate) async fn set_container_resources(
        &self,
        c: &Container,
        linux: api::LinuxContainerResources,
    ) -> Result<()> {
        let oci = petrel_oci::spec::linux_resources(&linux, &self.host)?;
        let _op = c.op.lock().await;
        let mut rec = c.record();
        match rec.state {
            ContainerState::Created | ContainerState::Running => {
                self.oci.update(&rec.id, &oci).await?;
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
        self.save_container(c, rec)?;
        Ok(())
    }
}
