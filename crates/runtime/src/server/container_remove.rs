//! RemoveContainer: stop by force if needed, undo everything, forget it.
//! Removing a container that is gone already succeeds, as CRI requires.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::service::Runtime;

impl Runtime {
    /// RemoveContainer.
    pub(crate) async fn remove_container(
        self: &Arc<Self>,
        req: api::RemoveContainerRequest,
    ) -> Result<api::RemoveContainerResponse> {
        let _sync = self.nri_block_sync().await;
        let c = match self.container(&req.container_id) {
            Ok(c) => c,
            Err(RuntimeError::NotFound { .. }) => return Ok(api::RemoveContainerResponse {}),
            Err(e) => return Err(e),
        };
        self.container_remove(&c).await?;
        Ok(api::RemoveContainerResponse {})
    }
}
