//! The published pod statuses: the Kubernetes `Pod` objects (spec from the
//! manifest, status computed by the pod workers) that `/pods` serves, with
//! a watch feed of changes for `petrel get pods -w`.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use tokio::sync::broadcast;

/// The kind of a watch event, as the Kubernetes watch API names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum WatchEventType {
    /// A pod appeared.
    Added,
    /// A pod's status or spec changed.
    Modified,
    /// A pod is gone.
    Deleted,
}

/// One change, as `{"type": ..., "object": Pod}` like a Kubernetes watch.
#[derive(Debug, Clone, Serialize)]
pub struct WatchEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub kind: WatchEventType,
    /// The pod after the change (before it, for Deleted).
    pub object: Arc<Pod>,
}

/// The pods, keyed by (namespace, name).
#[derive(Debug)]
pub struct StatusStore {
    pods: RwLock<BTreeMap<(String, String), Arc<Pod>>>,
    feed: broadcast::Sender<WatchEvent>,
}

impl Default for StatusStore {
    fn default() -> Self {
        Self::new()
    }
}

impl StatusStore {
    /// An empty store.
    pub fn new() -> Self {
        let (feed, _) = broadcast::channel(1024);
        Self {
            pods: RwLock::new(BTreeMap::new()),
            feed,
        }
    }

    fn key(pod: &Pod) -> (String, String) {
        (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// Publishes `pod`; watchers hear of it only if it changed.
    pub fn upsert(&self, pod: Pod) {
        let key = Self::key(&pod);
        let kind = {
            let mut g = self.pods.write().unwrap_or_else(|p| p.into_inner());
            match g.get(&key) {
                Some(old) if **old == pod => return,
                Some(_) => {
                    g.insert(key, Arc::new(pod.clone()));
                    WatchEventType::Modified
                }
                None => {
                    g.insert(key, Arc::new(pod.clone()));
                    WatchEventType::Added
                }
            }
        };
        let _ = self.feed.send(WatchEvent {
            kind,
            object: Arc::new(pod),
        });
    }

    /// Removes the pod `namespace/name`.
    pub fn remove(&self, namespace: &str, name: &str) {
        let old = {
            let mut g = self.pods.write().unwrap_or_else(|p| p.into_inner());
            g.remove(&(namespace.to_string(), name.to_string()))
        };
        if let Some(object) = old {
            let _ = self.feed.send(WatchEvent {
                kind: WatchEventType::Deleted,
                object,
            });
        }
    }

    /// Every pod, ordered by namespace then name.
    pub fn list(&self) -> Vec<Arc<Pod>> {
        let g = self.pods.read().unwrap_or_else(|p| p.into_inner());
        g.values().cloned().collect()
    }

    /// One pod.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        let g = self.pods.read().unwrap_or_else(|p| p.into_inner());
        g.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    /// A feed of changes from now on. A watcher that falls more than 1024
    /// changes behind gets `Lagged` and should list again.
    pub fn subscribe(&self) -> broadcast::Receiver<WatchEvent> {
        self.feed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(name: &str, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn store_should_publish_changes_only() {
        let s = StatusStore::new();
        let mut rx = s.subscribe();
        s.upsert(pod("a", "Pending"));
        s.upsert(pod("a", "Pending"));
        s.upsert(pod("a", "Running"));
        s.remove("default", "a");
        s.remove("default", "a");
        let kinds: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds,
            vec![
                WatchEventType::Added,
                WatchEventType::Modified,
                WatchEventType::Deleted
            ]
        );
        assert!(s.list().is_empty());
    }
}
