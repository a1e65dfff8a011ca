//! `imagePullSecrets` on a Petrel node of a real cluster (issue 32, item
//! 4): etcd and kube-apiserver (Node authorizer, NodeRestriction,
//! ServiceAccount admission) from the peers, the agent with the node's own
//! credentials over a Petrel runtime, and a private registry on loopback
//! behind htpasswd basic auth holding the busybox test image under a name
//! of its own. Pods are bound to the node (`spec.nodeName`) and pull with
//! `imagePullPolicy: Always`.
//!
//! - no pull secret: the pod waits with ErrImagePull / ImagePullBackOff and
//!   the registry's 401 in the message;
//! - a `kubectl create secret docker-registry` secret in the pod's
//!   `imagePullSecrets`: Running;
//! - a ServiceAccount's `imagePullSecrets` (a legacy `.dockercfg` secret
//!   keyed by a URL with a scheme), copied into the pod by admission:
//!   Running;
//! - a missing secret beside a good one: left out, the pod runs;
//! - a malformed secret: ErrImagePull naming the secret and its key.
//!
//! A missing peer fails this test unless `PETREL_PEERS_SKIP` leaves it out
//! (then it skips, saying so).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_testkit::agent::Agent;
use petrel_testkit::cluster::{self, node_name, Cluster};
use petrel_testkit::kubectl::Kubectl;
use petrel_testkit::kubelet;
use petrel_testkit::prelude::*;
use petrel_testkit::registry::LocalRegistry;
use petrel_testkit::wait::wait_for;
use serde_json::Value;

const USER: &str = "petrel-puller";

/// A pod bound to `node` running `image` (pulled every time), with the
/// pod-level spec lines `extra`.
fn pod(name: &str, node: &str, image: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  nodeName: {node}\n  automountServiceAccountToken: false\n\
         \x20 terminationGracePeriodSeconds: 1\n{extra}  containers:\n  - name: main\n\
         \x20   image: {image}\n    imagePullPolicy: Always\n\
         \x20   command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']\n"
    )
}

/// The waiting state of pod `name`'s container, once it has one.
fn waiting(kc: &Kubectl, name: &str) -> Option<Value> {
    let p = kc.get_json(&["pod", name]).ok()?;
    let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
    w["reason"].is_string().then(|| w.clone())
}

async fn wait_running(kc: &Kubectl, name: &str) -> Value {
    wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(60),
        || {
            kc.get_json(&["pod", name])
                .ok()
                .filter(|p| p["status"]["phase"] == "Running")
        },
    )
    .await
}

/// A secret manifest with one data key, its value base64-encoded.
fn secret_manifest(name: &str, type_: &str, key: &str, value: &str) -> String {
    use std::io::Write as _;
    let mut b64 = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("base64");
    b64.stdin
        .take()
        .unwrap()
        .write_all(value.as_bytes())
        .unwrap();
    let out = b64.wait_with_output().unwrap();
    let data = String::from_utf8(out.stdout).unwrap();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: default}}\n\
         type: {type_}\ndata: {{\"{key}\": \"{data}\"}}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_petrel_node_should_pull_with_the_pods_and_service_accounts_pull_secrets() {
    if let Some(why) = cluster::left_out() {
        eprintln!("skipped: {why}");
        return;
    }
    let t0 = Instant::now();
    let cluster = std::thread::spawn(Cluster::start);
    let password = format!("pw-{}", random_suffix());
    let reg = LocalRegistry::start_with(Some((USER, &password)));
    reg.push(&images_dir().join("busybox-oci.tar"), "private/busybox:1");
    let image = format!("{}/private/busybox:1", reg.host());
    let node = Node::start();
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let name = node_name("petrel-pull");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let agent = Agent::in_cluster(&node, &creds, &[]);
    eprintln!("cluster, registry and node up after {:?}", t0.elapsed());

    // The pod's own secret, as kubectl makes it.
    kc.ok(&[
        "create",
        "secret",
        "docker-registry",
        "regcred",
        &format!("--docker-server={}", reg.host()),
        &format!("--docker-username={USER}"),
        &format!("--docker-password={password}"),
    ])
    .unwrap();
    // The ServiceAccount's: the legacy format, keyed by a URL.
    let dockercfg = format!(
        "{{\"http://{}\": {{\"username\": \"{USER}\", \"password\": \"{password}\"}}}}",
        reg.host()
    );
    kc.apply(&secret_manifest(
        "sa-cred",
        "kubernetes.io/dockercfg",
        ".dockercfg",
        &dockercfg,
    ))
    .unwrap();
    kc.apply(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: puller, namespace: default}\n\
         imagePullSecrets: [{name: sa-cred}]\n",
    )
    .unwrap();
    // Valid JSON for the API server, but its auth field is not base64.
    kc.apply(&secret_manifest(
        "broken",
        "kubernetes.io/dockerconfigjson",
        ".dockerconfigjson",
        &format!(
            "{{\"auths\": {{\"{}\": {{\"auth\": \"{password}!\"}}}}}}",
            reg.host()
        ),
    ))
    .unwrap();

    kc.apply(&pod("anonymous", &name, &image, "")).unwrap();
    kc.apply(&pod(
        "own-secret",
        &name,
        &image,
        "  imagePullSecrets: [{name: regcred}]\n",
    ))
    .unwrap();
    kc.apply(&pod(
        "via-sa",
        &name,
        &image,
        "  serviceAccountName: puller\n",
    ))
    .unwrap();
    kc.apply(&pod(
        "one-missing",
        &name,
        &image,
        "  imagePullSecrets: [{name: not-there}, {name: regcred}]\n",
    ))
    .unwrap();
    kc.apply(&pod(
        "malformed",
        &name,
        &image,
        "  imagePullSecrets: [{name: broken}]\n",
    ))
    .unwrap();

    // Admission copied the ServiceAccount's pull secret into the pod.
    let via_sa = kc.get_json(&["pod", "via-sa"]).unwrap();
    assert_eq!(
        via_sa["spec"]["imagePullSecrets"],
        serde_json::json!([{"name": "sa-cred"}]),
        "{}",
        via_sa["spec"]
    );

    for p in ["own-secret", "via-sa", "one-missing"] {
        wait_running(&kc, p).await;
        eprintln!("{p} Running after {:?}", t0.elapsed());
    }

    let anonymous = wait_for(
        "anonymous waiting on its pull",
        Duration::from_secs(60),
        || {
            waiting(&kc, "anonymous")
                .filter(|w| w["reason"] == "ErrImagePull" || w["reason"] == "ImagePullBackOff")
        },
    )
    .await;
    let message = anonymous["message"].as_str().unwrap_or_default();
    assert!(message.contains("401 Unauthorized"), "{anonymous}");
    assert!(message.contains(&reg.host()), "{anonymous}");
    let p = kc.get_json(&["pod", "anonymous"]).unwrap();
    assert_eq!(p["status"]["phase"], "Pending", "{}", p["status"]);

    let malformed = wait_for("malformed waiting", Duration::from_secs(60), || {
        waiting(&kc, "malformed")
            .filter(|w| w["reason"] == "ErrImagePull" || w["reason"] == "ImagePullBackOff")
    })
    .await;
    let message = malformed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "pull secret default/broken: key .dockerconfigjson: auth of {} is not base64",
            reg.host()
        )),
        "{malformed}"
    );
    // No credential reaches a status or the agent's log.
    assert!(!message.contains(&password), "{malformed}");
    assert!(
        !agent.log().contains(&password),
        "the agent logged a password"
    );
    eprintln!("done after {:?}", t0.elapsed());
    drop(agent);
}
