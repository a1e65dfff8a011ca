//! The real [`Cache`] (the informers' stores) and [`PodSetApi`] (the API
//! server through kube's client).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use petrel_controller::informer::{Indexers, Store};

use crate::podset::{PodSet, POD_LABEL};
use crate::reconcile::{ApiError, Cache, PodSetApi};

/// The Pod index by PodSet: `namespace/<label value>`.
pub const PODSET_INDEX: &str = "podset";

/// Indexes Pods under [`PODSET_INDEX`].
pub fn pod_indexers() -> Indexers<Pod> {
    Indexers::default().custom(PODSET_INDEX, |p: &Pod| {
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let set = p.metadata.labels.as_ref().and_then(|l| l.get(POD_LABEL));
        set.map(|s| format!("{ns}/{s}")).into_iter().collect()
    })
}

/// The informers' caches.
#[derive(Debug, Clone)]
pub struct Caches {
    /// PodSets.
    pub podsets: Store<PodSet>,
    /// Pods, indexed by [`PODSET_INDEX`].
    pub pods: Store<Pod>,
}

impl Cache for Caches {
    fn podset(&self, key: &str) -> Option<Arc<PodSet>> {
        self.podsets.get(key)
    }

    fn pods_labelled(&self, ns: &str, name: &str) -> Vec<Arc<Pod>> {
        // The index is added before the informer starts: never missing.
        self.pods
            .by_index(PODSET_INDEX, &format!("{ns}/{name}"))
            .unwrap_or_default()
    }
}

/// The API server.
#[derive(Clone)]
pub struct KubeApi {
    /// The client.
    pub client: Client,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi").finish_non_exhaustive()
    }
}

fn other(what: String) -> impl FnOnce(kube::Error) -> ApiError {
    move |source| ApiError::Other { what, source }
}

#[async_trait]
impl PodSetApi for KubeApi {
    async fn create_pod(&self, ns: &str, pod: &Pod) -> Result<(), ApiError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        api.create(&PostParams::default(), pod)
            .await
            .map_err(other(format!(
                "create pod {ns}/{}",
                pod.metadata.generate_name.as_deref().unwrap_or_default()
            )))?;
        Ok(())
    }

    async fn delete_pod(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(other(format!("delete pod {ns}/{name}"))(e)),
        }
    }

    async fn replace_status(&self, ps: &PodSet) -> Result<(), ApiError> {
        let ns = ps.metadata.namespace.as_deref().unwrap_or_default();
        let name = ps.metadata.name.as_deref().unwrap_or_default();
        let api: Api<PodSet> = Api::namespaced(self.client.clone(), ns);
        match api.replace_status(name, &PostParams::default(), ps).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                Err(ApiError::Conflict(format!("podset {ns}/{name} status")))
            }
            Err(e) => Err(other(format!("replace status of podset {ns}/{name}"))(e)),
        }
    }
}
