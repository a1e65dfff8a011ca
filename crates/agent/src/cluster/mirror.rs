//! Mirror pods: each static pod's read-only copy in the API (kubelet's
//! mirror client), so `kubectl get pods` shows it and the scheduler counts
//! it. A mirror carries `kubernetes.io/config.mirror` with a hash of the
//! static pod, is owned by the Node, and is made again when the static pod
//! changes (the hash differs) or someone deletes it; a mirror whose static
//! pod is gone is deleted. The static pod's status is sent to its mirror
//! by the status sync.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, PostParams, Preconditions};
use sha2::Digest;

use crate::source::api::{is_mirror, MIRROR_ANNOTATION};
use crate::source::PodSource;
use crate::types::{DesiredPod, PodOrigin};

/// The hash of the static pod a mirror stands for.
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// Where the static pod came from.
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// How often the mirrors are checked without news.
const CHECK_EVERY: Duration = Duration::from_secs(10);

/// The hash of a static pod (its object as the agent runs it).
pub fn static_hash(d: &DesiredPod) -> String {
    let json = serde_json::to_vec(&*d.pod).unwrap_or_default();
    hex::encode(&sha2::Sha256::digest(&json)[..16])
}

/// The mirror of static pod `d` on node `node` (of UID `node_uid`).
pub fn mirror_of(d: &DesiredPod, node: &str, node_uid: &str) -> Pod {
    let hash = static_hash(d);
    let mut pod = Pod::clone(&d.pod);
    let meta = &mut pod.metadata;
    meta.name = Some(d.name.clone());
    meta.namespace = Some(d.namespace.clone());
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(MIRROR_ANNOTATION.to_string(), hash.clone());
    annotations.insert(CONFIG_HASH.to_string(), hash);
    annotations.insert(CONFIG_SOURCE.to_string(), "file".to_string());
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_string(),
        uid: node_uid.to_string(),
        controller: Some(true),
        ..Default::default()
    }]);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.to_string());
    }
    pod.status = None;
    pod
}

/// What to do to bring the API's mirrors in line with the static pods.
#[derive(Debug, Default)]
pub struct Plan {
    /// Static pods without a current mirror.
    pub create: Vec<DesiredPod>,
    /// Mirrors to delete: (namespace, name, uid). An outdated one is
    /// deleted first and made again by a later pass.
    pub delete: Vec<(String, String, String)>,
}

/// The plan for `statics` (the static pods that run, valid and owning
/// their names) against the API's `mirrors`.
pub fn plan(statics: &[DesiredPod], mirrors: &[Arc<Pod>]) -> Plan {
    let mut p = Plan::default();
    let by_name: BTreeMap<(String, String), &Arc<Pod>> = mirrors
        .iter()
        .filter(|m| is_mirror(m))
        .map(|m| {
            (
                (
                    m.metadata.namespace.clone().unwrap_or_default(),
                    m.metadata.name.clone().unwrap_or_default(),
                ),
                m,
            )
        })
        .collect();
    let mut wanted = std::collections::BTreeSet::new();
    for d in statics {
        let key = (d.namespace.clone(), d.name.clone());
        wanted.insert(key.clone());
        match by_name.get(&key) {
            None => p.create.push(d.clone()),
            Some(m) => {
                let current = m
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(MIRROR_ANNOTATION))
                    .is_some_and(|h| *h == static_hash(d));
                // A mirror being deleted is gone soon; it is made again then.
                if !current && m.metadata.deletion_timestamp.is_none() {
                    p.delete.push(identity(m));
                }
            }
        }
    }
    for (key, m) in by_name {
        if !wanted.contains(&key) && m.metadata.deletion_timestamp.is_none() {
            p.delete.push(identity(m));
        }
    }
    p
}

fn identity(m: &Pod) -> (String, String, String) {
    (
        m.metadata.namespace.clone().unwrap_or_default(),
        m.metadata.name.clone().unwrap_or_default(),
        m.metadata.uid.clone().unwrap_or_default(),
    )
}

/// The static pods that get mirrors: valid, and the owner of their name.
fn statics(source: &PodSource) -> Vec<DesiredPod> {
    source
        .all()
        .into_iter()
        .filter(|d| matches!(d.source, PodOrigin::File(_)) && d.invalid.is_none())
        .filter(|d| source.owner(&d.namespace, &d.name).as_deref() == Some(d.uid.as_str()))
        .collect()
}

/// What the mirror loop works with.
pub struct MirrorParts {
    /// The node's client.
    pub client: kube::Client,
    /// The node's name.
    pub node: String,
    /// The Node's UID, once registered.
    pub node_uid: tokio::sync::watch::Receiver<Option<String>>,
    /// The pods wanted (static ones among them).
    pub source: PodSource,
    /// The informer's cache of this node's pods (mirrors among them).
    pub pods: petrel_controller::informer::Store<Pod>,
    /// Woken when a static pod or a mirror may have changed.
    pub wake: Arc<tokio::sync::Notify>,
}

