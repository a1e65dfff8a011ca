//! `petrel ctl` as a user runs it, against a real runtime: import, run,
//! list, inspect, logs, exec, events, stats, stop and remove.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use petrel_testkit::prelude::*;

#[tokio::test]
async fn ctl_should_drive_a_pod_through_its_life() {
    let node = Node::start();
    let image = images_dir().join("busybox-oci.tar");
    let out = ok(&node, &["image", "import", image.to_str().unwrap()]);
    assert!(out.contains("docker.io/petrel/busybox:latest"), "{out}");
    assert!(ok(&node, &["images"]).contains("docker.io/petrel/busybox"));

    // Events, live, in the background.
    let events = Command::new(petrel_bin())
        .arg("ctl")
        .arg("--endpoint")
        .arg(format!("unix://{}", node.socket.display()))
        .args(["events", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let logs = node.dir.path().join("logs/ctl");
    let file = node.dir.path().join("pod.yaml");
    std::fs::write(
        &file,
        format!(
            "pod:\n  name: ctlpod\n  namespace: e2e\n  log_directory: {}\n  cgroup_parent: {}/ctlpod\n  labels: {{app: ctl}}\ncontainers:\n  - name: talker\n    image: docker.io/petrel/busybox:latest\n    command: [sh, -c, 'echo hi-from-ctl; echo oops >&2; sleep 1000']\n    env: {{NAME: petrel}}\n",
            logs.display(),
            node.cgroup_parent
        ),
    )
    .unwrap();
    let out = ok(&node, &["run", file.to_str().unwrap()]);
    let ids: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(ids.len(), 2, "{out}");
    let (pod, ctr) = (ids[0].to_string(), ids[1].to_string());

    assert_eq!(ok(&node, &["pods", "-q"]).trim(), pod);
    assert_eq!(ok(&node, &["ps", "-q"]).trim(), ctr);
    let table = ok(&node, &["ps"]);
    assert!(
        table.contains("talker") && table.contains("Running"),
        "{table}"
    );
    assert!(
        eventually(Duration::from_secs(5), || ok(&node, &["logs", &ctr])
            .contains("hi-from-ctl"))
        .await
    );
    let both = ctl(&node, &["logs", &ctr]);
    assert!(String::from_utf8_lossy(&both.stderr).contains("oops"));

    let inspect: serde_json::Value =
        serde_json::from_str(&ok(&node, &["inspect", &ctr[..12]])).unwrap();
    assert!(inspect.to_string().contains("talker"), "{inspect}");
    let o = ctl(
        &node,
        &["exec", &ctr, "--", "sh", "-c", "echo $NAME; exit 3"],
    );
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "petrel");
    assert!(ok(&node, &["stats"]).contains("talker"));
    let descs = ok(&node, &["metricdescs"]);
    assert!(
        descs.contains("container_cpu_usage_seconds_total"),
        "{descs}"
    );
    let metrics = ok(&node, &["metricsp"]);
    assert!(
        metrics.contains(&pod) && metrics.contains("container_memory_working_set_bytes"),
        "{metrics}"
    );
    assert!(ok(&node, &["info"]).contains("RuntimeReady"));
    assert!(ok(&node, &["version"]).contains("petrel"));

    ok(&node, &["stop", &ctr]);
    assert!(ok(&node, &["ps", "-a"]).contains("Exited"));
    ok(&node, &["rm", &ctr]);
    ok(&node, &["rmp", "-f", &pod]);
    assert!(ok(&node, &["pods", "-q"]).trim().is_empty());

    // Unknown ids are reported with exit code 1.
    let o = ctl(&node, &["inspect", "ffffffffffff"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("NotFound"));

    // The event stream saw the whole life, in order.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SAFETY: interrupting our own child.
    unsafe { libc::kill(events.id() as i32, libc::SIGINT) };
    let out = events.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let order: Vec<usize> = [
        "CONTAINER_CREATED_EVENT",
        "CONTAINER_STARTED_EVENT",
        "CONTAINER_STOPPED_EVENT",
        "CONTAINER_DELETED_EVENT",
    ]
    .iter()
    .map(|k| {
        text.find(k)
            .unwrap_or_else(|| panic!("{k} missing in {text}"))
    })
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
}
