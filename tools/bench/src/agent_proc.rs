//! The agent under test: a `petrel agent` process started and restarted
//! by the bench beside a runtime, its manifest directory, and a view of
//! its pods through `/pods` (the watch stream when it serves one, polling
//! otherwise).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tokio::sync::mpsc;

use petrel_testkit::agent::{AgentArgs, QUIET_EVICTION};
use petrel_testkit::process::{spawn_logged, stop_child, write_pid_file};

use crate::http;

/// How the agent's PLEG learns about changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--pleg events`: the runtime's GetContainerEvents stream.
    Events,
    /// `--pleg relist --relist-period 1s`: kubelet's generic PLEG.
    Relist,
}

impl Mode {
    /// The value of `--pleg`.
    pub fn arg(self) -> &'static str {
        match self {
            Mode::Events => "events",
            Mode::Relist => "relist",
        }
    }

    /// The other mode.
    pub fn other(self) -> Mode {
        match self {
            Mode::Events => Mode::Relist,
            Mode::Relist => Mode::Events,
        }
    }
}

/// The namespace of every bench pod.
pub const NAMESPACE: &str = "bench";

/// The relist period of relist mode (kubelet's).
pub const RELIST_PERIOD: &str = "1s";

/// A `petrel agent` of the bench.
pub struct AgentProc {
    petrel: PathBuf,
    endpoint: String,
    /// The manifest directory.
    pub manifests: PathBuf,
    root: PathBuf,
    /// `--node-name`: the label value on everything it creates.
    pub node: String,
    /// `--cgroup-root`: the cgroup parent of its pods.
    pub cgroup_root: String,
    log: PathBuf,
    /// Where its log and pid file are.
    dir: PathBuf,
    /// Its TCP port: /healthz and /metrics.
    pub addr: SocketAddr,
    /// Its unix socket: pods and the rest of the API.
    pub socket: PathBuf,
    /// The mode it runs in.
    pub mode: Mode,
    /// Its last start: spawn → /healthz 200 and the PLEG's first relist.
    pub last_startup: Duration,
    /// `--eviction-hard` of the next start.
    pub eviction_hard: String,
    /// More flags for the next start.
    pub extra_args: Vec<String>,
    child: Option<Child>,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind a free port")?;
    Ok(l.local_addr().context("local address")?.port())
}

impl AgentProc {
    /// Prepares an agent (not started) with its files under `dir`.
    pub fn new(
        petrel: &Path,
        endpoint: &str,
        dir: &Path,
        node: &str,
        cgroup_root: &str,
    ) -> Result<AgentProc> {
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)
            .with_context(|| format!("create {}", manifests.display()))?;
        Ok(AgentProc {
            petrel: petrel.to_path_buf(),
            endpoint: endpoint.to_string(),
            manifests,
            root: dir.join("agent-root"),
            node: node.to_string(),
            cgroup_root: cgroup_root.to_string(),
            log: dir.join("agent.log"),
            dir: dir.to_path_buf(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            socket: dir.join("agent-sock/agent.sock"),
            mode: Mode::Events,
            last_startup: Duration::ZERO,
            // The bench measures pods, not disk pressure.
            eviction_hard: QUIET_EVICTION.to_string(),
            extra_args: vec![],
            child: None,
        })
    }

