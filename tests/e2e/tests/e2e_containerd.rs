//! Smoke tests of the containerd harness (`petrel_testkit::prelude::containerd`): containerd
//! 1.7 and 1.6 from Debian run pods driven by `petrel ctl` and raw CRI
//! clients, 1.7 streams container events while 1.6 answers UNIMPLEMENTED,
//! and dropping an instance leaves nothing behind.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_cri::api::ContainerEventType as E;
use petrel_testkit::local_containerd::{Containerd, Version};
use petrel_testkit::prelude::*;

fn ctl(cd: &Containerd, args: &[&str]) -> String {
    let o = Command::new(petrel_bin())
        .arg("ctl")
        .arg("--endpoint")
        .arg(cd.endpoint())
        .args(args)
        .output()
        .expect("run petrel ctl");
    assert!(
        o.status.success(),
        "petrel ctl {args:?} failed: {}{}\ncontainerd log:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        cd.log()
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

type Events =
    tokio::sync::mpsc::UnboundedReceiver<Result<api::ContainerEventResponse, tonic::Status>>;

/// Subscribes to `GetContainerEvents` in a task of its own: containerd
/// sends the stream's response headers only with its first event, so
/// awaiting the call itself would wait until something happens.
fn subscribe(c: &Clients) -> Events {
    let mut rt = c.rt.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        match rt.get_container_events(api::GetEventsRequest {}).await {
            Err(s) => {
                let _ = tx.send(Err(s));
            }
            Ok(r) => {
                let mut stream = r.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(e)) => {
                            if tx.send(Ok(e)).is_err() {
                                return;
                            }
                        }
                        Ok(None) => return,
                        Err(s) => {
                            let _ = tx.send(Err(s));
                            return;
                        }
                    }
                }
            }
        }
    });
    rx
}

/// Reads events until `want` holds for the events of container `id`.
async fn events_until(
    events: &mut Events,
    id: &str,
    within: Duration,
    want: impl Fn(&[i32]) -> bool,
) -> Vec<i32> {
    let start = Instant::now();
    let mut seen = vec![];
    while !want(&seen) {
        let left = within.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Some(Ok(e))) if e.container_id == id => seen.push(e.container_event_type),
            Ok(Some(Ok(_))) => {}
            other => panic!("events of {id} so far {seen:?}, then {other:?}"),
        }
    }
    seen
}

