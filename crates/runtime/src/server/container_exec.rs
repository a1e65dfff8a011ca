//! ExecSync, and the streaming calls (Exec, Attach, PortForward), which
//! answer with URLs of the streaming server (`petrel_stream`).

use std::sync::Arc;
use std::time::Duration;

use petrel_cri::api;
use petrel_oci::runc::RuncError;

use crate::container::exec_process::exec_process;
use crate::error::{Result, RuntimeError};
use crate::records::ContainerState;
use crate::service::Runtime;

impl Runtime {
    /// ExecSync: runs a command in a running container and returns its
    /// output and exit code. A timeout kills the command (not the
    /// container) and returns DEADLINE_EXCEEDED.
    pub(crate) async fn exec_sync(
        self: &Arc<Self>,
        req: api::ExecSyncRequest,
    ) -> Result<api::ExecSyncResponse> {
        if req.cmd.is_empty() {
            return Err(RuntimeError::invalid("cmd", "must name a command"));
        }
        let c = self.container(&req.container_id)?;
        if c.state() != ContainerState::Running {
            return Err(RuntimeError::FailedPrecondition(format!(
                "container {} is not running",
                c.id
            )));
        }
        let bundle = c.with(|r| r.bundle.clone());
        let process = exec_process(&bundle.join("config.json"), req.cmd, None)?;
        let timeout =
            (req.timeout > 0).then(|| Duration::from_secs(u64::try_from(req.timeout).unwrap_or(0)));
        match self.oci.exec(&c.id, &process, &bundle, timeout).await {
            Ok(out) => Ok(api::ExecSyncResponse {
                stdout: out.stdout,
                stderr: out.stderr,
                exit_code: out.exit_code,
            }),
            Err(RuncError::Timeout { timeout, .. }) => Err(RuntimeError::DeadlineExceeded(
                format!("command in container {} timed out after {timeout:?}", c.id),
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// Exec: a URL of the streaming server for this command.
    pub(crate) async fn exec(self: &Arc<Self>, req: api::ExecRequest) -> Result<api::ExecResponse> {
        let spec = self.validate_exec(&req)?;
        let url = self.stream_server()?.exec_url(spec)?;
        Ok(api::ExecResponse { url })
    }

    /// Attach: a URL of the streaming server for the container's stdio.
    pub(crate) async fn attach(
        self: &Arc<Self>,
        req: api::AttachRequest,
    ) -> Result<api::AttachResponse> {
        let spec = self.validate_attach(&req)?;
        let url = self.stream_server()?.attach_url(spec)?;
        Ok(api::AttachResponse { url })
    }

    /// PortForward: a URL of the streaming server for the pod's ports.
    pub(crate) async fn port_forward(
        self: &Arc<Self>,
        req: api::PortForwardRequest,
    ) -> Result<api::PortForwardResponse> {
        let pod = self.validate_port_forward(&req)?;
        let ports = req
            .port
            .iter()
            .filter_map(|p| u16::try_from(*p).ok())
            .collect();
        let url = self.stream_server()?.port_forward_url(pod, ports)?;
        Ok(api::PortForwardResponse { url })
    }

    fn stream_server(&self) -> Result<&petrel_stream::StreamServer> {
        Ok(&self.streams)
    }
}
