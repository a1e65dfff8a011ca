//! Petrel's test kit: what the end-to-end tests need beyond Petrel itself.
//!
//! - [`peers`]: where the real ecosystem's binaries are (kubelet,
//!   kube-apiserver, etcd, kubectl, ...), built by `make peers`.
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
pub mod cri;
mod error;
pub mod http;
pub mod kubeconfig;
pub mod kubectl;
pub mod kubelet;
pub mod peers;
pub mod process;

pub use error::KitError;
