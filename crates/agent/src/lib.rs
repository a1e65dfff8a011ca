//! `petrel agent`: a kubelet-style node agent. It runs the pods described
//! by the manifests in a directory on any CRI runtime and keeps their
//! status true.
//!
//! The parts, each in its own module:
//! - [`source`]: the manifest directory, watched with inotify, as desired pods;
//! - [`pleg`]: learns what changed in the runtime (relisting, and the
//!   runtime's event stream as hints), and keeps [`cache`] fresh;
//! - [`worker`]: reconciles each pod through the controller kit's work queue;
//! - [`status`]: computes and publishes Kubernetes pod statuses;
//! - [`subpath`]: subPath mounts opened beneath their volume and bound by
//!   file descriptor, so a container's symlinks cannot lead them out;
//! - [`admission`]: kubelet's pod admission (resources, node affinity,
//!   host ports, taints) before a pod first starts;
//! - [`eviction`]: node-pressure eviction (kubelet's signals, thresholds
//!   and ranking);
//! - [`pull_credentials`]: registry credentials from pods' `imagePullSecrets`;
//! - [`cluster`]: cluster mode (`--kubeconfig`): the Node, its Lease, the pods bound to it, their status;
//! - [`server`]: `/healthz`, `/metrics`, `/pods`, and kubelet's
//!   `/containerLogs`, `/exec`, `/attach`, `/portForward`.

pub mod admission;
mod agent;
pub mod cache;
pub mod cluster;
pub mod config;
pub mod convert;
pub mod cri;
pub mod crilog;
mod der;
mod drain;
pub mod eviction;
pub mod health;
pub mod metrics;
pub mod pleg;
pub mod probe;
pub mod pull_credentials;
pub mod qos_cgroups;
pub mod quantity;
pub mod server;
pub mod source;
pub mod status;
pub mod subpath;
pub mod types;
pub mod userns;
pub mod worker;

pub use agent::{run, AgentError};
pub use config::{AgentConfig, PlegMode};
