//! The figures of one run and their rendering as docs/PERFORMANCE.md.

use std::time::Duration;

use crate::agent::AgentResults;
use crate::agent_report;
use crate::cluster_bench::ClusterResults;
use crate::cluster_bench_report;
use crate::controller_bench::ControllerResults;
use crate::controller_bench_report;
use crate::critest_bench::CritestBenchResults;
use crate::critest_bench_report;
use crate::eviction::EvictionResults;
use crate::eviction_report;
use crate::kubelet::KubeletResults;
use crate::kubelet_report;
use crate::machine::Machine;
use crate::metrics::OpTotals;
use crate::net::NetResults;
use crate::net_report;
use crate::nri::NriResults;
use crate::nri_report;
use crate::procfs::{Cpu, Mem};
use crate::pull::PullResults;
use crate::pull_report;
use crate::queue::QueueResults;
use crate::queue_report;
use crate::stats::{ms, ratio, verdict, within, Samples};
use crate::template::{render as render_template, TemplateError, Vars};
use crate::vm_bench::VmResults;
use crate::vm_bench_report;
use crate::Args;

/// Goal of P1: Petrel's latency over raw runc's.
const LIFECYCLE_RATIO_GOAL: f64 = 1.2;
/// Goal of P2: bytes of RSS per shim (1 MB).
const SHIM_RSS_GOAL_BYTES: u64 = 1_000_000;
/// Goal of P2: bytes of RSS of the runtime with 100 containers (30 MB).
const RUNTIME_RSS_GOAL_BYTES: u64 = 30_000_000;
/// Goal of P3: a List call at 1000 containers, judged at p50 (issue 2's
/// "≤ 1 ms at 1000" names no percentile, where its exit goal names p99).
const LIST_P50_GOAL: Duration = Duration::from_millis(1);
/// Goal of P4: p99 from kill(2) to the STOPPED event.
const EXIT_P99_GOAL: Duration = Duration::from_millis(5);
/// Goal of P5: percent of one core (runtime and shims) while idle.
const IDLE_CPU_GOAL_PERCENT: f64 = 0.1;

/// Per-step samples in the order the steps run.
#[derive(Debug, Default)]
pub struct Steps {
    steps: Vec<(&'static str, Samples)>,
}

impl Steps {
    /// Records one sample of step `name`.
    pub fn push(&mut self, name: &'static str, d: Duration) {
        match self.steps.iter_mut().find(|(n, _)| *n == name) {
            Some((_, s)) => s.push(d),
            None => {
                let mut s = Samples::default();
                s.push(d);
                self.steps.push((name, s));
            }
        }
    }

    /// Each step's name and samples, in the order the steps run.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Samples)> {
        self.steps.iter().map(|(n, s)| (*n, s))
    }
}

/// Latency of one lifecycle direction, Petrel and raw runc.
#[derive(Debug, Default)]
pub struct Lifecycle {
    /// Petrel, whole direction.
    pub petrel: Samples,
    /// Petrel, per CRI call.
    pub petrel_steps: Steps,
    /// Raw runc, whole direction.
    pub raw: Samples,
    /// Raw runc, per step.
    pub raw_steps: Steps,
    /// Mean handler time of each Petrel step by the runtime's own metrics.
    pub runtime_side: Vec<(&'static str, Option<Duration>)>,
}

impl Lifecycle {
    /// Records the runtime-side mean of every Petrel step from two metric
    /// snapshots taken around the phase.
    pub fn set_runtime_side(&mut self, after: &OpTotals, before: &OpTotals) {
        self.runtime_side = self
            .petrel_steps
            .steps
            .iter()
            .map(|(name, _)| (*name, after.mean_since(before, name)))
            .collect();
    }

