//! End-to-end: the agent on the systemd cgroup driver, on Petrel's runtime
//! also on its systemd driver, where systemd is PID 1 on cgroup v2 (the
//! systemd test guest of `e2e_cgroup_v2`, which runs it). The QoS and pod
//! cgroups are slices the agent asks systemd for; the runtime's container
//! scopes go in the pod slices; node allocatable is the kubepods slice's
//! MemoryMax; an eviction reads the slices' files.
//!
//! The expected names are spelled out here (kubelet's: parts joined by
//! `-`, a part's own `-` as `_`), not computed by the agent's code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_oci::cgroups::{CgroupVersion, Cgroups};
use petrel_testkit::agent::{phase, pod_yaml, running, sh_container as sh, Agent, MEMORY_HOG};
use petrel_testkit::prelude::Node;

const T: Duration = Duration::from_secs(60);
const MI: i64 = 1024 * 1024;

/// Stops the test's root slice (and so every slice and scope under it)
/// when dropped, after the agent and the runtime: kubelet leaves its QoS
/// slices behind, a test may not.
struct StopSlice(Option<String>);

impl Drop for StopSlice {
    fn drop(&mut self) {
        if let Some(unit) = &self.0 {
            let _ = std::process::Command::new("systemctl")
                .args(["stop", unit])
                .status();
        }
    }
}

