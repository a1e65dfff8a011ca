//! CheckpointPod and RestorePod: not supported; each answers UNIMPLEMENTED
//! naming itself, so a client can tell which call it may not use.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::service::Runtime;

impl Runtime {
    /// CheckpointPod.
    pub(crate) async fn checkpoint_pod(
        self: &Arc<Self>,
        _req: api::CheckpointPodRequest,
    ) -> Result<api::CheckpointPodResponse> {
        Err(RuntimeError::Unsupported(
            "CheckpointPod: pod checkpoints are not supported".into(),
        ))
    }

    /// RestorePod.
    pub(crate) async fn restore_pod(
        self: &Arc<Self>,
        _req: api::RestorePodRequest,
    ) -> Result<api::RestorePodResponse> {
        Err(RuntimeError::Unsupported(
            "RestorePod: restoring pods from checkpoints is not supported".into(),
        ))
    }
}
