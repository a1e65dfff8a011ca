//! ExecSync (the streaming calls arrive with the streaming server).

use std::sync::Arc;
use std::time::Duration;

use oci_spec::runtime::{Process, Spec};
use petrel_cri::api;
use petrel_oci::runc::RuncError;

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
        match self.runc.exec(&c.id, &process, &bundle, timeout).await {
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

    /// Exec: the streaming server is not part of this runtime yet.
    pub(crate) async fn exec(
        self: &Arc<Self>,
        _req: api::ExecRequest,
    ) -> Result<api::ExecResponse> {
        Err(RuntimeError::Unsupported(
            "streaming exec is not available yet; use ExecSync".into(),
        ))
    }

    /// Attach: the streaming server is not part of this runtime yet.
    pub(crate) async fn attach(
        self: &Arc<Self>,
        _req: api::AttachRequest,
    ) -> Result<api::AttachResponse> {
        Err(RuntimeError::Unsupported(
            "attach is not available yet".into(),
        ))
    }

    /// PortForward: the streaming server is not part of this runtime yet.
    pub(crate) async fn port_forward(
        self: &Arc<Self>,
        _req: api::PortForwardRequest,
    ) -> Result<api::PortForwardResponse> {
        Err(RuntimeError::Unsupported(
            "port forwarding is not available yet".into(),
        ))
    }

    /// CheckpointContainer is not supported (no CRIU).
    pub(crate) async fn checkpoint_container(
        self: &Arc<Self>,
        _req: api::CheckpointContainerRequest,
    ) -> Result<api::CheckpointContainerResponse> {
        Err(RuntimeError::Unsupported(
            "checkpointing containers is not supported".into(),
        ))
    }
}

/// The process of an exec: the container's own process settings (user,
/// environment, working directory, capabilities) with `cmd` as arguments,
/// on a terminal of `terminal` size (`Some((0, 0))`: size unknown yet) or
/// none.
pub(crate) fn exec_process(
    spec_path: &std::path::Path,
    cmd: Vec<String>,
    terminal: Option<(u16, u16)>,
) -> Result<Process> {
    let spec = Spec::load(spec_path)
        .map_err(|e| RuntimeError::internal(format!("read {}", spec_path.display()), e))?;
    let mut p = spec
        .process()
        .clone()
        .ok_or_else(|| RuntimeError::Internal(format!("{} has no process", spec_path.display())))?;
    p.set_args(Some(cmd));
    p.set_terminal(Some(terminal.is_some()));
    let size = match terminal.filter(|&(w, h)| w > 0 && h > 0) {
        Some((width, height)) => Some(
            oci_spec::runtime::BoxBuilder::default()
                .width(u64::from(width))
                .height(u64::from(height))
                .build()
                .map_err(|e| RuntimeError::internal("terminal size", e))?,
        ),
        None => None,
    };
    p.set_console_size(size);
    Ok(p)
}
