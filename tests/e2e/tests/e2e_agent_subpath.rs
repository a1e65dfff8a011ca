//! End-to-end: subPath mounts through `petrel agent` on a real `petrel
//! runtime` with real runc containers. A subPath is opened beneath its
//! volume and bound by file descriptor, so symlinks a container plants in
//! its volume never lead a mount onto the host: attacks by a second
//! container, by a restart, and by a swapping race are refused, and no
//! mount is left behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use petrel_testkit::agent::{container_state, container_status, running, Agent};
use petrel_testkit::local_containerd::{Containerd, Version};
use petrel_testkit::prelude::{mounts_under, random_suffix, Node, BUSYBOX};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

fn pod_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{spec}"
    )
}

/// A container running `sh -c script` with the given volumeMounts (YAML
/// flow items).
fn sh(name: &str, script: &str, mounts: &[String]) -> String {
    format!(
        "  - name: {name}\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts: [{}]\n",
        mounts.join(", ")
    )
}

fn mount(volume: &str, path: &str, sub: Option<&str>) -> String {
    match sub {
        Some(s) => format!("{{name: {volume}, mountPath: {path}, subPath: {s:?}}}"),
        None => format!("{{name: {volume}, mountPath: {path}}}"),
    }
}

/// The host directory of emptyDir `volume` of `pod`.
fn empty_dir(agent: &Agent, pod: &Value, volume: &str) -> PathBuf {
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    agent
        .root
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir")
        .join(volume)
}

/// Container `name` waits with `reason`.
fn waiting_reason(pod: &Value, name: &str, reason: &str) -> bool {
    matches!(container_state(pod, name), Some(("waiting", w)) if w["reason"] == reason)
}

