//! Paths a client names: the pod's log directory, a container's log path
//! (relative to it) and cgroup parents. The runtime creates the log
//! directories and the cgroups, so each must be clean (no `.` or `..`), free
//! of NUL, and within the kernel's limits: PATH_MAX (4096 bytes) for a
//! path, NAME_MAX (255) for each component.

use std::path::{Component, Path};

use petrel_oci::spec::shown;

use crate::error::{Result, RuntimeError};

/// Linux's PATH_MAX.
const PATH_MAX: usize = 4096;
/// Linux's NAME_MAX.
const NAME_MAX: usize = 255;

/// Checks the common rules; `what` says what the path must be.
fn common(field: &str, p: &str) -> Result<()> {
    let bad = |why: &str| Err(RuntimeError::invalid(field, format!("{} {why}", shown(p))));
    if p.len() > PATH_MAX {
        return bad(&format!("is longer than {PATH_MAX} bytes"));
    }
    if p.contains('\0') {
        return bad("contains NUL");
    }
    if p.split('/').any(|c| c == "." || c == "..") {
        return bad("has . or .. components");
    }
    if p.split('/').any(|c| c.len() > NAME_MAX) {
        return bad(&format!("has a component longer than {NAME_MAX} bytes"));
    }
    Ok(())
}

/// The pod's log directory: empty (no logs) or an absolute, clean path.
pub(crate) fn log_directory(field: &str, p: &str) -> Result<()> {
    if p.is_empty() {
        return Ok(());
    }
    common(field, p)?;
    if !p.starts_with('/') {
        return Err(RuntimeError::invalid(field, "must be an absolute path"));
    }
    Ok(())
}

/// A container's log path: relative to the pod's log directory, clean.
pub(crate) fn log_path(field: &str, p: &str) -> Result<()> {
    common(field, p)?;
    let path = Path::new(p);
    if path.is_absolute()
        || path
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(RuntimeError::invalid(
            field,
            format!(
                "{} must be relative to the pod's log directory, without . or ..",
                shown(p)
            ),
        ));
    }
    Ok(())
}

/// A cgroupfs path given by a client: absolute and clean.
pub(crate) fn cgroup_path(field: &str, p: &str) -> Result<()> {
    common(field, p)?;
    if !p.starts_with('/') {
        return Err(RuntimeError::invalid(
            field,
            format!("{} must be an absolute cgroup path", shown(p)),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_path_should_stay_inside_the_log_directory() {
        assert!(log_path("config.log_path", "c/0.log").is_ok());
        let long = "a".repeat(256);
        for bad in ["/etc/passwd", "../x.log", "a/../../x", "./x", "a\0b", &long] {
            let e = log_path("config.log_path", bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("config.log_path"), "{bad}: {e}");
        }
    }

    #[test]
    fn log_directory_and_cgroup_paths_should_be_absolute_and_clean() {
        assert!(log_directory("d", "").is_ok());
        assert!(log_directory("d", "/var/log/pods/ns_pod_uid").is_ok());
        assert!(cgroup_path("c", "/kubepods/burstable/pod1").is_ok());
        let huge = format!("/{}", "a/".repeat(3000));
        for bad in ["rel", "/a/../b", "/a/./b", "/a\0", huge.as_str()] {
            assert!(log_directory("d", bad).is_err(), "{bad:?}");
            assert!(cgroup_path("c", bad).is_err(), "{bad:?}");
        }
    }
}
