//! `petrel agent --kubeconfig` as a node of a real cluster (issue 31): etcd,
//! kube-apiserver (Node authorizer, NodeRestriction), kube-scheduler and
//! kube-controller-manager from the peers, the agent with a node's own
//! credentials (`system:node:<name>`) over a Petrel runtime.
//!
//! The node registers and becomes Ready (its Lease renewed); a static pod
//! shows as a mirror pod; a Deployment of 3 replicas is scheduled onto it
//! and runs, Running in the API; `kubectl logs/exec/port-forward` work
//! through the API server and the kubelet API refuses whoever the API
//! server does not authorize; `kubectl delete pod` stops the pod with its
//! grace period and the API object goes; an agent restart adopts the pods
//! without restarting a container; scaling to 0 leaves nothing in the
//! runtime.
//!
//! Outage: two minutes without an API server change nothing on the node,
//! and the Lease, the node's and pods' readiness resume after; a runtime restart under the agent
//! duplicates nothing. Side by side: a real kubelet node and a Petrel node
//! in one cluster, each running its own pod. TLS bootstrap: a node with only
//! a bootstrap token gets its client certificate through a CSR, keeps it
//! over a restart, renews it with its own credentials (one-minute
//! certificates) and goes on working after the first has expired.
//!
//! Admission: pods bound to the node (`spec.nodeName`, no scheduler) that
//! ask for more cpu than it has, or for labels it lacks, end Failed with
//! kubelet's reasons in the API and never run; a pod that fits runs;
//! labels and taints edited with kubectl reach admission of the next pods.
//!
//! A missing peer fails these tests unless `PETREL_PEERS_SKIP` leaves it
//! out (then they skip, saying so).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use petrel_testkit::agent::{Agent, MEMORY_HOG};
use petrel_testkit::cluster::{self, node_name, Cluster};
use petrel_testkit::kubectl::{Kubectl, PortForward};
use petrel_testkit::kubelet;
use petrel_testkit::prelude::*;
use petrel_testkit::wait::wait_for;
use serde_json::Value;

fn skip() -> bool {
    if let Some(why) = cluster::left_out() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

/// Waits until node `name` is Ready in the API; returns the Node.
async fn wait_node_ready(kc: &Kubectl, name: &str, within: Duration) -> Value {
    wait_for(&format!("node {name} Ready"), within, || {
        kc.get_json(&["node", name])
            .ok()
            .filter(|n| condition(n, "Ready").as_deref() == Some("True"))
    })
    .await
}

fn condition(obj: &Value, kind: &str) -> Option<String> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

/// The Deployment `web`: `replicas` busybox pods serving `pf-ok` on port
/// 8080, each stopping within a second.
fn deployment(replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: default}}\n\
         spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n\
         \x20   metadata: {{labels: {{app: web}}}}\n    spec:\n      automountServiceAccountToken: false\n\
         \x20     terminationGracePeriodSeconds: 2\n      containers:\n      - name: web\n\
         \x20       image: {BUSYBOX}\n        imagePullPolicy: Never\n\
         \x20       command: [sh, -c, 'trap \"exit 0\" TERM; echo up; mkdir -p /www; echo pf-ok > /www/index.html; httpd -f -p 8080 -h /www & wait']\n"
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

