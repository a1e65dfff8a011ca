//! End-to-end: the same agent, unchanged, against containerd 1.7 (with its
//! event stream) and containerd 1.6 (no events: `auto` falls back to
//! relisting).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use petrel_oci::cgroups::{CgroupVersion, Cgroups};
use petrel_testkit::agent::{container_state, container_status, phase, Agent};
use petrel_testkit::local_containerd::{Containerd, Version};
use petrel_testkit::prelude::BUSYBOX;

const T: Duration = Duration::from_secs(40);

fn pod_yaml(name: &str, policy: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

fn metric(agent: &Agent, name: &str) -> f64 {
    let Some((200, text)) = agent.get("/metrics") else {
        return -1.0;
    };
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1.0)
}

fn core_scenario(cd: &Containerd, expect_events: bool) {
    let agent = Agent::start(
        cd.dir.path(),
        &cd.endpoint(),
        &cd.cgroup_parent,
        &["--backoff-initial", "1s"],
    );
    // A long-running pod, a pod that exits once, a crashing pod.
    agent.write_manifest("run.yaml", &pod_yaml("run", "Always", "exec sleep 3600"));
    agent.write_manifest("once.yaml", &pod_yaml("once", "Never", "sleep 1; exit 6"));
    agent.write_manifest("crash.yaml", &pod_yaml("crash", "Always", "exit 2"));
    let pod = agent.wait_pod("default", "run", T, "running", |p| {
        matches!(container_state(p, "c"), Some(("running", _))) && p["status"]["podIP"].is_string()
    });
    let id = container_status(&pod, "c").unwrap()["containerID"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(id.starts_with("containerd://"), "{id}");
    // The agent made the pod's cgroup, with its weight, before containerd
    // made the sandbox inside it.
    let cg = Cgroups::detect().unwrap();
    let pod_cgroup = format!(
        "{}/kubepods/besteffort/pod{}",
        cd.cgroup_parent,
        pod["metadata"]["uid"].as_str().unwrap()
    );
    let (file, minimum) = match cg.version() {
        CgroupVersion::V1 => ("cpu.shares", "2"),
        CgroupVersion::V2 => ("cpu.weight", "1"),
    };
    assert_eq!(cg.read("cpu", &pod_cgroup, file).unwrap().trim(), minimum);
    let pod = agent.wait_pod("default", "once", T, "Failed", |p| phase(p) == "Failed");
    let (_, t) = container_state(&pod, "c").unwrap();
    assert_eq!(t["exitCode"], 6);
    agent.wait_pod("default", "crash", T, "restarted", |p| {
        container_status(p, "c").is_some_and(|c| c["restartCount"].as_i64() >= Some(1))
    });
    let mode = if expect_events { "Events" } else { "Relist" };
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("adopting pods") && l.contains(mode)),
        "expected {mode} with {:?}:\n{}",
        cd.version,
        agent.log()
    );
    if expect_events {
        assert!(metric(&agent, "kubelet_evented_pleg_connection_success_count") >= 1.0);
    }
    // Deleting the manifests terminates the pods.
    for f in ["run.yaml", "once.yaml", "crash.yaml"] {
        agent.remove_manifest(f);
    }
    for p in ["run", "once", "crash"] {
        agent.wait_gone("default", p, T);
    }
    // Its cgroup went with it (containerd removed what it made inside).
    let gone = || cg.dir("cpu", &pod_cgroup).is_ok_and(|d| !d.exists());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !gone() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone(), "{pod_cgroup} left\n{}", agent.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_run_pods_on_containerd_1_7_with_events() {
    let Some(cd) = Containerd::start(Version::V17) else {
        return;
    };
    core_scenario(&cd, true);
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_run_pods_on_containerd_1_6_by_relisting() {
    let Some(cd) = Containerd::start(Version::V16) else {
        return;
    };
    core_scenario(&cd, false);
}
