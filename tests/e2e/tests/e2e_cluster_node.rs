//! `petrel agent --kubeconfig` as a node of a real cluster (issue 31): etcd,
//! kube-apiserver (Node authorizer, NodeRestriction), kube-scheduler and
//! kube-controller-manager from the peers, the agent with a node's own
//! credentials (`system:node:<name>`) over a Petrel runtime.
//!
//! The node registers and becomes Ready (its Lease renewed); a Deployment
//! of 3 replicas is scheduled onto it and runs, Running in the API;
//! `kubectl delete pod` stops the pod with its grace period and the API
//! object goes; an agent restart adopts the pods without restarting a
//! container; scaling to 0 leaves nothing in the runtime.
//!
//! Admission: pods bound to the node (`spec.nodeName`, no scheduler) that
//! ask for more cpu than it has, or for labels it lacks, end Failed with
//! kubelet's reasons in the API and never run; a pod that fits runs.
//!
//! A missing peer fails these tests unless `PETREL_PEERS_SKIP` leaves it
//! out (then they skip, saying so).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use petrel_testkit::agent::Agent;
use petrel_testkit::cluster::{self, Cluster};
use petrel_testkit::kubectl::Kubectl;
use petrel_testkit::kubelet;
use petrel_testkit::prelude::*;
use serde_json::Value;

fn skip() -> bool {
    if let Some(why) = cluster::left_out() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

/// A node name no other test picks (RFC 1123).
fn node_name(prefix: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).unwrap();
    format!("{prefix}-{}", hex::encode(b))
}

/// Polls `f` until it gives a value, or panics naming `what`.
async fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn condition(obj: &Value, kind: &str) -> Option<String> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

/// The Deployment `web`: `replicas` busybox pods that stop within a second.
fn deployment(replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: default}}\n\
         spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n\
         \x20   metadata: {{labels: {{app: web}}}}\n    spec:\n      automountServiceAccountToken: false\n\
         \x20     terminationGracePeriodSeconds: 2\n      containers:\n      - name: web\n\
         \x20       image: {BUSYBOX}\n        imagePullPolicy: Never\n\
         \x20       command: [sh, -c, 'trap \"exit 0\" TERM; echo up; while true; do sleep 1; done']\n"
    )
}

/// The pods of the Deployment, by name: (uid, phase, node, ready).
fn web_pods(kc: &Kubectl) -> BTreeMap<String, (String, String, String, bool)> {
    let Ok(list) = kc.get_json(&["pods", "-l", "app=web"]) else {
        return BTreeMap::new();
    };
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&p["metadata"]["name"]),
                (
                    s(&p["metadata"]["uid"]),
                    s(&p["status"]["phase"]),
                    s(&p["spec"]["nodeName"]),
                    condition(p, "Ready").as_deref() == Some("True"),
                ),
            )
        })
        .collect()
}

async fn wait_web_running(
    kc: &Kubectl,
    n: usize,
    node: &str,
) -> BTreeMap<String, (String, String, String, bool)> {
    wait_for(
        &format!("{n} pods of web Running and Ready on {node}"),
        Duration::from_secs(120),
        || {
            let pods = web_pods(kc);
            let ok = pods.len() == n
                && pods
                    .values()
                    .all(|(_, phase, on, ready)| phase == "Running" && on == node && *ready);
            ok.then_some(pods)
        },
    )
    .await
}

