//! StreamPodSandboxStats: ListPodSandboxStats' answer for the same filter,
//! streamed in batches ([`super::list_stream`]).

use std::sync::Arc;

use petrel_cri::api;

use super::list_stream::batches;
use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StreamPodSandboxStats: the responses to send, in order.
    pub(crate) async fn stream_pod_sandbox_stats(
        self: &Arc<Self>,
        req: api::StreamPodSandboxStatsRequest,
    ) -> Result<Vec<api::StreamPodSandboxStatsResponse>> {
        let list = self
            .list_pod_sandbox_stats(api::ListPodSandboxStatsRequest { filter: req.filter })
            .await?;
        Ok(batches(list.stats)
            .into_iter()
            .map(|pod_sandbox_stats| api::StreamPodSandboxStatsResponse { pod_sandbox_stats })
            .collect())
    }
}
