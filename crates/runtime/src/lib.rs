//! Petrel's CRI v1 container runtime.
//!
//! [`serve`] runs the whole runtime: it opens the store and image store,
//! recovers every pod and container left by a previous run, and serves CRI
//! `RuntimeService` and `ImageService` (plus Petrel's admin API) on a unix
//! socket until it is told to stop. Containers outlive the runtime: each is
//! watched by its own `petrel-shim`.

pub mod checkpoint;
pub mod config;
pub mod container;
pub mod error;
pub mod events;
pub mod metrics;
pub mod nri;
pub mod open_files;
pub mod orphans;
pub mod parts;
pub mod records;
pub mod sample;
pub mod sandbox;
pub mod server;
pub mod service;
pub mod state;
pub mod streaming;
pub mod util;

mod recovery;
mod validate;

pub use config::RuntimeConfig;
pub use error::RuntimeError;
pub use parts::Parts;
pub use server::{serve, serve_runtime};
pub use service::Runtime;
pub use streaming::RuntimeStreams;
