//! Petrel's streaming server: the URLs that CRI `Exec`, `Attach` and
//! `PortForward` return are served here, in the protocols kubelet, kubectl
//! and crictl speak (SPDY/3.1 and WebSocket channels).
//!
//! The crate knows nothing about containers: whoever serves the streams
//! implements [`StreamBackend`] (the runtime does, with runc and its shims).

mod backend;
mod config;
mod error;
mod pipe;
mod protocol;
mod spdy;
mod tokens;

pub use backend::{
    AttachSpec, BackendError, ExecSpec, Reader, StreamBackend, StreamIo, TermSize, Writer,
};
pub use config::StreamConfig;
pub use error::StreamError;
pub use protocol::status::Outcome;
pub use tokens::TokenError;
