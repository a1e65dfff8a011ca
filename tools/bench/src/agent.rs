//! P10-P13: the agent (`petrel agent`) over a CRI runtime.
//!
//! One runtime (Petrel's, then containerd 1.7 where `make containerd` has
//! unpacked it) and one agent beside it, restarted in the other PLEG mode
//! when the bench needs it: the pods are adopted, not recreated (checked
//! by container id). Everything is driven through manifest files and seen
//! through the agent's `/pods`, next to references taken in the same run
//! from the runtime directly: its own exit events, its own
//! RunPodSandbox + CreateContainer + StartContainer, its own List calls.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use petrel_cri::api;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustix::process::{Pid, Signal};

use crate::agent_proc::{
    all_running, container_id, exit_shown, manifest, restart_count, terminated_code, AgentProc,
    Mode, ObserveMethod, Observer,
};
use crate::containerd::Containerd;
use crate::cpugroup::CpuGroup;
use crate::node::{pod_config, sleep_container, Clients, Node};
use crate::procfs::{self, Cpu};
use crate::stats::Samples;
use crate::sweep::Work;
use crate::Args;

/// Quiet time after the pods are up (or the agent restarted) before an
/// idle window: adoption and start-up syncs are over by then.
pub const SETTLE: Duration = Duration::from_secs(5);
/// Quiet time before each measured exit or start.
pub const GAP: Duration = Duration::from_millis(100);
/// The longest extra random quiet time in relist mode: one relist period,
/// so that events do not fall at one phase of the relist loop (a fixed
/// gap after the previous event, itself seen at a relist, would make
/// every sample wait almost a whole period).
pub const RELIST_JITTER: Duration = Duration::from_secs(1);

/// Quiet time before a measured exit or start: [`GAP`], plus a uniformly
/// random part of [`RELIST_JITTER`] in relist mode.
fn quiet(mode: Mode, rng: &mut StdRng) -> Duration {
    match mode {
        Mode::Events => GAP,
        Mode::Relist => {
            GAP + Duration::from_micros(rng.gen_range(0..RELIST_JITTER.as_micros() as u64))
        }
    }
}

/// The exit code of a container killed with SIGKILL.
pub const KILLED: i64 = 137;
/// Rounds of the raw List reference of P13.
pub const LIST_ROUNDS: usize = 50;
/// Tasks (threads) kept free on the machine when sizing the large layout.
const PID_MARGIN: usize = 4000;

/// CPU of the three parties over one idle window.
#[derive(Debug, Default, Clone)]
pub struct IdleWindow {
    /// Running containers of the agent (per the runtime) in the window.
    pub containers: usize,
    /// The window.
    pub wall: Duration,
    /// The runtime process (petrel runtime, containerd).
    pub runtime: Cpu,
    /// The agent.
    pub agent: Cpu,
    /// All shims of the runtime.
    pub shims: Cpu,
    /// How many shims.
    pub shim_count: usize,
    /// Relists in the window and their total seconds (the agent's
    /// kubelet_pleg_relist_duration_seconds count and sum), if exported.
    pub relists: Option<(u64, f64)>,
    /// Runtime + shims + agent by their cgroup's CPU accounting
    /// (nanoseconds, children included), when the cgroup could be made.
    pub accounted: Option<Duration>,
}

impl IdleWindow {
    /// Runtime + shims.
    pub fn runtime_side(&self) -> Cpu {
        self.runtime.plus(self.shims)
    }

    /// Everything: runtime + shims + agent.
    pub fn total(&self) -> Cpu {
        self.runtime_side().plus(self.agent)
    }
}

/// P10 at one size: both modes.
#[derive(Debug, Default, Clone)]
pub struct IdlePoint {
    /// Target number of running containers.
    pub containers: usize,
    /// Relist mode.
    pub relist: IdleWindow,
    /// Event mode.
    pub events: IdleWindow,
}

/// An agent restart: were the pods adopted?
#[derive(Debug, Default, Clone)]
pub struct Adoption {
    /// The mode the agent came back in.
    pub to: Option<Mode>,
    /// Running containers before the restart.
    pub before: usize,
    /// Of those, running with the same id after it.
    pub kept: usize,
    /// Running containers after it that were not there before.
    pub new: usize,
    /// Restart (SIGTERM) to every pod running at `/pods`.
    pub took: Duration,
    /// Spawn → /healthz 200 and the first relist done.
    pub startup: Duration,
}

/// P11 in one mode.
#[derive(Debug, Default, Clone)]
pub struct ExitRun {
    /// kill(2) → the pod at `/pods` shows the container terminated.
    pub agent: Samples,
    /// kill(2) → the runtime's STOPPED event at the bench's own subscriber.
    pub runtime: Samples,
    /// Exit codes shown that were not 137.
    pub wrong_codes: Vec<i64>,
    /// What `runtime` is.
    pub reference: ExitReference,
}

/// P12 in one mode.
#[derive(Debug, Default, Clone)]
pub struct StartRun {
    /// Manifest renamed into place → every container running at `/pods`.
    pub agent: Samples,
    /// RunPodSandbox + CreateContainer + StartContainer, direct.
    pub direct: Samples,
    /// Mean of the agent's own kubelet_pod_start_duration_seconds over
    /// the same pods.
    pub agent_metric_mean: Option<Duration>,
}

