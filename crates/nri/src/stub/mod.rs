//! The plugin SDK: what an NRI plugin author depends on.
//!
//! A plugin is a piece of shared state `S` plus the handlers it registers on a
//! [`StubBuilder`]. **Registering a handler is what subscribes the plugin to its event**:
//! the subscription mask sent in the Configure answer is computed from the registered
//! handlers, so events are never listed twice and a handler can never be forgotten in
//! the mask (or the mask name an event nobody handles). Unregistered events are not
//! subscribed, which is the "default no-op" of every handler. (A trait with default
//! methods cannot do this: Rust cannot tell at run time which default methods were
//! overridden, and the mask must be known before the first event arrives.)
//!
//! Handlers are `async` closures or functions taking `Arc<S>` and the request, so a
//! method `async fn create_container(self: Arc<Self>, req: CreateContainerRequest)` can
//! be registered as `MyPlugin::create_container`.
//!
//! Connection: a plugin launched by the runtime finds its socket in `NRI_PLUGIN_SOCKET`
//! (an inherited fd) and its identity in `NRI_PLUGIN_NAME`/`NRI_PLUGIN_IDX`; otherwise
//! it dials the runtime's socket ([`api::DEFAULT_SOCKET_PATH`] unless
//! [`StubBuilder::socket_path`] says otherwise). A dialled plugin reconnects with
//! exponential backoff when the runtime goes away (a runtime restart); a plugin on an
//! inherited socket ends [`Stub::run`] when the connection closes, as containerd's
//! plugins exit, because the runtime launches a fresh process instead.
//!
//! Compatibility: events that containerd 1.7 delivers through StateChange reach the same
//! handlers as the dedicated RPCs of newer runtimes, and a split Synchronize (`more`) is
//! reassembled before the synchronize handler sees it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use petrel_nri::api::{ContainerAdjustment, CreateContainerRequest, CreateContainerResponse};
//! use petrel_nri::stub::{PluginError, Stub};
//!
//! struct Labeller {
//!     value: String,
//! }
//!
//! impl Labeller {
//!     async fn create_container(
//!         self: Arc<Self>,
//!         req: CreateContainerRequest,
//!     ) -> Result<CreateContainerResponse, PluginError> {
//!         let name = req.container.map(|c| c.name).unwrap_or_default();
//!         let mut adjust = ContainerAdjustment::default();
//!         adjust.annotations.insert("example.com/seen-by".into(), self.value.clone());
//!         tracing::info!(%name, "adjusting");
//!         Ok(CreateContainerResponse { adjust: Some(adjust), ..Default::default() })
//!     }
//! }
//!
//! # async fn example() -> Result<(), petrel_nri::stub::StubError> {
//! let stub = Stub::builder(Labeller { value: "labeller".into() })
//!     .name("labeller")
//!     .index("50")
//!     .on_create_container(Labeller::create_container)
//!     .on_remove_container(|_state, req| async move {
//!         tracing::info!(id = ?req.container.map(|c| c.id), "removed");
//!         Ok(())
//!     })
//!     .build()?;
//! // A handle can ask the runtime for unsolicited updates at any time.
//! let _handle = stub.handle();
//! stub.run().await
//! # }
//! ```

mod handlers;
mod session;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::api::{self, EventMask, IdentityError};
use crate::mux::MuxError;
use crate::rpc::RpcError;

use handlers::Handlers;
pub use handlers::PluginError;
use session::Session;

/// Errors of the plugin SDK.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum StubError {
    /// Name or index missing or invalid.
    #[error("plugin identity: {0}")]
    Identity(#[from] IdentityError),
    /// The plugin registered no event handler: it would be subscribed to nothing.
    #[error("plugin registers no event handler")]
    NoHandlers,
    /// The runtime's socket could not be dialled.
    #[error("cannot connect to the NRI socket {path}: {reason}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// OS error.
        reason: String,
    },
    /// `NRI_PLUGIN_SOCKET` is set but unusable.
    #[error("inherited NRI socket: {0}")]
    InheritedSocket(String),
    /// RegisterPlugin failed.
    #[error("registration failed: {0}")]
    Register(RpcError),
    /// The configure handler failed or asked for events it has no handler for.
    #[error("configuration failed: {0}")]
    Configure(String),
    /// The connection to the runtime ended.
    #[error("connection to the runtime lost: {0}")]
    Disconnected(MuxError),
    /// No connection to the runtime right now.
    #[error("not connected to the runtime")]
    NotConnected,
    /// A call to the runtime failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
}

