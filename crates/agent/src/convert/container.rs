//! The container config.

use k8s_openapi::api::core::v1::Container;
use petrel_cri::api;

use super::{ConvertContext, ConvertError};
use crate::types::DesiredPod;

/// The CRI container config of one container of a pod.
pub fn container_config(
    pod: &DesiredPod,
    container: &Container,
    init: bool,
    restart_count: i32,
    ctx: &ConvertContext,
) -> Result<api::ContainerConfig, ConvertError> {
    let _ = (pod, container, init, restart_count, ctx);
    Ok(api::ContainerConfig::default())
}