/// P13 at one size.
#[derive(Debug, Default, Clone)]
pub struct RelistPoint {
    /// Pods of the agent.
    pub pods: usize,
    /// Their containers (running, per the runtime).
    pub containers: usize,
    /// The window read.
    pub wall: Duration,
    /// Relists in the window.
    pub count: u64,
    /// Their mean duration (sum / count).
    pub mean: Duration,
    /// ListPodSandbox + ListContainers with the agent's label selector,
    /// from the bench.
    pub reference: Samples,
}

/// How the large layout went.
#[derive(Debug, Default, Clone)]
pub struct Large {
    /// Pods asked for.
    pub target_pods: usize,
    /// Containers per pod.
    pub per_pod: usize,
    /// Pods written (fewer than asked when the machine's pid limit
    /// would not allow them).
    pub written: usize,
    /// Containers running at the end of the growth.
    pub running: usize,
    /// Pods present before the last growth step.
    pub grown_from: usize,
    /// The last growth step: its manifests written → every container
    /// running (or the timeout).
    pub grow: Duration,
    /// Why fewer were written or running, if so.
    pub note: Option<String>,
    /// Removing every pod through CRI at the end.
    pub teardown: Duration,
}

/// Everything measured against one runtime.
#[derive(Debug, Default)]
pub struct TargetRun {
    /// "petrel runtime", "containerd 1.7.24".
    pub name: String,
    /// P10 per size.
    pub idle: Vec<IdlePoint>,
    /// P11 per mode, `restartPolicy: Never`.
    pub exits: Vec<(Mode, ExitRun)>,
    /// P11 in event mode with `restartPolicy: Always`: the exit shown as
    /// a restart (`lastState.terminated`, `restartCount` + 1) or as the
    /// container terminated.
    pub exits_always: Option<ExitRun>,
    /// P12 per mode.
    pub starts: Vec<(Mode, StartRun)>,
    /// Every restart of the agent.
    pub adoptions: Vec<Adoption>,
    /// Deleting the exit pods' manifests → gone from `/pods`, per batch.
    pub deletes: Vec<(usize, Duration)>,
    /// What stopped the run early, if anything.
    pub error: Option<String>,
}

/// The whole agent section.
#[derive(Debug)]
pub struct AgentResults {
    /// Against Petrel's runtime.
    pub petrel: TargetRun,
    /// P13, against Petrel's runtime.
    pub relist: Vec<RelistPoint>,
    /// The large layout of P13.
    pub large: Large,
    /// Against containerd 1.7, or why not.
    pub containerd: Result<TargetRun, String>,
    /// How `/pods` was observed.
    pub method: Option<ObserveMethod>,
    /// Why the watch stream was not used.
    pub watch_error: Option<String>,
    /// Idle window length.
    pub idle_seconds: u64,
    /// P13 window length.
    pub relist_seconds: u64,
    /// P11/P12 pods in event mode.
    pub pods: usize,
    /// P11/P12 pods in relist mode.
    pub relist_pods: usize,
}

/// A runtime the agent drives.
enum Runtime<'a> {
    Petrel(&'a Node),
    Containerd(&'a Containerd),
}

impl Runtime<'_> {
    fn pid(&self) -> u32 {
        match self {
            Runtime::Petrel(n) => n.pid(),
            Runtime::Containerd(c) => c.pid(),
        }
    }

    fn shims(&self) -> Result<Vec<u32>> {
        match self {
            Runtime::Petrel(n) => procfs::shims_of(&n.state),
            Runtime::Containerd(c) => Ok(c.shims()),
        }
    }

    fn host_network(&self) -> bool {
        matches!(self, Runtime::Containerd(_))
    }
}

fn sum_cpu(pids: &[u32]) -> Cpu {
    pids.iter()
        .filter_map(|p| procfs::cpu(*p).ok())
        .fold(Cpu::default(), Cpu::plus)
}

/// The agent's label selector.
fn selector(node: &str) -> std::collections::HashMap<String, String> {
    [("petrel.io/node".to_string(), node.to_string())].into()
}

/// Ids of the agent's running containers, per the runtime.
async fn running_ids(c: &mut Clients, node: &str) -> Result<HashSet<String>> {
    let list =
        c.rt.list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                state: Some(api::ContainerStateValue {
                    state: api::ContainerState::ContainerRunning as i32,
                }),
                label_selector: selector(node),
                ..Default::default()
            }),
        })
        .await
        .context("ListContainers")?
        .into_inner()
        .containers;
    Ok(list.into_iter().map(|c| c.id).collect())
}

/// `name{...} value` or `name value`: the first sample of `name`.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            return None;
        }
        rest.rsplit(' ').next()?.parse().ok()
    })
}

/// The agent's relist count and total seconds.
async fn relist_totals(agent: &AgentProc) -> Option<(u64, f64)> {
    let text = agent.metrics().await.ok()?;
    let count = metric(&text, "kubelet_pleg_relist_duration_seconds_count")?;
    let sum = metric(&text, "kubelet_pleg_relist_duration_seconds_sum")?;
    Some((count as u64, sum))
}

