//! Pods the API server bound to this node (cluster mode), beside the
//! manifest directory's: fed by the cluster's pod informer, read by the
//! workers through the same [`PodSource`].
//!
//! A pod with a deletionTimestamp is no longer wanted: [`PodSource::get`]
//! stops returning it, so its worker terminates it, and
//! [`PodSource::deleting`] gives the pod with the deletion's grace period
//! (the smaller of the pod's and the request's) to terminate it with.
//! Mirror pods (the API's copies of static pods) are never run.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::{defaults, validate, ChangeKind, PodSource, SourceChange};
use crate::types::{DesiredPod, PodOrigin, PodUid};

/// The annotation that marks a mirror pod (kubelet's
/// `kubernetes.io/config.mirror`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether `pod` is the mirror of a static pod.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// An API pod as the workers want it: the API server's defaults are there
/// already; the agent's own checks may still find it cannot run here (a
/// volume type it does not provide, say).
fn desired(pod: &Pod, node: &str) -> Option<DesiredPod> {
    let uid = pod.metadata.uid.clone().filter(|u| !u.is_empty())?;
    let name = pod.metadata.name.clone().filter(|n| !n.is_empty())?;
    let mut pod = pod.clone();
    defaults::apply(&mut pod, node);
    // The informer's copy changes with every status write (the agent's
    // own too); what the workers act on is the pod without its status and
    // the fields every write changes.
    pod.status = None;
    pod.metadata.resource_version = None;
    pod.metadata.managed_fields = None;
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let errors = validate::validate_api(&pod);
    Some(DesiredPod {
        uid,
        namespace,
        name,
        pod: Arc::new(pod),
        source: PodOrigin::Api,
        invalid: (!errors.is_empty()).then(|| errors.join("; ")),
    })
}

/// The grace period a pod being deleted is stopped with: the deletion's
/// (`metadata.deletionGracePeriodSeconds`), never more than its own.
fn deletion_grace(pod: &Pod) -> Option<i64> {
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds);
    match (pod.metadata.deletion_grace_period_seconds, own) {
        (Some(d), Some(o)) => Some(d.min(o).max(0)),
        (Some(d), None) => Some(d.max(0)),
        (None, o) => o,
    }
}

impl PodSource {
    /// Takes the API's pod in (added or changed). Returns the change the
    /// workers must hear of, if the pod they act on changed: a status
    /// write or a resync changes nothing. A pod that got a
    /// deletionTimestamp is a removal.
    pub fn upsert_api(&self, pod: &Pod) -> Option<SourceChange> {
        if is_mirror(pod) {
            return None;
        }
        let mut d = desired(pod, &self.inner.node)?;
        let mut st = self.write();
        let uid = d.uid.clone();
        if pod.metadata.deletion_timestamp.is_some() {
            // Its worker stops it with the deletion's grace period.
            let mut p = Pod::clone(&d.pod);
            if let Some(spec) = p.spec.as_mut() {
                spec.termination_grace_period_seconds = deletion_grace(pod);
            }
            d.pod = Arc::new(p);
            let was = st.api.remove(&uid);
            let first = !st.api_deleting.contains_key(&uid);
            st.api_deleting.insert(uid.clone(), d.clone());
            return (was.is_some() || first).then_some(SourceChange {
                uid,
                kind: ChangeKind::Removed,
                pod: d,
            });
        }
        let kind = match st.api.get(&uid) {
            None => ChangeKind::Added,
            Some(o) if *o.pod == *d.pod && o.invalid == d.invalid => return None,
            Some(_) => ChangeKind::Updated,
        };
        st.api.insert(uid.clone(), d.clone());
        Some(SourceChange { uid, kind, pod: d })
    }

    /// The API's pod is gone (deleted for good, or no longer bound here).
    pub fn remove_api(&self, pod: &Pod) -> Option<SourceChange> {
        let uid = pod.metadata.uid.clone()?;
        let mut st = self.write();
        let wanted = st.api.remove(&uid);
        let deleting = st.api_deleting.remove(&uid);
        let d = wanted.or(deleting)?;
        Some(SourceChange {
            uid,
            kind: ChangeKind::Removed,
            pod: d,
        })
    }

