//! End-to-end: the agent publishes a pod's status on every outcome (issue
//! 28, item 8): a container that cannot be created or whose image cannot
//! be had is shown, with kubelet's waiting reason and the message, for as
//! long as it is retried; and a change the PLEG sees is shown at once, not
//! only after the sync that follows it. An exit is shown from the event's
//! payload, with no call to the runtime (item 10). Real `petrel runtime`,
//! real runc.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_testkit::agent::{
    container_id, container_state, container_status, phase, pod_yaml, running, sh_container as sh,
    Agent,
};
use petrel_testkit::prelude::{Node, BUSYBOX};

const T: Duration = Duration::from_secs(30);

/// The waiting reason of container `c` ("" when it is not waiting).
fn waiting_reason(p: &serde_json::Value, c: &str) -> String {
    match container_state(p, c) {
        Some(("waiting", w)) => w["reason"].as_str().unwrap_or("").to_string(),
        _ => String::new(),
    }
}

/// The STATUS column of `petrel get pods NAME`.
fn get_status(agent: &Agent, name: &str) -> String {
    let out = agent.petrel_get(&["pods", name]);
    assert!(
        out.status.success(),
        "petrel get pods {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let row = text.lines().nth(1).unwrap_or_default();
    row.split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_show_containers_that_cannot_be_created_while_retrying() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    agent.write_manifest(
        "nocmd.yaml",
        &pod_yaml(
            "nocmd",
            "",
            &format!(
                "  - name: c\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"/no/such/command\"]\n"
            ),
        ),
    );
    // Nothing listens on port 1: every pull fails at once.
    agent.write_manifest(
        "noimage.yaml",
        &pod_yaml(
            "noimage",
            "",
            "  - name: c\n    image: 127.0.0.1:1/petrel/absent:1\n    imagePullPolicy: IfNotPresent\n",
        ),
    );
    agent.write_manifest(
        "good.yaml",
        &pod_yaml("good", "", &sh("c", "exec sleep 3600")),
    );
    agent.wait_pod("default", "good", T, "running", |p| running(p, "c"));

    // runc refuses a command that does not exist at create (a runtime
    // that execs at start refuses it there: RunContainerError).
    let p = agent.wait_pod("default", "nocmd", T, "CreateContainerError", |p| {
        matches!(
            waiting_reason(p, "c").as_str(),
            "CreateContainerError" | "RunContainerError"
        )
    });
    let (_, w) = container_state(&p, "c").unwrap();
    let message = w["message"].as_str().unwrap_or("").to_string();
    eprintln!("{}: {message}", waiting_reason(&p, "c"));
    assert!(message.contains("/no/such/command"), "{message}");
    let reason = waiting_reason(&p, "c");
    // A container that failed at create never existed: the pod is
    // Pending. One that failed at start has ended (StartError, 128), and
    // kubelet counts it as stopped: Running, as it restarts.
    let expected = if reason == "CreateContainerError" {
        "Pending"
    } else {
        "Running"
    };
    assert_eq!(phase(&p), expected, "{p}");
    assert_eq!(get_status(&agent, "nocmd"), reason);
    // It is retried, and stays shown meanwhile.
    let log_count = |a: &Agent| a.log().matches("creating container").count();
    let tried = log_count(&agent);
    let t = Instant::now();
    while log_count(&agent) < tried + 2 {
        assert!(t.elapsed() < T, "no retry:\n{}", agent.log());
        assert!(
            agent
                .pod("default", "nocmd")
                .is_some_and(|p| waiting_reason(&p, "c") == reason),
            "no longer shown as {reason}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // An image that cannot be had: ErrImagePull, then ImagePullBackOff.
    agent.wait_pod("default", "noimage", T, "ErrImagePull", |p| {
        matches!(
            waiting_reason(p, "c").as_str(),
            "ErrImagePull" | "ImagePullBackOff"
        )
    });
    let status = get_status(&agent, "noimage");
    assert!(
        status == "ErrImagePull" || status == "ImagePullBackOff",
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_show_a_container_death_while_its_worker_is_busy() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    // `slow` ignores SIGTERM: stopping it takes its whole grace period,
    // during which its pod's worker is busy.
    let slow = |v: &str| {
        sh(
            "slow",
            &format!("trap '' TERM; echo {v}; while :; do sleep 1; done"),
        )
    };
    let victim = sh("victim", "exec sleep 3600");
    let spec = "  terminationGracePeriodSeconds: 10\n";
    agent.write_manifest(
        "busy.yaml",
        &pod_yaml("busy", spec, &format!("{}{victim}", slow("v1"))),
    );
    let p = agent.wait_pod("default", "busy", T, "running", |p| {
        running(p, "slow") && running(p, "victim")
    });
    let victim_id = container_id(&p, "victim");
    let victim_id = victim_id.trim_start_matches("petrel://").to_string();

    // A changed spec: the worker stops `slow` (10 s) to restart it.
    agent.write_manifest(
        "busy.yaml",
        &pod_yaml("busy", spec, &format!("{}{victim}", slow("v2"))),
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        agent
            .log()
            .contains("container spec changed; restarting it"),
        "the worker is not stopping slow yet:\n{}",
        agent.log()
    );
    // The victim dies meanwhile.
    let pid = node.clients().await.init_pid(&victim_id).await;
    // SAFETY: SIGKILL to the container's init, a pid the runtime gave.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let t = Instant::now();
    let p = agent.wait_pod("default", "busy", Duration::from_secs(3), "victim shown dead", |p| {
        matches!(container_state(p, "victim"), Some(("terminated", st)) if st["exitCode"] == 137)
    });
    eprintln!("death shown after {:?}", t.elapsed());
    // Its worker was still stopping `slow`.
    assert!(running(&p, "slow"), "{p}");
    assert_eq!(container_status(&p, "victim").unwrap()["restartCount"], 0);
    // Then the worker gets to it: both restarted.
    agent.wait_pod("default", "busy", T, "both restarted", |p| {
        running(p, "victim")
            && running(p, "slow")
            && container_status(p, "victim").is_some_and(|c| c["restartCount"] == 1)
    });
}

/// The agent's `kubelet_runtime_operations_total` of one CRI call.
fn operations(agent: &Agent, op: &str) -> f64 {
    let (_, text) = agent.get("/metrics").expect("metrics");
    let prefix = format!("kubelet_runtime_operations_total{{operation_type=\"{op}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_show_an_exit_from_the_event_payload_without_inspecting_the_pod() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    // `done` ends with 0 on SIGTERM: under OnFailure nothing follows its
    // exit (no restart; `stay` keeps the pod running), so every CRI call
    // after the kill is the exit's own cost.
    let containers = format!(
        "{}{}",
        sh("done", "trap 'exit 0' TERM; while :; do sleep 1; done"),
        sh("stay", "exec sleep 3600")
    );
    agent.write_manifest(
        "exits.yaml",
        &pod_yaml("exits", "  restartPolicy: OnFailure\n", &containers),
    );
    let p = agent.wait_pod("default", "exits", T, "running", |p| {
        running(p, "done") && running(p, "stay")
    });
    let id = container_id(&p, "done");
    let id = id.trim_start_matches("petrel://").to_string();
    // Settled: the start's events and syncs are behind us.
    std::thread::sleep(Duration::from_millis(2000));
    let ops = ["list_podsandbox", "podsandbox_status", "container_status"];
    let before: Vec<f64> = ops.iter().map(|op| operations(&agent, op)).collect();

    let pid = node.clients().await.init_pid(&id).await;
    // SAFETY: SIGTERM to the container's init, a pid the runtime gave.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let t = Instant::now();
    let p = agent.wait_pod(
        "default",
        "exits",
        T,
        "the exit shown",
        |p| matches!(container_state(p, "done"), Some(("terminated", st)) if st["exitCode"] == 0),
    );
    let shown = t.elapsed();
    assert!(running(&p, "stay"), "{p}");
    // Whatever the sync after it did is done too.
    std::thread::sleep(Duration::from_millis(500));
    let after: Vec<f64> = ops.iter().map(|op| operations(&agent, op)).collect();
    eprintln!(
        "exit shown after {shown:?}; CRI calls for it: {}",
        ops.iter()
            .zip(before.iter().zip(&after))
            .map(|(op, (b, a))| format!("{op}={}", a - b))
            .collect::<Vec<_>>()
            .join(" ")
    );
    // The STOPPED event's payload was the pod's status: no call at all (an
    // inspection lists the pod and asks each status).
    assert_eq!(after, before, "{ops:?}\n{}", agent.log());
}
