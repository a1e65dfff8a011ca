//! UpdatePodSandboxResources: kubelet tells the runtime a pod's new
//! pod-level resources after it has resized the pod's cgroup itself. The
//! sandbox's config records them (`linux.resources`, `linux.overhead`), so
//! that what the runtime reports and hands NRI plugins later is current.
//! Kubelet treats the call as best effort; an unknown pod is NOT_FOUND.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// UpdatePodSandboxResources.
    pub(crate) async fn update_pod_sandbox_resources(
        self: &Arc<Self>,
        req: api::UpdatePodSandboxResourcesRequest,
    ) -> Result<api::UpdatePodSandboxResourcesResponse> {
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        if req.resources.is_none() && req.overhead.is_none() {
            return Ok(api::UpdatePodSandboxResourcesResponse {});
        }
        let _op = sb.op.write().await;
        let mut rec = sb.record();
        let linux = rec.config.linux.get_or_insert_with(Default::default);
        if let Some(r) = req.resources {
            linux.resources = Some(r);
        }
        if let Some(o) = req.overhead {
            linux.overhead = Some(o);
        }
        self.save_sandbox(&sb, rec)?;
        Ok(api::UpdatePodSandboxResourcesResponse {})
    }
}
