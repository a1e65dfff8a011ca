//! CheckpointContainer: the request checked, then the container
//! checkpointed into an archive at `location` (`checkpoint::dump`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use petrel_cri::api;

use crate::error::{non_empty, Result, RuntimeError};
use crate::service::Runtime;

/// The bound of a checkpoint whose request names none (`timeout` 0).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Checks that the archive can be written at `location` before anything
/// is dumped: an absolute path in an existing directory this process may
/// write to, not a directory itself.
fn check_location(location: &str) -> Result<&Path> {
    let path = Path::new(non_empty(location, "location")?);
    let bad = |reason: String| RuntimeError::invalid("location", reason);
    if !path.is_absolute() || path.file_name().is_none() {
        return Err(bad(format!("{location:?} is not an absolute file path")));
    }
    if path.is_dir() {
        return Err(bad(format!("{location:?} is a directory")));
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    if !dir.is_dir() {
        return Err(bad(format!("directory {} does not exist", dir.display())));
    }
    rustix::fs::access(dir, rustix::fs::Access::WRITE_OK)
        .map_err(|e| bad(format!("directory {} is not writable: {e}", dir.display())))?;
    Ok(path)
}

impl Runtime {
    /// CheckpointContainer.
    pub(crate) async fn checkpoint_container(
        self: &Arc<Self>,
        req: api::CheckpointContainerRequest,
    ) -> Result<api::CheckpointContainerResponse> {
        let c = self.container(&req.container_id)?;
        let location = check_location(&req.location)?;
        let timeout = match u64::try_from(req.timeout) {
            Ok(0) => DEFAULT_TIMEOUT,
            Ok(secs) => Duration::from_secs(secs),
            Err(_) => {
                return Err(RuntimeError::invalid(
                    "timeout",
                    format!("{} is negative", req.timeout),
                ))
            }
        };
        self.container_checkpoint(&c, location, timeout).await?;
        Ok(api::CheckpointContainerResponse {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_location_should_name_the_field_and_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = dir.path().join("cp.tar");
        assert_eq!(
            check_location(&ok.display().to_string()).expect("ok"),
            ok.as_path()
        );
        for (location, reason) in [
            ("", "location"),
            ("relative/cp.tar", "not an absolute file path"),
            ("/nonexistent-petrel-dir/cp.tar", "does not exist"),
        ] {
            let err = check_location(location).expect_err(location);
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
            let msg = err.to_string();
            assert!(msg.contains("location") && msg.contains(reason), "{msg}");
        }
        let err = check_location(&dir.path().display().to_string()).expect_err("a directory");
        assert!(err.to_string().contains("is a directory"), "{err}");
    }
}
