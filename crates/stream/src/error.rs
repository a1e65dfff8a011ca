//! The crate's error type.

use crate::tokens::TokenError;

/// What went wrong in the streaming server or client.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The listening socket could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The configured address.
        address: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The request cannot be served (bad fields); the message says which.
    #[error("invalid streaming request: {0}")]
    InvalidArgument(String),
    /// A token could not be issued (too many in flight, no randomness).
    #[error(transparent)]
    Token(#[from] TokenError),
    /// [`crate::StreamServer::bind`] was called outside a tokio runtime.
    #[error("the streaming server needs a tokio runtime")]
    NoRuntime,
    /// The server has been shut down.
    #[error("the streaming server is shut down")]
    ShutDown,
}