    fn runtime_side_of(&self, step: &str) -> Option<Duration> {
        self.runtime_side
            .iter()
            .find(|(n, _)| *n == step)
            .and_then(|(_, d)| *d)
    }
}

/// Memory with one container per pod.
#[derive(Debug, Default)]
pub struct Memory {
    /// Running containers.
    pub containers: usize,
    /// Every shim of this runtime.
    pub shims: Vec<Mem>,
    /// How many of them are children of the runtime.
    pub shims_parented: usize,
    /// The runtime.
    pub runtime: Mem,
    /// Every container's init (busybox `sleep 3600`).
    pub inits: Vec<Mem>,
    /// A host `sleep` started by the bench.
    pub sleep: Mem,
}

/// CPU used over the idle window.
#[derive(Debug, Default)]
pub struct Idle {
    /// Length of the window.
    pub wall: Duration,
    /// The runtime.
    pub runtime: Cpu,
    /// All shims together.
    pub shims: Cpu,
    /// How many shims.
    pub shim_count: usize,
    /// A host `sleep` over the same window.
    pub sleep: Cpu,
    /// USER_HZ.
    pub ticks_per_second: u64,
}

/// One round of List calls.
#[derive(Debug, Default)]
pub struct ListRound {
    /// Containers present.
    pub containers: usize,
    /// Version (the floor of a call).
    pub version: Samples,
    /// ListContainers.
    pub list_containers: Samples,
    /// ListPodSandbox.
    pub list_pods: Samples,
    /// Encoded size of the ListContainers response.
    pub response_bytes: usize,
    /// Encoding that response in the bench process.
    pub encode: Samples,
    /// Decoding it.
    pub decode: Samples,
    /// Freeing the decoded response (not part of a call's latency).
    pub free: Samples,
    /// Mean handler time of Version, ListContainers and ListPodSandbox by
    /// the runtime's own metrics.
    pub runtime_side: [Option<Duration>; 3],
}

/// Growing to 1000 containers.
#[derive(Debug, Default)]
pub struct Scale {
    /// Containers present after growing.
    pub containers: usize,
    /// CreateContainer of the added containers.
    pub create: Samples,
    /// StartContainer of the added containers.
    pub start: Samples,
    /// The runtime at that size.
    pub runtime: Mem,
    /// Every shim at that size.
    pub shims: Vec<Mem>,
}

/// Exit notification latency.
#[derive(Debug, Default)]
pub struct Exits {
    /// kill(2) of a container's init to the STOPPED event at a subscriber.
    pub petrel: Samples,
    /// kill(2) of our own child to its pidfd being readable.
    pub kernel: Samples,
    /// kill(2) to the shim reaping the init (its exit record's time).
    pub to_reaped: Samples,
    /// The shim reaping the init to the runtime publishing the event
    /// (the event's `created_at`).
    pub to_published: Samples,
    /// Publication to reception by the subscriber.
    pub to_received: Samples,
}

/// Everything one run measured.
#[derive(Debug, Default)]
pub struct Results {
    /// write + fsync of a small file on the runtime's file system.
    pub fsync: Samples,
    /// P1 up.
    pub up: Lifecycle,
    /// P1 down.
    pub down: Lifecycle,
    /// P2.
    pub memory: Memory,
    /// P5.
    pub idle: Idle,
    /// P3, one round per size.
    pub lists: Vec<ListRound>,
    /// Growing to 1000 containers.
    pub scale: Scale,
    /// P4.
    pub exits: Exits,
    /// Shims of the runtime still present after the down phase (should be 0).
    pub shims_left: usize,
    /// The runtime's memory after every pod was removed.
    pub runtime_after: Mem,
    /// /proc/loadavg at the end.
    pub load_after: String,
    /// P6-P9, the controller kit's queue (absent with `--only runtime`).
    pub queue: Option<QueueResults>,
    /// P14-P15, image pull and create on a warm image (absent with
    /// `--only runtime`).
    pub pull: Option<PullResults>,
    /// P10-P13, the agent (absent with `--only runtime`).
    pub agent: Option<AgentResults>,
    /// P16-P18, pod network and exec against containerd (absent with
    /// `--only runtime`).
    pub net: Option<NetResults>,
    /// P19-P20, NRI (absent with `--only runtime`).
    pub nri: Option<NriResults>,
    /// P21-P22, the agent's eviction manager (absent with `--only runtime`).
    pub eviction: Option<EvictionResults>,
    /// P23-P27, the real kubelet beside Petrel (absent with `--only
    /// runtime`).
    pub kubelet: Option<KubeletResults>,
    /// P28, critest's benchmarks on both runtimes (absent with `--only
    /// runtime`).
    pub critest: Option<CritestBenchResults>,
    /// P29-P32, the controller kit beside controller-runtime (absent with
    /// `--only runtime`).
    pub controller: Option<ControllerResults>,
    /// P33-P35, nodes of a real cluster (absent with `--only runtime`).
    pub cluster: Option<ClusterResults>,
    /// P38-P39, cgroup v2 against v1 in test VM guests (absent with
    /// `--only runtime`).
    pub vm: Option<VmResults>,
}

fn kib(k: u64) -> String {
    format!("{k} KiB ({:.2} MB)", k as f64 * 1024.0 / 1e6)
}

fn kib_f(k: f64) -> String {
    format!("{k:.0} KiB ({:.2} MB)", k * 1024.0 / 1e6)
}

fn mean_of(mems: &[Mem], f: impl Fn(&Mem) -> u64) -> f64 {
    if mems.is_empty() {
        return 0.0;
    }
    mems.iter().map(&f).sum::<u64>() as f64 / mems.len() as f64
}

fn max_of(mems: &[Mem], f: impl Fn(&Mem) -> u64) -> u64 {
    mems.iter().map(f).max().unwrap_or(0)
}

fn cpu_ms(c: Cpu, hz: u64) -> f64 {
    c.ticks as f64 * 1000.0 / hz.max(1) as f64
}

fn percent_of_core(cpu_ms: f64, wall: Duration) -> f64 {
    if wall.is_zero() {
        return 0.0;
    }
    cpu_ms / (wall.as_secs_f64() * 1000.0) * 100.0
}

/// A partial report's template (`--only PART`).
const PART: &str = include_str!("../templates/part.md");

/// Renders the queue figures alone (`--only queue`): a partial report for
/// quick iteration, not a replacement for docs/PERFORMANCE.md.
pub fn render_queue_only(m: &Machine, q: &QueueResults) -> Result<String, TemplateError> {
    render_part(
        m,
        "petrel-bench --only queue",
        "the controller kit's queue only",
        queue_report::summary_rows(q)?,
        queue_report::sections(q)?,
    )
}

/// Renders the agent figures alone (`--only agent`): a partial report for
/// quick iteration, not a replacement for docs/PERFORMANCE.md.
pub fn render_agent_only(m: &Machine, a: &AgentResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "the agent only",
        agent_report::summary_rows(a)?,
        agent_report::sections(a)?,
    )
}

/// Renders the pull figures alone (`--only pull`).
pub fn render_pull_only(m: &Machine, p: &PullResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "image pull and create only",
        pull_report::summary_rows(p)?,
        pull_report::sections(p)?,
    )
}

