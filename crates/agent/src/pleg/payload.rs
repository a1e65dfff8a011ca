//! An event's payload as its pod's status. Petrel and containerd send,
//! with each event, the status of the event's sandbox and of every
//! container in it: what PodSandboxStatus and ContainerStatus would
//! answer. When that is the whole pod as the PLEG last saw it, the payload
//! stands for an inspection (kubelet's evented PLEG caches it likewise).
//! Anything less leaves the inspection to do: no sandbox status, a
//! container the PLEG saw missing from it, another sandbox of the pod, a
//! deletion, a sandbox's own event, a pod never seen.

use petrel_cri::api;

use super::events::from_cri_event;
use super::inspect::assemble;
use super::seen::PodSeen;
use super::PodLifecycleEventType;
use crate::types::{PodRuntimeStatus, ANNOTATION_CONTAINER_KIND, LABEL_POD_UID};

/// Why a payload cannot stand for an inspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gap {
    /// No plausible creation time: nothing to order it by.
    NoTimestamp,
    /// A deletion: the runtime may no longer know the object.
    Deletion,
    /// An event type this agent does not know.
    UnknownType,
    /// No sandbox status, or one without id or metadata.
    NoSandbox,
    /// The sandbox is another pod's.
    OtherPod,
    /// The event is the sandbox's own: its containers may not be listed.
    SandboxEvent,
    /// A container status without id or metadata.
    Malformed,
    /// The event's container, or one the PLEG saw, is not in it.
    ContainerMissing,
    /// The PLEG never saw the pod (or saw it gone).
    UnknownPod,
    /// The pod has (or had) another sandbox, which the payload omits.
    OtherSandbox,
}

/// A payload that stands for an inspection of its pod.
#[derive(Debug, Clone)]
pub(crate) struct PodView {
    sandbox: api::PodSandboxStatus,
    containers: Vec<api::ContainerStatus>,
    /// Containers whose status in the payload lacks what the agent needs
    /// (the annotations it wrote, the log path): asked for one by one.
    pub(crate) fetch: Vec<String>,
}

impl PodView {
    /// Replaces the payload's status of a container with one asked for.
    pub(crate) fn fetched(&mut self, status: api::ContainerStatus) {
        if let Some(c) = self.containers.iter_mut().find(|c| c.id == status.id) {
            *c = status;
        }
    }

    /// The pod's status, folded as an inspection folds it.
    pub(crate) fn into_status(self, uid: &str) -> PodRuntimeStatus {
        let sb = self.sandbox.id.clone();
        assemble(uid, vec![self.sandbox], self.containers, |_| {
            Some(sb.clone())
        })
    }
}

/// Reads the payload of `ev`, routed to pod `uid`, created at `ts` (None:
/// not plausible), against `known`, the pod's newest listing.
pub(crate) fn read(
    uid: &str,
    ev: &api::ContainerEventResponse,
    ts: Option<i64>,
    known: Option<&PodSeen>,
) -> Result<PodView, Gap> {
    if ts.is_none() {
        return Err(Gap::NoTimestamp);
    }
    if api::ContainerEventType::try_from(ev.container_event_type).is_err() {
        return Err(Gap::UnknownType);
    }
    if from_cri_event(ev.container_event_type) == Some(PodLifecycleEventType::ContainerRemoved) {
        return Err(Gap::Deletion);
    }
    let sb = match &ev.pod_sandbox_status {
        Some(sb) if !sb.id.is_empty() && sb.metadata.is_some() => sb,
        _ => return Err(Gap::NoSandbox),
    };
    let sb_uid = sb
        .labels
        .get(LABEL_POD_UID)
        .map(String::as_str)
        .or_else(|| sb.metadata.as_ref().map(|m| m.uid.as_str()));
    if sb_uid != Some(uid) {
        return Err(Gap::OtherPod);
    }
    if ev.container_id == sb.id {
        return Err(Gap::SandboxEvent);
    }
    let containers = &ev.containers_statuses;
    if containers
        .iter()
        .any(|c| c.id.is_empty() || c.metadata.is_none())
    {
        return Err(Gap::Malformed);
    }
    let listed = |id: &str| containers.iter().any(|c| c.id == id);
    if !listed(&ev.container_id) {
        return Err(Gap::ContainerMissing);
    }
    let known = match known {
        Some(k) if !k.sandboxes.is_empty() => k,
        _ => return Err(Gap::UnknownPod),
    };
    if known.sandboxes.len() != 1 || !known.sandboxes.contains_key(&sb.id) {
        return Err(Gap::OtherSandbox);
    }
    if known.containers.keys().any(|id| !listed(id)) {
        return Err(Gap::ContainerMissing);
    }
    let fetch = containers
        .iter()
        .filter(|c| !c.annotations.contains_key(ANNOTATION_CONTAINER_KIND) || c.log_path.is_empty())
        .map(|c| c.id.clone())
        .collect();
    Ok(PodView {
        sandbox: sb.clone(),
        containers: containers.clone(),
        fetch,
    })
}
