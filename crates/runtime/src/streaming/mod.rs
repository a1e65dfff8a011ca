//! The runtime's side of CRI streaming: [`RuntimeStreams`] implements the
//! streaming server's [`StreamBackend`] with runc and the shims.
//!
//! - `exec`: `runc exec --detach` of the command with the container's own
//!   process settings; its stdio are pipes (or a terminal received on a
//!   console socket) copied to and from the client. The runtime, a child
//!   subreaper, inherits the exec'd process when runc exits and waits for it
//!   by pidfd: no runc stays resident beside a long exec.
//! - `attach`: a connection to the container's shim on its attach socket
//!   (`petrel_shim::attach`), which holds the container's stdio.
//! - `port_forward`: a TCP connection to localhost made from a thread that
//!   joined the pod's network namespace.
//!
//! The CRI `Exec`, `Attach` and `PortForward` calls check their requests
//! with [`Runtime::validate_exec`], [`Runtime::validate_attach`] and
//! [`Runtime::validate_port_forward`] before asking the streaming server for
//! a URL; the backend checks the container again when the client connects.

mod attach;
mod exec;
mod fd;
mod port_forward;

use std::sync::{Arc, Weak};

use petrel_cri::api;
use petrel_stream::{AttachSpec, BackendError, ExecSpec, StreamBackend, StreamIo};

use crate::error::{Result, RuntimeError};
use crate::records::{ContainerState, SandboxState};
use crate::service::Runtime;
use crate::state::Container;

/// The runtime as the streaming server's backend. Holds the runtime weakly:
/// streams still open when the runtime shuts down fail instead of keeping it
/// alive.
#[derive(Debug, Clone)]
pub struct RuntimeStreams {
    rt: Weak<Runtime>,
}

impl RuntimeStreams {
    /// A backend serving streams of `rt`'s containers and pods.
    pub fn new(rt: &Arc<Runtime>) -> Self {
        Self::of(Arc::downgrade(rt))
    }

    /// A backend for the runtime behind `rt` (one being made, too).
    pub(crate) fn of(rt: Weak<Runtime>) -> Self {
        Self { rt }
    }

    fn runtime(&self) -> Result<Arc<Runtime>, BackendError> {
        self.rt
            .upgrade()
            .ok_or_else(|| BackendError::Internal("the runtime is shutting down".into()))
    }
}

#[async_trait::async_trait]
impl StreamBackend for RuntimeStreams {
    async fn exec(&self, spec: ExecSpec, io: StreamIo) -> Result<i32, BackendError> {
        let rt = self.runtime()?;
        let c = running_container(&rt, &spec.container_id)?;
        let target = exec::Target {
            id: c.id.clone(),
            bundle: c.with(|r| r.bundle.clone()),
            runtime: rt.oci.binary().to_path_buf(),
            runtime_root: rt.oci.root().to_path_buf(),
        };
        // The stream may last for hours: hold no reference to the runtime.
        drop((c, rt));
        exec::run(target, spec, io).await
    }

    async fn attach(&self, spec: AttachSpec, io: StreamIo) -> Result<(), BackendError> {
        let rt = self.runtime()?;
        let c = running_container(&rt, &spec.container_id)?;
        check_attach(&c, spec.tty, spec.stdin).map_err(BackendError::from)?;
        let bundle = c.with(|r| r.bundle.clone());
        let id = c.id.clone();
        drop((c, rt));
        attach::run(&id, &bundle, spec, io).await
    }

