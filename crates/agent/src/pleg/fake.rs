//! An in-memory [`RuntimeApi`] for the PLEG's unit tests: pods and
//! containers the test controls, per-call delays and failures, call counts,
//! and scripted event streams.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use petrel_cri::api;
use tokio::sync::mpsc;

use crate::cache::now_ns;
use crate::cri::{CriError, CriResult, EventStream, ExecOutput, RuntimeApi};
use crate::types::{ANNOTATION_CONTAINER_KIND, LABEL_MANAGED_BY, LABEL_POD_UID};

/// The sender side of a scripted stream: send events or an error; drop it
/// to end the stream.
pub(crate) type StreamTx = mpsc::UnboundedSender<CriResult<api::ContainerEventResponse>>;

enum Script {
    Fail(tonic::Code),
    Stream(mpsc::UnboundedReceiver<CriResult<api::ContainerEventResponse>>),
}

#[derive(Clone)]
struct Sandbox {
    uid: String,
    node: String,
    ready: bool,
    created_at: i64,
}

#[derive(Clone)]
struct Container {
    sandbox: String,
    uid: String,
    node: String,
    name: String,
    state: api::ContainerState,
    created_at: i64,
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<String, Sandbox>,
    containers: HashMap<String, Container>,
    next: i64,
}

