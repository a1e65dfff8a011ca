//! One pod's inspection: its sandboxes and containers as listed, each
//! asked for its status, folded into a [`PodRuntimeStatus`] ([`assemble`],
//! which folds an event's payload too).

use std::collections::HashMap;

use petrel_cri::api;

use crate::cri::{ContainerSummary, CriResult, RuntimeObserver};
use crate::types::{
    ContainerMeta, PodRuntimeStatus, ANNOTATION_CONTAINER_HASH, ANNOTATION_CONTAINER_KIND,
    ANNOTATION_RESTART_COUNT, KIND_INIT, KIND_SIDECAR, LABEL_MANAGED_BY, LABEL_POD_NAME,
    LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

/// The label selector of everything this node made.
pub(crate) fn node_selector(node: &str) -> HashMap<String, String> {
    HashMap::from([(LABEL_MANAGED_BY.to_string(), node.to_string())])
}

/// The label selector of one pod of this node.
pub(crate) fn pod_selector(node: &str, uid: &str) -> HashMap<String, String> {
    let mut s = node_selector(node);
    s.insert(LABEL_POD_UID.to_string(), uid.to_string());
    s
}

/// The pod UID of a sandbox: its label, else its metadata.
pub(crate) fn sandbox_uid(sb: &api::PodSandbox) -> Option<String> {
    sb.labels
        .get(LABEL_POD_UID)
        .cloned()
        .or_else(|| sb.metadata.as_ref().map(|m| m.uid.clone()))
        .filter(|u| !u.is_empty())
}

/// A pod's sandboxes and containers, as listed.
#[derive(Debug, Clone, Default)]
pub(crate) struct PodListing {
    pub(crate) sandboxes: Vec<api::PodSandbox>,
    pub(crate) containers: Vec<ContainerSummary>,
}

impl PodListing {
    /// Every id listed (sandboxes and containers).
    pub(crate) fn ids(&self) -> impl Iterator<Item = &str> {
        self.sandboxes
            .iter()
            .map(|s| s.id.as_str())
            .chain(self.containers.iter().map(|c| c.id.as_str()))
    }
}

/// Lists one pod (by its labels, only what this node made).
pub(crate) async fn list_pod(
    rt: &dyn RuntimeObserver,
    node: &str,
    uid: &str,
) -> CriResult<PodListing> {
    let sandboxes = rt.list_pod_sandboxes(pod_selector(node, uid)).await?;
    let containers = rt.list_containers(pod_selector(node, uid)).await?;
    Ok(PodListing {
        sandboxes,
        containers,
    })
}

/// Asks for the status of everything in `listing`. An object removed
/// between the listing and its status call is left out (it is gone); any
/// other error fails the inspection. Calls are sequential: the bound on
/// concurrent inspections is then a bound on concurrent calls.
pub(crate) async fn inspect_listed(
    rt: &dyn RuntimeObserver,
    uid: &str,
    listing: &PodListing,
) -> CriResult<PodRuntimeStatus> {
    let mut sandboxes = Vec::with_capacity(listing.sandboxes.len());
    for sb in &listing.sandboxes {
        match rt.pod_sandbox_status(&sb.id).await {
            Ok(s) => sandboxes.push(s),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    let mut containers = Vec::with_capacity(listing.containers.len());
    for c in &listing.containers {
        match rt.container_status(&c.id).await {
            Ok(s) => containers.push(s),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    let sandbox_of: HashMap<&str, &str> = listing
        .containers
        .iter()
        .map(|c| (c.id.as_str(), c.pod_sandbox_id.as_str()))
        .collect();
    let mut status = assemble(uid, sandboxes, containers, |id| {
        sandbox_of.get(id).map(|s| s.to_string())
    });
    if status.name.is_empty() {
        fill_identity_from_labels(&mut status, listing);
    }
    Ok(status)
}

/// Folds the statuses of a pod's sandboxes and containers into a
/// [`PodRuntimeStatus`]: newest first, name and namespace from the newest
/// sandbox, and what the agent wrote on each container with the sandbox
/// `sandbox_of` says it runs in. The one way both an inspection and an
/// event's payload become the cached status, so they cannot differ.
pub(crate) fn assemble(
    uid: &str,
    mut sandboxes: Vec<api::PodSandboxStatus>,
    mut containers: Vec<api::ContainerStatus>,
    sandbox_of: impl Fn(&str) -> Option<String>,
) -> PodRuntimeStatus {
    // Newest first; ties broken by id so the order is stable.
    sandboxes.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    containers.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    let (name, namespace) = sandboxes
        .first()
        .and_then(|s| s.metadata.as_ref())
        .map(|m| (m.name.clone(), m.namespace.clone()))
        .unwrap_or_default();
    let container_meta = containers
        .iter()
        .map(|c| {
            let mut meta = container_meta(&c.annotations);
            meta.sandbox_id = sandbox_of(&c.id).unwrap_or_default();
            (c.id.clone(), meta)
        })
        .collect();
    PodRuntimeStatus {
        uid: uid.to_string(),
        name,
        namespace,
        sandboxes,
        containers,
        container_meta,
    }
}

/// Name and namespace from the labels of what was listed (when no
/// sandbox status named the pod).
fn fill_identity_from_labels(status: &mut PodRuntimeStatus, listing: &PodListing) {
    let named = listing
        .sandboxes
        .iter()
        .map(|s| {
            (
                s.labels.get(LABEL_POD_NAME).map(String::as_str),
                s.labels.get(LABEL_POD_NAMESPACE).map(String::as_str),
            )
        })
        .chain(
            listing
                .containers
                .iter()
                .map(|c| (c.label(LABEL_POD_NAME), c.label(LABEL_POD_NAMESPACE))),
        );
    for (n, ns) in named {
        if let (Some(n), Some(ns)) = (n, ns) {
            status.name = n.to_string();
            status.namespace = ns.to_string();
            return;
        }
    }
}

/// What the agent wrote on a container at create time.
pub(crate) fn container_meta(annotations: &HashMap<String, String>) -> ContainerMeta {
    ContainerMeta {
        init: annotations
            .get(ANNOTATION_CONTAINER_KIND)
            .is_some_and(|k| k == KIND_INIT || k == KIND_SIDECAR),
        sidecar: annotations
            .get(ANNOTATION_CONTAINER_KIND)
            .is_some_and(|k| k == KIND_SIDECAR),
        hash: annotations
            .get(ANNOTATION_CONTAINER_HASH)
            .cloned()
            .unwrap_or_default(),
        restart_count: annotations
            .get(ANNOTATION_RESTART_COUNT)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0),
        sandbox_id: String::new(),
    }
}
