//! Petrel's test kit: what the end-to-end tests and `make conformance` need
//! beyond Petrel itself.
//!
//! - [`peers`]: where the real ecosystem's binaries are (critest,
//!   containerd 2.x, ...), built by `make peers`.
//! - [`images`]: the conformance kit's substitute images, built from Debian
//!   packages by `scripts/conformance-images.sh` and cached outside the clone.
//! - [`registry`]: a local registry serving them, and the hosts.toml mirrors
//!   that send the upstream registries' names to it.
//! - [`network`]: a private CNI bridge network with port mappings.
//! - [`petrel`] and [`containerd`]: a CRI runtime under test, with its own
//!   root, state, socket, cgroup parent and NRI socket, swept on drop.
//! - [`critest`]: one critest run (serialized host-wide) and its per-spec
//!   results; [`expected`]: the expected list they are held against;
//!   [`conformance`]: both together, and the side-by-side summary.

pub mod conformance;
pub mod containerd;
pub mod cri;
pub mod critest;
mod error;
pub mod expected;
pub mod images;
pub mod network;
pub mod peers;
pub mod petrel;
pub mod process;
pub mod registry;

pub use error::KitError;
