//! End-to-end: node-pressure eviction by `petrel agent` on a real runtime,
//! with real memory pressure made safely: each test's node is a memory
//! cgroup of its own (under the test's cgroup parent) with a small limit,
//! named with `--node-cgroup`, so pods fill it and not the machine.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_testkit::agent::{phase, running, Agent, MEMORY_HOG};
use petrel_testkit::prelude::{Node, BUSYBOX};
use serde_json::Value;

const MI: u64 = 1 << 20;

/// Makes the test's node cgroup with a memory limit; it lives under the
/// test's cgroup parent, which the node's cleanup removes.
fn node_cgroup(node: &Node, memory_limit: u64) -> String {
    let path = format!("{}/node", node.cgroup_parent);
    let dir = Node::make_cgroup("memory", &path).expect("create the node's memory cgroup");
    std::fs::write(
        dir.join(Node::memory_limit_file()),
        memory_limit.to_string(),
    )
    .expect("limit the node's memory");
    path
}

fn pod(name: &str, resources: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n{resources}"
    )
}

fn pod_condition<'a>(p: &'a Value, kind: &str) -> Option<&'a Value> {
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn node_condition(agent: &Agent, kind: &str) -> Option<String> {
    let (code, body) = agent.get("/node")?;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).ok()?;
    v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

