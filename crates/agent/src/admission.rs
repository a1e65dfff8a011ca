//! Pod admission, as kubelet decides it before a pod first starts: does the
//! pod fit beside the pods already admitted (requests against the node's
//! allocatable, the pod count), does it want this node (nodeSelector,
//! required node affinity, nodeName), are its host ports free, does it
//! tolerate the node's NoExecute taints.
//!
//! Everything here is pure: the pod, the pods already admitted and the
//! node's facts in, a verdict out. The pod workers keep the verdicts and
//! decide who is admitted already (see `worker::PodWorkers`).
//!
//! A refused pod shows phase Failed with the refusal's reason (kubelet's:
//! `OutOfcpu`, `NodeAffinity`, ...) and its message prefixed as kubelet
//! prefixes it ([`Refusal::status_message`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// What admission needs to know of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    /// The node's name.
    pub name: String,
    /// Its labels (the standard ones and `--node-labels`).
    pub labels: BTreeMap<String, String>,
    /// Its taints (`--register-with-taints`).
    pub taints: Vec<Taint>,
    /// Its allocatable: `cpu` in millicores, `memory`,
    /// `ephemeral-storage` and `hugepages-<size>` in bytes, `pods` a
    /// count.
    pub allocatable: BTreeMap<String, i64>,
}

impl NodeFacts {
    /// The facts from the node's allocatable as the Node shows it
    /// (quantities); a quantity that cannot be read counts as zero, as an
    /// unreadable machine fact does.
    pub fn new(
        name: String,
        labels: BTreeMap<String, String>,
        taints: Vec<Taint>,
        allocatable: &BTreeMap<String, Quantity>,
    ) -> Self {
        let allocatable = allocatable
            .iter()
            .map(|(k, q)| (k.clone(), amount(k, &q.0)))
            .collect();
        Self {
            name,
            labels,
            taints,
            allocatable,
        }
    }
}

/// Why a pod was refused: kubelet's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `OutOfcpu`, `OutOfpods`, `NodeAffinity`, `NodePorts`,
    /// `TaintToleration`, `NodeName`, ...
    pub reason: String,
    /// What the check found (without kubelet's prefix).
    pub message: String,
}

impl Refusal {
    fn predicate(name: &str, why: &str) -> Self {
        Self {
            reason: name.to_string(),
            message: format!("Predicate {name} failed: {why}"),
        }
    }

    /// The message the pod's status shows (kubelet prefixes it so).
    pub fn status_message(&self) -> String {
        format!("Pod was rejected: {}", self.message)
    }
}

/// A pod to admit.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// The pod's UID.
    pub uid: &'a str,
    /// The pod.
    pub pod: &'a Pod,
    /// Whether it is a static pod (kubelet does not check their taints).
    pub is_static: bool,
}

