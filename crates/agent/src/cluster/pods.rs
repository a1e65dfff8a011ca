//! The pods the API server binds to this node: one informer on
//! `spec.nodeName=<node>` (the only pods the Node authorizer lets a node
//! see), feeding the [`PodSource`] and, through it, the pod workers' queue;
//! and the status sync's queue, so every pod's API copy is looked at.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use petrel_controller::informer::{
    ApiLister, Event, EventClass, EventKind, Indexers, InformerConfig, Registration, Selectors,
    SharedInformer,
};
use petrel_controller::{Priority, WorkQueue};

use super::pod_status::UID_INDEX;
use crate::source::PodSource;

/// The informer of this node's pods, indexed by UID too (not started).
pub fn informer(client: kube::Client, node: &str) -> SharedInformer<Pod> {
    let api: kube::Api<Pod> = kube::Api::all(client);
    let lw = ApiLister::new(
        api,
        Selectors::default().fields(format!("spec.nodeName={node}")),
    );
    SharedInformer::new(
        Arc::new(lw),
        Indexers::standard().custom(UID_INDEX, |p: &Pod| {
            p.metadata.uid.clone().into_iter().collect()
        }),
        InformerConfig::default()
            .name("pods")
            .strip_managed_fields(true)
            // A lost API server is retried within seconds once it is back
            // (client-go's reflector waits up to 30 s).
            .backoff(Duration::from_millis(200), Duration::from_secs(7)),
    )
}

/// Feeds the informer's events into `source` (changes the workers must hear
/// of go to `pods`, urgently unless they are the first list's, and to
/// `volumes`, whose downwardAPI files may show what changed), every pod's
/// UID into `status` (the status sync's queue), and wakes the mirror loop
/// when a mirror pod changed.
pub fn feed(
    informer: &SharedInformer<Pod>,
    source: PodSource,
    pods: WorkQueue<String>,
    status: WorkQueue<String>,
    volumes: WorkQueue<String>,
    mirrors: Arc<tokio::sync::Notify>,
) -> Registration {
    informer.add_handler(move |ev: &Event<Pod>| {
        let obj = match ev.kind {
            EventKind::Delete => ev.old.as_ref(),
            _ => ev.new.as_ref(),
        };
        let Some(pod) = obj else { return };
        if crate::source::api::is_mirror(pod) {
            mirrors.notify_one();
        }
        let change = match ev.kind {
            EventKind::Delete => source.remove_api(pod),
            _ => source.upsert_api(pod),
        };
        if let Some(c) = change {
            tracing::info!(uid = %c.uid, kind = ?c.kind, pod = %format!("{}/{}", c.pod.namespace, c.pod.name), "API pod changed");
            let tier = if ev.class == EventClass::InitialList {
                Priority::Normal
            } else {
                Priority::Urgent
            };
            if ev.kind == EventKind::Update {
                volumes.add(c.uid.clone(), Priority::Normal);
            }
            pods.add(c.uid, tier);
        }
        if let Some(uid) = pod.metadata.uid.clone() {
            status.add(uid, Priority::Normal);
        }
    })
}

/// Waits until `registration` has handled the first list: only then does
/// the source hold every pod bound here, so the workers adopt them instead
/// of stopping them as orphans.
pub async fn wait_fed(registration: &Registration) {
    while !registration.has_synced() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
