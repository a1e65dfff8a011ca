//! NRI (Node Resource Interface) for Petrel, wire-compatible with containerd's NRI
//! (protocol v0.12, and the StateChange path of containerd 1.7).
//!
//! - [`api`]: the protocol's messages, generated from `proto/nri.proto`, and constants
//!   (event masks, service and method names, environment variables).
//! - [`mux`]: the connection multiplexer carrying both services over one socket.
//! - [`ttrpc`]: ttRPC message framing and envelopes.
//! - [`stub`]: the plugin SDK.
//! - [`adaptation`]: the runtime's end of one plugin connection, and the merging and
//!   validation of what plugins answer.

#![warn(missing_docs)]

pub mod api;
pub mod mux;
mod rpc;
pub mod ttrpc;

pub use rpc::RpcError;
pub mod adaptation;
pub mod stub;
