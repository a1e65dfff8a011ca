//! Security settings shared by the sandbox and its containers: namespace
//! modes, supplemental groups, seccomp and AppArmor profiles.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use petrel_cri::api;

use super::ConvertError;

/// The pod's namespace modes: the host's where the pod asks for them;
/// otherwise the pod's network and IPC, and a pid namespace per container
/// unless the pod shares one.
pub(crate) fn namespace_options(spec: &PodSpec) -> api::NamespaceOption {
    let node = api::NamespaceMode::Node as i32;
    let pod = api::NamespaceMode::Pod as i32;
    let pid = if spec.host_pid == Some(true) {
        node
    } else if spec.share_process_namespace == Some(true) {
        pod
    } else {
        api::NamespaceMode::Container as i32
    };
    api::NamespaceOption {
        network: if spec.host_network == Some(true) {
            node
        } else {
            pod
        },
        pid,
        ipc: if spec.host_ipc == Some(true) {
            node
        } else {
            pod
        },
        ..Default::default()
    }
}

/// The pod's supplemental groups, with its fsGroup (which volumes are
/// meant to be writable by) appended when not already there.
pub(crate) fn supplemental_groups(spec: &PodSpec) -> Vec<i64> {
    let Some(sc) = spec.security_context.as_ref() else {
        return Vec::new();
    };
    let mut groups = sc.supplemental_groups.clone().unwrap_or_default();
    if let Some(fs) = sc.fs_group {
        if !groups.contains(&fs) {
            groups.push(fs);
        }
    }
    groups
}

/// A seccomp or AppArmor profile in CRI form.
pub(crate) fn profile(
    kind: &str,
    localhost: Option<&str>,
    field: &str,
) -> Result<api::SecurityProfile, ConvertError> {
    let profile_type = match kind {
        "RuntimeDefault" => api::security_profile::ProfileType::RuntimeDefault,
        "Unconfined" => api::security_profile::ProfileType::Unconfined,
        "Localhost" => api::security_profile::ProfileType::Localhost,
        other => {
            return Err(ConvertError::invalid(
                format!("{field}.type"),
                format!("unknown profile type {other:?}"),
            ))
        }
    };
    let localhost_ref = localhost.unwrap_or_default().to_string();
    if profile_type == api::security_profile::ProfileType::Localhost && localhost_ref.is_empty() {
        return Err(ConvertError::invalid(
            format!("{field}.localhostProfile"),
            "required with type Localhost",
        ));
    }
    Ok(api::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    })
}

/// The pod's seccomp profile, if set.
pub(crate) fn pod_seccomp(spec: &PodSpec) -> Result<Option<api::SecurityProfile>, ConvertError> {
    spec.security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref())
        .map(|p| {
            profile(
                &p.type_,
                p.localhost_profile.as_deref(),
                "spec.securityContext.seccompProfile",
            )
        })
        .transpose()
}

/// Whether a container asks to be privileged.
pub(crate) fn is_privileged(c: &Container) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}