fn waiting_message(pod: &Value, name: &str) -> String {
    match container_state(pod, name) {
        Some(("waiting", w)) => w["message"].as_str().unwrap_or("").to_string(),
        _ => String::new(),
    }
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A file on the host's `/` that only an escape could write; removed on
/// drop in case the test fails because one did.
struct HostRootProbe(PathBuf);

impl HostRootProbe {
    fn new() -> Self {
        Self(PathBuf::from(format!(
            "/petrel-subpath-escape-{}",
            random_suffix()
        )))
    }
    fn name(&self) -> String {
        self.0.file_name().unwrap().to_string_lossy().into_owned()
    }
}

impl Drop for HostRootProbe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// After the pod is gone: no mount under the agent's root, no mount point
/// directory left.
fn assert_no_sub_path_mounts(agent: &Agent) {
    assert_eq!(mounts_under(&agent.root), Vec::<String>::new());
    let dir = agent.root.join("volume-subpaths");
    assert!(
        entries(&dir).is_empty(),
        "mount points left: {:?}",
        entries(&dir)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_bind_sub_paths_that_stay_inside_their_volume() {
    let node = Node::start_with_busybox().await;
    let mut agent = Agent::for_node(&node, &[]);
    let host = node.dir.path().join("host-vol");
    std::fs::create_dir_all(&host).unwrap();
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: data, emptyDir: {{}}}}\n  - {{name: host, hostPath: {{path: {}}}}}\n  initContainers:\n{}  containers:\n{}",
        host.display(),
        sh(
            "prep",
            "mkdir -p /all/real/inner && echo hello > /all/file.txt && ln -s real /all/link && mkdir /all/d && ln -s ../real/inner /all/d/back",
            &[mount("data", "/all", None)],
        ),
        sh(
            "app",
            "echo made > /new/x && cat /f.txt > /link/copied && echo back > /back/y && echo host > /h/z && exec sleep 3600",
            &[
                mount("data", "/new", Some("made/on/demand")),
                mount("data", "/f.txt", Some("file.txt")),
                mount("data", "/link", Some("link")),
                mount("data", "/back", Some("d/back")),
                mount("host", "/h", Some("sub/dir")),
            ],
        ),
    );
    agent.write_manifest("ok.yaml", &pod_yaml("ok", &spec));
    let pod = agent.wait_pod("default", "ok", T, "running", |p| running(p, "app"));
    let vol = empty_dir(&agent, &pod, "data");
    let settled = petrel_testkit::prelude::eventually(Duration::from_secs(10), || {
        host.join("sub/dir/z").exists()
    })
    .await;
    assert!(settled, "app did not write through its mounts");
    // A missing subPath is made as a directory with the volume's mode.
    assert_eq!(
        std::fs::read_to_string(vol.join("made/on/demand/x")).unwrap(),
        "made\n"
    );
    // A file subPath, and links that stay inside the volume.
    assert_eq!(
        std::fs::read_to_string(vol.join("real/copied")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(vol.join("real/inner/y")).unwrap(),
        "back\n"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("sub/dir/z")).unwrap(),
        "host\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(vol.join("made/on"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o777);
    // The binds were only needed to create the container: none is left
    // while it runs. The app may write before the agent has its
    // StartContainer answer and drops them, so wait for that.
    let unbound = petrel_testkit::prelude::eventually(Duration::from_secs(10), || {
        mounts_under(&agent.root).is_empty()
    })
    .await;
    assert!(unbound, "binds left: {:?}", mounts_under(&agent.root));

    // Binds a killed agent left are swept when it starts again, without
    // touching what they showed.
    agent.terminate();
    let stale = agent.root.join("volume-subpaths/some-uid/data/app/0");
    std::fs::create_dir_all(&stale).unwrap();
    let st = std::process::Command::new("mount")
        .arg("--bind")
        .arg(&vol)
        .arg(&stale)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(mounts_under(&agent.root).len(), 1);
    agent.restart();
    assert_eq!(mounts_under(&agent.root), Vec::<String>::new());
    assert!(!agent.root.join("volume-subpaths/some-uid").exists());
    assert!(vol.join("file.txt").exists(), "volume content untouched");

    agent.remove_manifest("ok.yaml");
    agent.wait_gone("default", "ok", T);
    assert_no_sub_path_mounts(&agent);
    assert_eq!(
        std::fs::read_to_string(host.join("sub/dir/z")).unwrap(),
        "host\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_refuse_a_sub_path_through_a_link_another_container_planted() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    let target = node.dir.path().join("host-target");
    std::fs::create_dir_all(&target).unwrap();
    let probe = HostRootProbe::new();
    let plant = format!("ln -s {} /s/link && ln -s / /s/root", target.display());
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: shared, emptyDir: {{}}}}\n  initContainers:\n{}  containers:\n{}{}{}",
        sh("planter", &plant, &[mount("shared", "/s", None)]),
        sh("bystander", "exec sleep 3600", &[mount("shared", "/s", None)]),
        sh(
            "victim",
            "echo pwned > /x/pwned; exec sleep 3600",
            &[mount("shared", "/x", Some("link"))],
        ),
        sh(
            "rooted",
            &format!("echo pwned > /y/{}; exec sleep 3600", probe.name()),
            &[mount("shared", "/y", Some("root"))],
        ),
    );
    agent.write_manifest("a.yaml", &pod_yaml("attack-a", &spec));
    let pod = agent.wait_pod("default", "attack-a", T, "refusing both subPaths", |p| {
        running(p, "bystander")
            && waiting_reason(p, "victim", "CreateContainerConfigError")
            && waiting_reason(p, "rooted", "CreateContainerConfigError")
    });
    for (name, sub) in [("victim", "link"), ("rooted", "root")] {
        let msg = waiting_message(&pod, name);
        assert!(
            msg.contains("volumeMount \"shared\"")
                && msg.contains(&format!("subPath \"{sub}\""))
                && msg.contains("outside the volume"),
            "{name}: {msg}"
        );
        // Never created: the runtime has no such container.
        assert!(container_status(&pod, name).unwrap()["containerID"].is_null());
    }
    let names: Vec<String> = agent
        .runtime_containers(&node)
        .await
        .iter()
        .filter_map(|c| c.metadata.as_ref().map(|m| m.name.clone()))
        .collect();
    assert!(
        !names.iter().any(|n| n == "victim" || n == "rooted"),
        "{names:?}"
    );
    assert_eq!(
        entries(&target),
        Vec::<String>::new(),
        "host directory written"
    );
    assert!(!probe.0.exists(), "host / written");
    // The planted links are still links: the agent did not make them
    // directories or follow them.
    let vol = empty_dir(&agent, &pod, "shared");
    assert!(std::fs::symlink_metadata(vol.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());

    agent.remove_manifest("a.yaml");
    agent.wait_gone("default", "attack-a", T);
    assert_no_sub_path_mounts(&agent);
    assert!(
        target.is_dir(),
        "the link's target survives the pod's removal"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_refuse_a_restart_whose_sub_path_became_a_link() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &["--backoff-initial", "100ms"]);
    let target = node.dir.path().join("host-target");
    std::fs::create_dir_all(&target).unwrap();
    let probe = HostRootProbe::new();
    // First run: swap the subPath directory for a link out, and exit. A
    // second run would write through it.
    let swap = |to: &str, file: &str, marker: &str| {
        format!(
            "if [ -e /all/{marker} ]; then echo pwned > /work/{file}; exec sleep 3600; fi; touch /all/{marker}; mv /all/{marker}-work /all/{marker}-old; ln -s {to} /all/{marker}-work; exit 1"
        )
    };
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: data, emptyDir: {{}}}}\n  containers:\n{}{}",
        sh(
            "dir",
            &swap(&target.display().to_string(), "pwned", "d"),
            &[
                mount("data", "/all", None),
                mount("data", "/work", Some("d-work"))
            ],
        ),
        sh(
            "root",
            &swap("/", &probe.name(), "r"),
            &[
                mount("data", "/all", None),
                mount("data", "/work", Some("r-work"))
            ],
        ),
    );
    agent.write_manifest("b.yaml", &pod_yaml("attack-b", &spec));
    let pod = agent.wait_pod("default", "attack-b", T, "refusing both restarts", |p| {
        ["dir", "root"].iter().all(|c| {
            waiting_reason(p, c, "CreateContainerConfigError")
                && container_status(p, c)
                    .is_some_and(|s| s["lastState"]["terminated"]["exitCode"] == 1)
        })
    });
    for (name, sub) in [("dir", "d-work"), ("root", "r-work")] {
        let msg = waiting_message(&pod, name);
        assert!(
            msg.contains("volumeMount \"data\"") && msg.contains(&format!("subPath \"{sub}\"")),
            "{name}: {msg}"
        );
        assert_eq!(container_status(&pod, name).unwrap()["restartCount"], 0);
    }
    // Retried, and still refused.
    std::thread::sleep(Duration::from_secs(3));
    let pod = agent.pod("default", "attack-b").unwrap();
    for name in ["dir", "root"] {
        let cs = container_status(&pod, name).unwrap();
        assert_eq!(cs["restartCount"], 0, "{cs}");
    }
    assert_eq!(
        entries(&target),
        Vec::<String>::new(),
        "host directory written"
    );
    assert!(!probe.0.exists(), "host / written");
    // The first run's files stayed in the volume.
    let vol = empty_dir(&agent, &pod, "data");
    assert!(vol.join("d-old").is_dir() && vol.join("r-old").is_dir());

    agent.remove_manifest("b.yaml");
    agent.wait_gone("default", "attack-b", T);
    assert_no_sub_path_mounts(&agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_never_bind_a_swapped_link_under_a_race() {
    let node = Node::start_with_busybox().await;
    // No crash-loop delay: the victim is created again as fast as the
    // agent can, while the swapper flips its subPath.
    let agent = Agent::for_node(&node, &["--backoff-initial", "0s"]);
    let target = node.dir.path().join("host-target");
    std::fs::create_dir_all(&target).unwrap();
    // `work` flips between one real directory (renamed in and out, so a
    // bind of it stays valid) and a link to the host; a directory the
    // agent made in between is dropped.
    let swapper = format!(
        "mkdir -p /all/real && touch /all/real/.real; while :; do \
         if [ -L /all/work ]; then rm -f /all/work; elif [ -d /all/work ] && [ ! -e /all/work/.real ]; then rm -rf /all/work; fi; \
         [ -d /all/real ] && mv -T /all/real /all/work; usleep 5000; \
         [ -e /all/work/.real ] && [ ! -L /all/work ] && mv -T /all/work /all/real; \
         [ -d /all/work ] && [ ! -L /all/work ] && rm -rf /all/work; \
         ln -s {} /all/work; usleep 5000; done",
        target.display()
    );
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: data, emptyDir: {{}}}}\n  containers:\n{}{}",
        sh("swapper", &swapper, &[mount("data", "/all", None)]),
        sh(
            "victim",
            "touch /w/pwned.$RANDOM; exit 0",
            &[mount("data", "/w", Some("work"))],
        ),
    );
    agent.write_manifest("c.yaml", &pod_yaml("race", &spec));
    const RESTARTS: i64 = 10;
    let start = Instant::now();
    let pod = agent.wait_pod(
        "default",
        "race",
        Duration::from_secs(120),
        "restarted often",
        |p| {
            container_status(p, "victim")
                .is_some_and(|c| c["restartCount"].as_i64() >= Some(RESTARTS))
        },
    );
    let took = start.elapsed();
    assert!(running(&pod, "swapper"));
    assert_eq!(
        entries(&target),
        Vec::<String>::new(),
        "host directory written"
    );
    // Both sides of the race were met: binds that succeeded (the
    // restarts) and refusals.
    let refused = agent.log().matches("subPath refused").count();
    eprintln!("{RESTARTS} restarts in {took:?}; {refused} refusals");
    assert!(refused > 0, "the race never met the link");
    // What the victim wrote stayed in the volume.
    let vol = empty_dir(&agent, &pod, "data");
    let written = entries(&vol.join("real")).len() + entries(&vol.join("work")).len();
    assert!(written > 1, "the victim never wrote into the volume");

    agent.remove_manifest("c.yaml");
    agent.wait_gone("default", "race", T);
    assert_no_sub_path_mounts(&agent);
    assert_eq!(
        entries(&target),
        Vec::<String>::new(),
        "host directory written"
    );
}