#[tokio::test]
async fn containerd17_should_run_a_ctl_pod_and_stream_its_events() {
    let Some(cd) = Containerd::start(Version::V17) else {
        return;
    };
    let mut c = cd.clients().await;
    let mut events = subscribe(&c);

    let pc = cd.pod_config("ctl17");
    let linux = pc.linux.as_ref().unwrap();
    let yaml = format!(
        "pod:\n  name: ctl17\n  namespace: e2e\n  cgroup_parent: {}\n  log_directory: {}\n\
         containers:\n  - name: hello\n    image: {BUSYBOX}\n    command: [/bin/sh, -c]\n    \
         args: [\"echo hello from containerd; sleep 0.2\"]\n    log_path: hello.log\n",
        linux.cgroup_parent, pc.log_directory
    );
    let file = cd.dir.path().join("pod.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = ctl(&cd, &["run", file.to_str().unwrap()]);
    let ids: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(ids.len(), 2, "pod and container ids: {out}");
    let (pod, id) = (ids[0], ids[1]);

    // The pod got an address on this instance's bridge.
    let ps =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.to_string(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner()
        .status
        .expect("status");
    let ip = ps.network.map(|n| n.ip).unwrap_or_default();
    let net = cd.subnet.trim_end_matches(".0/24");
    assert!(ip.starts_with(net), "pod ip {ip:?} not in {}", cd.subnet);

    let st = c
        .wait_state(
            id,
            api::ContainerState::ContainerExited,
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(st.exit_code, 0, "{st:?}");
    let logs = ctl(&cd, &["logs", id]);
    assert_eq!(logs.trim(), "hello from containerd");
    assert!(ctl(&cd, &["ps", "-a", "-q"]).contains(id));

    ctl(&cd, &["stopp", pod]);
    ctl(&cd, &["rmp", pod]);
    assert!(ctl(&cd, &["pods", "-q"]).trim().is_empty());

    let seen = events_until(&mut events, id, Duration::from_secs(10), |s| {
        s.contains(&(E::ContainerDeletedEvent as i32))
    })
    .await;
    let order: Vec<i32> = [
        E::ContainerCreatedEvent,
        E::ContainerStartedEvent,
        E::ContainerStoppedEvent,
        E::ContainerDeletedEvent,
    ]
    .iter()
    .map(|e| *e as i32)
    .collect();
    let firsts: Vec<i32> = order.iter().copied().filter(|e| seen.contains(e)).collect();
    assert_eq!(firsts, order, "events of {id}: {seen:?}");
    let pos = |e: E| seen.iter().position(|x| *x == e as i32).unwrap();
    assert!(pos(E::ContainerStartedEvent) < pos(E::ContainerStoppedEvent));
}

#[tokio::test]
async fn containerd16_should_run_a_host_network_pod_and_refuse_events() {
    let Some(cd) = Containerd::start(Version::V16) else {
        return;
    };
    let mut c = cd.clients().await;
    let v =
        c.rt.version(api::VersionRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(v.runtime_version.starts_with("1.6."), "{v:?}");

    // 1.6 has no GetContainerEvents: the call (or its first message) fails
    // with UNIMPLEMENTED, what the agent's `--pleg auto` falls back on.
    let mut events = subscribe(&c);
    match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
        Ok(Some(Err(s))) => assert_eq!(s.code(), tonic::Code::Unimplemented, "{s:?}"),
        other => panic!("containerd 1.6 answered GetContainerEvents with {other:?}"),
    }

    let pc = cd.host_network_pod_config("host16");
    let pod = c.run_pod(pc.clone()).await;
    let id = c
        .run(&pod, &pc, sh_container("hello", "echo hello from 1.6"))
        .await;
    let st = c
        .wait_state(
            &id,
            api::ContainerState::ContainerExited,
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(st.exit_code, 0, "{st:?}");
    assert!(
        cd.read_log("host16", "hello")
            .contains("stdout F hello from 1.6"),
        "{}",
        cd.read_log("host16", "hello")
    );
    c.remove(&id).await.expect("RemoveContainer");
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .expect("StopPodSandbox");
    c.remove_pod(&pod).await.expect("RemovePodSandbox");
    let left =
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(left.items.is_empty(), "{left:?}");
}

#[tokio::test]
async fn containerd_should_leave_nothing_behind_when_dropped_with_a_running_pod() {
    let Some(cd) = Containerd::start(Version::V17) else {
        return;
    };
    let mut c = cd.clients().await;
    let pc = cd.pod_config("debris");
    let pod = c.run_pod(pc.clone()).await;
    c.run(&pod, &pc, sh_container("sleeper", "sleep 300")).await;
    let hpc = cd.host_network_pod_config("debris-host");
    let hpod = c.run_pod(hpc.clone()).await;
    c.run(&hpod, &hpc, sh_container("sleeper", "sleep 300"))
        .await;
    let verbose =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner()
        .info
        .into_values()
        .collect::<String>();
    let netns = verbose
        .split('"')
        .find(|s| s.starts_with("/var/run/netns/cni-"))
        .map(str::to_string)
        .expect("the pod's network namespace path");
    assert!(Path::new(&netns).exists());
    assert!(Path::new("/sys/class/net").join(&cd.bridge).exists());
    let pid = cd.pid();
    let dir = cd.dir.path().to_path_buf();
    let cgroup_parent = cd.cgroup_parent.clone();
    let bridge = cd.bridge.clone();
    let shims: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&*cd.socket.to_string_lossy()))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|p| *p != pid.to_string())
        .collect();
    assert_eq!(shims.len(), 2, "one shim per pod: {shims:?}");

    drop(c);
    drop(cd);

    assert!(!dir.exists(), "{} left", dir.display());
    assert!(!Path::new(&netns).exists(), "{netns} left");
    assert!(
        !Path::new("/sys/class/net").join(&bridge).exists(),
        "bridge {bridge} left"
    );
    assert!(cgroup_leftovers(&cgroup_parent).is_empty(), "cgroups left");
    for p in shims.iter().chain([&pid.to_string()]) {
        assert!(
            !Path::new("/proc").join(p).exists(),
            "process {p} left (or a zombie)"
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&*dir.to_string_lossy()), "mounts left");
}
