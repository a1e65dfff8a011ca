//! A pod's user namespace request (RunPodSandbox's
//! `config.linux.security_context.namespace_options.userns_options`),
//! checked against the CRI's rules (`petrel_oci::userns::requested`) and
//! what this host can do: a pod is never run in the host's user namespace
//! when it asked for its own.

use petrel_cri::api;
use petrel_oci::spec::{HostLimits, SpecError};
use petrel_oci::userns::UserMappings;

use crate::error::{Result, RuntimeError};
use crate::sandbox::{namespace_mode, Ns};

/// The request's field.
pub(crate) const FIELD: &str = "config.linux.security_context.namespace_options.userns_options";

/// The mappings of the user namespace `config` asks for, if any: INVALID_ARGUMENT
/// for a request the CRI does not allow (see `petrel_oci::userns`) or a pod
/// that also shares the host's network, PID or IPC namespace (Kubernetes
/// forbids `hostUsers: false` with those); FAILED_PRECONDITION when the host
/// cannot (the OCI runtime has no idmapped mounts, as runc before 1.2, or the
/// kernel's overlayfs takes no idmapped layers).
pub(crate) fn pod(
    config: &api::PodSandboxConfig,
    host: &HostLimits,
) -> Result<Option<UserMappings>> {
    let Some(mappings) = requested(config)? else {
        return Ok(None);
    };
    for (ns, name) in [(Ns::Network, "network"), (Ns::Pid, "pid"), (Ns::Ipc, "ipc")] {
        if namespace_mode(config, ns) == api::NamespaceMode::Node {
            return Err(RuntimeError::invalid(
                FIELD,
                format!("a pod sharing the host's {name} namespace cannot have a user namespace of its own"),
            ));
        }
    }
    if !host.user_namespaces {
        return Err(RuntimeError::FailedPrecondition(format!(
            "{FIELD}: user namespaces (mode POD) are not supported on this node: the OCI runtime \
             must support idmapped mounts (runc 1.2 or later; see `runc features`) and the kernel \
             be Linux 5.19 or later"
        )));
    }
    Ok(Some(mappings))
}

/// The mappings `config` asks for, checked against the CRI's rules only
/// (a stored config passed [`pod`] when its pod was made).
pub(crate) fn requested(config: &api::PodSandboxConfig) -> Result<Option<UserMappings>> {
    let opts = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|o| o.userns_options.as_ref());
    petrel_oci::userns::requested(opts, FIELD).map_err(|e| match e {
        SpecError::Invalid { field, reason } => RuntimeError::invalid(field, reason),
        other => RuntimeError::from(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn config(
        userns: Option<api::UserNamespace>,
        network: api::NamespaceMode,
    ) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            linux: Some(api::LinuxPodSandboxConfig {
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        network: network as i32,
                        userns_options: userns,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod_mode(container_id: u32) -> api::UserNamespace {
        let map = vec![api::IdMapping {
            container_id,
            host_id: 1000,
            length: 100_000,
        }];
        api::UserNamespace {
            mode: api::NamespaceMode::Pod as i32,
            uids: map.clone(),
            gids: map,
        }
    }

    fn host(user_namespaces: bool) -> HostLimits {
        let mut h = HostLimits::detect().expect("host limits");
        h.user_namespaces = user_namespaces;
        h
    }

    #[test]
    fn pod_should_read_pod_mode_mappings_where_the_host_supports_them() {
        let c = config(Some(pod_mode(0)), api::NamespaceMode::Pod);
        let m = pod(&c, &host(true)).expect("valid").expect("a userns");
        assert_eq!(m.host_root(), (1000, 1000));
        let none = config(None, api::NamespaceMode::Pod);
        assert_eq!(pod(&none, &host(false)).expect("valid"), None);
    }

    #[test]
    fn pod_should_refuse_pod_mode_where_the_runtime_cannot_naming_the_field() {
        let c = config(Some(pod_mode(0)), api::NamespaceMode::Pod);
        let err = pod(&c, &host(false)).expect_err("refused");
        assert_eq!(err.code(), Code::FailedPrecondition);
        let msg = err.to_string();
        assert!(msg.contains(FIELD) && msg.contains("runc 1.2"), "{msg}");
    }

    #[test]
    fn pod_should_refuse_invalid_mappings_before_asking_the_host() {
        let c = config(Some(pod_mode(1)), api::NamespaceMode::Pod);
        let err = pod(&c, &host(false)).expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.to_string().contains("uids[0].container_id"), "{err}");
    }

    #[test]
    fn pod_should_refuse_a_user_namespace_with_the_host_network() {
        let c = config(Some(pod_mode(0)), api::NamespaceMode::Node);
        let err = pod(&c, &host(true)).expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.to_string().contains("network"), "{err}");
    }
}
