//! Checks of CRI requests made before anything is created: one module per
//! concern ([`names`], [`paths`]); resources and mounts are checked by the
//! spec builder's own rules (`petrel_oci::spec::check_container`), so that
//! what is refused up front and what the builder would refuse cannot drift
//! apart. Errors are INVALID_ARGUMENT naming the field and quoting at most
//! the start of a long value.

pub(crate) mod names;
pub(crate) mod paths;
pub(crate) mod userns;

use petrel_cri::api;
use petrel_oci::cgroups::systemd::CgroupDriver;
use petrel_oci::spec::HostLimits;

use crate::error::{required, Result, RuntimeError};

/// RunPodSandbox's config: the pod's names, log directory, cgroup parent
/// and seccomp request (a `Localhost` profile must exist and parse, though
/// a pause-less pod has no process for it to confine).
///
/// The cgroup parent is checked against the runtime's cgroup driver: an
/// absolute path with cgroupfs, a slice name with systemd, and the other
/// form refused with a message saying which driver takes it.
pub(crate) fn pod_sandbox(config: &api::PodSandboxConfig, driver: CgroupDriver) -> Result<()> {
    let md = required(config.metadata.as_ref(), "config.metadata")?;
    names::pod_metadata(md)?;
    paths::log_directory("config.log_directory", &config.log_directory)?;
    if let Some(l) = &config.linux {
        if !l.cgroup_parent.is_empty() {
            const FIELD: &str = "config.linux.cgroup_parent";
            petrel_oci::cgroups::systemd::pod_cgroup(driver, &l.cgroup_parent)
                .map_err(|e| RuntimeError::invalid(FIELD, e.to_string()))?;
            if driver == CgroupDriver::Cgroupfs {
                paths::cgroup_path(FIELD, &l.cgroup_parent)?;
            }
        }
        petrel_oci::spec::seccomp::check_sandbox_seccomp(l.security_context.as_ref()).map_err(
            |e| match e {
                petrel_oci::spec::SpecError::Invalid { field, reason } => {
                    RuntimeError::invalid(format!("config.{field}"), reason)
                }
                other => RuntimeError::from(other),
            },
        )?;
    }
    Ok(())
}

/// CreateContainer's config in its pod: the container's name, log path,
/// resources and mounts.
pub(crate) fn container(
    config: &api::ContainerConfig,
    sandbox: &api::PodSandboxConfig,
    host: &HostLimits,
) -> Result<()> {
    let md = required(config.metadata.as_ref(), "config.metadata")?;
    names::container_metadata(md)?;
    if !config.log_path.is_empty() {
        paths::log_path("config.log_path", &config.log_path)?;
    }
    petrel_oci::spec::check_container(config, sandbox, host).map_err(|e| match e {
        // The spec builder names resources from `resources.`: the
        // request's path is `config.linux.resources.`.
        petrel_oci::spec::SpecError::Invalid { field, reason }
            if field.starts_with("resources.") =>
        {
            RuntimeError::invalid(format!("config.linux.{field}"), reason)
        }
        petrel_oci::spec::SpecError::Invalid { field, reason } => {
            RuntimeError::invalid(format!("config.{field}"), reason)
        }
        other => RuntimeError::from(other),
    })
}