/// Admits `c` beside `admitted` (every pod that holds its resources on the
/// node) on `node`: Ok, or the first refusal in kubelet's order (the pod's
/// OS, then resources, node affinity, node name, host ports, taints).
pub fn admit(c: &Candidate<'_>, admitted: &[&Pod], node: &NodeFacts) -> Result<(), Refusal> {
    let Some(spec) = c.pod.spec.as_ref() else {
        return Ok(());
    };
    // A pod labelled for another OS, or asking for one, cannot run here
    // whatever else holds (kubelet checks these first).
    let os_label = c.pod.metadata.labels.as_ref().and_then(|l| l.get(OS_LABEL));
    // (kubelet compares with its own OS whatever the node's label says.)
    if os_label.is_some_and(|os| os != "linux") {
        return Err(Refusal {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".to_string(),
            message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                .to_string(),
        });
    }
    if spec.os.as_ref().is_some_and(|os| os.name != "linux") {
        return Err(Refusal {
            reason: "PodOSNotSupported".to_string(),
            message: "Failed to admit pod as the OS field doesn't match node OS".to_string(),
        });
    }
    fits_resources(c.pod, admitted, node)?;
    if !matches_node(spec, node) {
        return Err(Refusal::predicate(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node.name)
    {
        return Err(Refusal::predicate(
            "NodeName",
            "node(s) didn't match the requested node name",
        ));
    }
    if !ports_free(spec, admitted) {
        return Err(Refusal::predicate(
            "NodePorts",
            "node(s) didn't have free ports for the requested pod ports",
        ));
    }
    // Only NoExecute matters here: NoSchedule is the scheduler's business,
    // and a static pod is the node's own.
    if !c.is_static && untolerated_no_execute(&node.taints, spec) {
        return Err(Refusal::predicate(
            "TaintToleration",
            "node(s) had taints that the pod didn't tolerate",
        ));
    }
    Ok(())
}

/// Admits `pending` one after the other, oldest first (by creation time,
/// then namespace and name), each beside `admitted` and the ones admitted
/// before it, as kubelet admits the pods that arrive together. Returns
/// each pod's UID with its verdict, in that order; `admitted` ends with the
/// ones admitted.
pub fn admit_in_order<'a>(
    mut pending: Vec<Candidate<'a>>,
    admitted: &mut Vec<&'a Pod>,
    node: &NodeFacts,
) -> Vec<(&'a str, Result<(), Refusal>)> {
    pending.sort_by(|a, b| {
        let key = |c: &Candidate<'a>| {
            let m = &c.pod.metadata;
            (
                m.creation_timestamp.as_ref().map(|t| t.0),
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
                c.uid.to_string(),
            )
        };
        key(a).cmp(&key(b))
    });
    pending
        .into_iter()
        .map(|c| {
            let verdict = admit(&c, admitted, node);
            if verdict.is_ok() {
                admitted.push(c.pod);
            }
            (c.uid, verdict)
        })
        .collect()
}

const OS_LABEL: &str = "kubernetes.io/os";

// ---------------------------------------------------------------------------
// Resources.

/// A resource's amount: `cpu` in millicores, anything else in units
/// (bytes, a count); an unreadable quantity is zero (the API server
/// validated it).
fn amount(resource: &str, q: &str) -> i64 {
    let v = if resource == "cpu" {
        crate::quantity::cpu_millis(q)
    } else {
        crate::quantity::bytes(q)
    };
    v.unwrap_or(0)
}

/// A container's requests; a resource with a limit and no request asks for
/// its limit (what the API server's defaulting writes).
fn container_requests(c: &Container) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let Some(r) = c.resources.as_ref() else {
        return out;
    };
    for (k, q) in r.limits.iter().flatten() {
        out.insert(k.clone(), amount(k, &q.0));
    }
    for (k, q) in r.requests.iter().flatten() {
        out.insert(k.clone(), amount(k, &q.0));
    }
    out
}

fn add(into: &mut BTreeMap<String, i64>, from: &BTreeMap<String, i64>) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_insert(0);
        *e = e.saturating_add(*v);
    }
}

fn max_into(into: &mut BTreeMap<String, i64>, from: &BTreeMap<String, i64>) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

/// The pod's effective requests, as kubelet and the scheduler count them:
/// per resource the larger of (app containers + sidecars) and the largest
/// init container with the sidecars started before it; pod-level cpu and
/// memory requests replace the containers'; plus the pod's overhead.
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, i64> {
    let mut reqs = BTreeMap::new();
    let Some(spec) = pod.spec.as_ref() else {
        return reqs;
    };
    for c in &spec.containers {
        add(&mut reqs, &container_requests(c));
    }
    let mut sidecars = BTreeMap::new();
    let mut init_peak = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let own = container_requests(c);
        if c.restart_policy.as_deref() == Some("Always") {
            // A sidecar runs beside the app containers and beside every
            // init container after it.
            add(&mut reqs, &own);
            add(&mut sidecars, &own);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut at_its_point = own;
            add(&mut at_its_point, &sidecars);
            max_into(&mut init_peak, &at_its_point);
        }
    }
    max_into(&mut reqs, &init_peak);
    let pod_level = spec.resources.as_ref().and_then(|r| {
        let mut m = BTreeMap::new();
        for (k, q) in r.limits.iter().flatten() {
            m.insert(k.clone(), amount(k, &q.0));
        }
        for (k, q) in r.requests.iter().flatten() {
            m.insert(k.clone(), amount(k, &q.0));
        }
        (!m.is_empty()).then_some(m)
    });
    for res in ["cpu", "memory"] {
        if let Some(v) = pod_level.as_ref().and_then(|m| m.get(res)) {
            reqs.insert(res.to_string(), *v);
        }
    }
    let overhead = spec
        .overhead
        .iter()
        .flatten()
        .map(|(k, q)| (k.clone(), amount(k, &q.0)))
        .collect();
    add(&mut reqs, &overhead);
    reqs
}