/// The fake runtime.
#[derive(Default)]
pub(crate) struct FakeRuntime {
    state: Mutex<State>,
    calls: Mutex<HashMap<&'static str, usize>>,
    delays: Mutex<HashMap<&'static str, Duration>>,
    failing: Mutex<HashMap<&'static str, tonic::Code>>,
    failing_ids: Mutex<HashSet<String>>,
    scripts: Mutex<VecDeque<Script>>,
    inflight: AtomicUsize,
    max_inflight: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn err(operation: &'static str, code: tonic::Code, message: &str) -> CriError {
    CriError {
        operation,
        code,
        message: message.to_string(),
    }
}

fn matches(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl FakeRuntime {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    // ---- the test's controls ----

    /// Adds a ready sandbox of pod `uid` made by `node`; returns its id.
    pub(crate) fn add_sandbox(&self, uid: &str, node: &str) -> String {
        let mut s = lock(&self.state);
        s.next += 1;
        let id = format!("sb{}", s.next);
        let created_at = s.next;
        s.sandboxes.insert(
            id.clone(),
            Sandbox {
                uid: uid.into(),
                node: node.into(),
                ready: true,
                created_at,
            },
        );
        id
    }

    /// Adds a container to sandbox `sb`; returns its id.
    pub(crate) fn add_container(&self, sb: &str, name: &str, state: api::ContainerState) -> String {
        let mut s = lock(&self.state);
        s.next += 1;
        let id = format!("c{}", s.next);
        let created_at = s.next;
        let (uid, node) = s
            .sandboxes
            .get(sb)
            .map(|b| (b.uid.clone(), b.node.clone()))
            .unwrap_or_default();
        s.containers.insert(
            id.clone(),
            Container {
                sandbox: sb.into(),
                uid,
                node,
                name: name.into(),
                state,
                created_at,
            },
        );
        id
    }

    /// Changes a container's state.
    pub(crate) fn set_state(&self, id: &str, state: api::ContainerState) {
        if let Some(c) = lock(&self.state).containers.get_mut(id) {
            c.state = state;
        }
    }

    /// Marks a sandbox not ready.
    pub(crate) fn stop_sandbox(&self, id: &str) {
        if let Some(s) = lock(&self.state).sandboxes.get_mut(id) {
            s.ready = false;
        }
    }

    /// Removes a container or sandbox.
    pub(crate) fn remove(&self, id: &str) {
        let mut s = lock(&self.state);
        s.containers.remove(id);
        s.sandboxes.remove(id);
    }

    /// The state of a container now.
    pub(crate) fn state_of(&self, id: &str) -> Option<api::ContainerState> {
        lock(&self.state).containers.get(id).map(|c| c.state)
    }

    /// Delays every call of `op` (a CRI operation name).
    pub(crate) fn delay(&self, op: &'static str, d: Duration) {
        lock(&self.delays).insert(op, d);
    }

    /// Makes every call of `op` fail with `code` (None: succeed again).
    pub(crate) fn fail(&self, op: &'static str, code: Option<tonic::Code>) {
        match code {
            Some(c) => lock(&self.failing).insert(op, c),
            None => lock(&self.failing).remove(op),
        };
    }

    /// Makes status calls on `id` fail (Internal) until cleared.
    pub(crate) fn fail_id(&self, id: &str, failing: bool) {
        if failing {
            lock(&self.failing_ids).insert(id.into());
        } else {
            lock(&self.failing_ids).remove(id);
        }
    }

    /// The next `container_events` call fails with `code`.
    pub(crate) fn script_failure(&self, code: tonic::Code) {
        lock(&self.scripts).push_back(Script::Fail(code));
    }

    /// The next `container_events` call connects a stream the test feeds.
    /// Without a script, calls fail with Unavailable.
    pub(crate) fn script_stream(&self) -> StreamTx {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.scripts).push_back(Script::Stream(rx));
        tx
    }

    /// Calls of `op` so far.
    pub(crate) fn calls(&self, op: &str) -> usize {
        lock(&self.calls).get(op).copied().unwrap_or(0)
    }

    /// Calls of every operation so far.
    pub(crate) fn total_calls(&self) -> usize {
        lock(&self.calls).values().sum()
    }

    /// The most status calls that were in flight at once.
    pub(crate) fn max_inflight_status(&self) -> usize {
        self.max_inflight.load(Ordering::SeqCst)
    }

    /// An event of `kind` for `id`, with its pod's sandbox status in the
    /// payload (like containerd and Petrel), stamped now.
    pub(crate) fn event(
        &self,
        id: &str,
        kind: api::ContainerEventType,
    ) -> api::ContainerEventResponse {
        let s = lock(&self.state);
        let sb_id = s
            .containers
            .get(id)
            .map(|c| c.sandbox.clone())
            .unwrap_or_else(|| id.to_string());
        let sandbox = s.sandboxes.get(&sb_id).map(|b| sandbox_status(&sb_id, b));
        api::ContainerEventResponse {
            container_id: id.into(),
            container_event_type: kind as i32,
            created_at: now_ns(),
            pod_sandbox_status: sandbox,
            containers_statuses: Vec::new(),
        }
    }

    // ---- plumbing ----

    /// Counts, delays and fails a call; the snapshot is taken by the
    /// caller after this returns (so a delayed call sees late state) unless
    /// it snapshots first.
    async fn enter(&self, op: &'static str) -> CriResult<()> {
        *lock(&self.calls).entry(op).or_default() += 1;
        let delay = lock(&self.delays).get(op).copied();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        if let Some(code) = lock(&self.failing).get(op).copied() {
            return Err(err(op, code, "injected failure"));
        }
        Ok(())
    }

    /// Runs a status call: snapshot first, then the delay (a slow call
    /// returns what was true when it began), tracking concurrency.
    async fn status_call<T>(
        &self,
        op: &'static str,
        id: &str,
        snapshot: impl FnOnce(&State) -> Option<T>,
    ) -> CriResult<T> {
        let now = self.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inflight.fetch_max(now, Ordering::SeqCst);
        let snap = snapshot(&lock(&self.state));
        let r = self.enter(op).await;
        self.inflight.fetch_sub(1, Ordering::SeqCst);
        r?;
        if lock(&self.failing_ids).contains(id) {
            return Err(err(op, tonic::Code::Internal, "injected failure"));
        }
        snap.ok_or_else(|| err(op, tonic::Code::NotFound, id))
    }
}

fn sandbox_labels(b: &Sandbox) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_MANAGED_BY.to_string(), b.node.clone()),
        (LABEL_POD_UID.to_string(), b.uid.clone()),
    ])
}

fn container_labels(c: &Container) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_MANAGED_BY.to_string(), c.node.clone()),
        (LABEL_POD_UID.to_string(), c.uid.clone()),
    ])
}

fn sandbox_state(b: &Sandbox) -> i32 {
    if b.ready {
        api::PodSandboxState::SandboxReady as i32
    } else {
        api::PodSandboxState::SandboxNotready as i32
    }
}