async fn pod_start_totals(agent: &AgentProc) -> Option<(u64, f64)> {
    let text = agent.metrics().await.ok()?;
    let count = metric(&text, "kubelet_pod_start_duration_seconds_count")?;
    let sum = metric(&text, "kubelet_pod_start_duration_seconds_sum")?;
    Some((count as u64, sum))
}

/// Writes manifests for pods `names` and waits until the runtime runs
/// `want` containers of the agent in total; then until `/pods` shows
/// each of these pods with all containers running.
async fn grow(
    c: &mut Clients,
    agent: &AgentProc,
    names: &[String],
    per_pod: usize,
    host_network: bool,
    want: usize,
    timeout: Duration,
) -> Result<(Duration, usize)> {
    let t0 = Instant::now();
    for n in names {
        agent.write_manifest(n, &manifest(n, per_pod, "Always", host_network))?;
    }
    let mut last = (0, Instant::now());
    let running = loop {
        let n = running_ids(c, &agent.node).await?.len();
        if n >= want {
            break n;
        }
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(120) {
            bail!(
                "stuck at {n} of {want} running containers for 120 s:\n{}",
                agent.log_tail()
            );
        }
        if t0.elapsed() > timeout {
            return Ok((t0.elapsed(), n));
        }
        tokio::time::sleep(Duration::from_millis(if want > 500 { 2000 } else { 100 })).await;
    };
    let took = t0.elapsed();
    wait_pods_running(agent, names, per_pod, timeout).await?;
    Ok((took, running))
}

/// Waits until `/pods` shows every pod of `names` with its `per_pod`
/// containers running.
pub async fn wait_pods_running(
    agent: &AgentProc,
    names: &[String],
    per_pod: usize,
    timeout: Duration,
) -> Result<()> {
    let want: HashSet<&str> = names.iter().map(String::as_str).collect();
    let t0 = Instant::now();
    loop {
        let pods = agent.pods().await?;
        let ok = pods
            .iter()
            .filter(|p| {
                p.pointer("/metadata/name")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|n| want.contains(n))
                    && all_running(p, per_pod)
            })
            .count();
        if ok == want.len() {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            bail!(
                "/pods shows {ok} of {} pods running after {timeout:?}:\n{}",
                want.len(),
                agent.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(if want.len() > 200 {
            2000
        } else {
            200
        }))
        .await;
    }
}

