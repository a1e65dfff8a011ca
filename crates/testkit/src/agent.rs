//! A `petrel agent` under test, beside a runtime from [`crate::node::Node`] (or
//! any CRI endpoint): its own manifest directory, root, node name (so its
//! labels never match another test's pods), unix socket (the whole API)
//! and TCP port (health and metrics).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use petrel_cri::api;
use serde_json::Value;

use crate::bins::petrel_bin;
use crate::node::Node;
use crate::process::{
    describe, kill_child, random_suffix, spawn_logged, stop_child, wait_until_ready,
};

/// The command line of a `petrel agent` under test, the kit's one for the
/// end-to-end suite and the bench: its runtime, its own places, names and
/// ports, and the flags of the run.
#[derive(Debug, Clone)]
pub struct AgentArgs {
    /// `--runtime-endpoint`.
    pub endpoint: String,
    /// `--manifests`: the static pod directory.
    pub manifests: PathBuf,
    /// `--root`.
    pub root: PathBuf,
    /// `--listen`: /healthz and /metrics.
    pub listen: std::net::SocketAddr,
    /// `--agent-socket`: the whole API.
    pub socket: PathBuf,
    /// `--node-name`.
    pub node_name: String,
    /// `--cgroup-root`.
    pub cgroup_root: String,
    /// `--eviction-hard`; None: the flags in `extra` say it, or the
    /// agent's defaults hold.
    pub eviction_hard: Option<String>,
    /// More flags, last.
    pub extra: Vec<String>,
}

impl AgentArgs {
    /// `petrel agent` with these flags, run from the binary `petrel`.
    pub fn command(&self, petrel: &Path) -> Command {
        let mut cmd = Command::new(petrel);
        cmd.arg("agent")
            .args(["--runtime-endpoint", &self.endpoint])
            .arg("--manifests")
            .arg(&self.manifests)
            .arg("--root")
            .arg(&self.root)
            .args(["--listen", &self.listen.to_string()])
            .arg("--agent-socket")
            .arg(&self.socket)
            .args(["--node-name", &self.node_name])
            .args(["--cgroup-root", &self.cgroup_root]);
        if let Some(e) = &self.eviction_hard {
            cmd.args(["--eviction-hard", e]);
        }
        cmd.args(&self.extra);
        cmd
    }
}

/// The eviction threshold of an agent whose run is not about eviction:
/// memory only. kubelet's default disk thresholds (nodefs < 10 %, imagefs
/// < 15 % free) may well hold on a shared test machine's disk and would
/// evict or refuse its pods.
pub const QUIET_EVICTION: &str = "memory.available<100Mi";

/// About 8 MB more anonymous memory every 200 ms (a subshell holding a
/// 4 MB string and its copy), 28 times: past a 64Mi threshold on a 256Mi
/// node (192Mi of working set) but short of the limit, so only eviction
/// can stop it, not the OOM killer. The subshells loop rather than exec
/// sleep, which would free their memory.
pub const MEMORY_HOG: &str = "i=0; while [ $i -lt 28 ]; do (x=$(head -c 4000000 /dev/zero | tr '\\000' x); y=\"${x}.\"; while :; do sleep 30; done) & i=$((i+1)); sleep 0.2; done; wait";

/// A running agent.
pub struct Agent {
    pub manifests: PathBuf,
    pub root: PathBuf,
    pub node_name: String,
    /// The TCP port: /healthz and /metrics only (in a cluster: the whole
    /// kubelet API over TLS, on the node's IP).
    pub port: u16,
    /// The address the TCP port is on (loopback unless in a cluster).
    pub listen_ip: std::net::IpAddr,
    /// The unix socket: the whole API.
    pub socket: PathBuf,
    endpoint: String,
    cgroup_root: String,
    extra: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

fn free_port() -> u16 {
    crate::process::free_port().unwrap_or_else(|e| panic!("{e}"))
}

impl Agent {
    /// Starts an agent against `endpoint` with its files under `dir`.
    pub fn start(dir: &Path, endpoint: &str, cgroup_root: &str, extra: &[&str]) -> Agent {
        Self::start_in(dir, None, None, endpoint, cgroup_root, extra)
    }

