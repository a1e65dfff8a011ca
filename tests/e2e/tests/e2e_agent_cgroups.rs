//! End-to-end: the agent's QoS and pod cgroups, as kubelet's container
//! manager keeps them, read from the real cgroup files of a Guaranteed, a
//! Burstable and a BestEffort static pod. The files are read by the
//! host's cgroup version, so the test runs unchanged on v1 and v2.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use petrel_oci::cgroups::{CgroupVersion, Cgroups};
use petrel_testkit::agent::{phase, pod_yaml, running, sh_container as sh, Agent};
use petrel_testkit::prelude::Node;

const T: Duration = Duration::from_secs(30);
const MI: i64 = 1024 * 1024;

/// The CPUs the agent counts: `/sys/devices/system/cpu/online` ("0-3,6").
fn online_cpus() -> i64 {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    text.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<i64>().unwrap() - a.parse::<i64>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// kubelet's MilliCPUToShares.
fn shares(millis: i64) -> i64 {
    (millis * 1024 / 1000).clamp(2, 262_144)
}

/// Reads the host's cgroup files by version.
struct Files {
    cg: Cgroups,
}

impl Files {
    fn v2(&self) -> bool {
        self.cg.version() == CgroupVersion::V2
    }

    fn read(&self, controller: &str, path: &str, file: &str) -> String {
        self.cg
            .read(controller, path, file)
            .unwrap_or_else(|e| panic!("{path}/{file}: {e}"))
            .trim()
            .to_string()
    }

    /// cpu shares as written: v1 `cpu.shares`; v2 `cpu.weight`, compared
    /// with the weight of `want`.
    fn assert_shares(&self, path: &str, want: i64) {
        if self.v2() {
            let weight = 1 + ((want - 2) * 9999) / 262_142;
            assert_eq!(
                self.read("cpu", path, "cpu.weight"),
                weight.to_string(),
                "{path}"
            );
        } else {
            assert_eq!(
                self.read("cpu", path, "cpu.shares"),
                want.to_string(),
                "{path}"
            );
        }
    }

    /// [`Files::assert_shares`] once the agent has had up to 10 s to
    /// write them: a pod leaves its tier just after its status goes.
    fn eventually_shares(&self, path: &str, want: i64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = std::panic::catch_unwind(|| self.assert_shares(path, want));
            match r {
                Ok(()) => return,
                Err(e) if std::time::Instant::now() > deadline => std::panic::resume_unwind(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The CFS quota (None: unlimited) over kubelet's 100 ms period.
    fn assert_quota(&self, path: &str, want: Option<i64>) {
        if self.v2() {
            let q = want.map_or("max".to_string(), |q| q.to_string());
            assert_eq!(
                self.read("cpu", path, "cpu.max"),
                format!("{q} 100000"),
                "{path}"
            );
        } else {
            let q = want.unwrap_or(-1).to_string();
            assert_eq!(self.read("cpu", path, "cpu.cfs_quota_us"), q, "{path}");
            if want.is_some() {
                assert_eq!(self.read("cpu", path, "cpu.cfs_period_us"), "100000");
            }
        }
    }

    /// The memory limit (None: unlimited; v1 says so with a huge number).
    fn assert_memory(&self, path: &str, want: Option<i64>) {
        let file = if self.v2() {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        let got = self.read("memory", path, file);
        match want {
            Some(w) => assert_eq!(got, w.to_string(), "{path}"),
            None if self.v2() => assert_eq!(got, "max", "{path}"),
            None => assert!(got.parse::<u64>().unwrap() > 1 << 60, "{path}: {got}"),
        }
    }

    /// Whether cgroup `path` is in any hierarchy the agent writes.
    fn exists(&self, path: &str) -> bool {
        ["cpu", "memory", "pids"]
            .iter()
            .any(|c| self.cg.dir(c, path).is_ok_and(|d| d.exists()))
    }
}

fn container(name: &str, resources: &str) -> String {
    format!(
        "{}    resources: {resources}\n",
        sh(name, "exec sleep 3600")
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_keep_kubelets_qos_and_pod_cgroups() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(
        &node,
        &["--pod-max-pids", "200", "--kube-reserved", "cpu=500m"],
    );
    let files = Files {
        cg: Cgroups::detect().unwrap(),
    };
    let kubepods = format!("{}/kubepods", node.cgroup_parent);
    let burstable = format!("{kubepods}/burstable");
    let besteffort = format!("{kubepods}/besteffort");

    // The tiers, once the agent reached its runtime: kubepods weighs node
    // allocatable cpu.
    let deadline = std::time::Instant::now() + T;
    while !files.exists(&burstable) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // (The directories are made before their values are written.)
    files.eventually_shares(&kubepods, shares(online_cpus() * 1000 - 500));
    files.eventually_shares(&besteffort, 2);
    files.eventually_shares(&burstable, 2);

    let pods = [
        (
            "guaranteed",
            container("g", "{limits: {cpu: 250m, memory: 64Mi}}"),
        ),
        (
            "burstable",
            container(
                "b",
                "{requests: {cpu: 100m, memory: 16Mi}, limits: {cpu: 200m, memory: 32Mi}}",
            ),
        ),
        ("burstable-open", container("o", "{requests: {cpu: 200m}}")),
        ("besteffort", container("e", "{}")),
    ];
    for (name, c) in &pods {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &pod_yaml(name, "  terminationGracePeriodSeconds: 1\n", c),
        );
    }
    let mut uids = Vec::new();
    for (name, c) in &pods {
        let first = &c[4..c.find('\n').unwrap()].replace("name: ", "");
        let p = agent.wait_pod("default", name, T, "running", |p| {
            phase(p) == "Running" && running(p, first)
        });
        uids.push(p["metadata"]["uid"].as_str().unwrap().to_string());
    }
    let guaranteed = format!("{kubepods}/pod{}", uids[0]);
    let limited = format!("{burstable}/pod{}", uids[1]);
    let open = format!("{burstable}/pod{}", uids[2]);
    let best = format!("{besteffort}/pod{}", uids[3]);

    // The burstable tier weighs its pods' requests: 100m + 200m.
    files.assert_shares(&burstable, shares(300));
    files.assert_shares(&besteffort, 2);

    // Guaranteed: requests, limits and --pod-max-pids.
    files.assert_shares(&guaranteed, shares(250));
    files.assert_quota(&guaranteed, Some(25_000));
    files.assert_memory(&guaranteed, Some(64 * MI));
    assert_eq!(files.read("pids", &guaranteed, "pids.max"), "200");
    // Burstable with every limit: both enforced on the pod.
    files.assert_shares(&limited, shares(100));
    files.assert_quota(&limited, Some(20_000));
    files.assert_memory(&limited, Some(32 * MI));
    // Burstable without limits: none on the pod.
    files.assert_shares(&open, shares(200));
    files.assert_quota(&open, None);
    files.assert_memory(&open, None);
    // BestEffort: the minimum weight.
    files.assert_shares(&best, 2);
    files.assert_memory(&best, None);
    assert_eq!(files.read("pids", &best, "pids.max"), "200");

    // Removed pods take the cgroups the agent made with them; the tiers
    // stay, the burstable one weighs what is left.
    for name in ["guaranteed", "burstable", "besteffort"] {
        agent.remove_manifest(&format!("{name}.yaml"));
        agent.wait_gone("default", name, T);
    }
    for cg in [&guaranteed, &limited, &best] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while files.exists(cg) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!files.exists(cg), "{cg} left\n{}", agent.log());
    }
    assert!(files.exists(&open));
    files.eventually_shares(&burstable, shares(200));
    agent.remove_manifest("burstable-open.yaml");
    agent.wait_gone("default", "burstable-open", T);
    files.eventually_shares(&burstable, 2);
    assert!(files.exists(&besteffort) && files.exists(&kubepods));
}