/// Deletes the manifests of `names`; waits until `/pods` and the runtime
/// show none of them.
pub async fn delete_pods(
    c: &mut Clients,
    agent: &AgentProc,
    names: &[String],
    timeout: Duration,
) -> Result<Duration> {
    let t0 = Instant::now();
    for n in names {
        agent.remove_manifest(n)?;
    }
    let gone: HashSet<&str> = names.iter().map(String::as_str).collect();
    loop {
        let left = agent
            .pods()
            .await?
            .iter()
            .filter(|p| {
                p.pointer("/metadata/name")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|n| gone.contains(n))
            })
            .count();
        let sandboxes =
            c.rt.list_pod_sandbox(api::ListPodSandboxRequest {
                filter: Some(api::PodSandboxFilter {
                    label_selector: selector(&agent.node),
                    ..Default::default()
                }),
            })
            .await
            .context("ListPodSandbox")?
            .into_inner()
            .items
            .iter()
            .filter(|s| {
                s.metadata
                    .as_ref()
                    .is_some_and(|m| gone.contains(m.name.as_str()))
            })
            .count();
        if left == 0 && sandboxes == 0 {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > timeout {
            bail!(
                "{left} pods still at /pods and {sandboxes} sandboxes in the runtime {timeout:?} after their manifests were deleted:\n{}",
                agent.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Restarts the agent in `mode`; checks that its running containers
/// were adopted. `pods` (names, containers each) are waited for at
/// `/pods`; without them the agent gets [`SETTLE`] twice.
async fn restart(
    c: &mut Clients,
    agent: &mut AgentProc,
    mode: Mode,
    pods: Option<(&[String], usize)>,
) -> Result<Adoption> {
    let before = running_ids(c, &agent.node).await?;
    let t0 = Instant::now();
    agent.restart(mode).await?;
    match pods {
        Some((names, per_pod)) => {
            wait_pods_running(agent, names, per_pod, Duration::from_secs(600)).await?
        }
        None => tokio::time::sleep(SETTLE * 2).await,
    }
    let took = t0.elapsed();
    let after = running_ids(c, &agent.node).await?;
    Ok(Adoption {
        to: Some(mode),
        before: before.len(),
        kept: before.intersection(&after).count(),
        new: after.difference(&before).count(),
        took,
        startup: agent.last_startup,
    })
}

/// One idle window of `secs`.
async fn idle_window(
    c: &mut Clients,
    rt: &Runtime<'_>,
    agent: &AgentProc,
    secs: u64,
) -> Result<IdleWindow> {
    let containers = running_ids(c, &agent.node).await?.len();
    let m0 = relist_totals(agent).await;
    let shims = rt.shims()?;
    let (rt_pid, agent_pid) = (rt.pid(), agent.pid());
    let group = idle_cpu_group(agent, rt_pid, agent_pid, &shims);
    let g0 = group.as_ref().and_then(|g| g.usage().ok());
    let r0 = procfs::cpu(rt_pid)?;
    let a0 = procfs::cpu(agent_pid)?;
    let s0 = sum_cpu(&shims);
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let wall = t.elapsed();
    let r1 = procfs::cpu(rt_pid)?;
    let a1 = procfs::cpu(agent_pid)?;
    let s1 = sum_cpu(&shims);
    let g1 = group.as_ref().and_then(|g| g.usage().ok());
    if let Some(g) = group {
        // What cannot be undone here goes with the run's cgroup tree at the
        // end (`Work`'s sweep); the window's figures stand.
        if let Err(e) = g.leave() {
            eprintln!("petrel-bench: after the idle window: {e:#}");
        }
    }
    let shims_after = rt.shims()?;
    ensure!(
        shims == shims_after,
        "shims came or went during the idle window ({} -> {})",
        shims.len(),
        shims_after.len()
    );
    let m1 = relist_totals(agent).await;
    let relists = match (m0, m1) {
        (Some((n0, s0)), Some((n1, s1))) => Some((n1.saturating_sub(n0), (s1 - s0).max(0.0))),
        _ => None,
    };
    Ok(IdleWindow {
        containers,
        wall,
        runtime: r1.since(r0),
        agent: a1.since(a0),
        shims: s1.since(s0),
        shim_count: shims.len(),
        relists,
        accounted: g0.zip(g1).map(|(a, b)| b.saturating_sub(a)),
    })
}

/// The runtime, the agent and the shims moved into a cpuacct group of
/// their own for an idle window, or None (said on stderr) where that fails:
/// the window is then judged on clock ticks alone.
fn idle_cpu_group(
    agent: &AgentProc,
    rt_pid: u32,
    agent_pid: u32,
    shims: &[u32],
) -> Option<CpuGroup> {
    let mut pids = vec![rt_pid, agent_pid];
    pids.extend_from_slice(shims);
    let made = CpuGroup::create(&format!("{}-idle-cpu", agent.cgroup_root)).and_then(|mut g| {
        g.enter(&pids)?;
        Ok(g)
    });
    match made {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("petrel-bench: no cgroup CPU accounting for the idle window: {e:#}");
            None
        }
    }
}

/// What the agent's exit figure is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExitReference {
    /// The runtime's STOPPED event at the bench's own GetContainerEvents
    /// subscriber (Petrel's runtime broadcasts to every subscriber).
    #[default]
    Event,
    /// The runtime's ContainerStatus reporting EXITED, polled every
    /// [`STATUS_POLL`]: containerd 1.7 hands each event to one subscriber
    /// only (containerd#7318, fixed in 2.0), so a second subscriber would
    /// take events away from the agent.
    StatusPoll,
}

/// The polling interval of [`ExitReference::StatusPoll`].
pub const STATUS_POLL: Duration = Duration::from_millis(2);

/// Polls ContainerStatus of `id` until it is EXITED; when it first was.
async fn poll_exited(mut c: Clients, id: String) -> Option<Instant> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        let st =
            c.rt.container_status(api::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await
            .ok()?
            .into_inner()
            .status?;
        if st.state == api::ContainerState::ContainerExited as i32 {
            return Some(Instant::now());
        }
        tokio::time::sleep(STATUS_POLL).await;
    }
    None
}

/// A STOPPED event as the bench's own subscriber received it.
struct Stopped {
    id: String,
    at: Instant,
}

async fn subscribe_stopped(
    c: &Clients,
) -> Result<(
    tokio::sync::mpsc::UnboundedReceiver<Stopped>,
    tokio::task::JoinHandle<()>,
)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut rt = c.rt.clone();
    // The call is made inside the task: containerd (gRPC-Go) sends the
    // response headers only with the first event, so awaiting the call
    // here would wait for an event.
    let reader = tokio::spawn(async move {
        let Ok(resp) = rt.get_container_events(api::GetEventsRequest {}).await else {
            return;
        };
        let mut stream = resp.into_inner();
        while let Ok(Some(ev)) = stream.message().await {
            let at = Instant::now();
            if ev.container_event_type == api::ContainerEventType::ContainerStoppedEvent as i32
                && tx
                    .send(Stopped {
                        id: ev.container_id,
                        at,
                    })
                    .is_err()
            {
                break;
            }
        }
    });
    // The request is on its way once the task ran; leave a margin for the
    // runtime to register the subscriber.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if reader.is_finished() {
        bail!("GetContainerEvents failed at once");
    }
    Ok((rx, reader))
}

/// The reference of P12: the same pod (one `sleep` container) made
/// directly through CRI, then removed (untimed).
async fn direct_start(c: &mut Clients, name: &str, cgroup: &str, work: &Path) -> Result<Duration> {
    tokio::time::sleep(GAP).await;
    let config = pod_config(&format!("ref-{name}"), cgroup, work);
    let t = Instant::now();
    let pod = c.run_pod(&config).await?;
    let id = c.create(&pod, &config, sleep_container("c0")).await?;
    c.start(&id).await?;
    let took = t.elapsed();
    c.stop_pod(&pod).await?;
    c.remove_pod(&pod).await?;
    Ok(took)
}

