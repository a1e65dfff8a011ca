//! Kubernetes pod spec → CRI configs: the sandbox config of a pod, the
//! container config of each container, the QoS class and cgroup layout,
//! the spec hash that decides restarts, and the pod's volume directories.
//!
//! Everything here is a pure function of the pod and a [`ConvertContext`]
//! (except [`prepare_volumes`] and [`remove_pod_dir`], which touch only the
//! pod's own directories), so the pod workers stay thin and this stays
//! testable. A container's subPaths come out as [`SubPathMount`]s: the
//! worker binds them (see [`crate::subpath`]) just before it creates the
//! container.

mod api_volumes;
mod atomic;
mod container;
mod dns;
mod downward;
mod env;
mod hash;
mod hosts;
mod qos;
mod resources;
mod sandbox;
mod security;
mod service_env;
mod trust_bundles;
mod volumes;

use std::path::PathBuf;

pub use api_volumes::{
    api_volume_payload, is_api_volume, service_account, token_keys, Lookup, ObjectView, Objects,
    TokenKey,
};
pub use atomic::{FileProjection, Payload};
pub use container::{
    container_config, container_plan, is_sidecar, ContainerPlan,
    ANNOTATION_TERMINATION_MESSAGE_PATH, DEFAULT_TERMINATION_GRACE_SECONDS,
};
pub use dns::DnsSettings;
pub use downward::{
    format_map, go_quote, DEFAULT_MODE as DOWNWARD_API_DEFAULT_MODE,
    FIELD_PATHS as DOWNWARD_API_FIELD_PATHS,
};
pub use hash::{container_hash, sandbox_hash};
pub use hosts::write_hosts_file;
pub(crate) use qos::effective_request;
pub use qos::{pod_cgroup_parent, qos_class, QosClass};
pub use resources::{linux_resources, node_memory_bytes, oom_score_adj};
pub use sandbox::sandbox_config;
pub use service_env::service_env;
pub use trust_bundles::{selector_matches, TrustBundle};
pub use volumes::{
    image_volume_reference, prepare_volumes, refresh_volumes, remove_pod_dir, SubPathMount,
};

/// What a conversion needs to know about the node and the pod's place on
/// it, beyond the pod itself.
#[derive(Debug, Clone, Default)]
pub struct ConvertContext {
    /// This node's name (spec.nodeName, and the managed-by label's value).
    pub node_name: String,
    /// Where the pods' cgroups are (driver and root): the sandbox's cgroup
    /// parent comes from it.
    pub cgroups: crate::qos_cgroups::CgroupLayout,
    /// The pod's directory, `<agent root>/pods/<uid>` (emptyDir volumes).
    pub pod_dir: PathBuf,
    /// The pod's subPath mount points, `<agent root>/volume-subpaths/<uid>`.
    pub sub_path_dir: PathBuf,
    /// The pod's log directory, `<agent root>/logs/<ns>_<name>_<uid>`.
    pub log_dir: PathBuf,
    /// The pod's IPs when known (status.podIP(s) fieldRefs).
    pub pod_ips: Vec<String>,
    /// The node's IP (status.hostIP fieldRefs, hostNetwork pods).
    pub host_ip: String,
    /// Where `Localhost` seccomp profiles are (`<agent root>/seccomp`).
    pub seccomp_root: PathBuf,
    /// kubelet's `seccompDefault`: no profile means `RuntimeDefault`.
    pub seccomp_default: bool,
    /// Whether the runtime's default handler supports recursive read-only
    /// mounts (`recursiveReadOnly`).
    pub recursive_read_only: bool,
    /// The pod's user-namespace range (`hostUsers: false`): the host id of
    /// its root, 65536 ids from there ([`crate::userns`]); an error when
    /// none could be had (the pod is then refused, never run in the host's
    /// user namespace); `None` for pods on the host's.
    pub userns: Option<Result<u32, String>>,
    /// The API objects of cluster mode (configMap, secret and projected
    /// volumes, environment from them); `None` for a node without an API
    /// server, whose pods cannot use them.
    pub objects: Option<Objects>,
    /// Whether secret and projected volumes get a tmpfs of their own (the
    /// agent as root; off in unit tests).
    pub memory_volumes: bool,
    /// kubelet's DNS settings (`--cluster-dns`, `--cluster-domain`,
    /// `--resolv-conf`).
    pub dns: DnsSettings,
    /// The pod's service variables ([`service_env`]; cluster mode), set
    /// where containers are created: the container's own variables win.
    pub service_env: Vec<(String, String)>,
}

/// The pod's `securityContext.fsGroup`, if it is a group id.
pub(crate) fn fs_group(pod: &crate::types::DesiredPod) -> Option<u32> {
    let g = pod.pod.spec.as_ref()?.security_context.as_ref()?.fs_group?;
    u32::try_from(g).ok()
}

/// Why a pod spec cannot be turned into CRI configs. Messages name the
/// field concerned.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A field whose value is unusable (bad quantity, unknown fieldRef,
    /// unsafe subPath, ...).
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field path, e.g. `spec.containers[app].env[FOO].valueFrom`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A feature the agent does not support yet (configMap/secret sources,
    /// volume types other than emptyDir, hostPath and downwardAPI, ...).
    #[error("unsupported {field}: {reason}")]
    Unsupported {
        /// The field path.
        field: String,
        /// What is not supported.
        reason: String,
    },
    /// An API object (or a key of it, or a token) the pod needs is not
    /// there, or not known yet: retried, and shown with kubelet's words.
    #[error("{0}")]
    Missing(String),
    /// An I/O error while preparing the pod's volumes.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation, e.g. "create emptyDir".
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl ConvertError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Unsupported {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod test_support {
    //! Builders shared by the conversion and status tests.

    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::ConvertContext;
    use crate::types::DesiredPod;

    /// A desired pod from YAML, with the UID set as a source would.
    pub fn desired(yaml: &str) -> DesiredPod {
        let mut pod: Pod = serde_yaml::from_str(yaml).unwrap();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let uid = format!("uid-{name}");
        pod.metadata.uid = Some(uid.clone());
        DesiredPod {
            uid,
            namespace,
            name,
            pod: Arc::new(pod),
            source: crate::types::PodOrigin::File(PathBuf::from("/manifests/pod.yaml")),
            invalid: None,
        }
    }

    /// A context with fixed values.
    pub fn ctx() -> ConvertContext {
        ConvertContext {
            node_name: "node-1".to_string(),
            cgroups: crate::qos_cgroups::CgroupLayout::new(
                crate::qos_cgroups::CgroupDriver::Cgroupfs,
                "/petrel",
            )
            .unwrap_or_default(),
            pod_dir: PathBuf::from("/var/lib/petrel/pods/uid"),
            sub_path_dir: PathBuf::from("/var/lib/petrel/volume-subpaths/uid"),
            log_dir: PathBuf::from("/var/lib/petrel/logs/ns_name_uid"),
            pod_ips: vec!["10.0.0.5".to_string(), "fd00::5".to_string()],
            host_ip: "192.168.1.10".to_string(),
            seccomp_root: PathBuf::from("/var/lib/petrel/seccomp"),
            seccomp_default: false,
            recursive_read_only: true,
            userns: None,
            objects: None,
            memory_volumes: false,
            dns: super::DnsSettings::default(),
            service_env: Vec::new(),
        }
    }

    fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        })
    }

    /// A container with these requests and limits.
    pub fn container_with(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: "c".to_string(),
            image: Some("busybox".to_string()),
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}
