//! CRI v1 bindings and the plumbing to speak them over unix sockets.
//!
//! - [`api`]: the CRI v1 messages, clients and servers, re-exported from the
//!   maintained `k8s-cri` crate (generated at its build time from the upstream
//!   `api.proto`).
//! - [`admin`]: Petrel's small administrative API served beside CRI.
//! - [`client::connect`] dials `unix:///path` endpoints; [`server::bind_unix`]
//!   creates a listening socket with the right permissions, whose
//!   connections answer any `:authority` ([`authority`], over [`hpack`]).
//! - [`list::ListClient`]: ListPodSandbox and ListContainers decoded at
//!   prost's fastest, for relists of thousands of containers; its
//!   `list_container_summaries` decodes only what a relist needs
//!   ([`summary`]).

pub mod authority;
pub mod client;
pub mod hpack;
pub mod list;
pub mod server;
pub mod summary;

/// CRI v1 (`runtime.v1`) messages, `RuntimeService` and `ImageService`.
pub use k8s_cri::v1 as api;

/// Petrel's administrative API (`petrel.admin.v1`).
#[allow(clippy::all, missing_docs)]
pub mod admin {
    tonic::include_proto!("petrel.admin.v1");
}

pub use client::{connect, connect_lazy, ClientError, Endpoint};
pub use list::ListClient;
pub use server::{bind_unix, ServerError};
pub use summary::ContainerSummary;
