//! The gRPC face of the runtime: CRI `RuntimeService` and `ImageService`,
//! and Petrel's admin API, served on one unix socket.
//!
//! Every call goes through `CriServer::call`, which refuses calls until
//! start-up recovery is done, runs a mutating call's handler in its own
//! task (a client that hangs up cannot cancel a create halfway) and a
//! read's on the connection's task (no spawn per List or Status call),
//! turns a panic into an `INTERNAL` error instead of taking the daemon
//! down, records metrics, logs mutating calls, and converts errors to gRPC
//! codes in one place.

pub mod admin;
pub mod container_checkpoint;
pub mod container_create;
pub mod container_exec;
pub mod container_list;
pub mod container_log;
pub mod container_remove;
pub mod container_start;
pub mod container_stats_stream;
pub mod container_stop;
pub mod container_stream;
pub mod container_update;
pub mod deadline;
pub mod events;
pub mod fast_list;
pub mod image_export;
pub mod image_gc;
pub mod image_pull;
pub mod image_stream;
pub mod images;
#[cfg(test)]
mod list_perf;
pub mod list_stream;
pub mod metric_descriptors;
pub mod pod_checkpoint;
pub mod runtime_info;
pub mod sandbox_list;
pub mod sandbox_metrics;
pub mod sandbox_metrics_stream;
pub mod sandbox_remove;
pub mod sandbox_run;
pub mod sandbox_stats_stream;
pub mod sandbox_stop;
pub mod sandbox_stream;
pub mod sandbox_update;
pub mod stats;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_cri::admin as adm;
use petrel_cri::admin::admin_server::{Admin, AdminServer};
use petrel_cri::api;
use petrel_cri::api::image_service_server::{ImageService, ImageServiceServer};
use petrel_cri::api::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tower::layer::util::{Identity, Stack};

use crate::config::RuntimeConfig;
use crate::error::{Result, RuntimeError};
use crate::service::Runtime;