    /// Starts the agent in `mode` and waits until `/healthz` answers 200.
    pub async fn start(&mut self, mode: Mode) -> Result<()> {
        if self.child.is_some() {
            bail!("the agent is already running");
        }
        self.mode = mode;
        self.addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut extra = vec!["--pleg".to_string(), mode.arg().to_string()];
        if mode == Mode::Relist {
            extra.extend(["--relist-period".to_string(), RELIST_PERIOD.to_string()]);
        }
        extra.extend(self.extra_args.iter().cloned());
        let args = AgentArgs {
            endpoint: self.endpoint.clone(),
            manifests: self.manifests.clone(),
            root: self.root.clone(),
            listen: self.addr,
            socket: self.socket.clone(),
            node_name: self.node.clone(),
            cgroup_root: self.cgroup_root.clone(),
            eviction_hard: Some(self.eviction_hard.clone()),
            extra,
        };
        let child = spawn_logged("petrel agent", &mut args.command(&self.petrel), &self.log)?;
        write_pid_file(&self.dir, "agent", child.id());
        self.child = Some(child);
        let start = Instant::now();
        let mut last = String::from("no answer");
        while start.elapsed() < Duration::from_secs(30) {
            match http::get(self.addr, "/healthz", Duration::from_secs(2)).await {
                Ok(r) if r.status == 200 => return self.wait_first_relist(start).await,
                Ok(r) => {
                    last = format!(
                        "status {}: {}",
                        r.status,
                        String::from_utf8_lossy(&r.body).trim()
                    )
                }
                Err(e) => last = format!("{e:#}"),
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait().context("wait for the agent")? {
                    self.child = None;
                    bail!("agent exited at start ({st}):\n{}", self.log_tail());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "agent's /healthz not 200 within 30 s (last: {last}):\n{}",
            self.log_tail()
        )
    }

    /// Waits until the PLEG's first relist is done (the agent adopts and
    /// starts pods only after it; /healthz may answer before): its
    /// relist counter at /metrics is at least 1.
    async fn wait_first_relist(&mut self, start: Instant) -> Result<()> {
        let name = "kubelet_pleg_relist_duration_seconds_count";
        while start.elapsed() < Duration::from_secs(60) {
            let text = self.metrics().await?;
            let count = text.lines().find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            });
            match count {
                Some(n) if n >= 1.0 => {
                    self.last_startup = start.elapsed();
                    return Ok(());
                }
                Some(_) => {}
                None => bail!("no {name} at the agent's /metrics"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "the agent's PLEG did not relist within 60 s of its start:\n{}",
            self.log_tail()
        )
    }

    /// Stops the agent (SIGTERM, SIGKILL after 10 s); its pods keep running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Duration::from_secs(10));
        }
    }

    /// Stops the agent and starts it again in `mode`.
    pub async fn restart(&mut self, mode: Mode) -> Result<()> {
        self.stop();
        self.start(mode).await
    }

    /// The agent's pid (0 when stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// The agent's whole log (every start appends to it).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the agent's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn manifest_path(&self, name: &str) -> PathBuf {
        self.manifests.join(format!("{name}.yaml"))
    }

    /// Writes the manifest of pod `name` to a hidden temporary file; the
    /// returned closure renames it into place (the moment the agent may
    /// see it) and returns that moment.
    pub fn stage_manifest(&self, name: &str, text: &str) -> Result<Staged> {
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
        Ok(Staged {
            tmp,
            path: self.manifest_path(name),
        })
    }

    /// Writes the manifest of pod `name` in one step.
    pub fn write_manifest(&self, name: &str, text: &str) -> Result<Instant> {
        self.stage_manifest(name, text)?.publish()
    }

    /// Deletes the manifest of pod `name`.
    pub fn remove_manifest(&self, name: &str) -> Result<()> {
        let p = self.manifest_path(name);
        std::fs::remove_file(&p).with_context(|| format!("remove {}", p.display()))
    }

    /// The unix socket, as an HTTP endpoint.
    pub fn api(&self) -> http::Endpoint {
        http::Endpoint::Unix(self.socket.clone())
    }

    /// GET `path` on the socket, status 200 required.
    pub async fn get(&self, path: &str) -> Result<Vec<u8>> {
        let r = http::get(self.api(), path, Duration::from_secs(30)).await?;
        if r.status != 200 {
            bail!(
                "GET {path}: status {}: {}",
                r.status,
                String::from_utf8_lossy(&r.body).trim()
            );
        }
        Ok(r.body)
    }

    /// Every pod at `/pods`.
    pub async fn pods(&self) -> Result<Vec<Value>> {
        let body = self.get("/pods").await?;
        let v: Value = serde_json::from_slice(&body).context("/pods is not JSON")?;
        Ok(v.get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default())
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.get("/metrics").await?).into_owned())
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A manifest written to a temporary file, not yet in place.
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
}

impl Staged {
    /// Renames it into place; returns the moment just before the rename.
    pub fn publish(self) -> Result<Instant> {
        let t = Instant::now();
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("rename to {}", self.path.display()))?;
        Ok(t)
    }
}

