//! An in-memory [`RuntimeObserver`] and [`RuntimeActuator`] for unit tests of the PLEG and the pod
//! workers.
//!
//! Two ways to use it:
//! - **Scripted** (the PLEG's tests): the test adds sandboxes and
//!   containers, changes their states, feeds event streams by hand, and
//!   sets fixed per-call delays and failures.
//! - **Faithful** (the pod workers' fault tests): the mutating CRI calls
//!   behave like a runtime's (RunPodSandbox, CreateContainer, Start, Stop,
//!   Remove, with labels, annotations, metadata and timestamps from the
//!   configs) and publish CRI events to live subscribers. [`Faults`] then
//!   injects seeded random trouble: call delays, UNAVAILABLE before or
//!   after a call took effect, events late, duplicated, reordered, dropped,
//!   streams cut, containers and sandboxes dying by themselves. The fake
//!   checks the agent's invariants on every create and start and records
//!   each violation (see [`FakeRuntime::violations`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_cri::api::ContainerEventType as Ev;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;

use crate::cache::now_ns;
use crate::cri::{
    ContainerSummary, CriError, CriResult, EventStream, ExecOutput, RuntimeActuator,
    RuntimeObserver, LISTED_LABELS,
};
use crate::types::{
    ANNOTATION_CONTAINER_KIND, KIND_APP, KIND_INIT, KIND_SIDECAR, LABEL_MANAGED_BY, LABEL_POD_UID,
};

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
    ready: bool,
    created_at: i64,
    metadata: api::PodSandboxMetadata,
    labels: HashMap<String, String>,
    annotations: HashMap<String, String>,
    /// Names of the init containers created in this sandbox, and whether
    /// one of their instances did its part (a regular one exited 0, a
    /// sidecar started): a container may be created only once every other
    /// has, whatever is removed later.
    inits: HashMap<String, bool>,
}

/// Which part a container plays in its pod, from the kind the agent wrote
/// on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Runs to completion before the next init container starts.
    Init,
    /// An init container kept running beside everything after it.
    Sidecar,
    App,
}

impl Kind {
    fn of(annotations: &HashMap<String, String>) -> Self {
        match annotations
            .get(ANNOTATION_CONTAINER_KIND)
            .map(String::as_str)
        {
            Some(KIND_INIT) => Kind::Init,
            Some(KIND_SIDECAR) => Kind::Sidecar,
            _ => Kind::App,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Kind::Init => KIND_INIT,
            Kind::Sidecar => KIND_SIDECAR,
            Kind::App => KIND_APP,
        }
    }
}

#[derive(Clone)]
struct Container {
    sandbox: String,
    uid: String,
    name: String,
    kind: Kind,
    state: api::ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    attempt: u32,
    image: String,
    labels: HashMap<String, String>,
    annotations: HashMap<String, String>,
    /// An init container exits by itself at this time, with this code.
    planned_exit: Option<(Instant, i32)>,
}

impl Container {
    fn live(&self) -> bool {
        matches!(
            self.state,
            api::ContainerState::ContainerCreated | api::ContainerState::ContainerRunning
        )
    }
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<String, Sandbox>,
    containers: HashMap<String, Container>,
    next: i64,
    /// The last runtime timestamp handed out (ns, strictly increasing).
    clock: i64,
}

impl State {
    /// A runtime timestamp: now, but always after the previous one, so
    /// creation order is timestamp order (as the pod workers assume).
    fn stamp(&mut self) -> i64 {
        self.clock = now_ns().max(self.clock + 1);
        self.clock
    }

    fn next_id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }
}

/// The nominal period of [`FakeRuntime::chaos_tick`]. Per-tick faults are
/// scaled by the time since the previous tick in units of this, so a test
/// starved of CPU, whose ticks come late, still gets the faults it asked
/// for per second.
pub(crate) const TICK: Duration = Duration::from_millis(5);

/// Random trouble, all off by default. Probabilities are per call, per
/// event delivery or per [`TICK`] of time passed between calls of
/// [`FakeRuntime::chaos_tick`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults {
    /// Each call waits up to this long before it takes effect (or takes
    /// its snapshot) and up to this long again before it returns.
    pub(crate) max_delay: Duration,
    /// Some calls are slow instead: each wait is, with this probability,
    /// up to `slow_delay` long.
    pub(crate) slow: f64,
    /// The longest wait of a slow call.
    pub(crate) slow_delay: Duration,
    /// A call fails with UNAVAILABLE without doing anything.
    pub(crate) fail_before: f64,
    /// A mutating call takes effect, then fails with UNAVAILABLE (the
    /// answer was lost).
    pub(crate) fail_after: f64,
    /// An event is not delivered to a subscriber.
    pub(crate) event_drop: f64,
    /// An event is delivered twice.
    pub(crate) event_dup: f64,
    /// Each delivery is late by up to this long (so events reorder).
    pub(crate) event_max_delay: Duration,
    /// A subscriber's stream breaks (UNAVAILABLE) instead of getting an
    /// event.
    pub(crate) stream_cut: f64,
    /// Per tick: every stream breaks.
    pub(crate) cut_all: f64,
    /// Per tick and running app container: it exits by itself.
    pub(crate) app_exit: f64,
    /// Per tick and ready sandbox: it dies (its containers with it).
    pub(crate) sandbox_death: f64,
    /// An init container exits non-zero.
    pub(crate) init_failure: f64,
    /// Per tick and exited container: removed behind the agent's back
    /// (the runtime's garbage collection, an operator's `crictl rm`).
    pub(crate) remove_exited: f64,
    /// An event carries only its sandbox's status, no container's (as a
    /// runtime that sends less): the agent must inspect the pod.
    pub(crate) thin_events: f64,
}