/// containerd makes a container's mounts at StartContainer, not at
/// CreateContainer: the binds must live until the start.
#[tokio::test(flavor = "multi_thread")]
async fn agent_should_bind_sub_paths_for_a_runtime_that_mounts_at_start() {
    let Some(cd) = Containerd::start(Version::V17) else {
        return;
    };
    let agent = Agent::start(cd.dir.path(), &cd.endpoint(), &cd.cgroup_parent, &[]);
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: data, emptyDir: {{}}}}\n  initContainers:\n{}  containers:\n{}",
        sh("prep", "echo hello > /all/file.txt", &[mount("data", "/all", None)]),
        sh(
            "app",
            "cat /f.txt > /w/x && exec sleep 3600",
            &[
                mount("data", "/w", Some("made")),
                mount("data", "/f.txt", Some("file.txt")),
            ],
        ),
    );
    agent.write_manifest("cd.yaml", &pod_yaml("on-containerd", &spec));
    let pod = agent.wait_pod("default", "on-containerd", T, "running", |p| {
        running(p, "app")
    });
    let vol = empty_dir(&agent, &pod, "data");
    // The shell creates x before cat fills it: wait for the content.
    let wrote = petrel_testkit::prelude::eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(vol.join("made/x")).is_ok_and(|s| s == "hello\n")
    })
    .await;
    assert!(
        wrote,
        "app did not write through its subPath: {:?}",
        std::fs::read_to_string(vol.join("made/x"))
    );
    assert_eq!(mounts_under(&agent.root), Vec::<String>::new());
    agent.remove_manifest("cd.yaml");
    agent.wait_gone("default", "on-containerd", T);
    assert_no_sub_path_mounts(&agent);
}
