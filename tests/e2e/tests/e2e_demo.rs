//! End-to-end: what `make demo` relies on (issue 28, item 13). A node
//! stopped with `--drain-on-exit` stops and removes its pods first (a
//! second signal exits at once); `petrel ctl` and `petrel get` exit 0 when
//! the reader of their output goes away (`| head`) and write no colour
//! codes to a pipe; the node's log file has none either.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use petrel_testkit::agent::Agent;
use petrel_testkit::prelude::{petrel_bin, random_suffix, Node, BUSYBOX};

const T: Duration = Duration::from_secs(60);

/// The agent half of a `petrel node` under test: its flags and where to
/// reach it.
struct NodeAgent {
    manifests: PathBuf,
    socket: PathBuf,
    args: Vec<String>,
}

impl NodeAgent {
    fn new(dir: &Path, extra: &[&str]) -> Self {
        let suffix = random_suffix();
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        let socket = dir.join("agent-sock/agent.sock");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut args: Vec<String> = vec![
            "--manifests".into(),
            manifests.display().to_string(),
            "--agent-socket".into(),
            socket.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--node-name".into(),
            format!("node-{suffix}"),
            // Disk thresholds off: not what these tests are about.
            "--eviction-hard".into(),
            "memory.available<100Mi".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self {
            manifests,
            socket,
            args,
        }
    }

    fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    fn write(&self, file: &str, text: &str) {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests.join(file)).unwrap();
    }

