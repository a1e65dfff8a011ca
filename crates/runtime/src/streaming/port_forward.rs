//! Port forwarding: a TCP connection to localhost inside the pod's network
//! namespace.
//!
//! A socket belongs to the network namespace it was created in, whatever
//! thread uses it later. So a short-lived thread of its own joins the pod's
//! namespace (`setns` changes only the calling thread), connects, hands the
//! connected socket back and exits; no thread of the tokio runtime ever
//! changes namespace.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use petrel_stream::BackendError;

/// How long a connection may take (loopback answers at once; a listener
/// with a full backlog may not).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to `port` on localhost in the pod's network namespace (`netns`,
/// the pinned namespace file; `None` for a pod on the host's network):
/// 127.0.0.1 first, as kubelet's runtimes do, then ::1 for a server that
/// listens on IPv6 only.
pub(super) async fn connect(
    pod: &str,
    netns: Option<PathBuf>,
    port: u16,
) -> Result<tokio::net::TcpStream, BackendError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("petrel-portfwd".into())
        .spawn(move || {
            drop(tx.send(connect_in_netns(netns.as_deref(), port)));
        })
        .map_err(|e| BackendError::Internal(format!("start port-forward thread: {e}")))?;
    let stream = rx
        .await
        .map_err(|_| BackendError::Internal("port-forward thread failed".into()))?
        .map_err(|e| match e {
            ConnectError::Netns(e) => BackendError::FailedPrecondition(format!(
                "network namespace of pod {pod} is gone: {e}"
            )),
            ConnectError::Connect(e) => {
                BackendError::Internal(format!("connect to port {port} in pod {pod}: {e}"))
            }
        })?;
    stream
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpStream::from_std(stream))
        .map_err(|e| BackendError::Internal(format!("port-forward socket: {e}")))
}

enum ConnectError {
    Netns(io::Error),
    Connect(io::Error),
}

/// Runs on a thread of its own, which ends right after.
fn connect_in_netns(netns: Option<&std::path::Path>, port: u16) -> Result<TcpStream, ConnectError> {
    if let Some(path) = netns {
        let file = std::fs::File::open(path).map_err(ConnectError::Netns)?;
        rustix::thread::move_into_link_name_space(
            file.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| ConnectError::Netns(e.into()))?;
    }
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(s) => Ok(s),
        Err(e4) => {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            // Report the IPv4 error: that is what most servers listen on.
            TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| ConnectError::Connect(e4))
        }
    }
}