/// Renders the network and exec figures alone (`--only net`).
pub fn render_net_only(m: &Machine, n: &NetResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "pod network and exec only",
        net_report::summary_rows(n)?,
        net_report::sections(n)?,
    )
}

/// Renders the NRI figures alone (`--only nri`).
pub fn render_nri_only(m: &Machine, n: &NriResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "NRI only",
        nri_report::summary_rows(n)?,
        nri_report::sections(n)?,
    )
}

/// Renders the eviction manager's figures alone (`--only eviction`).
pub fn render_eviction_only(m: &Machine, e: &EvictionResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "the eviction manager only",
        eviction_report::summary_rows(e)?,
        eviction_report::sections(e)?,
    )
}

/// Renders the kubelet figures alone (`--only kubelet`).
pub fn render_kubelet_only(m: &Machine, k: &KubeletResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "the real kubelet beside Petrel only",
        kubelet_report::summary_rows(k)?,
        kubelet_report::sections(k)?,
    )
}

/// Renders critest's benchmarks alone (`--only critest`).
pub fn render_critest_only(m: &Machine, c: &CritestBenchResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "critest's benchmarks only",
        critest_bench_report::summary_rows(c)?,
        critest_bench_report::sections(c)?,
    )
}

/// Renders the controller kit's figures alone (`--only controller`).
pub fn render_controller_only(m: &Machine, c: &ControllerResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "the controller kit beside controller-runtime only",
        controller_bench_report::summary_rows(c)?,
        controller_bench_report::sections(c)?,
    )
}

/// Renders the cluster node figures alone (`--only cluster`).
pub fn render_cluster_only(m: &Machine, c: &ClusterResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "nodes of a real cluster, `petrel node` beside kubelet, only",
        cluster_bench_report::summary_rows(c)?,
        cluster_bench_report::sections(c)?,
    )
}

/// Renders the cgroup v2 against v1 figures alone (`--only vm`).
pub fn render_vm_only(m: &Machine, r: &VmResults) -> Result<String, TemplateError> {
    render_part(
        m,
        &m.command,
        "cgroup v2 against v1 in test VM guests only",
        vm_bench_report::summary_rows(r)?,
        vm_bench_report::sections(r)?,
    )
}

/// One part's report: a title, the run in a comment, the summary table
/// with the part's `rows`, then its `sections`.
fn render_part(
    m: &Machine,
    command: &str,
    title: &str,
    rows: String,
    sections: String,
) -> Result<String, TemplateError> {
    let mut v = Vars::new();
    v.set("title", title)
        .set("command", command)
        .set("date", &m.date)
        .set("commit", &m.commit)
        .set("cpus", m.cpus)
        .set("cpu_model", &m.cpu_model)
        .set("rows", rows)
        .set("sections", sections);
    render_template(PART, &v)
}

/// The whole report's template.
const REPORT: &str = include_str!("../templates/report.md");

/// p50, p99, max and mean of `s` in ms, under those names.
fn sample_vars(v: &mut Vars, s: &Samples) {
    v.set("p50", ms(s.p50()))
        .set("p99", ms(s.p99()))
        .set("max", ms(s.max()))
        .set("mean", ms(s.mean()));
}

/// The values of one lifecycle direction (P1): its summary row and table.
fn lifecycle_vars(promise: &str, title: &str, raw_what: &str, l: &Lifecycle, pass: bool) -> Vars {
    let mut v = Vars::new();
    sample_vars(&mut v, &l.petrel);
    v.set("promise", promise)
        .set("title", title)
        .set("raw_what", raw_what)
        .set("raw_p50", ms(l.raw.p50()))
        .set("raw_p99", ms(l.raw.p99()))
        .set("raw_max", ms(l.raw.max()))
        .set("raw_mean", ms(l.raw.mean()))
        .set("ratio_p50", ratio(l.petrel.p50(), l.raw.p50()))
        .set("ratio_p99", ratio(l.petrel.p99(), l.raw.p99()))
        .set("verdict", verdict(pass));
    let steps = l
        .petrel_steps
        .steps
        .iter()
        .map(|(name, s)| {
            let mut r = Vars::new();
            sample_vars(&mut r, s);
            r.set("name", name).set(
                "runtime_side",
                l.runtime_side_of(name).map(ms).unwrap_or_default(),
            );
            r
        })
        .collect();
    let raw_steps = l
        .raw_steps
        .steps
        .iter()
        .map(|(name, s)| {
            let mut r = Vars::new();
            sample_vars(&mut r, s);
            r.set("name", name);
            r
        })
        .collect();
    let largest = l
        .petrel_steps
        .steps
        .iter()
        .max_by_key(|(_, s)| s.p50())
        .map(|(name, s)| {
            let mut r = Vars::new();
            r.set("name", name)
                .set("p50", ms(s.p50()))
                .set("total_p50", ms(l.petrel.p50()))
                .set("excess", signed_ms(l.petrel.p50(), l.raw.p50()));
            r
        })
        .into_iter()
        .collect();
    v.list("steps", steps)
        .list("raw_steps", raw_steps)
        .list("largest", largest);
    v
}

/// One row of P2's memory table.
fn memory_row(name: &str, ms: &[Mem]) -> Vars {
    let mut v = Vars::new();
    v.set("name", name)
        .set("count", ms.len())
        .set("mean_rss", kib_f(mean_of(ms, |m| m.rss_kib)))
        .set("max_rss", kib(max_of(ms, |m| m.rss_kib)))
        .set("mean_pss", kib_f(mean_of(ms, |m| m.pss_kib)))
        .set("max_pss", kib(max_of(ms, |m| m.pss_kib)))
        .set("mean_uss", kib_f(mean_of(ms, |m| m.uss_kib)))
        .set("mean_anon", kib_f(mean_of(ms, |m| m.anon_kib)));
    v
}

