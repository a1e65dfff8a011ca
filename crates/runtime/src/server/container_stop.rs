//! StopContainer: the container's stop signal, SIGKILL after the timeout
//! (`container::stop`).

use std::sync::Arc;

use petrel_cri::api;

use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StopContainer.
    pub(crate) async fn stop_container(
        self: &Arc<Self>,
        req: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse> {
        let c = self.container(&req.container_id)?;
        self.container_stop(&c, req.timeout.max(0)).await?;
        Ok(api::StopContainerResponse {})
    }
}
