//! [`ConfigMapLock`] on a real API server, and the leader's own Pod from
//! its environment.

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::Client;
use tokio::sync::watch;

use super::error::{ConfigError, LockError};
use super::for_life::{ConfigMapLock, LockObject, PodRef};
use super::watch_changes::ChangeWatch;

/// Where a Pod finds its namespace when `POD_NAMESPACE` is unset.
const SA_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// A lock ConfigMap `namespace/name`.
#[derive(Debug)]
pub struct KubeConfigMapLock {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    changes: ChangeWatch,
}

impl KubeConfigMapLock {
    /// The lock `namespace/name`; starts watching it (inside a tokio
    /// runtime).
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let changes = ChangeWatch::start(api.clone(), name);
        Self {
            api,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            changes,
        }
    }

    fn object(&self, cm: &ConfigMap) -> LockObject {
        let owner_uid = cm
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Pod" && o.api_version == "v1")
            .map(|o| o.uid.clone());
        LockObject {
            uid: cm.metadata.uid.clone().unwrap_or_default(),
            owner_uid,
        }
    }
}

/// The Pod named by `POD_NAME` in `POD_NAMESPACE` (or the service
/// account's namespace), with its uid read from the API server.
pub async fn own_pod(client: Client) -> Result<PodRef, OwnPodError> {
    let name = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or(ConfigError::MissingEnv("POD_NAME"))?;
    let namespace = match std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty())
    {
        Some(ns) => ns,
        None => std::fs::read_to_string(SA_NAMESPACE)
            .map(|s| s.trim().to_owned())
            .map_err(|_| ConfigError::MissingEnv("POD_NAMESPACE"))?,
    };
    pod_ref(client, &namespace, &name).await
}

/// The Pod `namespace/name` with its uid read from the API server.
pub async fn pod_ref(client: Client, namespace: &str, name: &str) -> Result<PodRef, OwnPodError> {
    let pod = Api::<Pod>::namespaced(client, namespace)
        .get(name)
        .await
        .map_err(|source| OwnPodError::Get {
            pod: format!("{namespace}/{name}"),
            source,
        })?;
    Ok(PodRef {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        uid: pod.metadata.uid.unwrap_or_default(),
    })
}

/// The leader's own Pod could not be found.
#[derive(Debug, thiserror::Error)]
pub enum OwnPodError {
    /// The environment does not name it.
    #[error(transparent)]
    Env(#[from] ConfigError),
    /// The API server did not return it.
    #[error("leader-for-life: get pod {pod}: {source}")]
    Get {
        /// `namespace/name`.
        pod: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

impl ConfigMapLock for KubeConfigMapLock {
    async fn get(&self) -> Result<Option<LockObject>, LockError> {
        let got = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| LockError::from_kube(&self.describe(), e))?;
        Ok(got.as_ref().map(|cm| self.object(cm)))
    }

    async fn create(&self, owner: &PodRef) -> Result<LockObject, LockError> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: owner.name.clone(),
                    uid: owner.uid.clone(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let made = self
            .api
            .create(&PostParams::default(), &cm)
            .await
            .map_err(|e| LockError::from_kube(&self.describe(), e))?;
        Ok(self.object(&made))
    }

    async fn delete(&self, uid: &str) -> Result<(), LockError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(&self.name, &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(LockError::from_kube(&self.describe(), e)),
        }
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.receiver()
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