/// Containers of the runtime by pod UID label: (id, attempt, state).
async fn containers(node: &Node) -> Vec<(String, String, u32, i32)> {
    let mut c = node.clients().await;
    let list =
        c.rt.list_containers(petrel_cri::api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .containers;
    list.into_iter()
        .map(|x| {
            let uid = x
                .labels
                .get("io.kubernetes.pod.uid")
                .cloned()
                .unwrap_or_default();
            let attempt = x.metadata.as_ref().map_or(0, |m| m.attempt);
            (uid, x.id, attempt, x.state)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_petrel_node_should_join_run_a_deployment_and_let_its_pods_go() {
    if skip() {
        return;
    }
    let t0 = Instant::now();
    let cluster = std::thread::spawn(|| {
        let mut c = Cluster::start()?;
        c.start_controller_manager(&[
            "nodelifecycle",
            "deployment",
            "replicaset",
            "garbagecollector",
        ])?;
        c.start_scheduler()?;
        Ok::<_, petrel_testkit::KitError>(c)
    });
    let node = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let name = node_name("petrel");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let mut agent = Agent::in_cluster(&node, &creds, &[]);

    // Registration, Ready, the Lease.
    let n = wait_for(
        &format!("node {name} Ready"),
        Duration::from_secs(90),
        || {
            kc.get_json(&["node", &name])
                .ok()
                .filter(|n| condition(n, "Ready").as_deref() == Some("True"))
        },
    )
    .await;
    eprintln!("node Ready after {:?}", t0.elapsed());
    assert_eq!(n["metadata"]["labels"]["kubernetes.io/hostname"], name);
    assert_eq!(n["metadata"]["labels"]["kubernetes.io/os"], "linux");
    let addresses = n["status"]["addresses"].to_string();
    assert!(
        addresses.contains(&creds.node_ip.to_string()),
        "{addresses}"
    );
    for r in ["cpu", "memory", "pods", "ephemeral-storage"] {
        assert!(
            n["status"]["allocatable"][r].is_string(),
            "allocatable {r}: {n}"
        );
    }
    let runtime = n["status"]["nodeInfo"]["containerRuntimeVersion"]
        .as_str()
        .unwrap_or_default();
    assert!(runtime.starts_with("petrel://"), "{runtime}");
    let lease = kc
        .get_json(&["lease", "-n", "kube-node-lease", &name])
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], name);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);

    // A Deployment of 3 runs on the node.
    kc.apply(&deployment(3)).unwrap();
    let pods = wait_web_running(&kc, 3, &name).await;
    eprintln!("3 replicas Running after {:?}", t0.elapsed());
    let before = containers(&node).await;
    for (uid, ..) in pods.values() {
        assert_eq!(
            before.iter().filter(|c| &c.0 == uid).count(),
            1,
            "one container for pod {uid}: {before:?}"
        );
    }

    // kubectl delete: stopped, removed, gone from the API; replaced.
    let (victim, (victim_uid, ..)) = pods
        .iter()
        .next()
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap();
    let started = Instant::now();
    kc.run_with(
        &["delete", "pod", &victim, "--wait=true"],
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    let took = started.elapsed();
    assert!(
        kc.get_json(&["pod", &victim]).is_err(),
        "pod {victim} still in the API"
    );
    assert!(
        containers(&node).await.iter().all(|c| c.0 != victim_uid),
        "pod {victim}'s containers outlived its deletion"
    );
    eprintln!("pod deleted in {took:?}");
    let pods = wait_web_running(&kc, 3, &name).await;

    // An agent restart adopts every pod: no container restarted or made.
    let before = containers(&node).await;
    agent.terminate();
    agent.restart();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let again = wait_web_running(&kc, 3, &name).await;
    assert_eq!(
        again.keys().collect::<Vec<_>>(),
        pods.keys().collect::<Vec<_>>()
    );
    let after = containers(&node).await;
    assert_eq!(
        after, before,
        "the restart changed the runtime's containers"
    );

    // Scaled to 0: nothing left, in the API or in the runtime.
    kc.ok(&["scale", "deployment", "web", "--replicas=0"])
        .unwrap();
    wait_for("web scaled to 0", Duration::from_secs(60), || {
        let gone = kc
            .get_json(&["pods", "-l", "app=web"])
            .ok()
            .is_some_and(|l| l["items"].as_array().is_some_and(Vec::is_empty));
        gone.then_some(())
    })
    .await;
    let left: Vec<_> = containers(&node)
        .await
        .into_iter()
        .filter(|c| pods.values().any(|p| p.0 == c.0))
        .collect();
    assert!(left.is_empty(), "containers left: {left:?}");
    eprintln!("done after {:?}", t0.elapsed());
    drop(agent);
}

/// A busybox pod bound to `node` by `spec.nodeName`, asking for `cpu`,
/// with `extra` spec lines (indented two spaces).
fn bound_pod(name: &str, node: &str, cpu: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  nodeName: {node}\n  automountServiceAccountToken: false\n\
         \x20 terminationGracePeriodSeconds: 1\n{extra}  containers:\n  - name: main\n\
         \x20   image: {BUSYBOX}\n    imagePullPolicy: Never\n\
         \x20   command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']\n\
         \x20   resources: {{requests: {{cpu: \"{cpu}\"}}}}\n"
    )
}

/// (phase, reason, message, uid) of pod `name` in the API.
fn pod_verdict(kc: &Kubectl, name: &str) -> Option<(String, String, String, String)> {
    let p = kc.get_json(&["pod", name]).ok()?;
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Some((
        s(&p["status"]["phase"]),
        s(&p["status"]["reason"]),
        s(&p["status"]["message"]),
        s(&p["metadata"]["uid"]),
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_petrel_node_should_refuse_what_it_cannot_run() {
    if skip() {
        return;
    }
    let t0 = Instant::now();
    let cluster = std::thread::spawn(Cluster::start);
    let node = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let name = node_name("petrel-admit");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let agent = Agent::in_cluster(&node, &creds, &[]);
    let n = wait_for(
        &format!("node {name} Ready"),
        Duration::from_secs(90),
        || {
            kc.get_json(&["node", &name])
                .ok()
                .filter(|n| condition(n, "Ready").as_deref() == Some("True"))
        },
    )
    .await;
    eprintln!("node Ready after {:?}", t0.elapsed());
    let cpu = n["status"]["allocatable"]["cpu"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    // More cpu than the whole node has; labels the node lacks; and one
    // that fits (and selects the node by its hostname label).
    kc.apply(&bound_pod("greedy", &name, "1000", "")).unwrap();
    kc.apply(&bound_pod(
        "picky",
        &name,
        "10m",
        "  nodeSelector: {disktype: ssd}\n",
    ))
    .unwrap();
    kc.apply(&bound_pod(
        "modest",
        &name,
        "10m",
        &format!("  nodeSelector: {{kubernetes.io/hostname: {name}}}\n"),
    ))
    .unwrap();

    let greedy = wait_for("greedy Failed", Duration::from_secs(60), || {
        pod_verdict(&kc, "greedy").filter(|v| v.0 == "Failed")
    })
    .await;
    assert_eq!(greedy.1, "OutOfcpu", "{greedy:?}");
    assert!(
        greedy.2.starts_with(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000000, used: "
        ),
        "{greedy:?} (allocatable cpu {cpu})"
    );
    let picky = wait_for("picky Failed", Duration::from_secs(60), || {
        pod_verdict(&kc, "picky").filter(|v| v.0 == "Failed")
    })
    .await;
    assert_eq!(picky.1, "NodeAffinity", "{picky:?}");
    assert_eq!(
        picky.2,
        "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
    );
    let modest = wait_for("modest Running", Duration::from_secs(60), || {
        pod_verdict(&kc, "modest").filter(|v| v.0 == "Running")
    })
    .await;
    eprintln!("verdicts in the API after {:?}", t0.elapsed());

    // The refused never ran; they stay Failed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let uids: Vec<String> = containers(&node).await.into_iter().map(|c| c.0).collect();
    assert!(uids.contains(&modest.3), "{uids:?}");
    assert!(
        !uids.contains(&greedy.3) && !uids.contains(&picky.3),
        "a refused pod has containers: {uids:?}"
    );
    assert_eq!(
        pod_verdict(&kc, "greedy").map(|v| v.1),
        Some("OutOfcpu".into())
    );
    assert_eq!(
        pod_verdict(&kc, "picky").map(|v| v.1),
        Some("NodeAffinity".into())
    );
    eprintln!("done after {:?}", t0.elapsed());
    drop(agent);
}
