//! The Node object: registered once (created, or, if it exists, its labels
//! brought up to date, as kubelet does), then its status computed every
//! 10 s (kubelet's nodeStatusUpdateFrequency) and sent only when it
//! changed or 5 min have passed (nodeStatusReportFrequency): the Lease is
//! the heartbeat, the status is news.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::node_object::{
    conditions, node_images, node_status, registration, status_changed, ConditionInputs,
    MachineFacts, NodeIdentity, Reservations,
};
use crate::cri::RuntimeObserver;
use crate::eviction::NodeState;

/// How often the status is computed (kubelet's nodeStatusUpdateFrequency).
pub const UPDATE_EVERY: Duration = Duration::from_secs(10);
/// The longest a status goes unsent (kubelet's nodeStatusReportFrequency).
pub const REPORT_EVERY: Duration = Duration::from_secs(300);
/// Retry delays of a failed registration or status write.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(7);

/// What the node loop is made of.
pub struct NodeParts {
    /// The node's client.
    pub client: kube::Client,
    /// Who the node is.
    pub identity: NodeIdentity,
    /// The machine.
    pub facts: MachineFacts,
    /// What is set aside from capacity.
    pub reservations: Reservations,
    /// The runtime (readiness, images).
    pub runtime: Arc<dyn RuntimeObserver>,
    /// The eviction manager's pressure conditions.
    pub pressure: Arc<NodeState>,
    /// Told the Node's UID once it is registered (the Lease's owner).
    pub uid: tokio::sync::watch::Sender<Option<String>>,
}

/// Registers the node, then keeps its status; runs until its task is
/// aborted.
pub async fn run(p: NodeParts) {
    let api: kube::Api<Node> = kube::Api::all(p.client.clone());
    let name = p.identity.name.clone();
    let mut failing = Failing::default();
    let mut retry = RETRY_FIRST;
    let mut last: NodeStatus = loop {
        let status = current_status(&p, None).await;
        match register(&api, &p.identity, status.clone()).await {
            Ok(node) => {
                failing.ok(&name, "registration");
                tracing::info!(node = %name, "node registered");
                let _ = p.uid.send(node.metadata.uid.clone());
                break node.status.unwrap_or(status);
            }
            Err(e) => {
                failing.err(&name, "registration", &e);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    };
    let mut sent_at = Instant::now();
    // An existing Node (an agent restart) gets its status at once.
    let mut first = true;
    loop {
        if !first {
            tokio::time::sleep(UPDATE_EVERY).await;
        }
        first = false;
        let next = current_status(&p, last.conditions.as_deref()).await;
        if !status_changed(&last, &next) && sent_at.elapsed() < REPORT_EVERY {
            continue;
        }
        let patch = json!({ "status": next });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {
                failing.ok(&name, "status");
                last = next;
                sent_at = Instant::now();
            }
            // Retried at the next update.
            Err(e) => failing.err(&name, "status", &e),
        }
    }
}

/// Creates the Node; if it exists, brings its labels up to date (a node
/// keeps its taints and spec, as kubelet leaves them) and returns it.
async fn register(
    api: &kube::Api<Node>,
    identity: &NodeIdentity,
    status: NodeStatus,
) -> Result<Node, kube::Error> {
    let node = registration(identity, status);
    match api.create(&PostParams::default(), &node).await {
        Ok(n) => Ok(n),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let annotations = node.metadata.annotations.clone().unwrap_or_default();
            let patch = json!({"metadata": {"labels": labels, "annotations": annotations}});
            api.patch(
                &identity.name,
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
        }
        Err(e) => Err(e),
    }
}

/// The status now: the runtime's readiness, the eviction manager's
/// pressure, the images; conditions' transition times carried from `prev`.
async fn current_status(p: &NodeParts, prev: Option<&[NodeCondition]>) -> NodeStatus {
    let (runtime, network) = match p.runtime.status().await {
        Ok(s) => readiness(&s),
        Err(e) => (Err(format!("container runtime is down: {e}")), Ok(())),
    };
    let inputs = ConditionInputs::new(runtime, network, &p.pressure.conditions());
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conds = conditions(&inputs, prev, &now);
    let images = match p.runtime.list_images().await {
        Ok(list) => node_images(list.into_iter().map(|i| {
            let mut names = i.repo_digests;
            names.extend(i.repo_tags);
            (names, i.size)
        })),
        Err(_) => Vec::new(),
    };
    node_status(&p.identity, &p.facts, &p.reservations, conds, images)
}

/// The runtime's and its network's readiness from CRI Status, with
/// kubelet's messages.
fn readiness(s: &petrel_cri::api::RuntimeStatus) -> (Result<(), String>, Result<(), String>) {
    let cond = |t: &str| s.conditions.iter().find(|c| c.r#type == t);
    let check = |t: &str, what: &str| match cond(t) {
        Some(c) if c.status => Ok(()),
        Some(c) => Err(format!(
            "{what} not ready: {t}=false reason:{} message:{}",
            c.reason, c.message
        )),
        None => Err(format!("{what} not ready: {t} missing")),
    };
    (
        check(
            "RuntimeReady",
            "container runtime status check may not have completed yet: container runtime",
        ),
        check("NetworkReady", "container runtime network"),
    )
}

/// Failures logged once per cause and part.
#[derive(Default)]
struct Failing(BTreeMap<&'static str, String>);

impl Failing {
    fn err(&mut self, node: &str, part: &'static str, e: &kube::Error) {
        let cause = e.to_string();
        if self.0.get(part) != Some(&cause) {
            tracing::warn!(node, part, error = %cause, "node update failed; retrying");
            self.0.insert(part, cause);
        }
    }

    fn ok(&mut self, node: &str, part: &'static str) {
        if self.0.remove(part).is_some() {
            tracing::info!(node, part, "node update succeeded again");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use petrel_cri::api::{RuntimeCondition, RuntimeStatus};

    fn status(runtime: bool, network: bool) -> RuntimeStatus {
        let c = |t: &str, s: bool| RuntimeCondition {
            r#type: t.into(),
            status: s,
            reason: if s { String::new() } else { "NotReady".into() },
            message: if s { String::new() } else { "no CNI".into() },
        };
        RuntimeStatus {
            conditions: vec![c("RuntimeReady", runtime), c("NetworkReady", network)],
        }
    }

    #[test]
    fn readiness_should_name_what_is_not_ready() {
        assert_eq!(readiness(&status(true, true)), (Ok(()), Ok(())));
        let (r, n) = readiness(&status(true, false));
        assert!(r.is_ok());
        let n = n.unwrap_err();
        assert!(
            n.contains("network not ready") && n.contains("no CNI"),
            "{n}"
        );
        let (r, _) = readiness(&RuntimeStatus { conditions: vec![] });
        assert!(r.unwrap_err().contains("RuntimeReady missing"));
    }
}
