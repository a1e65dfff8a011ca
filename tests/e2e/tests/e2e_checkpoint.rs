//! CheckpointContainer with real runc and CRIU, and restores from the
//! archive by CreateContainer (as containerd and CRI-O take it): a counting
//! container goes on counting from where it was, in another pod, watched,
//! logged, exec'd into and reaped like any other; bad requests are refused
//! with the field named and leave nothing behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::criu::criu_bin;
use petrel_testkit::prelude::*;

/// Counts in memory, writing each value to stdout and to /tmp/count.
const COUNTER: &str =
    "i=0; while true; do i=$((i+1)); echo $i; echo $i > /tmp/count; sleep 0.1; done";

fn node_with_criu() -> Node {
    Node::start_with(&format!(
        "criu_binary = {:?}",
        criu_bin().display().to_string()
    ))
}

async fn checkpoint(
    c: &mut Clients,
    id: &str,
    location: &Path,
) -> Result<api::CheckpointContainerResponse, tonic::Status> {
    c.rt.checkpoint_container(api::CheckpointContainerRequest {
        container_id: id.to_string(),
        location: location.display().to_string(),
        timeout: 60,
    })
    .await
    .map(|r| r.into_inner())
}

async fn count(c: &mut Clients, id: &str) -> u64 {
    let out = c.exec_sh(id, "cat /tmp/count", 5).await;
    assert_eq!(out.exit_code, 0, "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Waits (10 s at most) until the container's count passes `past`.
async fn wait_count_past(c: &mut Clients, id: &str, past: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = count(c, id).await;
        if n > past {
            return n;
        }
        assert!(std::time::Instant::now() < deadline, "count stuck at {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The numbers the container printed, in its CRI log.
fn logged_numbers(node: &Node, pod: &str, container: &str) -> Vec<u64> {
    read_log(node, pod, container)
        .lines()
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

fn tar_entries(path: &Path) -> Vec<String> {
    let out = std::process::Command::new("tar")
        .arg("-tf")
        .arg(path)
        .output()
        .expect("run tar");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn checkpoint_then_restore_should_continue_the_counter_from_its_value() {
    let mut node = node_with_criu();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pa = node.pod_config("cp-origin");
    let pod_a = c.run_pod(pa.clone()).await;
    let counter = c.run(&pod_a, &pa, sh_container("counter", COUNTER)).await;
    wait_count_past(&mut c, &counter, 10).await;

    // Checkpoint: the archive kubelet expects; the container runs on.
    let archive = node.dir.path().join("checkpoint-counter.tar");
    let before = count(&mut c, &counter).await;
    checkpoint(&mut c, &counter, &archive)
        .await
        .expect("CheckpointContainer");
    let entries = tar_entries(&archive);
    for want in [
        "checkpoint/inventory.img",
        "config.dump",
        "spec.dump",
        "status.dump",
        "rootfs-diff.tar",
        "dump.log",
        "stats-dump",
        "container.log",
    ] {
        assert!(
            entries.iter().any(|e| e == want),
            "{want} missing: {entries:?}"
        );
    }
    assert_eq!(
        c.state(&counter).await,
        api::ContainerState::ContainerRunning
    );
    let after = count(&mut c, &counter).await;
    wait_count_past(&mut c, &counter, after).await;

    // The original goes, pod and all.
    c.stop(&counter, 0).await.unwrap();
    c.remove(&counter).await.unwrap();
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod_a.clone(),
    })
    .await
    .unwrap();
    c.remove_pod(&pod_a).await.unwrap();

    // Restored as a new container of another pod.
    let pb = node.pod_config("cp-restored");
    let pod_b = c.run_pod(pb.clone()).await;
    let mut config = sh_container("counter", COUNTER);
    config.image = Some(api::ImageSpec {
        image: archive.display().to_string(),
        ..Default::default()
    });
    let restored = c.create(&pod_b, &pb, config).await.expect("restore");
    c.start(&restored).await.expect("StartContainer");
    let st = c.status(&restored).await;
    assert_eq!(st.state, api::ContainerState::ContainerRunning as i32);
    assert_eq!(st.image.as_ref().map(|i| i.image.as_str()), Some(BUSYBOX));
    assert_eq!(
        st.annotations.get("restored").map(String::as_str),
        Some("true")
    );

    // It is in the new pod's namespaces (runc hands CRIU the pod's network
    // namespace in place of the old pod's).
    let pid = c.init_pid(&restored).await;
    let ns_inode = |path: String| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&path)
            .map(|m| m.ino())
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    assert_eq!(
        ns_inode(format!("/proc/{pid}/ns/net")),
        ns_inode(format!(
            "{}/state/sandboxes/{pod_b}/net",
            node.dir.path().display()
        )),
        "the restored process is not in its pod's network namespace"
    );

    // It counts on from the checkpointed value, not from 1: the first
    // number it logs is past the one read before the checkpoint.
    let logged = eventually(Duration::from_secs(10), || {
        logged_numbers(&node, "cp-restored", "counter").len() >= 5
    })
    .await;
    assert!(logged, "{}", read_log(&node, "cp-restored", "counter"));
    let numbers = logged_numbers(&node, "cp-restored", "counter");
    assert!(
        numbers[0] > before,
        "restarted from {} (checkpointed at >= {before})",
        numbers[0]
    );
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    // Exec works in it, and its file system came along.
    assert!(count(&mut c, &restored).await > before);
    // Stats of its cgroup.
    let stats =
        c.rt.container_stats(api::ContainerStatsRequest {
            container_id: restored.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .expect("stats");
    let memory = stats
        .memory
        .and_then(|m| m.working_set_bytes)
        .map(|v| v.value);
    assert!(memory.unwrap_or(0) > 0, "{memory:?}");

    // A crash of the runtime loses nothing: still running, still watched.
    node.kill9();
    node.restart();
    let mut c = node.clients().await;
    assert_eq!(
        c.state(&restored).await,
        api::ContainerState::ContainerRunning
    );
    c.stop(&restored, 0).await.unwrap();
    let st = c.status(&restored).await;
    assert_eq!(st.state, api::ContainerState::ContainerExited as i32);
    assert_eq!(st.exit_code, 137, "{st:?}");
    c.remove(&restored).await.unwrap();
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod_b.clone(),
    })
    .await
    .unwrap();
    c.remove_pod(&pod_b).await.unwrap();
    node.assert_no_debris("cp-restored");
    node.assert_no_zombie_children(Duration::from_secs(15));
}

#[tokio::test]
async fn checkpoint_and_restore_should_refuse_bad_requests_and_leave_nothing() {
    let node = node_with_criu();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("cp-bad");
    let pod = c.run_pod(pc.clone()).await;
    let archive = node.dir.path().join("cp.tar");

    let err = checkpoint(&mut c, "no-such-container", &archive)
        .await
        .expect_err("unknown id");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");

    let created = c
        .create(&pod, &pc, sh_container("created", "sleep 100"))
        .await
        .unwrap();
    let err = checkpoint(&mut c, &created, &archive)
        .await
        .expect_err("not running");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");

    let running = c.run(&pod, &pc, sh_container("running", "sleep 100")).await;
    let err = checkpoint(
        &mut c,
        &running,
        Path::new("/nonexistent-petrel-dir/cp.tar"),
    )
    .await
    .expect_err("bad location");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("location"), "{}", err.message());
    assert!(!archive.exists());

    // A file that is not a checkpoint archive, and a tar that is not one.
    let garbage = node.dir.path().join("garbage.tar");
    std::fs::write(&garbage, b"not a checkpoint").unwrap();
    let plain = node.dir.path().join("plain.tar");
    let out = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&plain)
        .arg("-C")
        .arg(node.dir.path())
        .arg("garbage.tar")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for bad in [&garbage, &plain] {
        let mut config = sh_container("restored", "sleep 1");
        config.image = Some(api::ImageSpec {
            image: bad.display().to_string(),
            ..Default::default()
        });
        let err = c
            .create(&pod, &pc, config)
            .await
            .expect_err("not a checkpoint");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("config.image.image")
                && err.message().contains("not a checkpoint archive"),
            "{}",
            err.message()
        );
    }
    let listed =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .containers;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let layers = std::fs::read_dir(node.dir.path().join("root/containers"))
        .unwrap()
        .count();
    assert_eq!(layers, 2, "a refused restore left a layer");
    let work = std::fs::read_dir(node.dir.path().join("root/checkpoints"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(work, 0, "checkpoint work directories left");

    for id in [&created, &running] {
        c.stop(id, 0).await.unwrap();
        c.remove(id).await.unwrap();
    }
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris("cp-bad");
}

#[tokio::test]
async fn ctl_and_crictl_checkpoint_should_write_archives_of_a_running_container() {
    let node = node_with_criu();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("cp-cli");
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("counter", COUNTER)).await;
    wait_count_past(&mut c, &id, 3).await;

    let ours = node.dir.path().join("ctl.tar");
    let out = ok(
        &node,
        &["checkpoint", "--export", &ours.display().to_string(), &id],
    );
    assert_eq!(out.trim(), id);
    let crictl = petrel_testkit::peers::peer_binary("crictl").unwrap_or_else(|e| panic!("{e}"));
    let theirs = node.dir.path().join("crictl.tar");
    let out = std::process::Command::new(crictl)
        .arg("--runtime-endpoint")
        .arg(format!("unix://{}", node.socket.display()))
        .arg("--timeout")
        .arg("60s")
        .arg("checkpoint")
        .arg(format!("--export={}", theirs.display()))
        .arg(&id)
        .output()
        .expect("run crictl");
    assert!(out.status.success(), "crictl checkpoint: {out:?}");
    for archive in [&ours, &theirs] {
        let entries = tar_entries(archive);
        for want in ["checkpoint/inventory.img", "config.dump", "spec.dump"] {
            assert!(
                entries.iter().any(|e| e == want),
                "{want} missing in {}",
                archive.display()
            );
        }
    }
    // Both times it was left running, and it still counts.
    let now = count(&mut c, &id).await;
    wait_count_past(&mut c, &id, now).await;

    c.stop(&id, 0).await.unwrap();
    c.remove(&id).await.unwrap();
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris("cp-cli");
}
