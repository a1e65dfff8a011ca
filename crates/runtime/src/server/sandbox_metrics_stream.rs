//! StreamPodSandboxMetrics: ListPodSandboxMetrics' answer, streamed in
//! batches ([`super::list_stream`]).

use std::sync::Arc;

use petrel_cri::api;

use super::list_stream::batches;
use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StreamPodSandboxMetrics: the responses to send, in order.
    pub(crate) async fn stream_pod_sandbox_metrics(
        self: &Arc<Self>,
        _req: api::StreamPodSandboxMetricsRequest,
    ) -> Result<Vec<api::StreamPodSandboxMetricsResponse>> {
        let list = self
            .list_pod_sandbox_metrics(api::ListPodSandboxMetricsRequest {})
            .await?;
        Ok(batches(list.pod_metrics)
            .into_iter()
            .map(|pod_sandbox_metrics| api::StreamPodSandboxMetricsResponse {
                pod_sandbox_metrics,
            })
            .collect())
    }
}
