//! What a change means: kubelet's mapping of container state transitions
//! (relist) and of CRI event types (event stream) to lifecycle events, and
//! their delivery to the PLEG's sink.

use super::{PodLifecycleEvent, PodLifecycleEventType};
use petrel_cri::api;

/// A container's (or sandbox's) state as the relist sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObjState {
    Running,
    Exited,
    Created,
    Unknown,
    /// Not listed (never made, or removed).
    NonExistent,
}

impl ObjState {
    /// The state of a listed container.
    pub(crate) fn of_container(state: i32) -> Self {
        match api::ContainerState::try_from(state) {
            Ok(api::ContainerState::ContainerRunning) => Self::Running,
            Ok(api::ContainerState::ContainerExited) => Self::Exited,
            Ok(api::ContainerState::ContainerCreated) => Self::Created,
            Ok(api::ContainerState::ContainerUnknown) | Err(_) => Self::Unknown,
        }
    }

    /// The state of a listed sandbox: a ready sandbox counts as running, a
    /// not-ready one as exited (kubelet treats sandboxes like containers).
    pub(crate) fn of_sandbox(state: i32) -> Self {
        match api::PodSandboxState::try_from(state) {
            Ok(api::PodSandboxState::SandboxReady) => Self::Running,
            Ok(api::PodSandboxState::SandboxNotready) => Self::Exited,
            Err(_) => Self::Unknown,
        }
    }
}

/// The lifecycle events a transition from `old` to `new` means.
pub(crate) fn transition_events(old: ObjState, new: ObjState) -> &'static [PodLifecycleEventType] {
    use PodLifecycleEventType as T;
    if old == new {
        return &[];
    }
    match new {
        ObjState::Running => &[T::ContainerStarted],
        ObjState::Exited => &[T::ContainerDied],
        ObjState::Unknown => &[T::ContainerChanged],
        // Being created is no news for the pod worker (it made it); the pod
        // is still re-inspected because its state changed.
        ObjState::Created => &[],
        // Gone: if it was seen dead, only its removal is news; otherwise its
        // death was missed and is reported too.
        ObjState::NonExistent if old == ObjState::Exited => &[T::ContainerRemoved],
        ObjState::NonExistent => &[T::ContainerDied, T::ContainerRemoved],
    }
}

/// The lifecycle event a CRI event type stands for. CREATED stands for
/// none: the pod worker made the container itself, and reacting to it is
/// how upstream's evented PLEG restarted static pods (kubernetes #121349).
pub(crate) fn from_cri_event(event_type: i32) -> Option<PodLifecycleEventType> {
    match api::ContainerEventType::try_from(event_type) {
        Ok(api::ContainerEventType::ContainerStartedEvent) => {
            Some(PodLifecycleEventType::ContainerStarted)
        }
        Ok(api::ContainerEventType::ContainerStoppedEvent) => {
            Some(PodLifecycleEventType::ContainerDied)
        }
        Ok(api::ContainerEventType::ContainerDeletedEvent) => {
            Some(PodLifecycleEventType::ContainerRemoved)
        }
        Ok(api::ContainerEventType::ContainerCreatedEvent) | Err(_) => None,
    }
}

/// Delivers lifecycle events to the PLEG's sink.
pub(crate) struct Emitter {
    sink: super::EventSink,
}

impl Emitter {
    pub(crate) fn new(sink: super::EventSink) -> Self {
        Self { sink }
    }

    /// Hands `event` to the sink. ContainerChanged is never sent, like
    /// kubelet.
    pub(crate) fn emit(&self, event: PodLifecycleEvent) {
        if event.kind == PodLifecycleEventType::ContainerChanged {
            return;
        }
        (self.sink)(event);
    }
}