/// Errors that stop the runtime from serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The runtime could not open its state.
    #[error("{0}")]
    Open(#[from] RuntimeError),
    /// The socket could not be created.
    #[error("{0}")]
    Socket(#[from] petrel_cri::ServerError),
    /// The gRPC server failed.
    #[error("serve: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// NRI could not start (its socket or plugin directory).
    #[error("{0}")]
    Nri(#[from] crate::nri::NriError),
}

/// Runs the runtime until `shutdown` completes: open, recover, serve.
///
/// On shutdown the socket stops accepting, event streams end, in-flight
/// calls get a few seconds to finish, and containers keep running under
/// their shims.
pub async fn serve(
    config: RuntimeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let rt = Runtime::open(config)?;
    serve_runtime(rt, shutdown).await
}

/// Runs a runtime made by [`Runtime::open`] until `shutdown` completes:
/// recover, serve. For embedders that also need the runtime itself (such as
/// a streaming server's backend, [`crate::RuntimeStreams`]).
pub async fn serve_runtime(
    rt: Arc<Runtime>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let socket = rt.config.socket_path();
    let mode = rt.config.socket_mode;
    // Ended with this function, whichever way it returns.
    let _reaper = AbortOnDrop(tokio::spawn(crate::orphans::reap_orphans()).abort_handle());
    rt.recover().await?;
    // After recovery (plugins are synchronized with what it found), before
    // the first CRI call (which may already need a plugin).
    let nri = rt.nri.clone();
    nri.launch()?;
    let incoming = match petrel_cri::bind_unix(&socket, mode) {
        Ok(i) => i,
        Err(e) => {
            nri.shutdown().await;
            return Err(e.into());
        }
    };
    rt.set_initialized();
    tracing::info!(socket = %socket.display(), root = %rt.layout.root.display(), state = %rt.layout.state.display(), "petrel runtime serving CRI");
    let mut serving = tokio::spawn(router(&rt).serve_with_incoming(incoming));
    tokio::select! {
        r = &mut serving => {
            nri.shutdown().await;
            crate::util::remove_file_logged(&socket, "CRI socket");
            return match r {
                Ok(r) => r.map_err(ServeError::from),
                Err(e) => Err(RuntimeError::task("gRPC server", e).into()),
            };
        }
        () = shutdown => {}
    }
    // Refuse new calls, end event streams, let the calls under way finish
    // (clients such as kubelet keep idle connections open forever, so waiting
    // for connections to close is not an option), then drop the server.
    tracing::info!("shutting down; containers keep running");
    rt.begin_shutdown();
    rt.events.close();
    rt.streams.shutdown().await;
    if tokio::time::timeout(Duration::from_secs(10), rt.calls_drained())
        .await
        .is_err()
    {
        tracing::warn!("calls under way did not finish within 10s");
    }
    // Removed containers' remains still queued: a little time to finish,
    // else the next start's sweep of the trash does it.
    if tokio::time::timeout(Duration::from_secs(5), rt.remover.idle())
        .await
        .is_err()
    {
        tracing::info!("removals under way left to the next start");
    }
    serving.abort();
    nri.shutdown().await;
    crate::util::remove_file_logged(&socket, "CRI socket");
    Ok(())
}

/// The gRPC server with every service of the runtime, ready to serve.
/// With `[cri] fast_paths` on, the two List calls are answered by the
/// hand-framed fast path ([`fast_list`]); off, by the typed handlers.
pub(crate) fn router(
    rt: &Arc<Runtime>,
) -> tonic::transport::server::Router<Stack<deadline::DeadlineLayer, Identity>> {
    let server = CriServer { rt: rt.clone() };
    let typed = RuntimeServiceServer::new(server.clone());
    // The client's deadline answered as DEADLINE_EXCEEDED (see deadline.rs).
    let mut builder = tonic::transport::Server::builder().layer(deadline::DeadlineLayer);
    let router = if rt.config.fast_paths {
        builder.add_service(fast_list::RuntimeRoutes::new(typed, rt.clone()))
    } else {
        builder.add_service(typed)
    };
    router
        .add_service(ImageServiceServer::new(server.clone()))
        .add_service(AdminServer::new(server))
}

/// The tonic services, sharing one runtime.
#[derive(Debug, Clone)]
pub struct CriServer {
    rt: Arc<Runtime>,
}

/// Calls that change state are logged at info, the rest at trace.
fn is_mutating(op: &str) -> bool {
    !(op.starts_with("List")
        || op.starts_with("Stream")
        || op.ends_with("Status")
        || op.ends_with("Stats")
        || op == "Version"
        || op == "ImageFsInfo"
        || op == "RuntimeConfig"
        || op == "Metrics"
        || op == "NriPlugins")
}

impl CriServer {
    async fn call<Req, Resp, F, Fut>(
        &self,
        op: &'static str,
        req: Request<Req>,
        f: F,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
        F: FnOnce(Arc<Runtime>, Req) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Resp>> + Send + 'static,
    {
        let Some(_call) = self.rt.enter_call() else {
            return Err(RuntimeError::Unavailable(
                "the runtime is starting or shutting down".into(),
            )
            .into());
        };
        let start = Instant::now();
        let rt = self.rt.clone();
        let req = req.into_inner();
        let mutating = is_mutating(op);
        let res = if mutating {
            let task = tokio::spawn(async move { f(rt, req).await });
            // Calls run to completion when their client goes away (a
            // half-made change is worse than an unwanted one), except
            // ExecSync, whose command is killed when nobody waits for its
            // output any more, and PullImage, whose downloads stop when
            // nobody waits for the image (the commit, once begun, runs on
            // and completes or fails whole).
            let _abort =
                matches!(op, "ExecSync" | "PullImage").then(|| AbortOnDrop(task.abort_handle()));
            match task.await {
                Ok(r) => r,
                Err(e) => Err(RuntimeError::task(op, e)),
            }
        } else {
            // A read runs on the connection's own task: no task to spawn,
            // schedule and join per call (nor an idle worker woken for it),
            // and a client that goes away cancels only a read. A panic is
            // still an INTERNAL error, not the daemon's end.
            use futures_util::FutureExt;
            match std::panic::AssertUnwindSafe(async move { f(rt, req).await })
                .catch_unwind()
                .await
            {
                Ok(r) => r,
                Err(_) => Err(RuntimeError::Invariant(format!("{op} panicked"))),
            }
        };
        let took = start.elapsed();
        self.rt.metrics.observe(op, took, res.is_err());
        // Converted (and a long message cut) before it is logged too.
        let res = res.map_err(Status::from);
        match &res {
            Err(s) => {
                tracing::warn!(op, code = ?s.code(), error = s.message(), took_ms = took.as_millis() as u64, "call failed")
            }
            Ok(_) if mutating => {
                tracing::info!(op, took_ms = took.as_millis() as u64, "call done")
            }
            Ok(_) => tracing::trace!(op, "call done"),
        }
        res.map(Response::new)
    }
}

impl CriServer {
    /// A streamed List call: the handler runs as any call does
    /// ([`CriServer::call`]) and yields its batches, which are then sent
    /// one response each, and the stream ends.
    async fn stream<Req, Resp, F, Fut>(
        &self,
        op: &'static str,
        req: Request<Req>,
        f: F,
    ) -> Result<Response<ListStream<Resp>>, Status>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
        F: FnOnce(Arc<Runtime>, Req) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<Resp>>> + Send + 'static,
    {
        let batches = self.call(op, req, f).await?.into_inner();
        Ok(Response::new(Box::pin(tokio_stream::iter(
            batches.into_iter().map(Ok),
        ))))
    }
}

/// Aborts a call's task when the call is dropped (its client went away).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type EventStream =
    Pin<Box<dyn Stream<Item = Result<api::ContainerEventResponse, Status>> + Send + 'static>>;

/// The answer of a streamed List call.
type ListStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

macro_rules! stream_rpc {
    ($self:ident, $name:literal, $req:ident, $method:ident) => {
        $self
            .stream($name, $req, |rt, r| async move { rt.$method(r).await })
            .await
    };
}

macro_rules! rpc {
    ($self:ident, $name:literal, $req:ident, $method:ident) => {
        $self
            .call($name, $req, |rt, r| async move { rt.$method(r).await })
            .await
    };
}

#[tonic::async_trait]
impl RuntimeService for CriServer {
    async fn version(
        &self,
        r: Request<api::VersionRequest>,
    ) -> Result<Response<api::VersionResponse>, Status> {
        rpc!(self, "Version", r, version)
    }
    async fn run_pod_sandbox(
        &self,
        r: Request<api::RunPodSandboxRequest>,
    ) -> Result<Response<api::RunPodSandboxResponse>, Status> {
        rpc!(self, "RunPodSandbox", r, run_pod_sandbox)
    }
    async fn stop_pod_sandbox(
        &self,
        r: Request<api::StopPodSandboxRequest>,
    ) -> Result<Response<api::StopPodSandboxResponse>, Status> {
        rpc!(self, "StopPodSandbox", r, stop_pod_sandbox)
    }
    async fn remove_pod_sandbox(
        &self,
        r: Request<api::RemovePodSandboxRequest>,
    ) -> Result<Response<api::RemovePodSandboxResponse>, Status> {
        rpc!(self, "RemovePodSandbox", r, remove_pod_sandbox)
    }
    async fn pod_sandbox_status(
        &self,
        r: Request<api::PodSandboxStatusRequest>,
    ) -> Result<Response<api::PodSandboxStatusResponse>, Status> {
        rpc!(self, "PodSandboxStatus", r, pod_sandbox_status)
    }
    async fn list_pod_sandbox(
        &self,
        r: Request<api::ListPodSandboxRequest>,
    ) -> Result<Response<api::ListPodSandboxResponse>, Status> {
        rpc!(self, "ListPodSandbox", r, list_pod_sandbox)
    }
    async fn create_container(
        &self,
        r: Request<api::CreateContainerRequest>,
    ) -> Result<Response<api::CreateContainerResponse>, Status> {
        rpc!(self, "CreateContainer", r, create_container)
    }
    async fn start_container(
        &self,
        r: Request<api::StartContainerRequest>,
    ) -> Result<Response<api::StartContainerResponse>, Status> {
        rpc!(self, "StartContainer", r, start_container)
    }
    async fn stop_container(
        &self,
        r: Request<api::StopContainerRequest>,
    ) -> Result<Response<api::StopContainerResponse>, Status> {
        rpc!(self, "StopContainer", r, stop_container)
    }
    async fn remove_container(
        &self,
        r: Request<api::RemoveContainerRequest>,
    ) -> Result<Response<api::RemoveContainerResponse>, Status> {
        rpc!(self, "RemoveContainer", r, remove_container)
    }
    async fn list_containers(
        &self,
        r: Request<api::ListContainersRequest>,
    ) -> Result<Response<api::ListContainersResponse>, Status> {
        rpc!(self, "ListContainers", r, list_containers)
    }
    async fn container_status(
        &self,
        r: Request<api::ContainerStatusRequest>,
    ) -> Result<Response<api::ContainerStatusResponse>, Status> {
        rpc!(self, "ContainerStatus", r, container_status_rpc)
    }
    async fn update_container_resources(
        &self,
        r: Request<api::UpdateContainerResourcesRequest>,
    ) -> Result<Response<api::UpdateContainerResourcesResponse>, Status> {
        rpc!(
            self,
            "UpdateContainerResources",
            r,
            update_container_resources
        )
    }
    async fn reopen_container_log(
        &self,
        r: Request<api::ReopenContainerLogRequest>,
    ) -> Result<Response<api::ReopenContainerLogResponse>, Status> {
        rpc!(self, "ReopenContainerLog", r, reopen_container_log)
    }
    async fn exec_sync(
        &self,
        r: Request<api::ExecSyncRequest>,
    ) -> Result<Response<api::ExecSyncResponse>, Status> {
        rpc!(self, "ExecSync", r, exec_sync)
    }
    async fn exec(
        &self,
        r: Request<api::ExecRequest>,
    ) -> Result<Response<api::ExecResponse>, Status> {
        rpc!(self, "Exec", r, exec)
    }
    async fn attach(
        &self,
        r: Request<api::AttachRequest>,
    ) -> Result<Response<api::AttachResponse>, Status> {
        rpc!(self, "Attach", r, attach)
    }
    async fn port_forward(
        &self,
        r: Request<api::PortForwardRequest>,
    ) -> Result<Response<api::PortForwardResponse>, Status> {
        rpc!(self, "PortForward", r, port_forward)
    }
    async fn container_stats(
        &self,
        r: Request<api::ContainerStatsRequest>,
    ) -> Result<Response<api::ContainerStatsResponse>, Status> {
        rpc!(self, "ContainerStats", r, container_stats)
    }
    async fn list_container_stats(
        &self,
        r: Request<api::ListContainerStatsRequest>,
    ) -> Result<Response<api::ListContainerStatsResponse>, Status> {
        rpc!(self, "ListContainerStats", r, list_container_stats)
    }
    async fn pod_sandbox_stats(
        &self,
        r: Request<api::PodSandboxStatsRequest>,
    ) -> Result<Response<api::PodSandboxStatsResponse>, Status> {
        rpc!(self, "PodSandboxStats", r, pod_sandbox_stats)
    }
    async fn list_pod_sandbox_stats(
        &self,
        r: Request<api::ListPodSandboxStatsRequest>,
    ) -> Result<Response<api::ListPodSandboxStatsResponse>, Status> {
        rpc!(self, "ListPodSandboxStats", r, list_pod_sandbox_stats)
    }
    async fn update_runtime_config(
        &self,
        r: Request<api::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<api::UpdateRuntimeConfigResponse>, Status> {
        rpc!(self, "UpdateRuntimeConfig", r, update_runtime_config)
    }
    async fn status(
        &self,
        r: Request<api::StatusRequest>,
    ) -> Result<Response<api::StatusResponse>, Status> {
        rpc!(self, "Status", r, status)
    }
    async fn checkpoint_container(
        &self,
        r: Request<api::CheckpointContainerRequest>,
    ) -> Result<Response<api::CheckpointContainerResponse>, Status> {
        rpc!(self, "CheckpointContainer", r, checkpoint_container)
    }

    async fn checkpoint_pod(
        &self,
        r: Request<api::CheckpointPodRequest>,
    ) -> Result<Response<api::CheckpointPodResponse>, Status> {
        rpc!(self, "CheckpointPod", r, checkpoint_pod)
    }
    async fn restore_pod(
        &self,
        r: Request<api::RestorePodRequest>,
    ) -> Result<Response<api::RestorePodResponse>, Status> {
        rpc!(self, "RestorePod", r, restore_pod)
    }
    async fn update_pod_sandbox_resources(
        &self,
        r: Request<api::UpdatePodSandboxResourcesRequest>,
    ) -> Result<Response<api::UpdatePodSandboxResourcesResponse>, Status> {
        rpc!(
            self,
            "UpdatePodSandboxResources",
            r,
            update_pod_sandbox_resources
        )
    }

    type StreamPodSandboxesStream = ListStream<api::StreamPodSandboxesResponse>;

    async fn stream_pod_sandboxes(
        &self,
        r: Request<api::StreamPodSandboxesRequest>,
    ) -> Result<Response<Self::StreamPodSandboxesStream>, Status> {
        stream_rpc!(self, "StreamPodSandboxes", r, stream_pod_sandboxes)
    }

    type StreamContainersStream = ListStream<api::StreamContainersResponse>;

    async fn stream_containers(
        &self,
        r: Request<api::StreamContainersRequest>,
    ) -> Result<Response<Self::StreamContainersStream>, Status> {
        stream_rpc!(self, "StreamContainers", r, stream_containers)
    }

    type StreamContainerStatsStream = ListStream<api::StreamContainerStatsResponse>;

    async fn stream_container_stats(
        &self,
        r: Request<api::StreamContainerStatsRequest>,
    ) -> Result<Response<Self::StreamContainerStatsStream>, Status> {
        stream_rpc!(self, "StreamContainerStats", r, stream_container_stats)
    }

    type StreamPodSandboxStatsStream = ListStream<api::StreamPodSandboxStatsResponse>;

    async fn stream_pod_sandbox_stats(
        &self,
        r: Request<api::StreamPodSandboxStatsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxStatsStream>, Status> {
        stream_rpc!(self, "StreamPodSandboxStats", r, stream_pod_sandbox_stats)
    }

    type StreamPodSandboxMetricsStream = ListStream<api::StreamPodSandboxMetricsResponse>;

    async fn stream_pod_sandbox_metrics(
        &self,
        r: Request<api::StreamPodSandboxMetricsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxMetricsStream>, Status> {
        stream_rpc!(
            self,
            "StreamPodSandboxMetrics",
            r,
            stream_pod_sandbox_metrics
        )
    }

    type GetContainerEventsStream = EventStream;

    async fn get_container_events(
        &self,
        _r: Request<api::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        if self.rt.enter_call().is_none() {
            return Err(RuntimeError::Unavailable(
                "the runtime is starting or shutting down".into(),
            )
            .into());
        }
        Ok(Response::new(self.rt.event_stream()))
    }

    async fn list_metric_descriptors(
        &self,
        r: Request<api::ListMetricDescriptorsRequest>,
    ) -> Result<Response<api::ListMetricDescriptorsResponse>, Status> {
        rpc!(self, "ListMetricDescriptors", r, list_metric_descriptors)
    }
    async fn list_pod_sandbox_metrics(
        &self,
        r: Request<api::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<api::ListPodSandboxMetricsResponse>, Status> {
        rpc!(self, "ListPodSandboxMetrics", r, list_pod_sandbox_metrics)
    }
    async fn runtime_config(
        &self,
        r: Request<api::RuntimeConfigRequest>,
    ) -> Result<Response<api::RuntimeConfigResponse>, Status> {
        rpc!(self, "RuntimeConfig", r, runtime_config)
    }
}

#[tonic::async_trait]
impl ImageService for CriServer {
    async fn list_images(
        &self,
        r: Request<api::ListImagesRequest>,
    ) -> Result<Response<api::ListImagesResponse>, Status> {
        rpc!(self, "ListImages", r, list_images)
    }
    type StreamImagesStream = ListStream<api::StreamImagesResponse>;

    async fn stream_images(
        &self,
        r: Request<api::StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        stream_rpc!(self, "StreamImages", r, stream_images)
    }
    async fn image_status(
        &self,
        r: Request<api::ImageStatusRequest>,
    ) -> Result<Response<api::ImageStatusResponse>, Status> {
        rpc!(self, "ImageStatus", r, image_status)
    }
    async fn pull_image(
        &self,
        r: Request<api::PullImageRequest>,
    ) -> Result<Response<api::PullImageResponse>, Status> {
        rpc!(self, "PullImage", r, pull_image)
    }
    async fn remove_image(
        &self,
        r: Request<api::RemoveImageRequest>,
    ) -> Result<Response<api::RemoveImageResponse>, Status> {
        rpc!(self, "RemoveImage", r, remove_image)
    }
    async fn image_fs_info(
        &self,
        r: Request<api::ImageFsInfoRequest>,
    ) -> Result<Response<api::ImageFsInfoResponse>, Status> {
        rpc!(self, "ImageFsInfo", r, image_fs_info)
    }
}

#[tonic::async_trait]
impl Admin for CriServer {
    async fn import_image(
        &self,
        r: Request<adm::ImportImageRequest>,
    ) -> Result<Response<adm::ImportImageResponse>, Status> {
        rpc!(self, "ImportImage", r, import_image)
    }
    async fn metrics(
        &self,
        r: Request<adm::MetricsRequest>,
    ) -> Result<Response<adm::MetricsResponse>, Status> {
        rpc!(self, "Metrics", r, metrics_text)
    }
    async fn garbage_collect_images(
        &self,
        r: Request<adm::GarbageCollectImagesRequest>,
    ) -> Result<Response<adm::GarbageCollectImagesResponse>, Status> {
        rpc!(self, "GarbageCollectImages", r, garbage_collect_images)
    }
    async fn export_image(
        &self,
        r: Request<adm::ExportImageRequest>,
    ) -> Result<Response<adm::ExportImageResponse>, Status> {
        rpc!(self, "ExportImage", r, export_image)
    }
    async fn nri_plugins(
        &self,
        r: Request<adm::NriPluginsRequest>,
    ) -> Result<Response<adm::NriPluginsResponse>, Status> {
        rpc!(self, "NriPlugins", r, nri_plugins)
    }

    type PullImageStream = image_pull::PullStream;

    /// Like `CriServer::call`, but the answer is a stream: the pull and
    /// its progress run in a task of their own, which ends the stream with
    /// the last message or the error's status.
    async fn pull_image(
        &self,
        r: Request<adm::AdminPullImageRequest>,
    ) -> Result<Response<Self::PullImageStream>, Status> {
        if self.rt.enter_call().is_none() {
            return Err(RuntimeError::Unavailable(
                "the runtime is starting or shutting down".into(),
            )
            .into());
        }
        let req = r.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(image_pull::PROGRESS_QUEUE);
        let rt = self.rt.clone();
        tokio::spawn(async move {
            let res = {
                let Some(_call) = rt.enter_call() else {
                    let _ = tx
                        .send(Err(RuntimeError::Unavailable(
                            "the runtime is shutting down".into(),
                        )
                        .into()))
                        .await;
                    return;
                };
                let start = Instant::now();
                let res = rt.pull_image_progress(req, &tx).await;
                let took = start.elapsed();
                rt.metrics.observe("PullImage", took, res.is_err());
                match &res {
                    Err(e) => {
                        tracing::warn!(op = "PullImage", stream = true, error = %e, took_ms = took.as_millis() as u64, "call failed")
                    }
                    Ok(_) => tracing::info!(
                        op = "PullImage",
                        stream = true,
                        took_ms = took.as_millis() as u64,
                        "call done"
                    ),
                }
                res
            };
            // The call is over for shutdown's sake; the last message waits
            // for the client as long as its connection lives.
            let _ = tx.send(res.map_err(Status::from)).await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parts::fake::TestRuntime;

    #[tokio::test]
    async fn a_read_that_panics_should_answer_internal_and_reads_should_go_on() {
        let t = TestRuntime::new();
        let server = CriServer { rt: t.rt.clone() };
        let boom = server
            .call(
                "ListImages",
                Request::new(true),
                |_rt, panic: bool| async move {
                    assert!(!panic, "boom");
                    Ok(())
                },
            )
            .await
            .expect_err("a panic");
        assert_eq!(boom.code(), tonic::Code::Internal);
        assert!(boom.message().contains("ListImages"), "{boom:?}");
        let images = server
            .call(
                "ListImages",
                Request::new(api::ListImagesRequest::default()),
                |rt, r| async move { rt.list_images(r).await },
            )
            .await
            .expect("list images")
            .into_inner();
        assert_eq!(images.images.len(), 1);
    }
}
