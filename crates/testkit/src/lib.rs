//! Petrel's test kit: what the end-to-end tests, `make conformance` and
//! `make bench` need beyond Petrel itself.
//!
//! - [`peers`]: where the real ecosystem's binaries are (critest, kubelet,
//!   kube-apiserver, etcd, kubectl, containerd 2.x, ...), built by `make peers`.
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
//! - [`certs`]: a throwaway certificate authority and the certificates a
//!   cluster needs, made with the `openssl` command.
//! - [`kubeconfig`]: kubeconfig files for those credentials.
//! - [`cluster`]: etcd and kube-apiserver on loopback, several side by side.
//! - [`kubectl`]: kubectl against such a cluster, with a deadline.
//! - [`kubelet`]: the real kubelet driving a CRI runtime under test,
//!   standalone (static pods) or joined to a [`cluster::Cluster`].
//! - [`process`], [`cri`], [`http`]: processes stopped by pid and swept
//!   places, the CRI calls the kit makes itself, plain HTTP GETs.

pub mod certs;
pub mod cluster;
pub mod conformance;
pub mod containerd;
pub mod cri;
pub mod critest;
mod error;
pub mod expected;
pub mod http;
pub mod images;
pub mod kubeconfig;
pub mod kubectl;
pub mod kubelet;
pub mod network;
pub mod peers;
pub mod petrel;
pub mod process;
pub mod registry;

pub use error::KitError;
