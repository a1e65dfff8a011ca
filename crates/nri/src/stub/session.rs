//! One connection of a plugin to a runtime: register, get configured, serve the Plugin
//! service until the connection ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tokio::net::UnixStream;
use tokio::sync::oneshot;

use crate::api::{self, method, Event, EventMask};
use crate::mux::{Mux, Sink, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::rpc::{self, Handler, HandlerFuture, RpcClient};
use crate::ttrpc::{Code, Status};

use super::handlers::{Handlers, PluginError};
use super::{RuntimeInfo, Shared, StubError};

/// Bound of a plugin-initiated UpdateContainers: the runtime may have to touch many
/// containers, so this is generous, but a dead runtime must not hang the plugin.
const UPDATE_CONTAINERS_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a failed configuration keeps the connection for its answer to be read.
const CONFIGURE_REFUSAL_GRACE: Duration = Duration::from_secs(1);

/// A live, configured connection.
pub(crate) struct Session {
    client: RpcClient,
    info: StdMutex<RuntimeInfo>,
}

impl Session {
    pub(crate) fn runtime_info(&self) -> RuntimeInfo {
        self.info.lock().map(|i| i.clone()).unwrap_or_default()
    }

    pub(crate) async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, StubError> {
        let req = api::UpdateContainersRequest { update, evict };
        let resp: api::UpdateContainersResponse = self
            .client
            .call(
                method::UPDATE_CONTAINERS,
                &req,
                Some(UPDATE_CONTAINERS_TIMEOUT),
            )
            .await?;
        Ok(resp.failed)
    }
}

/// How a session ended.
pub(crate) struct SessionEnd {
    /// The plugin had been registered and configured.
    pub(crate) configured: bool,
    /// The runtime had sent Shutdown.
    pub(crate) shutdown: bool,
    /// Why it ended.
    pub(crate) cause: StubError,
}

/// Per-session state the Plugin service needs.
struct ServiceState<S> {
    handlers: Arc<Handlers<S>>,
    state: Arc<S>,
    session: Arc<Session>,
    configured: StdMutex<Option<oneshot::Sender<Result<(), String>>>>,
    /// Pods and containers of a split Synchronize collected so far.
    sync_parts: StdMutex<Option<(Vec<api::PodSandbox>, Vec<api::Container>)>>,
    shutdown_seen: AtomicBool,
}

pub(crate) async fn run_session<S: Send + Sync + 'static>(
    stream: UnixStream,
    name: &str,
    index: &str,
    registration_timeout: Duration,
    handlers: Arc<Handlers<S>>,
    state: Arc<S>,
    shared: Arc<Shared>,
) -> SessionEnd {
    let fail = |configured, cause| SessionEnd {
        configured,
        shutdown: false,
        cause,
    };
    let (mux, reading) = match Mux::open(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]) {
        Ok(opened) => opened,
        Err(e) => return fail(false, StubError::Disconnected(e)),
    };
    // However the session ends, also by its future being dropped (a stopped stub), the
    // connection ends with it; the serving tasks would keep it open otherwise.
    let _close_on_exit = CloseOnDrop(mux.clone());
    let (client, answers) = RpcClient::new(mux.clone(), RUNTIME_SERVICE_CONN, api::RUNTIME_SERVICE);
    let session = Arc::new(Session {
        client,
        info: StdMutex::new(RuntimeInfo::default()),
    });
    let (cfg_tx, cfg_rx) = oneshot::channel();
    let service = Arc::new(ServiceState {
        handlers,
        state,
        session: session.clone(),
        configured: StdMutex::new(Some(cfg_tx)),
        sync_parts: StdMutex::new(None),
        shutdown_seen: AtomicBool::new(false),
    });
    let sinks: Vec<(_, Box<dyn Sink>)> = vec![
        (
            PLUGIN_SERVICE_CONN,
            Box::new(rpc::server(
                PLUGIN_SERVICE_CONN,
                api::PLUGIN_SERVICE,
                plugin_service(service.clone()),
            )),
        ),
        (RUNTIME_SERVICE_CONN, Box::new(answers)),
    ];
    if let Err(e) = reading.start(sinks) {
        return fail(false, StubError::Disconnected(e));
    }

    let register = api::RegisterPluginRequest {
        plugin_name: name.to_string(),
        plugin_idx: index.to_string(),
        nri_version: api::NRI_VERSION.to_string(),
    };
    tracing::info!(plugin = %format!("{index}-{name}"), "nri plugin: registering");
    let registered: Result<api::Empty, _> = session
        .client
        .call(
            method::REGISTER_PLUGIN,
            &register,
            Some(registration_timeout),
        )
        .await;
    if let Err(e) = registered {
        mux.close().await;
        return fail(false, StubError::Register(e));
    }

    let configured = tokio::select! {
        r = cfg_rx => r.unwrap_or(Err("connection closed before Configure".into())),
        cause = mux.closed() => Err(format!("connection closed before Configure: {cause}")),
    };
    if let Err(reason) = configured {
        // The runtime is being answered with the reason and hangs up on reading it;
        // hang up ourselves if it does not within a grace period.
        let _ = tokio::time::timeout(CONFIGURE_REFUSAL_GRACE, mux.closed()).await;
        mux.close().await;
        return fail(false, StubError::Configure(reason));
    }
    let info = session.runtime_info();
    tracing::info!(
        plugin = %format!("{index}-{name}"),
        runtime = %info.runtime_name,
        runtime_version = %info.runtime_version,
        events = %info.events,
        "nri plugin: configured"
    );
    shared.current.send_replace(Some(session));
    let cause = mux.closed().await;
    SessionEnd {
        configured: true,
        shutdown: service.shutdown_seen.load(Ordering::SeqCst),
        cause: StubError::Disconnected(cause),
    }
}

