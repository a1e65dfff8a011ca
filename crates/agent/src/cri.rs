//! The agent's view of a CRI runtime, as two traits so each part holds
//! only what it needs and is unit-tested against a fake:
//! [`RuntimeObserver`], the calls that change nothing (the PLEG, the
//! server, eviction's statistics), and [`RuntimeActuator`], the calls that
//! do (the pod workers, probes, eviction's reclaim). [`CriRuntime`]
//! implements both over gRPC, for any CRI runtime (Petrel's, containerd,
//! CRI-O), counting every call in kubelet's `runtime_operations_*`
//! metrics.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures_util::Stream;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
pub use petrel_cri::ContainerSummary;
use tonic::transport::Channel;

use crate::metrics::{AgentMetrics, OperationLabels};
use crate::types::{LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};

/// The container labels [`RuntimeObserver::list_containers`] keeps: the pod a
/// container belongs to.
pub const LISTED_LABELS: &[&str] = &[LABEL_POD_UID, LABEL_POD_NAME, LABEL_POD_NAMESPACE];

/// A CRI call that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{operation}: {code:?}: {message}")]
pub struct CriError {
    /// The CRI operation, e.g. `create_container`.
    pub operation: &'static str,
    /// The gRPC status code.
    pub code: tonic::Code,
    /// The runtime's message.
    pub message: String,
}

impl CriError {
    fn new(operation: &'static str, s: tonic::Status) -> Self {
        Self {
            operation,
            code: s.code(),
            message: s.message().to_string(),
        }
    }

    /// The runtime does not know the object (already gone).
    pub fn is_not_found(&self) -> bool {
        self.code == tonic::Code::NotFound
    }

    /// The runtime does not implement the call.
    pub fn is_unimplemented(&self) -> bool {
        self.code == tonic::Code::Unimplemented
    }

    /// The runtime could not be reached at all.
    pub fn is_unavailable(&self) -> bool {
        self.code == tonic::Code::Unavailable
    }
}

/// Result of a CRI call.
pub type CriResult<T> = Result<T, CriError>;

/// A stream of container events.
pub type EventStream = Pin<Box<dyn Stream<Item = CriResult<api::ContainerEventResponse>> + Send>>;

/// Output of ExecSync.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    /// Captured stdout.
    pub stdout: Vec<u8>,
    /// Captured stderr.
    pub stderr: Vec<u8>,
    /// Exit code.
    pub exit_code: i32,
}

