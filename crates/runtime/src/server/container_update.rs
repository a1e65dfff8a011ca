//! UpdateContainerResources: validated, shown to NRI plugins (which may
//! change it), applied live through runc, recorded.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
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
        // Refused before any plugin sees it.
        petrel_oci::spec::linux_resources(&linux, &self.host)?;
        let (linux, updates) = self.nri_update(&c, &linux).await?;
        self.container_set_resources(&c, linux).await?;
        self.nri_updated(&c, updates).await;
        Ok(api::UpdateContainerResourcesResponse {})
    }
}
