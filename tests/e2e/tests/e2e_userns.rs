//! Pods in user namespaces of their own (CRI `userns_options` mode POD)
//! with real runc: the newer runc of the peers (1.2 or later: idmapped
//! mounts) runs them, every container of the pod in the same user
//! namespace, the image's and a host volume's files owned inside as on the
//! host, the process seen from the host under the mapped uid, and exec,
//! logs and stats working; Debian's runc 1.1 refuses them with a clear
//! error and nothing left behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::prelude::*;

/// The host ids of the container's root (a range no host user has).
const HOST_UID: u32 = 1_200_000;
const HOST_GID: u32 = 1_300_000;
const SIZE: u32 = 65536;

fn userns(uid: u32, gid: u32) -> api::UserNamespace {
    let map = |host_id| {
        vec![api::IdMapping {
            container_id: 0,
            host_id,
            length: SIZE,
        }]
    };
    api::UserNamespace {
        mode: api::NamespaceMode::Pod as i32,
        uids: map(uid),
        gids: map(gid),
    }
}

/// A pod config of `node` asking for a user namespace (its network, PID
/// and IPC namespaces its own).
fn userns_pod(node: &Node, name: &str) -> api::PodSandboxConfig {
    let mut pc = node.pod_config(name);
    let ns = pod_namespaces(&mut pc);
    ns.network = api::NamespaceMode::Pod as i32;
    ns.pid = api::NamespaceMode::Pod as i32;
    ns.ipc = api::NamespaceMode::Pod as i32;
    ns.userns_options = Some(userns(HOST_UID, HOST_GID));
    pc
}

/// The newer runc of the peers (`make peers`); `None` when
/// PETREL_PEERS_SKIP leaves it out (the test is then skipped, said).
fn new_runc() -> Option<PathBuf> {
    if petrel_testkit::peers::left_out("runc") {
        eprintln!("skipped: PETREL_PEERS_SKIP names runc");
        return None;
    }
    Some(petrel_testkit::peers::peer_binary("runc").unwrap_or_else(|e| panic!("{e}")))
}

fn uid_of(pid: u64) -> u32 {
    std::fs::metadata(format!("/proc/{pid}"))
        .unwrap_or_else(|e| panic!("/proc/{pid}: {e}"))
        .uid()
}