/// Reconnection policy for dialled connections: the delay starts at `initial` and
/// doubles up to `max` after every failed attempt; a session that got configured resets
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

/// How the stub reaches the runtime.
enum Transport {
    /// Dial this socket path (external plugin).
    Dial(PathBuf),
    /// Use this already connected stream once (inherited socket or given connection).
    Given(Option<UnixStream>),
}

/// What the runtime said in Configure, as the plugin last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// Runtime name, e.g. "containerd" or "petrel".
    pub runtime_name: String,
    /// Runtime version.
    pub runtime_version: String,
    /// NRI version of the runtime ("" for runtimes that do not say, such as 1.7).
    pub nri_version: String,
    /// Registration timeout the runtime applies (zero if it did not say: containerd 1.7).
    pub registration_timeout: Duration,
    /// Per-request timeout the runtime applies: handlers should finish well within it
    /// (zero if the runtime did not say: containerd 1.7, whose default is 2 s).
    pub request_timeout: Duration,
    /// Events the plugin is subscribed to.
    pub events: EventMask,
}

/// Shared between the stub, its sessions and handles.
pub(crate) struct Shared {
    /// The current session, while one is configured.
    pub(crate) current: watch::Sender<Option<Arc<Session>>>,
    /// Asks `run` to stop.
    pub(crate) stop: watch::Sender<bool>,
}

/// A configured plugin, ready to [`run`](Stub::run).
pub struct Stub<S> {
    name: String,
    index: String,
    transport: Transport,
    reconnect: Option<Backoff>,
    registration_timeout: Duration,
    handlers: Arc<Handlers<S>>,
    state: Arc<S>,
    shared: Arc<Shared>,
}

/// Builds a [`Stub`]: identity, transport, and the handlers (= subscriptions).
pub struct StubBuilder<S> {
    name: Option<String>,
    index: Option<String>,
    socket_path: Option<PathBuf>,
    connection: Option<UnixStream>,
    reconnect: Option<Backoff>,
    registration_timeout: Duration,
    handlers: Handlers<S>,
    state: S,
    shared: Arc<Shared>,
}

/// A cloneable handle on a running stub: calls to the runtime that are not answers to
/// an event.
#[derive(Clone)]
pub struct StubHandle {
    shared: Arc<Shared>,
}

static INHERITED_TAKEN: AtomicBool = AtomicBool::new(false);

