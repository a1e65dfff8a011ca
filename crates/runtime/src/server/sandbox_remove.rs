//! RemovePodSandbox: stop, remove every container, undo the sandbox
//! (`sandbox::lifecycle`). Removing a sandbox that is gone already
//! succeeds, as CRI requires.

use std::sync::Arc;

use petrel_cri::api;

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
        self.sandbox_remove(&sb).await?;
        Ok(api::RemovePodSandboxResponse {})
    }
}
