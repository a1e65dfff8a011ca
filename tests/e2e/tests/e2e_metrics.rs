//! ListMetricDescriptors and ListPodSandboxMetrics against a real runtime:
//! a pod on a private CNI network, a runc container with limits; every
//! descriptor's metric is reported with its labels and type, and the
//! values move when the container works (CPU, memory, network).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_testkit::network::PodNetwork;
use petrel_testkit::prelude::*;

/// Metrics that need block I/O of the container's own (reads and writes
/// reaching a disk): present only when the kernel counted some.
const NEED_BLOCK_IO: &[&str] = &[
    "container_fs_reads_bytes_total",
    "container_fs_reads_total",
    "container_fs_writes_bytes_total",
    "container_fs_writes_total",
    "container_blkio_device_usage_total",
];

async fn pod_metrics(c: &mut Clients, pod: &str) -> api::PodSandboxMetrics {
    c.rt.list_pod_sandbox_metrics(api::ListPodSandboxMetricsRequest {})
        .await
        .expect("ListPodSandboxMetrics")
        .into_inner()
        .pod_metrics
        .into_iter()
        .find(|p| p.pod_sandbox_id == pod)
        .expect("the pod's metrics")
}

/// Every metric of the pod and its containers, by name.
fn by_name(p: &api::PodSandboxMetrics) -> HashMap<String, Vec<api::Metric>> {
    let mut out: HashMap<String, Vec<api::Metric>> = HashMap::new();
    let all = p
        .metrics
        .iter()
        .chain(p.container_metrics.iter().flat_map(|c| c.metrics.iter()));
    for m in all {
        out.entry(m.name.clone()).or_default().push(m.clone());
    }
    out
}