/// The manifest of a bench pod: `containers` busybox containers running
/// `sleep`, grace period 0 (the bench removes pods without waiting).
pub fn manifest(name: &str, containers: usize, restart: &str, host_network: bool) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n  restartPolicy: {restart}\n  terminationGracePeriodSeconds: 0\n"
    );
    if host_network {
        s.push_str("  hostNetwork: true\n");
    }
    s.push_str("  containers:\n");
    for i in 0..containers {
        s.push_str(&format!(
            "  - name: c{i}\n    image: {}\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"86400\"]\n",
            crate::node::BUSYBOX
        ));
    }
    s
}

/// The state key (`running`, `waiting`, `terminated`) and value of
/// container `name` of a pod.
pub fn container_state<'a>(pod: &'a Value, name: &str) -> Option<(&'a str, &'a Value)> {
    let c = pod
        .pointer("/status/containerStatuses")?
        .as_array()?
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))?;
    c.get("state")?
        .as_object()?
        .iter()
        .next()
        .map(|(k, v)| (k.as_str(), v))
}

/// Every one of the pod's `n` containers is running.
pub fn all_running(pod: &Value, n: usize) -> bool {
    let Some(cs) = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
    else {
        return false;
    };
    cs.len() == n
        && cs
            .iter()
            .all(|c| c.pointer("/state/running").is_some_and(Value::is_object))
}

/// The exit code of container `name` if it is terminated.
pub fn terminated_code(pod: &Value, name: &str) -> Option<i64> {
    match container_state(pod, name) {
        Some(("terminated", v)) => Some(v.get("exitCode").and_then(Value::as_i64).unwrap_or(-1)),
        _ => None,
    }
}

/// The status of container `name` of a pod.
fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod.pointer("/status/containerStatuses")?
        .as_array()?
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
}

/// The `restartCount` of container `name` (0 when absent).
pub fn restart_count(pod: &Value, name: &str) -> i64 {
    container_status(pod, name)
        .and_then(|c| c.get("restartCount"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Whether the pod's status shows the exit of container `name`'s
/// instance `id`, which had been restarted `restarts` times, and with
/// which exit code (-1 when none is given): the container terminated,
/// or restarted since (`restartCount` above `restarts`, or
/// `lastState.terminated` naming `id`), as kubelet shows a container
/// with `restartPolicy: Always` that exited.
pub fn exit_shown(pod: &Value, name: &str, id: &str, restarts: i64) -> Option<i64> {
    let code = |t: &Value| t.get("exitCode").and_then(Value::as_i64).unwrap_or(-1);
    if let Some(("terminated", t)) = container_state(pod, name) {
        return Some(code(t));
    }
    let c = container_status(pod, name)?;
    let last = c.pointer("/lastState/terminated").filter(|t| t.is_object());
    let names_id = last
        .and_then(|t| t.get("containerID"))
        .and_then(Value::as_str)
        .is_some_and(|cid| cid.ends_with(id));
    let restarted = restart_count(pod, name) > restarts;
    match last {
        Some(t) if names_id || restarted => Some(code(t)),
        None if restarted => Some(-1),
        _ => None,
    }
}

/// The runtime's id of container `name` (`containerID` without its
/// `runtime://` prefix).
pub fn container_id(pod: &Value, name: &str) -> Option<String> {
    let c = pod
        .pointer("/status/containerStatuses")?
        .as_array()?
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))?;
    let id = c.get("containerID")?.as_str()?;
    let id = id.split_once("://").map(|(_, i)| i).unwrap_or(id);
    (!id.is_empty()).then(|| id.to_string())
}

fn key_of(pod: &Value) -> Option<String> {
    let ns = pod.pointer("/metadata/namespace")?.as_str()?;
    let name = pod.pointer("/metadata/name")?.as_str()?;
    Some(format!("{ns}/{name}"))
}

/// How the bench sees the agent's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObserveMethod {
    /// `GET /pods?watch=true`, each event stamped when its last byte arrived.
    Watch,
    /// `GET /pods/{ns}/{name}` every [`POLL_EVERY`], stamped on each answer.
    Poll,
}

