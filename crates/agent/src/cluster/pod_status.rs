//! The status of the API's pods, sent to the API server (kubelet's status
//! manager): what the pod workers publish (the [`StatusStore`]) becomes a
//! merge patch of `pods/<name>/status`, sent only when it differs from
//! what the API holds; and a pod being deleted is deleted for good (grace
//! 0, with its UID as precondition) once its workers have stopped and
//! removed it, so a new pod of the same name is never touched.
//!
//! One reconcile per pod UID, on a work queue (so a pod's writes never
//! race and failures back off), woken by the store's feed, by the pod
//! informer and by the workers forgetting a pod.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use petrel_controller::informer::Store;
use petrel_controller::Action;
use serde_json::{json, Value};

use crate::status::StatusStore;

/// The pod informer's index of pods by UID.
pub const UID_INDEX: &str = "uid";

/// Condition types the node owns; any other (PodScheduled, DisruptionTarget,
/// readiness gates) is written by someone else and kept as the API has it.
const NODE_CONDITIONS: &[&str] = &[
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
    "PodResizePending",
    "PodResizeInProgress",
];

/// Status fields the node owns: each is sent, as null when the node has
/// none, so a merge patch clears what it no longer shows.
const NODE_FIELDS: &[&str] = &[
    "phase",
    "message",
    "reason",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "qosClass",
    "initContainerStatuses",
    "containerStatuses",
    "ephemeralContainerStatuses",
    "observedGeneration",
    "resize",
];

/// A refusal or failure of the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiFailure {
    /// The object is not there (any more).
    #[error("not found")]
    NotFound,
    /// A precondition or resourceVersion did not hold (409), or the
    /// object changed identity.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Anything else (refused, invalid, unreachable).
    #[error("{0}")]
    Other(String),
}

impl From<kube::Error> for ApiFailure {
    fn from(e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(s) if s.code == 404 => Self::NotFound,
            kube::Error::Api(s) if s.code == 409 => Self::Conflict(s.message.clone()),
            _ => Self::Other(e.to_string()),
        }
    }
}

/// The API calls the status sync makes (a trait, so the decisions are
/// unit-tested without an API server).
#[async_trait]
pub trait PodStatusApi: Send + Sync {
    /// Merge-patches `pods/<name>/status`; returns the new resourceVersion.
    async fn patch_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Option<String>, ApiFailure>;
    /// Deletes the pod with grace period 0 if its UID is still `uid`.
    async fn delete_now(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ApiFailure>;
}

/// The real calls, over a kube client with the node's credentials.
pub struct KubePodStatusApi {
    /// The client.
    pub client: kube::Client,
}

#[async_trait]
impl PodStatusApi for KubePodStatusApi {
    async fn patch_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Option<String>, ApiFailure> {
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        let pod = api
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await?;
        Ok(pod.metadata.resource_version)
    }

