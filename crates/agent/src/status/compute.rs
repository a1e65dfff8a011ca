//! The Kubernetes status of a pod, from the runtime's view and the pod
//! worker's hints.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use crate::types::{DesiredPod, PodHints, PodRuntimeStatus};

/// What status computation needs beyond the pod and the runtime.
#[derive(Debug, Clone, Copy)]
pub struct StatusContext<'a> {
    /// The node's IP (status.hostIP, and podIP of hostNetwork pods).
    pub host_ip: &'a str,
    /// The runtime's name for container IDs, `<name>://<id>`.
    pub runtime_name: &'a str,
    /// The current time.
    pub now: SystemTime,
}

/// The pod's Kubernetes status.
pub fn compute_pod_status(
    pod: &DesiredPod,
    runtime: Option<&PodRuntimeStatus>,
    hints: &PodHints,
    ctx: &StatusContext,
) -> PodStatus {
    let _ = (pod, runtime, hints, ctx);
    PodStatus::default()
}

/// The pod as published at `/pods`.
pub fn published_pod(
    pod: &DesiredPod,
    status: PodStatus,
    terminating_since: Option<SystemTime>,
) -> Pod {
    let _ = (pod, terminating_since);
    Pod {
        status: Some(status),
        ..Pod::default()
    }
}
