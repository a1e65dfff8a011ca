//! What pods of a Petrel node read from the API (issue 32): configMap,
//! secret and projected volumes (a ClusterTrustBundle's too), the default service-account token volume,
//! environment from ConfigMaps and Secrets — against a real kube-apiserver
//! (Node authorizer, NodeRestriction) and kube-controller-manager's
//! `root-ca-cert-publisher`, the agent with a node's own credentials over
//! a Petrel runtime.
//!
//! A pod gets its files and variables; secrets and the token sit on tmpfs;
//! the pod reads its own Pod object with its token; a ConfigMap change
//! reaches the mounted file within seconds while a subPath copy stays as
//! it was, and a label added to the pod reaches its downwardAPI file; a
//! pod whose ConfigMap does not exist yet waits with kubelet's
//! words and starts once it is created; a missing key is
//! CreateContainerConfigError; a deleted pod leaves no mount behind, and
//! the watch of the object only it read ends.
//!
//! A missing peer fails these tests unless `PETREL_PEERS_SKIP` leaves it
//! out (then they skip, saying so).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_testkit::agent::Agent;
use petrel_testkit::cluster::{self, node_name, Cluster};
use petrel_testkit::kubectl::Kubectl;
use petrel_testkit::kubelet;
use petrel_testkit::prelude::*;
use petrel_testkit::wait::wait_for;
use serde_json::Value;

fn exec(kc: &Kubectl, pod: &str, script: &str) -> String {
    kc.ok(&["exec", pod, "--", "sh", "-c", script])
        .unwrap_or_else(|e| panic!("exec {script:?} in {pod}: {e}"))
}

fn phase(kc: &Kubectl, pod: &str) -> Option<Value> {
    kc.get_json(&["pod", pod]).ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_of_a_petrel_node_should_read_config_maps_secrets_and_tokens() {
    if let Some(why) = cluster::left_out() {
        eprintln!("skipped: {why}");
        return;
    }
    let t0 = Instant::now();
    let cluster = std::thread::spawn(|| {
        let mut c = Cluster::start()?;
        c.start_controller_manager(&["root-ca-cert-publisher"])?;
        Ok::<_, petrel_testkit::KitError>(c)
    });
    let node = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    let name = node_name("petrel-objects");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let agent = Agent::in_cluster(&node, &creds, &[]);
    let api = cluster.server().to_string();
    let kubectl = petrel_testkit::peers::peer_binary("kubectl").unwrap();
    let kubectl = kubectl.display();
    // The cluster's CA as a ClusterTrustBundle (GA in 1.37).
    let ca = std::fs::read_to_string(cluster.ca_cert()).unwrap();
    let anchors: String = ca.lines().map(|l| format!("    {l}\n")).collect();
    let anchors = anchors.trim_end();
    kc.apply(&format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: default, namespace: default}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: cfg, namespace: default}}
data: {{app.conf: v1, mode: fast}}
---
apiVersion: v1
kind: Secret
metadata: {{name: creds, namespace: default}}
stringData: {{user: admin, pass: s3cret}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: pod-reader, namespace: default}}
rules: [{{apiGroups: [""], resources: [pods], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: pod-reader, namespace: default}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}}
subjects: [{{kind: ServiceAccount, name: default, namespace: default}}]
---
apiVersion: certificates.k8s.io/v1
kind: ClusterTrustBundle
metadata: {{name: petrel-anchors}}
spec:
  trustBundle: |
{anchors}
---
apiVersion: v1
kind: Pod
metadata: {{name: reader, namespace: default}}
spec:
  nodeName: {name}
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  securityContext: {{fsGroup: 2345}}
  volumes:
  - {{name: cfg, configMap: {{name: cfg}}}}
  - {{name: sec, secret: {{secretName: creds, defaultMode: 0400}}}}
  - {{name: kubectl, hostPath: {{path: "{kubectl}", type: File}}}}
  - {{name: info, downwardAPI: {{items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]}}}}
  - {{name: anchors, projected: {{sources: [{{clusterTrustBundle: {{name: petrel-anchors, path: ca.pem}}}}]}}}}
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
    env:
    - {{name: API, value: "{api}"}}
    - {{name: USER_NAME, valueFrom: {{secretKeyRef: {{name: creds, key: user}}}}}}
    envFrom: [{{configMapRef: {{name: cfg}}, prefix: CFG_}}]
    volumeMounts:
    - {{name: cfg, mountPath: /cfg}}
    - {{name: sec, mountPath: /sec}}
    - {{name: cfg, mountPath: /sub/app.conf, subPath: app.conf}}
    - {{name: kubectl, mountPath: /kubectl, readOnly: true}}
    - {{name: info, mountPath: /info}}
    - {{name: anchors, mountPath: /anchors}}