#[tokio::test]
async fn userns_pod_should_map_ids_and_idmap_the_rootfs_and_volumes_with_a_new_runc() {
    let Some(runc) = new_runc() else { return };
    let node = Node::start_with_runc(&runc);
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let status =
        c.rt.status(api::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    let features = status.runtime_handlers[0].features.unwrap();
    assert!(
        features.user_namespaces,
        "runc 1.2+ on Linux 6.x: {status:?}"
    );

    // A host volume: a file owned by host root, one by a mapped host id.
    let volume = tempfile::tempdir().unwrap();
    std::fs::write(volume.path().join("root-owned"), "r").unwrap();
    std::fs::write(volume.path().join("mapped"), "m").unwrap();
    std::os::unix::fs::chown(volume.path().join("mapped"), Some(1000), Some(1000)).unwrap();

    let pc = userns_pod(&node, "userns");
    let pod = c.run_pod(pc.clone()).await;
    let mut app = sh_container("app", "echo started; sleep 600");
    app.mounts = vec![api::Mount {
        container_path: "/data".into(),
        host_path: volume.path().display().to_string(),
        ..Default::default()
    }];
    let app = c.run(&pod, &pc, app).await;

    // The mapping, as the container sees it.
    let r = c
        .exec_sh(&app, "cat /proc/self/uid_map /proc/self/gid_map", 10)
        .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let maps: Vec<Vec<String>> = String::from_utf8_lossy(&r.stdout)
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(
        maps,
        [
            ["0", &HOST_UID.to_string(), &SIZE.to_string()],
            ["0", &HOST_GID.to_string(), &SIZE.to_string()]
        ],
        "{maps:?}"
    );
    // The image's files are root's inside; so are / and what root writes.
    let r = c
        .exec_sh(
            &app,
            "id -u; stat -c '%u:%g' /bin/busybox /etc/passwd /; touch /new && stat -c '%u:%g' /new",
            10,
        )
        .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let out = String::from_utf8_lossy(&r.stdout).to_string();
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["0", "0:0", "0:0", "0:0", "0:0"],
        "{out}"
    );
    // The volume is idmapped: host ids shown as they are on the host, and
    // what the container's root writes is host root's on disk.
    let r = c
        .exec_sh(
            &app,
            "stat -c '%u:%g' /data/root-owned /data/mapped; echo hi > /data/written",
            10,
        )
        .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let out = String::from_utf8_lossy(&r.stdout).to_string();
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["0:0", "1000:1000"],
        "{out}"
    );
    let written = std::fs::metadata(volume.path().join("written")).unwrap();
    assert_eq!((written.uid(), written.gid()), (0, 0));

    // From the host, the container's process is the mapped uid.
    let pid = c.init_pid(&app).await;
    assert_eq!(uid_of(pid), HOST_UID, "the host sees the mapped uid");

    // A second container joins the same user namespace.
    let second = c.run(&pod, &pc, sh_container("second", "sleep 600")).await;
    let pid2 = c.init_pid(&second).await;
    let ns = |pid: u64| std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap();
    assert_eq!(
        ns(pid),
        ns(pid2),
        "both containers in the pod's user namespace"
    );
    assert_ne!(ns(pid), std::fs::read_link("/proc/self/ns/user").unwrap());

    // Logs, stats and the hostname work.
    let log = petrel_testkit::node::read_log(&node, "userns", "app");
    assert!(log.contains("started"), "{log}");
    let stats =
        c.rt.container_stats(api::ContainerStatsRequest {
            container_id: app.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(stats.stats.and_then(|s| s.memory).is_some());
    let r = c.exec_sh(&app, "hostname", 10).await;
    assert_eq!(r.exit_code, 0, "{r:?}");

    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris("userns");
}

#[tokio::test]
async fn userns_pod_should_survive_a_runtime_restart() {
    let Some(runc) = new_runc() else { return };
    let mut node = Node::start_with_runc(&runc);
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = userns_pod(&node, "userns-restart");
    let pod = c.run_pod(pc.clone()).await;
    let before = c.run(&pod, &pc, sh_container("a", "sleep 600")).await;
    node.terminate();
    node.restart();
    let mut c = node.clients().await;
    // A container made after the restart joins the same user namespace.
    let after = c.run(&pod, &pc, sh_container("b", "sleep 600")).await;
    let ns = |pid: u64| std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap();
    let (p1, p2) = (c.init_pid(&before).await, c.init_pid(&after).await);
    assert_eq!(ns(p1), ns(p2));
    assert_eq!(uid_of(p2), HOST_UID);
    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris("userns-restart");
}

#[tokio::test]
async fn userns_pod_should_be_refused_with_runc_1_1_and_leave_nothing() {
    // Debian's runc (no idmapped mounts), the default of the test node.
    let node = Node::start();
    if !Path::new("/usr/sbin/runc").exists() {
        panic!("Debian's runc is missing: apt-get install runc");
    }
    let mut c = node.clients().await;
    let status =
        c.rt.status(api::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    assert!(
        !status.runtime_handlers[0]
            .features
            .as_ref()
            .unwrap()
            .user_namespaces
    );
    let err =
        c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(userns_pod(&node, "userns-old")),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("userns_options"), "{err}");
    assert!(err.message().contains("idmapped"), "{err}");
    let listed =
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
            .await
            .unwrap()
            .into_inner();
    assert!(listed.items.is_empty());
    node.assert_no_debris("userns-old");
}

#[tokio::test]
async fn userns_pod_should_refuse_what_the_cri_does_not_allow_naming_the_field() {
    let Some(runc) = new_runc() else { return };
    let node = Node::start_with_runc(&runc);
    let mut c = node.clients().await;
    let cases: [(&str, api::UserNamespace, &str); 3] = [
        (
            "container-root",
            {
                let mut u = userns(HOST_UID, HOST_GID);
                u.uids[0].container_id = 1;
                u
            },
            "uids[0].container_id",
        ),
        (
            "two-ranges",
            {
                let mut u = userns(HOST_UID, HOST_GID);
                u.gids.push(u.gids[0]);
                u
            },
            "gids",
        ),
        (
            "container-mode",
            api::UserNamespace {
                mode: api::NamespaceMode::Container as i32,
                ..Default::default()
            },
            "userns_options.mode",
        ),
    ];
    for (name, u, field) in cases {
        let mut pc = userns_pod(&node, name);
        pod_namespaces(&mut pc).userns_options = Some(u);
        let err =
            c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(pc),
                runtime_handler: String::new(),
            })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{name}: {err}");
        assert!(err.message().contains(field), "{name}: {err}");
    }
    // Give a late-starting runtime task a moment, then look for debris.
    tokio::time::sleep(Duration::from_millis(50)).await;
    node.assert_no_debris("container-root");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_run_host_users_false_pods_in_a_range_of_their_own() {
    use petrel_testkit::agent::{container_id, pod_yaml, running, Agent};
    const T: Duration = Duration::from_secs(60);
    let Some(runc) = new_runc() else { return };
    let node = Node::start_with_runc(&runc);
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let agent = Agent::for_node(&node, &[]);
    let sleeper = format!(
        "  - name: c\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
    );
    agent.write_manifest("u1.yaml", &pod_yaml("u1", "  hostUsers: false\n", &sleeper));
    agent.write_manifest("u2.yaml", &pod_yaml("u2", "  hostUsers: false\n", &sleeper));
    let mut ranges = Vec::new();
    for name in ["u1", "u2"] {
        let p = agent.wait_pod("default", name, T, "running", |p| running(p, "c"));
        let id = container_id(&p, "c");
        let id = id.split("://").nth(1).unwrap_or(&id).to_string();
        let r = c.exec_sh(&id, "cat /proc/self/uid_map", 10).await;
        assert_eq!(r.exit_code, 0, "{r:?}");
        let map: Vec<u64> = String::from_utf8_lossy(&r.stdout)
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(map.len(), 3, "one range: {map:?}");
        assert_eq!((map[0], map[2]), (0, 65536), "{map:?}");
        assert!(map[1] >= 65536 && map[1].is_multiple_of(65536), "{map:?}");
        assert_eq!(uid_of(c.init_pid(&id).await), map[1] as u32);
        ranges.push(map[1]);
    }
    assert_ne!(ranges[0], ranges[1], "each pod has its own range");
    agent.remove_manifest("u1.yaml");
    agent.remove_manifest("u2.yaml");
    agent.wait_gone("default", "u1", T);
    agent.wait_gone("default", "u2", T);
}
