//! One plugin connection, runtime side.

use std::future::Future;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use prost::Message;
use thiserror::Error;
use tokio::net::UnixStream;
use tokio::sync::oneshot;

use crate::api::{self, method, Event, EventMask, IdentityError};
use crate::mux::{Mux, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::rpc::{self, Handler, HandlerFuture, RpcClient, RpcError};
use crate::ttrpc::{self, Code, Status};

/// How long a refused plugin may take to read the refusal and hang up.
const REFUSAL_GRACE: Duration = Duration::from_secs(1);

/// Tunables of a plugin connection. Defaults are containerd's.
#[derive(Debug, Clone)]
pub struct ConnOptions {
    /// How long a plugin has to call RegisterPlugin after connecting (default 5 s).
    pub registration_timeout: Duration,
    /// Bound of every call into the plugin (default 2 s). A hung plugin costs at most
    /// this per call.
    pub request_timeout: Duration,
    /// Largest encoded size of one Synchronize message; pods and containers beyond it
    /// go into further messages with `more` set. Default: the ttRPC limit less 64 KiB
    /// for the envelopes.
    pub sync_message_bytes: usize,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            sync_message_bytes: ttrpc::MAX_MESSAGE_LEN - 64 * 1024,
        }
    }
}

/// What a plugin said about itself in RegisterPlugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Plugin name.
    pub name: String,
    /// Two-digit invocation index.
    pub index: String,
    /// NRI version the plugin was built with ("" if it did not say).
    pub nri_version: String,
}

impl Registration {
    /// `index-name`, the way plugins are named in logs and configuration.
    pub fn qualified_name(&self) -> String {
        format!("{}-{}", self.index, self.name)
    }
}

/// Errors of a plugin connection.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ConnError {
    /// The plugin did not register in time.
    #[error("plugin did not register within {0:?}")]
    RegistrationTimeout(Duration),
    /// The plugin registered with an invalid name or index.
    #[error("plugin registration refused: {0}")]
    InvalidIdentity(#[from] IdentityError),
    /// The connection ended before the plugin registered.
    #[error("connection closed before the plugin registered: {0}")]
    ClosedBeforeRegistration(MuxError),
    /// A call into the plugin failed (status, timeout, lost connection).
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// Configure answered with bits that are not events.
    #[error("plugin subscribed to invalid events 0x{0:x}")]
    InvalidEvents(i32),
    /// The plugin answered an intermediate Synchronize chunk as if it were the last:
    /// it predates split synchronization.
    #[error("plugin does not handle split synchronization (answered a chunk with more={more} and {updates} updates)")]
    SplitSyncUnsupported {
        /// The `more` it answered.
        more: bool,
        /// Updates it returned early.
        updates: usize,
    },
    /// One pod or container alone is larger than a Synchronize message may be.
    #[error(
        "{kind} {id} encodes to {len} bytes, more than a Synchronize message may carry ({max})"
    )]
    SyncObjectTooLarge {
        /// "pod" or "container".
        kind: &'static str,
        /// Its id.
        id: String,
        /// Encoded size.
        len: usize,
        /// [`ConnOptions::sync_message_bytes`].
        max: usize,
    },
}

impl ConnError {
    /// True if the call ran into its timeout: no answer in time, or the
    /// plugin's own side gave up on the deadline the request carried (an SDK
    /// enforcing the timeout answers DEADLINE_EXCEEDED just before it).
    pub fn is_timeout(&self) -> bool {
        match self {
            ConnError::Rpc(RpcError::Timeout { .. }) => true,
            ConnError::Rpc(RpcError::Status { code, .. }) => {
                *code == crate::ttrpc::Code::DeadlineExceeded as i32
            }
            _ => false,
        }
    }

    /// True if the connection is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(
            self,
            ConnError::Rpc(RpcError::Disconnected { .. }) | ConnError::ClosedBeforeRegistration(_)
        )
    }
}