/// The polling interval when there is no watch stream.
pub const POLL_EVERY: Duration = Duration::from_millis(2);

/// The bench's view of the agent's pods.
pub struct Observer {
    addr: http::Endpoint,
    rx: Option<mpsc::UnboundedReceiver<http::Line>>,
    /// The latest version of each pod seen, by `ns/name`.
    latest: HashMap<String, Value>,
    /// Why the watch stream is not used, if it is not.
    pub watch_error: Option<String>,
}

impl Observer {
    /// Opens a watch on `agent`, or falls back to polling.
    pub async fn open(agent: &AgentProc) -> Observer {
        let mut o = Observer {
            addr: agent.api(),
            rx: None,
            latest: HashMap::new(),
            watch_error: None,
        };
        match http::stream_lines(agent.api(), "/pods?watch=true").await {
            Ok(rx) => o.rx = Some(rx),
            Err(e) => o.watch_error = Some(format!("{e:#}")),
        }
        o
    }

    /// Which method is in use.
    pub fn method(&self) -> ObserveMethod {
        if self.rx.is_some() {
            ObserveMethod::Watch
        } else {
            ObserveMethod::Poll
        }
    }

    fn apply(&mut self, line: &http::Line) {
        let Ok(ev) = serde_json::from_str::<Value>(&line.text) else {
            return;
        };
        let (kind, obj) = match (ev.get("type").and_then(Value::as_str), ev.get("object")) {
            (Some(k), Some(o)) => (k, o),
            // A bare pod (a server that streams objects).
            _ => ("MODIFIED", &ev),
        };
        let Some(key) = key_of(obj) else { return };
        if kind == "DELETED" {
            self.latest.remove(&key);
        } else {
            self.latest.insert(key, obj.clone());
        }
    }

