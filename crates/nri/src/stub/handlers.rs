//! Handler storage and the builder methods that register handlers (and with them the
//! subscription to their events).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::api::{self, Event, EventMask};

use super::StubBuilder;

/// A handler's failure, reported to the runtime as the call's error status (for
/// validation: as a rejection with this reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginError(String);

impl PluginError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> PluginError {
        PluginError(message.into())
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Any error converts, so handlers can use `?` on their own errors.
impl<E: std::error::Error> From<E> for PluginError {
    fn from(e: E) -> PluginError {
        PluginError(e.to_string())
    }
}

pub(crate) type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, PluginError>> + Send>>;
pub(crate) type Handler<S, Req, Resp> = Arc<dyn Fn(Arc<S>, Req) -> BoxFut<Resp> + Send + Sync>;
pub(crate) type SyncHandler<S> = Arc<
    dyn Fn(Arc<S>, Vec<api::PodSandbox>, Vec<api::Container>) -> BoxFut<Vec<api::ContainerUpdate>>
        + Send
        + Sync,
>;
pub(crate) type ShutdownHandler<S> = Arc<dyn Fn(Arc<S>) -> BoxFut<()> + Send + Sync>;

macro_rules! event_handlers {
    ($( $(#[$doc:meta])* $field:ident => $setter:ident, $event:ident, $req:ty, $resp:ty; )*) => {
        /// The registered handlers of a plugin.
        pub(crate) struct Handlers<S> {
            pub(crate) configure: Option<Handler<S, api::ConfigureRequest, Option<EventMask>>>,
            pub(crate) synchronize: Option<SyncHandler<S>>,
            pub(crate) shutdown: Option<ShutdownHandler<S>>,
            $( pub(crate) $field: Option<Handler<S, $req, $resp>>, )*
        }

        impl<S> Default for Handlers<S> {
            fn default() -> Self {
                Handlers {
                    configure: None,
                    synchronize: None,
                    shutdown: None,
                    $( $field: None, )*
                }
            }
        }

        impl<S> Handlers<S> {
            /// The subscription: one event per registered event handler.
            pub(crate) fn events(&self) -> EventMask {
                let mut mask = EventMask::EMPTY;
                $( if self.$field.is_some() { mask.set(Event::$event); } )*
                mask
            }
        }

        impl<S: Send + Sync + 'static> StubBuilder<S> {
            $(
                $(#[$doc])*
                pub fn $setter<F, Fut>(mut self, handler: F) -> Self
                where
                    F: Fn(Arc<S>, $req) -> Fut + Send + Sync + 'static,
                    Fut: Future<Output = Result<$resp, PluginError>> + Send + 'static,
                {
                    self.handlers.$field = Some(Arc::new(move |s, r| Box::pin(handler(s, r))));
                    self
                }
            )*
        }
    };
}

event_handlers! {
    /// Handles RunPodSandbox (also when delivered through StateChange).
    run_pod_sandbox => on_run_pod_sandbox, RunPodSandbox, api::RunPodSandboxRequest, ();
    /// Handles UpdatePodSandbox.
    update_pod_sandbox => on_update_pod_sandbox, UpdatePodSandbox, api::UpdatePodSandboxRequest, ();
    /// Handles PostUpdatePodSandbox (also through StateChange).
    post_update_pod_sandbox => on_post_update_pod_sandbox, PostUpdatePodSandbox, api::PostUpdatePodSandboxRequest, ();
    /// Handles StopPodSandbox (also through StateChange).
    stop_pod_sandbox => on_stop_pod_sandbox, StopPodSandbox, api::StopPodSandboxRequest, ();
    /// Handles RemovePodSandbox (also through StateChange).
    remove_pod_sandbox => on_remove_pod_sandbox, RemovePodSandbox, api::RemovePodSandboxRequest, ();
    /// Handles CreateContainer: answer with an adjustment, updates of other containers
    /// and evictions.
    create_container => on_create_container, CreateContainer, api::CreateContainerRequest, api::CreateContainerResponse;
    /// Handles PostCreateContainer (also through StateChange).
    post_create_container => on_post_create_container, PostCreateContainer, api::PostCreateContainerRequest, ();
    /// Handles StartContainer (also through StateChange).
    start_container => on_start_container, StartContainer, api::StartContainerRequest, ();
    /// Handles PostStartContainer (also through StateChange).
    post_start_container => on_post_start_container, PostStartContainer, api::PostStartContainerRequest, ();
    /// Handles UpdateContainer: answer with updates and evictions.
    update_container => on_update_container, UpdateContainer, api::UpdateContainerRequest, api::UpdateContainerResponse;
    /// Handles PostUpdateContainer (also through StateChange).
    post_update_container => on_post_update_container, PostUpdateContainer, api::PostUpdateContainerRequest, ();
    /// Handles StopContainer: answer with updates of the remaining containers.
    stop_container => on_stop_container, StopContainer, api::StopContainerRequest, api::StopContainerResponse;
    /// Handles RemoveContainer (also through StateChange).
    remove_container => on_remove_container, RemoveContainer, api::RemoveContainerRequest, ();
    /// Validates the merged adjustment of a container: an `Err` rejects it with its
    /// message as the reason.
    validate_container_adjustment => on_validate_container_adjustment, ValidateContainerAdjustment, api::ValidateContainerAdjustmentRequest, ();
}

impl<S: Send + Sync + 'static> StubBuilder<S> {
    /// Handles Configure: gets the plugin's configuration text and the runtime's
    /// identity. May narrow the subscription by answering `Some(mask)` (a subset of the
    /// registered handlers' events); `None` keeps all of them.
    pub fn on_configure<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(Arc<S>, api::ConfigureRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<EventMask>, PluginError>> + Send + 'static,
    {
        self.handlers.configure = Some(Arc::new(move |s, r| Box::pin(handler(s, r))));
        self
    }

    /// Handles Synchronize: every pod and container the runtime knows, reassembled if
    /// the runtime split them. Answer with updates to existing containers.
    pub fn on_synchronize<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(Arc<S>, Vec<api::PodSandbox>, Vec<api::Container>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<api::ContainerUpdate>, PluginError>> + Send + 'static,
    {
        self.handlers.synchronize = Some(Arc::new(move |s, p, c| Box::pin(handler(s, p, c))));
        self
    }

    /// Handles Shutdown (the runtime is going down).
    pub fn on_shutdown<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(Arc<S>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), PluginError>> + Send + 'static,
    {
        self.handlers.shutdown = Some(Arc::new(move |s| Box::pin(handler(s))));
        self
    }
}