/// The value of `name` whose labels end with `suffix`.
fn value(p: &api::PodSandboxMetrics, name: &str, suffix: &[&str]) -> u64 {
    by_name(p)
        .get(name)
        .and_then(|ms| {
            ms.iter().find(|m| {
                m.label_values
                    .ends_with(&suffix.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            })
        })
        .and_then(|m| m.value.as_ref())
        .map(|v| v.value)
        .unwrap_or_else(|| panic!("{name} {suffix:?} not reported"))
}

/// Polls the pod's metrics until `ok` holds for `name` (labels ending with
/// `suffix`), or fails after `within`.
async fn wait_for(
    c: &mut Clients,
    pod: &str,
    name: &str,
    suffix: &[&str],
    within: Duration,
    ok: impl Fn(u64) -> bool,
) -> u64 {
    let start = Instant::now();
    loop {
        let v = value(&pod_metrics(c, pod).await, name, suffix);
        if ok(v) {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "{name} stayed at {v} for {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn pod_sandbox_metrics_should_report_every_descriptor_and_move_with_work() {
    let net = PodNetwork::new().expect("pod network");
    let node = Node::start_with(&net.cri_config());
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("metrics");
    let pod = c.run_pod(pc.clone()).await;
    let mut cfg = sh_container("worker", "sleep 1000");
    cfg.linux = Some(api::LinuxContainerConfig {
        resources: Some(api::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 150_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 256 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let ctr = c.run(&pod, &pc, cfg).await;

    // Descriptors: every reported metric has one, with as many label
    // values as it has keys and the same type each time.
    let descs =
        c.rt.list_metric_descriptors(api::ListMetricDescriptorsRequest {})
            .await
            .expect("ListMetricDescriptors")
            .into_inner()
            .descriptors;
    assert!(descs.len() >= 40, "{} descriptors", descs.len());
    let keys: HashMap<&str, &api::MetricDescriptor> =
        descs.iter().map(|d| (d.name.as_str(), d)).collect();
    let first = pod_metrics(&mut c, &pod).await;
    let found = by_name(&first);
    for d in &descs {
        assert!(
            !d.help.is_empty()
                && d.label_keys[..5] == ["pod", "namespace", "container", "id", "image"]
        );
        let Some(ms) = found.get(&d.name) else {
            assert!(
                NEED_BLOCK_IO.contains(&d.name.as_str()),
                "{} not reported",
                d.name
            );
            continue;
        };
        for m in ms {
            assert_eq!(m.label_values.len(), d.label_keys.len(), "{}", d.name);
            assert!(m.timestamp > 0);
        }
    }
    for (name, ms) in &found {
        assert!(keys.contains_key(name.as_str()), "{name} has no descriptor");
        let kind = ms[0].metric_type;
        assert!(ms.iter().all(|m| m.metric_type == kind), "{name}");
        let counter = kind == api::MetricType::Counter as i32;
        assert_eq!(
            counter,
            name.ends_with("_total") && name != "container_fs_inodes_total"
                || name == "container_memory_failcnt",
            "{name}"
        );
    }
    // Label values: the pod's and the container's own.
    let meta = pc.metadata.clone().unwrap();
    let cm = &first.container_metrics;
    assert_eq!(cm.len(), 1);
    assert_eq!(cm[0].container_id, ctr);
    let rss = cm[0]
        .metrics
        .iter()
        .find(|m| m.name == "container_memory_rss")
        .unwrap();
    assert_eq!(
        rss.label_values,
        [
            meta.name.clone(),
            meta.namespace.clone(),
            "worker".into(),
            ctr.clone(),
            BUSYBOX.to_string()
        ]
    );
    let eth0 = first
        .metrics
        .iter()
        .find(|m| m.name == "container_network_receive_bytes_total")
        .unwrap();
    assert_eq!(
        eth0.label_values,
        [
            meta.name,
            meta.namespace,
            String::new(),
            pod.clone(),
            String::new(),
            "eth0".into()
        ]
    );
    // The limits in force.
    assert_eq!(
        value(&first, "container_spec_memory_limit_bytes", &[]),
        256 << 20
    );
    // v2 keeps cpu.weight: 512 shares come back as the shares it stands for.
    let shares = if Node::cgroup_v2() {
        2 + (Node::cpu_weight(512) - 1) * 262_142 / 9_999
    } else {
        512
    };
    assert_eq!(value(&first, "container_spec_cpu_shares", &[]), shares);
    assert_eq!(value(&first, "container_spec_cpu_quota", &[]), 150_000);
    assert_eq!(value(&first, "container_spec_cpu_period", &[]), 100_000);
    assert!(value(&first, "container_processes", &[]) >= 1);
    assert!(value(&first, "container_file_descriptors", &[]) >= 3);

    // A second call within a second is answered from the kept readings.
    let again = pod_metrics(&mut c, &pod).await;
    assert_eq!(
        rss.timestamp,
        again.container_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == "container_memory_rss")
            .unwrap()
            .timestamp
    );

    // CPU: a busy loop in the background; the whole-second counter rises.
    let cpu0 = value(&first, "container_cpu_usage_seconds_total", &[]);
    let r = c
        .exec_sh(
            &ctr,
            "(while :; do :; done) > /dev/null 2>&1 & echo $! > /tmp/busy",
            10,
        )
        .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    wait_for(
        &mut c,
        &pod,
        "container_cpu_usage_seconds_total",
        &[],
        Duration::from_secs(90),
        |v| v >= cpu0 + 2,
    )
    .await;
    let user = value(
        &pod_metrics(&mut c, &pod).await,
        "container_cpu_user_seconds_total",
        &[],
    );
    assert!(user >= 1, "user seconds {user}");
    let r = c.exec_sh(&ctr, "kill $(cat /tmp/busy)", 10).await;
    assert_eq!(r.exit_code, 0, "{r:?}");

    // Memory: 40 MiB written to the pod's shm are charged to the container.
    let mem0 = value(
        &pod_metrics(&mut c, &pod).await,
        "container_memory_usage_bytes",
        &[],
    );
    let r = c
        .exec_sh(
            &ctr,
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 2>&1",
            30,
        )
        .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    wait_for(
        &mut c,
        &pod,
        "container_memory_usage_bytes",
        &[],
        Duration::from_secs(10),
        |v| v >= mem0 + (30 << 20),
    )
    .await;

    // Network: pings to the bridge's gateway leave by eth0 and come back.
    let tx0 = value(
        &pod_metrics(&mut c, &pod).await,
        "container_network_transmit_packets_total",
        &["eth0"],
    );
    let rx0 = value(
        &pod_metrics(&mut c, &pod).await,
        "container_network_receive_bytes_total",
        &["eth0"],
    );
    let r = c
        .exec_sh(&ctr, &format!("ping -c 3 -W 5 {}.1", net.prefix), 30)
        .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    wait_for(
        &mut c,
        &pod,
        "container_network_transmit_packets_total",
        &["eth0"],
        Duration::from_secs(10),
        |v| v >= tx0 + 3,
    )
    .await;
    wait_for(
        &mut c,
        &pod,
        "container_network_receive_bytes_total",
        &["eth0"],
        Duration::from_secs(10),
        |v| v > rx0,
    )
    .await;

    // A stopped pod is no longer reported.
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    let left =
        c.rt.list_pod_sandbox_metrics(api::ListPodSandboxMetricsRequest {})
            .await
            .unwrap()
            .into_inner()
            .pod_metrics;
    assert!(left.iter().all(|p| p.pod_sandbox_id != pod));
}