struct CloseOnDrop(Mux);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close_now();
    }
}

fn plugin_error(e: PluginError) -> Status {
    Status::new(Code::Unknown, e.message())
}

/// Calls an optional handler; an event without a handler is answered with the default
/// response (the runtime should not send it: the plugin is not subscribed).
async fn call_opt<S, Req, Resp: Default>(
    handler: &Option<super::handlers::Handler<S, Req, Resp>>,
    state: &Arc<S>,
    req: Req,
) -> Result<Resp, Status> {
    match handler {
        Some(h) => h(state.clone(), req).await.map_err(plugin_error),
        None => Ok(Resp::default()),
    }
}

fn plugin_service<S: Send + Sync + 'static>(svc: Arc<ServiceState<S>>) -> Handler {
    Arc::new(move |method: String, payload: Bytes| -> HandlerFuture {
        let svc = svc.clone();
        Box::pin(async move { dispatch(&svc, &method, payload).await })
    })
}

async fn dispatch<S: Send + Sync + 'static>(
    svc: &ServiceState<S>,
    name: &str,
    payload: Bytes,
) -> Result<Vec<u8>, Status> {
    let h = &svc.handlers;
    let st = &svc.state;
    macro_rules! event {
        ($field:ident, $req:ty, $resp:ty) => {{
            let req: $req = rpc::decode_arg(name, payload)?;
            let _: () = call_opt(&h.$field, st, req).await?;
            Ok(<$resp>::default().encode_to_vec())
        }};
    }
    match name {
        method::CONFIGURE => configure(svc, rpc::decode_arg(name, payload)?).await,
        method::SYNCHRONIZE => synchronize(svc, rpc::decode_arg(name, payload)?).await,
        method::SHUTDOWN => {
            svc.shutdown_seen.store(true, Ordering::SeqCst);
            tracing::info!("nri plugin: runtime is shutting down");
            if let Some(handler) = &h.shutdown {
                handler(st.clone()).await.map_err(plugin_error)?;
            }
            Ok(api::Empty {}.encode_to_vec())
        }
        method::RUN_POD_SANDBOX => {
            event!(
                run_pod_sandbox,
                api::RunPodSandboxRequest,
                api::RunPodSandboxResponse
            )
        }
        method::UPDATE_POD_SANDBOX => event!(
            update_pod_sandbox,
            api::UpdatePodSandboxRequest,
            api::UpdatePodSandboxResponse
        ),
        method::POST_UPDATE_POD_SANDBOX => event!(
            post_update_pod_sandbox,
            api::PostUpdatePodSandboxRequest,
            api::PostUpdatePodSandboxResponse
        ),
        method::STOP_POD_SANDBOX => event!(
            stop_pod_sandbox,
            api::StopPodSandboxRequest,
            api::StopPodSandboxResponse
        ),
        method::REMOVE_POD_SANDBOX => event!(
            remove_pod_sandbox,
            api::RemovePodSandboxRequest,
            api::RemovePodSandboxResponse
        ),
        method::CREATE_CONTAINER => {
            let req: api::CreateContainerRequest = rpc::decode_arg(name, payload)?;
            let resp = call_opt(&h.create_container, st, req).await?;
            Ok(resp.encode_to_vec())
        }
        method::POST_CREATE_CONTAINER => event!(
            post_create_container,
            api::PostCreateContainerRequest,
            api::PostCreateContainerResponse
        ),
        method::START_CONTAINER => event!(
            start_container,
            api::StartContainerRequest,
            api::StartContainerResponse
        ),
        method::POST_START_CONTAINER => event!(
            post_start_container,
            api::PostStartContainerRequest,
            api::PostStartContainerResponse
        ),
        method::UPDATE_CONTAINER => {
            let req: api::UpdateContainerRequest = rpc::decode_arg(name, payload)?;
            let resp = call_opt(&h.update_container, st, req).await?;
            Ok(resp.encode_to_vec())
        }
        method::POST_UPDATE_CONTAINER => event!(
            post_update_container,
            api::PostUpdateContainerRequest,
            api::PostUpdateContainerResponse
        ),
        method::STOP_CONTAINER => {
            let req: api::StopContainerRequest = rpc::decode_arg(name, payload)?;
            let resp = call_opt(&h.stop_container, st, req).await?;
            Ok(resp.encode_to_vec())
        }
        method::REMOVE_CONTAINER => event!(
            remove_container,
            api::RemoveContainerRequest,
            api::RemoveContainerResponse
        ),
        method::STATE_CHANGE => {
            state_change(svc, rpc::decode_arg(name, payload)?).await?;
            Ok(api::Empty {}.encode_to_vec())
        }
        method::VALIDATE_CONTAINER_ADJUSTMENT => {
            let req: api::ValidateContainerAdjustmentRequest = rpc::decode_arg(name, payload)?;
            let resp = match &h.validate_container_adjustment {
                Some(v) => match v(st.clone(), req).await {
                    Ok(()) => api::ValidateContainerAdjustmentResponse::default(),
                    Err(e) => api::ValidateContainerAdjustmentResponse {
                        reject: true,
                        reason: e.message().to_string(),
                    },
                },
                None => api::ValidateContainerAdjustmentResponse::default(),
            };
            Ok(resp.encode_to_vec())
        }
        other => Err(rpc::unimplemented(api::PLUGIN_SERVICE, other)),
    }
}

