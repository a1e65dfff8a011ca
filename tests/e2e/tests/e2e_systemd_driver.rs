//! Petrel's runtime on the systemd cgroup driver (`cgroup_driver =
//! "systemd"`), for real: only where systemd is PID 1 on cgroup v2, the
//! systemd test VM (`e2e_cgroup_v2` runs these there; this machine's init
//! is not systemd). Ignored elsewhere; never skipped silently: run where
//! systemd is not PID 1, they fail saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use petrel_cri::api;
use petrel_oci::cgroups::systemd::expand_slice;
use petrel_testkit::cluster::node_name;
use petrel_testkit::kubelet::{Kubelet, KubeletOptions};
use petrel_testkit::prelude::*;

/// Fails unless systemd is PID 1 and the hierarchy is pure v2.
fn assert_systemd_host() {
    let comm = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    assert_eq!(
        comm.trim(),
        "systemd",
        "systemd is not PID 1 here: run these in the systemd test VM (e2e_cgroup_v2)"
    );
    assert!(Node::cgroup_v2(), "not a cgroup v2 host");
}

/// `systemctl show -P <property> <unit>`.
fn unit_property(unit: &str, property: &str) -> String {
    let out = Command::new("systemctl")
        .args(["show", "-P", property, "--", unit])
        .output()
        .expect("run systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The units systemd has loaded whose names contain `part`.
fn units_named(part: &str) -> Vec<String> {
    let out = Command::new("systemctl")
        .args(["list-units", "--all", "--plain", "--no-legend", "--full"])
        .output()
        .expect("run systemctl list-units");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|u| u.contains(part))
        .map(str::to_string)
        .collect()
}

fn read(dir: &std::path::Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        .trim()
        .to_string()
}

/// A pod in its own slice and a container with limits: the container is
/// the scope `petrel-<id>.scope` in the pod's slice, as systemd and the
/// files say; its limits land and move live; stats, the pod's stats and
/// ListPodSandboxMetrics come from the expanded paths; an OOM kill is
/// OOMKilled; nothing is left in systemd once the pod is removed.
#[tokio::test]
#[ignore = "needs systemd as PID 1 on cgroup v2: e2e_cgroup_v2 runs it in the systemd VM"]
async fn systemd_driver_should_run_containers_as_scopes_in_the_pods_slice() {
    assert_systemd_host();
    let node = Node::start_systemd();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;

    let answer =
        c.rt.runtime_config(api::RuntimeConfigRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(
        answer.linux.map(|l| l.cgroup_driver),
        Some(api::CgroupDriver::Systemd as i32)
    );
    // A cgroupfs parent is refused, naming the driver.
    let mut bad = node.pod_config("bad");
    bad.linux.as_mut().unwrap().cgroup_parent = "/kubepods/pod1".into();
    let e =
        c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(bad),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("systemd cgroup driver"), "{e}");

    let slice = node.systemd_pod_slice("sd");
    let pc = node.systemd_pod_config("sd");
    let pod = c.run_pod(pc.clone()).await;
    let pod_dir = Node::cgroup_dir("", &expand_slice(&slice).unwrap());
    assert!(pod_dir.is_dir(), "{} made", pod_dir.display());
    assert_eq!(unit_property(&slice, "ActiveState"), "active");

    let resources = |memory: i64, quota: i64| api::LinuxContainerResources {
        memory_limit_in_bytes: memory,
        cpu_shares: 2048,
        cpu_period: 100_000,
        cpu_quota: quota,
        unified: [("pids.max".to_string(), "64".to_string())].into(),
        ..Default::default()
    };
    let mut cfg = sh_container("app", "while true; do sleep 1; done");
    cfg.linux = Some(api::LinuxContainerConfig {
        resources: Some(resources(64 << 20, 150_000)),
        security_context: None,
    });
    let id = c.run(&pod, &pc, cfg).await;
    let scope = format!("petrel-{id}.scope");
    let dir = pod_dir.join(&scope);
    assert_eq!(unit_property(&scope, "ActiveState"), "active");
    assert_eq!(unit_property(&scope, "Slice"), slice);
    assert_eq!(
        unit_property(&scope, "ControlGroup"),
        format!("{}/{scope}", expand_slice(&slice).unwrap())
    );
    assert_eq!(read(&dir, "memory.max"), (64u64 << 20).to_string());
    assert_eq!(read(&dir, "cpu.weight"), Node::cpu_weight(2048).to_string());
    assert_eq!(read(&dir, "cpu.max"), "150000 100000");
    assert_eq!(read(&dir, "pids.max"), "64");
    // The container's init is in the scope.
    let procs = read(&dir, "cgroup.procs");
    assert!(!procs.is_empty(), "no process in {}", dir.display());

    // Live: runc update sets the unit's properties and the files.
    c.rt.update_container_resources(api::UpdateContainerResourcesRequest {
        container_id: id.clone(),
        linux: Some(resources(96 << 20, 50_000)),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(read(&dir, "memory.max"), (96u64 << 20).to_string());
    assert_eq!(read(&dir, "cpu.max"), "50000 100000");
    assert_eq!(
        unit_property(&scope, "MemoryMax"),
        (96u64 << 20).to_string()
    );

    // Stats: the container's from its scope, the pod's from its slice.
    let stats =
        c.rt.container_stats(api::ContainerStatsRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let mem = stats.memory.and_then(|m| m.usage_bytes).map(|v| v.value);
    assert!(mem.is_some_and(|v| v > 0), "container memory {mem:?}");
    let pod_stats =
        c.rt.pod_sandbox_stats(api::PodSandboxStatsRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let pod_mem = pod_stats
        .linux
        .and_then(|l| l.memory)
        .and_then(|m| m.usage_bytes)
        .map(|v| v.value);
    assert!(pod_mem.is_some_and(|v| v > 0), "pod memory {pod_mem:?}");
    let metrics =
        c.rt.list_pod_sandbox_metrics(api::ListPodSandboxMetricsRequest {})
            .await
            .unwrap()
            .into_inner()
            .pod_metrics
            .into_iter()
            .find(|p| p.pod_sandbox_id == pod)
            .expect("the pod's metrics");
    let usage = metrics
        .container_metrics
        .iter()
        .filter(|m| m.container_id == id)
        .flat_map(|m| m.metrics.iter())
        .find(|m| m.name == "container_memory_usage_bytes")
        .and_then(|m| m.value.as_ref())
        .map(|v| v.value);
    assert!(usage.is_some_and(|v| v > 0), "metrics usage {usage:?}");

    // The OOM killer: OOMKilled, though systemd removes the scope's
    // cgroup as soon as it is empty.
    let hog_id = c.run(&pod, &pc, hog("hog", 0)).await;
    let st = exited(&mut c, &hog_id, Duration::from_secs(120)).await;
    let hog_scope = format!("petrel-{hog_id}.scope");
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "OOMKilled"),
        "{hog_scope}: LoadState={} ActiveState={} Result={}",
        unit_property(&hog_scope, "LoadState"),
        unit_property(&hog_scope, "ActiveState"),
        unit_property(&hog_scope, "Result"),
    );

    c.remove_pod(&pod).await.unwrap();
    let left: Vec<String> = [id.as_str(), hog_id.as_str(), slice.as_str()]
        .iter()
        .flat_map(|n| units_named(n))
        .collect();
    assert!(left.is_empty(), "units left: {left:?}");
    assert!(!pod_dir.exists(), "{} left", pod_dir.display());
    node.assert_no_debris(&pod);
    // The default slice systemd made as the pod slice's parent.
    let _ = Command::new("systemctl")
        .args(["stop", "--", &node.cgroup_parent])
        .status();
}

/// The real kubelet with `cgroupDriver: systemd` on Petrel's runtime with
/// the systemd driver: a static pod with limits runs, its container is a
/// scope in the pod's slice under `kubepods.slice`, with the limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs systemd as PID 1 on cgroup v2: e2e_cgroup_v2 runs it in the systemd VM"]
async fn kubelet_on_the_systemd_driver_should_run_a_pod_with_limits_in_kubepods_slice() {
    assert_systemd_host();
    let node = Node::start_systemd();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let name = node_name("sd");
    let k = Kubelet::start(
        KubeletOptions::standalone(&name, &format!("unix://{}", node.socket.display()))
            .systemd_cgroups(true),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: limited\n  namespace: default\n\
         spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    \
         image: {BUSYBOX}\n    imagePullPolicy: Never\n    \
         command: [\"sh\", \"-c\", \"while true; do sleep 1; done\"]\n    resources:\n      \
         requests:\n        cpu: 100m\n        memory: 32Mi\n      limits:\n        \
         cpu: 200m\n        memory: 64Mi\n"
    );
    k.write_manifest("limited", &yaml).unwrap();
    let pod = format!("limited-{name}");
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let ctr = loop {
        let running =
            c.rt.list_containers(api::ListContainersRequest {
                filter: Some(api::ContainerFilter {
                    label_selector: [("io.kubernetes.pod.name".to_string(), pod.clone())].into(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .containers
            .into_iter()
            .find(|x| x.state == api::ContainerState::ContainerRunning as i32);
        if let Some(ctr) = running {
            break ctr;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pod}/main not running in Petrel within 180 s; kubelet's log:\n{}",
            petrel_testkit::process::tail(&k.log_path(), 40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let scope = format!("petrel-{}.scope", ctr.id);
    let cgroup = unit_property(&scope, "ControlGroup");
    assert!(
        cgroup.starts_with("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"),
        "{scope} is in {cgroup:?}"
    );
    let dir = Node::cgroup_dir("", &cgroup);
    assert_eq!(read(&dir, "memory.max"), (64u64 << 20).to_string());
    assert_eq!(read(&dir, "cpu.max"), "20000 100000");
    // The pod's slice is kubelet's, with the pod's limit.
    let pod_dir = dir.parent().unwrap();
    assert_eq!(read(pod_dir, "memory.max"), (64u64 << 20).to_string());
    drop(k);
}

/// Stops these units (a slice: with every scope in it) when dropped, so
/// that a failed test leaves nothing in systemd.
struct StopUnitsOnDrop(Vec<String>);

impl Drop for StopUnitsOnDrop {
    fn drop(&mut self) {
        for unit in self.0.iter().rev() {
            let _ = Command::new("systemctl")
                .args(["stop", "--", unit])
                .status();
            let _ = Command::new("systemctl")
                .args(["reset-failed", "--", unit])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The `petrel-*.scope` units systemd has loaded in slice `slice`, sorted.
fn scopes_in(slice: &str) -> Vec<String> {
    let out = Command::new("systemctl")
        .args([
            "list-units",
            "--all",
            "--plain",
            "--no-legend",
            "--full",
            "--",
            "petrel-*.scope",
        ])
        .output()
        .expect("run systemctl list-units");
    let mut scopes: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|u| unit_property(u, "Slice") == slice)
        .map(str::to_string)
        .collect();
    scopes.sort();
    scopes
}

/// Waits up to `within` for `f` to hold.
async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while !f() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// What a container's shim left in its bundle: the exit record and its
/// diagnostics.
fn shim_files(node: &Node, id: &str) -> String {
    let bundle = node.state_dir().join("containers").join(id);
    let file = |f: &str| std::fs::read_to_string(bundle.join(f)).unwrap_or_else(|e| e.to_string());
    format!(
        "exit record: {:?}\nshim.log:\n{}",
        file("exit"),
        file("shim.log")
    )
}

/// The container's status once it has exited.
async fn exited(c: &mut Clients, id: &str, within: Duration) -> api::ContainerStatus {
    c.wait_state(id, api::ContainerState::ContainerExited, within)
        .await
}

/// A busybox shell filling memory past a 32 MiB limit after `delay` s.
fn hog(name: &str, delay: u32) -> api::ContainerConfig {
    let wait = if delay > 0 {
        format!("sleep {delay}; ")
    } else {
        String::new()
    };
    let mut hog = sh_container(name, &format!("{wait}a=x; while true; do a=$a$a; done"));
    hog.linux = Some(api::LinuxContainerConfig {
        resources: Some(api::LinuxContainerResources {
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        }),
        security_context: None,
    });
    hog
}

/// OOMKilled is exact on the systemd driver: the shim's finding from the
/// container's own scope. In one pod a container OOM-killed is
/// OOMKilled, and a sibling SIGKILLed by StopContainer after it is
/// `Error`, though the pod slice's hierarchical `oom_kill` grew while the
/// sibling ran (what the runtime's fallback would take for its OOM kill);
/// a container OOM-killed while the runtime was down (SIGKILLed) is
/// OOMKilled once the runtime is back, from its shim's exit record.
#[tokio::test]
#[ignore = "needs systemd as PID 1 on cgroup v2: e2e_cgroup_v2 runs it in the systemd VM"]
async fn systemd_driver_should_tell_each_containers_oom_kill_across_a_runtime_crash() {
    assert_systemd_host();
    let mut node = Node::start_systemd();
    let _units = StopUnitsOnDrop(vec![node.cgroup_parent.clone()]);
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let slice = node.systemd_pod_slice("oom");
    let pc = node.systemd_pod_config("oom");
    let pod = c.run_pod(pc.clone()).await;
    let pod_dir = Node::cgroup_dir("", &expand_slice(&slice).unwrap());

    let sibling = c
        .run(
            &pod,
            &pc,
            sh_container("sibling", "while true; do sleep 1; done"),
        )
        .await;
    let hog_id = c.run(&pod, &pc, hog("hog", 0)).await;
    let st = exited(&mut c, &hog_id, Duration::from_secs(120)).await;
    assert_eq!((st.exit_code, st.reason.as_str()), (137, "OOMKilled"));
    // The pod saw the kill: an inference from the pod would blame the
    // sibling too.
    let pod_events = read(&pod_dir, "memory.events");
    assert!(
        !pod_events.contains("oom_kill 0"),
        "no OOM kill in the pod slice: {pod_events}"
    );
    c.stop(&sibling, 0).await.unwrap();
    let st = exited(&mut c, &sibling, Duration::from_secs(60)).await;
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "Error"),
        "{}",
        shim_files(&node, &sibling)
    );

    // OOM-killed while the runtime is down.
    let late = c.run(&pod, &pc, hog("late-hog", 2)).await;
    drop(c);
    node.kill9();
    let gone = eventually(Duration::from_secs(180), || {
        !node.live_shims().contains_key(&late)
    })
    .await;
    assert!(gone, "the late hog's shim still runs after 180 s");
    node.restart();
    let mut c = node.clients().await;
    let st = exited(&mut c, &late, Duration::from_secs(60)).await;
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "OOMKilled"),
        "{}",
        shim_files(&node, &late)
    );

    c.remove_pod(&pod).await.unwrap();
    let left: Vec<String> = [sibling.as_str(), hog_id.as_str(), late.as_str(), &slice]
        .iter()
        .flat_map(|n| units_named(n))
        .collect();
    assert!(left.is_empty(), "units left: {left:?}");
    assert!(!pod_dir.exists(), "{} left", pod_dir.display());
    node.assert_no_debris(&pod);
}

/// runc, through a wrapper that stalls (after runc's own success) the
/// create of a container whose config names `PETREL_E2E_STALL_CREATE`:
/// the scope exists, the shim is still inside its create (which is
/// StartContainer's: a created container has no shim yet).
fn stalling_runc(dir: &std::path::Path) -> std::path::PathBuf {
    let real = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("runc"))
        .find(|p| p.is_file())
        .expect("runc in PATH");
    let wrapper = dir.join("runc");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n{real:?} \"$@\" || exit $?\nfor a in \"$@\"; do\n  \
             if [ \"$a\" = create ] && grep -q PETREL_E2E_STALL_CREATE config.json 2>/dev/null; then\n    \
             sleep 40\n  fi\ndone\nexit 0\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

/// Crash recovery on the systemd driver, for real: the runtime SIGKILLed
/// with two containers running, one container's shim SIGKILLed too, and a
/// start stalled inside runc's create once runc made its scope; restarted,
/// it kills the container of the dead shim, undoes the interrupted start
/// (its shim and runc container gone, its scope stopped through systemd;
/// the container stays Created), keeps the other running; removing the
/// pod then leaves no scope, no slice and no cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs systemd as PID 1 on cgroup v2: e2e_cgroup_v2 runs it in the systemd VM"]
async fn systemd_driver_should_leave_no_scope_after_a_runtime_crash() {
    assert_systemd_host();
    let bin = tempfile::tempdir().unwrap();
    let runc = stalling_runc(bin.path());
    let mut node = Node::start_systemd_with_runc(&runc);
    let _units = StopUnitsOnDrop(vec![node.cgroup_parent.clone()]);
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let slice = node.systemd_pod_slice("crash");
    let pc = node.systemd_pod_config("crash");
    let pod = c.run_pod(pc.clone()).await;
    let pod_dir = Node::cgroup_dir("", &expand_slice(&slice).unwrap());
    let sleeper = |name| sh_container(name, "while true; do sleep 1; done");
    let kept = c.run(&pod, &pc, sleeper("kept")).await;
    let orphaned = c.run(&pod, &pc, sleeper("orphaned")).await;
    let (kept_scope, orphaned_scope) = (
        format!("petrel-{kept}.scope"),
        format!("petrel-{orphaned}.scope"),
    );
    assert_eq!(scopes_in(&slice), {
        let mut v = vec![kept_scope.clone(), orphaned_scope.clone()];
        v.sort();
        v
    });

    // A start stalled in runc's create, once runc made the scope.
    let mut stalled = sleeper("stalled");
    stalled.envs.push(api::KeyValue {
        key: "PETREL_E2E_STALL_CREATE".into(),
        value: "1".into(),
    });
    let stalled_id = c.create(&pod, &pc, stalled).await.unwrap();
    let mut c2 = node.clients().await;
    let id2 = stalled_id.clone();
    let start = tokio::spawn(async move { c2.start(&id2).await });
    let appeared = eventually(Duration::from_secs(60), || scopes_in(&slice).len() == 3).await;
    assert!(
        appeared,
        "no scope for the stalled create: {:?}",
        scopes_in(&slice)
    );
    let stalled_scope = format!("petrel-{stalled_id}.scope");
    assert!(scopes_in(&slice).contains(&stalled_scope));

    // The crash: the runtime, and one container's shim.
    drop(c);
    node.kill9();
    assert!(start.await.unwrap().is_err(), "the stalled start answered");
    let shim = node.live_shims()[&orphaned];
    let killed = Command::new("kill")
        .args(["-9", &shim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {shim}");
    node.restart();
    let mut c = node.clients().await;

    let st = exited(&mut c, &orphaned, Duration::from_secs(60)).await;
    assert_eq!(st.reason, "Unknown", "{st:?}");
    assert_eq!(
        c.status(&kept).await.state,
        api::ContainerState::ContainerRunning as i32
    );
    let ids: Vec<String> =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .containers
            .into_iter()
            .map(|x| x.id)
            .collect();
    assert_eq!(ids.len(), 3, "containers after recovery: {ids:?}");
    // Recovery keeps an interrupted start's container Created.
    assert_eq!(
        c.status(&stalled_id).await.state,
        api::ContainerState::ContainerCreated as i32
    );
    let undone = eventually(Duration::from_secs(60), || {
        scopes_in(&slice) == [kept_scope.clone()]
    })
    .await;
    assert!(
        undone,
        "scopes after recovery: {:?} (stalled: {stalled_scope})",
        scopes_in(&slice)
    );

    c.remove_pod(&pod).await.unwrap();
    let left: Vec<String> = [kept.as_str(), orphaned.as_str(), &stalled_id, &slice]
        .iter()
        .flat_map(|n| units_named(n))
        .chain(scopes_in(&slice))
        .collect();
    assert!(left.is_empty(), "units left: {left:?}");
    assert!(!pod_dir.exists(), "{} left", pod_dir.display());
    node.assert_no_debris(&pod);
}
