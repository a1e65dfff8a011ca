//! StopPodSandbox: every container killed, the pod's network released
//! (`sandbox::lifecycle`). Idempotent: stopping a stopped pod, or one that
//! is gone, succeeds and does nothing (plugins hear of the stop once).

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::service::Runtime;

impl Runtime {
    /// StopPodSandbox.
    pub(crate) async fn stop_pod_sandbox(
        self: &Arc<Self>,
        req: api::StopPodSandboxRequest,
    ) -> Result<api::StopPodSandboxResponse> {
        // As creations and removals: a plugin being synchronized is told
        // of the stop after its Synchronize, or synchronized after the stop.
        let _sync = self.nri_block_sync().await;
        let sb = match self.sandbox(&req.pod_sandbox_id) {
            Ok(sb) => sb,
            Err(RuntimeError::NotFound { .. }) => return Ok(api::StopPodSandboxResponse {}),
            Err(e) => return Err(e),
        };
        self.sandbox_stop(&sb).await?;
        Ok(api::StopPodSandboxResponse {})
    }
}

#[cfg(test)]
mod tests {
    use petrel_cri::api;

    use crate::parts::fake::{Call, TestRuntime};

    #[tokio::test]
    async fn stop_pod_should_succeed_and_do_nothing_for_an_unknown_or_removed_pod() {
        let t = TestRuntime::new();
        let stop = |id: &str| api::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        t.rt.stop_pod_sandbox(stop("deadbeef"))
            .await
            .expect("unknown id");
        let id = t.pod("p").await;
        t.rt.remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .expect("remove");
        t.host.clear_calls();
        t.rt.stop_pod_sandbox(stop(&id))
            .await
            .expect("stop removed");
        assert_eq!(t.host.calls(), Vec::<Call>::new());
        assert!(t.rt.stop_pod_sandbox(stop("")).await.is_err());
    }
}