async fn configure<S: Send + Sync + 'static>(
    svc: &ServiceState<S>,
    req: api::ConfigureRequest,
) -> Result<Vec<u8>, Status> {
    let registered = svc.handlers.events();
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    let mut info = RuntimeInfo {
        runtime_name: req.runtime_name.clone(),
        runtime_version: req.runtime_version.clone(),
        nri_version: req.nri_version.clone(),
        registration_timeout: ms(req.registration_timeout),
        request_timeout: ms(req.request_timeout),
        events: registered,
    };
    let outcome = match &svc.handlers.configure {
        None => Ok(registered),
        Some(handler) => match handler(svc.state.clone(), req).await {
            Ok(None) => Ok(registered),
            Ok(Some(mask)) if mask.is_empty() => {
                Err("configure handler subscribed to no event".to_string())
            }
            Ok(Some(mask)) if !registered.includes(mask) => Err(format!(
                "configure handler subscribed to events without a handler: {}",
                EventMask(mask.0 & !registered.0)
            )),
            Ok(Some(mask)) => Ok(mask),
            Err(e) => Err(e.message().to_string()),
        },
    };
    let waiter = svc.configured.lock().ok().and_then(|mut w| w.take());
    match outcome {
        Ok(events) => {
            info.events = events;
            if let Ok(mut slot) = svc.session.info.lock() {
                *slot = info;
            }
            if let Some(w) = waiter {
                let _ = w.send(Ok(()));
            }
            Ok(api::ConfigureResponse { events: events.0 }.encode_to_vec())
        }
        Err(reason) => {
            tracing::error!(%reason, "nri plugin: configuration failed");
            if let Some(w) = waiter {
                let _ = w.send(Err(reason.clone()));
            }
            Err(Status::new(Code::Unknown, reason))
        }
    }
}