/// P12: `n` pods (one `sleep` container, restartPolicy Never, so that P11
/// can kill them after) brought up through manifests, alternating with
/// the same pod made directly through CRI (when `direct_cgroup` is given).
#[allow(clippy::too_many_arguments)]
async fn measure_starts(
    c: &mut Clients,
    agent: &AgentProc,
    obs: &mut Observer,
    names: &[String],
    host_network: bool,
    direct_cgroup: Option<&str>,
    work: &Path,
) -> Result<StartRun> {
    let mut run = StartRun::default();
    let mut rng = StdRng::seed_from_u64(12);
    let m0 = pod_start_totals(agent).await;
    for (i, name) in names.iter().enumerate() {
        if i % 2 == 1 {
            if let Some(cg) = direct_cgroup {
                run.direct.push(direct_start(c, name, cg, work).await?);
            }
        }
        tokio::time::sleep(quiet(agent.mode, &mut rng)).await;
        let staged = agent.stage_manifest(name, &manifest(name, 1, "Never", host_network))?;
        obs.drain()?;
        let t0 = staged.publish()?;
        let (at, _) = obs
            .wait_for(name, Duration::from_secs(60), |p| all_running(p, 1))
            .await
            .with_context(|| format!("pod {name} did not run:\n{}", agent.log_tail()))?;
        run.agent.push(at.saturating_duration_since(t0));
        if i % 2 == 0 {
            if let Some(cg) = direct_cgroup {
                run.direct.push(direct_start(c, name, cg, work).await?);
            }
        }
    }
    let m1 = pod_start_totals(agent).await;
    if let (Some((n0, s0)), Some((n1, s1))) = (m0, m1) {
        if n1 > n0 {
            run.agent_metric_mean =
                Duration::try_from_secs_f64((s1 - s0).max(0.0) / (n1 - n0) as f64).ok();
        }
    }
    Ok(run)
}

/// The pods' `restartPolicy` in a P11 run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    /// The end is the container shown terminated.
    Never,
    /// The end is the exit shown as [`exit_shown`] reads it: terminated,
    /// or restarted with `lastState.terminated`.
    Always,
}

/// P11: kills the container of each pod of `names` (running, one
/// container `c0`) and times the agent's `/pods` against the runtime's own
/// STOPPED event.
async fn measure_exits(
    c: &mut Clients,
    agent: &AgentProc,
    obs: &mut Observer,
    names: &[String],
    reference: ExitReference,
    policy: Restart,
) -> Result<ExitRun> {
    let (mut events, reader) = match reference {
        ExitReference::Event => {
            let (rx, task) = subscribe_stopped(c).await?;
            (Some(rx), Some(task))
        }
        ExitReference::StatusPoll => (None, None),
    };
    let result = async {
        let mut run = ExitRun {
            reference,
            ..Default::default()
        };
        let mut rng = StdRng::seed_from_u64(11);
        for name in names {
            tokio::time::sleep(quiet(agent.mode, &mut rng)).await;
            obs.drain()?;
            let pod = match obs.latest(name) {
                Some(p) if container_id(p, "c0").is_some() => p.clone(),
                _ => {
                    let body = agent.get(&format!("/pods/bench/{name}")).await?;
                    serde_json::from_slice(&body).context("pod JSON")?
                }
            };
            let id = container_id(&pod, "c0")
                .with_context(|| format!("pod {name}: no containerID at /pods"))?;
            let restarts = restart_count(&pod, "c0");
            let shown = |p: &serde_json::Value| match policy {
                Restart::Never => terminated_code(p, "c0"),
                Restart::Always => exit_shown(p, "c0", &id, restarts),
            };
            let (pid, _) = c.init_pid(&id).await?;
            let target = Pid::from_raw(pid as i32).context("init pid")?;
            // Events of earlier exits are not this one's.
            if let Some(rx) = events.as_mut() {
                while rx.try_recv().is_ok() {}
            }
            let poll = (reference == ExitReference::StatusPoll)
                .then(|| tokio::spawn(poll_exited(c.clone(), id.clone())));
            let t0 = Instant::now();
            rustix::process::kill_process(target, Signal::KILL)
                .with_context(|| format!("kill init {pid} of container {id}"))?;
            let (at, pod) = obs
                .wait_for(name, Duration::from_secs(15), |p| shown(p).is_some())
                .await
                .with_context(|| format!("exit of {name} not shown:\n{}", agent.log_tail()))?;
            run.agent.push(at.saturating_duration_since(t0));
            if let Some(code) = shown(&pod).filter(|c| *c != KILLED) {
                run.wrong_codes.push(code);
            }
            let seen = match (events.as_mut(), poll) {
                (Some(rx), _) => loop {
                    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                        Ok(Some(ev)) if ev.id == id => break ev.at,
                        Ok(Some(_)) => continue,
                        Ok(None) => bail!("the runtime's event stream ended"),
                        Err(_) => bail!("no STOPPED event for container {id} within 10 s"),
                    }
                },
                (None, Some(task)) => task
                    .await
                    .context("status poll task")?
                    .with_context(|| format!("container {id} not EXITED in ContainerStatus"))?,
                (None, None) => bail!("no exit reference"),
            };
            run.runtime.push(seen.saturating_duration_since(t0));
        }
        Ok(run)
    }
    .await;
    if let Some(r) = reader {
        r.abort();
    }
    result
}