/// What the agent asks a CRI runtime without changing anything: the
/// PLEG's listings and inspections, the server's status, logs and stream
/// set-ups, and eviction's statistics. (Exec, Attach and PortForward only
/// ask for a URL: what runs there is the client's doing.)
#[async_trait::async_trait]
pub trait RuntimeObserver: Send + Sync + 'static {
    /// Version: the runtime's name and version.
    async fn version(&self) -> CriResult<api::VersionResponse>;
    /// Status: runtime and network readiness.
    async fn status(&self) -> CriResult<api::RuntimeStatus>;
    /// Status's runtime handlers and their features (recursive read-only
    /// mounts, user namespaces). A runtime that reports none has only a
    /// default handler without them.
    async fn runtime_handlers(&self) -> CriResult<Vec<api::RuntimeHandler>> {
        Ok(Vec::new())
    }
    /// RuntimeConfig: the runtime's Linux settings (its cgroup driver). A
    /// runtime without the call answers Unimplemented.
    async fn runtime_config(&self) -> CriResult<api::RuntimeConfigResponse>;
    /// ListPodSandbox with the given label selector (empty: all).
    async fn list_pod_sandboxes(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::PodSandbox>>;
    /// ListContainers with the given label selector (empty: all), each
    /// container summarised: ids, state, creation time and the labels in
    /// [`LISTED_LABELS`] (all a relist needs; decoding less is most of a
    /// large relist's saving).
    async fn list_containers(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<ContainerSummary>>;
    /// PodSandboxStatus (not verbose).
    async fn pod_sandbox_status(&self, id: &str) -> CriResult<api::PodSandboxStatus>;
    /// ContainerStatus (not verbose).
    async fn container_status(&self, id: &str) -> CriResult<api::ContainerStatus>;
    /// ImageStatus: the image if present.
    async fn image_status(&self, image: &str) -> CriResult<Option<api::Image>>;
    /// GetContainerEvents: the runtime's event stream.
    async fn container_events(&self) -> CriResult<EventStream>;
    /// ImageFsInfo: the image and container filesystems' usage and mount
    /// points.
    async fn image_fs_info(&self) -> CriResult<api::ImageFsInfoResponse>;
    /// ListContainerStats of the containers with the given labels (empty:
    /// all): each one's writable layer, CPU and memory.
    async fn list_container_stats(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::ContainerStats>>;
    /// ListImages.
    async fn list_images(&self) -> CriResult<Vec<api::Image>>;
    /// The images (ids and references) of every container of the runtime,
    /// any state, anyone's: what image reclaim must keep.
    async fn images_in_use(&self) -> CriResult<std::collections::HashSet<String>>;
    /// Exec: prepares a streaming exec; returns the URL of the runtime's
    /// streaming server to which the client's upgrade is proxied.
    async fn exec(&self, req: api::ExecRequest) -> CriResult<String>;
    /// Attach: prepares a streaming attach; returns its URL.
    async fn attach(&self, req: api::AttachRequest) -> CriResult<String>;
    /// PortForward: prepares port forwarding into a sandbox; returns its URL.
    async fn port_forward(&self, req: api::PortForwardRequest) -> CriResult<String>;
}

/// What changes the runtime: the pod workers' calls (sandboxes,
/// containers, images, hooks), the probes' exec and eviction's reclaim
/// (dead containers, unused images). It observes too.
#[async_trait::async_trait]
pub trait RuntimeActuator: RuntimeObserver {
    /// RunPodSandbox; returns the sandbox id.
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig) -> CriResult<String>;
    /// StopPodSandbox.
    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()>;
    /// RemovePodSandbox.
    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()>;
    /// CreateContainer; returns the container id.
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> CriResult<String>;
    /// StartContainer.
    async fn start_container(&self, id: &str) -> CriResult<()>;
    /// StopContainer with a grace period in seconds.
    async fn stop_container(&self, id: &str, timeout_secs: i64) -> CriResult<()>;
    /// RemoveContainer.
    async fn remove_container(&self, id: &str) -> CriResult<()>;
    /// ExecSync with a timeout in seconds (0: none).
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> CriResult<ExecOutput>;
    /// PullImage with registry credentials `auth` (none: the runtime's
    /// own, if any); returns the image reference.
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String>;
    /// RemoveImage by id.
    async fn remove_image(&self, id: &str) -> CriResult<()>;
}

/// [`RuntimeObserver`] and [`RuntimeActuator`] over a CRI gRPC channel.
#[derive(Clone)]
pub struct CriRuntime {
    rt: RuntimeServiceClient<Channel>,
    /// The relist's two calls, decoded at prost's fastest.
    list: petrel_cri::ListClient,
    img: ImageServiceClient<Channel>,
    metrics: AgentMetrics,
    timeout: Duration,
}

impl CriRuntime {
    /// A client on `endpoint` (`unix:///path`); the connection is made on
    /// first use and remade after the runtime restarts.
    pub fn new(
        endpoint: &str,
        metrics: AgentMetrics,
        timeout: Duration,
    ) -> Result<Self, petrel_cri::ClientError> {
        let channel = petrel_cri::connect_lazy(endpoint)?;
        Ok(Self {
            rt: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20),
            list: petrel_cri::ListClient::new(channel.clone()).max_decoding_message_size(64 << 20),
            img: ImageServiceClient::new(channel).max_decoding_message_size(64 << 20),
            metrics,
            timeout,
        })
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.timeout);
        r
    }

    async fn observe<T, F>(&self, op: &'static str, fut: F) -> CriResult<T>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let labels = OperationLabels {
            operation_type: op.to_string(),
        };
        let start = Instant::now();
        let r = fut.await;
        self.metrics.runtime_operations.get_or_create(&labels).inc();
        self.metrics
            .runtime_operations_duration
            .get_or_create(&labels)
            .observe(start.elapsed().as_secs_f64());
        match r {
            Ok(resp) => Ok(resp.into_inner()),
            Err(s) => {
                self.metrics
                    .runtime_operations_errors
                    .get_or_create(&labels)
                    .inc();
                Err(CriError::new(op, s))
            }
        }
    }
}