/// One container or sandbox as the test sees it (for assertions).
#[derive(Debug, Clone)]
pub(crate) struct ContainerView {
    pub(crate) id: String,
    pub(crate) sandbox: String,
    pub(crate) uid: String,
    pub(crate) name: String,
    pub(crate) state: api::ContainerState,
    pub(crate) exit_code: i32,
    pub(crate) created_at: i64,
    pub(crate) annotations: HashMap<String, String>,
}

/// One sandbox as the test sees it.
#[derive(Debug, Clone)]
pub(crate) struct SandboxView {
    pub(crate) id: String,
    pub(crate) uid: String,
    pub(crate) ready: bool,
    pub(crate) created_at: i64,
}

/// The fake runtime.
pub(crate) struct FakeRuntime {
    state: Mutex<State>,
    calls: Mutex<HashMap<&'static str, usize>>,
    delays: Mutex<HashMap<&'static str, Duration>>,
    /// StopContainer of these containers takes this long to take effect
    /// (a container slow to exit).
    stop_delays: Mutex<HashMap<String, Duration>>,
    /// The containers StopContainer stopped, in order.
    stopped: Mutex<Vec<String>>,
    failing: Mutex<HashMap<&'static str, tonic::Code>>,
    failing_ids: Mutex<HashSet<String>>,
    scripts: Mutex<VecDeque<Script>>,
    inflight: AtomicUsize,
    max_inflight: AtomicUsize,
    /// Creates of a container that had run before (attempt above 0).
    recreates: AtomicUsize,
    /// Subscribe `container_events` to the fake's own events when no
    /// stream is scripted.
    live_events: AtomicBool,
    subscribers: Mutex<Vec<StreamTx>>,
    faults: Mutex<Faults>,
    rng: Mutex<StdRng>,
    violations: Mutex<Vec<String>>,
    last_tick: Mutex<Option<Instant>>,
    /// What Exec/Attach/PortForward URLs start with (a test's own
    /// streaming server).
    stream_base: Mutex<String>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            calls: Mutex::default(),
            delays: Mutex::default(),
            stop_delays: Mutex::default(),
            stopped: Mutex::default(),
            failing: Mutex::default(),
            failing_ids: Mutex::default(),
            scripts: Mutex::default(),
            inflight: AtomicUsize::new(0),
            max_inflight: AtomicUsize::new(0),
            recreates: AtomicUsize::new(0),
            live_events: AtomicBool::new(false),
            subscribers: Mutex::default(),
            faults: Mutex::default(),
            rng: Mutex::new(StdRng::seed_from_u64(0)),
            violations: Mutex::default(),
            last_tick: Mutex::default(),
            stream_base: Mutex::new("http://127.0.0.1:1".into()),
        }
    }
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

/// Is `op` one that changes the runtime?
fn mutating(op: &str) -> bool {
    matches!(
        op,
        "run_podsandbox"
            | "stop_podsandbox"
            | "remove_podsandbox"
            | "create_container"
            | "start_container"
            | "stop_container"
            | "remove_container"
            | "pull_image"
    )
}

impl FakeRuntime {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A fake whose `container_events` subscribes to its own events and
    /// whose random faults (off until [`FakeRuntime::set_faults`]) draw
    /// from `seed`.
    pub(crate) fn live(seed: u64) -> Self {
        let f = Self::default();
        f.live_events.store(true, Ordering::SeqCst);
        *lock(&f.rng) = StdRng::seed_from_u64(seed);
        f
    }

    // ---- the test's controls ----

    /// Adds a ready sandbox of pod `uid` made by `node`; returns its id.
    pub(crate) fn add_sandbox(&self, uid: &str, node: &str) -> String {
        let mut s = lock(&self.state);
        let id = s.next_id("sb");
        let created_at = s.next;
        s.sandboxes.insert(
            id.clone(),
            Sandbox {
                uid: uid.into(),
                ready: true,
                created_at,
                metadata: api::PodSandboxMetadata {
                    name: format!("pod-{uid}"),
                    uid: uid.into(),
                    namespace: "default".into(),
                    attempt: 0,
                },
                labels: HashMap::from([
                    (LABEL_MANAGED_BY.to_string(), node.to_string()),
                    (LABEL_POD_UID.to_string(), uid.to_string()),
                ]),
                annotations: HashMap::new(),
                inits: HashMap::new(),
            },
        );
        id
    }

