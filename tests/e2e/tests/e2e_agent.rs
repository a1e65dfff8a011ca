//! End-to-end: `petrel agent` running static pods on a real `petrel
//! runtime` with real runc containers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::agent::{
    condition, container_id, container_state, container_status, phase, pod_yaml, running,
    sh_container as sh, Agent,
};
use petrel_testkit::prelude::Node;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_start_change_and_delete_a_pod() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &["--pleg", "events"]);
    let out = node.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let volumes = format!(
        "  volumes:\n  - name: out\n    hostPath:\n      path: {}\n  terminationGracePeriodSeconds: 5\n",
        out.display()
    );
    let a = format!(
        "{}    volumeMounts:\n    - name: out\n      mountPath: /out\n    lifecycle:\n      preStop:\n        exec:\n          command: [\"sh\", \"-c\", \"echo stopping > /out/prestop\"]\n",
        sh("a", "trap 'exit 0' TERM; while :; do sleep 1; done")
    );
    let b = sh("b", "echo v1; exec sleep 3600");
    agent.write_manifest("web.yaml", &pod_yaml("web", &volumes, &format!("{a}{b}")));

    let pod = agent.wait_pod("default", "web", T, "running and ready", |p| {
        phase(p) == "Running" && condition(p, "Ready") && running(p, "a") && running(p, "b")
    });
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    assert!(condition(&pod, "Initialized") && condition(&pod, "PodReadyToStartContainers"));
    let (a1, b1) = (container_id(&pod, "a"), container_id(&pod, "b"));
    assert!(a1.starts_with("petrel://"), "{a1}");

    // A change to b's spec restarts b only.
    let b2spec = sh("b", "echo v2; exec sleep 3600");
    agent.write_manifest(
        "web.yaml",
        &pod_yaml("web", &volumes, &format!("{a}{b2spec}")),
    );
    let pod = agent.wait_pod("default", "web", T, "running a new b", |p| {
        running(p, "b") && container_id(p, "b") != b1 && !container_id(p, "b").is_empty()
    });
    assert_eq!(container_id(&pod, "a"), a1, "a must not restart");
    assert_eq!(container_status(&pod, "b").unwrap()["restartCount"], 1);
    let live: Vec<_> = agent
        .runtime_containers(&node)
        .await
        .into_iter()
        .filter(|c| c.state == api::ContainerState::ContainerRunning as i32)
        .collect();
    assert_eq!(live.len(), 2, "exactly one a and one b run: {live:?}");

    // A change of a pod-level field (a label) moves the pod to a new
    // sandbox: the old one is stopped gracefully (preStop ran), both
    // containers run again in the new one.
    let ready = |sbs: &[api::PodSandbox]| -> Vec<String> {
        sbs.iter()
            .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
            .map(|s| s.id.clone())
            .collect()
    };
    let old_sandbox = ready(&agent.runtime_sandboxes(&node).await);
    assert_eq!(old_sandbox.len(), 1, "{old_sandbox:?}");
    let b2 = container_id(&pod, "b");
    agent.write_manifest(
        "web.yaml",
        &pod_yaml("web", &volumes, &format!("{a}{b2spec}")).replace(
            "  namespace: default\n",
            "  namespace: default\n  labels: {tier: front}\n",
        ),
    );
    agent.wait_pod("default", "web", T, "running in a new sandbox", |p| {
        running(p, "a")
            && running(p, "b")
            && condition(p, "Ready")
            && container_id(p, "a") != a1
            && container_id(p, "b") != b2
    });
    let new_sandbox = ready(&agent.runtime_sandboxes(&node).await);
    assert_eq!(new_sandbox.len(), 1, "{new_sandbox:?}");
    assert_ne!(new_sandbox, old_sandbox);
    let prestop = out.join("prestop");
    assert_eq!(
        std::fs::read_to_string(&prestop).unwrap_or_default().trim(),
        "stopping"
    );
    std::fs::remove_file(&prestop).unwrap();

    // Deleting the manifest terminates the pod gracefully (preStop ran).
    agent.remove_manifest("web.yaml");
    agent.wait_gone("default", "web", T);
    assert_eq!(
        std::fs::read_to_string(out.join("prestop"))
            .unwrap_or_default()
            .trim(),
        "stopping"
    );
    assert!(agent.runtime_containers(&node).await.is_empty());
    assert!(agent.runtime_sandboxes(&node).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_run_init_containers_in_order() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    let out = node.dir.path().join("init-out");
    std::fs::create_dir_all(&out).unwrap();
    let spec = format!(
        "  volumes:\n  - name: out\n    hostPath:\n      path: {}\n  - name: scratch\n    emptyDir: {{}}\n  initContainers:\n{}    volumeMounts:\n    - {{name: out, mountPath: /out}}\n    - {{name: scratch, mountPath: /scratch}}\n{}    volumeMounts:\n    - {{name: out, mountPath: /out}}\n    - {{name: scratch, mountPath: /scratch}}\n",
        out.display(),
        sh("first", "sleep 1; echo 1 >> /out/order; echo hi > /scratch/x"),
        sh("second", "echo 2 >> /out/order; cat /scratch/x >> /out/order"),
    );
    let app = format!(
        "{}    volumeMounts:\n    - {{name: out, mountPath: /out}}\n",
        sh("app", "echo app >> /out/order; exec sleep 3600")
    );
    agent.write_manifest("init.yaml", &pod_yaml("init", &spec, &app));
    // While the first init container runs, the pod is Pending/initialising.
    let pod = agent.wait_pod("default", "init", T, "running", |p| running(p, "app"));
    assert!(condition(&pod, "Initialized"));
    let inits = pod["status"]["initContainerStatuses"].as_array().unwrap();
    assert_eq!(inits.len(), 2);
    for i in inits {
        assert_eq!(i["state"]["terminated"]["exitCode"], 0, "{i}");
        assert_eq!(i["state"]["terminated"]["reason"], "Completed", "{i}");
    }
    // Running means its process started, not that it has written yet.
    let order = || std::fs::read_to_string(out.join("order")).unwrap_or_default();
    petrel_testkit::prelude::eventually(Duration::from_secs(20), || order().ends_with("app\n"))
        .await;
    assert_eq!(order(), "1\n2\nhi\napp\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_apply_restart_policies_with_backoff() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &["--backoff-initial", "2s"]);
    agent.write_manifest(
        "crash.yaml",
        &pod_yaml("crash", "", &sh("c", "echo boom; exit 3")),
    );
    agent.write_manifest(
        "once.yaml",
        &pod_yaml("once", "  restartPolicy: OnFailure\n", &sh("c", "exit 0")),
    );
    agent.write_manifest(
        "never.yaml",
        &pod_yaml("never", "  restartPolicy: Never\n", &sh("c", "exit 1")),
    );
    // Always: restarted, then held in CrashLoopBackOff.
    let pod = agent.wait_pod("default", "crash", T, "in CrashLoopBackOff", |p| {
        matches!(container_state(p, "c"), Some(("waiting", w)) if w["reason"] == "CrashLoopBackOff")
    });
    let cs = container_status(&pod, "c").unwrap();
    assert!(cs["restartCount"].as_i64().unwrap() >= 1, "{cs}");
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3, "{cs}");
    assert_eq!(phase(&pod), "Running");
    // The backoff doubles: restart count keeps growing, slowly.
    let pod = agent.wait_pod("default", "crash", T, "restarted twice", |p| {
        container_status(p, "c").is_some_and(|c| c["restartCount"].as_i64() >= Some(2))
    });
    assert!(!running(&pod, "c") || container_status(&pod, "c").is_some());

    let pod = agent.wait_pod("default", "once", T, "Succeeded", |p| {
        phase(p) == "Succeeded"
    });
    assert_eq!(container_status(&pod, "c").unwrap()["restartCount"], 0);
    let pod = agent.wait_pod("default", "never", T, "Failed", |p| phase(p) == "Failed");
    let (k, v) = container_state(&pod, "c").unwrap();
    assert_eq!((k, v["exitCode"].as_i64()), ("terminated", Some(1)));
    assert_eq!(v["reason"], "Error");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_act_on_exec_probes() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    let c = format!(
        "{}    readinessProbe:\n      exec: {{command: [\"test\", \"-f\", \"/tmp/ready\"]}}\n      periodSeconds: 1\n      failureThreshold: 1\n{}    livenessProbe:\n      exec: {{command: [\"sh\", \"-c\", \"test ! -f /tmp/dead\"]}}\n      periodSeconds: 1\n      failureThreshold: 2\n",
        sh("ready", "sleep 4; touch /tmp/ready; exec sleep 3600"),
        sh("live", "sleep 2; touch /tmp/dead; exec sleep 3600"),
    );
    agent.write_manifest(
        "probe.yaml",
        &pod_yaml("probe", "  terminationGracePeriodSeconds: 1\n", &c),
    );
    // Not ready while its probe fails (a loaded machine may take a while to
    // show the container running, hence the wait rather than one look).
    agent.wait_pod("default", "probe", T, "running, not ready", |p| {
        running(p, "ready")
            && container_status(p, "ready").is_some_and(|c| c["ready"] == false)
            && !condition(p, "Ready")
    });
    agent.wait_pod("default", "probe", T, "ready", |p| {
        container_status(p, "ready").is_some_and(|c| c["ready"] == true)
    });
    // The liveness probe fails once /tmp/dead exists: restarted.
    agent.wait_pod("default", "probe", T, "live restarted", |p| {
        container_status(p, "live").is_some_and(|c| c["restartCount"].as_i64() >= Some(1))
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_show_invalid_manifests_and_run_the_rest() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    agent.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [oops\n",
    );
    agent.write_manifest(
        "noimage.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: noimage\nspec:\n  containers:\n  - name: c\n",
    );
    agent.write_manifest(
        "missing.yaml",
        &pod_yaml(
            "missing",
            "",
            "  - name: c\n    image: docker.io/petrel/absent:1\n    imagePullPolicy: Never\n",
        ),
    );
    // Nothing listens on port 1: the pull fails at once, again and again.
    agent.write_manifest(
        "unpullable.yaml",
        &pod_yaml(
            "unpullable",
            "",
            "  - name: c\n    image: 127.0.0.1:1/petrel/absent:1\n    imagePullPolicy: IfNotPresent\n",
        ),
    );
    agent.write_manifest(
        "good.yaml",
        &pod_yaml("good", "", &sh("c", "exec sleep 3600")),
    );
    agent.wait_pod("default", "good", T, "running", |p| running(p, "c"));
    let bad = agent.wait_pod("default", "noimage", T, "shown", |_| true);
    assert_eq!(phase(&bad), "Pending");
    let msg = bad["status"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("image"), "{bad}");
    let broken = agent.wait_pod("default", "broken", T, "shown", |_| true);
    assert!(
        broken["status"]["message"].as_str().unwrap_or("").len() > 5,
        "{broken}"
    );
    agent.wait_pod("default", "missing", T, "ErrImageNeverPull", |p| {
        matches!(container_state(p, "c"), Some(("waiting", w)) if w["reason"] == "ErrImageNeverPull")
    });
    // A failed pull shows ErrImagePull, then kubelet's ImagePullBackOff
    // (10 s before the next attempt) with the pull's error.
    let waiting = |p: &serde_json::Value| match container_state(p, "c") {
        Some(("waiting", w)) => w["reason"].as_str().unwrap_or("").to_string(),
        _ => String::new(),
    };
    agent.wait_pod("default", "unpullable", T, "ErrImagePull", |p| {
        waiting(p) == "ErrImagePull" || waiting(p) == "ImagePullBackOff"
    });
    let p = agent.wait_pod("default", "unpullable", T, "ImagePullBackOff", |p| {
        waiting(p) == "ImagePullBackOff"
    });
    let msg = container_state(&p, "c").unwrap().1["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        msg.starts_with("Back-off pulling image \"127.0.0.1:1/petrel/absent:1\": ")
            && msg.len() > 60,
        "{msg}"
    );
    assert_eq!(phase(&p), "Pending");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_probe_host_network_pods_over_http_and_tcp() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = format!(
        "{}    ports:\n    - {{name: http, containerPort: {port}}}\n    readinessProbe:\n      httpGet: {{path: /index.html, port: http}}\n      periodSeconds: 1\n    livenessProbe:\n      tcpSocket: {{port: {port}}}\n      periodSeconds: 1\n{}    readinessProbe:\n      httpGet: {{path: /missing, port: {port}}}\n      periodSeconds: 1\n",
        sh(
            "web",
            &format!("mkdir -p /www; echo ok > /www/index.html; exec httpd -f -p 127.0.0.1:{port} -h /www")
        ),
        sh("other", "exec sleep 3600"),
    );
    agent.write_manifest(
        "hn.yaml",
        &pod_yaml(
            "hn",
            "  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n",
            &c,
        ),
    );
    let pod = agent.wait_pod("default", "hn", T, "web ready", |p| {
        container_status(p, "web").is_some_and(|c| c["ready"] == true)
    });
    // A 404 is a failure: "other" never becomes ready.
    assert_eq!(container_status(&pod, "other").unwrap()["ready"], false);
    assert!(!condition(&pod, "Ready"));
    // The TCP liveness probe passes: no restarts.
    std::thread::sleep(Duration::from_secs(3));
    let pod = agent.pod("default", "hn").unwrap();
    assert_eq!(container_status(&pod, "web").unwrap()["restartCount"], 0);
    assert!(pod["status"]["podIP"].is_string(), "{pod}");
}