/// One round of P3: its calls' rows and its response's sizes.
fn list_round_vars(l: &ListRound) -> Vars {
    let calls = [
        ("Version", &l.version),
        ("ListContainers", &l.list_containers),
        ("ListPodSandbox", &l.list_pods),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (name, s))| {
        let mut r = Vars::new();
        sample_vars(&mut r, s);
        r.set("call", name)
            .set("ratio_p50", ratio(s.p50(), l.version.p50()))
            .set("ratio_p99", ratio(s.p99(), l.version.p99()))
            .set(
                "runtime_side",
                l.runtime_side[i].map(ms).unwrap_or_default(),
            );
        r
    })
    .collect();
    let mut v = Vars::new();
    v.set("containers", l.containers)
        .set("response_bytes", l.response_bytes)
        .set("encode_p50", ms(l.encode.p50()))
        .set("decode_p50", ms(l.decode.p50()))
        .set("free_p50", ms(l.free.p50()))
        .list("calls", calls);
    v
}

/// Where the median ListContainers call of the largest round goes (P3).
fn list_largest_vars(l: &ListRound) -> Vars {
    let call = l.list_containers.p50();
    let known = l.version.p50() + l.decode.p50();
    let mut v = list_round_vars(l);
    v.set("call_p50", ms(call))
        .set(
            "handler",
            l.runtime_side[1].map(ms).unwrap_or_else(|| "—".to_string()),
        )
        .set("version_p50", ms(l.version.p50()))
        .set("rest", ms(call.saturating_sub(known)));
    v
}

/// The summary rows and the sections of the other parts, in report order.
fn other_parts(r: &Results) -> Result<(String, String), TemplateError> {
    let mut rows = String::new();
    let mut sections = String::new();
    if let Some(q) = &r.queue {
        rows += &queue_report::summary_rows(q)?;
        sections += &queue_report::sections(q)?;
    }
    if let Some(a) = &r.agent {
        rows += &agent_report::summary_rows(a)?;
        sections += &agent_report::sections(a)?;
    }
    if let Some(p) = &r.pull {
        rows += &pull_report::summary_rows(p)?;
        sections += &pull_report::sections(p)?;
    }
    if let Some(n) = &r.net {
        rows += &net_report::summary_rows(n)?;
        sections += &net_report::sections(n)?;
    }
    if let Some(n) = &r.nri {
        rows += &nri_report::summary_rows(n)?;
        sections += &nri_report::sections(n)?;
    }
    if let Some(e) = &r.eviction {
        rows += &eviction_report::summary_rows(e)?;
        sections += &eviction_report::sections(e)?;
    }
    if let Some(k) = &r.kubelet {
        rows += &kubelet_report::summary_rows(k)?;
        sections += &kubelet_report::sections(k)?;
    }
    if let Some(c) = &r.critest {
        rows += &critest_bench_report::summary_rows(c)?;
        sections += &critest_bench_report::sections(c)?;
    }
    if let Some(c) = &r.controller {
        rows += &controller_bench_report::summary_rows(c)?;
        sections += &controller_bench_report::sections(c)?;
    }
    if let Some(c) = &r.cluster {
        rows += &cluster_bench_report::summary_rows(c)?;
        sections += &cluster_bench_report::sections(c)?;
    }
    if let Some(v) = &r.vm {
        rows += &vm_bench_report::summary_rows(v)?;
        sections += &vm_bench_report::sections(v)?;
    }
    Ok((rows, sections))
}

/// The machine's facts and the run's flags, for "The run".
fn run_vars(v: &mut Vars, m: &Machine, args: &Args, r: &Results) {
    v.set("date", &m.date)
        .set("commit", &m.commit)
        .set("command", &m.command)
        .set("kernel", &m.kernel)
        .set("cpus", m.cpus)
        .set("cpu_model", &m.cpu_model)
        .set("memory", &m.memory)
        .set("load_before", &m.load_before)
        .set("load_after", &r.load_after)
        .set("cgroups", &m.cgroups)
        .set("work_fs", &m.work_fs)
        .set("runc", &m.runc)
        .set("shim", &m.shim)
        .set("pods", args.pods)
        .set("extra_per_pod", args.extra_per_pod)
        .set("list_calls", args.list_calls)
        .set("exit_count", args.exits)
        .set("idle_seconds", args.idle_seconds)
        .flag("agent", r.agent.is_some())
        .set("agent_idle_seconds", args.agent_idle_seconds)
        .set("agent_sizes", format!("{:?}", args.agent_sizes))
        .set(
            "agent_containerd_sizes",
            format!("{:?}", args.agent_containerd_sizes),
        )
        .set("agent_pods", args.agent_pods)
        .set("agent_relist_pods", args.agent_relist_pods)
        .set("agent_large_pods", args.agent_large_pods)
        .set("agent_containers_per_pod", args.agent_containers_per_pod)
        .set("agent_relist_seconds", args.agent_relist_seconds)
        .flag("net", r.net.is_some())
        .set("net_pods", args.net_pods)
        .set("net_execs", args.net_execs)
        .flag("nri", r.nri.is_some())
        .set("nri_rounds", args.nri_rounds)
        .set("nri_creates", args.nri_creates)
        .set("nri_sync_containers", args.nri_sync_containers)
        .set("nri_sync_rounds", args.nri_sync_rounds)
        .flag("eviction", r.eviction.is_some())
        .set("eviction_rounds", args.eviction_rounds)
        .set("eviction_polling_rounds", args.eviction_polling_rounds)
        .set("eviction_idle_seconds", args.eviction_idle_seconds)
        .set("eviction_pass_seconds", args.eviction_pass_seconds)
        .flag("pull", r.pull.is_some())
        .set("pull_image_mb", args.pull_image_mb)
        .set("pull_layers", args.pull_layers)
        .set("pull_repetitions", args.pull_repetitions)
        .set("create_containers", args.create_containers)
        .set("fsync_p50", ms(r.fsync.p50()))
        .set("fsync_p99", ms(r.fsync.p99()));
    match &r.cluster {
        Some(c) => v
            .flag("cluster", true)
            .set("cluster_starts", c.starts)
            .set("cluster_burst", c.burst)
            .set("cluster_idle_seconds", c.idle_seconds),
        None => v.flag("cluster", false),
    };
    match &r.kubelet {
        Some(k) => v
            .flag("kubelet", true)
            .set("kubelet_idle_seconds", k.idle_seconds)
            .set("kubelet_sizes", format!("{:?}", k.sizes))
            .set("kubelet_exits", k.exits)
            .set("kubelet_starts", k.starts)
            .set("kubelet_ramp_seconds", k.ramp_timeout.as_secs()),
        None => v.flag("kubelet", false),
    };
}