/// Resources checked besides cpu, memory and ephemeral-storage: huge
/// pages and names with a domain (extended resources, which count only if
/// the node has them).
fn is_scalar(resource: &str) -> bool {
    resource.starts_with("hugepages-") || resource.contains('/')
}

/// An extended resource (a domain outside `kubernetes.io`): one the node
/// does not offer is left to whoever placed the pod, as kubelet leaves it.
fn is_extended(resource: &str) -> bool {
    match resource.split_once('/') {
        Some((domain, _)) => {
            !(domain == "kubernetes.io"
                || domain.ends_with(".kubernetes.io")
                || resource.starts_with("requests."))
        }
        None => false,
    }
}

fn out_of(resource: &str, requested: i64, used: i64, capacity: i64) -> Refusal {
    Refusal {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// The pod count, then cpu, memory, ephemeral-storage and the scalar
/// resources, as kubelet checks them; the first that does not fit refuses.
fn fits_resources(pod: &Pod, admitted: &[&Pod], node: &NodeFacts) -> Result<(), Refusal> {
    let alloc = |r: &str| node.allocatable.get(r).copied().unwrap_or(0);
    let count = i64::try_from(admitted.len()).unwrap_or(i64::MAX);
    if count.saturating_add(1) > alloc("pods") {
        return Err(out_of("pods", 1, count, alloc("pods")));
    }
    let want = pod_requests(pod);
    let get = |r: &str| want.get(r).copied().unwrap_or(0);
    let scalars: Vec<(&String, i64)> = want
        .iter()
        .filter(|(k, _)| is_scalar(k))
        .filter(|(k, _)| !is_extended(k) || node.allocatable.contains_key(*k))
        .map(|(k, v)| (k, *v))
        .collect();
    if get("cpu") == 0 && get("memory") == 0 && get("ephemeral-storage") == 0 && scalars.is_empty()
    {
        return Ok(());
    }
    let mut used: BTreeMap<String, i64> = BTreeMap::new();
    for p in admitted {
        add(&mut used, &pod_requests(p));
    }
    let used_of = |r: &str| used.get(r).copied().unwrap_or(0);
    for r in ["cpu", "memory", "ephemeral-storage"] {
        let v = get(r);
        if v > 0 && v > alloc(r).saturating_sub(used_of(r)) {
            return Err(out_of(r, v, used_of(r), alloc(r)));
        }
    }
    for (r, v) in scalars {
        if v != 0 && v > alloc(r).saturating_sub(used_of(r)) {
            return Err(out_of(r, v, used_of(r), alloc(r)));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Node selector and required node affinity.

/// Whether the node carries every label of the pod's nodeSelector and
/// matches one of the terms of its required node affinity.
fn matches_node(spec: &PodSpec, node: &NodeFacts) -> bool {
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    if !selector_ok {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node)),
    }
}

/// A term matches when all its expressions and fields do; an empty term,
/// or one with an invalid requirement, matches nothing.
fn term_matches(term: &NodeSelectorTerm, node: &NodeFacts) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|r| label_matches(r, &node.labels))
        && fields.iter().all(|r| field_matches(r, &node.name))
}

fn label_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    match r.operator.as_str() {
        "In" => !values.is_empty() && value.is_some_and(|v| values.contains(v)),
        "NotIn" => !values.is_empty() && value.is_none_or(|v| !values.contains(v)),
        "Exists" => values.is_empty() && value.is_some(),
        "DoesNotExist" => values.is_empty() && value.is_none(),
        op @ ("Gt" | "Lt") => {
            let [bound] = values else {
                return false;
            };
            let (Ok(bound), Some(Ok(v))) = (bound.parse::<i64>(), value.map(|v| v.parse::<i64>()))
            else {
                return false;
            };
            if op == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// Only `metadata.name` can be matched by field, with In or NotIn and one
/// value.
fn field_matches(r: &NodeSelectorRequirement, name: &str) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    if r.key != "metadata.name" {
        return false;
    }
    match (r.operator.as_str(), values) {
        ("In", [v]) => v == name,
        ("NotIn", [v]) => v != name,
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// Host ports.

/// (protocol, host IP, host port) of the app containers' ports that take a
/// host port; the protocol defaults to TCP and the IP to all addresses.
fn host_ports(spec: &PodSpec) -> Vec<(String, String, i32)> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| {
            let protocol = p
                .protocol
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "TCP".to_string());
            let ip = p
                .host_ip
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "0.0.0.0".to_string());
            (protocol, ip, p.host_port.unwrap_or(0))
        })
        .collect()
}

