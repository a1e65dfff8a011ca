//! Every Service of the cluster, watched (one informer, indexed by
//! namespace; the Node authorizer lets a node list and watch services), so
//! that each container is created with its pod's service variables as
//! kubelet gives them ([`crate::convert::service_env`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use petrel_controller::informer::{
    ApiLister, Indexers, InformerConfig, Selectors, SharedInformer, NAMESPACE,
};

use crate::types::{DesiredPod, PodOrigin};
use crate::worker::ServiceEnvFn;

/// The namespace of the API server's `kubernetes` service.
const DEFAULT_NAMESPACE: &str = "default";

/// The informer of all services (not started).
pub fn informer(client: kube::Client) -> SharedInformer<Service> {
    let api: kube::Api<Service> = kube::Api::all(client);
    SharedInformer::new(
        Arc::new(ApiLister::new(api, Selectors::default())),
        Indexers::standard(),
        InformerConfig::default()
            .name("services")
            .strip_managed_fields(true)
            .backoff(Duration::from_millis(200), Duration::from_secs(7)),
    )
}

/// The pods' service variables from the informer's cache: those of the
/// pod's namespace (with `enableServiceLinks`, true unless false) and of
/// `default`'s `kubernetes`. An API pod waits for the first list, as in
/// kubelet (else it could start without `KUBERNETES_SERVICE_HOST`); a
/// static pod takes what is there.
pub fn env_source(informer: &SharedInformer<Service>) -> ServiceEnvFn {
    let informer = informer.clone();
    Arc::new(move |pod: &DesiredPod| {
        if pod.source == PodOrigin::Api && !informer.has_synced() {
            return Err(
                "services have not yet been read at least once, cannot construct envvars"
                    .to_string(),
            );
        }
        let links = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let store = informer.store();
        let mut services = store
            .by_index(NAMESPACE, &pod.namespace)
            .map_err(|e| e.to_string())?;
        if pod.namespace != DEFAULT_NAMESPACE {
            services.extend(
                store
                    .by_index(NAMESPACE, DEFAULT_NAMESPACE)
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(crate::convert::service_env(
            services.iter().map(|s| s.as_ref()),
            &pod.namespace,
            links,
        ))
    })
}
