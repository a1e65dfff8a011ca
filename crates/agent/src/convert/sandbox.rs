//! The pod sandbox config.

use petrel_cri::api;

use super::{ConvertContext, ConvertError};
use crate::types::DesiredPod;

/// The CRI sandbox config of a pod.
pub fn sandbox_config(
    pod: &DesiredPod,
    attempt: u32,
    ctx: &ConvertContext,
) -> Result<api::PodSandboxConfig, ConvertError> {
    let _ = (pod, attempt, ctx);
    Ok(api::PodSandboxConfig::default())
}