/// Whether none of the pod's host ports is taken by an admitted pod: the
/// same protocol and port on the same IP, or on any IP when either side
/// binds all addresses.
fn ports_free(spec: &PodSpec, admitted: &[&Pod]) -> bool {
    let want = host_ports(spec);
    if want.is_empty() {
        return true;
    }
    let taken: Vec<(String, String, i32)> = admitted
        .iter()
        .filter_map(|p| p.spec.as_ref())
        .flat_map(host_ports)
        .collect();
    !want.iter().any(|(proto, ip, port)| {
        taken.iter().any(|(tp, tip, tport)| {
            tp == proto && tport == port && (ip == "0.0.0.0" || tip == "0.0.0.0" || tip == ip)
        })
    })
}

// ---------------------------------------------------------------------------
// Taints.

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if t.key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "" | "Equal" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// Whether the node has a NoExecute taint none of the pod's tolerations
/// tolerates.
fn untolerated_no_execute(taints: &[Taint], spec: &PodSpec) -> bool {
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .any(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node() -> NodeFacts {
        NodeFacts {
            name: "n1".to_string(),
            labels: [
                ("kubernetes.io/hostname", "n1"),
                ("kubernetes.io/os", "linux"),
                ("disk", "ssd"),
                ("cores", "8"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            taints: Vec::new(),
            allocatable: [
                ("cpu", 2000),
                ("memory", 4 << 30),
                ("ephemeral-storage", 10 << 30),
                ("hugepages-2Mi", 64 << 20),
                ("pods", 3),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        }
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn with_requests(name: &str, cpu: &str, memory: &str) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
        }))
    }

    fn verdict(p: &Pod, admitted: &[&Pod], node: &NodeFacts) -> Result<(), Refusal> {
        admit(
            &Candidate {
                uid: "u",
                pod: p,
                is_static: false,
            },
            admitted,
            node,
        )
    }

    fn reason(r: Result<(), Refusal>) -> String {
        r.err().map(|r| r.reason).unwrap_or_default()
    }

    #[test]
    fn requests_should_be_the_larger_of_the_app_and_the_init_containers() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "i1", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                    {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
                    {"name": "i2", "resources": {"requests": {"cpu": "900m"}}}
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "300m", "memory": "100Mi"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "100m", "memory": "50Mi"}}}
                ],
                "overhead": {"cpu": "10m"}
            }
        }));
        let r = pod_requests(&p);
        // cpu: app 400m + sidecar 200m = 600m; i1 alone 1000m; i2 with the
        // sidecar 1100m: the peak wins, plus the overhead.
        assert_eq!(r["cpu"], 1110);
        // memory: app 150Mi vs i1 1Gi.
        assert_eq!(r["memory"], 1 << 30);
    }

    #[test]
    fn pod_level_requests_should_replace_the_containers() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "resources": {"requests": {"cpu": "1500m"}},
                "containers": [{"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Mi"}}}]
            }
        }));
        let r = pod_requests(&p);
        assert_eq!(r["cpu"], 1500);
        assert_eq!(r["memory"], 1 << 20);
    }

    #[test]
    fn a_pod_should_be_refused_when_its_cpu_does_not_fit_beside_the_admitted() {
        let n = node();
        let running = with_requests("a", "500m", "1Mi");
        let big = with_requests("b", "3", "1Mi");
        let err = verdict(&big, &[&running], &n).unwrap_err();
        assert_eq!(err.reason, "OutOfcpu");
        assert_eq!(
            err.status_message(),
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 3000, used: 500, capacity: 2000"
        );
        let fits = with_requests("c", "1500m", "1Mi");
        assert_eq!(verdict(&fits, &[&running], &n), Ok(()));
        let just_over = with_requests("d", "1501m", "1Mi");
        assert_eq!(reason(verdict(&just_over, &[&running], &n)), "OutOfcpu");
    }

    #[test]
    fn memory_storage_and_hugepages_should_be_checked_with_their_names() {
        let n = node();
        assert_eq!(
            reason(verdict(&with_requests("m", "1m", "5Gi"), &[], &n)),
            "OutOfmemory"
        );
        let storage = pod(serde_json::json!({
            "metadata": {"name": "s"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"ephemeral-storage": "11Gi"}}}]}
        }));
        let err = verdict(&storage, &[], &n).unwrap_err();
        assert_eq!(err.reason, "OutOfephemeral-storage");
        assert!(err.message.starts_with(
            "Node didn't have enough resource: ephemeral-storage, requested: 11811160064, used: 0"
        ));
        let huge = pod(serde_json::json!({
            "metadata": {"name": "h"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"hugepages-2Mi": "128Mi"}, "limits": {"hugepages-2Mi": "128Mi"}}}]}
        }));
        assert_eq!(reason(verdict(&huge, &[], &n)), "OutOfhugepages-2Mi");
        let huge1g = pod(serde_json::json!({
            "metadata": {"name": "h"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"hugepages-1Gi": "1Gi"}}}]}
        }));
        assert_eq!(reason(verdict(&huge1g, &[], &n)), "OutOfhugepages-1Gi");
        // An extended resource the node does not offer is not checked.
        let gpu = pod(serde_json::json!({
            "metadata": {"name": "g"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"example.com/gpu": "1"}}}]}
        }));
        assert_eq!(verdict(&gpu, &[], &n), Ok(()));
    }

    #[test]
    fn the_pod_count_should_be_checked_first_even_without_requests() {
        let n = node();
        let others: Vec<Pod> = (0..3)
            .map(|i| with_requests(&format!("p{i}"), "1m", "1"))
            .collect();
        let refs: Vec<&Pod> = others.iter().collect();
        let empty = pod(
            serde_json::json!({"metadata": {"name": "e"}, "spec": {"containers": [{"name": "c"}]}}),
        );
        let err = verdict(&empty, &refs, &n).unwrap_err();
        assert_eq!(err.reason, "OutOfpods");
        assert_eq!(
            err.message,
            "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
        );
        assert_eq!(verdict(&empty, &refs[..2], &n), Ok(()));
    }

    fn with_spec(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{"name": "c"}]);
        pod(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
    }

    fn affinity(exprs: serde_json::Value, fields: serde_json::Value) -> Pod {
        with_spec(serde_json::json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": exprs, "matchFields": fields}
            ]}
        }}}))
    }

    #[test]
    fn node_selector_and_affinity_should_match_the_nodes_labels() {
        let n = node();
        let ok = with_spec(serde_json::json!({"nodeSelector": {"disk": "ssd"}}));
        assert_eq!(verdict(&ok, &[], &n), Ok(()));
        let no = with_spec(serde_json::json!({"nodeSelector": {"disk": "hdd"}}));
        let err = verdict(&no, &[], &n).unwrap_err();
        assert_eq!(err.reason, "NodeAffinity");
        assert_eq!(
            err.status_message(),
            "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
        );
        let e = |key: &str, op: &str, values: &[&str]| serde_json::json!({"key": key, "operator": op, "values": values});
        let cases = [
            (e("disk", "In", &["hdd", "ssd"]), true),
            (e("disk", "In", &["hdd"]), false),
            (e("disk", "NotIn", &["hdd"]), true),
            (e("gpu", "NotIn", &["yes"]), true),
            (e("disk", "NotIn", &["ssd"]), false),
            (e("disk", "Exists", &[]), true),
            (e("gpu", "Exists", &[]), false),
            (e("gpu", "DoesNotExist", &[]), true),
            (e("disk", "DoesNotExist", &[]), false),
            (e("cores", "Gt", &["4"]), true),
            (e("cores", "Gt", &["8"]), false),
            (e("cores", "Lt", &["9"]), true),
            (e("cores", "Lt", &["x"]), false),
            (e("disk", "Gt", &["1"]), false),
            (e("disk", "Bogus", &["ssd"]), false),
        ];
        for (expr, want) in cases {
            let p = affinity(serde_json::json!([expr.clone()]), serde_json::json!([]));
            assert_eq!(verdict(&p, &[], &n).is_ok(), want, "{expr}");
        }
        let by_name = affinity(
            serde_json::json!([]),
            serde_json::json!([e("metadata.name", "In", &["n1"])]),
        );
        assert_eq!(verdict(&by_name, &[], &n), Ok(()));
        let other = affinity(
            serde_json::json!([]),
            serde_json::json!([e("metadata.name", "In", &["n2"])]),
        );
        assert_eq!(reason(verdict(&other, &[], &n)), "NodeAffinity");
        let not_other = affinity(
            serde_json::json!([]),
            serde_json::json!([e("metadata.name", "NotIn", &["n2"])]),
        );
        assert_eq!(verdict(&not_other, &[], &n), Ok(()));
        // Terms are ORed; an empty term matches nothing.
        let ored = with_spec(serde_json::json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {}, {"matchExpressions": [e("disk", "In", &["ssd"])]}
            ]}
        }}}));
        assert_eq!(verdict(&ored, &[], &n), Ok(()));
        let empty = with_spec(serde_json::json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}
        }}}));
        assert_eq!(reason(verdict(&empty, &[], &n)), "NodeAffinity");
        // Expressions within a term are ANDed.
        let both = affinity(
            serde_json::json!([e("disk", "In", &["ssd"]), e("gpu", "Exists", &[])]),
            serde_json::json!([]),
        );
        assert_eq!(reason(verdict(&both, &[], &n)), "NodeAffinity");
    }

    #[test]
    fn a_pod_for_another_node_or_os_should_be_refused() {
        let n = node();
        let elsewhere = with_spec(serde_json::json!({"nodeName": "n2"}));
        let err = verdict(&elsewhere, &[], &n).unwrap_err();
        assert_eq!(err.reason, "NodeName");
        assert_eq!(
            err.message,
            "Predicate NodeName failed: node(s) didn't match the requested node name"
        );
        assert_eq!(
            verdict(&with_spec(serde_json::json!({"nodeName": "n1"})), &[], &n),
            Ok(())
        );
        let windows = with_spec(serde_json::json!({"os": {"name": "windows"}}));
        assert_eq!(reason(verdict(&windows, &[], &n)), "PodOSNotSupported");
        let mut labelled = with_spec(serde_json::json!({}));
        labelled.metadata.labels =
            Some([("kubernetes.io/os".to_string(), "windows".to_string())].into());
        assert_eq!(
            reason(verdict(&labelled, &[], &n)),
            "PodOSSelectorNodeLabelDoesNotMatch"
        );
    }

    fn ports(list: serde_json::Value) -> Pod {
        pod(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "ports": list}]}}),
        )
    }

    #[test]
    fn host_ports_should_conflict_by_protocol_port_and_ip() {
        let n = node();
        let p = |port: i32, proto: &str, ip: &str| serde_json::json!({"containerPort": 80, "hostPort": port, "protocol": proto, "hostIP": ip});
        let held = ports(serde_json::json!([p(8080, "TCP", "10.0.0.1")]));
        let cases = [
            (p(8080, "TCP", "10.0.0.1"), false),
            (p(8080, "TCP", "0.0.0.0"), false),
            (p(8080, "TCP", ""), false),
            (p(8080, "TCP", "10.0.0.2"), true),
            (p(8080, "UDP", "10.0.0.1"), true),
            (p(8081, "TCP", "10.0.0.1"), true),
        ];
        for (want, free) in cases {
            let v = verdict(&ports(serde_json::json!([want.clone()])), &[&held], &n);
            assert_eq!(v.is_ok(), free, "{want}");
        }
        let all =
            ports(serde_json::json!([{"containerPort": 53, "hostPort": 53, "protocol": "UDP"}]));
        let specific = ports(serde_json::json!([p(53, "UDP", "10.0.0.9")]));
        let err = verdict(&specific, &[&all], &n).unwrap_err();
        assert_eq!(err.reason, "NodePorts");
        assert_eq!(
            err.message,
            "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
        );
        // A container port without a host port takes nothing.
        let plain = ports(serde_json::json!([{"containerPort": 8080}]));
        assert_eq!(verdict(&plain, &[&held], &n), Ok(()));
        // The default protocol is TCP.
        let tcp = ports(serde_json::json!([{"containerPort": 1, "hostPort": 8080}]));
        assert_eq!(reason(verdict(&tcp, &[&held], &n)), "NodePorts");
    }

    #[test]
    fn only_untolerated_no_execute_taints_should_refuse_and_not_static_pods() {
        let mut n = node();
        let taint = |key: &str, value: Option<&str>, effect: &str| Taint {
            key: key.to_string(),
            value: value.map(str::to_string),
            effect: effect.to_string(),
            time_added: None,
        };
        n.taints = vec![taint("dedicated", Some("infra"), "NoSchedule")];
        let plain = with_spec(serde_json::json!({}));
        assert_eq!(
            verdict(&plain, &[], &n),
            Ok(()),
            "NoSchedule is not checked"
        );
        n.taints
            .push(taint("maintenance", Some("yes"), "NoExecute"));
        let err = verdict(&plain, &[], &n).unwrap_err();
        assert_eq!(err.reason, "TaintToleration");
        assert_eq!(
            err.message,
            "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
        );
        let static_pod = Candidate {
            uid: "s",
            pod: &plain,
            is_static: true,
        };
        assert_eq!(admit(&static_pod, &[], &n), Ok(()));
        let tolerating = |t: serde_json::Value| with_spec(serde_json::json!({"tolerations": [t]}));
        let cases = [
            (
                serde_json::json!({"key": "maintenance", "operator": "Equal", "value": "yes", "effect": "NoExecute"}),
                true,
            ),
            (
                serde_json::json!({"key": "maintenance", "value": "yes"}),
                true,
            ),
            (
                serde_json::json!({"key": "maintenance", "operator": "Exists"}),
                true,
            ),
            (serde_json::json!({"operator": "Exists"}), true),
            (
                serde_json::json!({"key": "maintenance", "value": "no"}),
                false,
            ),
            (
                serde_json::json!({"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}),
                false,
            ),
            (
                serde_json::json!({"key": "other", "operator": "Exists"}),
                false,
            ),
        ];
        for (t, ok) in cases {
            assert_eq!(verdict(&tolerating(t.clone()), &[], &n).is_ok(), ok, "{t}");
        }
    }

    #[test]
    fn resources_should_be_reported_before_the_other_reasons() {
        let n = node();
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"nodeSelector": {"disk": "hdd"}, "containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]}
        }));
        assert_eq!(reason(verdict(&p, &[], &n)), "OutOfcpu");
    }

    #[test]
    fn pods_should_be_admitted_oldest_first() {
        let n = node();
        let at = |name: &str, cpu: &str, t: &str| {
            pod(serde_json::json!({
                "metadata": {"name": name, "namespace": "default", "creationTimestamp": t},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
            }))
        };
        let old = at("old", "1500m", "2024-01-01T00:00:00Z");
        let young = at("young", "1", "2024-01-01T00:00:05Z");
        let small = at("small", "500m", "2024-01-01T00:00:09Z");
        let running = with_requests("run", "500m", "1");
        // Given youngest first, the oldest still wins.
        let pending = vec![
            Candidate {
                uid: "y",
                pod: &young,
                is_static: false,
            },
            Candidate {
                uid: "s",
                pod: &small,
                is_static: false,
            },
            Candidate {
                uid: "o",
                pod: &old,
                is_static: false,
            },
        ];
        let mut admitted = vec![&running];
        let out = admit_in_order(pending, &mut admitted, &n);
        let got: Vec<(&str, String)> = out.into_iter().map(|(u, v)| (u, reason(v))).collect();
        assert_eq!(
            got,
            vec![
                ("o", String::new()),
                ("y", "OutOfcpu".to_string()),
                ("s", "OutOfcpu".to_string()),
            ]
        );
        assert_eq!(admitted.len(), 2);
    }
}
