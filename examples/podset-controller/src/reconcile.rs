//! The reconcile, exactly as the reference's: read the PodSet and its Pods
//! from the caches, create the missing Pods, delete the extra ones, write
//! the status when it differs, and report the change's stamp.
//!
//! The caches and the API are traits ([`Cache`], [`PodSetApi`]) so the logic
//! is tested against fakes; [`crate::controller`] gives the real ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use petrel_controller::Action;

use crate::podset::{PodSet, PodSetStatus, CHANGED_AT, GROUP, KIND, POD_LABEL, VERSION};
use crate::report::Reporter;

/// What the reconcile reads: the informers' caches.
pub trait Cache: Send + Sync {
    /// The PodSet under `namespace/name`.
    fn podset(&self, key: &str) -> Option<Arc<PodSet>>;
    /// The Pods of namespace `ns` labelled with PodSet `name`.
    fn pods_labelled(&self, ns: &str, name: &str) -> Vec<Arc<Pod>>;
}

/// What the reconcile writes.
#[async_trait]
pub trait PodSetApi: Send + Sync {
    /// Creates a Pod in `ns`.
    async fn create_pod(&self, ns: &str, pod: &Pod) -> Result<(), ApiError>;
    /// Deletes Pod `name` of `ns`; a Pod already gone is no error.
    async fn delete_pod(&self, ns: &str, name: &str) -> Result<(), ApiError>;
    /// Replaces the status of `ps` (its resourceVersion guards the write).
    async fn replace_status(&self, ps: &PodSet) -> Result<(), ApiError>;
}

/// A failed API call.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Someone wrote the object since we read it (HTTP 409).
    #[error("conflict writing {0}")]
    Conflict(String),
    /// Anything else.
    #[error("{what}: {source}")]
    Other {
        /// What was being done (`create pod ns/web-`).
        what: String,
        /// The client's error.
        source: kube::Error,
    },
}

/// Why a reconcile is retried (with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A write failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The key is not `namespace/name`.
    #[error("bad key {0:?}: want namespace/name")]
    BadKey(String),
}

/// The reconciler: caches, API, reporter.
pub struct Reconciler {
    /// The informers' caches.
    pub cache: Arc<dyn Cache>,
    /// The API.
    pub api: Arc<dyn PodSetApi>,
    /// The stdout protocol.
    pub report: Arc<Reporter>,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler").finish_non_exhaustive()
    }
}

impl Reconciler {
    /// Reconciles the PodSet under `key` (`namespace/name`).
    pub async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        self.report.reconcile_started();
        let Some((ns, name)) = key.split_once('/') else {
            return Err(ReconcileError::BadKey(key.to_string()));
        };
        let Some(ps) = self.cache.podset(key) else {
            // Deleted: its Pods go with it (garbage collection).
            return Ok(Action::Done);
        };
        let uid = ps.metadata.uid.as_deref().unwrap_or_default();
        let owned: Vec<Arc<Pod>> = self
            .cache
            .pods_labelled(ns, name)
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && controlled_by(p, uid))
            .collect();
        let want = usize::try_from(ps.spec.replicas).unwrap_or(0);
        for _ in owned.len()..want {
            self.api.create_pod(ns, &new_pod(&ps)).await?;
        }
        for pod in owned.iter().skip(want) {
            if let Some(pod_name) = pod.metadata.name.as_deref() {
                self.api.delete_pod(ns, pod_name).await?;
            }
        }
        let generation = ps.metadata.generation.unwrap_or(0);
        if ps.status.replicas != ps.spec.replicas || ps.status.observed_generation != generation {
            let mut updated = PodSet::clone(&ps);
            updated.status = PodSetStatus {
                replicas: ps.spec.replicas,
                observed_generation: generation,
            };
            // A conflict means a newer PodSet is on its way to the cache:
            // retried with backoff, as the reference's `Requeue: true`.
            self.api.replace_status(&updated).await?;
        }
        let stamp = ps
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CHANGED_AT));
        self.report
            .reconciled(key, generation, stamp.map(String::as_str));
        Ok(Action::Done)
    }
}

/// Whether `pod`'s controller is the PodSet of UID `uid`.
pub fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && !uid.is_empty() && r.uid == uid)
}

/// The PodSet that controls `pod`, as `namespace/name` (an Owns mapping).
pub fn owner_key(pod: &Pod) -> Option<String> {
    let ns = pod.metadata.namespace.as_deref()?;
    let owner = pod.metadata.owner_references.iter().flatten().find(|r| {
        r.controller == Some(true)
            && r.kind == KIND
            && r.api_version.split('/').next() == Some(GROUP)
    })?;
    Some(format!("{ns}/{}", owner.name))
}

/// A new Pod of `ps`: its template, named `<name>-…`, labelled and
/// controlled by it.
pub fn new_pod(ps: &PodSet) -> Pod {
    let template = ps.spec.template.clone();
    let mut meta = template.metadata.unwrap_or_default();
    let name = ps.metadata.name.clone().unwrap_or_default();
    meta.namespace = ps.metadata.namespace.clone();
    meta.generate_name = Some(format!("{name}-"));
    meta.name = None;
    meta.resource_version = None;
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POD_LABEL.to_string(), name.clone());
    meta.owner_references = Some(vec![OwnerReference {
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.to_string(),
        name,
        uid: ps.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    Pod {
        metadata: meta,
        spec: template.spec,
        status: None,
    }
}

#[cfg(test)]
mod tests;
