//! Checkpoint and restore of containers with CRIU (through runc).
//!
//! CheckpointContainer (`dump.rs`) dumps a running container with `runc
//! checkpoint --leave-running` (kubelet's forensic checkpoint: the
//! container goes on) and writes the checkpoint archive (`archive.rs`) to
//! the location asked for. A restore is a CreateContainer whose image is
//! the path of such an archive, as with containerd and CRI-O
//! (`restore.rs`): the container is made from the archive's base image,
//! its writable layer from the archive's rootfs diff, and its shim runs
//! `runc restore` from the archive's CRIU images instead of `runc create`.

pub mod archive;
mod dump;
pub(crate) mod restore;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use crate::error::{Result, RuntimeError};
use crate::service::Runtime;

impl Runtime {
    /// The CRIU binary (`criu_binary`: a path, or a name looked up on
    /// PATH now), or FAILED_PRECONDITION naming what was looked for.
    pub(crate) fn criu_binary(&self) -> Result<PathBuf> {
        let configured = &self.config.criu_binary;
        let found = if configured.components().count() > 1 {
            configured.is_file().then(|| configured.clone())
        } else {
            crate::parts::on_path(&configured.to_string_lossy())
        };
        found.ok_or_else(|| {
            RuntimeError::FailedPrecondition(format!(
                "checkpoint/restore needs CRIU: {} not found (set criu_binary)",
                configured.display()
            ))
        })
    }
}