    /// Adds a container to sandbox `sb`; returns its id. A name starting
    /// with `init` makes an init container, with `sidecar` a sidecar.
    pub(crate) fn add_container(&self, sb: &str, name: &str, state: api::ContainerState) -> String {
        let mut s = lock(&self.state);
        let id = s.next_id("c");
        let created_at = s.next;
        let (uid, labels) = s
            .sandboxes
            .get(sb)
            .map(|b| {
                let labels = b
                    .labels
                    .iter()
                    .filter(|(k, _)| *k == LABEL_MANAGED_BY || *k == LABEL_POD_UID)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                (b.uid.clone(), labels)
            })
            .unwrap_or_default();
        let kind = if name.starts_with("init") {
            Kind::Init
        } else if name.starts_with("sidecar") {
            Kind::Sidecar
        } else {
            Kind::App
        };
        s.containers.insert(
            id.clone(),
            Container {
                sandbox: sb.into(),
                uid,
                name: name.into(),
                kind,
                state,
                created_at,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                attempt: 0,
                image: String::new(),
                labels,
                annotations: HashMap::from([(
                    ANNOTATION_CONTAINER_KIND.to_string(),
                    kind.as_str().to_string(),
                )]),
                planned_exit: None,
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

    /// Makes a running container exit by itself with `code`, with its
    /// event.
    pub(crate) fn exit(&self, id: &str, code: i32) {
        let mut s = lock(&self.state);
        let ts = s.stamp();
        let exited = match s.containers.get_mut(id) {
            Some(c) if c.state == api::ContainerState::ContainerRunning => {
                exit_container(c, code, ts);
                true
            }
            _ => false,
        };
        if exited {
            self.publish_locked(&s, id, Ev::ContainerStoppedEvent, ts);
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

    /// Makes StopContainer of container `id` take `d` to take effect.
    pub(crate) fn delay_stop(&self, id: &str, d: Duration) {
        lock(&self.stop_delays).insert(id.to_string(), d);
    }

    /// The containers StopContainer stopped so far, in order.
    pub(crate) fn stopped(&self) -> Vec<String> {
        lock(&self.stopped).clone()
    }

    /// Makes Exec/Attach/PortForward answer URLs under `base`
    /// (`http://host:port`): `{base}/{exec|attach|portforward}/{id}`.
    pub(crate) fn set_stream_base(&self, base: &str) {
        *lock(&self.stream_base) = base.to_string();
    }

    /// The URL of a streaming call on a running container `id`.
    async fn stream_url(&self, op: &'static str, id: &str) -> CriResult<String> {
        self.enter(op).await?;
        let running = lock(&self.state)
            .containers
            .get(id)
            .map(|c| c.state == api::ContainerState::ContainerRunning);
        self.leave(op).await?;
        match running {
            Some(true) => Ok(format!("{}/{op}/{id}", lock(&self.stream_base))),
            Some(false) => Err(err(
                op,
                tonic::Code::FailedPrecondition,
                &format!("container {id} is not running"),
            )),
            None => Err(err(op, tonic::Code::NotFound, id)),
        }
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
    /// Without a script, calls fail with Unavailable (unless the fake is
    /// [`FakeRuntime::live`]).
    pub(crate) fn script_stream(&self) -> StreamTx {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.scripts).push_back(Script::Stream(rx));
        tx
    }

    /// Calls of `op` so far.
    pub(crate) fn calls(&self, op: &str) -> usize {
        lock(&self.calls).get(op).copied().unwrap_or(0)
    }

    /// How many creates were of a container that had run before.
    pub(crate) fn recreates(&self) -> usize {
        self.recreates.load(Ordering::SeqCst)
    }

    /// Calls of every operation so far.
    pub(crate) fn total_calls(&self) -> usize {
        lock(&self.calls).values().sum()
    }

    /// The most status calls that were in flight at once.
    pub(crate) fn max_inflight_status(&self) -> usize {
        self.max_inflight.load(Ordering::SeqCst)
    }

    /// An event of `kind` for `id` with only its sandbox's status in the
    /// payload (no container statuses: a runtime that sends less), stamped
    /// now.
    pub(crate) fn event(
        &self,
        id: &str,
        kind: api::ContainerEventType,
    ) -> api::ContainerEventResponse {
        let mut ev = self.event_full(id, kind);
        ev.containers_statuses.clear();
        ev
    }

    /// An event of `kind` for `id` with the whole payload, as Petrel and
    /// containerd send it: the sandbox's status and every container's in
    /// it, stamped now.
    pub(crate) fn event_full(
        &self,
        id: &str,
        kind: api::ContainerEventType,
    ) -> api::ContainerEventResponse {
        let s = lock(&self.state);
        event_of(&s, id, kind, now_ns(), true)
    }

    /// Replaces the random faults (`Faults::default()`: none).
    pub(crate) fn set_faults(&self, faults: Faults) {
        *lock(&self.faults) = faults;
    }

    /// Every invariant violation seen so far.
    pub(crate) fn violations(&self) -> Vec<String> {
        lock(&self.violations).clone()
    }

    /// Every sandbox now.
    pub(crate) fn sandboxes(&self) -> Vec<SandboxView> {
        let s = lock(&self.state);
        let mut v: Vec<SandboxView> = s
            .sandboxes
            .iter()
            .map(|(id, b)| SandboxView {
                id: id.clone(),
                uid: b.uid.clone(),
                ready: b.ready,
                created_at: b.created_at,
            })
            .collect();
        v.sort_by_key(|b| b.created_at);
        v
    }

    /// Every container now, oldest first.
    pub(crate) fn containers(&self) -> Vec<ContainerView> {
        let s = lock(&self.state);
        let mut v: Vec<ContainerView> = s
            .containers
            .iter()
            .map(|(id, c)| ContainerView {
                id: id.clone(),
                sandbox: c.sandbox.clone(),
                uid: c.uid.clone(),
                name: c.name.clone(),
                state: c.state,
                exit_code: c.exit_code,
                created_at: c.created_at,
                annotations: c.annotations.clone(),
            })
            .collect();
        v.sort_by_key(|c| c.created_at);
        v
    }

    /// Lets time act on the runtime: init containers whose run is over
    /// exit; with faults, app containers exit and sandboxes die at random,
    /// and streams break. Call it every [`TICK`] or so.
    pub(crate) fn chaos_tick(&self) {
        let mut faults = lock(&self.faults).clone();
        let now = Instant::now();
        // Per-tick chances for the time that passed: 1 - (1 - p)^ticks.
        let ticks = lock(&self.last_tick)
            .replace(now)
            .map_or(1.0, |t| (now - t).as_secs_f64() / TICK.as_secs_f64())
            .min(20.0);
        for p in [
            &mut faults.cut_all,
            &mut faults.app_exit,
            &mut faults.sandbox_death,
            &mut faults.remove_exited,
        ] {
            *p = 1.0 - (1.0 - *p).powf(ticks);
        }
        let mut s = lock(&self.state);
        let mut rng = lock(&self.rng);
        let mut events = Vec::new();
        let mut gone = Vec::new();
        let mut completed = Vec::new();
        let mut ids: Vec<String> = s.containers.keys().cloned().collect();
        ids.sort();
        for id in ids {
            let roll: f64 = rng.gen();
            let code = [0, 1, 137][rng.gen_range(0..3)];
            let ts = s.stamp();
            let Some(c) = s.containers.get_mut(&id) else {
                continue;
            };
            if c.state == api::ContainerState::ContainerExited && roll < faults.remove_exited {
                events.push((id.clone(), Ev::ContainerDeletedEvent, ts));
                gone.push(id.clone());
                continue;
            }
            if c.state != api::ContainerState::ContainerRunning {
                continue;
            }
            let exit = match c.planned_exit {
                Some((at, code)) if at <= now => Some(code),
                Some(_) => None,
                None if roll < faults.app_exit => Some(code),
                None => None,
            };
            if let Some(code) = exit {
                if c.kind == Kind::Init && code == 0 {
                    completed.push((c.sandbox.clone(), c.name.clone()));
                }
                exit_container(c, code, ts);
                events.push((id.clone(), Ev::ContainerStoppedEvent, ts));
            }
        }
        for (sb, name) in completed {
            if let Some(b) = s.sandboxes.get_mut(&sb) {
                b.inits.insert(name, true);
            }
        }
        let mut sbs: Vec<String> = s
            .sandboxes
            .iter()
            .filter(|(_, b)| b.ready)
            .map(|(id, _)| id.clone())
            .collect();
        sbs.sort();
        for sb in sbs {
            if rng.gen::<f64>() < faults.sandbox_death {
                events.extend(stop_sandbox_locked(&mut s, &sb));
            }
        }
        let cut = rng.gen::<f64>() < faults.cut_all;
        drop(rng);
        self.publish_all(&s, events);
        for id in gone {
            s.containers.remove(&id);
        }
        drop(s);
        if cut {
            let subs = std::mem::take(&mut *lock(&self.subscribers));
            for tx in subs {
                let _ = tx.send(Err(err(
                    "get_container_events",
                    tonic::Code::Unavailable,
                    "stream cut",
                )));
            }
        }
    }

    // ---- plumbing ----

    fn roll(&self, p: f64) -> bool {
        p > 0.0 && lock(&self.rng).gen::<f64>() < p
    }

    /// One wait of a call under `faults`.
    fn call_delay(&self, faults: &Faults) -> Duration {
        if self.roll(faults.slow) {
            self.random_delay(faults.slow_delay)
        } else {
            self.random_delay(faults.max_delay)
        }
    }

    fn random_delay(&self, max: Duration) -> Duration {
        if max.is_zero() {
            return Duration::ZERO;
        }
        lock(&self.rng).gen_range(Duration::ZERO..max)
    }

    /// Counts, delays and fails a call before it acts; the snapshot is
    /// taken by the caller after this returns (so a delayed call sees late
    /// state) unless it snapshots first.
    async fn enter(&self, op: &'static str) -> CriResult<()> {
        *lock(&self.calls).entry(op).or_default() += 1;
        let delay = lock(&self.delays).get(op).copied();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        if let Some(code) = lock(&self.failing).get(op).copied() {
            return Err(err(op, code, "injected failure"));
        }
        let faults = lock(&self.faults).clone();
        let d = self.call_delay(&faults);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
        if self.roll(faults.fail_before) {
            return Err(err(op, tonic::Code::Unavailable, "injected failure"));
        }
        Ok(())
    }

    /// After a call acted: a late answer, or a lost one.
    async fn leave(&self, op: &'static str) -> CriResult<()> {
        let faults = lock(&self.faults).clone();
        let d = self.call_delay(&faults);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
        if mutating(op) && self.roll(faults.fail_after) {
            return Err(err(
                op,
                tonic::Code::Unavailable,
                "injected failure after the fact",
            ));
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
        self.leave(op).await?;
        if lock(&self.failing_ids).contains(id) {
            return Err(err(op, tonic::Code::Internal, "injected failure"));
        }
        snap.ok_or_else(|| err(op, tonic::Code::NotFound, id))
    }

    fn violation(&self, what: String) {
        tracing::error!(%what, "fake runtime: invariant violated");
        lock(&self.violations).push(what);
    }

    /// The invariants a container `id` (about to be created or started)
    /// must not break: one live instance per name and sandbox; regular
    /// init containers one at a time, with no app container beside them
    /// (sidecars may run beside anything).
    fn check_container(&self, s: &State, id: &str, c: &Container, op: &str) {
        for (oid, o) in &s.containers {
            if oid == id || o.sandbox != c.sandbox || !o.live() {
                continue;
            }
            let clash = matches!(
                (c.kind, o.kind),
                (Kind::Init, Kind::Init | Kind::App) | (Kind::App, Kind::Init)
            );
            if o.name == c.name {
                self.violation(format!(
                    "{op} {id}: container {} of pod {} already live in sandbox {} as {oid} ({:?})",
                    c.name, c.uid, c.sandbox, o.state
                ));
            } else if clash {
                self.violation(format!(
                    "{op} {id}: {} container {} of pod {} while {} container {} ({oid}, {:?}) is live in sandbox {}",
                    c.kind.as_str(),
                    c.name,
                    c.uid,
                    o.kind.as_str(),
                    o.name,
                    o.state,
                    c.sandbox
                ));
            }
        }
    }

    /// Publishes an event to every live subscriber, with the faults'
    /// drops, duplicates, delays and cuts. Called with the state locked so
    /// that, without faults, events arrive in the order of the changes.
    fn publish_locked(&self, s: &State, id: &str, kind: Ev, ts: i64) {
        let faults = lock(&self.faults).clone();
        let full = !self.roll(faults.thin_events);
        let ev = event_of(s, id, kind, ts, full);
        let mut subs = lock(&self.subscribers);
        subs.retain(|tx| !tx.is_closed());
        let mut keep = Vec::with_capacity(subs.len());
        for tx in subs.drain(..) {
            if self.roll(faults.stream_cut) {
                let _ = tx.send(Err(err(
                    "get_container_events",
                    tonic::Code::Unavailable,
                    "stream cut",
                )));
                continue;
            }
            if !self.roll(faults.event_drop) {
                let copies = if self.roll(faults.event_dup) { 2 } else { 1 };
                for _ in 0..copies {
                    let d = self.random_delay(faults.event_max_delay);
                    if d.is_zero() {
                        let _ = tx.send(Ok(ev.clone()));
                    } else {
                        let (tx, ev) = (tx.clone(), ev.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(d).await;
                            let _ = tx.send(Ok(ev));
                        });
                    }
                }
            }
            keep.push(tx);
        }
        *subs = keep;
    }

    fn publish_all(&self, s: &State, events: Vec<(String, Ev, i64)>) {
        for (id, kind, ts) in events {
            self.publish_locked(s, &id, kind, ts);
        }
    }

    /// Removes a sandbox and its containers (stopping what runs).
    fn remove_sandbox_locked(&self, s: &mut State, id: &str) {
        let mut events = stop_sandbox_locked(s, id);
        let mut ids: Vec<String> = s
            .containers
            .iter()
            .filter(|(_, c)| c.sandbox == id)
            .map(|(cid, _)| cid.clone())
            .collect();
        ids.sort();
        for cid in ids {
            let ts = s.stamp();
            events.push((cid, Ev::ContainerDeletedEvent, ts));
        }
        let ts = s.stamp();
        events.push((id.to_string(), Ev::ContainerDeletedEvent, ts));
        // The payload names the sandbox: publish before it is gone.
        self.publish_all(s, events);
        s.containers.retain(|_, c| c.sandbox != id);
        s.sandboxes.remove(id);
    }
}

/// An event of `kind` for `id` stamped `ts`, with the status of its
/// sandbox in the payload and, when `full`, of every container in it
/// (newest first, as Petrel orders them).
fn event_of(s: &State, id: &str, kind: Ev, ts: i64, full: bool) -> api::ContainerEventResponse {
    let sb_id = s
        .containers
        .get(id)
        .map(|c| c.sandbox.clone())
        .unwrap_or_else(|| id.to_string());
    let sandbox = s.sandboxes.get(&sb_id).map(|b| sandbox_status(&sb_id, b));
    let mut containers: Vec<api::ContainerStatus> = if full && sandbox.is_some() {
        s.containers
            .iter()
            .filter(|(_, c)| c.sandbox == sb_id)
            .map(|(cid, c)| container_status(cid, c))
            .collect()
    } else {
        Vec::new()
    };
    containers.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    api::ContainerEventResponse {
        container_id: id.to_string(),
        container_event_type: kind as i32,
        created_at: ts,
        pod_sandbox_status: sandbox,
        containers_statuses: containers,
    }
}

fn exit_container(c: &mut Container, code: i32, ts: i64) {
    c.state = api::ContainerState::ContainerExited;
    c.exit_code = code;
    c.finished_at = ts;
    c.planned_exit = None;
}

/// Stops a sandbox and every live container in it (as a runtime does when
/// the sandbox dies or is stopped); returns the events.
fn stop_sandbox_locked(s: &mut State, sb: &str) -> Vec<(String, Ev, i64)> {
    let mut events = Vec::new();
    let mut ids: Vec<String> = s
        .containers
        .iter()
        .filter(|(_, c)| c.sandbox == sb && c.live())
        .map(|(id, _)| id.clone())
        .collect();
    ids.sort();
    for id in ids {
        let ts = s.stamp();
        if let Some(c) = s.containers.get_mut(&id) {
            exit_container(c, 137, ts);
            events.push((id, Ev::ContainerStoppedEvent, ts));
        }
    }
    let ts = s.stamp();
    if let Some(b) = s.sandboxes.get_mut(sb) {
        if b.ready {
            b.ready = false;
            events.push((sb.to_string(), Ev::ContainerStoppedEvent, ts));
        }
    }
    events
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
        metadata: Some(b.metadata.clone()),
        state: sandbox_state(b),
        created_at: b.created_at,
        labels: b.labels.clone(),
        annotations: b.annotations.clone(),
        ..Default::default()
    }
}

fn container_status(id: &str, c: &Container) -> api::ContainerStatus {
    let reason = match (c.state, c.exit_code) {
        (api::ContainerState::ContainerExited, 0) => "Completed",
        (api::ContainerState::ContainerExited, _) => "Error",
        _ => "",
    };
    api::ContainerStatus {
        id: id.into(),
        metadata: Some(api::ContainerMetadata {
            name: c.name.clone(),
            attempt: c.attempt,
        }),
        state: c.state as i32,
        created_at: c.created_at,
        started_at: c.started_at,
        finished_at: c.finished_at,
        exit_code: c.exit_code,
        image: Some(api::ImageSpec {
            image: c.image.clone(),
            ..Default::default()
        }),
        image_ref: c.image.clone(),
        reason: reason.to_string(),
        labels: c.labels.clone(),
        annotations: c.annotations.clone(),
        log_path: format!("{}/{}.log", c.name, c.attempt),
        ..Default::default()
    }
}

#[async_trait::async_trait]
impl RuntimeObserver for FakeRuntime {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        self.enter("version").await?;
        self.leave("version").await?;
        Ok(api::VersionResponse {
            runtime_name: "fake".into(),
            ..Default::default()
        })
    }

    async fn status(&self) -> CriResult<api::RuntimeStatus> {
        self.enter("status").await?;
        self.leave("status").await?;
        Ok(api::RuntimeStatus::default())
    }

    async fn runtime_config(&self) -> CriResult<api::RuntimeConfigResponse> {
        self.enter("runtime_config").await?;
        self.leave("runtime_config").await?;
        // The fake's cgroups are laid out as the cgroupfs driver's.
        Ok(api::RuntimeConfigResponse {
            linux: Some(api::LinuxRuntimeConfiguration {
                cgroup_driver: api::CgroupDriver::Cgroupfs as i32,
            }),
        })
    }

    async fn list_pod_sandboxes(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        self.enter("list_podsandbox").await?;
        let items = {
            let s = lock(&self.state);
            s.sandboxes
                .iter()
                .filter(|(_, b)| matches(&b.labels, &labels))
                .map(|(id, b)| api::PodSandbox {
                    id: id.clone(),
                    metadata: Some(b.metadata.clone()),
                    state: sandbox_state(b),
                    created_at: b.created_at,
                    labels: b.labels.clone(),
                    annotations: b.annotations.clone(),
                    ..Default::default()
                })
                .collect()
        };
        self.leave("list_podsandbox").await?;
        Ok(items)
    }

    async fn list_containers(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<ContainerSummary>> {
        self.enter("list_containers").await?;
        let items = {
            let s = lock(&self.state);
            s.containers
                .iter()
                .filter(|(_, c)| matches(&c.labels, &labels))
                .map(|(id, c)| ContainerSummary {
                    id: id.clone(),
                    pod_sandbox_id: c.sandbox.clone(),
                    state: c.state as i32,
                    created_at: c.created_at,
                    labels: c
                        .labels
                        .iter()
                        .filter(|(k, _)| LISTED_LABELS.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                })
                .collect()
        };
        self.leave("list_containers").await?;
        Ok(items)
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<api::PodSandboxStatus> {
        self.status_call("podsandbox_status", id, |s| {
            s.sandboxes.get(id).map(|b| sandbox_status(id, b))
        })
        .await
    }

    async fn container_status(&self, id: &str) -> CriResult<api::ContainerStatus> {
        self.status_call("container_status", id, |s| {
            s.containers.get(id).map(|c| container_status(id, c))
        })
        .await
    }

    async fn image_status(&self, image: &str) -> CriResult<Option<api::Image>> {
        self.enter("image_status").await?;
        self.leave("image_status").await?;
        Ok(Some(api::Image {
            id: format!("sha256:{image}"),
            repo_tags: vec![image.to_string()],
            ..Default::default()
        }))
    }

    async fn image_fs_info(&self) -> CriResult<api::ImageFsInfoResponse> {
        self.enter("image_fs_info").await?;
        self.leave("image_fs_info").await?;
        // The fake keeps no images on any filesystem.
        Ok(api::ImageFsInfoResponse::default())
    }

    async fn list_container_stats(
        &self,
        _labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::ContainerStats>> {
        self.enter("list_container_stats").await?;
        self.leave("list_container_stats").await?;
        // The fake's containers have no writable layers.
        Ok(Vec::new())
    }

    async fn list_images(&self) -> CriResult<Vec<api::Image>> {
        self.enter("list_images").await?;
        self.leave("list_images").await?;
        Ok(Vec::new())
    }

    async fn images_in_use(&self) -> CriResult<std::collections::HashSet<String>> {
        self.enter("list_containers").await?;
        let used = lock(&self.state)
            .containers
            .values()
            .map(|c| c.image.clone())
            .collect();
        self.leave("list_containers").await?;
        Ok(used)
    }

    async fn exec(&self, req: api::ExecRequest) -> CriResult<String> {
        self.stream_url("exec", &req.container_id).await
    }

    async fn attach(&self, req: api::AttachRequest) -> CriResult<String> {
        self.stream_url("attach", &req.container_id).await
    }

    async fn port_forward(&self, req: api::PortForwardRequest) -> CriResult<String> {
        const OP: &str = "portforward";
        self.enter(OP).await?;
        let known = lock(&self.state)
            .sandboxes
            .contains_key(&req.pod_sandbox_id);
        self.leave(OP).await?;
        if !known {
            return Err(err(OP, tonic::Code::NotFound, &req.pod_sandbox_id));
        }
        Ok(format!(
            "{}/{OP}/{}",
            lock(&self.stream_base),
            req.pod_sandbox_id
        ))
    }

    async fn container_events(&self) -> CriResult<EventStream> {
        *lock(&self.calls).entry("get_container_events").or_default() += 1;
        let script = lock(&self.scripts).pop_front();
        match script {
            Some(Script::Stream(rx)) => Ok(Box::pin(
                tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            )),
            Some(Script::Fail(code)) => Err(err("get_container_events", code, "scripted")),
            None if self.live_events.load(Ordering::SeqCst) => {
                let faults = lock(&self.faults).clone();
                if self.roll(faults.fail_before) {
                    return Err(err(
                        "get_container_events",
                        tonic::Code::Unavailable,
                        "injected failure",
                    ));
                }
                let (tx, rx) = mpsc::unbounded_channel();
                lock(&self.subscribers).push(tx);
                Ok(Box::pin(
                    tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
                ))
            }
            None => Err(err(
                "get_container_events",
                tonic::Code::Unavailable,
                "connection refused",
            )),
        }
    }
}

#[async_trait::async_trait]
impl RuntimeActuator for FakeRuntime {
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig) -> CriResult<String> {
        const OP: &str = "run_podsandbox";
        self.enter(OP).await?;
        let id = {
            let mut s = lock(&self.state);
            let metadata = config.metadata.clone().unwrap_or_default();
            let uid = config
                .labels
                .get(LABEL_POD_UID)
                .cloned()
                .unwrap_or_else(|| metadata.uid.clone());
            for (oid, b) in &s.sandboxes {
                if b.uid == uid && b.ready {
                    self.violation(format!(
                        "run_podsandbox: pod {uid} already has the ready sandbox {oid}"
                    ));
                }
            }
            let id = s.next_id("sb");
            let created_at = s.stamp();
            s.sandboxes.insert(
                id.clone(),
                Sandbox {
                    uid,
                    ready: true,
                    created_at,
                    metadata,
                    labels: config.labels,
                    annotations: config.annotations,
                    inits: HashMap::new(),
                },
            );
            let started = s.stamp();
            self.publish_all(
                &s,
                vec![
                    (id.clone(), Ev::ContainerCreatedEvent, created_at),
                    (id.clone(), Ev::ContainerStartedEvent, started),
                ],
            );
            id
        };
        self.leave(OP).await?;
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        const OP: &str = "stop_podsandbox";
        self.enter(OP).await?;
        {
            let mut s = lock(&self.state);
            if !s.sandboxes.contains_key(id) {
                return Err(err(OP, tonic::Code::NotFound, id));
            }
            let events = stop_sandbox_locked(&mut s, id);
            self.publish_all(&s, events);
        }
        self.leave(OP).await
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        const OP: &str = "remove_podsandbox";
        self.enter(OP).await?;
        {
            let mut s = lock(&self.state);
            // Removing what is gone succeeds (CRI).
            if s.sandboxes.contains_key(id) {
                self.remove_sandbox_locked(&mut s, id);
            }
        }
        self.leave(OP).await
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        _sandbox_config: api::PodSandboxConfig,
    ) -> CriResult<String> {
        const OP: &str = "create_container";
        self.enter(OP).await?;
        let id = {
            let mut s = lock(&self.state);
            let Some(sb) = s.sandboxes.get(sandbox_id) else {
                return Err(err(OP, tonic::Code::NotFound, sandbox_id));
            };
            if !sb.ready {
                return Err(err(
                    OP,
                    tonic::Code::FailedPrecondition,
                    &format!("sandbox {sandbox_id} is not ready"),
                ));
            }
            let uid = sb.uid.clone();
            let metadata = config.metadata.clone().unwrap_or_default();
            let kind = Kind::of(&config.annotations);
            if metadata.attempt > 0 {
                self.recreates.fetch_add(1, Ordering::SeqCst);
            }
            let id = s.next_id("c");
            let created_at = s.stamp();
            let c = Container {
                sandbox: sandbox_id.to_string(),
                uid,
                name: metadata.name.clone(),
                kind,
                state: api::ContainerState::ContainerCreated,
                created_at,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                attempt: metadata.attempt,
                image: config.image.map(|i| i.image).unwrap_or_default(),
                labels: config.labels,
                annotations: config.annotations,
                planned_exit: None,
            };
            self.check_container(&s, &id, &c, OP);
            if let Some(b) = s.sandboxes.get_mut(sandbox_id) {
                // Init containers start in order: each one created before
                // did its part. (Another instance of one created before
                // is a restart: a sidecar's may come while a later init
                // container runs.)
                let again = b.inits.contains_key(&c.name);
                let pending = b.inits.iter().find(|(_, done)| !**done).filter(|_| !again);
                if let Some((name, _)) = pending {
                    self.violation(format!(
                        "{OP} {id}: {} container {} of pod {} while init container {name} never did its part in sandbox {sandbox_id}",
                        c.kind.as_str(),
                        c.name,
                        c.uid
                    ));
                }
                if c.kind != Kind::App {
                    b.inits.entry(c.name.clone()).or_insert(false);
                }
            }
            s.containers.insert(id.clone(), c);
            self.publish_all(
                &s,
                vec![(id.clone(), Ev::ContainerCreatedEvent, created_at)],
            );
            id
        };
        self.leave(OP).await?;
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        const OP: &str = "start_container";
        self.enter(OP).await?;
        {
            let mut guard = lock(&self.state);
            let s = &mut *guard;
            let Some(c) = s.containers.get(id).cloned() else {
                return Err(err(OP, tonic::Code::NotFound, id));
            };
            if c.state != api::ContainerState::ContainerCreated {
                return Err(err(
                    OP,
                    tonic::Code::FailedPrecondition,
                    &format!("container {id} is {:?}, not created", c.state),
                ));
            }
            if !s.sandboxes.get(&c.sandbox).is_some_and(|b| b.ready) {
                return Err(err(
                    OP,
                    tonic::Code::FailedPrecondition,
                    &format!("sandbox {} of container {id} is not ready", c.sandbox),
                ));
            }
            self.check_container(s, id, &c, OP);
            if c.kind == Kind::Sidecar {
                if let Some(b) = s.sandboxes.get_mut(&c.sandbox) {
                    b.inits.insert(c.name.clone(), true);
                }
            }
            let planned_exit = if c.kind == Kind::Init {
                let faults = lock(&self.faults).clone();
                let run = Duration::from_millis(lock(&self.rng).gen_range(2..30));
                let code = if self.roll(faults.init_failure) { 1 } else { 0 };
                Some((Instant::now() + run, code))
            } else {
                None
            };
            let ts = s.stamp();
            if let Some(c) = s.containers.get_mut(id) {
                c.state = api::ContainerState::ContainerRunning;
                c.started_at = ts;
                c.planned_exit = planned_exit;
            }
            self.publish_all(s, vec![(id.to_string(), Ev::ContainerStartedEvent, ts)]);
        }
        self.leave(OP).await
    }

    async fn stop_container(&self, id: &str, _timeout_secs: i64) -> CriResult<()> {
        const OP: &str = "stop_container";
        self.enter(OP).await?;
        let slow = lock(&self.stop_delays).get(id).copied();
        if let Some(d) = slow {
            tokio::time::sleep(d).await;
        }
        {
            let mut s = lock(&self.state);
            let ts = s.stamp();
            let Some(c) = s.containers.get_mut(id) else {
                return Err(err(OP, tonic::Code::NotFound, id));
            };
            if c.live() {
                exit_container(c, 137, ts);
                lock(&self.stopped).push(id.to_string());
                self.publish_all(&s, vec![(id.to_string(), Ev::ContainerStoppedEvent, ts)]);
            }
        }
        self.leave(OP).await
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        const OP: &str = "remove_container";
        self.enter(OP).await?;
        {
            let mut s = lock(&self.state);
            if s.containers.contains_key(id) {
                let mut events = Vec::new();
                let ts = s.stamp();
                if let Some(c) = s.containers.get_mut(id) {
                    // A running container is removed forcibly (CRI).
                    if c.live() {
                        exit_container(c, 137, ts);
                        events.push((id.to_string(), Ev::ContainerStoppedEvent, ts));
                    }
                }
                let ts = s.stamp();
                events.push((id.to_string(), Ev::ContainerDeletedEvent, ts));
                self.publish_all(&s, events);
                s.containers.remove(id);
            }
        }
        self.leave(OP).await
    }

    async fn exec_sync(
        &self,
        id: &str,
        _cmd: Vec<String>,
        _timeout_secs: i64,
    ) -> CriResult<ExecOutput> {
        const OP: &str = "exec_sync";
        self.enter(OP).await?;
        let running = lock(&self.state)
            .containers
            .get(id)
            .map(|c| c.state == api::ContainerState::ContainerRunning);
        self.leave(OP).await?;
        match running {
            Some(true) => Ok(ExecOutput::default()),
            Some(false) => Err(err(
                OP,
                tonic::Code::FailedPrecondition,
                &format!("container {id} is not running"),
            )),
            None => Err(err(OP, tonic::Code::NotFound, id)),
        }
    }

    async fn remove_image(&self, _id: &str) -> CriResult<()> {
        self.enter("remove_image").await?;
        self.leave("remove_image").await
    }

    async fn pull_image(
        &self,
        image: &str,
        _auth: Option<api::AuthConfig>,
        _sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        self.enter("pull_image").await?;
        self.leave("pull_image").await?;
        Ok(format!("sha256:{image}"))
    }
}