/// Keeps the mirrors in line, on news and every 10 s; runs until its task
/// is aborted.
pub async fn run(mut p: MirrorParts) {
    let mut failing: Option<String> = None;
    let node_uid = loop {
        if let Some(uid) = p.node_uid.borrow().clone() {
            break uid;
        }
        if p.node_uid.changed().await.is_err() {
            return;
        }
    };
    loop {
        let plan = plan(&statics(&p.source), &p.pods.list());
        let mut error = None;
        for (ns, name, uid) in &plan.delete {
            let api: kube::Api<Pod> = kube::Api::namespaced(p.client.clone(), ns);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(name, &dp).await {
                Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "mirror pod deleted"),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => error = Some(format!("delete mirror pod {ns}/{name}: {e}")),
            }
        }
        for d in &plan.create {
            let api: kube::Api<Pod> = kube::Api::namespaced(p.client.clone(), &d.namespace);
            let mirror = mirror_of(d, &p.node, &node_uid);
            match api.create(&PostParams::default(), &mirror).await {
                Ok(_) => {
                    tracing::info!(pod = %format!("{}/{}", d.namespace, d.name), "mirror pod created")
                }
                // Made meanwhile (or an outdated one still there).
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    error = Some(format!("create mirror pod {}/{}: {e}", d.namespace, d.name))
                }
            }
        }
        match error {
            Some(e) if failing.as_deref() != Some(e.as_str()) => {
                tracing::warn!(error = %e, "mirror pods: retrying");
                failing = Some(e);
            }
            Some(_) => {}
            None => failing = None,
        }
        let _ = tokio::time::timeout(CHECK_EVERY, p.wake.notified()).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::desired;

    fn mirror(d: &DesiredPod, uid: &str) -> Arc<Pod> {
        let mut m = mirror_of(d, "n1", "node-uid");
        m.metadata.uid = Some(uid.into());
        Arc::new(m)
    }

    #[test]
    fn a_mirror_should_be_owned_by_the_node_and_carry_the_static_pods_hash() {
        let d = desired("metadata: {name: s-n1, namespace: kube-system}\nspec:\n  containers: [{name: c, image: i}]\n");
        let m = mirror_of(&d, "n1", "node-uid");
        let a = m.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[MIRROR_ANNOTATION], static_hash(&d));
        assert_eq!(a[CONFIG_SOURCE], "file");
        let o = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.uid.as_str(), o.controller),
            ("Node", "node-uid", Some(true))
        );
        assert!(m.metadata.uid.is_none());
        assert_eq!(m.spec.unwrap().node_name.as_deref(), Some("n1"));
        assert!(is_mirror(&mirror_of(&d, "n1", "u")));
    }

    #[test]
    fn the_plan_should_make_missing_mirrors_and_delete_outdated_and_orphaned_ones() {
        let a = desired("metadata: {name: a}\nspec:\n  containers: [{name: c, image: i}]\n");
        let b = desired("metadata: {name: b}\nspec:\n  containers: [{name: c, image: i}]\n");
        let b2 = desired("metadata: {name: b}\nspec:\n  containers: [{name: c, image: j}]\n");
        let gone = desired("metadata: {name: gone}\nspec:\n  containers: [{name: c, image: i}]\n");
        let mirrors = vec![mirror(&b, "mb"), mirror(&gone, "mg")];
        let p = plan(&[a.clone(), b.clone()], &mirrors);
        assert_eq!(
            p.create.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(p.delete, [("default".into(), "gone".into(), "mg".into())]);
        // b changed: its mirror is replaced (deleted now, made next pass).
        let p = plan(&[b2], &mirrors);
        assert!(p
            .delete
            .contains(&("default".into(), "b".into(), "mb".into())));
        assert!(p.create.is_empty());
        // In line: nothing to do.
        let p = plan(std::slice::from_ref(&b), &[mirror(&b, "mb")]);
        assert!(p.create.is_empty() && p.delete.is_empty());
    }

    #[test]
    fn an_api_pod_of_the_same_name_should_not_be_taken_for_a_mirror() {
        let s = desired("metadata: {name: a}\nspec:\n  containers: [{name: c, image: i}]\n");
        let mut api = Pod::clone(&s.pod);
        api.metadata.uid = Some("api".into());
        let p = plan(&[s], &[Arc::new(api)]);
        assert_eq!(p.create.len(), 1);
        assert!(p.delete.is_empty());
    }
}