/// Raw ListPodSandbox + ListContainers with the agent's selector.
async fn list_reference(c: &mut Clients, node: &str, rounds: usize) -> Result<Samples> {
    let mut s = Samples::default();
    for i in 0..rounds + 5 {
        let t = Instant::now();
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: selector(node),
                ..Default::default()
            }),
        })
        .await
        .context("ListPodSandbox")?;
        c.rt.list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: selector(node),
                ..Default::default()
            }),
        })
        .await
        .context("ListContainers")?;
        // The first five warm up.
        if i >= 5 {
            s.push(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(s)
}

/// P13 at the current size: the agent in relist mode, idle.
async fn relist_point(
    c: &mut Clients,
    agent: &AgentProc,
    pods: usize,
    secs: u64,
) -> Result<RelistPoint> {
    ensure!(agent.mode == Mode::Relist, "P13 needs relist mode");
    let containers = running_ids(c, &agent.node).await?.len();
    let m0 = relist_totals(agent)
        .await
        .context("no kubelet_pleg_relist_duration_seconds at /metrics")?;
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let wall = t.elapsed();
    let m1 = relist_totals(agent)
        .await
        .context("no kubelet_pleg_relist_duration_seconds at /metrics")?;
    let count = m1.0.saturating_sub(m0.0);
    let mean = if count > 0 {
        Duration::try_from_secs_f64((m1.1 - m0.1).max(0.0) / count as f64).unwrap_or_default()
    } else {
        Duration::ZERO
    };
    let reference = list_reference(c, &agent.node, LIST_ROUNDS).await?;
    Ok(RelistPoint {
        pods,
        containers,
        wall,
        count,
        mean,
        reference,
    })
}

fn names(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i:04}")).collect()
}

/// P11 (and P12 where `direct_cgroup` is given) in both modes, then P10
/// at every size; the agent is left in event mode with the P10 pods.
#[allow(clippy::too_many_arguments)]
async fn exits_starts_idle(
    args: &Args,
    run: &mut TargetRun,
    res_method: &mut Option<(ObserveMethod, Option<String>)>,
    c: &mut Clients,
    rt: &Runtime<'_>,
    agent: &mut AgentProc,
    direct_cgroup: Option<&str>,
    work: &Path,
    sizes: &[usize],
    idle_names: &mut Vec<String>,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let hn = rt.host_network();
    for (k, mode) in [Mode::Events, Mode::Relist].into_iter().enumerate() {
        if k == 0 {
            agent.start(mode).await?;
        } else {
            agent.restart(mode).await?;
        }
        let mut obs = Observer::open(agent).await;
        if res_method.is_none() {
            *res_method = Some((obs.method(), obs.watch_error.clone()));
        }
        let n = match mode {
            Mode::Events => args.agent_pods,
            Mode::Relist => args.agent_relist_pods,
        };
        let pods = names(&format!("up-{}", &mode.arg()[..1]), 0..n);
        progress(&format!(
            "{}: P12 {} pods through manifests, {} mode",
            run.name,
            pods.len(),
            mode.arg()
        ));
        let starts = measure_starts(c, agent, &mut obs, &pods, hn, direct_cgroup, work).await?;
        run.starts.push((mode, starts));
        progress(&format!(
            "{}: P11 {} exits, {} mode",
            run.name,
            pods.len(),
            mode.arg()
        ));
        let reference = match rt {
            Runtime::Petrel(_) => ExitReference::Event,
            Runtime::Containerd(_) => ExitReference::StatusPoll,
        };
        let exits = measure_exits(c, agent, &mut obs, &pods, reference, Restart::Never).await?;
        run.exits.push((mode, exits));
        let took = delete_pods(c, agent, &pods, Duration::from_secs(300)).await?;
        run.deletes.push((pods.len(), took));
        if mode == Mode::Events {
            // P11 with restartPolicy Always: fresh pods, each killed once,
            // so that no restart back-off is in the way.
            let always = names("al-e", 0..n);
            progress(&format!(
                "{}: P11 {} exits, restartPolicy Always, events mode",
                run.name,
                always.len()
            ));
            let want = running_ids(c, &agent.node).await?.len() + always.len();
            grow(c, agent, &always, 1, hn, want, Duration::from_secs(300)).await?;
            obs.drain()?;
            let exits =
                measure_exits(c, agent, &mut obs, &always, reference, Restart::Always).await?;
            run.exits_always = Some(exits);
            delete_pods(c, agent, &always, Duration::from_secs(300)).await?;
        }
    }

    // P10: the agent is in relist mode now; the first size is measured in
    // it first, the next in event mode first, and so on.
    let mut have = 0;
    for &size in sizes {
        progress(&format!(
            "{}: P10 growing to {size} running containers",
            run.name
        ));
        let new = names("idle", have..size.max(have));
        grow(c, agent, &new, 1, hn, size, Duration::from_secs(600)).await?;
        idle_names.extend(new);
        have = size.max(have);
        tokio::time::sleep(SETTLE).await;
        let mut point = IdlePoint {
            containers: size,
            ..Default::default()
        };
        for i in 0..2 {
            if i == 1 {
                let to = agent.mode.other();
                progress(&format!(
                    "{}: restarting the agent in {} mode",
                    run.name,
                    to.arg()
                ));
                let a = restart(c, agent, to, Some((idle_names, 1))).await?;
                run.adoptions.push(a);
                tokio::time::sleep(SETTLE).await;
            }
            progress(&format!(
                "{}: P10 idle window of {} s, {size} containers, {} mode",
                run.name,
                args.agent_idle_seconds,
                agent.mode.arg()
            ));
            let w = idle_window(c, rt, agent, args.agent_idle_seconds).await?;
            match agent.mode {
                Mode::Relist => point.relist = w,
                Mode::Events => point.events = w,
            }
        }
        run.idle.push(point);
    }
    Ok(())
}