    async fn delete_now(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ApiFailure> {
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        let params = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        api.delete(name, &params).await?;
        Ok(())
    }
}

/// The API's pods as the informer has them.
pub trait ApiPods: Send + Sync {
    /// The pod of this UID.
    fn by_uid(&self, uid: &str) -> Option<Arc<Pod>>;
}

impl ApiPods for Store<Pod> {
    fn by_uid(&self, uid: &str) -> Option<Arc<Pod>> {
        self.by_index(UID_INDEX, uid)
            .ok()
            .and_then(|v| v.into_iter().next())
    }
}

/// What the status sync reads about the node's own side.
pub trait PodsOnNode: Send + Sync {
    /// Whether the pod workers still know pod `uid` (it has not been
    /// stopped and removed).
    fn is_known(&self, uid: &str) -> bool;
}

/// What was last sent for one pod.
#[derive(Debug, Clone)]
struct Sent {
    /// The status fields sent.
    status: Value,
    /// The API's resourceVersion the patch was computed against: while
    /// the informer still holds that version, it has not seen the patch.
    against: Option<String>,
}

/// The status sync of the API's pods.
pub struct PodStatusSync {
    api: Arc<dyn PodStatusApi>,
    pods: Arc<dyn ApiPods>,
    published: Arc<StatusStore>,
    node: Arc<dyn PodsOnNode>,
    sent: Mutex<HashMap<String, Sent>>,
    /// The last failure logged per pod (logged once per cause).
    failures: Mutex<HashMap<String, String>>,
}

impl PodStatusSync {
    /// A sync over the pod informer's cache `pods` (indexed by
    /// [`UID_INDEX`]) and the workers' `published` statuses.
    pub fn new(
        api: Arc<dyn PodStatusApi>,
        pods: Arc<dyn ApiPods>,
        published: Arc<StatusStore>,
        node: Arc<dyn PodsOnNode>,
    ) -> Self {
        Self {
            api,
            pods,
            published,
            node,
            sent: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn api_pod(&self, uid: &str) -> Option<Arc<Pod>> {
        self.pods.by_uid(uid)
    }

    /// Brings the API's copy of pod `uid` up to date: deletes it if it is
    /// being deleted and stopped, else patches its status if it differs.
    pub async fn reconcile(&self, uid: &str) -> Result<Action, ApiFailure> {
        let result = self.reconcile_once(uid).await;
        self.note(uid, result.as_ref().err());
        result
    }

    async fn reconcile_once(&self, uid: &str) -> Result<Action, ApiFailure> {
        let Some(api_pod) = self.api_pod(uid) else {
            self.lock_sent().remove(uid);
            return Ok(Action::Done);
        };
        let ns = api_pod.metadata.namespace.clone().unwrap_or_default();
        let name = api_pod.metadata.name.clone().unwrap_or_default();
        if api_pod.metadata.deletion_timestamp.is_some() && !self.node.is_known(uid) {
            return match self.api.delete_now(&ns, &name, uid).await {
                Ok(()) => {
                    tracing::info!(uid, pod = %format!("{ns}/{name}"), "pod stopped and removed; deleted from the API");
                    self.lock_sent().remove(uid);
                    Ok(Action::Done)
                }
                // Gone already, or another pod of that name now.
                Err(ApiFailure::NotFound | ApiFailure::Conflict(_)) => Ok(Action::Done),
                Err(e) => Err(e),
            };
        }
        // A mirror shows its static pod (same name, the static pod's UID).
        let mirror = crate::source::api::is_mirror(&api_pod);
        let Some(ours) = self
            .published
            .get(&ns, &name)
            .filter(|p| mirror || p.metadata.uid.as_deref() == Some(uid))
        else {
            return Ok(Action::Done);
        };
        let mut want = status_fields(ours.status.as_ref(), api_pod.status.as_ref());
        // The generation of the spec the workers acted on.
        if let (Some(g), Some(obj)) = (ours.metadata.generation, want.as_object_mut()) {
            obj.insert("observedGeneration".to_string(), json!(g));
        }
        let have = status_fields(api_pod.status.as_ref(), api_pod.status.as_ref());
        if want == have {
            return Ok(Action::Done);
        }
        let rv = api_pod.metadata.resource_version.clone();
        if let Some(s) = self.lock_sent().get(uid) {
            if s.status == want && s.against == rv {
                // Sent already; the informer has not seen it yet.
                return Ok(Action::Done);
            }
        }
        let patch = status_patch(uid, &want);
        match self.api.patch_status(&ns, &name, &patch).await {
            Ok(_) => {
                self.lock_sent().insert(
                    uid.to_string(),
                    Sent {
                        status: want,
                        against: rv,
                    },
                );
                Ok(Action::Done)
            }
            Err(ApiFailure::NotFound) => Ok(Action::Done),
            Err(e) => Err(e),
        }
    }

    fn lock_sent(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sent>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs a failure once per pod and cause; a success ends the episode.
    fn note(&self, uid: &str, err: Option<&ApiFailure>) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        match err {
            None => {
                if f.remove(uid).is_some() {
                    tracing::info!(uid, "pod status sent again");
                }
            }
            Some(e) => {
                let cause = e.to_string();
                if f.get(uid) != Some(&cause) {
                    tracing::warn!(uid, error = %cause, "sending the pod's status failed; retrying with backoff");
                    f.insert(uid.to_string(), cause);
                }
            }
        }
    }
}

/// The status fields the node owns, from `ours`, with the conditions the
/// node does not own taken from `api`: a JSON object with every status
/// field the node owns (null where unset) and `conditions`.
pub fn status_fields(ours: Option<&PodStatus>, api: Option<&PodStatus>) -> Value {
    let ours_json = ours
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_else(|| json!({}));
    let mut out = serde_json::Map::new();
    for f in NODE_FIELDS {
        out.insert(
            (*f).to_string(),
            ours_json.get(*f).cloned().unwrap_or(Value::Null),
        );
    }
    let conditions = merged_conditions(
        ours.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]),
        api.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]),
    );
    out.insert(
        "conditions".to_string(),
        serde_json::to_value(conditions).unwrap_or(Value::Null),
    );
    Value::Object(out)
}

/// Set by whoever disrupts the pod: the node when it evicts it, the API
/// server's eviction or a controller otherwise. The node's wins when it has
/// one; else the API's is kept.
const DISRUPTION: &str = "DisruptionTarget";

/// Everyone else's conditions as the API has them, in the API's order,
/// then the node's.
fn merged_conditions(ours: &[PodCondition], api: &[PodCondition]) -> Vec<PodCondition> {
    let ours_disrupts = ours.iter().any(|c| c.type_ == DISRUPTION);
    let mine = |t: &str| NODE_CONDITIONS.contains(&t) || (t == DISRUPTION && ours_disrupts);
    let mut out: Vec<PodCondition> = api.iter().filter(|c| !mine(&c.type_)).cloned().collect();
    out.extend(ours.iter().filter(|c| mine(&c.type_)).cloned());
    out
}

/// The merge patch of `pods/<name>/status`: the status fields, and the
/// pod's UID, which the API server refuses to change, so a patch meant
/// for a pod that was replaced under the same name fails.
pub fn status_patch(uid: &str, fields: &Value) -> Value {
    json!({"metadata": {"uid": uid}, "status": fields})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
