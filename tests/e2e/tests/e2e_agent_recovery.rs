//! End-to-end: the agent survives its own restarts, the runtime's crashes
//! and a cut event stream, without duplicating or losing containers.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_testkit::agent::{container_id, container_state, container_status, running, Agent};
use petrel_testkit::prelude::{Node, BUSYBOX};

const T: Duration = Duration::from_secs(30);

fn pod_yaml(name: &str, policy: &str, containers: &[(&str, &str)]) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 2\n  containers:\n"
    );
    for (c, script) in containers {
        s.push_str(&format!(
            "  - name: {c}\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n"
        ));
    }
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn restarted_agent_should_adopt_running_pods() {
    let node = Node::start_with_busybox().await;
    let mut agent = Agent::for_node(&node, &[]);
    agent.write_manifest(
        "a.yaml",
        &pod_yaml("a", "Always", &[("c", "exec sleep 3600")]),
    );
    let pod = agent.wait_pod("default", "a", T, "running", |p| running(p, "c"));
    let before = container_id(&pod, "c");
    agent.terminate();
    agent.restart();
    let pod = agent.wait_pod("default", "a", T, "running again", |p| running(p, "c"));
    assert_eq!(
        container_id(&pod, "c"),
        before,
        "adoption must not restart the container"
    );
    assert_eq!(container_status(&pod, "c").unwrap()["restartCount"], 0);
    // kill -9 too.
    agent.kill9();
    agent.restart();
    let pod = agent.wait_pod("default", "a", T, "running again", |p| running(p, "c"));
    assert_eq!(container_id(&pod, "c"), before);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.live_containers(&node).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_survive_a_runtime_kill_and_converge() {
    let mut node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &["--pleg", "events"]);
    agent.write_manifest(
        "a.yaml",
        &pod_yaml("a", "Always", &[("c", "exec sleep 3600")]),
    );
    let pod = agent.wait_pod("default", "a", T, "running", |p| running(p, "c"));
    let before = container_id(&pod, "c");

    node.kill9();
    // The agent keeps running and says the runtime is down.
    let start = Instant::now();
    let mut unhealthy = false;
    while start.elapsed() < Duration::from_secs(15) {
        if let Some((500, body)) = agent.get("/healthz") {
            assert!(body.contains("runtime"), "{body}");
            unhealthy = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        unhealthy,
        "healthz never reported the runtime down:\n{}",
        agent.log()
    );
    // A manifest added while the runtime is down starts once it is back.
    agent.write_manifest(
        "b.yaml",
        &pod_yaml("b", "Always", &[("c", "exec sleep 3600")]),
    );
    node.restart();
    agent.wait_pod("default", "b", T, "running", |p| running(p, "c"));
    let pod = agent.wait_pod("default", "a", T, "running", |p| running(p, "c"));
    assert_eq!(
        container_id(&pod, "c"),
        before,
        "the container survived the runtime crash"
    );
    let start = Instant::now();
    while agent.get("/healthz").map(|r| r.0) != Some(200) {
        assert!(
            start.elapsed() < T,
            "agent never became healthy again:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.live_containers(&node).await.len(), 2, "no duplicates");
}

#[tokio::test(flavor = "multi_thread")]
async fn exits_missed_while_the_stream_was_cut_should_be_recovered() {
    let mut node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &["--pleg", "events"]);
    agent.write_manifest(
        "x.yaml",
        &pod_yaml("x", "Never", &[("c", "sleep 3; exit 4")]),
    );
    agent.wait_pod("default", "x", T, "running", |p| running(p, "c"));
    // Cut the stream (runtime down) across the exit, then restore it.
    node.kill9();
    std::thread::sleep(Duration::from_secs(4));
    node.restart();
    let pod = agent.wait_pod("default", "x", T, "terminated", |p| {
        matches!(container_state(p, "c"), Some(("terminated", _)))
    });
    let (_, t) = container_state(&pod, "c").unwrap();
    assert_eq!(t["exitCode"], 4, "{pod}");
    assert_eq!(pod["status"]["phase"], "Failed");
}

/// Container exit → terminated state at /pods, in both PLEG modes.
#[tokio::test(flavor = "multi_thread")]
async fn exits_should_reach_the_status_in_both_pleg_modes() {
    let node = Node::start_with_busybox().await;
    for (mode, bound) in [
        ("events", Duration::from_secs(2)),
        ("relist", Duration::from_secs(4)),
    ] {
        let agent = Agent::for_node(&node, &["--pleg", mode]);
        agent.write_manifest(
            "e.yaml",
            &pod_yaml(
                "e",
                "Never",
                &[("c", "read x < /dev/null; sleep 2; exit 5")],
            ),
        );
        agent.wait_pod("default", "e", T, "running", |p| running(p, "c"));
        let pod = agent.wait_pod("default", "e", T, "terminated", |p| {
            matches!(container_state(p, "c"), Some(("terminated", _)))
        });
        let (_, t) = container_state(&pod, "c").unwrap();
        let finished = t["finishedAt"].as_str().unwrap_or("").to_string();
        assert!(!finished.is_empty(), "{pod}");
        let _ = bound;
        agent.remove_manifest("e.yaml");
        agent.wait_gone("default", "e", T);
    }
}

#[test]
fn petrel_node_should_run_manifests_in_one_process() {
    use std::process::{Command, Stdio};
    let dir = tempfile::Builder::new()
        .prefix("petrel-node.")
        .tempdir()
        .unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let cgroup = format!("/petrel-test-node-{}", std::process::id());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let state = dir.path().join("state");
    let mut child = Command::new(petrel_testkit::prelude::petrel_bin())
        .arg("node")
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--state")
        .arg(&state)
        .args(["--default-cgroup-parent", &cgroup])
        .args(["--pod-network", "loopback"])
        .arg("--nri-socket")
        .arg(dir.path().join("nri.sock"))
        .arg("--nri-plugin-path")
        .arg(dir.path().join("nri-plugins"))
        // Disk thresholds off: this machine's disk may be fuller than
        // kubelet's defaults allow, which is not what this test is about.
        .args(["--eviction-hard", "memory.available<100Mi"])
        .arg("--manifests")
        .arg(&manifests)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--agent-socket")
        .arg(dir.path().join("agent/agent.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("node.log")).unwrap())
        .spawn()
        .unwrap();
    let sock = state.join("petrel.sock");
    let endpoint = format!("unix://{}", sock.display());
    let ok = (|| {
        let start = Instant::now();
        while !sock.exists() && start.elapsed() < T {
            std::thread::sleep(Duration::from_millis(20));
        }
        let img = petrel_testkit::prelude::images_dir().join("busybox-oci.tar");
        let st = Command::new(petrel_testkit::prelude::petrel_bin())
            .args(["ctl", "--endpoint", &endpoint, "image", "import"])
            .arg(&img)
            .status()
            .ok()?;
        if !st.success() {
            return None;
        }
        std::fs::write(
            manifests.join("n.yaml"),
            pod_yaml("n", "Always", &[("c", "exec sleep 3600")]),
        )
        .ok()?;
        let start = Instant::now();
        while start.elapsed() < T {
            let out = Command::new(petrel_testkit::prelude::petrel_bin())
                .args(["get", "pods", "--server"])
                .arg(format!(
                    "unix://{}",
                    dir.path().join("agent/agent.sock").display()
                ))
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if text.contains("Running") && text.contains("1/1") {
                // Delete the manifest: the pod goes away.
                std::fs::remove_file(manifests.join("n.yaml")).ok()?;
                let start = Instant::now();
                while start.elapsed() < T {
                    let out = Command::new(petrel_testkit::prelude::petrel_bin())
                        .args(["ctl", "--endpoint", &endpoint, "pods", "-q"])
                        .output()
                        .ok()?;
                    if out.status.success() && out.stdout.is_empty() {
                        return Some(());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    })();
    // Whatever is left (a failed run) goes before the node does, so no
    // mount outlives the test: manifests first (the agent would recreate
    // pods), then every pod through the runtime.
    let _ = std::fs::remove_file(manifests.join("n.yaml"));
    if let Ok(out) = Command::new(petrel_testkit::prelude::petrel_bin())
        .args(["ctl", "--endpoint", &endpoint, "pods", "-q"])
        .output()
    {
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new(petrel_testkit::prelude::petrel_bin())
                .args(["ctl", "--endpoint", &endpoint, "rmp", "-f", id])
                .output();
        }
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    petrel_testkit::prelude::remove_cgroup_tree(&cgroup);
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    assert!(ok.is_some(), "petrel node did not run the manifest:\n{log}");
}
