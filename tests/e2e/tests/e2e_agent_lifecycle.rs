//! End-to-end: Kubernetes pod lifecycle rules the agent follows as kubelet
//! does (issue 28, item 9): native sidecars (init containers with
//! `restartPolicy: Always`), the sandbox of a completed pod stopped (its IP
//! released), and downwardAPI volumes. Real `petrel runtime`, real runc.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_testkit::agent::{
    condition, container_id, phase, pod_yaml, running, sh_container as sh, Agent,
};
use petrel_testkit::network::{PodNetwork, LOOPBACK_PORTMAP};
use petrel_testkit::prelude::Node;
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// Init container `name`'s status.
fn init_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["initContainerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// Init container `name` runs.
fn init_running(pod: &Value, name: &str) -> bool {
    init_status(pod, name).is_some_and(|c| c["state"]["running"].is_object())
}

/// The pod's sandboxes, by state, as the runtime has them.
async fn sandbox_states(agent: &Agent, node: &Node) -> Vec<i32> {
    agent
        .runtime_sandboxes(node)
        .await
        .into_iter()
        .map(|s| s.state)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_run_native_sidecars_as_kubelet_does() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &["--backoff-initial", "1s"]);
    let out = node.dir.path().join("sidecar-out");
    std::fs::create_dir_all(&out).unwrap();
    let mount = "    volumeMounts:\n    - {name: out, mountPath: /out}\n";
    // `proxy` is a sidecar whose startupProbe passes 2 s after it started:
    // `late` must wait for it. Each writes its steps to /out/order.
    let proxy = format!(
        "{}    restartPolicy: Always\n    startupProbe:\n      exec: {{command: [\"test\", \"-f\", \"/tmp/up\"]}}\n      periodSeconds: 1\n{mount}",
        sh(
            "proxy",
            "trap 'echo proxy-term >> /out/order; exit 0' TERM; echo proxy >> /out/order; sleep 2; echo proxy-up >> /out/order; touch /tmp/up; while :; do sleep 0.1; done"
        )
    );
    let spec = format!(
        "  restartPolicy: Never\n  terminationGracePeriodSeconds: 10\n  volumes:\n  - name: out\n    hostPath:\n      path: {}\n  initContainers:\n{}{mount}{proxy}{}{mount}",
        out.display(),
        sh("setup", "echo setup >> /out/order"),
        sh("late", "echo late >> /out/order"),
    );
    let main = format!(
        "{}{mount}",
        sh(
            "main",
            "echo main >> /out/order; while [ ! -e /out/done ]; do sleep 0.1; done; echo main-done >> /out/order"
        )
    );
    agent.write_manifest("mesh.yaml", &pod_yaml("mesh", &spec, &main));

    // Initialized in order, the sidecar running beside the app.
    let pod = agent.wait_pod("default", "mesh", T, "running", |p| {
        phase(p) == "Running" && running(p, "main") && init_running(p, "proxy")
    });
    assert!(condition(&pod, "Initialized"), "{pod}");
    let proxy = init_status(&pod, "proxy").unwrap();
    assert_eq!(
        (&proxy["ready"], &proxy["started"]),
        (&true.into(), &true.into())
    );
    for name in ["setup", "late"] {
        let s = init_status(&pod, name).unwrap();
        assert_eq!(s["state"]["terminated"]["reason"], "Completed", "{s}");
    }
    // `main` is running before its shell has written its line.
    let read_order = || std::fs::read_to_string(out.join("order")).unwrap_or_default();
    petrel_testkit::wait::eventually(T, || read_order().lines().count() >= 5).await;
    let order = read_order();
    assert_eq!(
        order.lines().take(5).collect::<Vec<_>>(),
        ["setup", "proxy", "proxy-up", "late", "main"],
        "late waits for the sidecar's startupProbe"
    );

    // The sidecar dies: it is restarted, though the pod's policy is Never;
    // the app runs on.
    let main_id = container_id(&pod, "main");
    let proxy_id = proxy["containerID"].as_str().unwrap().to_string();
    let pid = node
        .clients()
        .await
        .init_pid(proxy_id.trim_start_matches("petrel://"))
        .await;
    // SAFETY: SIGKILL to the container's init, a pid the runtime gave.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let pod = agent.wait_pod("default", "mesh", T, "the sidecar restarted", |p| {
        init_running(p, "proxy") && init_status(p, "proxy").is_some_and(|c| c["restartCount"] == 1)
    });
    assert_eq!(container_id(&pod, "main"), main_id, "the app runs on");
    assert_eq!(phase(&pod), "Running");

    // The app completes: the sidecar is stopped after it, and the pod
    // (restartPolicy Never) succeeded, its sandbox stopped.
    std::fs::write(out.join("done"), b"").unwrap();
    let pod = agent.wait_pod("default", "mesh", T, "Succeeded", |p| {
        phase(p) == "Succeeded"
            && init_status(p, "proxy").is_some_and(|c| c["state"]["terminated"].is_object())
    });
    assert!(!condition(&pod, "Ready"));
    let order = std::fs::read_to_string(out.join("order")).unwrap();
    let tail: Vec<&str> = order.lines().rev().take(2).collect();
    assert_eq!(tail, ["proxy-term", "main-done"], "{order}");
    let t = Instant::now();
    while sandbox_states(&agent, &node).await != [api::PodSandboxState::SandboxNotready as i32] {
        assert!(
            t.elapsed() < T,
            "the sandbox is not stopped:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing starts again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(agent.live_containers(&node).await.is_empty());
    let pod = agent.pod("default", "mesh").unwrap();
    assert_eq!(phase(&pod), "Succeeded");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_stop_the_sandbox_of_a_completed_pod_and_release_its_ip() {
    let net = PodNetwork::with_chain(LOOPBACK_PORTMAP);
    let node = Node::start_with(&net.cri_config());
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let agent = Agent::for_node(&node, &[]);
    agent.write_manifest(
        "never.yaml",
        &pod_yaml("never", "  restartPolicy: Never\n", &sh("c", "sleep 5")),
    );
    agent.write_manifest(
        "onfailure.yaml",
        &pod_yaml(
            "onfailure",
            "  restartPolicy: OnFailure\n",
            &sh("c", "sleep 5"),
        ),
    );
    agent.write_manifest(
        "always.yaml",
        &pod_yaml(
            "always",
            "  terminationGracePeriodSeconds: 1\n",
            &sh("c", "exec sleep 3600"),
        ),
    );
    let mut ips = Vec::new();
    for name in ["never", "onfailure", "always"] {
        let p = agent.wait_pod("default", name, T, "running with an IP", |p| {
            running(p, "c") && p["status"]["podIP"].is_string()
        });
        ips.push(p["status"]["podIP"].as_str().unwrap().to_string());
    }
    assert_eq!(net.leased().len(), 3, "{:?}", net.leased());

    // Both complete: their sandboxes stop and their leases go; the status
    // stays, with the IP the pod had.
    for (name, ip) in ["never", "onfailure"].iter().zip(&ips) {
        let p = agent.wait_pod("default", name, T, "Succeeded", |p| {
            phase(p) == "Succeeded" && !condition(p, "PodReadyToStartContainers")
        });
        assert_eq!(p["status"]["podIP"], ip.as_str(), "{name}");
    }
    let t = Instant::now();
    while net.leased() != [ips[2].clone()] {
        assert!(
            t.elapsed() < T,
            "leases {:?}, want only {}:\n{}",
            net.leased(),
            ips[2],
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = agent
        .runtime_sandboxes(&node)
        .await
        .into_iter()
        .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        .count();
    assert_eq!(ready, 1, "only the running pod keeps its sandbox");
    // And they stay so.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.runtime_sandboxes(&node).await.len(), 3);
    for name in ["never", "onfailure"] {
        assert_eq!(phase(&agent.pod("default", name).unwrap()), "Succeeded");
    }

    // Deleting the pods removes them all.
    for f in ["never.yaml", "onfailure.yaml", "always.yaml"] {
        agent.remove_manifest(f);
    }
    for name in ["never", "onfailure", "always"] {
        agent.wait_gone("default", name, T);
    }
    let t = Instant::now();
    while !net.leased().is_empty() {
        assert!(t.elapsed() < T, "leases left: {:?}", net.leased());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pod's `..data` link of its downwardAPI volume `name`, on the host.
fn downward_data(agent: &Agent, uid: &str, name: &str) -> std::path::PathBuf {
    agent
        .root
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~downward-api")
        .join(name)
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_serve_downward_api_volumes() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    let out = node.dir.path().join("downward-out");
    std::fs::create_dir_all(&out).unwrap();
    // The container copies what it sees to /out, and tries to write.
    let script = "for f in name labels annotations tier cpu mem; do cat /podinfo/$f > /out/$f; done; \
        stat -c %a /podinfo/..data/uid > /out/uid-mode; stat -c %a /podinfo/..data/name > /out/name-mode; \
        if touch /podinfo/x 2>/dev/null; then echo rw > /out/rw; else echo ro > /out/rw; fi; \
        exec sleep 3600";
    let manifest = |tier: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: info\n  namespace: default\n  labels: {{app: web, tier: {tier}}}\n  annotations:\n    note: \"a \\\"quoted\\\"\\nline\"\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: out\n    hostPath: {{path: {}}}\n  - name: podinfo\n    downwardAPI:\n      defaultMode: 0644\n      items:\n      - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}\n      - {{path: uid, fieldRef: {{fieldPath: metadata.uid}}, mode: 0400}}\n      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}\n      - {{path: annotations, fieldRef: {{fieldPath: metadata.annotations}}}}\n      - {{path: tier, fieldRef: {{fieldPath: \"metadata.labels['tier']\"}}}}\n      - {{path: cpu, resourceFieldRef: {{containerName: c, resource: limits.cpu, divisor: 1m}}}}\n      - {{path: mem, resourceFieldRef: {{containerName: c, resource: requests.memory, divisor: 1Mi}}}}\n  containers:\n{}    resources:\n      limits: {{cpu: 500m, memory: 64Mi}}\n    volumeMounts:\n    - {{name: out, mountPath: /out}}\n    - {{name: podinfo, mountPath: /podinfo}}\n",
            out.display(),
            sh("c", script)
        )
    };
    agent.write_manifest("info.yaml", &manifest("front"));
    let pod = agent.wait_pod("default", "info", T, "running", |p| running(p, "c"));
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let read = |f: &str| {
        let t = Instant::now();
        loop {
            if let Ok(s) = std::fs::read_to_string(out.join(f)) {
                if !s.is_empty() {
                    return s;
                }
            }
            assert!(t.elapsed() < T, "/out/{f} not written:\n{}", agent.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert_eq!(read("rw"), "ro\n", "the volume is read-only");
    assert_eq!(read("name"), "info");
    assert_eq!(read("labels"), "app=\"web\"\ntier=\"front\"");
    assert_eq!(read("annotations"), r#"note="a \"quoted\"\nline""#);
    assert_eq!(read("tier"), "front");
    assert_eq!(read("cpu"), "500");
    assert_eq!(read("mem"), "64");
    assert_eq!(read("uid-mode"), "400\n");
    assert_eq!(read("name-mode"), "644\n");

    // On the host: kubelet's layout, one version behind `..data`.
    let dir = downward_data(&agent, &uid, "podinfo");
    let first = std::fs::read_link(dir.join("..data")).unwrap();
    assert!(first.to_string_lossy().starts_with("..20"), "{first:?}");
    assert_eq!(
        std::fs::read_link(dir.join("labels")).unwrap(),
        std::path::Path::new("..data/labels")
    );

    // A changed label (a pod-level change: a new sandbox) rewrites the
    // volume in place, as a new version swapped in at once.
    for f in ["rw", "labels"] {
        std::fs::remove_file(out.join(f)).unwrap();
    }
    agent.write_manifest("info.yaml", &manifest("back"));
    assert_eq!(read("rw"), "ro\n");
    assert_eq!(read("labels"), "app=\"web\"\ntier=\"back\"");
    let second = std::fs::read_link(dir.join("..data")).unwrap();
    assert_ne!(first, second);
    let versions: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("..20"))
        .collect();
    assert_eq!(versions, [second.to_string_lossy().into_owned()]);

    agent.remove_manifest("info.yaml");
    agent.wait_gone("default", "info", T);
    // (The status goes just before the pod's directory.)
    let t = Instant::now();
    while dir.exists() {
        assert!(t.elapsed() < T, "the volume stays after the pod");
        std::thread::sleep(Duration::from_millis(20));
    }
}