fn sandbox_status(id: &str, b: &Sandbox) -> api::PodSandboxStatus {
    api::PodSandboxStatus {
        id: id.into(),
        metadata: Some(api::PodSandboxMetadata {
            name: format!("pod-{}", b.uid),
            uid: b.uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        state: sandbox_state(b),
        created_at: b.created_at,
        labels: sandbox_labels(b),
        ..Default::default()
    }
}

#[async_trait::async_trait]
impl RuntimeApi for FakeRuntime {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        self.enter("version").await?;
        Ok(api::VersionResponse::default())
    }

    async fn status(&self) -> CriResult<api::RuntimeStatus> {
        self.enter("status").await?;
        Ok(api::RuntimeStatus::default())
    }

    async fn list_pod_sandboxes(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        self.enter("list_podsandbox").await?;
        let s = lock(&self.state);
        Ok(s.sandboxes
            .iter()
            .filter(|(_, b)| matches(&sandbox_labels(b), &labels))
            .map(|(id, b)| api::PodSandbox {
                id: id.clone(),
                metadata: sandbox_status(id, b).metadata,
                state: sandbox_state(b),
                created_at: b.created_at,
                labels: sandbox_labels(b),
                ..Default::default()
            })
            .collect())
    }

    async fn list_containers(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::Container>> {
        self.enter("list_containers").await?;
        let s = lock(&self.state);
        Ok(s.containers
            .iter()
            .filter(|(_, c)| matches(&container_labels(c), &labels))
            .map(|(id, c)| api::Container {
                id: id.clone(),
                pod_sandbox_id: c.sandbox.clone(),
                metadata: Some(api::ContainerMetadata {
                    name: c.name.clone(),
                    attempt: 0,
                }),
                state: c.state as i32,
                created_at: c.created_at,
                labels: container_labels(c),
                ..Default::default()
            })
            .collect())
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<api::PodSandboxStatus> {
        self.status_call("podsandbox_status", id, |s| {
            s.sandboxes.get(id).map(|b| sandbox_status(id, b))
        })
        .await
    }

    async fn container_status(&self, id: &str) -> CriResult<api::ContainerStatus> {
        self.status_call("container_status", id, |s| {
            s.containers.get(id).map(|c| api::ContainerStatus {
                id: id.into(),
                metadata: Some(api::ContainerMetadata {
                    name: c.name.clone(),
                    attempt: 0,
                }),
                state: c.state as i32,
                created_at: c.created_at,
                labels: container_labels(c),
                annotations: HashMap::from([(
                    ANNOTATION_CONTAINER_KIND.to_string(),
                    if c.name.starts_with("init") {
                        "init"
                    } else {
                        "app"
                    }
                    .to_string(),
                )]),
                ..Default::default()
            })
        })
        .await
    }

    async fn run_pod_sandbox(&self, _config: api::PodSandboxConfig) -> CriResult<String> {
        Err(err("run_podsandbox", tonic::Code::Unimplemented, "fake"))
    }

    async fn stop_pod_sandbox(&self, _id: &str) -> CriResult<()> {
        Err(err("stop_podsandbox", tonic::Code::Unimplemented, "fake"))
    }

    async fn remove_pod_sandbox(&self, _id: &str) -> CriResult<()> {
        Err(err("remove_podsandbox", tonic::Code::Unimplemented, "fake"))
    }

    async fn create_container(
        &self,
        _sandbox_id: &str,
        _config: api::ContainerConfig,
        _sandbox_config: api::PodSandboxConfig,
    ) -> CriResult<String> {
        Err(err("create_container", tonic::Code::Unimplemented, "fake"))
    }

    async fn start_container(&self, _id: &str) -> CriResult<()> {
        Err(err("start_container", tonic::Code::Unimplemented, "fake"))
    }

    async fn stop_container(&self, _id: &str, _timeout_secs: i64) -> CriResult<()> {
        Err(err("stop_container", tonic::Code::Unimplemented, "fake"))
    }

    async fn remove_container(&self, _id: &str) -> CriResult<()> {
        Err(err("remove_container", tonic::Code::Unimplemented, "fake"))
    }

    async fn exec_sync(
        &self,
        _id: &str,
        _cmd: Vec<String>,
        _timeout_secs: i64,
    ) -> CriResult<ExecOutput> {
        Err(err("exec_sync", tonic::Code::Unimplemented, "fake"))
    }

    async fn image_status(&self, _image: &str) -> CriResult<Option<api::Image>> {
        Err(err("image_status", tonic::Code::Unimplemented, "fake"))
    }

    async fn pull_image(
        &self,
        _image: &str,
        _sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        Err(err("pull_image", tonic::Code::Unimplemented, "fake"))
    }

    async fn container_events(&self) -> CriResult<EventStream> {
        *lock(&self.calls).entry("get_container_events").or_default() += 1;
        let script = lock(&self.scripts).pop_front();
        match script {
            Some(Script::Stream(rx)) => Ok(Box::pin(
                tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            )),
            Some(Script::Fail(code)) => Err(err("get_container_events", code, "scripted")),
            None => Err(err(
                "get_container_events",
                tonic::Code::Unavailable,
                "connection refused",
            )),
        }
    }
}
