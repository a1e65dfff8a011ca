//! StreamContainers: ListContainers' answer for the same filter, streamed
//! in batches ([`super::list_stream`]).

use std::sync::Arc;

use petrel_cri::api;

use super::list_stream::batches;
use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StreamContainers: the responses to send, in order.
    pub(crate) async fn stream_containers(
        self: &Arc<Self>,
        req: api::StreamContainersRequest,
    ) -> Result<Vec<api::StreamContainersResponse>> {
        let list = self
            .list_containers(api::ListContainersRequest { filter: req.filter })
            .await?;
        Ok(batches(list.containers)
            .into_iter()
            .map(|containers| api::StreamContainersResponse { containers })
            .collect())
    }
}
