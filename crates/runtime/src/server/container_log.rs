//! ReopenContainerLog: the shim reopens the log file after rotation.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::records::ContainerState;
use crate::service::Runtime;

impl Runtime {
    /// ReopenContainerLog.
    pub(crate) async fn reopen_container_log(
        self: &Arc<Self>,
        req: api::ReopenContainerLogRequest,
    ) -> Result<api::ReopenContainerLogResponse> {
        let c = self.container(&req.container_id)?;
        if c.state() != ContainerState::Running {
            return Err(RuntimeError::FailedPrecondition(format!(
                "container {} is not running",
                c.id
            )));
        }
        let (bundle, has_log) = c.with(|r| (r.bundle.clone(), r.log_path.is_some()));
        if !has_log {
            return Err(RuntimeError::FailedPrecondition(format!(
                "container {} has no log path",
                c.id
            )));
        }
        self.shims
            .send_command(&bundle, petrel_shim::Command::ReopenLog)
            .await?;
        Ok(api::ReopenContainerLogResponse {})
    }
}