    /// Starts an agent against the runtime `node` as the node of a cluster
    /// that `creds` were made for (its name, kubeconfig and IP): its TCP
    /// port on the node's IP with the node's serving certificate, clients
    /// with certificates of the cluster's CA, as the API server reaches a
    /// kubelet.
    pub fn in_cluster(
        node: &Node,
        creds: &crate::cluster::NodeCredentials,
        extra: &[&str],
    ) -> Agent {
        let mut args = vec![
            "--tls-cert-file".to_string(),
            creds.serving.cert.display().to_string(),
            "--tls-private-key-file".to_string(),
            creds.serving.key.display().to_string(),
            "--client-ca-file".to_string(),
            creds.client_ca.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::in_cluster_serving_itself(node, creds, &args)
    }

    /// [`Agent::in_cluster`] without a serving certificate or client CA:
    /// the agent makes its own self-signed certificate, as kubelet does.
    pub fn in_cluster_serving_itself(
        node: &Node,
        creds: &crate::cluster::NodeCredentials,
        extra: &[&str],
    ) -> Agent {
        let mut args = vec![
            "--kubeconfig".to_string(),
            creds.kubeconfig.display().to_string(),
            "--node-ip".to_string(),
            creds.node_ip.to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::start_in(
            node.dir.path(),
            None,
            Some((creds.node.clone(), creds.node_ip)),
            &format!("unix://{}", node.socket.display()),
            &node.cgroup_parent,
            &args,
        )
    }

    /// Starts an agent against the runtime `node` whose root is `root`
    /// (e.g. a small filesystem to fill).
    pub fn for_node_at(node: &Node, root: &Path, extra: &[&str]) -> Agent {
        Self::start_in(
            node.dir.path(),
            Some(root.to_path_buf()),
            None,
            &format!("unix://{}", node.socket.display()),
            &node.cgroup_parent,
            extra,
        )
    }

    fn start_in(
        dir: &Path,
        root: Option<PathBuf>,
        node: Option<(String, std::net::IpAddr)>,
        endpoint: &str,
        cgroup_root: &str,
        extra: &[&str],
    ) -> Agent {
        let suffix = random_suffix();
        let manifests = dir.join(format!("manifests-{suffix}"));
        // A node of a cluster makes its own (it may have no static pods).
        if node.is_none() {
            std::fs::create_dir_all(&manifests).expect("manifests dir");
        }
        let mut a = Agent {
            manifests,
            root: root.unwrap_or_else(|| dir.join(format!("agent-{suffix}"))),
            node_name: node
                .as_ref()
                .map_or_else(|| format!("node-{suffix}"), |n| n.0.clone()),
            port: free_port(),
            listen_ip: node
                .as_ref()
                .map_or(std::net::IpAddr::from([127, 0, 0, 1]), |n| n.1),
            socket: dir.join(format!("agent-sock-{suffix}/agent.sock")),
            endpoint: endpoint.to_string(),
            cgroup_root: cgroup_root.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            log: dir.join(format!("agent-{suffix}.log")),
            child: None,
        };
        a.spawn();
        a
    }

    /// Starts an agent against the runtime `node`.
    pub fn for_node(node: &Node, extra: &[&str]) -> Agent {
        Self::start(
            node.dir.path(),
            &format!("unix://{}", node.socket.display()),
            &node.cgroup_parent,
            extra,
        )
    }

    fn spawn(&mut self) {
        let mut extra = vec!["--log-level".to_string(), "debug".to_string()];
        extra.extend(self.extra.iter().cloned());
        let args = AgentArgs {
            endpoint: self.endpoint.clone(),
            manifests: self.manifests.clone(),
            root: self.root.clone(),
            listen: std::net::SocketAddr::new(self.listen_ip, self.port),
            socket: self.socket.clone(),
            node_name: self.node_name.clone(),
            cgroup_root: self.cgroup_root.clone(),
            eviction_hard: self.default_eviction(),
            extra,
        };
        let mut cmd = args.command(&petrel_bin());
        let command = describe(&cmd);
        let child =
            spawn_logged("petrel agent", &mut cmd, &self.log).unwrap_or_else(|e| panic!("{e}"));
        let c = self.child.insert(child);
        let (socket, log) = (self.socket.clone(), self.log.clone());
        let ready = wait_until_ready(
            "petrel agent",
            c,
            Duration::from_secs(20),
            &command,
            &log,
            || healthy(&socket),
        );
        if let Err(e) = ready {
            panic!("{e}\n{}", self.log());
        }
    }

    /// Tests that are not about eviction keep only its memory threshold:
    /// kubelet's default disk thresholds (nodefs < 10 %, imagefs < 15 %
    /// free) may well hold on a shared test machine's disk and would evict
    /// or refuse their pods.
    fn default_eviction(&self) -> Option<String> {
        if self.extra.iter().any(|a| a == "--eviction-hard") {
            None
        } else {
            Some(QUIET_EVICTION.to_string())
        }
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kill -9` the agent.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_child(&mut c);
        }
    }

    /// SIGTERM the agent and wait for it (SIGKILL after 10 s).
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
    }

    /// Starts the agent again with the same settings.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the agent first");
        self.spawn();
    }

    /// Writes a manifest file (atomically, like an editor).
    pub fn write_manifest(&self, file: &str, text: &str) {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.join(file)).expect("rename manifest");
    }

    /// Deletes a manifest file.
    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).expect("remove manifest");
    }

    /// A raw GET on the unix socket: (status code, body), or None if the
    /// agent is unreachable.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        get_unix(&self.socket, path)
    }

    /// A raw GET on the TCP port (health and metrics only).
    pub fn get_tcp(&self, path: &str) -> Option<(u16, String)> {
        let s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        raw_get(s, path)
    }

    /// `unix://` and the socket, for `petrel get --server`.
    pub fn server_url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Runs `petrel get ARGS` against this agent and waits for it.
    pub fn petrel_get(&self, args: &[&str]) -> std::process::Output {
        Command::new(petrel_bin())
            .arg("get")
            .args(args)
            .args(["--server", &self.server_url()])
            .output()
            .expect("run petrel get")
    }
}

/// A raw GET on unix socket `socket`.
fn get_unix(socket: &Path, path: &str) -> Option<(u16, String)> {
    let s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    raw_get(s, path)
}

/// Whether the agent on `socket` answers `/healthz`.
fn healthy(socket: &Path) -> bool {
    get_unix(socket, "/healthz").is_some()
}

/// A GET with `Connection: close` over `s`: (status code, de-chunked body).
fn raw_get<S: Read + Write>(mut s: S, path: &str) -> Option<(u16, String)> {
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((code, body))
}

/// A TCP port on loopback that forwards each connection to the agent's
/// unix socket: for clients that speak only TCP (the streaming client of
/// the tests), as a local proxy would. Ends with the test's runtime.
pub async fn tcp_bridge(socket: &Path) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bridge bind");
    let port = l.local_addr().expect("bridge addr").port();
    let socket = socket.to_path_buf();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = l.accept().await {
            let socket = socket.clone();
            tokio::spawn(async move {
                if let Ok(mut unix) = tokio::net::UnixStream::connect(&socket).await {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                }
            });
        }
    });
    port
}

impl Agent {
    /// Every pod at /pods.
    pub fn pods(&self) -> Vec<Value> {
        let Some((200, body)) = self.get("/pods") else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The pod `ns/name` at /pods/{ns}/{name}.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        match self.get(&format!("/pods/{ns}/{name}")) {
            Some((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    /// Polls the pod until `f` holds, or panics with the pod and the log.
    pub fn wait_pod(
        &self,
        ns: &str,
        name: &str,
        within: Duration,
        what: &str,
        f: impl Fn(&Value) -> bool,
    ) -> Value {
        let within = crate::wait::scaled(within);
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < within {
            if let Some(p) = self.pod(ns, name) {
                if f(&p) {
                    return p;
                }
                last = Some(p);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!(
            "pod {ns}/{name}: not {what} within {within:?}; last seen:\n{}\nagent log:\n{}",
            serde_json::to_string_pretty(&last).unwrap_or_default(),
            tail(&self.log(), 80)
        );
    }

    /// Polls until the pod is gone from /pods.
    pub fn wait_gone(&self, ns: &str, name: &str, within: Duration) {
        let within = crate::wait::scaled(within);
        let start = Instant::now();
        while start.elapsed() < within {
            if self.pod(ns, name).is_none() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!(
            "pod {ns}/{name} still present after {within:?}:\n{}",
            tail(&self.log(), 80)
        );
    }
}

impl Agent {
    fn selector(&self) -> std::collections::HashMap<String, String> {
        [("petrel.io/node".to_string(), self.node_name.clone())].into()
    }

    /// The runtime's containers made by this agent (its node label).
    pub async fn runtime_containers(&self, node: &Node) -> Vec<api::Container> {
        let mut c = node.clients().await;
        c.rt.list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: self.selector(),
                ..Default::default()
            }),
        })
        .await
        .expect("list containers")
        .into_inner()
        .containers
    }

    /// The running ones among them.
    pub async fn live_containers(&self, node: &Node) -> Vec<api::Container> {
        let mut all = self.runtime_containers(node).await;
        all.retain(|c| c.state == api::ContainerState::ContainerRunning as i32);
        all
    }

    /// The runtime's sandboxes made by this agent.
    pub async fn runtime_sandboxes(&self, node: &Node) -> Vec<api::PodSandbox> {
        let mut c = node.clients().await;
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: self.selector(),
                ..Default::default()
            }),
        })
        .await
        .expect("list sandboxes")
        .into_inner()
        .items
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.terminate();
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// The state key (`running`, `waiting`, `terminated`) of container `name`.
pub fn container_state<'a>(pod: &'a Value, name: &str) -> Option<(&'a str, &'a Value)> {
    let statuses = pod["status"]["containerStatuses"].as_array()?;
    let c = statuses.iter().find(|c| c["name"] == name)?;
    let st = c["state"].as_object()?;
    st.iter().next().map(|(k, v)| (k.as_str(), v))
}

/// A container's status object.
pub fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// The `containerID` of container `name` ("" if none).
pub fn container_id(pod: &Value, name: &str) -> String {
    container_status(pod, name)
        .and_then(|c| c["containerID"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Container `name` is running.
pub fn running(pod: &Value, name: &str) -> bool {
    matches!(container_state(pod, name), Some(("running", _)))
}

/// Phase of a pod.
pub fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or("")
}

/// The pod's condition `kind` is True.
pub fn condition(pod: &Value, kind: &str) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// A static pod's manifest: `extra_spec` (indented spec lines, may be
/// empty) before `containers` (list items, e.g. from [`sh_container`]).
pub fn pod_yaml(name: &str, extra_spec: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{extra_spec}  containers:\n{containers}"
    )
}

/// A manifest's busybox container item running `sh -c script`.
pub fn sh_container(name: &str, script: &str) -> String {
    format!(
        "  - name: {name}\n    image: {}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n",
        crate::test_images::BUSYBOX
    )
}
