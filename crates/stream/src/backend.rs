//! What the streaming server needs from a runtime.

use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

/// A byte stream from the client (stdin).
pub type Reader = Pin<Box<dyn AsyncRead + Send>>;
/// A byte stream to the client (stdout, stderr).
pub type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// A terminal size, as a client's resize message carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermSize {
    /// Columns.
    pub width: u16,
    /// Rows.
    pub height: u16,
}

/// The client's side of an exec or attach. Each stream is present only when
/// the request asked for it.
pub struct StreamIo {
    /// What the client types.
    pub stdin: Option<Reader>,
    /// The process's standard output (with a terminal: all of its output).
    pub stdout: Option<Writer>,
    /// The process's standard error; never present with a terminal, which
    /// merges it into stdout.
    pub stderr: Option<Writer>,
    /// Terminal size changes; present only with a terminal. The first one
    /// usually arrives before any input.
    pub resize: Option<tokio::sync::mpsc::Receiver<TermSize>>,
}

impl std::fmt::Debug for StreamIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamIo")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("resize", &self.resize.is_some())
            .finish()
    }
}

/// An exec the runtime has accepted (CRI `ExecRequest`, validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    /// The container to run the command in.
    pub container_id: String,
    /// The command and its arguments.
    pub cmd: Vec<String>,
    /// Run the command on a terminal.
    pub tty: bool,
    /// Stream stdin.
    pub stdin: bool,
    /// Stream stdout.
    pub stdout: bool,
    /// Stream stderr (ignored with `tty`).
    pub stderr: bool,
}

/// An attach the runtime has accepted (CRI `AttachRequest`, validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachSpec {
    /// The container whose main process to attach to.
    pub container_id: String,
    /// The container runs on a terminal.
    pub tty: bool,
    /// Stream stdin.
    pub stdin: bool,
    /// Stream stdout.
    pub stdout: bool,
    /// Stream stderr (ignored with `tty`).
    pub stderr: bool,
}

/// Why a backend could not serve a stream. The message goes to the client.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The container or pod is gone.
    #[error("{0}")]
    NotFound(String),
    /// The container or pod is not in a state that allows this.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The command could not be started (missing binary, permission):
    /// reported to the client like a failed command, with `exit_code`
    /// (126/127 like a shell).
    #[error("{message}")]
    CommandFailed {
        /// What went wrong, as the OCI runtime said it.
        message: String,
        /// The exit code reported to the client.
        exit_code: i32,
    },
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

/// The runtime side of the streaming server.
#[async_trait::async_trait]
pub trait StreamBackend: Send + Sync + 'static {
    /// Runs `spec.cmd` in the container wired to `io`, and returns its exit
    /// code once it has exited and all its output has been written to
    /// `io`. Dropping the future (the client went away) must kill the
    /// command.
    async fn exec(&self, spec: ExecSpec, io: StreamIo) -> Result<i32, BackendError>;

    /// Connects `io` to the container's main process until the process exits
    /// or the client goes away. Output the container wrote before the attach
    /// is not replayed (it is in the CRI log).
    async fn attach(&self, spec: AttachSpec, io: StreamIo) -> Result<(), BackendError>;

    /// A TCP connection to `port` on localhost inside the pod's network
    /// namespace (what `kubectl port-forward` reaches).
    async fn port_forward(
        &self,
        pod_sandbox_id: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, BackendError>;
}
