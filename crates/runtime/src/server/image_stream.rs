//! StreamImages: ListImages' answer for the same filter, streamed in
//! batches ([`super::list_stream`]).

use std::sync::Arc;

use petrel_cri::api;

use super::list_stream::batches;
use crate::error::Result;
use crate::service::Runtime;

impl Runtime {
    /// StreamImages: the responses to send, in order.
    pub(crate) async fn stream_images(
        self: &Arc<Self>,
        req: api::StreamImagesRequest,
    ) -> Result<Vec<api::StreamImagesResponse>> {
        let list = self
            .list_images(api::ListImagesRequest { filter: req.filter })
            .await?;
        Ok(batches(list.images)
            .into_iter()
            .map(|images| api::StreamImagesResponse { images })
            .collect())
    }
}
