//! StartContainer (`container::lifecycle`).

use std::sync::Arc;

use petrel_cri::api;

use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StartContainer.
    pub(crate) async fn start_container(
        self: &Arc<Self>,
        req: api::StartContainerRequest,
    ) -> Result<api::StartContainerResponse> {
        let _sync = self.nri_block_sync().await;
        let c = self.container(&req.container_id)?;
        self.container_start(&c).await?;
        Ok(api::StartContainerResponse {})
    }
}
