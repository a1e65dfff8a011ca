//! CRI clients on one connection to a runtime under test (Petrel's or
//! containerd), with the calls the end-to-end tests make, and the container
//! and pod configs they build.

#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::test_images::{images_dir, BUSYBOX};

/// CRI clients on one connection.
#[derive(Clone)]
pub struct Clients {
    pub rt: RuntimeServiceClient<Channel>,
    pub img: ImageServiceClient<Channel>,
    pub admin: AdminClient<Channel>,
}

impl Clients {
    /// The runtime's metrics in the Prometheus text format (Admin.Metrics).
    pub async fn metrics(&mut self) -> String {
        self.admin
            .metrics(petrel_cri::admin::MetricsRequest {})
            .await
            .expect("Metrics")
            .into_inner()
            .text
    }

    /// ExecSync of `sh -c script` in container `id` with a timeout in
    /// seconds; the call itself must succeed (the script may fail).
    pub async fn exec_sh(&mut self, id: &str, script: &str, timeout: i64) -> api::ExecSyncResponse {
        self.rt
            .exec_sync(api::ExecSyncRequest {
                container_id: id.to_string(),
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                timeout,
            })
            .await
            .expect("ExecSync")
            .into_inner()
    }

    /// Imports the busybox test image (Petrel's Admin API); returns its id.
    pub async fn import_busybox(&mut self) -> String {
        let path = images_dir().join("busybox-oci.tar");
        let r = self
            .admin
            .import_image(petrel_cri::admin::ImportImageRequest {
                path: path.display().to_string(),
                tags: vec![],
            })
            .await
            .expect("import busybox")
            .into_inner();
        r.images.first().map(|i| i.id.clone()).unwrap_or_default()
    }

    /// RunPodSandbox, returning the id.
    pub async fn run_pod(&mut self, config: api::PodSandboxConfig) -> String {
        self.rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .expect("RunPodSandbox")
            .into_inner()
            .pod_sandbox_id
    }

    /// CreateContainer, returning the id.
    pub async fn create(
        &mut self,
        pod: &str,
        pod_config: &api::PodSandboxConfig,
        config: api::ContainerConfig,
    ) -> Result<String, tonic::Status> {
        self.rt
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.to_string(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    /// CreateContainer + StartContainer.
    pub async fn run(
        &mut self,
        pod: &str,
        pod_config: &api::PodSandboxConfig,
        config: api::ContainerConfig,
    ) -> String {
        let id = self
            .create(pod, pod_config, config)
            .await
            .expect("CreateContainer");
        self.start(&id).await.expect("StartContainer");
        id
    }

    pub async fn start(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .start_container(api::StartContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .map(drop)
    }

    /// The `info` of a verbose ContainerStatus (pid, runtime spec, ...).
    pub async fn verbose_info(&mut self, id: &str) -> serde_json::Value {
        let r = self
            .rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            })
            .await
            .expect("ContainerStatus")
            .into_inner();
        serde_json::from_str(&r.info["info"]).expect("verbose info is JSON")
    }

    /// The pid of a running container's init (from its verbose status).
    pub async fn init_pid(&mut self, id: &str) -> u64 {
        self.verbose_info(id).await["pid"]
            .as_u64()
            .expect("pid in verbose info")
    }

    /// Asserts that ContainerStatus of `id` answers NOT_FOUND.
    pub async fn assert_container_gone(&mut self, id: &str) {
        let err = self
            .rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .expect_err("ContainerStatus of a removed container");
        assert_eq!(err.code(), tonic::Code::NotFound, "{id}");
    }

    pub async fn status(&mut self, id: &str) -> api::ContainerStatus {
        self.rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .status
            .expect("status")
    }

    /// The container's CRI state.
    pub async fn state(&mut self, id: &str) -> api::ContainerState {
        let s = self.status(id).await;
        api::ContainerState::try_from(s.state).expect("state")
    }

    /// Waits until the container reaches `state`.
    pub async fn wait_state(
        &mut self,
        id: &str,
        state: api::ContainerState,
        within: Duration,
    ) -> api::ContainerStatus {
        let within = crate::wait::scaled(within);
        let start = Instant::now();
        loop {
            let s = self.status(id).await;
            if s.state == state as i32 {
                return s;
            }
            assert!(
                start.elapsed() < within,
                "container {id} did not reach {state:?}: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(&mut self, id: &str, timeout: i64) -> Result<(), tonic::Status> {
        self.rt
            .stop_container(api::StopContainerRequest {
                container_id: id.to_string(),
                timeout,
            })
            .await
            .map(drop)
    }

    pub async fn remove(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .remove_container(api::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .map(drop)
    }

    pub async fn remove_pod(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .map(drop)
    }
}

/// A test pod's config: pod network and IPC namespaces, a PID namespace
/// per container, hostname `name`, logs under `log_root/name` and the
/// cgroup `cgroup_parent/name`. The launchers' `pod_config` build on it.
pub fn test_pod_config(
    namespace: &str,
    name: &str,
    log_root: &std::path::Path,
    cgroup_parent: &str,
) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_string(),
            namespace: namespace.to_string(),
            uid: format!("uid-{name}"),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: log_root.join(name).display().to_string(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: format!("{cgroup_parent}/{name}"),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Pod as i32,
                    pid: api::NamespaceMode::Container as i32,
                    ipc: api::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container config running `sh -c script` in the busybox image.
pub fn sh_container(name: &str, script: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: BUSYBOX.to_string(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), script.to_string()],
        log_path: format!("{name}.log"),
        labels: HashMap::from([("container".to_string(), name.to_string())]),
        ..Default::default()
    }
}

/// The namespace options of a pod config made by [`crate::node::Node::pod_config`].
pub fn pod_namespaces(pc: &mut api::PodSandboxConfig) -> &mut api::NamespaceOption {
    pc.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default)
}

/// `cfg` with its own namespace options set to `opts`.
pub fn with_namespaces(
    mut cfg: api::ContainerConfig,
    opts: api::NamespaceOption,
) -> api::ContainerConfig {
    cfg.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = Some(opts);
    cfg
}
