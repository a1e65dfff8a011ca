//! StreamContainerStats: ListContainerStats' answer for the same filter,
//! streamed in batches ([`super::list_stream`]).

use std::sync::Arc;

use petrel_cri::api;

use super::list_stream::batches;
use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StreamContainerStats: the responses to send, in order.
    pub(crate) async fn stream_container_stats(
        self: &Arc<Self>,
        req: api::StreamContainerStatsRequest,
    ) -> Result<Vec<api::StreamContainerStatsResponse>> {
        let list = self
            .list_container_stats(api::ListContainerStatsRequest { filter: req.filter })
            .await?;
        Ok(batches(list.stats)
            .into_iter()
            .map(|container_stats| api::StreamContainerStatsResponse { container_stats })
            .collect())
    }
}