fn systemctl_show(unit: &str, property: &str) -> String {
    let out = std::process::Command::new("systemctl")
        .args(["show", "-P", property, unit])
        .output()
        .expect("systemctl");
    assert!(out.status.success(), "systemctl show {unit}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn read(cg: &Cgroups, path: &str, file: &str) -> String {
    cg.read("memory", path, file)
        .unwrap_or_else(|e| panic!("{path}/{file}: {e}"))
        .trim()
        .to_string()
}

/// kubelet's shares of `millis`, as v2's linear weight.
fn weight(millis: i64) -> i64 {
    let shares = (millis * 1024 / 1000).clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

fn eventually(what: &str, within: Duration, mut ok: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + within;
    loop {
        match ok() {
            None => return,
            Some(why) if Instant::now() > deadline => panic!("{what}: {why}"),
            Some(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Petrel's runtime on its systemd driver, with the busybox image: its
/// default parent the slice of the test's own cgroup parent
/// (`/petrel-test-x` → `petrel_test_x.slice`), in the driver's form.
async fn systemd_node() -> Node {
    let mut node = Node::prepare_with("cgroup_driver = \"systemd\"\n", "");
    let stem = node.cgroup_parent.trim_start_matches('/').replace('-', "_");
    let text = std::fs::read_to_string(&node.config_file).unwrap();
    let from = format!("default_cgroup_parent = {:?}", node.cgroup_parent);
    assert!(text.contains(&from), "{text}");
    let text = text.replace(&from, &format!("default_cgroup_parent = \"{stem}.slice\""));
    std::fs::write(&node.config_file, text).unwrap();
    node.spawn();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    node
}

fn mem_total() -> i64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("MemTotal");
    kb * 1024
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs systemd as PID 1 on cgroup v2: runs in the systemd guest (e2e_cgroup_v2)"]
async fn agent_on_the_systemd_driver_should_keep_qos_and_pod_slices() {
    let init = std::fs::read_to_string("/proc/1/comm").unwrap();
    assert_eq!(init.trim(), "systemd", "this test needs systemd as PID 1");
    let cg = Cgroups::detect().unwrap();
    assert_eq!(cg.version(), CgroupVersion::V2, "this test needs cgroup v2");

    let mut stop = StopSlice(None);
    let node = systemd_node().await;
    // The agent's root: the runtime's parent, as cgroupfs `/a-b` → the
    // slice `a_b.slice`.
    let stem = node.cgroup_parent.trim_start_matches('/').replace('-', "_");
    stop.0 = Some(format!("{stem}.slice"));
    let kubepods = format!("/{stem}.slice/{stem}-kubepods.slice");
    let burstable = format!("{kubepods}/{stem}-kubepods-burstable.slice");
    let besteffort = format!("{kubepods}/{stem}-kubepods-besteffort.slice");

    // Node allocatable: 512Mi reserved; the hog is evicted once the pods
    // use 48Mi of what is left.
    let allocatable = mem_total() - 512 * MI;
    let threshold = format!("allocatableMemory.available<{}Mi", allocatable / MI - 48);
    let agent = Agent::for_node(
        &node,
        &[
            "--cgroup-driver",
            "systemd",
            "--kube-reserved",
            "cpu=500m,memory=512Mi",
            "--eviction-hard",
            &threshold,
            "--eviction-pressure-transition-period",
            "3s",
        ],
    );

    // The QoS slices with their weights (2 cpus or more: read them).
    let cpus = std::thread::available_parallelism().unwrap().get() as i64;
    // (The burstable tier is made last.)
    eventually("QoS slices", T, || {
        for tier in [&besteffort, &burstable] {
            match cg.read("cpu", tier, "cpu.weight") {
                Ok(got) if got.trim() == "1" => {}
                Ok(got) => return Some(format!("{tier} cpu.weight {got}")),
                Err(e) => return Some(format!("{e}\n{}", agent.log())),
            }
        }
        None
    });
    assert_eq!(
        read(&cg, &kubepods, "cpu.weight"),
        weight(cpus * 1000 - 500).to_string()
    );
    assert_eq!(read(&cg, &burstable, "cpu.weight"), "1");
    assert_eq!(
        systemctl_show(&format!("{stem}-kubepods.slice"), "CPUWeight"),
        weight(cpus * 1000 - 500).to_string(),
        "{}",
        agent.log()
    );
    // Node allocatable: MemoryMax of the kubepods slice, set through
    // systemd (which would write over a bare file).
    eventually("node allocatable", T, || {
        let got = read(&cg, &kubepods, "memory.max");
        (got != allocatable.to_string()).then(|| format!("memory.max {got}"))
    });
    assert_eq!(
        systemctl_show(&format!("{stem}-kubepods.slice"), "MemoryMax"),
        allocatable.to_string()
    );

    // A burstable and a besteffort pod, each in its slice, their
    // containers in scopes inside.
    let limited = format!(
        "{}    resources: {{requests: {{cpu: 100m, memory: 16Mi}}, limits: {{cpu: 200m, memory: 32Mi}}}}\n",
        sh("b", "exec sleep 3600")
    );
    agent.write_manifest(
        "burstable.yaml",
        &pod_yaml(
            "burstable",
            "  terminationGracePeriodSeconds: 1\n",
            &limited,
        ),
    );
    agent.write_manifest(
        "besteffort.yaml",
        &pod_yaml(
            "besteffort",
            "  terminationGracePeriodSeconds: 1\n",
            &sh("e", "exec sleep 3600"),
        ),
    );
    let b = agent.wait_pod("default", "burstable", T, "running", |p| {
        phase(p) == "Running" && running(p, "b")
    });
    let e = agent.wait_pod("default", "besteffort", T, "running", |p| {
        phase(p) == "Running" && running(p, "e")
    });
    let uid = |p: &serde_json::Value| p["metadata"]["uid"].as_str().unwrap().replace('-', "_");
    let b_slice = format!("{burstable}/{stem}-kubepods-burstable-pod{}.slice", uid(&b));
    let e_slice = format!(
        "{besteffort}/{stem}-kubepods-besteffort-pod{}.slice",
        uid(&e)
    );
    assert_eq!(read(&cg, &b_slice, "cpu.weight"), weight(100).to_string());
    assert_eq!(read(&cg, &b_slice, "cpu.max"), "20000 100000");
    assert_eq!(read(&cg, &b_slice, "memory.max"), (32 * MI).to_string());
    assert_eq!(read(&cg, &e_slice, "cpu.weight"), "1");
    assert_eq!(read(&cg, &e_slice, "memory.max"), "max");
    assert_eq!(read(&cg, &burstable, "cpu.weight"), weight(100).to_string());
    for slice in [&b_slice, &e_slice] {
        let dir = cg.dir("memory", slice).unwrap();
        let scopes: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".scope"))
            .collect();
        assert!(!scopes.is_empty(), "no container scope in {slice}");
        let busy = scopes
            .iter()
            .any(|s| !read(&cg, &format!("{slice}/{s}"), "cgroup.procs").is_empty());
        assert!(busy, "no process in the scopes of {slice}: {scopes:?}");
    }

    // The summary reads the pod slices and the containers' scopes.
    eventually("summary of the pods", T, || {
        let Some((code, body)) = agent.get("/stats/summary") else {
            return Some("no answer".into());
        };
        let s: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let Some(pod) = s["pods"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["podRef"]["name"] == "burstable"))
            .cloned()
        else {
            return Some(format!("{code}: no burstable pod in {body}"));
        };
        let ws = pod["memory"]["workingSetBytes"].as_i64().unwrap_or(0);
        let containers = pod["containers"].as_array().map_or(0, Vec::len);
        (code != 200 || ws <= 0 || containers == 0)
            .then(|| format!("{code}: working set {ws}, {containers} containers"))
    });

    // Eviction: allocatable memory read from the kubepods slice, the
    // besteffort hog ranked from its slice; the burstable pod is spared.
    agent.write_manifest(
        "hog.yaml",
        &pod_yaml(
            "hog",
            "  terminationGracePeriodSeconds: 1\n",
            &sh("h", MEMORY_HOG),
        ),
    );
    let evicted = agent.wait_pod("default", "hog", T, "evicted", |p| {
        phase(p) == "Failed" && p["status"]["reason"] == "Evicted"
    });
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("allocatableMemory.available"), "{message}");
    assert!(running(&agent.pod("default", "burstable").unwrap(), "b"));

    // Removed pods take their slices; the QoS slices stay.
    for name in ["burstable", "besteffort", "hog"] {
        agent.remove_manifest(&format!("{name}.yaml"));
        agent.wait_gone("default", name, T);
    }
    for slice in [&b_slice, &e_slice] {
        eventually("pod slice removed", Duration::from_secs(20), || {
            let dir = cg.dir("memory", slice).unwrap();
            dir.exists()
                .then(|| format!("{slice} left\n{}", agent.log()))
        });
    }
    assert!(cg.dir("memory", &besteffort).unwrap().exists());
    eventually("burstable tier back", Duration::from_secs(20), || {
        let got = read(&cg, &burstable, "cpu.weight");
        (got != "1").then(|| format!("cpu.weight {got}"))
    });
    drop(agent);
    drop(node);
}
