//! A client for the streaming server's URLs (and kubelet's, and any CRI
//! runtime's): exec and attach over WebSocket (v5, falling back to v4) or
//! SPDY/3.1, and port-forward over either. Used by `petrel ctl` and tests.

mod spdy;
mod upgrade;
mod ws;

use std::sync::atomic::AtomicU64;

use tokio::sync::{mpsc, oneshot};

pub use crate::protocol::status::Outcome;
use crate::{Reader, TermSize, Writer};

/// Which protocol to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// WebSocket channels (v5, else v4).
    #[default]
    WebSocket,
    /// SPDY/3.1 streams (v5, else v4).
    Spdy,
}

/// Which streams an exec or attach uses; must match the CRI request the
/// URL was issued for.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommandOptions {
    /// Send stdin.
    pub stdin: bool,
    /// Receive stdout.
    pub stdout: bool,
    /// Receive stderr (never with `tty`).
    pub stderr: bool,
    /// The command runs on a terminal: resize messages are accepted.
    pub tty: bool,
    /// The protocol.
    pub transport: Transport,
}

/// Why a streaming client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://host:port/path`.
    #[error("invalid streaming URL {url:?}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TCP connection failed.
    #[error("cannot connect to {address}: {source}")]
    Connect {
        /// host:port.
        address: String,
        /// Why.
        source: std::io::Error,
    },
    /// The server answered the upgrade with an HTTP error.
    #[error("the server refused the stream (HTTP {status}): {body}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The response body (the server's explanation).
        body: String,
    },
    /// The protocol failed after the upgrade, or during it.
    #[error("{0}")]
    Protocol(String),
    /// The connection ended before the command's status arrived.
    #[error("the connection ended before the command reported its status")]
    NoStatus,
}

/// A running exec or attach. Read `stdout` and `stderr` while waiting:
/// the status comes after all output, and unread output holds it back.
pub struct RemoteCommand {
    /// What the command reads; shutting it down closes the command's stdin
    /// (SPDY, and WebSocket v5; on v4 stdin cannot be closed alone).
    pub stdin: Option<Writer>,
    /// The command's stdout (with a terminal: all its output).
    pub stdout: Option<Reader>,
    /// The command's stderr.
    pub stderr: Option<Reader>,
    /// Terminal size changes (with a terminal, protocol v3 and later).
    pub resize: Option<mpsc::Sender<TermSize>>,
    protocol: String,
    status: oneshot::Receiver<Outcome>,
    closer: Closer,
}

impl std::fmt::Debug for RemoteCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteCommand")
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

/// Ends the client's side of a connection.
enum Closer {
    Ws(crate::ws::conn::WsConn),
    Spdy(crate::spdy::session::Session),
}

impl Closer {
    async fn close(&self) {
        match self {
            Closer::Ws(c) => c.close(std::time::Duration::from_secs(1)).await,
            Closer::Spdy(s) => s.go_away().await,
        }
    }
}

impl RemoteCommand {
    /// The negotiated subprotocol, e.g. `v5.channel.k8s.io`.
    pub fn protocol(&self) -> &str {
        &self.protocol
    }

    /// Waits for the command's outcome (its exit code, or why it could not
    /// run), then closes the connection.
    pub async fn wait(self) -> Result<Outcome, ClientError> {
        let r = self.status.await.map_err(|_| ClientError::NoStatus);
        self.closer.close().await;
        r
    }
}

/// Reads a stream to its end and hands over the bytes (the error stream's
/// status, read beside the outputs on both transports).
fn collect(mut r: crate::pipe::ChunkReader) -> oneshot::Receiver<Vec<u8>> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut all = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut r, &mut all).await;
        let _ = tx.send(all);
    });
    rx
}

/// Connects to an exec or attach URL.
pub async fn remote_command(url: &str, opts: CommandOptions) -> Result<RemoteCommand, ClientError> {
    match opts.transport {
        Transport::WebSocket => ws::remote_command(url, opts).await,
        Transport::Spdy => spdy::remote_command(url, opts).await,
    }
}

/// One forwarded connection to a port in the pod.
pub struct ForwardedStream {
    /// Bytes from the pod.
    pub reader: Reader,
    /// Bytes to the pod; shutting it down half-closes the connection
    /// (SPDY only: over WebSocket the pod's side ending ends it).
    pub writer: Writer,
    /// The forward's error report.
    pub error: ForwardError,
}

impl std::fmt::Debug for ForwardedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardedStream").finish_non_exhaustive()
    }
}

/// The server's report on one forwarded connection, available once the
/// server is done with it.
#[derive(Debug)]
pub struct ForwardError(oneshot::Receiver<String>);

impl ForwardError {
    /// `None` if the forward ended cleanly, else the server's message
    /// (e.g. the pod refused the connection).
    pub async fn wait(self) -> Option<String> {
        match self.0.await {
            Ok(m) if !m.trim().is_empty() => Some(m),
            _ => None,
        }
    }
}

/// A SPDY port-forward connection: each [`PortForwarder::open`] forwards
/// one more TCP connection over it, as `kubectl port-forward` does.
pub struct PortForwarder {
    session: crate::spdy::session::Session,
    next_request: AtomicU64,
}

impl std::fmt::Debug for PortForwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortForwarder").finish_non_exhaustive()
    }
}

impl PortForwarder {
    /// Connects to a port-forward URL over SPDY.
    pub async fn connect(url: &str) -> Result<PortForwarder, ClientError> {
        spdy::port_forwarder(url).await
    }

    /// Opens a connection to `port` in the pod.
    pub async fn open(&self, port: u16) -> Result<ForwardedStream, ClientError> {
        spdy::open_forward(self, port).await
    }

    /// Ends the connection (streams still open are cut).
    pub async fn close(&self) {
        self.session.go_away().await;
    }
}

/// Connects to a port-forward URL over WebSocket, one connection per port
/// in `ports` (the same ports, in the same order, as the CRI request).
pub async fn port_forward_websocket(
    url: &str,
    ports: &[u16],
) -> Result<Vec<ForwardedStream>, ClientError> {
    ws::port_forward(url, ports).await
}
