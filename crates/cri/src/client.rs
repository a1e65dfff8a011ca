//! Dialling a CRI endpoint over a unix socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};
use tower::service_fn;

/// Errors while dialling an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint string is not `unix:///path` or an absolute path.
    #[error("invalid endpoint {0:?}: expected unix:///path/to/socket or an absolute path")]
    InvalidEndpoint(String),
    /// The socket could not be reached.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The transport error.
        source: tonic::transport::Error,
    },
}

/// A parsed CRI endpoint: the path of a unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// Parses `unix:///path`, `unix:/path` or a plain absolute path.
    pub fn parse(s: &str) -> Result<Self, ClientError> {
        let raw = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
            .unwrap_or(s);
        if raw.is_empty() || !raw.starts_with('/') {
            return Err(ClientError::InvalidEndpoint(s.to_string()));
        }
        Ok(Self {
            path: PathBuf::from(raw),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Dials a CRI (or Petrel admin) endpoint and returns a channel usable by
/// every generated client. The connection is made eagerly so that a missing
/// socket is reported here rather than on the first call.
pub async fn connect(endpoint: &str) -> Result<Channel, ClientError> {
    let ep = Endpoint::parse(endpoint)?;
    let path = ep.path.clone();
    // The URI is a placeholder: the connector ignores it and dials the socket.
    let channel = tonic::transport::Endpoint::from_static("http://[::1]:50051")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| ClientError::Connect {
            path: ep.path.clone(),
            source,
        })?;
    Ok(channel)
}

/// Like [`connect`], but the connection is made on first use and remade
/// after it breaks, so a client outlives restarts of the server (the agent
/// keeps one channel to its runtime for its whole life).
pub fn connect_lazy(endpoint: &str) -> Result<Channel, ClientError> {
    let ep = Endpoint::parse(endpoint)?;
    let path = ep.path;
    let channel = tonic::transport::Endpoint::from_static("http://[::1]:50051")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }));
    Ok(channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_should_accept_unix_urls_and_paths() {
        for s in ["unix:///run/x.sock", "unix:/run/x.sock", "/run/x.sock"] {
            assert_eq!(
                Endpoint::parse(s).map(|e| e.path().to_path_buf()).ok(),
                Some(PathBuf::from("/run/x.sock")),
                "{s}"
            );
        }
    }

    #[test]
    fn endpoint_should_reject_relative_and_tcp() {
        for s in ["", "unix://", "x.sock", "tcp://127.0.0.1:1"] {
            assert!(Endpoint::parse(s).is_err(), "{s}");
        }
    }
}
