//! GetContainerEvents: one mailbox subscription per stream.

use std::sync::Arc;

use tokio_stream::StreamExt;
use tonic::Status;

use crate::events::Lagged;
use crate::service::Runtime;

impl Runtime {
    /// A new event stream. It ends with RESOURCE_EXHAUSTED if this
    /// subscriber falls behind (it lost events and must relist), or cleanly
    /// when the runtime shuts down.
    // tonic fixes the stream's item type as Result<_, Status>.
    #[allow(clippy::result_large_err)]
    pub(crate) fn event_stream(self: &Arc<Self>) -> super::EventStream {
        let sub = self.events.subscribe();
        tracing::info!(subscriber = sub.id(), "event subscriber connected");
        Box::pin(sub.map(|r| r.map_err(lagged_status)))
    }
}

/// The status ending the stream of a subscriber that fell behind.
fn lagged_status(l: Lagged) -> Status {
    Status::resource_exhausted(format!(
        "event subscriber fell behind and lost {} events: relist, then subscribe again",
        l.missed
    ))
}