    /// `petrel get pods -A -o json` against this agent.
    fn pods(&self) -> serde_json::Value {
        let out = Command::new(petrel_bin())
            .args(["get", "pods", "-A", "-o", "json", "--server"])
            .arg(format!("unix://{}", self.socket.display()))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// Waits until every pod in `names` has all its containers running.
    fn wait_running(&self, names: &[&str], node: &Node) {
        let start = Instant::now();
        loop {
            let pods = self.pods();
            let running = |name: &str| {
                pods["items"].as_array().into_iter().flatten().any(|p| {
                    p["metadata"]["name"] == name
                        && p["status"]["containerStatuses"]
                            .as_array()
                            .is_some_and(|cs| cs.iter().all(|c| c["state"]["running"].is_object()))
                })
            };
            if names.iter().all(|n| running(n)) {
                return;
            }
            assert!(
                start.elapsed() < T,
                "pods {names:?} not running: {pods}\n{}",
                node.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A pod of one container whose SIGTERM handler writes `/out/<name>`
/// before exiting, and whose preStop hook writes `/out/<name>.prestop`.
fn polite(name: &str, out: &Path, grace: u64) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: {grace}\n  volumes:\n  - name: out\n    hostPath:\n      path: {}\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"trap 'echo bye > /out/{name}; exit 0' TERM; while :; do sleep 1; done\"]\n    volumeMounts:\n    - {{name: out, mountPath: /out}}\n    lifecycle:\n      preStop:\n        exec:\n          command: [\"sh\", \"-c\", \"echo stopping > /out/{name}.prestop\"]\n",
        out.display()
    )
}

/// A pod that ignores SIGTERM (its stop takes the whole grace period).
fn stubborn(name: &str, grace: u64) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: {grace}\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"trap '' TERM; while :; do sleep 1; done\"]\n"
    )
}

/// Sends SIGTERM to `pid`.
fn sigterm(pid: u32) {
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
}

#[tokio::test(flavor = "multi_thread")]
async fn node_should_drain_and_remove_its_pods_on_exit_when_asked() {
    let mut node = Node::prepare_with("", "");
    let agent = NodeAgent::new(node.dir.path(), &["--drain-on-exit"]);
    node.spawn_node(&agent.args());
    node.import_busybox(&mut node.clients().await).await;
    let out = node.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    agent.write("a.yaml", &polite("a", &out, 10));
    agent.write("b.yaml", &polite("b", &out, 10));
    agent.wait_running(&["a", "b"], &node);
    assert!(node.live_shims().len() >= 2, "{:?}", node.live_shims());

    let t = Instant::now();
    assert_eq!(node.terminate(), Some(0), "{}", node.log());
    eprintln!("node drained and stopped in {:?}", t.elapsed());
    for name in ["a", "b"] {
        // Stopped gracefully: preStop, then SIGTERM.
        let prestop = std::fs::read_to_string(out.join(format!("{name}.prestop")));
        assert_eq!(prestop.unwrap_or_default().trim(), "stopping", "{name}");
        let bye = std::fs::read_to_string(out.join(name));
        assert_eq!(bye.unwrap_or_default().trim(), "bye", "{name}");
    }
    // And removed: no shim, no runc container, nothing of the pods left.
    assert!(node.live_shims().is_empty(), "{:?}", node.live_shims());
    assert!(node.runc_list().is_empty(), "{:?}", node.runc_list());
    let log = node.log();
    assert!(
        log.contains("drained: no pod of this node is left"),
        "{log}"
    );
    // A log file gets no colour codes.
    assert!(!log.contains('\u{1b}'), "colour codes in the log file");
}

#[tokio::test(flavor = "multi_thread")]
async fn node_should_exit_at_once_on_a_second_signal_while_draining() {
    let mut node = Node::prepare_with("", "");
    let agent = NodeAgent::new(node.dir.path(), &["--drain-on-exit"]);
    node.spawn_node(&agent.args());
    node.import_busybox(&mut node.clients().await).await;
    agent.write("slow.yaml", &stubborn("slow", 60));
    agent.wait_running(&["slow"], &node);
    let pid = node.pid();
    sigterm(pid);
    let start = Instant::now();
    while !node
        .log()
        .contains("draining: every pod is stopped and removed")
    {
        assert!(start.elapsed() < T, "no drain:\n{}", node.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    assert_eq!(node.terminate(), Some(0), "{}", node.log());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the second signal did not end the drain: {:?}",
        t.elapsed()
    );
    assert!(node.log().contains("second signal: exiting at once"));
}

/// Runs `petrel ARGS` with its standard output a pipe nobody reads (the
/// reader end closed first, as `| head` leaves it once satisfied).
fn with_reader_gone(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(petrel_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_should_exit_0_when_its_reader_goes_away_and_print_no_colour_to_a_pipe() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    agent.write_manifest(
        "talker.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: talker\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"seq 1 100000; exec sleep 3600\"]\n"
        ),
    );
    agent.wait_pod("default", "talker", T, "running", |p| {
        petrel_testkit::agent::running(p, "c")
    });
    let id = petrel_testkit::agent::container_id(&agent.pod("default", "talker").unwrap(), "c");
    let id = id.trim_start_matches("petrel://").to_string();
    let endpoint = format!("unix://{}", node.socket.display());
    let server = agent.server_url();
    // The log is complete (100000 lines) before it is read.
    let start = Instant::now();
    while !petrel_testkit::prelude::ok(&node, &["logs", "--tail", "1", &id]).contains("100000") {
        assert!(start.elapsed() < T, "the log never reached 100000");
        std::thread::sleep(Duration::from_millis(100));
    }
    let ctl = |rest: &[&str]| -> Vec<String> {
        ["ctl", "--endpoint", &endpoint]
            .iter()
            .chain(rest)
            .map(|s| s.to_string())
            .collect()
    };
    let get = |rest: &[&str]| -> Vec<String> {
        ["get"]
            .iter()
            .chain(rest)
            .chain(["--server", server.as_str()].iter())
            .map(|s| s.to_string())
            .collect()
    };
    let commands: Vec<Vec<String>> = vec![
        ctl(&["version"]),
        ctl(&["info"]),
        ctl(&["pods"]),
        ctl(&["ps", "-a"]),
        ctl(&["inspect", &id]),
        ctl(&["images"]),
        ctl(&["inspecti", BUSYBOX]),
        ctl(&["imagefsinfo"]),
        ctl(&["logs", &id]),
        ctl(&["logs", "-f", &id]),
        ctl(&["stats"]),
        ctl(&["metrics"]),
        ctl(&["nri"]),
        get(&["pods"]),
        get(&["pods", "-A", "-o", "wide"]),
        get(&["pods", "-o", "json"]),
        get(&["pods", "-o", "yaml"]),
        get(&["pods", "-w"]),
        get(&["node"]),
        vec!["--help".into()],
        vec!["ctl".into(), "--help".into()],
    ];
    let mut failures = Vec::new();
    for args in &commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = with_reader_gone(&args);
        if o.status.code() != Some(0) || !o.stderr.is_empty() {
            failures.push(format!(
                "petrel {}: {} {}",
                args.join(" "),
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        // Read normally (a pipe, not a terminal): no colour codes.
        if !args.contains(&"-w") && !args.contains(&"-f") {
            let o = Command::new(petrel_bin()).args(&args).output().unwrap();
            if o.stdout.contains(&0x1b) || o.stderr.contains(&0x1b) {
                failures.push(format!("petrel {}: colour codes", args.join(" ")));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");

    // As the demo runs it: a shell with pipefail, and `head`.
    let o = Command::new("bash")
        .args([
            "-o",
            "pipefail",
            "-c",
            "\"$0\" ctl --endpoint \"$1\" logs \"$2\" | head -n 3",
        ])
        .arg(petrel_bin())
        .arg(&endpoint)
        .arg(&id)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1\n2\n3\n");
}
