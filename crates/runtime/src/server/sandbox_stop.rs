//! StopPodSandbox: every container killed, the pod's network released
//! (`sandbox::lifecycle`). Idempotent.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StopPodSandbox.
    pub(crate) async fn stop_pod_sandbox(
        self: &Arc<Self>,
        req: api::StopPodSandboxRequest,
    ) -> Result<api::StopPodSandboxResponse> {
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        self.sandbox_stop(&sb).await?;
        self.nri_pod_gone(&sb, petrel_nri::api::Event::StopPodSandbox)
            .await;
        Ok(api::StopPodSandboxResponse {})
    }
}