/// What the owner of a connection does with the plugin's own requests.
pub trait RuntimeHandler: Send + Sync + 'static {
    /// The plugin asks, unsolicited, for container updates and evictions. The answer
    /// lists the updates that failed; an `Err` is returned to the plugin as its status.
    fn update_containers(
        &self,
        plugin: &Registration,
        req: api::UpdateContainersRequest,
    ) -> impl Future<Output = Result<api::UpdateContainersResponse, Status>> + Send;
}

/// A socketpair for launching a pre-registered plugin: the runtime keeps the first end
/// (give it to [`PluginConn::accept`]), the second is to become the child's fd 3 (with
/// `NRI_PLUGIN_SOCKET=3`). Both ends are close-on-exec; the launcher's dup2 onto fd 3
/// clears that flag on the copy.
pub fn plugin_socketpair() -> std::io::Result<(UnixStream, OwnedFd)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    Ok((UnixStream::from_std(ours)?, OwnedFd::from(theirs)))
}

/// A registered plugin, runtime side. Cheap to clone; all clones share the connection.
#[derive(Clone)]
pub struct PluginConn {
    inner: Arc<ConnInner>,
}

struct ConnInner {
    mux: Mux,
    client: RpcClient,
    registration: Registration,
    options: ConnOptions,
    peer_pid: Option<i32>,
    events: AtomicI32,
    /// Events this plugin answered Unimplemented for: delivered through StateChange.
    state_change_fallback: AtomicI32,
}

impl std::fmt::Debug for PluginConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginConn")
            .field("registration", &self.inner.registration)
            .field("events", &self.events())
            .finish()
    }
}

/// The last handle on a connection gone: the connection goes too (its tasks hold the
/// multiplexer, so without this it would outlive every handle).
impl Drop for ConnInner {
    fn drop(&mut self) {
        self.mux.close_now();
    }
}

type RegistrationSlot = Arc<StdMutex<Option<Registration>>>;

impl PluginConn {
    /// Runs NRI on `stream` (an accepted external connection or the runtime's end of a
    /// [`plugin_socketpair`]) and waits for the plugin to register. The Runtime service
    /// is served from then on; `handler` receives the plugin's UpdateContainers.
    pub async fn accept<H: RuntimeHandler>(
        stream: UnixStream,
        handler: Arc<H>,
        options: ConnOptions,
    ) -> Result<PluginConn, ConnError> {
        let peer_pid = stream.peer_cred().ok().and_then(|c| c.pid());
        let (mux, reading) = Mux::open(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN])
            .map_err(ConnError::ClosedBeforeRegistration)?;
        let (client, answers) =
            RpcClient::new(mux.clone(), PLUGIN_SERVICE_CONN, api::PLUGIN_SERVICE);

        let (reg_tx, reg_rx) = oneshot::channel();
        let registered: RegistrationSlot = Arc::default();
        let service = runtime_service(handler, registered.clone(), reg_tx);
        reading
            .start(vec![
                (PLUGIN_SERVICE_CONN, Box::new(answers)),
                (
                    RUNTIME_SERVICE_CONN,
                    Box::new(rpc::server(
                        RUNTIME_SERVICE_CONN,
                        api::RUNTIME_SERVICE,
                        service,
                    )),
                ),
            ])
            .map_err(ConnError::ClosedBeforeRegistration)?;

