//! Pods' pull secrets read from the API server with the node's
//! credentials: a GET in the pod's namespace per pull, which the Node
//! authorizer allows for exactly the secrets that pods bound to this node
//! reference. Pulls are rare (an image missing, or `Always`, with
//! backoff), so nothing is cached or watched.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;

use crate::pull_credentials::SecretReader;

/// How long a read may take: a pod's pull waits for it, and kubelet's
/// secret manager would answer from its cache.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Secrets read with the node's client.
pub struct KubeSecrets {
    /// The node's client.
    pub client: kube::Client,
}

#[async_trait]
impl SecretReader for KubeSecrets {
    async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, String> {
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(READ_TIMEOUT, api.get(name)).await {
            Ok(Ok(secret)) => Ok(secret),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no answer from the API server within {READ_TIMEOUT:?}"
            )),
        }
    }
}