async fn synchronize<S: Send + Sync + 'static>(
    svc: &ServiceState<S>,
    req: api::SynchronizeRequest,
) -> Result<Vec<u8>, Status> {
    let Some(handler) = &svc.handlers.synchronize else {
        // Nothing to hand over: acknowledge every chunk as upstream plugins do.
        return Ok(api::SynchronizeResponse {
            update: Vec::new(),
            more: req.more,
        }
        .encode_to_vec());
    };
    let (pods, containers) = {
        let mut parts = svc
            .sync_parts
            .lock()
            .map_err(|_| Status::new(Code::Internal, "sync state poisoned"))?;
        let (pods, containers) = parts.get_or_insert_with(Default::default);
        pods.extend(req.pods);
        containers.extend(req.containers);
        if req.more {
            tracing::debug!(
                pods = pods.len(),
                containers = containers.len(),
                "nri plugin: collecting split synchronization"
            );
            return Ok(api::SynchronizeResponse {
                update: Vec::new(),
                more: true,
            }
            .encode_to_vec());
        }
        parts.take().unwrap_or_default()
    };
    let update = handler(svc.state.clone(), pods, containers)
        .await
        .map_err(plugin_error)?;
    Ok(api::SynchronizeResponse {
        update,
        more: false,
    }
    .encode_to_vec())
}

/// Delivers a StateChange (how containerd 1.7 sends most events) to the handler the
/// dedicated RPC would reach.
async fn state_change<S: Send + Sync + 'static>(
    svc: &ServiceState<S>,
    evt: api::StateChangeEvent,
) -> Result<(), Status> {
    let h = &svc.handlers;
    let st = &svc.state;
    let (pod, container) = (evt.pod, evt.container);
    match Event::try_from(evt.event).unwrap_or(Event::Unknown) {
        Event::RunPodSandbox => {
            call_opt(&h.run_pod_sandbox, st, api::RunPodSandboxRequest { pod }).await
        }
        Event::PostUpdatePodSandbox => {
            let req = api::PostUpdatePodSandboxRequest { pod };
            call_opt(&h.post_update_pod_sandbox, st, req).await
        }
        Event::StopPodSandbox => {
            call_opt(&h.stop_pod_sandbox, st, api::StopPodSandboxRequest { pod }).await
        }
        Event::RemovePodSandbox => {
            call_opt(
                &h.remove_pod_sandbox,
                st,
                api::RemovePodSandboxRequest { pod },
            )
            .await
        }
        Event::PostCreateContainer => {
            let req = api::PostCreateContainerRequest { pod, container };
            call_opt(&h.post_create_container, st, req).await
        }
        Event::StartContainer => {
            let req = api::StartContainerRequest { pod, container };
            call_opt(&h.start_container, st, req).await
        }
        Event::PostStartContainer => {
            let req = api::PostStartContainerRequest { pod, container };
            call_opt(&h.post_start_container, st, req).await
        }
        Event::PostUpdateContainer => {
            let req = api::PostUpdateContainerRequest { pod, container };
            call_opt(&h.post_update_container, st, req).await
        }
        Event::RemoveContainer => {
            let req = api::RemoveContainerRequest { pod, container };
            call_opt(&h.remove_container, st, req).await
        }
        other => {
            tracing::debug!(
                event = other.as_str_name(),
                "nri plugin: StateChange event ignored"
            );
            Ok(())
        }
    }
}