        let outcome = tokio::select! {
            r = tokio::time::timeout(options.registration_timeout, reg_rx) => match r {
                Ok(Ok(result)) => result,
                // The service was dropped: the trunk ended; report why.
                Ok(Err(_)) => Err(ConnError::ClosedBeforeRegistration(
                    mux.error().unwrap_or(MuxError::Closed),
                )),
                Err(_) => Err(ConnError::RegistrationTimeout(options.registration_timeout)),
            },
            cause = mux.closed() => Err(ConnError::ClosedBeforeRegistration(cause)),
        };
        let registration = match outcome {
            Ok(registration) => registration,
            Err(err) => {
                tracing::warn!(error = %err, "nri: plugin connection refused");
                if matches!(err, ConnError::InvalidIdentity(_)) {
                    // The plugin is being answered with the reason; a plugin that reads
                    // it hangs up, one that does not is cut off after a short grace.
                    let _ = tokio::time::timeout(REFUSAL_GRACE, mux.closed()).await;
                }
                mux.close().await;
                return Err(err);
            }
        };
        tracing::info!(
            plugin = %registration.qualified_name(),
            nri_version = %registration.nri_version,
            pid = ?peer_pid,
            "nri: plugin registered"
        );
        Ok(PluginConn {
            inner: Arc::new(ConnInner {
                mux,
                client,
                registration,
                options,
                peer_pid,
                events: AtomicI32::new(0),
                state_change_fallback: AtomicI32::new(0),
            }),
        })
    }

    /// Who the plugin said it is.
    pub fn registration(&self) -> &Registration {
        &self.inner.registration
    }

    /// Process id of the peer, if the kernel told.
    pub fn peer_pid(&self) -> Option<i32> {
        self.inner.peer_pid
    }

    /// Events the plugin subscribed to in [`configure`](Self::configure).
    pub fn events(&self) -> EventMask {
        EventMask(self.inner.events.load(Ordering::Relaxed))
    }

    /// True if the plugin subscribed to `event`.
    pub fn subscribed(&self, event: Event) -> bool {
        self.events().contains(event)
    }

    /// Events this plugin receives through the deprecated StateChange call because it
    /// does not implement their dedicated RPC (built against NRI before v0.12).
    pub fn state_change_events(&self) -> EventMask {
        EventMask(self.inner.state_change_fallback.load(Ordering::Relaxed))
    }

    /// The timeout every call into the plugin is bounded by.
    pub fn request_timeout(&self) -> Duration {
        self.inner.options.request_timeout
    }

    /// Closes the connection.
    pub async fn close(&self) {
        self.inner.mux.close().await;
    }

    /// Waits until the connection is gone and tells why.
    pub async fn closed(&self) -> MuxError {
        self.inner.mux.closed().await
    }

    /// Why the connection is gone, or `None` while it works.
    pub fn error(&self) -> Option<MuxError> {
        self.inner.mux.error()
    }

    async fn call<Req: Message, Resp: Message + Default>(
        &self,
        method: &str,
        req: &Req,
    ) -> Result<Resp, ConnError> {
        self.call_within(method, req, self.inner.options.request_timeout)
            .await
    }

    async fn call_within<Req: Message, Resp: Message + Default>(
        &self,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, ConnError> {
        Ok(self.inner.client.call(method, req, Some(timeout)).await?)
    }

    /// The bound of each Synchronize message: the larger of the request and
    /// registration timeouts. Synchronize ends a plugin's admission, and a
    /// plugin that reconciles (or waits for) what it is shown there is not
    /// dropped at the request timeout, which would lose it every object
    /// created meanwhile.
    pub fn sync_timeout(&self) -> Duration {
        let o = &self.inner.options;
        o.request_timeout.max(o.registration_timeout)
    }

    /// Sends Configure and records the subscription. An answer of 0 means every event,
    /// as in containerd.
    pub async fn configure(
        &self,
        config: &str,
        runtime_name: &str,
        runtime_version: &str,
    ) -> Result<EventMask, ConnError> {
        let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let req = api::ConfigureRequest {
            config: config.to_string(),
            runtime_name: runtime_name.to_string(),
            runtime_version: runtime_version.to_string(),
            registration_timeout: millis(self.inner.options.registration_timeout),
            request_timeout: millis(self.inner.options.request_timeout),
            nri_version: api::NRI_VERSION.to_string(),
        };
        let resp: api::ConfigureResponse = self.call(method::CONFIGURE, &req).await?;
        let mut events = EventMask(resp.events);
        if events.invalid_bits() != 0 {
            return Err(ConnError::InvalidEvents(events.invalid_bits()));
        }
        if events.is_empty() {
            events = EventMask::ALL;
        }
        self.inner.events.store(events.0, Ordering::Relaxed);
        tracing::info!(plugin = %self.registration().qualified_name(), %events, "nri: plugin configured");
        Ok(events)
    }

    /// Sends every pod and container, split into as many Synchronize messages as the
    /// size budget needs (`more` set on all but the last), and returns the updates the
    /// plugin asks for. Each message is bounded by [`PluginConn::sync_timeout`].
    pub async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, ConnError> {
        let chunks = sync_chunks(pods, containers, self.inner.options.sync_message_bytes)?;
        let last = chunks.len().saturating_sub(1);
        for (i, (p, c)) in chunks.into_iter().enumerate() {
            let more = i != last;
            let req = api::SynchronizeRequest {
                pods: pods[p].to_vec(),
                containers: containers[c].to_vec(),
                more,
            };
            let resp: api::SynchronizeResponse = self
                .call_within(method::SYNCHRONIZE, &req, self.sync_timeout())
                .await?;
            if !more {
                return Ok(resp.update);
            }
            if !resp.more || !resp.update.is_empty() {
                return Err(ConnError::SplitSyncUnsupported {
                    more: resp.more,
                    updates: resp.update.len(),
                });
            }
        }
        Ok(Vec::new())
    }

    /// Tells the plugin the runtime is going down.
    pub async fn shutdown(&self) -> Result<(), ConnError> {
        let _: api::Empty = self.call(method::SHUTDOWN, &api::Empty {}).await?;
        Ok(())
    }

    /// Sends a raw StateChange notification.
    pub async fn state_change(&self, event: &api::StateChangeEvent) -> Result<(), ConnError> {
        let _: api::Empty = self.call(method::STATE_CHANGE, event).await?;
        Ok(())
    }

    /// Delivers an event whose dedicated RPC older plugins lack: if the plugin answered
    /// Unimplemented once, the event goes through StateChange from then on.
    async fn notify<Req: Message>(
        &self,
        method: &str,
        event: Event,
        req: &Req,
        pod: Option<&api::PodSandbox>,
        container: Option<&api::Container>,
    ) -> Result<(), ConnError> {
        let bit = EventMask::of(event).0;
        if self.inner.state_change_fallback.load(Ordering::Relaxed) & bit == 0 {
            match self.call::<Req, api::Empty>(method, req).await {
                Ok(_) => return Ok(()),
                Err(ConnError::Rpc(e)) if e.is_unimplemented() => {
                    self.inner
                        .state_change_fallback
                        .fetch_or(bit, Ordering::Relaxed);
                    tracing::warn!(
                        plugin = %self.registration().qualified_name(),
                        event = event.as_str_name(),
                        "nri: plugin lacks the dedicated RPC, using deprecated StateChange"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        self.state_change(&api::StateChangeEvent {
            event: event as i32,
            pod: pod.cloned(),
            container: container.cloned(),
        })
        .await
    }

    /// RunPodSandbox (StateChange fallback).
    pub async fn run_pod_sandbox(&self, req: &api::RunPodSandboxRequest) -> Result<(), ConnError> {
        let pod = req.pod.as_ref();
        self.notify(
            method::RUN_POD_SANDBOX,
            Event::RunPodSandbox,
            req,
            pod,
            None,
        )
        .await
    }

    /// UpdatePodSandbox.
    pub async fn update_pod_sandbox(
        &self,
        req: &api::UpdatePodSandboxRequest,
    ) -> Result<api::UpdatePodSandboxResponse, ConnError> {
        self.call(method::UPDATE_POD_SANDBOX, req).await
    }

    /// PostUpdatePodSandbox (StateChange fallback).
    pub async fn post_update_pod_sandbox(
        &self,
        req: &api::PostUpdatePodSandboxRequest,
    ) -> Result<(), ConnError> {
        let pod = req.pod.as_ref();
        self.notify(
            method::POST_UPDATE_POD_SANDBOX,
            Event::PostUpdatePodSandbox,
            req,
            pod,
            None,
        )
        .await
    }

    /// StopPodSandbox (StateChange fallback).
    pub async fn stop_pod_sandbox(
        &self,
        req: &api::StopPodSandboxRequest,
    ) -> Result<(), ConnError> {
        let pod = req.pod.as_ref();
        self.notify(
            method::STOP_POD_SANDBOX,
            Event::StopPodSandbox,
            req,
            pod,
            None,
        )
        .await
    }

    /// RemovePodSandbox (StateChange fallback).
    pub async fn remove_pod_sandbox(
        &self,
        req: &api::RemovePodSandboxRequest,
    ) -> Result<(), ConnError> {
        let pod = req.pod.as_ref();
        self.notify(
            method::REMOVE_POD_SANDBOX,
            Event::RemovePodSandbox,
            req,
            pod,
            None,
        )
        .await
    }

    /// CreateContainer: the plugin's adjustment, updates and evictions.
    pub async fn create_container(
        &self,
        req: &api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, ConnError> {
        self.call(method::CREATE_CONTAINER, req).await
    }

    /// PostCreateContainer (StateChange fallback).
    pub async fn post_create_container(
        &self,
        req: &api::PostCreateContainerRequest,
    ) -> Result<(), ConnError> {
        let (pod, ctr) = (req.pod.as_ref(), req.container.as_ref());
        self.notify(
            method::POST_CREATE_CONTAINER,
            Event::PostCreateContainer,
            req,
            pod,
            ctr,
        )
        .await
    }

    /// StartContainer (StateChange fallback).
    pub async fn start_container(&self, req: &api::StartContainerRequest) -> Result<(), ConnError> {
        let (pod, ctr) = (req.pod.as_ref(), req.container.as_ref());
        self.notify(
            method::START_CONTAINER,
            Event::StartContainer,
            req,
            pod,
            ctr,
        )
        .await
    }

    /// PostStartContainer (StateChange fallback).
    pub async fn post_start_container(
        &self,
        req: &api::PostStartContainerRequest,
    ) -> Result<(), ConnError> {
        let (pod, ctr) = (req.pod.as_ref(), req.container.as_ref());
        self.notify(
            method::POST_START_CONTAINER,
            Event::PostStartContainer,
            req,
            pod,
            ctr,
        )
        .await
    }

    /// UpdateContainer: further updates and evictions.
    pub async fn update_container(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, ConnError> {
        self.call(method::UPDATE_CONTAINER, req).await
    }

    /// PostUpdateContainer (StateChange fallback).
    pub async fn post_update_container(
        &self,
        req: &api::PostUpdateContainerRequest,
    ) -> Result<(), ConnError> {
        let (pod, ctr) = (req.pod.as_ref(), req.container.as_ref());
        self.notify(
            method::POST_UPDATE_CONTAINER,
            Event::PostUpdateContainer,
            req,
            pod,
            ctr,
        )
        .await
    }

    /// StopContainer: updates to the remaining containers.
    pub async fn stop_container(
        &self,
        req: &api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, ConnError> {
        self.call(method::STOP_CONTAINER, req).await
    }

    /// RemoveContainer (StateChange fallback).
    pub async fn remove_container(
        &self,
        req: &api::RemoveContainerRequest,
    ) -> Result<(), ConnError> {
        let (pod, ctr) = (req.pod.as_ref(), req.container.as_ref());
        self.notify(
            method::REMOVE_CONTAINER,
            Event::RemoveContainer,
            req,
            pod,
            ctr,
        )
        .await
    }

    /// ValidateContainerAdjustment.
    pub async fn validate_container_adjustment(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, ConnError> {
        self.call(method::VALIDATE_CONTAINER_ADJUSTMENT, req).await
    }
}

/// Builds the Runtime service: the first valid RegisterPlugin completes `reg_tx`;
/// UpdateContainers is refused until then and handed to `handler` after.
fn runtime_service<H: RuntimeHandler>(
    handler: Arc<H>,
    registered: RegistrationSlot,
    reg_tx: oneshot::Sender<Result<Registration, ConnError>>,
) -> Handler {
    let reg_tx = Arc::new(StdMutex::new(Some(reg_tx)));
    Arc::new(move |method: String, payload| -> HandlerFuture {
        let handler = handler.clone();
        let registered = registered.clone();
        let reg_tx = reg_tx.clone();
        Box::pin(async move {
            match method.as_str() {
                method::REGISTER_PLUGIN => {
                    let req: api::RegisterPluginRequest = rpc::decode_arg(&method, payload)?;
                    let checked = api::check_plugin_name(&req.plugin_name)
                        .and_then(|_| api::check_plugin_index(&req.plugin_idx));
                    let waiter = reg_tx.lock().ok().and_then(|mut t| t.take());
                    let Some(waiter) = waiter else {
                        return Err(Status::new(
                            Code::FailedPrecondition,
                            "plugin already registered",
                        ));
                    };
                    match checked {
                        Ok(()) => {
                            let reg = Registration {
                                name: req.plugin_name,
                                index: req.plugin_idx,
                                nri_version: req.nri_version,
                            };
                            if let Ok(mut slot) = registered.lock() {
                                *slot = Some(reg.clone());
                            }
                            let _ = waiter.send(Ok(reg));
                            Ok(api::Empty {}.encode_to_vec())
                        }
                        Err(e) => {
                            let status = Status::new(Code::InvalidArgument, e.to_string());
                            let _ = waiter.send(Err(ConnError::InvalidIdentity(e)));
                            Err(status)
                        }
                    }
                }
                method::UPDATE_CONTAINERS => {
                    let req: api::UpdateContainersRequest = rpc::decode_arg(&method, payload)?;
                    let reg = registered.lock().ok().and_then(|r| r.clone());
                    let Some(reg) = reg else {
                        return Err(Status::new(
                            Code::FailedPrecondition,
                            "UpdateContainers before RegisterPlugin",
                        ));
                    };
                    tracing::info!(
                        plugin = %reg.qualified_name(),
                        updates = req.update.len(),
                        evictions = req.evict.len(),
                        "nri: plugin requested container updates"
                    );
                    let resp = handler.update_containers(&reg, req).await?;
                    Ok(resp.encode_to_vec())
                }
                other => Err(rpc::unimplemented(api::RUNTIME_SERVICE, other)),
            }
        })
    })
}

/// Size a message field holding `len` bytes costs: tag, length prefix, body.
fn field_cost(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

type Chunk = (std::ops::Range<usize>, std::ops::Range<usize>);

/// Splits pods then containers into consecutive ranges whose encoded Synchronize
/// message stays within `budget` bytes. Always at least one (possibly empty) chunk.
fn sync_chunks(
    pods: &[api::PodSandbox],
    containers: &[api::Container],
    budget: usize,
) -> Result<Vec<Chunk>, ConnError> {
    // Room for the `more` flag.
    let budget = budget.saturating_sub(2);
    let mut chunks = Vec::new();
    let (mut p0, mut c0, mut used) = (0usize, 0usize, 0usize);
    for (i, pod) in pods.iter().enumerate() {
        let cost = field_cost(pod.encoded_len());
        if cost > budget {
            return Err(ConnError::SyncObjectTooLarge {
                kind: "pod",
                id: pod.id.clone(),
                len: cost,
                max: budget,
            });
        }
        if used + cost > budget {
            chunks.push((p0..i, 0..0));
            p0 = i;
            used = 0;
        }
        used += cost;
    }
    for (i, ctr) in containers.iter().enumerate() {
        let cost = field_cost(ctr.encoded_len());
        if cost > budget {
            return Err(ConnError::SyncObjectTooLarge {
                kind: "container",
                id: ctr.id.clone(),
                len: cost,
                max: budget,
            });
        }
        if used + cost > budget {
            chunks.push((p0..pods.len(), c0..i));
            p0 = pods.len();
            c0 = i;
            used = 0;
        }
        used += cost;
    }
    chunks.push((p0..pods.len(), c0..containers.len()));
    Ok(chunks)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ctr(id: usize, pad: usize) -> api::Container {
        api::Container {
            id: format!("c{id}"),
            args: vec!["x".repeat(pad)],
            ..Default::default()
        }
    }

    struct NoUpdates;
    impl RuntimeHandler for NoUpdates {
        async fn update_containers(
            &self,
            _plugin: &Registration,
            _req: api::UpdateContainersRequest,
        ) -> Result<api::UpdateContainersResponse, Status> {
            Ok(api::UpdateContainersResponse::default())
        }
    }

    /// A plugin built against NRI before v0.12 knows StartContainer only as a
    /// StateChange: the connection falls back once and remembers it.
    #[tokio::test]
    async fn old_plugin_gets_events_through_state_change() {
        use tokio::sync::mpsc;
        let (a, b) = UnixStream::pair().unwrap();
        // The old plugin: a ttRPC server on connection 1 that knows only StateChange,
        // and a client on connection 2 that registers.
        let (mux, reading) = Mux::open(b, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let old: Handler = Arc::new(move |method: String, payload| -> HandlerFuture {
            let tx = tx.clone();
            Box::pin(async move {
                match method.as_str() {
                    method::STATE_CHANGE => {
                        let evt: api::StateChangeEvent = rpc::decode_arg(&method, payload)?;
                        let _ = tx.send((evt.event, evt.container.map(|c| c.id)));
                        Ok(api::Empty {}.encode_to_vec())
                    }
                    other => Err(rpc::unimplemented(api::PLUGIN_SERVICE, other)),
                }
            })
        });
        let (client, answers) =
            RpcClient::new(mux.clone(), RUNTIME_SERVICE_CONN, api::RUNTIME_SERVICE);
        reading
            .start(vec![
                (
                    PLUGIN_SERVICE_CONN,
                    Box::new(rpc::server(PLUGIN_SERVICE_CONN, api::PLUGIN_SERVICE, old)),
                ),
                (RUNTIME_SERVICE_CONN, Box::new(answers)),
            ])
            .unwrap();
        let register = tokio::spawn(async move {
            let req = api::RegisterPluginRequest {
                plugin_name: "old".into(),
                plugin_idx: "03".into(),
                nri_version: String::new(),
            };
            client
                .call::<_, api::Empty>(method::REGISTER_PLUGIN, &req, None)
                .await
        });

        let conn = PluginConn::accept(a, Arc::new(NoUpdates), ConnOptions::default())
            .await
            .unwrap();
        register.await.unwrap().unwrap();
        assert_eq!(conn.registration().nri_version, "");
        for id in ["c1", "c2"] {
            let req = api::StartContainerRequest {
                pod: None,
                container: Some(api::Container {
                    id: id.into(),
                    ..Default::default()
                }),
            };
            conn.start_container(&req).await.unwrap();
            let got = rx.recv().await.unwrap();
            assert_eq!(got, (Event::StartContainer as i32, Some(id.to_string())));
        }
        assert_eq!(
            conn.state_change_events(),
            EventMask::of(Event::StartContainer)
        );
        // Events with no StateChange form fail as Unimplemented.
        let err = conn
            .create_container(&api::CreateContainerRequest::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ConnError::Rpc(e) if e.is_unimplemented()),
            "{err:?}"
        );
    }

    #[test]
    fn chunks_cover_everything_in_order_within_budget() {
        let pods: Vec<api::PodSandbox> = (0..10)
            .map(|i| api::PodSandbox {
                id: format!("p{i}"),
                ..Default::default()
            })
            .collect();
        let ctrs: Vec<api::Container> = (0..100).map(|i| ctr(i, 100)).collect();
        let budget = 1000;
        let chunks = sync_chunks(&pods, &ctrs, budget).unwrap();
        assert!(chunks.len() > 1);
        let (mut np, mut nc) = (0, 0);
        for (p, c) in &chunks {
            assert_eq!(p.start, np);
            assert_eq!(c.start, nc);
            np = p.end;
            nc = c.end;
            let msg = api::SynchronizeRequest {
                pods: pods[p.clone()].to_vec(),
                containers: ctrs[c.clone()].to_vec(),
                more: true,
            };
            assert!(
                msg.encoded_len() <= budget,
                "{} > {budget}",
                msg.encoded_len()
            );
        }
        assert_eq!((np, nc), (10, 100));
        // Everything fits: one message.
        assert_eq!(sync_chunks(&pods, &ctrs, 1 << 20).unwrap().len(), 1);
        // Nothing to send: still one (empty) message.
        assert_eq!(sync_chunks(&[], &[], 1000).unwrap(), vec![(0..0, 0..0)]);
        // One object over budget.
        assert!(matches!(
            sync_chunks(&[], &[ctr(1, 5000)], 1000),
            Err(ConnError::SyncObjectTooLarge {
                kind: "container",
                ..
            })
        ));
    }
}