/// Waits up to `within` until the node's condition `kind` has `status`.
fn wait_node_condition(agent: &Agent, kind: &str, status: &str, within: Duration) {
    let start = Instant::now();
    while node_condition(agent, kind).as_deref() != Some(status) {
        assert!(
            start.elapsed() < within,
            "{kind} is not {status} after {within:?} ({:?}):\n{}",
            node_condition(agent, kind),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An agent whose root is the small filesystem `root`, watching it every
/// second against the hard threshold `hard` (a `nodefs.available` one),
/// with pressure kept for `transition` after it ends; `extra` flags last.
fn disk_agent(
    node: &Node,
    root: &std::path::Path,
    hard: &str,
    transition: &str,
    extra: &[&str],
) -> Agent {
    let mut flags = vec![
        "--eviction-hard",
        hard,
        "--eviction-monitoring-interval",
        "1s",
        "--eviction-pressure-transition-period",
        transition,
    ];
    flags.extend_from_slice(extra);
    Agent::for_node_at(node, root, &flags)
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_pressure_should_evict_the_best_effort_hog_and_spare_the_guaranteed_pod() {
    let node = Node::start_with_busybox().await;
    let cgroup = node_cgroup(&node, 256 * MI);
    let agent = Agent::for_node(
        &node,
        &[
            "--node-cgroup",
            &cgroup,
            "--eviction-hard",
            "memory.available<64Mi",
            "--eviction-pressure-transition-period",
            "3s",
        ],
    );
    // The node is quiet: no pressure yet.
    wait_node_condition(&agent, "MemoryPressure", "False", Duration::from_secs(15));

    agent.write_manifest(
        "steady.yaml",
        &pod(
            "steady",
            "    resources:\n      requests: {cpu: 100m, memory: 32Mi}\n      limits: {cpu: 100m, memory: 32Mi}\n",
            "exec sleep 3600",
        ),
    );
    let steady = agent.wait_pod(
        "default",
        "steady",
        Duration::from_secs(30),
        "running",
        |p| running(p, "main"),
    );
    assert_eq!(steady["status"]["qosClass"], "Guaranteed");

    agent.write_manifest("hog.yaml", &pod("hog", "", MEMORY_HOG));
    let evicted = agent.wait_pod("default", "hog", Duration::from_secs(60), "evicted", |p| {
        phase(p) == "Failed" && p["status"]["reason"] == "Evicted"
    });
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("memory") && message.contains("memory.available"),
        "{message}"
    );
    let disruption = pod_condition(&evicted, "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(disruption["status"], "True");
    assert_eq!(disruption["reason"], "TerminationByKubelet");
    assert_eq!(evicted["status"]["qosClass"], "BestEffort");

    // Its containers stop and it is not started again.
    let hog_pod = agent.wait_pod("default", "hog", Duration::from_secs(30), "stopped", |p| {
        !running(p, "main")
    });
    assert_eq!(phase(&hog_pod), "Failed");
    assert_eq!(
        node_condition(&agent, "MemoryPressure").as_deref(),
        Some("True")
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(!running(&agent.pod("default", "hog").unwrap(), "main"));

    // The Guaranteed pod was spared.
    let steady = agent.pod("default", "steady").unwrap();
    assert!(running(&steady, "main"), "{steady}");
    assert_eq!(phase(&steady), "Running");

    // The pressure ends after the transition period.
    wait_node_condition(&agent, "MemoryPressure", "False", Duration::from_secs(30));

    // The summary of the last pass, in kubelet's shape.
    let (code, body) = agent.get("/stats/summary").unwrap();
    assert_eq!(code, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(summary["node"]["nodeName"], agent.node_name.as_str());
    assert!(
        summary["node"]["memory"]["workingSetBytes"]
            .as_i64()
            .unwrap()
            > 0
    );
    assert_eq!(
        summary["node"]["memory"]["availableBytes"]
            .as_i64()
            .unwrap()
            + summary["node"]["memory"]["workingSetBytes"]
                .as_i64()
                .unwrap(),
        (256 * MI) as i64,
        "{body}"
    );
    assert!(summary["node"]["fs"]["capacityBytes"].as_i64().unwrap() > 0);
    assert!(
        summary["node"]["runtime"]["imageFs"]["capacityBytes"]
            .as_i64()
            .unwrap()
            > 0
    );
    let pods = summary["pods"].as_array().unwrap();
    let steady = pods
        .iter()
        .find(|p| p["podRef"]["name"] == "steady")
        .expect("steady in the summary");
    assert!(
        steady["memory"]["workingSetBytes"].as_i64().unwrap() > 0,
        "{steady}"
    );
    assert!(
        steady["process_stats"]["process_count"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "{steady}"
    );
    assert_eq!(steady["containers"][0]["name"], "main", "{steady}");
    assert!(
        steady["cpu"]["usageCoreNanoSeconds"].as_u64().is_some(),
        "{steady}"
    );

    let (_, metrics) = agent.get("/metrics").unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kubelet_evictions{eviction_signal=\"memory.available\"} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains("kubelet_eviction_stats_age_seconds_count"),
        "{metrics}"
    );
    let log = agent.log();
    assert!(log.contains("memory threshold armed"), "{log}");
    // The threshold crossing itself ran the pass that evicted (v1: the
    // kernel's eventfd; v2: the watch of memory.current near the
    // threshold): from the notification to the eviction's decision took
    // little time (the benchmark measures this properly).
    let evict_at = log.find("evicting pod").expect("an eviction in the log");
    let notified_at = log[..evict_at]
        .rfind("eviction pass on notification")
        .unwrap_or_else(|| {
            let rel: Vec<&str> = log
                .lines()
                .filter(|l| {
                    l.contains("evict") || l.contains("threshold") || l.contains("notification")
                })
                .collect();
            panic!(
                "no pass on notification before the eviction:\n{}",
                rel.join("\n")
            )
        });
    let stamp = |i: usize| -> k8s_openapi::jiff::Timestamp {
        let line_start = log[..i].rfind('\n').map_or(0, |n| n + 1);
        let word = log[line_start..].split_whitespace().next().unwrap();
        word.parse()
            .unwrap_or_else(|e| panic!("timestamp {word:?}: {e}"))
    };
    let latency = stamp(evict_at).duration_since(stamp(notified_at));
    eprintln!("notification to eviction decision: {latency:?}");
    assert!(latency.as_secs_f64() < 1.0, "{latency:?}");

    // A restarted agent keeps the pod evicted (it is not started again)
    // and adopts the Guaranteed one.
    let mut agent = agent;
    agent.terminate();
    agent.restart();
    let hog = agent.wait_pod(
        "default",
        "hog",
        Duration::from_secs(30),
        "evicted again",
        |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted",
    );
    assert!(!running(&hog, "main"), "{hog}");
    agent.wait_pod(
        "default",
        "steady",
        Duration::from_secs(30),
        "running",
        |p| running(p, "main"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let hog = agent.pod("default", "hog").unwrap();
    assert!(!running(&hog, "main"), "{hog}");
    assert!(agent
        .log()
        .contains("pod stays evicted across the agent's restart"));
}

#[tokio::test(flavor = "multi_thread")]
async fn pid_pressure_should_evict_the_forking_pod_and_refuse_new_pods() {
    let node = Node::start_with_busybox().await;
    let cgroup = format!("{}/node", node.cgroup_parent);
    let pids = Node::make_cgroup("pids", &cgroup).expect("create the node's pids cgroup");
    std::fs::write(pids.join("pids.max"), "150").expect("limit the node's pids");
    let agent = Agent::for_node(
        &node,
        &[
            "--node-cgroup",
            &cgroup,
            "--eviction-hard",
            "pid.available<70",
            "--eviction-pressure-transition-period",
            "60s",
            "--system-reserved",
            "memory=64Mi",
            "--kube-reserved",
            "memory=32Mi,pid=10",
        ],
    );
    agent.write_manifest("steady.yaml", &pod("steady", "", "exec sleep 3600"));
    agent.wait_pod(
        "default",
        "steady",
        Duration::from_secs(30),
        "running",
        |p| running(p, "main"),
    );

    // 100 processes, 20 a second: past 80 in use (150 - 70) but under the
    // limit of 150.
    let forker = "i=0; while [ $i -lt 100 ]; do sleep 3600 & i=$((i+1)); sleep 0.05; done; wait";
    agent.write_manifest("forker.yaml", &pod("forker", "", forker));
    let evicted = agent.wait_pod(
        "default",
        "forker",
        Duration::from_secs(60),
        "evicted",
        |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted",
    );
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("pid.available"), "{message}");
    assert_eq!(
        node_condition(&agent, "PIDPressure").as_deref(),
        Some("True")
    );
    let steady = agent.pod("default", "steady").unwrap();
    assert!(running(&steady, "main"), "{steady}");

    // Under PID pressure (held for the transition period) a new pod that
    // is not critical is refused, with kubelet's reason.
    agent.write_manifest("late.yaml", &pod("late", "", "exec sleep 3600"));
    let late = agent.wait_pod("default", "late", Duration::from_secs(30), "refused", |p| {
        phase(p) == "Failed"
    });
    assert_eq!(late["status"]["reason"], "Evicted");
    let message = late["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("PIDPressure"), "{message}");
    assert!(!running(&late, "main"));
}

/// Mounts a tmpfs of `size` at `dir` (under the node's directory, whose
/// mounts the node's cleanup removes).
fn small_fs(dir: &std::path::Path, size: &str) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let st = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0755"),
            "tmpfs",
        ])
        .arg(dir)
        .status()
        .expect("mount");
    assert!(st.success(), "mount tmpfs on {}", dir.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_pressure_should_evict_by_local_storage_limits_then_by_usage() {
    let node = Node::start_with_busybox().await;
    let root = node.dir.path().join("agent-root");
    small_fs(&root, "32m");
    let agent = disk_agent(&node, &root, "nodefs.available<50%", "60s", &[]);
    agent.write_manifest(
        "steady.yaml",
        &pod(
            "steady",
            "    resources:\n      requests: {cpu: 100m, memory: 32Mi}\n      limits: {cpu: 100m, memory: 32Mi}\n",
            "exec sleep 3600",
        ),
    );
    agent.wait_pod(
        "default",
        "steady",
        Duration::from_secs(30),
        "running",
        |p| running(p, "main"),
    );

    // An emptyDir past its sizeLimit: evicted at once, its volume removed.
    let with_scratch = |name: &str, limit: &str, mb: u32| {
        pod(
            name,
            "    volumeMounts: [{name: scratch, mountPath: /scratch}]\n",
            &format!("dd if=/dev/zero of=/scratch/f bs=1M count={mb} && exec sleep 3600"),
        )
        .replace(
            "  containers:\n",
            &format!("  volumes: [{{name: scratch, emptyDir: {{{limit}}}}}]\n  containers:\n"),
        )
    };
    agent.write_manifest("filler.yaml", &with_scratch("filler", "sizeLimit: 4Mi", 6));
    let filler = agent.wait_pod(
        "default",
        "filler",
        Duration::from_secs(30),
        "evicted",
        |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted",
    );
    let message = filler["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("EmptyDir volume \"scratch\" exceeds the limit \"4Mi\""),
        "{message}"
    );
    let uid = filler["metadata"]["uid"].as_str().unwrap().to_string();
    let start = Instant::now();
    while root.join("pods").join(&uid).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the evicted pod's volumes stay"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        node_condition(&agent, "DiskPressure").as_deref(),
        Some("False")
    );

    // A pod filling the node's filesystem past the threshold: node-level
    // reclaim first, then the biggest user is evicted; the other stays.
    agent.write_manifest("writer.yaml", &with_scratch("writer", "", 20));
    let writer = agent.wait_pod(
        "default",
        "writer",
        Duration::from_secs(60),
        "evicted",
        |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted",
    );
    let message = writer["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("nodefs.available") && message.contains("ephemeral-storage"),
        "{message}"
    );
    assert_eq!(
        node_condition(&agent, "DiskPressure").as_deref(),
        Some("True")
    );
    let steady = agent.pod("default", "steady").unwrap();
    assert!(running(&steady, "main"), "{steady}");
    let log = agent.log();
    // The writer's eviction is the last; node-level reclaim ran before it.
    let evict = log.rfind("evicting pod").expect("an eviction in the log");
    assert!(
        log[..evict].contains("node-level reclaim"),
        "no reclaim before the eviction:\n{log}"
    );
    let (_, metrics) = agent.get("/metrics").unwrap();
    assert!(
        metrics.contains("kubelet_evictions{eviction_signal=\"emptydirfs.limit\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kubelet_evictions{eviction_signal=\"nodefs.available\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_soft_threshold_should_wait_out_its_grace_period() {
    let node = Node::start_with_busybox().await;
    let cgroup = node_cgroup(&node, 256 * MI);
    let agent = Agent::for_node(
        &node,
        &[
            "--node-cgroup",
            &cgroup,
            "--eviction-hard",
            "memory.available<0%",
            "--eviction-soft",
            "memory.available<64Mi",
            "--eviction-soft-grace-period",
            "memory.available=4s",
            "--eviction-max-pod-grace-period",
            "2",
            "--eviction-monitoring-interval",
            "500ms",
        ],
    );
    agent.write_manifest("hog.yaml", &pod("hog", "", MEMORY_HOG));
    // Pressure shows as soon as the soft threshold is met...
    wait_node_condition(&agent, "MemoryPressure", "True", Duration::from_secs(60));
    let pressure_at = Instant::now();
    // ...but the pod is evicted only after the grace period.
    let evicted = agent.wait_pod("default", "hog", Duration::from_secs(30), "evicted", |p| {
        phase(p) == "Failed" && p["status"]["reason"] == "Evicted"
    });
    let waited = pressure_at.elapsed();
    assert!(
        waited >= Duration::from_millis(3500),
        "evicted after {waited:?}"
    );
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("memory.available"), "{message}");
    agent.wait_pod("default", "hog", Duration::from_secs(30), "stopped", |p| {
        !running(p, "main")
    });
}

/// A pod's files under the agent's root: its container's log directory.
fn log_dir(agent: &Agent, pod: &Value) -> std::path::PathBuf {
    agent.root.join("logs").join(format!(
        "default_{}_{}",
        pod["metadata"]["name"].as_str().unwrap(),
        pod["metadata"]["uid"].as_str().unwrap()
    ))
}

fn restart_count(pod: &Value) -> i64 {
    petrel_testkit::agent::container_status(pod, "main")
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or(0)
}

/// Starts pod `chatty`: its first instance writes 14 MB of logs and fails;
/// the second (an emptyDir remembers the first) sleeps. The dead first
/// instance and its log stay (the newest exited instance is kept). Returns
/// the directory of its container's logs.
async fn start_chatty(agent: &Agent, node: &Node) -> std::path::PathBuf {
    let line = "x".repeat(999);
    let script = format!(
        "if [ -e /state/done ]; then exec sleep 3600; fi; touch /state/done; yes {line} | head -c 14000000; exit 1"
    );
    let chatty = pod(
        "chatty",
        "    volumeMounts: [{name: state, mountPath: /state}]\n",
        &script,
    )
    .replace(
        "  containers:\n",
        "  volumes: [{name: state, emptyDir: {}}]\n  containers:\n",
    );
    agent.write_manifest("chatty.yaml", &chatty);
    let p = agent.wait_pod(
        "default",
        "chatty",
        Duration::from_secs(90),
        "restarted",
        |p| running(p, "main") && restart_count(p) >= 1,
    );
    let logs = log_dir(agent, &p).join("main");
    let first_log = logs.join("0.log");
    let size = std::fs::metadata(&first_log)
        .map(|m| m.len())
        .unwrap_or_else(|e| panic!("{}: {e}", first_log.display()));
    assert!(size > 13_000_000, "the first instance's log: {size} bytes");
    assert!(logs.join("1.log").exists());
    assert_eq!(dead(&agent.runtime_containers(node).await), 1);
    assert_eq!(
        node_condition(agent, "DiskPressure").as_deref(),
        Some("False")
    );
    logs
}

fn dead(cs: &[petrel_cri::api::Container]) -> usize {
    cs.iter()
        .filter(|c| c.state == petrel_cri::api::ContainerState::ContainerExited as i32)
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn node_level_reclaim_should_remove_dead_containers_with_their_logs_before_evicting() {
    let node = Node::start_with_busybox().await;
    let root = node.dir.path().join("agent-root");
    small_fs(&root, "32m");
    let agent = disk_agent(&node, &root, "nodefs.available<40%", "5s", &[]);
    let logs = start_chatty(&agent, &node).await;
    let first_log = logs.join("0.log");

    // The node fills up (8 MB the test writes): past the threshold, only
    // the dead container's log can make room.
    std::fs::write(root.join("ballast"), vec![1u8; 8 << 20]).expect("ballast");
    let start = Instant::now();
    while first_log.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the dead container's log stays:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its container is gone from the runtime; nobody was evicted. The log
    // is deleted before the pass observes the node again and says so.
    assert_eq!(dead(&agent.runtime_containers(&node).await), 0);
    petrel_testkit::wait::eventually(Duration::from_secs(30), || {
        let log = agent.log();
        log.contains("relieved the pressure") || log.contains("evicting pod")
    })
    .await;
    let log = agent.log();
    assert!(
        log.contains("node-level reclaim relieved the pressure; no eviction"),
        "{log}"
    );
    let reclaim = log
        .lines()
        .find(|l| l.contains("node-level reclaim") && l.contains("removed_containers=1"))
        .unwrap_or_else(|| panic!("no reclaim of one container:\n{log}"));
    let freed: i64 = reclaim
        .split("freed_log_bytes=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(freed > 13_000_000, "{reclaim}");
    assert!(!log.contains("evicting pod"), "{log}");
    let p = agent.pod("default", "chatty").unwrap();
    assert!(running(&p, "main"), "{p}");
    assert!(
        logs.join("1.log").exists(),
        "the live container's log stays"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn minimum_reclaim_should_evict_when_node_level_reclaim_frees_too_little() {
    let node = Node::start_with_busybox().await;
    let root = node.dir.path().join("agent-root");
    small_fs(&root, "32m");
    // Threshold 40 % of 32 MiB (12.8 MiB available); with the minimum
    // reclaim, pressure ends only above 24.8 MiB available.
    let agent = disk_agent(
        &node,
        &root,
        "nodefs.available<40%",
        "5s",
        &["--eviction-minimum-reclaim", "nodefs.available=12Mi"],
    );
    let logs = start_chatty(&agent, &node).await;
    let first_log = logs.join("0.log");

    // 8 MiB of ballast: past the threshold. Reclaiming the dead container's
    // 14 MB log brings the node back above 40 % but not above 40 % plus the
    // minimum reclaim, so a pod is evicted after the reclaim.
    std::fs::write(root.join("ballast"), vec![1u8; 8 << 20]).expect("ballast");
    let p = agent.wait_pod(
        "default",
        "chatty",
        Duration::from_secs(60),
        "evicted",
        |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted",
    );
    assert!(
        !first_log.exists(),
        "reclaim removed the dead instance's log"
    );
    let message = p["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("nodefs.available"), "{message}");
    let log = agent.log();
    assert!(
        !log.contains("node-level reclaim relieved the pressure"),
        "{log}"
    );
    let evict = log.find("evicting pod").expect("an eviction in the log");
    assert!(
        log[..evict].contains("removed_containers=1"),
        "no reclaim of the dead container before the eviction:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_ranking_should_count_writable_layers_on_the_node_filesystem() {
    // The runtime's root (images, writable layers) and the agent's root on
    // one small filesystem, as on a node without a separate imagefs.
    let node = Node::start_on_tmpfs("64m");
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let root = node.root.join("agent-root");
    let agent = disk_agent(&node, &root, "nodefs.available<50%", "60s", &[]);
    // 10 MB in an emptyDir...
    agent.write_manifest(
        "volume.yaml",
        &pod(
            "volume",
            "    volumeMounts: [{name: scratch, mountPath: /scratch}]\n",
            "dd if=/dev/zero of=/scratch/f bs=1M count=10 && exec sleep 3600",
        )
        .replace(
            "  containers:\n",
            "  volumes: [{name: scratch, emptyDir: {}}]\n  containers:\n",
        ),
    );
    agent.wait_pod(
        "default",
        "volume",
        Duration::from_secs(30),
        "running",
        |p| running(p, "main"),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        node_condition(&agent, "DiskPressure").as_deref(),
        Some("False")
    );
    // ...then 24 MB in a container's writable layer: the node's
    // filesystem passes half full, and the writable layer makes that pod
    // the biggest user.
    agent.write_manifest(
        "layer.yaml",
        &pod(
            "layer",
            "",
            "dd if=/dev/zero of=/fill bs=1M count=24 && exec sleep 3600",
        ),
    );
    let evicted = agent.wait_pod(
        "default",
        "layer",
        Duration::from_secs(60),
        "evicted",
        |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted",
    );
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("nodefs.available"), "{message}");
    // Its stopped container is reclaimed at the next pass (its writable
    // layer with it), which relieves the node: the other pod stays.
    let start = Instant::now();
    while !agent
        .log()
        .contains("node-level reclaim relieved the pressure; no eviction")
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no relief by reclaim:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    let volume = agent.pod("default", "volume").unwrap();
    assert!(running(&volume, "main"), "{volume}");
    assert_eq!(agent.log().matches("evicting pod").count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_summary_should_show_volumes_writable_layers_logs_and_ephemeral_storage() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(
        &node,
        &[
            "--eviction-hard",
            "memory.available<1Mi",
            "--eviction-monitoring-interval",
            "1s",
        ],
    );
    // 3 MiB in an emptyDir, 5 MiB in the writable layer, 1 MB of logs.
    let script = "dd if=/dev/zero of=/scratch/f bs=1M count=3 && dd if=/dev/zero of=/layer bs=1M count=5 && yes 0123456789 | head -c 1000000 && exec sleep 3600";
    agent.write_manifest(
        "writer.yaml",
        &pod(
            "writer",
            "    volumeMounts: [{name: scratch, mountPath: /scratch}]\n",
            script,
        )
        .replace(
            "  containers:\n",
            "  volumes: [{name: scratch, emptyDir: {}}]\n  containers:\n",
        ),
    );
    agent.wait_pod(
        "default",
        "writer",
        Duration::from_secs(30),
        "running",
        |p| running(p, "main"),
    );
    let start = Instant::now();
    let writer = loop {
        let (code, body) = agent.get("/stats/summary").unwrap();
        assert_eq!(code, 200, "{body}");
        let summary: Value = serde_json::from_str(&body).unwrap();
        let found = summary["pods"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["podRef"]["name"] == "writer").cloned());
        if let Some(p) = found {
            let logs = p["containers"][0]["logs"]["usedBytes"]
                .as_i64()
                .unwrap_or(0);
            if logs >= 1_000_000 {
                break p;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no complete summary of the writer:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let mib = 1i64 << 20;
    let rootfs = &writer["containers"][0]["rootfs"];
    assert!(rootfs["usedBytes"].as_i64().unwrap() >= 5 * mib, "{writer}");
    assert!(rootfs["inodesUsed"].as_i64().unwrap() >= 1, "{writer}");
    assert!(rootfs["capacityBytes"].as_i64().unwrap() > 0, "{writer}");
    let logs = &writer["containers"][0]["logs"];
    assert!(logs["capacityBytes"].as_i64().unwrap() > 0, "{writer}");
    let volume = writer["volume"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "scratch"))
        .unwrap_or_else(|| panic!("no scratch volume: {writer}"));
    assert!(volume["usedBytes"].as_i64().unwrap() >= 3 * mib, "{writer}");
    assert!(volume["inodesUsed"].as_i64().unwrap() >= 1, "{writer}");
    assert!(volume["capacityBytes"].as_i64().unwrap() > 0, "{writer}");
    let eph = &writer["ephemeral-storage"];
    let used = eph["usedBytes"].as_i64().unwrap();
    assert!(
        used >= rootfs["usedBytes"].as_i64().unwrap()
            + logs["usedBytes"].as_i64().unwrap()
            + volume["usedBytes"].as_i64().unwrap(),
        "{writer}"
    );
    assert!(used < 20 * mib, "{writer}");
    assert!(eph["availableBytes"].as_i64().unwrap() > 0, "{writer}");

    // A container's writable layer counts toward its ephemeral-storage
    // limit: 6 MiB written in its root over a 4Mi limit evicts the pod.
    agent.write_manifest(
        "limited.yaml",
        &pod(
            "limited",
            "    resources:\n      limits: {ephemeral-storage: 4Mi}\n",
            "dd if=/dev/zero of=/fill bs=1M count=6 && exec sleep 3600",
        ),
    );
    let evicted = agent.wait_pod(
        "default",
        "limited",
        Duration::from_secs(30),
        "evicted",
        |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted",
    );
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("Container main exceeded its local ephemeral storage limit"),
        "{message}"
    );
    let writer = agent.pod("default", "writer").unwrap();
    assert!(running(&writer, "main"), "{writer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn node_allocatable_should_follow_the_node_cgroups_limit() {
    let node = Node::start_with_busybox().await;
    let cgroup = node_cgroup(&node, 256 * MI);
    let agent = Agent::for_node(
        &node,
        &[
            "--node-cgroup",
            &cgroup,
            "--system-reserved",
            "memory=64Mi",
            "--eviction-hard",
            "memory.available<1Mi",
            "--eviction-monitoring-interval",
            "1s",
        ],
    );
    let pods_limit =
        Node::cgroup_dir("memory", &format!("{cgroup}/kubepods")).join(Node::memory_limit_file());
    let wait_limit = |want: u64| {
        let start = Instant::now();
        loop {
            let now = std::fs::read_to_string(&pods_limit)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            if now == Some(want) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "pods' cgroup limit {now:?}, want {want}:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let allocatable = || -> Option<String> {
        let (_, body) = agent.get("/node")?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["status"]["allocatable"]["memory"]
            .as_str()
            .map(str::to_string)
    };
    wait_limit(192 * MI);
    // The node grows: allocatable follows at the next pass.
    let node_limit = Node::cgroup_dir("memory", &cgroup).join(Node::memory_limit_file());
    std::fs::write(&node_limit, (320 * MI).to_string()).unwrap();
    wait_limit(256 * MI);
    let start = Instant::now();
    while allocatable().as_deref() != Some(&(256 * MI).to_string()) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "allocatable {:?}",
            allocatable()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // And shrinks.
    std::fs::write(&node_limit, (200 * MI).to_string()).unwrap();
    wait_limit(136 * MI);
    assert!(
        agent
            .log()
            .contains("node capacity changed: node allocatable re-applied"),
        "{}",
        agent.log()
    );
}

/// PSI through the agent: the node cgroup also exists in the cgroup2
/// hierarchy (on this hybrid host, `/sys/fs/cgroup/unified`, where runc
/// places the pods' processes too and the kernel accounts their memory
/// stalls), so the agent arms its PSI trigger there; a pod thrashing its
/// page cache under a small memory limit stalls, and that alone runs a
/// pass (the periodic one is minutes away and no memory threshold is
/// near).
#[tokio::test(flavor = "multi_thread")]
async fn memory_stalls_in_the_node_should_run_a_pass_through_psi() {
    let node = Node::start_with_busybox().await;
    let cgroup = node_cgroup(&node, 256 * MI);
    let unified = std::path::Path::new("/sys/fs/cgroup/unified");
    let dir = if unified.join("cgroup.procs").exists() {
        unified.join(cgroup.trim_start_matches('/'))
    } else {
        // A pure v2 host: the node cgroup is already in the only hierarchy.
        Node::cgroup_dir("", &cgroup)
    };
    std::fs::create_dir_all(&dir).expect("the node cgroup in the cgroup2 hierarchy");
    let agent = Agent::for_node(
        &node,
        &[
            "--node-cgroup",
            &cgroup,
            "--eviction-hard",
            "memory.available<1Mi",
            "--eviction-monitoring-interval",
            "5m",
        ],
    );
    let armed = format!("path={}", dir.join("memory.pressure").display());
    let start = Instant::now();
    while !agent.log().lines().any(|l| {
        l.contains("memory pressure (PSI) trigger armed")
            && l.contains(&armed)
            && l.contains("some 100000 2000000")
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no PSI trigger armed on {armed}:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let passes = || agent.log().matches("eviction pass on notification").count();
    let before = passes();
    agent.write_manifest(
        "thrasher.yaml",
        &pod(
            "thrasher",
            "    resources:\n      limits: {memory: 16Mi}\n",
            "head -c 67108864 /dev/urandom > /f; while :; do cat /f > /dev/null; done",
        ),
    );
    agent.wait_pod(
        "default",
        "thrasher",
        Duration::from_secs(30),
        "running",
        |p| running(p, "main"),
    );
    let start = Instant::now();
    while passes() <= before {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no pass on a PSI notification; {}:\n{}",
            std::fs::read_to_string(dir.join("memory.pressure")).unwrap_or_default(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Stalls are no memory pressure in kubelet's sense: nothing evicted.
    assert_eq!(
        node_condition(&agent, "MemoryPressure").as_deref(),
        Some("False")
    );
    assert!(!agent.log().contains("evicting pod"));
}
