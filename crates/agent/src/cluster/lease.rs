//! The node's heartbeat: its Lease in `kube-node-lease`, renewed as
//! kubelet renews it (a 40 s lease renewed every 10 s, a quarter of it;
//! retried from 200 ms up to 7 s while the API server fails), so the
//! node lifecycle controller sees the node alive without a status write.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;

/// The namespace of node leases.
pub const NAMESPACE: &str = "kube-node-lease";
/// kubelet's node lease duration.
pub const DURATION_SECS: i32 = 40;
/// How often the lease is renewed (a quarter of its duration).
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// The first and the longest retry delay after a failure (kubelet's).
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(7);

/// The lease `prev` renewed at `now` by node `node` (of UID `node_uid`,
/// its owner once known, so the lease goes with the Node): a new lease
/// when there is none.
pub fn renewed(prev: Option<&Lease>, node: &str, node_uid: Option<&str>, now: Timestamp) -> Lease {
    let mut lease = prev.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            ..Default::default()
        },
        spec: None,
    });
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node.to_string());
    spec.lease_duration_seconds = Some(DURATION_SECS);
    spec.renew_time = Some(MicroTime(now));
    if let Some(uid) = node_uid {
        let owned = lease
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid);
        if !owned {
            lease.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid: uid.to_string(),
                ..Default::default()
            }]);
        }
    }
    lease
}

/// Renews the lease of `node` forever (until its task is aborted).
/// `node_uid` gives the Node's UID once it is registered.
pub async fn run(
    client: kube::Client,
    node: String,
    node_uid: tokio::sync::watch::Receiver<Option<String>>,
) {
    let api: kube::Api<Lease> = kube::Api::namespaced(client, NAMESPACE);
    let mut last: Option<Lease> = None;
    let mut retry = RETRY_FIRST;
    let mut failing: Option<String> = None;
    loop {
        let uid = node_uid.borrow().clone();
        match renew(&api, &node, uid.as_deref(), last.take()).await {
            Ok(l) => {
                if failing.take().is_some() {
                    tracing::info!(node, "node lease renewed again");
                }
                last = Some(l);
                retry = RETRY_FIRST;
                tokio::time::sleep(RENEW_EVERY).await;
            }
            Err(e) => {
                let cause = e.to_string();
                if failing.as_deref() != Some(cause.as_str()) {
                    tracing::warn!(node, error = %cause, "renewing the node lease failed; retrying with backoff");
                    failing = Some(cause);
                }
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

/// One renewal: an update of the lease last written (one request), else a
/// read and an update, or a create when there is none.
async fn renew(
    api: &kube::Api<Lease>,
    node: &str,
    node_uid: Option<&str>,
    last: Option<Lease>,
) -> Result<Lease, kube::Error> {
    let pp = PostParams::default();
    if let Some(l) = last {
        let next = renewed(Some(&l), node, node_uid, Timestamp::now());
        match api.replace(node, &pp, &next).await {
            Ok(l) => return Ok(l),
            // Someone else wrote it (or it was deleted): read it again.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    match api.get_opt(node).await? {
        Some(l) => {
            let next = renewed(Some(&l), node, node_uid, Timestamp::now());
            api.replace(node, &pp, &next).await
        }
        None => {
            let next = renewed(None, node, node_uid, Timestamp::now());
            api.create(&pp, &next).await
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_new_lease_should_be_held_by_the_node_for_kubelets_duration() {
        let l = renewed(None, "n1", None, at("2026-01-01T00:00:00Z"));
        assert_eq!(l.metadata.name.as_deref(), Some("n1"));
        assert_eq!(l.metadata.namespace.as_deref(), Some(NAMESPACE));
        let s = l.spec.unwrap();
        assert_eq!(s.holder_identity.as_deref(), Some("n1"));
        assert_eq!(s.lease_duration_seconds, Some(40));
        assert_eq!(s.renew_time.unwrap().0.to_string(), "2026-01-01T00:00:00Z");
        assert!(l.metadata.owner_references.is_none());
    }

    #[test]
    fn a_renewal_should_move_only_the_renew_time_and_add_the_node_as_owner() {
        let mut first = renewed(None, "n1", None, at("2026-01-01T00:00:00Z"));
        first.metadata.resource_version = Some("7".into());
        let next = renewed(
            Some(&first),
            "n1",
            Some("uid-1"),
            at("2026-01-01T00:00:10Z"),
        );
        assert_eq!(next.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            next.spec
                .as_ref()
                .unwrap()
                .renew_time
                .as_ref()
                .unwrap()
                .0
                .to_string(),
            "2026-01-01T00:00:10Z"
        );
        let owners = next.metadata.owner_references.clone().unwrap();
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("Node", "uid-1")
        );
        // Owned already: left as is.
        let again = renewed(Some(&next), "n1", Some("uid-1"), at("2026-01-01T00:00:20Z"));
        assert_eq!(again.metadata.owner_references.unwrap().len(), 1);
    }
}
