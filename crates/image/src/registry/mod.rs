//! Pulling images from OCI / Docker v2 registries: host resolution with
//! containerd's `hosts.toml` (`hosts`), HTTP with auth challenges
//! (`client`, `auth`), the pull itself (`pull`) and its per-layer progress
//! (`progress`). Pulled blobs go to the
//! store's temp directory and are committed by
//! [`ImageStore::import_pulled`](crate::ImageStore::import_pulled) exactly
//! like an imported archive.

mod auth;
mod client;
mod hosts;
mod progress;
mod pull;

pub use auth::{decode_auth_field, Credentials};
pub use hosts::{is_loopback, Capabilities, Host, RegistryHosts};
pub use progress::{LayerProgress, LayerState, ProgressReporter, PullProgress, Throttle};
pub use pull::{Blob, PulledImage, PulledLayer, Puller, MAX_MANIFEST_BYTES};
