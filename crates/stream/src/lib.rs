//! Petrel's streaming server: the URLs that CRI `Exec`, `Attach` and
//! `PortForward` return are served here, in the protocols kubelet, kubectl
//! and crictl speak (SPDY/3.1 and WebSocket channels).
//!
//! The crate knows nothing about containers: whoever serves the streams
//! implements [`StreamBackend`] (the runtime does, with runc and its shims).
//!
//! - [`StreamServer`]: listens, issues single-use URLs, upgrades each
//!   request and drives the backend.
//! - [`client`]: the other end, for `petrel ctl` and tests.
//! - [`origin`]: the `Host` and `Origin` checks that keep web pages out
//!   (DNS rebinding, cross-origin WebSockets).

mod backend;
pub mod client;
mod command;
mod config;
mod error;
mod forward;
mod idle;
pub mod origin;
mod pipe;
mod protocol;
mod server;
mod spdy;
mod tokens;
mod ws;

pub use backend::{
    AttachSpec, BackendError, ExecSpec, Reader, StreamBackend, StreamIo, TermSize, Writer,
};
pub use config::StreamConfig;
pub use error::StreamError;
pub use protocol::status::Outcome;
pub use server::{Listening, StreamServer};
pub use tokens::TokenError;
