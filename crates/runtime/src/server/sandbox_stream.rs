//! StreamPodSandboxes: ListPodSandbox's answer for the same filter,
//! streamed in batches ([`super::list_stream`]).

use std::sync::Arc;

use petrel_cri::api;

use super::list_stream::batches;
use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StreamPodSandboxes: the responses to send, in order.
    pub(crate) async fn stream_pod_sandboxes(
        self: &Arc<Self>,
        req: api::StreamPodSandboxesRequest,
    ) -> Result<Vec<api::StreamPodSandboxesResponse>> {
        let list = self
            .list_pod_sandbox(api::ListPodSandboxRequest { filter: req.filter })
            .await?;
        Ok(batches(list.items)
            .into_iter()
            .map(|pod_sandboxes| api::StreamPodSandboxesResponse { pod_sandboxes })
            .collect())
    }
}
