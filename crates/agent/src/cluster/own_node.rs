//! The node's own Node object as the API shows it, watched (one informer on
//! `metadata.name=<node>`, as kubelet's node lister), so that labels and
//! taints edited in the API (`kubectl label node`, `kubectl taint`) reach
//! admission of the pods that come next, as they do in kubelet. Pods
//! already admitted are not looked at again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use petrel_controller::informer::{
    ApiLister, Event, EventKind, Indexers, InformerConfig, Registration, Selectors, SharedInformer,
};

use crate::admission::NodeFacts;

/// The informer of the node's own Node object (not started).
pub fn informer(client: kube::Client, node: &str) -> SharedInformer<Node> {
    let api: kube::Api<Node> = kube::Api::all(client);
    let lw = ApiLister::new(
        api,
        Selectors::default().fields(format!("metadata.name={node}")),
    );
    SharedInformer::new(
        Arc::new(lw),
        Indexers::standard(),
        InformerConfig::default()
            .name("node")
            .strip_managed_fields(true)
            .backoff(Duration::from_millis(200), Duration::from_secs(7)),
    )
}

/// Calls `apply` with admission's facts each time the Node's labels, taints
/// or allocatable change; `start` holds the facts admission has now (from
/// the flags), whose allocatable is kept while the Node shows none.
pub fn feed(
    informer: &SharedInformer<Node>,
    start: NodeFacts,
    apply: impl Fn(NodeFacts) + Send + Sync + 'static,
) -> Registration {
    let last = std::sync::Mutex::new(start);
    informer.add_handler(move |ev: &Event<Node>| {
        if ev.kind == EventKind::Delete {
            // Re-registered by the node loop; until then nothing changes.
            return;
        }
        let Some(node) = ev.new.as_ref() else { return };
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        let next = facts_of(node, &last);
        if next != *last {
            tracing::info!(node = %next.name, labels = next.labels.len(), taints = next.taints.len(), "node's labels, taints or allocatable changed: admission uses them");
            *last = next.clone();
            apply(next);
        }
    })
}

/// Admission's facts from the Node; what the Node does not show is kept
/// from `prev`.
pub fn facts_of(node: &Node, prev: &NodeFacts) -> NodeFacts {
    let labels: BTreeMap<String, String> = node.metadata.labels.clone().unwrap_or_default();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut facts = match node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
        Some(a) if !a.is_empty() => NodeFacts::new(prev.name.clone(), labels, taints, a),
        _ => NodeFacts {
            labels,
            taints,
            ..prev.clone()
        },
    };
    facts.name = prev.name.clone();
    facts
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn prev() -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            labels: BTreeMap::from([("a".into(), "1".into())]),
            taints: vec![],
            allocatable: BTreeMap::from([("cpu".into(), 2000)]),
        }
    }

    #[test]
    fn facts_of_should_take_labels_and_taints_from_the_node() {
        let mut node = Node::default();
        node.metadata.labels = Some(BTreeMap::from([("b".into(), "2".into())]));
        node.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "k".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let f = facts_of(&node, &prev());
        assert_eq!(f.name, "n1");
        assert_eq!(f.labels, BTreeMap::from([("b".into(), "2".into())]));
        assert_eq!(f.taints.len(), 1);
        // No allocatable shown: the previous one stays.
        assert_eq!(f.allocatable, prev().allocatable);
    }

    #[test]
    fn facts_of_should_take_allocatable_when_the_node_shows_it() {
        let node = Node {
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([
                    ("cpu".into(), Quantity("1500m".into())),
                    ("pods".into(), Quantity("10".into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let f = facts_of(&node, &prev());
        assert_eq!(f.allocatable.get("cpu"), Some(&1500));
        assert_eq!(f.allocatable.get("pods"), Some(&10));
        assert!(f.labels.is_empty() && f.taints.is_empty());
    }
}
