//! CRI v1 bindings and the plumbing to speak them over unix sockets.
//!
//! - [`api`]: the CRI v1 messages, clients and servers, generated at build
//!   time from the upstream `api.proto` of `k8s.io/cri-api` v0.37.2, vendored
//!   unchanged in `third_party/cri-api/`.
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
pub mod serde_bytes;
pub mod server;
pub mod summary;

/// CRI v1 (`runtime.v1`) messages, `RuntimeService` and `ImageService`.
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod api {
    tonic::include_proto!("runtime.v1");

    /// Upstream marks the credentials `debug_redact`: they never reach a
    /// log through `{:?}`.
    impl std::fmt::Debug for AuthConfig {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            fn shown(s: &str) -> &'static str {
                if s.is_empty() {
                    ""
                } else {
                    "[redacted]"
                }
            }
            f.debug_struct("AuthConfig")
                .field("username", &self.username)
                .field("password", &shown(&self.password))
                .field("auth", &shown(&self.auth))
                .field("server_address", &self.server_address)
                .field("identity_token", &shown(&self.identity_token))
                .field("registry_token", &shown(&self.registry_token))
                .finish()
        }
    }
}

/// Petrel's administrative API (`petrel.admin.v1`).
#[allow(clippy::all, missing_docs)]
pub mod admin {
    tonic::include_proto!("petrel.admin.v1");
}

pub use client::{connect, connect_lazy, ClientError, Endpoint};
pub use list::ListClient;
pub use server::{bind_unix, ServerError};
pub use summary::ContainerSummary;