"#
    ))
    .unwrap();
    let pod = wait_for("reader Running", Duration::from_secs(60), || {
        phase(&kc, "reader").filter(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    eprintln!("reader Running after {:?}", t0.elapsed());

    // Files and variables.
    assert_eq!(exec(&kc, "reader", "cat /cfg/app.conf /cfg/mode"), "v1fast");
    assert_eq!(exec(&kc, "reader", "cat /sec/user"), "admin");
    // defaultMode 0400, and the fsGroup's read bit, its group.
    assert_eq!(
        exec(&kc, "reader", "stat -L -c '%a %g' /sec/pass"),
        "440 2345\n"
    );
    // (The container's own environment: a shell drops names with dots.)
    let env = exec(&kc, "reader", "tr '\\0' '\\n' < /proc/1/environ");
    for want in ["USER_NAME=admin", "CFG_app.conf=v1", "CFG_mode=fast"] {
        assert!(env.lines().any(|l| l == want), "{want} not in {env}");
    }
    // Secrets and the token never reach a disk; everything is read-only.
    let mounts = exec(&kc, "reader", "cat /proc/mounts");
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    for (path, fs) in [("/sec", "tmpfs"), (sa, "tmpfs")] {
        let line = mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(path))
            .unwrap_or_else(|| panic!("{path} not mounted: {mounts}"));
        assert_eq!(line.split(' ').nth(2), Some(fs), "{line}");
        assert!(line.split(' ').nth(3).unwrap().starts_with("ro"), "{line}");
    }
    // The default token volume: token, ca.crt, namespace; the pod reads
    // its own Pod object with the token.
    assert_eq!(
        exec(&kc, "reader", &format!("cat {sa}/namespace")),
        "default"
    );
    assert!(exec(&kc, "reader", &format!("cat {sa}/ca.crt")).contains("BEGIN CERTIFICATE"));
    // (kubectl, a static binary, lent from the host: busybox's TLS does
    // not speak what the API server asks for.)
    let own = exec(
        &kc,
        "reader",
        &format!(
            "/kubectl --server=$API --certificate-authority={sa}/ca.crt --token=$(cat {sa}/token) get pod reader -o json"
        ),
    );
    let own: Value = serde_json::from_str(&own).unwrap_or_else(|e| panic!("{e}: {own}"));
    assert_eq!(own["metadata"]["uid"], uid.as_str());
    // The ClusterTrustBundle projection holds the cluster's CA.
    let projected = exec(&kc, "reader", "cat /anchors/ca.pem");
    let der = |pem: &str| -> Vec<u8> {
        pem.lines()
            .filter(|l| !l.starts_with("-----"))
            .collect::<String>()
            .into_bytes()
    };
    assert_eq!(der(&projected), der(&ca), "{projected}");
    eprintln!("files, env and token checked after {:?}", t0.elapsed());

    // A ConfigMap change reaches the mounted file in place (the subPath
    // copy stays as it was, as in kubelet).
    kc.ok(&[
        "patch",
        "configmap",
        "cfg",
        "-p",
        r#"{"data":{"app.conf":"v2"}}"#,
    ])
    .unwrap();
    let changed = Instant::now();
    wait_for(
        "app.conf updated in the pod",
        Duration::from_secs(10),
        || (exec(&kc, "reader", "cat /cfg/app.conf") == "v2").then_some(()),
    )
    .await;
    eprintln!("ConfigMap change in the pod after {:?}", changed.elapsed());
    assert_eq!(exec(&kc, "reader", "cat /sub/app.conf"), "v1");
    // A label added to the pod reaches its downwardAPI file; the pod is
    // the same pod (kubelet does not restart it for a label).
    let container_id = |kc: &Kubectl| {
        phase(kc, "reader").unwrap()["status"]["containerStatuses"][0]["containerID"].clone()
    };
    let before = container_id(&kc);
    kc.ok(&["label", "pod", "reader", "tier=gold"]).unwrap();
    wait_for(
        "the label in the downwardAPI file",
        Duration::from_secs(10),
        || {
            exec(&kc, "reader", "cat /info/labels")
                .contains("tier=\"gold\"")
                .then_some(())
        },
    )
    .await;
    assert_eq!(container_id(&kc), before, "a label restarted the pod");

    // A pod whose ConfigMap does not exist yet waits, saying why, and
    // starts once it is there; a missing key is CreateContainerConfigError.
    let waiting_pod = |pod: &str, extra: &str| {
        format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: {pod}, namespace: default}}
spec:
  nodeName: {name}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
{extra}"#
        )
    };
    kc.apply(&waiting_pod(
        "waiter",
        "    volumeMounts: [{name: later, mountPath: /later}]\n  volumes: [{name: later, configMap: {name: later}}]\n",
    ))
    .unwrap();
    kc.apply(&waiting_pod(
        "nokey",
        "    env: [{name: X, valueFrom: {secretKeyRef: {name: creds, key: nokey}}}]\n",
    ))
    .unwrap();
    let msg = wait_for("waiter says why it waits", Duration::from_secs(30), || {
        let p = phase(&kc, "waiter")?;
        let m = p["status"]["message"].as_str()?.to_string();
        m.contains("configmap \"later\" not found").then_some(m)
    })
    .await;
    assert!(
        msg.contains("MountVolume.SetUp failed for volume \"later\""),
        "{msg}"
    );
    assert_eq!(phase(&kc, "waiter").unwrap()["status"]["phase"], "Pending");
    let nokey = wait_for("nokey waiting", Duration::from_secs(30), || {
        let p = phase(&kc, "nokey")?;
        let w = p["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        w["reason"].is_string().then_some(w)
    })
    .await;
    assert_eq!(nokey["reason"], "CreateContainerConfigError", "{nokey}");
    assert_eq!(
        nokey["message"], "couldn't find key nokey in Secret default/creds",
        "{nokey}"
    );
    kc.ok(&["create", "configmap", "later", "--from-literal=k=here"])
        .unwrap();
    let created = Instant::now();
    wait_for("waiter Running", Duration::from_secs(20), || {
        phase(&kc, "waiter").filter(|p| p["status"]["phase"] == "Running")
    })
    .await;
    eprintln!("waiter Running {:?} after its ConfigMap", created.elapsed());
    assert_eq!(exec(&kc, "waiter", "cat /later/k"), "here");

    // A deleted pod leaves neither its files nor a mount behind.
    kc.run_with(
        &["delete", "pod", "reader", "--wait=true"],
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    let pod_dir = agent.root.join("pods").join(&uid);
    wait_for("reader's directory gone", Duration::from_secs(30), || {
        (!pod_dir.exists()).then_some(())
    })
    .await;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(&uid),
        "a mount of the pod is left: {mountinfo}"
    );
    // Only reader read ConfigMap cfg: its watch ends with the pod.
    wait_for("cfg's watch ended", Duration::from_secs(10), || {
        agent
            .log()
            .lines()
            .any(|l| l.contains("watch ended") && l.contains("name=cfg"))
            .then_some(())
    })
    .await;
    eprintln!("done after {:?}", t0.elapsed());
    drop(agent);
}
