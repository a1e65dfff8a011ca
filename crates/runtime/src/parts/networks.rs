//! The network seam of pod sandboxes: which network new pods join, and
//! each pod's attachment to it (ADD, DEL, CHECK). The real one is CNI
//! ([`CniNetworks`], in `sandbox::network`); the pod's network namespace is pinned through
//! [`super::PodKernel`] before ADD and released after DEL.

use petrel_cni::NetworkList;

use crate::error::Result;
use crate::records::{NetworkRecord, SandboxRecord};
pub use crate::sandbox::network::{CniNetworks, Readiness};

/// Pod networking as RunPodSandbox, StopPodSandbox, RemovePodSandbox,
/// PodSandboxStatus, Status and recovery use it.
#[async_trait::async_trait]
pub trait PodNetworking: Send + Sync + std::fmt::Debug {
    /// The network new pods join: `Ok(None)` when pods get loopback only;
    /// an error (FAILED_PRECONDITION) when pods are networked but the
    /// network is not usable now.
    fn current(&self) -> Result<Option<NetworkList>>;

    /// NetworkReady, as Status reports it.
    fn readiness(&self) -> Readiness;

    /// ADD: attaches the pod in `rec` (its namespace pinned, its intent
    /// recorded) to `list`; what the record keeps of it is returned.
    async fn add(&self, list: &NetworkList, rec: &SandboxRecord) -> Result<NetworkRecord>;

    /// DEL: releases the pod's network as recorded in `net`, also when its
    /// namespace is gone or its ADD never finished.
    async fn del(&self, rec: &SandboxRecord, net: &NetworkRecord) -> Result<()>;

    /// CHECK: whether the pod's network is still as ADD made it; `Ok(None)`
    /// when the network has no CHECK.
    async fn check(&self, rec: &SandboxRecord, net: &NetworkRecord) -> Result<Option<()>>;
}