    async fn port_forward(
        &self,
        pod_sandbox_id: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, BackendError> {
        let rt = self.runtime()?;
        let sb = rt.sandbox(pod_sandbox_id)?;
        let (id, state, netns) = sb.with(|r| (r.id.clone(), r.state, r.netns.clone()));
        if state != SandboxState::Ready {
            return Err(BackendError::FailedPrecondition(format!(
                "pod sandbox {id} is not ready"
            )));
        }
        drop((sb, rt));
        port_forward::connect(&id, netns, port).await
    }
}

impl From<RuntimeError> for BackendError {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::NotFound { .. } => Self::NotFound(e.to_string()),
            RuntimeError::FailedPrecondition(msg) => Self::FailedPrecondition(msg),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// The container, if it exists and runs.
fn running_container(rt: &Runtime, id: &str) -> Result<Arc<Container>> {
    let c = rt.container(id)?;
    if c.state() != ContainerState::Running {
        return Err(RuntimeError::FailedPrecondition(format!(
            "container {} is not running",
            c.id
        )));
    }
    Ok(c)
}

/// Whether an attach with `tty` and `stdin` fits how the container was made.
fn check_attach(c: &Container, tty: bool, stdin: bool) -> Result<()> {
    let (has_tty, has_stdin) = c.with(|r| (r.config.tty, r.config.stdin));
    if tty && !has_tty {
        return Err(RuntimeError::FailedPrecondition(format!(
            "container {} has no terminal (created without tty); attach without tty",
            c.id
        )));
    }
    if stdin && !has_stdin {
        return Err(RuntimeError::FailedPrecondition(format!(
            "container {} was created without stdin; attach without stdin",
            c.id
        )));
    }
    Ok(())
}

/// The stream flags every streaming request shares, checked as containerd
/// and kubelet check them.
fn check_streams(tty: bool, stdin: bool, stdout: bool, stderr: bool) -> Result<()> {
    if tty && stderr {
        return Err(RuntimeError::invalid(
            "stderr",
            "tty and stderr cannot both be true (a terminal merges stderr into stdout)",
        ));
    }
    if !stdin && !stdout && !stderr {
        return Err(RuntimeError::invalid(
            "stdin",
            "one of stdin, stdout and stderr must be set",
        ));
    }
    Ok(())
}

impl Runtime {
    /// Checks a CRI `ExecRequest`: a command, sensible streams, a running
    /// container. Returns what the streaming server serves (with the
    /// container's full id, also when the request gave a prefix).
    pub fn validate_exec(&self, req: &api::ExecRequest) -> Result<ExecSpec> {
        if req.cmd.is_empty() || req.cmd[0].is_empty() {
            return Err(RuntimeError::invalid("cmd", "must name a command"));
        }
        check_streams(req.tty, req.stdin, req.stdout, req.stderr)?;
        let c = running_container(self, &req.container_id)?;
        Ok(ExecSpec {
            container_id: c.id.clone(),
            cmd: req.cmd.clone(),
            tty: req.tty,
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
        })
    }

    /// Checks a CRI `AttachRequest`: sensible streams, a running container
    /// made with a terminal if one is asked for, and with stdin if input is.
    pub fn validate_attach(&self, req: &api::AttachRequest) -> Result<AttachSpec> {
        check_streams(req.tty, req.stdin, req.stdout, req.stderr)?;
        let c = running_container(self, &req.container_id)?;
        check_attach(&c, req.tty, req.stdin)?;
        Ok(AttachSpec {
            container_id: c.id.clone(),
            tty: req.tty,
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
        })
    }

    /// Checks a CRI `PortForwardRequest`: a ready pod and valid ports.
    /// Returns the pod's full id.
    pub fn validate_port_forward(&self, req: &api::PortForwardRequest) -> Result<String> {
        if let Some(bad) = req.port.iter().find(|&&p| !(1..=65535).contains(&p)) {
            return Err(RuntimeError::invalid(
                "port",
                format!("{bad} is not a TCP port (1-65535)"),
            ));
        }
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        let (id, state) = sb.with(|r| (r.id.clone(), r.state));
        if state != SandboxState::Ready {
            return Err(RuntimeError::FailedPrecondition(format!(
                "pod sandbox {id} is not ready"
            )));
        }
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_streams_should_follow_cri_rules() {
        assert!(check_streams(false, false, true, true).is_ok());
        assert!(check_streams(true, true, true, false).is_ok());
        assert!(matches!(
            check_streams(true, false, true, true),
            Err(RuntimeError::InvalidArgument { .. })
        ));
        assert!(matches!(
            check_streams(false, false, false, false),
            Err(RuntimeError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn runtime_errors_should_keep_their_kind_for_the_client() {
        let nf = BackendError::from(RuntimeError::NotFound {
            kind: "container",
            id: "abc".into(),
        });
        assert!(matches!(nf, BackendError::NotFound(m) if m.contains("abc")));
        let fp = BackendError::from(RuntimeError::FailedPrecondition("x".into()));
        assert!(matches!(fp, BackendError::FailedPrecondition(m) if m == "x"));
        let other = BackendError::from(RuntimeError::Invariant("boom".into()));
        assert!(matches!(other, BackendError::Internal(m) if m == "boom"));
    }
}