    /// Applies every event received so far.
    pub fn drain(&mut self) -> Result<()> {
        let mut lines = vec![];
        if let Some(rx) = self.rx.as_mut() {
            loop {
                match rx.try_recv() {
                    Ok(l) => lines.push(l),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        bail!("the agent closed the watch stream")
                    }
                }
            }
        }
        for l in &lines {
            self.apply(l);
        }
        Ok(())
    }

    /// Waits until pod `name` satisfies `pred`; returns when the bench
    /// learnt it (the arrival of the watch event, or the poll's answer)
    /// and the pod.
    pub async fn wait_for(
        &mut self,
        name: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<(Instant, Value)> {
        let key = format!("{NAMESPACE}/{name}");
        let deadline = Instant::now() + timeout;
        if self.rx.is_none() {
            let path = format!("/pods/{NAMESPACE}/{name}");
            while Instant::now() < deadline {
                let r = http::get(self.addr.clone(), &path, Duration::from_secs(10)).await?;
                let at = Instant::now();
                if r.status == 200 {
                    if let Ok(pod) = serde_json::from_slice::<Value>(&r.body) {
                        if pred(&pod) {
                            return Ok((at, pod));
                        }
                        self.latest.insert(key.clone(), pod);
                    }
                }
                tokio::time::sleep(POLL_EVERY).await;
            }
            bail!(
                "pod {key}: condition not met within {timeout:?}; last seen {}",
                self.describe(name)
            );
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.rx.as_mut() {
                Some(rx) => tokio::time::timeout(left, rx.recv()).await,
                None => bail!("no watch stream"),
            };
            match line {
                Ok(Some(l)) => {
                    self.apply(&l);
                    if let Some(pod) = self.latest.get(&key) {
                        if pred(pod) {
                            return Ok((l.at, pod.clone()));
                        }
                    }
                }
                Ok(None) => bail!("the agent closed the watch stream"),
                Err(_) => bail!(
                    "pod {key}: condition not met within {timeout:?}; last seen {}",
                    self.describe(name)
                ),
            }
        }
    }

    /// The latest version of pod `name`, if seen.
    pub fn latest(&self, name: &str) -> Option<&Value> {
        self.latest.get(&format!("{NAMESPACE}/{name}"))
    }

    /// A short description of the latest version of pod `name`.
    pub fn describe(&self, name: &str) -> String {
        match self.latest(name) {
            None => "never".to_string(),
            Some(p) => {
                let s = p.get("status").cloned().unwrap_or(Value::Null);
                let text = s.to_string();
                text.chars().take(600).collect()
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(states: &[&str]) -> Value {
        let cs: Vec<Value> = states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let state = match *s {
                    "running" => serde_json::json!({"running": {"startedAt": "x"}}),
                    "killed" => serde_json::json!({"terminated": {"exitCode": 137}}),
                    _ => serde_json::json!({"waiting": {"reason": "ContainerCreating"}}),
                };
                serde_json::json!({"name": format!("c{i}"), "state": state, "containerID": format!("petrel://id{i}")})
            })
            .collect();
        serde_json::json!({"metadata": {"name": "p", "namespace": "bench"}, "status": {"containerStatuses": cs}})
    }

    #[test]
    fn predicates_should_read_kubernetes_container_states() {
        assert!(all_running(&pod(&["running", "running"]), 2));
        assert!(!all_running(&pod(&["running", "waiting"]), 2));
        assert!(!all_running(&pod(&["running"]), 2));
        assert_eq!(terminated_code(&pod(&["killed"]), "c0"), Some(137));
        assert_eq!(terminated_code(&pod(&["running"]), "c0"), None);
        assert_eq!(
            container_id(&pod(&["running"]), "c0").as_deref(),
            Some("id0")
        );
    }

    #[test]
    fn exit_shown_should_see_a_terminated_or_restarted_container() {
        let status = |c: Value| {
            serde_json::json!({"metadata": {"name": "p", "namespace": "bench"},
                "status": {"containerStatuses": [c]}})
        };
        // Still running as before the kill: not shown.
        let before = status(serde_json::json!({"name": "c0", "restartCount": 2,
            "state": {"running": {}}, "containerID": "petrel://old",
            "lastState": {"terminated": {"exitCode": 137, "containerID": "petrel://older"}}}));
        assert_eq!(restart_count(&before, "c0"), 2);
        assert_eq!(exit_shown(&before, "c0", "old", 2), None);
        // Terminated, waiting for its restart.
        let terminated = pod(&["killed"]);
        assert_eq!(exit_shown(&terminated, "c0", "id0", 0), Some(137));
        // Restarted: running again, the exit in lastState, the count up.
        let restarted = status(serde_json::json!({"name": "c0", "restartCount": 3,
            "state": {"running": {}}, "containerID": "petrel://new",
            "lastState": {"terminated": {"exitCode": 137, "containerID": "petrel://old"}}}));
        assert_eq!(exit_shown(&restarted, "c0", "old", 2), Some(137));
        // In back-off: waiting, lastState names the killed instance.
        let backoff = status(serde_json::json!({"name": "c0", "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 137, "containerID": "petrel://old"}}}));
        assert_eq!(exit_shown(&backoff, "c0", "old", 2), Some(137));
        assert_eq!(exit_shown(&backoff, "c1", "old", 2), None);
    }

    #[test]
    fn manifest_should_be_a_v1_pod_with_n_containers() {
        let m = manifest("big-0001", 3, "Always", true);
        assert!(m.contains("name: big-0001\n  namespace: bench"));
        assert!(m.contains("hostNetwork: true"));
        assert_eq!(m.matches("- name: c").count(), 3);
        assert!(!manifest("x", 1, "Never", false).contains("hostNetwork"));
    }

    #[test]
    fn observer_should_apply_watch_events() {
        let mut o = Observer {
            addr: http::Endpoint::Tcp(SocketAddr::from(([127, 0, 0, 1], 1))),
            rx: None,
            latest: HashMap::new(),
            watch_error: None,
        };
        let line = |t: &str| http::Line {
            at: Instant::now(),
            text: t.to_string(),
        };
        let p = pod(&["running"]);
        o.apply(&line(
            &serde_json::json!({"type": "ADDED", "object": p}).to_string(),
        ));
        assert!(o.latest("p").is_some());
        o.apply(&line(
            &serde_json::json!({"type": "DELETED", "object": p}).to_string(),
        ));
        assert!(o.latest("p").is_none());
    }
}