/// Renders the report.
pub fn render(m: &Machine, args: &Args, r: &Results) -> Result<String, TemplateError> {
    let hz = r.idle.ticks_per_second;
    let up_pass = within(r.up.petrel.p50(), r.up.raw.p50(), LIFECYCLE_RATIO_GOAL)
        && within(r.up.petrel.p99(), r.up.raw.p99(), LIFECYCLE_RATIO_GOAL);
    let down_pass = within(r.down.petrel.p50(), r.down.raw.p50(), LIFECYCLE_RATIO_GOAL)
        && within(r.down.petrel.p99(), r.down.raw.p99(), LIFECYCLE_RATIO_GOAL);
    let mem = &r.memory;
    let shim_max_rss = max_of(&mem.shims, |m| m.rss_kib);
    let shim_pass = !mem.shims.is_empty() && shim_max_rss * 1024 <= SHIM_RSS_GOAL_BYTES;
    let rt_pass = mem.runtime.rss_kib * 1024 <= RUNTIME_RSS_GOAL_BYTES;
    let list_pass = |s: &Samples| s.len() > 0 && s.p50() <= LIST_P50_GOAL;
    let exit_pass = r.exits.petrel.len() > 0 && r.exits.petrel.p99() <= EXIT_P99_GOAL;
    let idle_ms = cpu_ms(r.idle.runtime, hz) + cpu_ms(r.idle.shims, hz);
    let idle_pct = percent_of_core(idle_ms, r.idle.wall);
    let idle_pass = idle_pct <= IDLE_CPU_GOAL_PERCENT;

    let mut v = Vars::new();
    run_vars(&mut v, m, args, r);

    // P1
    v.set("lifecycle_goal", LIFECYCLE_RATIO_GOAL)
        .set("up_pods", r.up.petrel.len())
        .list(
            "lifecycle",
            vec![
                lifecycle_vars(
                    "Pod up: RunPodSandbox + CreateContainer + StartContainer",
                    "Up",
                    "raw `runc create` + `runc start`",
                    &r.up,
                    up_pass,
                ),
                lifecycle_vars(
                    "Pod down: StopContainer(0) + RemoveContainer + StopPodSandbox + RemovePodSandbox",
                    "Down",
                    "raw `runc kill KILL` + wait + `runc delete`",
                    &r.down,
                    down_pass,
                ),
            ],
        )
        .flag("scaled", r.scale.create.len() > 0)
        .set("scale_added", r.scale.create.len())
        .set("scale_containers", r.scale.containers)
        .set("scale_create_p50", ms(r.scale.create.p50()))
        .set("scale_create_p99", ms(r.scale.create.p99()))
        .set("scale_start_p50", ms(r.scale.start.p50()))
        .set("scale_start_p99", ms(r.scale.start.p99()));

    // P2
    let mut memory = vec![
        memory_row("petrel-shim", &mem.shims),
        memory_row("petrel runtime", &[mem.runtime]),
        memory_row("container init (busybox sleep)", &mem.inits),
        memory_row("host sleep (reference)", &[mem.sleep]),
    ];
    if !r.scale.shims.is_empty() {
        memory.push(memory_row(
            &format!("petrel-shim at {} containers", r.scale.containers),
            &r.scale.shims,
        ));
        memory.push(memory_row(
            &format!("petrel runtime at {} containers", r.scale.containers),
            &[r.scale.runtime],
        ));
    }
    memory.push(memory_row(
        "petrel runtime after all pods were removed",
        &[r.runtime_after],
    ));
    v.set("containers", mem.containers)
        .set("shim_max_rss", kib(shim_max_rss))
        .set("shim_mean_rss", kib_f(mean_of(&mem.shims, |m| m.rss_kib)))
        .set("shim_mean_pss", kib_f(mean_of(&mem.shims, |m| m.pss_kib)))
        .set("shim_mean_uss", kib_f(mean_of(&mem.shims, |m| m.uss_kib)))
        .set("shims", mem.shims.len())
        .set("shims_parented", mem.shims_parented)
        .set("sleep_rss", kib(mem.sleep.rss_kib))
        .set("sleep_pss", kib(mem.sleep.pss_kib))
        .set("init_mean_rss", kib_f(mean_of(&mem.inits, |m| m.rss_kib)))
        .set(
            "shim_sleep_ratio",
            ratio_f(mean_of(&mem.shims, |m| m.rss_kib), mem.sleep.rss_kib as f64),
        )
        .set("shim_verdict", verdict(shim_pass))
        .set("runtime_rss", kib(mem.runtime.rss_kib))
        .set("runtime_pss", kib(mem.runtime.pss_kib))
        .set("runtime_verdict", verdict(rt_pass))
        .set(
            "shim_pss_sum",
            kib(mem.shims.iter().map(|m| m.pss_kib).sum()),
        )
        .list("memory_rows", memory);

    // P3
    let mut list_summary = Vec::new();
    if let Some(b) = r.lists.last() {
        for (name, s) in [
            ("ListContainers", &b.list_containers),
            ("ListPodSandbox", &b.list_pods),
        ] {
            let mut row = Vars::new();
            row.set("call", name)
                .set("containers", b.containers)
                .set("p50", ms(s.p50()))
                .set("p99", ms(s.p99()))
                .set("version_p50", ms(b.version.p50()))
                .set("version_p99", ms(b.version.p99()))
                .set("ratio_p50", ratio(s.p50(), b.version.p50()))
                .set("ratio_p99", ratio(s.p99(), b.version.p99()))
                .set(
                    "verdict",
                    if b.containers >= 1000 {
                        verdict(list_pass(s))
                    } else {
                        "n/a (fewer than 1000 containers)"
                    },
                );
            list_summary.push(row);
        }
    }
    v.list("list_summary", list_summary)
        .list("list_rounds", r.lists.iter().map(list_round_vars).collect())
        .list(
            "list_largest",
            r.lists.last().map(list_largest_vars).into_iter().collect(),
        );

    // P4
    let exit_paths = [
        ("kill(2) → STOPPED event received", &r.exits.petrel),
        (
            "&nbsp;&nbsp;kill(2) → shim reaped the init (exit record's time)",
            &r.exits.to_reaped,
        ),
        (
            "&nbsp;&nbsp;shim reaped → runtime published (event's created_at)",
            &r.exits.to_published,
        ),
        (
            "&nbsp;&nbsp;published → received by the subscriber",
            &r.exits.to_received,
        ),
        ("kill(2) → pidfd readable (kernel floor)", &r.exits.kernel),
        ("write + fsync, 128 bytes (disk floor)", &r.fsync),
    ]
    .into_iter()
    .map(|(path, s)| {
        let mut row = Vars::new();
        sample_vars(&mut row, s);
        row.set("path", path);
        row
    })
    .collect();
    v.set("exit_p50", ms(r.exits.petrel.p50()))
        .set("exit_p99", ms(r.exits.petrel.p99()))
        .set("exits", r.exits.petrel.len())
        .set("exits_over", r.exits.petrel.count_over(EXIT_P99_GOAL))
        .set("kernel_p50", ms(r.exits.kernel.p50()))
        .set("kernel_p99", ms(r.exits.kernel.p99()))
        .set(
            "exit_ratio_p50",
            ratio(r.exits.petrel.p50(), r.exits.kernel.p50()),
        )
        .set(
            "exit_ratio_p99",
            ratio(r.exits.petrel.p99(), r.exits.kernel.p99()),
        )
        .set("exit_verdict", verdict(exit_pass))
        .set("exit_gap_ms", crate::EXIT_GAP.as_millis())
        .list("exit_paths", exit_paths);

    // P5
    let idle_rows = [
        ("petrel runtime".to_string(), r.idle.runtime),
        (
            format!("all {} shims together", r.idle.shim_count),
            r.idle.shims,
        ),
        ("host sleep (reference)".to_string(), r.idle.sleep),
    ]
    .into_iter()
    .map(|(name, c)| {
        let cms = cpu_ms(c, hz);
        let mut row = Vars::new();
        row.set("name", name)
            .set("ticks", c.ticks)
            .set("cpu_ms", format!("{cms:.0}"))
            .set("sched_ms", format!("{:.3}", c.sched_ns as f64 / 1e6))
            .set("pct", format!("{:.3}", percent_of_core(cms, r.idle.wall)));
        row
    })
    .collect();
    v.set("idle_shims", r.idle.shim_count)
        .set("idle_goal", IDLE_CPU_GOAL_PERCENT)
        .set("idle_ms", format!("{idle_ms:.0}"))
        .set("idle_wall", format!("{:.0}", r.idle.wall.as_secs_f64()))
        .set("idle_wall_1", format!("{:.1}", r.idle.wall.as_secs_f64()))
        .set("idle_pct", format!("{idle_pct:.3}"))
        .set("idle_sleep_ms", format!("{:.0}", cpu_ms(r.idle.sleep, hz)))
        .set("idle_verdict", verdict(idle_pass))
        .set("hz", hz)
        .list("idle_rows", idle_rows);

    let (rows, sections) = other_parts(r)?;
    v.set("section_rows", rows)
        .set("sections", sections)
        .set("shims_left", r.shims_left);
    render_template(REPORT, &v)
}