/// What a request to the kubelet API presents.
#[derive(Clone, Copy)]
enum Credential<'a> {
    Cert(&'a petrel_testkit::certs::Issued),
    Token(&'a str),
    None,
}

/// The HTTP status of GET `base``path` with `cred` (curl).
fn curl_status(base: &str, path: &str, ca: &std::path::Path, cred: Credential<'_>) -> String {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "20",
        "--cacert",
    ])
    .arg(ca);
    match cred {
        Credential::Cert(c) => {
            cmd.arg("--cert").arg(&c.cert).arg("--key").arg(&c.key);
        }
        Credential::Token(t) => {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        Credential::None => {}
    }
    let out = cmd.arg(format!("{base}{path}")).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    let n = wait_node_ready(&kc, &name, Duration::from_secs(90)).await;
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

    // A static pod beside them, named <name>-<node> as kubelet names it,
    // shows in the API as a mirror pod with its status; a deleted mirror
    // comes back; the manifest removed, the mirror goes.
    agent.write_manifest(
        "static.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: static, namespace: default}}\n\
             spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n\
             \x20   image: {BUSYBOX}\n    imagePullPolicy: Never\n\
             \x20   command: [sh, -c, 'trap \"exit 0\" TERM; echo static up; while true; do sleep 1; done']\n"
        ),
    );
    let mirror_name = format!("static-{name}");
    let running_mirror = |kc: &Kubectl| {
        kc.get_json(&["pod", &mirror_name]).ok().filter(|p| {
            p["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string()
                && p["status"]["phase"] == "Running"
                && p["metadata"]["deletionTimestamp"].is_null()
        })
    };
    let m = wait_for(
        "the static pod's mirror Running",
        Duration::from_secs(60),
        || running_mirror(&kc),
    )
    .await;
    assert_eq!(m["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(kc.ok(&["logs", &mirror_name]).unwrap(), "static up\n");
    let first_uid = m["metadata"]["uid"].as_str().unwrap().to_string();
    kc.ok(&["delete", "pod", &mirror_name, "--wait=false"])
        .unwrap();
    wait_for("the mirror made again", Duration::from_secs(60), || {
        running_mirror(&kc).filter(|p| p["metadata"]["uid"] != first_uid.as_str())
    })
    .await;
    agent.remove_manifest("static.yaml");
    wait_for(
        "the mirror gone with its static pod",
        Duration::from_secs(60),
        || kc.get_json(&["pod", &mirror_name]).is_err().then_some(()),
    )
    .await;
    eprintln!("mirror pod done after {:?}", t0.elapsed());

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

    // logs, exec (with stdin), port-forward: API server -> the agent's
    // kubelet API (TLS, the API server's client certificate) -> runtime.
    let some = pods.keys().next().unwrap().clone();
    let logs = kc.ok(&["logs", &some]).unwrap();
    assert_eq!(logs, "up\n");
    let out = kc
        .ok(&["exec", &some, "--", "sh", "-c", "echo exec-$((6*7))"])
        .unwrap();
    assert_eq!(out, "exec-42\n");
    let out = kc
        .ok_with(
            &["exec", "-i", &some, "--", "cat"],
            Some(b"through stdin\n"),
        )
        .unwrap();
    assert_eq!(out, "through stdin\n");
    // `exec -it` from a terminal: the container's side is a TTY too.
    let out = kc
        .in_terminal(
            &[
                "exec",
                "-it",
                &some,
                "--",
                "sh",
                "-c",
                "test -t 0 && test -t 1 && echo tty-$((6*7)); tty",
            ],
            Duration::from_secs(60),
        )
        .unwrap();
    assert!(
        out.contains("tty-42\r\n") && out.contains("/dev/pts/"),
        "{out:?}"
    );
    {
        let (_pf, local) = PortForward::start(&kc, &some, 8080).unwrap();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], local));
        let r = petrel_testkit::http::get(addr, "/", Duration::from_secs(20)).unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "pf-ok\n"));
    }
    eprintln!("logs, exec, port-forward done after {:?}", t0.elapsed());

    // What `kubectl top` reads, through the API server's node proxy: the
    // summary and the resource metrics, with this pod's container in them.
    let proxy = format!("/api/v1/nodes/{name}/proxy");
    let summary = wait_for("the pod in /stats/summary", Duration::from_secs(30), || {
        let s: Value = serde_json::from_str(
            &kc.ok(&["get", "--raw", &format!("{proxy}/stats/summary")])
                .ok()?,
        )
        .ok()?;
        let listed = s["pods"]
            .as_array()?
            .iter()
            .any(|p| p["podRef"]["name"] == some.as_str());
        listed.then_some(s)
    })
    .await;
    assert_eq!(summary["node"]["nodeName"], name);
    let metrics = kc
        .ok(&["get", "--raw", &format!("{proxy}/metrics/resource")])
        .unwrap();
    let sample = format!("container_cpu_usage_seconds_total{{container=\"web\",namespace=\"default\",pod=\"{some}\"}}");
    assert!(
        metrics.contains(&sample),
        "{sample} missing from:\n{metrics}"
    );
    assert!(metrics.contains("resource_scrape_error 0"), "{metrics}");

    // The kubelet API asks the API server who may do what: another node's
    // certificate, a service account's token without rights, or no
    // credentials at all get nothing; an admin gets the pods.
    let base = format!("https://{}:{}", creds.node_ip, agent.port);
    let other = cluster
        .node_credentials(&node_name("other"), creds.node_ip)
        .unwrap();
    let admin = cluster.admin_client();
    let exec = format!("/exec/default/{some}/web?command=id&output=1");
    let token = kc.ok(&["create", "token", "default"]).unwrap();
    let cases: [(&str, &str, Credential<'_>, &str); 6] = [
        (
            "another node's certificate",
            "/pods",
            Credential::Cert(&other.client),
            "403",
        ),
        (
            "another node's certificate",
            &exec,
            Credential::Cert(&other.client),
            "403",
        ),
        (
            "another node's certificate",
            "/stats/summary",
            Credential::Cert(&other.client),
            "403",
        ),
        (
            "a token without rights",
            "/pods",
            Credential::Token(token.trim()),
            "403",
        ),
        ("no credentials", "/pods", Credential::None, "401"),
        (
            "an admin's certificate",
            "/pods",
            Credential::Cert(admin),
            "200",
        ),
    ];
    for (who, path, cred, want) in cases {
        let got = curl_status(&base, path, cluster.ca_cert(), cred);
        assert_eq!(got, want, "{who} asking {path}");
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

    // kubectl drain: the node is cordoned and its pods evicted through the
    // eviction API (each stopped with its grace period, then deleted); the
    // replacements wait for a schedulable node, and run once uncordoned.
    let drained: Vec<String> = again.values().map(|p| p.0.clone()).collect();
    kc.run_with(
        &["drain", &name, "--ignore-daemonsets", "--timeout=60s"],
        None,
        Duration::from_secs(90),
    )
    .unwrap();
    let n = kc.get_json(&["node", &name]).unwrap();
    assert_eq!(n["spec"]["unschedulable"], true);
    let left: Vec<_> = containers(&node)
        .await
        .into_iter()
        .filter(|c| drained.contains(&c.0))
        .collect();
    assert!(left.is_empty(), "drained pods' containers left: {left:?}");
    assert!(
        web_pods(&kc).values().all(|p| p.1 == "Pending"),
        "{:?}",
        web_pods(&kc)
    );
    kc.ok(&["uncordon", &name]).unwrap();
    let pods = wait_web_running(&kc, 3, &name).await;
    eprintln!("drain and uncordon done after {:?}", t0.elapsed());

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
         \x20   command: [sh, -c, 'trap \"exit 0\" TERM; echo up; while true; do sleep 1; done']\n\
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
    let n = wait_node_ready(&kc, &name, Duration::from_secs(90)).await;
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

    // Labels and taints edited in the API reach admission, as in kubelet:
    // the label picky lacked lets the next such pod in; a NoExecute taint
    // keeps out a pod that does not tolerate it.
    kc.ok(&["label", "node", &name, "disktype=ssd"]).unwrap();
    kc.ok(&[
        "taint",
        "node",
        &name,
        "petrel.test/quarantine=yes:NoExecute",
    ])
    .unwrap();
    // The node's informer hears of both before the next pods come.
    tokio::time::sleep(Duration::from_secs(2)).await;
    kc.apply(&bound_pod(
        "picky-again",
        &name,
        "10m",
        "  nodeSelector: {disktype: ssd}\n  tolerations: [{key: petrel.test/quarantine, operator: Exists}]\n",
    ))
    .unwrap();
    kc.apply(&bound_pod("intolerant", &name, "10m", ""))
        .unwrap();
    wait_for("picky-again Running", Duration::from_secs(60), || {
        pod_verdict(&kc, "picky-again").filter(|v| v.0 == "Running")
    })
    .await;
    let intolerant = wait_for("intolerant Failed", Duration::from_secs(60), || {
        pod_verdict(&kc, "intolerant").filter(|v| v.0 == "Failed")
    })
    .await;
    assert_eq!(intolerant.1, "TaintToleration", "{intolerant:?}");
    kc.ok(&["taint", "node", &name, "petrel.test/quarantine-"])
        .unwrap();
    eprintln!(
        "labels and taints from the API heeded after {:?}",
        t0.elapsed()
    );

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

    // A pod it cannot run for other reasons says why in its status: an
    // image that is not there with pull policy Never waits with kubelet's
    // ErrImageNeverPull; a volume type the node does not provide.
    let missing =
        bound_pod("no-image", &name, "10m", "").replace(BUSYBOX, "docker.io/petrel/not-here:1");
    kc.apply(&missing).unwrap();
    let waiting = wait_for(
        "no-image waiting with a reason",
        Duration::from_secs(60),
        || {
            let p = kc.get_json(&["pod", "no-image"]).ok()?;
            let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
            w["reason"].is_string().then(|| w.clone())
        },
    )
    .await;
    assert_eq!(waiting["reason"], "ErrImageNeverPull", "{waiting}");
    assert!(
        waiting["message"]
            .as_str()
            .unwrap()
            .contains("docker.io/petrel/not-here:1"),
        "{waiting}"
    );
    kc.apply(&bound_pod(
        "odd-volume",
        &name,
        "10m",
        "  volumes: [{name: v, gitRepo: {repository: https://git.invalid/x}}]\n",
    ))
    .unwrap();
    // (gitRepo volumes are disabled in kubelet since 1.33: the pod waits,
    // saying why, with kubelet's reason, and never runs.)
    let odd = wait_for("odd-volume with a reason", Duration::from_secs(60), || {
        let p = kc.get_json(&["pod", "odd-volume"]).ok()?;
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            .is_string()
            .then_some(p)
    })
    .await;
    assert_eq!(odd["status"]["phase"], "Pending", "{}", odd["status"]);
    let waiting = &odd["status"]["containerStatuses"][0]["state"]["waiting"];
    assert_eq!(waiting["reason"], "CreateContainerConfigError", "{waiting}");
    assert!(
        waiting["message"].as_str().unwrap().contains("gitRepo"),
        "{waiting}"
    );
    assert_eq!(condition(&odd, "Ready").as_deref(), Some("False"));
    eprintln!("done after {:?}", t0.elapsed());
    drop(agent);
}

async fn wait_pod_running(kc: &Kubectl, pod: &str) -> Value {
    wait_for(
        &format!("pod {pod} Running"),
        Duration::from_secs(90),
        || {
            kc.get_json(&["pod", pod])
                .ok()
                .filter(|p| p["status"]["phase"] == "Running")
        },
    )
    .await
}

fn renew_time(kc: &Kubectl, node: &str) -> Option<Timestamp> {
    kc.get_json(&["lease", "-n", "kube-node-lease", node])
        .ok()
        .and_then(|l| l["spec"]["renewTime"].as_str()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_petrel_node_should_ride_out_an_api_server_outage_and_a_runtime_restart() {
    if skip() {
        return;
    }
    let t0 = Instant::now();
    // The node lifecycle controller judges the node by its Lease, as in a
    // real cluster: after the outage it must see the node Ready again.
    let cluster = std::thread::spawn(|| {
        let mut c = Cluster::start()?;
        c.start_controller_manager(&["nodelifecycle"])?;
        Ok::<_, petrel_testkit::KitError>(c)
    });
    let mut node = Node::start_with_busybox().await;
    let mut cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let name = node_name("outage");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let agent = Agent::in_cluster(&node, &creds, &[]);
    kc.apply(&bound_pod("a", &name, "10m", "")).unwrap();
    wait_pod_running(&kc, "a").await;
    let before = containers(&node).await;

    // The API server is gone for two minutes (longer than the Lease's
    // 40 s): the pod keeps running, the agent keeps serving; afterwards
    // the Lease is renewed within the retry backoff's bound, the node and
    // the pod are Ready again (whatever the node lifecycle controller
    // marked meanwhile) and a new pod runs.
    let down = Instant::now();
    cluster
        .restart_apiserver_after(Duration::from_secs(120))
        .unwrap();
    eprintln!("API server back after {:?}", down.elapsed());
    let back = Timestamp::now();
    let returned = Instant::now();
    assert_eq!(
        containers(&node).await,
        before,
        "the outage changed the containers"
    );
    assert!(agent.get("/healthz").is_some_and(|(code, _)| code == 200));
    wait_for(
        "the Lease renewed after the outage",
        Duration::from_secs(30),
        || renew_time(&kc, &name).filter(|t| *t > back).map(drop),
    )
    .await;
    eprintln!(
        "Lease renewed {:?} after the API server's return",
        returned.elapsed()
    );
    wait_node_ready(&kc, &name, Duration::from_secs(90)).await;
    wait_for("pod a Ready again", Duration::from_secs(60), || {
        let p = kc.get_json(&["pod", "a"]).ok()?;
        (condition(&p, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;
    kc.apply(&bound_pod("b", &name, "10m", "")).unwrap();
    wait_pod_running(&kc, "b").await;
    eprintln!("outage ridden out after {:?}", t0.elapsed());

    // The runtime restarts under the agent: nothing is duplicated, both
    // pods stay Running, a deletion still goes through.
    let before = containers(&node).await;
    node.terminate();
    node.restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_pod_running(&kc, "a").await;
    wait_pod_running(&kc, "b").await;
    assert_eq!(
        containers(&node).await,
        before,
        "the runtime restart changed the containers"
    );
    kc.run_with(
        &["delete", "pod", "a", "--wait=true"],
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    assert!(kc.get_json(&["pod", "a"]).is_err());
    eprintln!("runtime restart done after {:?}", t0.elapsed());

    // Past the node lifecycle controller's grace period (50 s) after the
    // outage, whatever it marked, the node and its pod are Ready.
    wait_for(
        "node and pod b Ready a minute after the outage",
        Duration::from_secs(150),
        || {
            let n = kc.get_json(&["node", &name]).ok()?;
            let p = kc.get_json(&["pod", "b"]).ok()?;
            (returned.elapsed() > Duration::from_secs(60)
                && condition(&n, "Ready").as_deref() == Some("True")
                && condition(&p, "Ready").as_deref() == Some("True"))
            .then_some(())
        },
    )
    .await;
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_petrel_node_and_a_kubelet_node_should_serve_one_cluster_side_by_side() {
    if skip() || kubelet::left_out().is_some() {
        eprintln!("skipped: {:?}", kubelet::left_out());
        return;
    }
    let cluster = std::thread::spawn(|| {
        let mut c = Cluster::start()?;
        c.start_controller_manager(&["nodelifecycle"])?;
        Ok::<_, petrel_testkit::KitError>(c)
    });
    let petrel_rt = Node::start_with_busybox().await;
    let kubelet_rt = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let ip = kubelet::node_ip().unwrap();
    let (pn, kn) = (node_name("petrel"), node_name("kubelet"));
    let agent = Agent::in_cluster(&petrel_rt, &cluster.node_credentials(&pn, ip).unwrap(), &[]);
    let _k = kubelet::Kubelet::start(kubelet::KubeletOptions::joined(
        cluster.node_credentials(&kn, ip).unwrap(),
        &format!("unix://{}", kubelet_rt.socket.display()),
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    for n in [&pn, &kn] {
        wait_node_ready(&kc, n, Duration::from_secs(120)).await;
    }
    kc.apply(&bound_pod("on-petrel", &pn, "10m", "")).unwrap();
    kc.apply(&bound_pod("on-kubelet", &kn, "10m", "")).unwrap();
    for p in ["on-petrel", "on-kubelet"] {
        let pod = wait_pod_running(&kc, p).await;
        assert_eq!(kc.ok(&["logs", p]).unwrap(), "up\n", "{pod}");
    }
    // Each node ran only its own pod.
    let petrel_uid = kc
        .ok(&["get", "pod", "on-petrel", "-o", "jsonpath={.metadata.uid}"])
        .unwrap();
    let kubelet_uid = kc
        .ok(&["get", "pod", "on-kubelet", "-o", "jsonpath={.metadata.uid}"])
        .unwrap();
    let pc = containers(&petrel_rt).await;
    let kcs = containers(&kubelet_rt).await;
    assert!(
        pc.iter().any(|c| c.0 == petrel_uid) && pc.iter().all(|c| c.0 != kubelet_uid),
        "{pc:?}"
    );
    assert!(
        kcs.iter().any(|c| c.0 == kubelet_uid) && kcs.iter().all(|c| c.0 != petrel_uid),
        "{kcs:?}"
    );
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_petrel_node_should_join_by_tls_bootstrap() {
    if skip() {
        return;
    }
    let cluster = std::thread::spawn(|| {
        let mut c = Cluster::start()?;
        // Certificates live a minute, so the node must renew its own.
        c.start_controller_manager_with(
            &["csrapproving", "csrsigning", "nodelifecycle"],
            &["--cluster-signing-duration=1m"],
        )?;
        Ok::<_, petrel_testkit::KitError>(c)
    });
    let node = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let boot = cluster.bootstrap_kubeconfig().unwrap();
    let name = node_name("boot");
    // The node's serving certificate comes from the kit; its client
    // certificate and kubeconfig from TLS bootstrap.
    let mut creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    creds.kubeconfig = dir.path().join("kubelet.kubeconfig");
    let cert_dir = dir.path().join("pki");
    let boot_flag = boot.display().to_string();
    let cert_flag = cert_dir.display().to_string();
    let mut agent = Agent::in_cluster(
        &node,
        &creds,
        &[
            "--bootstrap-kubeconfig",
            &boot_flag,
            "--cert-dir",
            &cert_flag,
        ],
    );
    wait_node_ready(&kc, &name, Duration::from_secs(90)).await;

    // One request by the bootstrap token, approved and signed. (The
    // signer backdates a certificate by 5 minutes, so one of a minute is
    // past its renewal point at once: the node renews it right away, by
    // its own requests, seen below.)
    let bootstrap_requests = || {
        let csrs = kc.get_json(&["csr"]).unwrap();
        csrs["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| {
                c["spec"]["username"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("system:bootstrap:"))
            })
            .cloned()
            .collect::<Vec<Value>>()
    };
    let csrs = bootstrap_requests();
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    let csr = &csrs[0];
    assert_eq!(
        csr["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert!(csr["status"]["certificate"].is_string());
    // Written privately, naming the node.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&creds.kubeconfig), 0o600);
    assert_eq!(mode(&cert_dir), 0o700);
    let current = cert_dir.join("kubelet-client-current.pem");
    assert_eq!(mode(&current), 0o600);
    let subject = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(&current)
        .output()
        .unwrap();
    let subject = String::from_utf8_lossy(&subject.stdout).into_owned();
    assert!(
        subject.contains(&format!("CN = system:node:{name}")),
        "{subject}"
    );
    assert!(subject.contains("O = system:nodes"), "{subject}");

    // The node's own credentials run its pods.
    kc.apply(&bound_pod("booted", &name, "10m", "")).unwrap();
    wait_pod_running(&kc, "booted").await;

    let dates = |p: &std::path::Path| {
        let o = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-dates", "-in"])
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // The bootstrap's certificate: the first file written.
    let mut files: Vec<_> = std::fs::read_dir(&cert_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("kubelet-client-2")
        })
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    let first = dates(&files[0]);
    eprintln!("first certificate: {first}");

    // Before it expires, the node renews it with its own credentials (a
    // request by system:node:<name>, approved as a renewal), and goes on
    // working once the first has expired.
    let renewed_by_node = || {
        kc.get_json(&["csr"]).ok().and_then(|l| {
            l["items"]
                .as_array()?
                .iter()
                .find(|c| {
                    c["spec"]["username"] == format!("system:node:{name}").as_str()
                        && c["status"]["certificate"].is_string()
                })
                .cloned()
        })
    };
    wait_for(
        "the node's renewal",
        Duration::from_secs(90),
        renewed_by_node,
    )
    .await;
    let second = dates(&current);
    eprintln!("current certificate: {second}");

    // Restarted, it goes on with its current certificate: no bootstrap.
    agent.terminate();
    agent.restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_pod_running(&kc, "booted").await;
    assert_eq!(
        bootstrap_requests().len(),
        1,
        "a restart bootstrapped again"
    );
    let not_after = first
        .lines()
        .find_map(|l| l.strip_prefix("notAfter="))
        .unwrap();
    let first_end: Timestamp = k8s_openapi::jiff::fmt::strtime::parse(
        "%b %d %H:%M:%S %Y %z",
        not_after
            .trim()
            .replace("  ", " ")
            .replace(" GMT", " +0000"),
    )
    .unwrap()
    .to_timestamp()
    .unwrap();
    let wait = (first_end.as_second() - Timestamp::now().as_second()).max(0) as u64 + 2;
    tokio::time::sleep(Duration::from_secs(wait)).await;
    kc.apply(&bound_pod("after-rotation", &name, "10m", ""))
        .unwrap();
    wait_pod_running(&kc, "after-rotation").await;
    let after = Timestamp::now();
    wait_for(
        "the Lease renewed with the new certificate",
        Duration::from_secs(30),
        || renew_time(&kc, &name).filter(|t| *t > after).map(drop),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_petrel_node_without_a_serving_certificate_should_make_its_own() {
    if skip() {
        return;
    }
    let cluster = std::thread::spawn(Cluster::start);
    let node = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    let name = node_name("selfsigned");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let agent = Agent::in_cluster_serving_itself(&node, &creds, &[]);
    wait_node_ready(&kc, &name, Duration::from_secs(90)).await;
    // Its port serves TLS with a certificate it made (0600 in <root>/pki),
    // and still asks the API server who may do what.
    let cert = agent.root.join("pki/kubelet.crt");
    use std::os::unix::fs::PermissionsExt;
    let key_mode = std::fs::metadata(agent.root.join("pki/kubelet.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(key_mode & 0o777, 0o600);
    // It had no manifest directory either: it made an empty, private one.
    let manifests_mode = std::fs::metadata(&agent.manifests)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(manifests_mode & 0o777, 0o700);
    // Without --client-ca-file, as kubelet, only bearer tokens authenticate:
    // a service account bound to system:kubelet-api-admin gets the pods,
    // one without rights is refused, certificates count for nothing.
    for sa in ["default", "reader"] {
        kc.ok(&["create", "serviceaccount", sa]).unwrap();
    }
    kc.ok(&[
        "create",
        "clusterrolebinding",
        &format!("reader-{name}"),
        "--clusterrole=system:kubelet-api-admin",
        "--serviceaccount=default:reader",
    ])
    .unwrap();
    let reader = kc.ok(&["create", "token", "reader"]).unwrap();
    let nobody = kc.ok(&["create", "token", "default"]).unwrap();
    let base = format!("https://{}:{}", agent.listen_ip, agent.port);
    let status = |cred| curl_status(&base, "/pods", &cert, cred);
    assert_eq!(status(Credential::Token(reader.trim())), "200");
    assert_eq!(status(Credential::Token(nobody.trim())), "403");
    assert_eq!(status(Credential::None), "401");
    assert_eq!(status(Credential::Cert(cluster.admin_client())), "401");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_should_follow_and_show_the_previous_attempt_on_a_petrel_node() {
    if skip() {
        return;
    }
    let cluster = std::thread::spawn(Cluster::start);
    let node = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let name = node_name("logs");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let _agent = Agent::in_cluster(&node, &creds, &[]);
    // A container that counts once a second, and one that says which
    // attempt it is and exits.
    let pod = bound_pod("talker", &name, "10m", "").replace(
        "'trap \"exit 0\" TERM; echo up; while true; do sleep 1; done'",
        "'trap \"exit 0\" TERM; i=0; while true; do echo tick-$i; i=$((i+1)); sleep 1; done'",
    );
    kc.apply(&pod).unwrap();
    let crasher = bound_pod("crasher", &name, "10m", "").replace(
        "'trap \"exit 0\" TERM; echo up; while true; do sleep 1; done'",
        "'echo attempt-$(cat /proc/sys/kernel/random/uuid); sleep 1; exit 3'",
    );
    kc.apply(&crasher).unwrap();
    wait_pod_running(&kc, "talker").await;

    // logs -f: lines as they come, through the API server.
    let mut follow = kc
        .command(&["logs", "-f", "talker"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = follow.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    // A line written after the follow began arrives too.
    let later = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(
        first.starts_with("tick-") && later.starts_with("tick-"),
        "{first} {later}"
    );
    assert_ne!(first, later);

    // attach: to a container reading its stdin (closed when the session
    // ends: stdinOnce), through the API server.
    let echo = bound_pod("echoer", &name, "10m", "")
        .replace(
            "'trap \"exit 0\" TERM; echo up; while true; do sleep 1; done'",
            "'while read line; do echo got-$line; done'",
        )
        .replace(
            "    imagePullPolicy: Never\n",
            "    imagePullPolicy: Never\n    stdin: true\n    stdinOnce: true\n",
        );
    assert!(
        echo.contains("stdinOnce: true") && echo.contains("while read"),
        "{echo}"
    );
    kc.apply(&echo).unwrap();
    wait_pod_running(&kc, "echoer").await;
    let out = kc
        .run_with(
            &["attach", "-i", "echoer", "-c", "main"],
            Some(b"one\ntwo\n"),
            Duration::from_secs(30),
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("got-one") && text.contains("got-two"),
        "{out:?}"
    );

    // --previous: the attempt before the running (or latest) one.
    wait_for("crasher restarted twice", Duration::from_secs(90), || {
        let p = kc.get_json(&["pod", "crasher"]).ok()?;
        let n = p["status"]["containerStatuses"][0]["restartCount"].as_u64()?;
        (n >= 2).then_some(())
    })
    .await;
    let previous = kc.ok(&["logs", "--previous", "crasher"]).unwrap();
    let current = kc.ok(&["logs", "crasher"]).unwrap();
    assert!(previous.starts_with("attempt-"), "{previous:?}");
    assert!(current.starts_with("attempt-"), "{current:?}");
    assert_ne!(previous, current, "--previous showed the latest attempt");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_evicted_under_node_pressure_should_be_failed_evicted_in_the_api() {
    if skip() {
        return;
    }
    let cluster = std::thread::spawn(Cluster::start);
    let node = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    // The node is a 256 MiB memory cgroup under the test's cgroup parent.
    let cgroup = format!("{}/node", node.cgroup_parent);
    let dir = Node::cgroup_dir("memory", &cgroup);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("memory.limit_in_bytes"),
        (256u64 << 20).to_string(),
    )
    .unwrap();
    let name = node_name("pressure");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let _agent = Agent::in_cluster(
        &node,
        &creds,
        &[
            "--node-cgroup",
            &cgroup,
            "--eviction-hard",
            "memory.available<64Mi",
            "--eviction-pressure-transition-period",
            "3s",
        ],
    );
    wait_node_ready(&kc, &name, Duration::from_secs(90)).await;
    let hog = bound_pod("hog", &name, "10m", "").replace(
        "'trap \"exit 0\" TERM; echo up; while true; do sleep 1; done'",
        &format!("{MEMORY_HOG:?}"),
    );
    kc.apply(&hog).unwrap();
    // The eviction shows in the API as kubelet shows it, and on the Node.
    let evicted = wait_for("hog Failed, Evicted", Duration::from_secs(90), || {
        kc.get_json(&["pod", "hog"])
            .ok()
            .filter(|p| p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Evicted")
    })
    .await;
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("memory.available"), "{message}");
    let disruption = evicted["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .cloned()
        .unwrap_or_else(|| panic!("no DisruptionTarget: {}", evicted["status"]));
    assert_eq!(disruption["reason"], "TerminationByKubelet");
    let uid = evicted["metadata"]["uid"].as_str().unwrap().to_string();
    let start = Instant::now();
    loop {
        let running = containers(&node)
            .await
            .into_iter()
            .any(|c| c.0 == uid && c.3 == petrel_cri::api::ContainerState::ContainerRunning as i32);
        if !running {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the hog still runs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
