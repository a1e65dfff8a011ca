//! Container resources: cpu shares, quota and memory limit from requests
//! and limits, and the OOM score adjustment from the QoS class.

use k8s_openapi::api::core::v1::Container;
use petrel_cri::api;

use super::QosClass;

/// The node's memory in bytes (MemTotal), read once.
pub fn node_memory_bytes() -> i64 {
    0
}

/// The OOM score adjustment of a container.
pub fn oom_score_adj(qos: QosClass, memory_request: i64, node_memory: i64) -> i64 {
    let _ = (qos, memory_request, node_memory);
    0
}

/// The container's Linux resources.
pub fn linux_resources(
    container: &Container,
    qos: QosClass,
    node_memory: i64,
) -> api::LinuxContainerResources {
    let _ = (container, qos, node_memory);
    api::LinuxContainerResources::default()
}