    /// The API pod `uid` while it is being deleted (stopped with the
    /// deletion's grace period), until it is gone from the API.
    pub fn deleting(&self, uid: &str) -> Option<DesiredPod> {
        self.read().api_deleting.get(uid).cloned()
    }

    /// Whether `uid` is a pod of the API server (wanted or being deleted).
    pub fn is_api(&self, uid: &str) -> bool {
        let st = self.read();
        st.api.contains_key(uid) || st.api_deleting.contains_key(uid)
    }

    /// The UIDs of every API pod known, wanted or being deleted.
    pub fn api_uids(&self) -> Vec<PodUid> {
        let st = self.read();
        st.api
            .keys()
            .chain(st.api_deleting.keys())
            .cloned()
            .collect()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, super::State> {
        self.inner.state.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn source() -> (tempfile::TempDir, PodSource) {
        let dir = tempfile::tempdir().unwrap();
        let src = PodSource::load(dir.path(), "node-a").unwrap();
        (dir, src)
    }

    const WEB: &str = "metadata: {name: web, namespace: ns, uid: u1}\nspec:\n  nodeName: node-a\n  terminationGracePeriodSeconds: 30\n  containers: [{name: c, image: busybox}]\n";

    #[test]
    fn an_api_pod_should_be_wanted_beside_the_static_pods() {
        let (_d, src) = source();
        let c = src.upsert_api(&pod(WEB)).unwrap();
        assert_eq!(c.kind, ChangeKind::Added);
        assert_eq!(c.pod.source, PodOrigin::Api);
        assert_eq!(src.get("u1").unwrap().name, "web");
        assert_eq!(src.all().len(), 1);
        assert!(src.is_api("u1"));
        assert_eq!(src.owner("ns", "web").as_deref(), Some("u1"));
    }

    #[test]
    fn a_status_write_should_change_nothing_the_workers_act_on() {
        let (_d, src) = source();
        src.upsert_api(&pod(WEB)).unwrap();
        let mut p = pod(WEB);
        p.metadata.resource_version = Some("7".into());
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        assert!(src.upsert_api(&p).is_none());
        let mut q = pod(WEB);
        q.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
        assert_eq!(src.upsert_api(&q).unwrap().kind, ChangeKind::Updated);
    }

    #[test]
    fn a_deletion_should_end_the_pod_with_the_smaller_grace_period() {
        let (_d, src) = source();
        src.upsert_api(&pod(WEB)).unwrap();
        let mut p = pod(WEB);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        p.metadata.deletion_grace_period_seconds = Some(5);
        let c = src.upsert_api(&p).unwrap();
        assert_eq!(c.kind, ChangeKind::Removed);
        assert!(src.get("u1").is_none());
        assert!(src.all().is_empty());
        let d = src.deleting("u1").unwrap();
        let grace = d
            .pod
            .spec
            .as_ref()
            .unwrap()
            .termination_grace_period_seconds;
        assert_eq!(grace, Some(5));
        // The same deletion seen again is no news.
        assert!(src.upsert_api(&p).is_none());
        // Gone from the API: gone here.
        assert_eq!(src.remove_api(&p).unwrap().kind, ChangeKind::Removed);
        assert!(src.deleting("u1").is_none());
        assert!(!src.is_api("u1"));
    }

    #[test]
    fn a_mirror_pod_should_never_run() {
        let (_d, src) = source();
        let mut p = pod(WEB);
        p.metadata.annotations = Some(BTreeMap::from([(MIRROR_ANNOTATION.into(), "h".into())]));
        assert!(src.upsert_api(&p).is_none());
        assert!(src.all().is_empty());
    }

    #[test]
    fn a_pod_the_agent_cannot_run_should_be_wanted_as_invalid() {
        let (_d, src) = source();
        let p = pod("metadata: {name: cm, namespace: ns, uid: u2}\nspec:\n  volumes: [{name: v, gitRepo: {repository: x}}]\n  containers: [{name: c, image: busybox}]\n");
        let c = src.upsert_api(&p).unwrap();
        assert!(c.pod.invalid.unwrap().contains("gitRepo"));
    }
}