fn ratio_f(a: f64, b: f64) -> String {
    if b == 0.0 {
        return "n/a".to_string();
    }
    format!("{:.2}×", a / b)
}

fn signed_ms(a: Duration, b: Duration) -> String {
    let d = a.as_secs_f64() - b.as_secs_f64();
    format!("{:+.3}", d * 1e3)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::report_sample;

    /// Compares `text` with the stored rendering `name` under testdata/;
    /// `PETREL_BENCH_BLESS=1` rewrites it instead.
    fn golden(name: &str, text: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name);
        if std::env::var_os("PETREL_BENCH_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            return;
        }
        let want = std::fs::read_to_string(&path).unwrap();
        if want != text {
            let at = want
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(want.lines().count().min(text.lines().count()));
            panic!(
                "{name} differs at line {}:\nwant: {:?}\ngot:  {:?}",
                at + 1,
                want.lines().nth(at),
                text.lines().nth(at)
            );
        }
    }

    #[test]
    fn render_should_match_the_stored_sample_report() {
        let text = render(
            &report_sample::machine(),
            &report_sample::args(),
            &report_sample::results(),
        )
        .unwrap();
        golden("sample-report.md", &text);
    }

    #[test]
    fn render_should_keep_the_sections_tables_and_key_lines() {
        let text = render(
            &report_sample::machine(),
            &report_sample::args(),
            &report_sample::results(),
        )
        .unwrap();
        let headings: Vec<&str> = text.lines().filter(|l| l.starts_with("## ")).collect();
        for h in [
            "## Summary",
            "## The run",
            "## P1 Lifecycle latency: within 1.2× of plain runc",
            "## P2 Memory: a shim costs ≤ 1 MB, the runtime ≤ 30 MB",
            "## P3 List latency: ≤ 1 ms at 1000 containers",
            "## P4 Exit notification: STOPPED within 5 ms",
            "## P5 Idle CPU: nothing",
            "## P10-P13 The agent (`petrel agent`)",
            "## Clean-up check",
            "## How to reproduce",
            "## Noise",
        ] {
            assert!(headings.contains(&h), "no heading {h:?}");
        }
        for line in [
            "| date | 2026-01-02 03:04:05 UTC |",
            "| P1 | Pod up: RunPodSandbox + CreateContainer + StartContainer | ≤ 1.2× raw runc at p50 and p99 | p50 57.000 ms, p99 59.500 ms | raw `runc create` + `runc start`: p50 51.600 ms, p99 53.600 ms | p50 1.10×, p99 1.11× | **PASS** |",
            "| &nbsp;&nbsp;CreateContainer | 1.500 | 2.000 | 2.000 | 1.550 |  |",
            "| petrel-shim at 1000 containers | 1000 | 950 KiB (0.97 MB) | 950 KiB (0.97 MB) | 475 KiB (0.49 MB) | 475 KiB (0.49 MB) | 316 KiB (0.32 MB) | 237 KiB (0.24 MB) |",
            "| 1000 | ListContainers | 2.048 | 2.098 | 2.098 | 16.52 | 14.08 | 2.049 | 0.050 |",
            "| P11 | Agent: container exit → terminated at /pods, events mode (petrel runtime) | p99 ≤ 20 ms | p50 5.700 ms, p99 8.700 ms (20 exits) | the runtime's STOPPED event at the bench's subscriber for the same exits: p50 1.200 ms, p99 1.700 ms | p50 4.75×, p99 5.12× | **PASS** |",
            "| P11 | Agent: container exit → exit shown at /pods, events mode, restartPolicy Always (petrel runtime) | p99 ≤ 20 ms | p50 6.700 ms, p99 9.700 ms (20 exits) | the runtime's STOPPED event at the bench's subscriber for the same exits: p50 1.450 ms, p99 1.950 ms | p50 4.62×, p99 4.97× | **PASS** |",
            "| events, restartPolicy Always (exit shown) | 20 | 6.700 | 9.700 | 9.700 | the runtime's STOPPED event at the bench's subscriber | 1.450 | 1.950 | 1.950 | none |",
            "| relist | 20 | 502.700 | 505.700 | 505.700 | the runtime's STOPPED event at the bench's subscriber | 125.450 | 125.950 | 125.950 | [1, 143] |",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?}");
        }
        assert_tables_square(&text);
    }

    /// Every table keeps as many cells in each row as in its head.
    fn assert_tables_square(text: &str) {
        let mut cells = None;
        for l in text.lines() {
            if l.starts_with('|') {
                let n = l.matches('|').count() - l.matches("\\|").count();
                let head = *cells.get_or_insert(n);
                assert_eq!(n, head, "row of {n} bars under a head of {head}: {l}");
            } else {
                cells = None;
            }
        }
    }

    #[test]
    fn render_critest_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        let full = render_critest_only(&m, &report_sample::critest()).unwrap();
        assert_tables_square(&full);
        golden("sample-critest.md", &full);
        let none = crate::critest_bench::CritestBenchResults {
            containerd: Err("no containerd in build/peers/bin | `make peers`\nmore".into()),
            ..report_sample::critest()
        };
        let text = render_critest_only(&m, &none).unwrap();
        assert_tables_square(&text);
        golden("sample-critest-none.md", &text);
    }

    #[test]
    fn render_controller_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        let full = render_controller_only(&m, &report_sample::controller()).unwrap();
        assert_tables_square(&full);
        golden("sample-controller.md", &full);
        let mut partial = report_sample::controller();
        partial.runs[2].error = Some("storm: leading: not within 120s".into());
        partial.handoffs[1].error = Some("the first replica leads: not within 120s".into());
        let text = render_controller_only(&m, &partial).unwrap();
        assert_tables_square(&text);
        golden("sample-controller-partial.md", &text);
        let none = crate::controller_bench::ControllerResults {
            error: Some("no podset-controller in build/peers/bin | `make peers`".into()),
            ..Default::default()
        };
        let text = render_controller_only(&m, &none).unwrap();
        assert_tables_square(&text);
        golden("sample-controller-none.md", &text);
    }

    #[test]
    fn render_vm_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        let full = render_vm_only(&m, &report_sample::vm()).unwrap();
        assert_tables_square(&full);
        golden("sample-vm.md", &full);
        // The v1 guest stopped before its figures: nothing is judged.
        let mut partial = report_sample::vm();
        partial.runs[1] = crate::vm_bench::GuestRun {
            cgroup: "v1".into(),
            error: Some("boot the v1 guest: no answer from the agent | boot timeout".into()),
            ..Default::default()
        };
        let text = render_vm_only(&m, &partial).unwrap();
        assert_tables_square(&text);
        golden("sample-vm-partial.md", &text);
        let none = crate::vm_bench::VmResults {
            error: Some("test VM kernel missing: run `make vm`\nmore".into()),
            pods: 24,
            rounds: 10,
            ..Default::default()
        };
        let text = render_vm_only(&m, &none).unwrap();
        assert_tables_square(&text);
        golden("sample-vm-none.md", &text);
    }

    #[test]
    fn render_cluster_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        let full = render_cluster_only(&m, &report_sample::cluster()).unwrap();
        assert_tables_square(&full);
        golden("sample-cluster.md", &full);
        let partial = render_cluster_only(&m, &report_sample::cluster_partial()).unwrap();
        assert_tables_square(&partial);
        golden("sample-cluster-partial.md", &partial);
        let none = crate::cluster_bench::ClusterResults {
            error: Some("no etcd in build/peers/bin | `make peers`\nmore".into()),
            starts: 30,
            burst: 100,
            idle_seconds: 60,
            ..Default::default()
        };
        let text = render_cluster_only(&m, &none).unwrap();
        assert_tables_square(&text);
        golden("sample-cluster-none.md", &text);
    }

    #[test]
    fn render_nri_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        golden(
            "sample-nri.md",
            &render_nri_only(&m, &report_sample::nri()).unwrap(),
        );
        // Nothing measured, no floor: the other branches.
        let mut n = crate::nri::NriResults::default();
        n.wait_p50 = [
            Some(Duration::from_micros(40)),
            Some(Duration::from_micros(90)),
        ];
        n.hook_p50 = n.wait_p50;
        n.create[0] = report_sample::ramp(3, 20.0, 0.1);
        golden("sample-nri-partial.md", &render_nri_only(&m, &n).unwrap());
        let none = crate::nri::NriResults::default();
        golden("sample-nri-none.md", &render_nri_only(&m, &none).unwrap());
    }

    #[test]
    fn render_eviction_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        let e = report_sample::eviction();
        golden("sample-eviction.md", &render_eviction_only(&m, &e).unwrap());
        let none = crate::eviction::EvictionResults {
            error: Some("no `v1` memory controller\nmore".into()),
            notified: report_sample::ramp(3, 40.0, 1.0),
            ..Default::default()
        };
        golden(
            "sample-eviction-partial.md",
            &render_eviction_only(&m, &none).unwrap(),
        );
    }

    #[test]
    fn render_net_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        golden(
            "sample-net.md",
            &render_net_only(&m, &report_sample::net()).unwrap(),
        );
        let partial = crate::net::NetResults {
            containerd_missing: Some("no containerd 1.7 | here".into()),
            run_petrel: report_sample::ramp(3, 20.0, 1.0),
            forward_bytes: 1 << 20,
            forward_petrel: report_sample::ramp(3, 2.0, 1.0),
            ..Default::default()
        };
        golden(
            "sample-net-partial.md",
            &render_net_only(&m, &partial).unwrap(),
        );
    }

    #[test]
    fn render_pull_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        golden(
            "sample-pull.md",
            &render_pull_only(&m, &report_sample::pull()).unwrap(),
        );
        let none = crate::pull::PullResults::default();
        golden("sample-pull-none.md", &render_pull_only(&m, &none).unwrap());
    }

    #[test]
    fn render_queue_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        golden(
            "sample-queue.md",
            &render_queue_only(&m, &report_sample::queue()).unwrap(),
        );
        let none = crate::queue::QueueResults::default();
        golden(
            "sample-queue-none.md",
            &render_queue_only(&m, &none).unwrap(),
        );
    }

    #[test]
    fn render_kubelet_only_should_match_the_stored_samples() {
        let m = report_sample::machine();
        let full = render_kubelet_only(&m, &report_sample::kubelet()).unwrap();
        // The tables with a column per setup among them.
        assert_tables_square(&full);
        golden("sample-kubelet.md", &full);
        let partial = render_kubelet_only(&m, &report_sample::kubelet_partial()).unwrap();
        assert_tables_square(&partial);
        golden("sample-kubelet-partial.md", &partial);
        // Stopped before any setup.
        let none = crate::kubelet::KubeletResults {
            error: Some("no kubelet in build/peers/bin (`make peers`)\nmore".into()),
            ..Default::default()
        };
        golden(
            "sample-kubelet-none.md",
            &render_kubelet_only(&m, &none).unwrap(),
        );
    }

    #[test]
    fn render_agent_only_should_match_the_stored_sample() {
        let text = render_agent_only(&report_sample::machine(), &report_sample::agent()).unwrap();
        golden("sample-agent.md", &text);
    }
}
