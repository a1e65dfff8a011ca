//! Version, Status, RuntimeConfig and the calls with nothing to do here.

use std::sync::Arc;

use petrel_cri::api;
use petrel_oci::cgroups::systemd::CgroupDriver;

use crate::error::Result;
use crate::service::Runtime;

/// The CRI API version implemented.
pub const CRI_API_VERSION: &str = "v1";
/// The runtime's name in Version.
pub const RUNTIME_NAME: &str = "petrel";

impl Runtime {
    /// Version.
    pub(crate) async fn version(
        self: &Arc<Self>,
        _req: api::VersionRequest,
    ) -> Result<api::VersionResponse> {
        Ok(api::VersionResponse {
            version: "0.1.0".to_string(),
            runtime_name: RUNTIME_NAME.to_string(),
            runtime_version: env!("CARGO_PKG_VERSION").to_string(),
            runtime_api_version: CRI_API_VERSION.to_string(),
        })
    }

    /// Status: the runtime is ready once it serves; the network is ready
    /// when the CNI configuration and its plugins are there (or pods get
    /// loopback only, by configuration). The one handler (`""`) has
    /// recursive read-only mounts when the host does (found at start-up).
    pub(crate) async fn status(
        self: &Arc<Self>,
        req: api::StatusRequest,
    ) -> Result<api::StatusResponse> {
        let net = self.networks.readiness();
        let conditions = vec![
            api::RuntimeCondition {
                r#type: "RuntimeReady".to_string(),
                status: true,
                reason: String::new(),
                message: String::new(),
            },
            api::RuntimeCondition {
                r#type: "NetworkReady".to_string(),
                status: net.ready,
                reason: net.reason,
                message: net.message,
            },
        ];
        let mut info = std::collections::HashMap::new();
        if req.verbose {
            info.insert(
                "config".to_string(),
                serde_json::to_string(&self.config).unwrap_or_default(),
            );
            info.insert(
                "cgroupVersion".to_string(),
                format!("{:?}", self.cgroups.version()),
            );
            info.insert(
                "shim".to_string(),
                self.shims.binary().display().to_string(),
            );
        }
        Ok(api::StatusResponse {
            status: Some(api::RuntimeStatus { conditions }),
            info,
            runtime_handlers: vec![api::RuntimeHandler {
                name: String::new(),
                features: Some(api::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: self.host.recursive_read_only,
                    user_namespaces: self.host.user_namespaces,
                }),
            }],
            // Merge and Strict are both applied (petrel_oci::user), and the
            // process's identity is in ContainerStatus.user.
            features: Some(api::RuntimeFeatures {
                supplemental_groups_policy: true,
                // Pods with host network keep the host's user namespace.
                user_namespaces_host_network: false,
                // Mount.mount_options are refused (CreateContainer).
                mount_options: false,
            }),
        })
    }

    /// RuntimeConfig: the cgroup driver.
    pub(crate) async fn runtime_config(
        self: &Arc<Self>,
        _req: api::RuntimeConfigRequest,
    ) -> Result<api::RuntimeConfigResponse> {
        let driver = match self.config.cgroup_driver {
            CgroupDriver::Cgroupfs => api::CgroupDriver::Cgroupfs,
            CgroupDriver::Systemd => api::CgroupDriver::Systemd,
        };
        Ok(api::RuntimeConfigResponse {
            linux: Some(api::LinuxRuntimeConfiguration {
                cgroup_driver: driver as i32,
            }),
        })
    }

    /// UpdateRuntimeConfig: the pod CIDR is logged. The CNI configuration
    /// in the configuration directory decides pod addresses (no template
    /// is filled from the CIDR, unlike containerd's `conf_template`).
    pub(crate) async fn update_runtime_config(
        self: &Arc<Self>,
        req: api::UpdateRuntimeConfigRequest,
    ) -> Result<api::UpdateRuntimeConfigResponse> {
        if let Some(cidr) = req
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
        {
            tracing::info!(pod_cidr = %cidr, "runtime config updated");
        }
        Ok(api::UpdateRuntimeConfigResponse {})
    }
}

#[cfg(test)]
mod tests {
    use petrel_cri::api;

    use crate::parts::fake::FakeHost;
    use crate::service::Runtime;

    async fn status_of(recursive_read_only: bool, user_namespaces: bool) -> api::StatusResponse {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = FakeHost::new();
        let mut parts = host.parts();
        parts.host.recursive_read_only = recursive_read_only;
        parts.host.user_namespaces = user_namespaces;
        let config = crate::RuntimeConfig {
            root: dir.path().join("root"),
            state: dir.path().join("state"),
            ..Default::default()
        };
        let rt = Runtime::with_parts(config, parts).expect("open runtime");
        rt.status(api::StatusRequest { verbose: false })
            .await
            .expect("status")
    }

    #[tokio::test]
    async fn status_should_report_recursive_read_only_mounts_as_the_host_has_them() {
        for supported in [true, false] {
            let s = status_of(supported, false).await;
            let [handler] = s.runtime_handlers.as_slice() else {
                panic!("one handler expected: {:?}", s.runtime_handlers);
            };
            assert_eq!(handler.name, "");
            let features = handler.features.as_ref().expect("features");
            assert_eq!(features.recursive_read_only_mounts, supported);
            assert!(!features.user_namespaces);
            let runtime = s.features.expect("runtime features");
            assert!(runtime.supplemental_groups_policy);
        }
    }

    #[tokio::test]
    async fn status_should_report_user_namespaces_only_where_the_host_has_them() {
        for supported in [true, false] {
            let s = status_of(true, supported).await;
            let features = s.runtime_handlers[0].features.as_ref().expect("features");
            assert_eq!(features.user_namespaces, supported);
        }
    }
}