#[async_trait::async_trait]
impl RuntimeObserver for CriRuntime {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        let mut c = self.rt.clone();
        let req = self.request(api::VersionRequest {
            version: "v1".to_string(),
        });
        self.observe("version", c.version(req)).await
    }

    async fn status(&self) -> CriResult<api::RuntimeStatus> {
        let mut c = self.rt.clone();
        let req = self.request(api::StatusRequest { verbose: false });
        let r = self.observe("status", c.status(req)).await?;
        Ok(r.status.unwrap_or_default())
    }

    async fn runtime_handlers(&self) -> CriResult<Vec<api::RuntimeHandler>> {
        let mut c = self.rt.clone();
        let req = self.request(api::StatusRequest { verbose: false });
        Ok(self
            .observe("status", c.status(req))
            .await?
            .runtime_handlers)
    }

    async fn runtime_config(&self) -> CriResult<api::RuntimeConfigResponse> {
        let mut c = self.rt.clone();
        let req = self.request(api::RuntimeConfigRequest {});
        self.observe("runtime_config", c.runtime_config(req)).await
    }

    async fn list_pod_sandboxes(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        let mut c = self.list.clone();
        let req = self.request(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: labels,
                ..Default::default()
            }),
        });
        Ok(self
            .observe("list_podsandbox", c.list_pod_sandbox(req))
            .await?
            .items)
    }

    async fn list_containers(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<ContainerSummary>> {
        let mut c = self.list.clone();
        let req = self.request(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: labels,
                ..Default::default()
            }),
        });
        self.observe(
            "list_containers",
            c.list_container_summaries(req, LISTED_LABELS),
        )
        .await
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<api::PodSandboxStatus> {
        let mut c = self.rt.clone();
        let req = self.request(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: false,
        });
        let r = self
            .observe("podsandbox_status", c.pod_sandbox_status(req))
            .await?;
        r.status.ok_or_else(|| CriError {
            operation: "podsandbox_status",
            code: tonic::Code::Internal,
            message: format!("runtime returned no status for sandbox {id}"),
        })
    }

    async fn container_status(&self, id: &str) -> CriResult<api::ContainerStatus> {
        let mut c = self.rt.clone();
        let req = self.request(api::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        });
        let r = self
            .observe("container_status", c.container_status(req))
            .await?;
        r.status.ok_or_else(|| CriError {
            operation: "container_status",
            code: tonic::Code::Internal,
            message: format!("runtime returned no status for container {id}"),
        })
    }

    async fn image_fs_info(&self) -> CriResult<api::ImageFsInfoResponse> {
        let mut c = self.img.clone();
        let req = self.request(api::ImageFsInfoRequest {});
        self.observe("image_fs_info", c.image_fs_info(req)).await
    }

    async fn list_container_stats(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::ContainerStats>> {
        let mut c = self.rt.clone();
        let req = self.request(api::ListContainerStatsRequest {
            filter: Some(api::ContainerStatsFilter {
                label_selector: labels,
                ..Default::default()
            }),
        });
        Ok(self
            .observe("list_container_stats", c.list_container_stats(req))
            .await?
            .stats)
    }

    async fn list_images(&self) -> CriResult<Vec<api::Image>> {
        let mut c = self.img.clone();
        let req = self.request(api::ListImagesRequest { filter: None });
        Ok(self
            .observe("list_images", c.list_images(req))
            .await?
            .images)
    }

    async fn images_in_use(&self) -> CriResult<std::collections::HashSet<String>> {
        let mut c = self.rt.clone();
        let req = self.request(api::ListContainersRequest { filter: None });
        let list = self
            .observe("list_containers", c.list_containers(req))
            .await?;
        let mut used = std::collections::HashSet::new();
        for ctr in list.containers {
            used.insert(ctr.image_ref);
            if let Some(spec) = ctr.image {
                used.insert(spec.image);
            }
        }
        used.remove("");
        Ok(used)
    }

    async fn image_status(&self, image: &str) -> CriResult<Option<api::Image>> {
        let mut c = self.img.clone();
        let req = self.request(api::ImageStatusRequest {
            image: Some(api::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            verbose: false,
        });
        Ok(self
            .observe("image_status", c.image_status(req))
            .await?
            .image)
    }

    async fn exec(&self, req: api::ExecRequest) -> CriResult<String> {
        let mut c = self.rt.clone();
        let req = self.request(req);
        Ok(self.observe("exec", c.exec(req)).await?.url)
    }

    async fn attach(&self, req: api::AttachRequest) -> CriResult<String> {
        let mut c = self.rt.clone();
        let req = self.request(req);
        Ok(self.observe("attach", c.attach(req)).await?.url)
    }

    async fn port_forward(&self, req: api::PortForwardRequest) -> CriResult<String> {
        let mut c = self.rt.clone();
        let req = self.request(req);
        Ok(self.observe("port_forward", c.port_forward(req)).await?.url)
    }

    async fn container_events(&self) -> CriResult<EventStream> {
        use tokio_stream::StreamExt;
        // A dead runtime is an error here rather than a stream that never
        // starts.
        self.version().await?;
        let mut c = self.rt.clone();
        // No deadline: the stream lives until the runtime or agent ends it.
        let req = tonic::Request::new(api::GetEventsRequest {});
        // containerd 1.7 sends the response headers only with the first
        // event, so the call itself would block until something happens:
        // the subscription is made now, and waiting for the headers is
        // the stream's first step (an error then, such as UNIMPLEMENTED,
        // is its first item).
        // The call runs in a task of its own, started now, so the
        // subscription exists before the caller's first relist; it ends
        // when the receiver is dropped.
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(async move {
            let op = "get_container_events";
            let resp = tokio::select! {
                r = c.get_container_events(req) => r,
                () = tx.closed() => return,
            };
            let mut inner = match resp {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    let _ = tx.send(Err(CriError::new(op, s))).await;
                    return;
                }
            };
            loop {
                let item = tokio::select! {
                    i = inner.next() => i,
                    () = tx.closed() => return,
                };
                let Some(item) = item else { return };
                if tx
                    .send(item.map_err(|s| CriError::new(op, s)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Box::pin(stream))
    }
}

#[async_trait::async_trait]
impl RuntimeActuator for CriRuntime {
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig) -> CriResult<String> {
        let mut c = self.rt.clone();
        // Sandbox creation may include CNI and image work: a longer deadline.
        let mut req = tonic::Request::new(api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        });
        req.set_timeout(self.timeout.max(Duration::from_secs(240)));
        Ok(self
            .observe("run_podsandbox", c.run_pod_sandbox(req))
            .await?
            .pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let mut c = self.rt.clone();
        let req = self.request(api::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        });
        self.observe("stop_podsandbox", c.stop_pod_sandbox(req))
            .await
            .map(|_| ())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let mut c = self.rt.clone();
        let req = self.request(api::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        });
        self.observe("remove_podsandbox", c.remove_pod_sandbox(req))
            .await
            .map(|_| ())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> CriResult<String> {
        let mut c = self.rt.clone();
        let req = self.request(api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        });
        Ok(self
            .observe("create_container", c.create_container(req))
            .await?
            .container_id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        let mut c = self.rt.clone();
        let req = self.request(api::StartContainerRequest {
            container_id: id.to_string(),
        });
        self.observe("start_container", c.start_container(req))
            .await
            .map(|_| ())
    }

    async fn stop_container(&self, id: &str, timeout_secs: i64) -> CriResult<()> {
        let mut c = self.rt.clone();
        let mut req = tonic::Request::new(api::StopContainerRequest {
            container_id: id.to_string(),
            timeout: timeout_secs,
        });
        // The call lasts as long as the grace period, plus the runtime's work.
        req.set_timeout(self.timeout + Duration::from_secs(timeout_secs.max(0) as u64));
        self.observe("stop_container", c.stop_container(req))
            .await
            .map(|_| ())
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        let mut c = self.rt.clone();
        let req = self.request(api::RemoveContainerRequest {
            container_id: id.to_string(),
        });
        self.observe("remove_container", c.remove_container(req))
            .await
            .map(|_| ())
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> CriResult<ExecOutput> {
        let mut c = self.rt.clone();
        let mut req = tonic::Request::new(api::ExecSyncRequest {
            container_id: id.to_string(),
            cmd,
            timeout: timeout_secs,
        });
        req.set_timeout(self.timeout + Duration::from_secs(timeout_secs.max(0) as u64));
        let r = self.observe("exec_sync", c.exec_sync(req)).await?;
        Ok(ExecOutput {
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
        })
    }

    async fn remove_image(&self, id: &str) -> CriResult<()> {
        let mut c = self.img.clone();
        let req = self.request(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: id.to_string(),
                ..Default::default()
            }),
        });
        self.observe("remove_image", c.remove_image(req)).await?;
        Ok(())
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        let mut c = self.img.clone();
        let req = tonic::Request::new(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            auth,
            sandbox_config,
        });
        // No deadline, as kubelet sets none: the runtime stops a pull whose
        // caller gives up, so a deadline would fail every pull longer than
        // it for good. A stalled registry fails the pull by itself (the
        // runtime's registry client has connect and read timeouts).
        Ok(self
            .observe("pull_image", c.pull_image(req))
            .await?
            .image_ref)
    }
}