impl<S: Send + Sync + 'static> Stub<S> {
    /// Starts building a plugin around `state`.
    pub fn builder(state: S) -> StubBuilder<S> {
        StubBuilder {
            name: None,
            index: None,
            socket_path: None,
            connection: None,
            reconnect: Some(Backoff::default()),
            registration_timeout: Duration::from_secs(5),
            handlers: Handlers::default(),
            state,
            shared: Arc::new(Shared {
                current: watch::channel(None).0,
                stop: watch::channel(false).0,
            }),
        }
    }

    /// Plugin name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Plugin index.
    pub fn index(&self) -> &str {
        &self.index
    }

    /// Events the plugin subscribes to (from its registered handlers).
    pub fn events(&self) -> EventMask {
        self.handlers.events()
    }

    /// A handle for calls to the runtime from outside the handlers.
    pub fn handle(&self) -> StubHandle {
        StubHandle {
            shared: self.shared.clone(),
        }
    }

    /// Runs the plugin: connect, register, serve events. With a dialled socket it
    /// reconnects with backoff whenever the runtime goes away, until
    /// [`StubHandle::stop`]. With an inherited or given connection it returns when that
    /// connection ends (`Ok` after a Shutdown or a stop, the cause otherwise).
    pub async fn run(mut self) -> Result<(), StubError> {
        let mut stop = self.shared.stop.subscribe();
        let mut delay = self.reconnect.map(|b| b.initial);
        loop {
            if *stop.borrow_and_update() {
                return Ok(());
            }
            let (stream, redial) = match &mut self.transport {
                Transport::Given(stream) => match stream.take() {
                    Some(s) => (Ok(s), false),
                    None => return Err(StubError::Disconnected(MuxError::Closed)),
                },
                Transport::Dial(path) => (
                    UnixStream::connect(&*path)
                        .await
                        .map_err(|e| StubError::Connect {
                            path: path.clone(),
                            reason: e.to_string(),
                        }),
                    true,
                ),
            };
            let end = match stream {
                Ok(stream) => {
                    let session = session::run_session(
                        stream,
                        &self.name,
                        &self.index,
                        self.registration_timeout,
                        self.handlers.clone(),
                        self.state.clone(),
                        self.shared.clone(),
                    );
                    tokio::select! {
                        end = session => end,
                        _ = stop.wait_for(|s| *s) => {
                            self.shared.current.send_replace(None);
                            return Ok(());
                        }
                    }
                }
                Err(cause) => session::SessionEnd {
                    configured: false,
                    shutdown: false,
                    cause,
                },
            };
            self.shared.current.send_replace(None);
            let backoff = match self.reconnect {
                Some(backoff) if redial => backoff,
                // An inherited connection is used once, as containerd's plugins do: the
                // runtime launches a new process rather than expecting this one back.
                _ if end.shutdown => return Ok(()),
                _ => return Err(end.cause),
            };
            if end.configured {
                delay = Some(backoff.initial);
            }
            let wait = delay.unwrap_or(backoff.initial);
            tracing::info!(error = %end.cause, retry_in = ?wait, "nri plugin: no runtime connection, retrying");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
            delay = Some((wait * 2).min(backoff.max));
        }
    }
}

impl<S: Send + Sync + 'static> StubBuilder<S> {
    /// Plugin name (default: `NRI_PLUGIN_NAME`, else from the executable's `NN-name`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Plugin index, two digits (default: `NRI_PLUGIN_IDX`, else from `NN-name`).
    pub fn index(mut self, index: impl Into<String>) -> Self {
        self.index = Some(index.into());
        self
    }

    /// Socket to dial when no socket is inherited.
    pub fn socket_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket_path = Some(path.into());
        self
    }

    /// Uses an already connected stream (no reconnection), like an inherited socket.
    pub fn connection(mut self, stream: UnixStream) -> Self {
        self.connection = Some(stream);
        self
    }

    /// Reconnection backoff for dialled connections.
    pub fn reconnect(mut self, backoff: Backoff) -> Self {
        self.reconnect = Some(backoff);
        self
    }

    /// Do not reconnect: `run` returns when the connection ends.
    pub fn no_reconnect(mut self) -> Self {
        self.reconnect = None;
        self
    }

    /// How long to wait for RegisterPlugin's answer (default 5 s).
    pub fn registration_timeout(mut self, timeout: Duration) -> Self {
        self.registration_timeout = timeout;
        self
    }

    /// A handle on the stub being built, e.g. to keep in the plugin's state for
    /// unsolicited updates from background tasks (the same as [`Stub::handle`]).
    pub fn handle(&self) -> StubHandle {
        StubHandle {
            shared: self.shared.clone(),
        }
    }

    /// Resolves identity and transport. Fails without any event handler, or with an
    /// invalid name or index.
    pub fn build(self) -> Result<Stub<S>, StubError> {
        if self.handlers.events().is_empty() {
            return Err(StubError::NoHandlers);
        }
        let (name, index) = resolve_identity(self.name, self.index)?;
        let transport = if let Some(stream) = self.connection {
            Transport::Given(Some(stream))
        } else if let Some(stream) = inherited_socket()? {
            Transport::Given(Some(stream))
        } else {
            Transport::Dial(
                self.socket_path
                    .unwrap_or_else(|| PathBuf::from(api::DEFAULT_SOCKET_PATH)),
            )
        };
        Ok(Stub {
            name,
            index,
            transport,
            reconnect: self.reconnect,
            registration_timeout: self.registration_timeout,
            handlers: Arc::new(self.handlers),
            state: Arc::new(self.state),
            shared: self.shared,
        })
    }
}