/// Removes every pod of the agent through CRI, four at a time.
async fn remove_pods(c: &Clients, node: &str) -> Result<Duration> {
    let t0 = Instant::now();
    let mut c0 = c.clone();
    let ids: Vec<String> = c0
        .rt
        .list_pod_sandbox(api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: selector(node),
                ..Default::default()
            }),
        })
        .await
        .context("ListPodSandbox")?
        .into_inner()
        .items
        .into_iter()
        .map(|p| p.id)
        .collect();
    let chunks: Vec<Vec<String>> = ids
        .chunks(ids.len().div_ceil(4).max(1))
        .map(<[String]>::to_vec)
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for chunk in chunks {
        let mut c = c.clone();
        set.spawn(async move {
            for id in chunk {
                c.stop_pod(&id).await?;
                c.remove_pod(&id).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.context("removal task")??;
    }
    Ok(t0.elapsed())
}

/// The agent section against Petrel's runtime, then containerd 1.7.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> AgentResults {
    let mut res = AgentResults {
        petrel: TargetRun {
            name: "petrel runtime".to_string(),
            ..Default::default()
        },
        relist: vec![],
        large: Large::default(),
        containerd: Err("not run".to_string()),
        method: None,
        watch_error: None,
        idle_seconds: args.agent_idle_seconds,
        relist_seconds: args.agent_relist_seconds,
        pods: args.agent_pods,
        relist_pods: args.agent_relist_pods,
    };
    let mut method = None;
    if args.agent_skip_petrel {
        res.petrel.error = Some("skipped with --agent-skip-petrel".to_string());
    } else if let Err(e) = measure_petrel(args, work, &mut res, &mut method, progress).await {
        progress(&format!("agent on petrel runtime failed: {e:#}"));
        res.petrel.error = Some(format!("{e:#}"));
    }
    res.containerd = match containerd_skip_reason(args) {
        Some(why) => Err(why),
        None => {
            let mut run = TargetRun {
                name: "containerd 1.7".to_string(),
                ..Default::default()
            };
            if let Err(e) = measure_containerd(args, work, &mut run, &mut method, progress).await {
                progress(&format!("agent on containerd failed: {e:#}"));
                run.error = Some(format!("{e:#}"));
            }
            Ok(run)
        }
    };
    if let Some((m, e)) = method {
        res.method = Some(m);
        res.watch_error = e;
    }
    res
}

fn containerd_skip_reason(args: &Args) -> Option<String> {
    if args.agent_skip_containerd {
        return Some("skipped with --agent-skip-containerd".to_string());
    }
    let images = args
        .image
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    crate::containerd::unavailable(&crate::containerd::bin_dir(&args.build_dir), &images)
}

async fn measure_petrel(
    args: &Args,
    work: &Work,
    res: &mut AgentResults,
    method: &mut Option<(ObserveMethod, Option<String>)>,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let dir = work.dir.join("agent");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    progress("agent: starting a runtime for the agent");
    let mut node = Node::start(
        &args.petrel,
        args.shim.as_deref(),
        &format!("{}/agent-direct", work.cgroup_parent),
    )?;
    let mut c = node.connect().await?;
    c.import(&args.image).await?;
    let node_name = format!("bench-{}", work.id());
    let mut agent = AgentProc::new(
        &args.petrel,
        &node.endpoint(),
        &dir,
        &node_name,
        &format!("{}/agent", work.cgroup_parent),
    )?;
    let rt = Runtime::Petrel(&node);
    let mut idle_names = vec![];
    let direct_cgroup = format!("{}/agent-direct", work.cgroup_parent);
    let out = async {
        exits_starts_idle(
            args,
            &mut res.petrel,
            method,
            &mut c,
            &rt,
            &mut agent,
            Some(&direct_cgroup),
            &dir,
            &args.agent_sizes,
            &mut idle_names,
            progress,
        )
        .await?;
        large(args, res, &mut c, &mut agent, &idle_names, progress).await
    }
    .await;
    agent.stop();
    progress("agent: removing the agent's pods");
    match remove_pods(&c, &node_name).await {
        Ok(d) => res.large.teardown = d,
        Err(e) => progress(&format!("removing pods failed: {e:#}")),
    }
    drop(c);
    node.shutdown();
    out
}

/// P13: relist mode at 100 pods × N and at the large size.
async fn large(
    args: &Args,
    res: &mut AgentResults,
    c: &mut Clients,
    agent: &mut AgentProc,
    idle_names: &[String],
    progress: &dyn Fn(&str),
) -> Result<()> {
    let per = args.agent_containers_per_pod.max(1);
    progress("agent: P13 removing the P10 pods");
    delete_pods(c, agent, idle_names, Duration::from_secs(600)).await?;
    if agent.mode != Mode::Events {
        agent.restart(Mode::Events).await?;
    }
    // Each container is a shim and an init: keep the machine's pid limit
    // in sight.
    let (tasks, pid_max) = procfs::tasks_and_pid_max();
    let room = pid_max.saturating_sub(tasks + PID_MARGIN) / 2 / per;
    let target = args.agent_large_pods;
    let large_pods = target.min(room);
    res.large = Large {
        target_pods: target,
        per_pod: per,
        written: large_pods,
        ..Default::default()
    };
    if large_pods < target {
        res.large.note = Some(format!(
            "pid_max is {pid_max} and {tasks} tasks exist: room for {large_pods} pods of {per} containers (each a shim and an init), keeping {PID_MARGIN} free"
        ));
    }
    let small = 100.min(large_pods);
    let mut have = 0;
    for size in [small, large_pods] {
        if size <= have {
            continue;
        }
        if agent.mode != Mode::Events {
            agent.restart(Mode::Events).await?;
        }
        progress(&format!(
            "agent: P13 growing to {size} pods × {per} containers (event mode)"
        ));
        let new = names("big", have..size);
        let all = names("big", 0..size);
        let (took, running) = grow(
            c,
            agent,
            &new,
            per,
            false,
            size * per,
            Duration::from_secs(args.agent_grow_timeout),
        )
        .await?;
        let complete = running >= size * per;
        res.large.grown_from = have;
        res.large.grow = took;
        res.large.running = running;
        have = size;
        if !complete {
            res.large.note = Some(format!(
                "only {running} of {} containers ran within {} s; measured as they were",
                size * per,
                args.agent_grow_timeout
            ));
        }
        progress("agent: P13 restarting the agent in relist mode");
        let wait = complete.then_some((all.as_slice(), per));
        let a = restart(c, agent, Mode::Relist, wait).await?;
        res.petrel.adoptions.push(a);
        tokio::time::sleep(SETTLE).await;
        progress(&format!(
            "agent: P13 relist window of {} s at {size} pods",
            args.agent_relist_seconds
        ));
        res.relist
            .push(relist_point(c, agent, size, args.agent_relist_seconds).await?);
    }
    Ok(())
}

async fn measure_containerd(
    args: &Args,
    work: &Work,
    run: &mut TargetRun,
    method: &mut Option<(ObserveMethod, Option<String>)>,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let dir = work.dir.join("containerd");
    let images = args
        .image
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    progress("agent: starting containerd 1.7");
    let mut cd =
        Containerd::start(&crate::containerd::bin_dir(&args.build_dir), &dir, &images).await?;
    if !cd.version.is_empty() {
        run.name = format!("containerd {}", cd.version);
    }
    let mut c = Clients::connect(&cd.endpoint()).await?;
    let node_name = format!("bench-{}-cd", work.id());
    let adir = dir.join("agent");
    let mut agent = AgentProc::new(
        &args.petrel,
        &cd.endpoint(),
        &adir,
        &node_name,
        &format!("{}/agent-cd", work.cgroup_parent),
    )?;
    let rt = Runtime::Containerd(&cd);
    let mut idle_names = vec![];
    let out = exits_starts_idle(
        args,
        run,
        method,
        &mut c,
        &rt,
        &mut agent,
        None,
        &adir,
        &args.agent_containerd_sizes,
        &mut idle_names,
        progress,
    )
    .await;
    agent.stop();
    if let Err(e) = remove_pods(&c, &node_name).await {
        progress(&format!("removing containerd pods failed: {e:#}"));
    }
    drop(c);
    cd.shutdown();
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn metric_should_find_plain_and_labelled_samples() {
        let text = "# HELP kubelet_pleg_relist_duration_seconds x\n\
                    kubelet_pleg_relist_duration_seconds_sum 0.25\n\
                    kubelet_pleg_relist_duration_seconds_count 10\n\
                    kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"} 9\n\
                    kubelet_pod_start_duration_seconds_count{x=\"y\"} 3\n";
        assert_eq!(
            metric(text, "kubelet_pleg_relist_duration_seconds_sum"),
            Some(0.25)
        );
        assert_eq!(
            metric(text, "kubelet_pleg_relist_duration_seconds_count"),
            Some(10.0)
        );
        assert_eq!(
            metric(text, "kubelet_pod_start_duration_seconds_count"),
            Some(3.0)
        );
        assert_eq!(metric(text, "kubelet_pleg_relist_duration_seconds"), None);
    }
}