impl StubHandle {
    /// Asks the runtime to update and/or evict containers. Returns the updates the
    /// runtime could not apply.
    pub async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, StubError> {
        let session = self
            .shared
            .current
            .borrow()
            .clone()
            .ok_or(StubError::NotConnected)?;
        session.update_containers(update, evict).await
    }

    /// Waits until the plugin is registered and configured, and returns what the
    /// runtime told it.
    pub async fn connected(&self) -> RuntimeInfo {
        let mut rx = self.shared.current.subscribe();
        loop {
            if let Some(session) = rx.borrow_and_update().clone() {
                return session.runtime_info();
            }
            if rx.changed().await.is_err() {
                // The stub is gone; nothing will ever connect.
                std::future::pending::<()>().await;
            }
        }
    }

    /// What the runtime said in Configure, if connected.
    pub fn runtime_info(&self) -> Option<RuntimeInfo> {
        self.shared
            .current
            .borrow()
            .as_ref()
            .map(|s| s.runtime_info())
    }

    /// Makes [`Stub::run`] return.
    pub fn stop(&self) {
        self.shared.stop.send_replace(true);
    }
}

fn resolve_identity(
    name: Option<String>,
    index: Option<String>,
) -> Result<(String, String), StubError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let name = name.or_else(|| env(api::PLUGIN_NAME_ENV));
    let index = index.or_else(|| env(api::PLUGIN_IDX_ENV));
    let exe = std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let (index, name) = match (index, name) {
        (Some(i), Some(n)) => (i, n),
        (Some(i), None) => (i, exe),
        (None, name) => {
            let (i, n) = api::parse_plugin_name(&exe)?;
            (i, name.unwrap_or(n))
        }
    };
    api::check_plugin_index(&index)?;
    api::check_plugin_name(&name)?;
    Ok((name, index))
}

/// Takes the socket named by `NRI_PLUGIN_SOCKET`, once per process.
fn inherited_socket() -> Result<Option<UnixStream>, StubError> {
    let Some(value) = std::env::var_os(api::PLUGIN_SOCKET_ENV) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().into_owned();
    if value.is_empty() {
        return Ok(None);
    }
    let fd: i32 = value.parse().map_err(|_| {
        StubError::InheritedSocket(format!(
            "{}={value:?} is not an fd number",
            api::PLUGIN_SOCKET_ENV
        ))
    })?;
    if fd < 3 {
        return Err(StubError::InheritedSocket(format!(
            "fd {fd} is a standard stream, not a socket"
        )));
    }
    if INHERITED_TAKEN.swap(true, Ordering::SeqCst) {
        return Err(StubError::InheritedSocket(
            "the inherited socket was already taken by another stub".into(),
        ));
    }
    let std_stream = take_inherited_fd(fd);
    std_stream
        .set_nonblocking(true)
        .map_err(|e| StubError::InheritedSocket(format!("fd {fd}: {e}")))?;
    // A non-socket fd fails here rather than at the first read.
    std_stream.peer_addr().map_err(|e| {
        StubError::InheritedSocket(format!("fd {fd} is not a connected unix socket: {e}"))
    })?;
    UnixStream::from_std(std_stream)
        .map(Some)
        .map_err(|e| StubError::InheritedSocket(format!("fd {fd}: {e}")))
}

/// The only unsafe operation of this crate: taking ownership of the fd the runtime
/// handed down. Rust cannot prove an inherited fd number is open and unowned; the NRI
/// launch protocol promises it (the runtime put its socketpair end there for us alone),
/// and `INHERITED_TAKEN` ensures it is taken once.
#[allow(unsafe_code)]
fn take_inherited_fd(fd: i32) -> std::os::unix::net::UnixStream {
    use std::os::fd::FromRawFd;
    // SAFETY: see above; ownership of `fd` passes to the returned stream exactly once.
    unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) }
}
