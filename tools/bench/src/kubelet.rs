//! P23-P27: the real kubelet (`make peers`) against Petrel, through the
//! test kit (crates/testkit): seed 000's table reproduced with kubelet
//! itself, and Petrel's whole node set beside kubelet + containerd.
//!
//! Four setups, one after the other, each with its own CNI network,
//! runtime, directories and cgroups (all inside the bench's work
//! directory and `/petrel-bench-<id>`), on the same pods: busybox
//! `sleep` containers, one per pod, from static pod manifests:
//!
//! - `petrel node` (agent and runtime in one process, events PLEG);
//! - kubelet on `petrel runtime`;
//! - kubelet on containerd 2.x (`make peers`);
//! - kubelet on containerd 1.7 (`make containerd`), where kubelet
//!   accepts it (its refusal is recorded otherwise).
//!
//! kubelet runs standalone (no API server), alternately with its generic
//! PLEG and with `EventedPLEG=true`, restarted in the other mode between
//! windows (its pods are adopted, checked by container id). The image
//! comes from the conformance kit's read-only registry through the
//! runtimes' mirror configuration, so both runtimes pull the same bytes.
//!
//! This module holds the results and the sequence (and the CPU windows
//! and memory); `kubelet_stack` starts the stacks, `kubelet_pods` writes
//! manifests and times exits and starts at `/pods`, `kubelet_critest`
//! brings critest's counts, `kubelet_report` renders it all.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use petrel_testkit::images::ConformanceImages;
use petrel_testkit::registry::{write_mirror_config, LocalRegistry};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::cpugroup::CpuGroup;
use crate::http;
use crate::kubelet_pods::{exits, quiet, running_ids, start_one, wait_all_running, write_manifest};
use crate::kubelet_stack::{children_named, kubelet_warnings, start_stack, Runtime, Stack};
use crate::node::Clients;
use crate::procfs::{self, Cpu, Mem};
use crate::stats::Samples;
use crate::sweep::Work;
use crate::Args;

/// The image of every pod: the conformance kit's busybox substitute.
pub const IMAGE: &str = "registry.k8s.io/e2e-test-images/busybox:1.29-2";
/// The one container of every pod.
pub const CONTAINER: &str = "sleep";
/// The namespace of every pod.
pub const NAMESPACE: &str = "bench";
/// Quiet time after pods are up or kubelet restarted, before a window.
pub const SETTLE: Duration = Duration::from_secs(10);
/// Quiet time before each measured exit or start...
pub const GAP: Duration = Duration::from_millis(200);
/// ...plus a uniformly random part of this (one generic relist period),
/// so that samples do not fall at one phase of a relist loop.
pub const JITTER: Duration = Duration::from_secs(1);
/// Pause between two GETs of `/pods` while waiting for a change.
pub const POLL_GAP: Duration = Duration::from_millis(10);

/// A node stack under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Setup {
    /// `petrel node`: agent and runtime in one process.
    PetrelNode,
    /// kubelet on `petrel runtime`.
    KubeletPetrel,
    /// kubelet on containerd 2.x from `make peers`.
    KubeletContainerd,
    /// kubelet on containerd 1.7 from `make containerd`.
    #[value(name = "kubelet-containerd-1.7")]
    KubeletContainerd17,
}

impl Setup {
    /// Whether kubelet is the agent.
    pub fn is_kubelet(self) -> bool {
        !matches!(self, Setup::PetrelNode)
    }

    /// A short tag for names of pods, nodes and cgroups.
    pub fn tag(self) -> &'static str {
        match self {
            Setup::PetrelNode => "node",
            Setup::KubeletPetrel => "kp",
            Setup::KubeletContainerd => "kc2",
            Setup::KubeletContainerd17 => "kc17",
        }
    }
}

/// How the agent learns about container changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pleg {
    /// kubelet's generic PLEG: a relist every second.
    Generic,
    /// kubelet with `EventedPLEG=true`, or Petrel's agent with
    /// `--pleg events`: the runtime's GetContainerEvents stream.
    Evented,
}

impl Pleg {
    /// The other mode.
    pub fn other(self) -> Pleg {
        match self {
            Pleg::Generic => Pleg::Evented,
            Pleg::Evented => Pleg::Generic,
        }
    }

    /// As written in the report.
    pub fn name(self) -> &'static str {
        match self {
            Pleg::Generic => "generic",
            Pleg::Evented => "evented",
        }
    }
}

/// CPU of the node's processes over one idle window.
#[derive(Debug, Default, Clone)]
pub struct Window {
    /// The window.
    pub wall: Duration,
    /// kubelet (None for `petrel node`, whose agent is the runtime process).
    pub kubelet: Option<Cpu>,
    /// The runtime process (`petrel runtime`, `petrel node`, containerd).
    pub runtime: Cpu,
    /// Every shim of the runtime.
    pub shims: Cpu,
    /// How many shims.
    pub shim_count: usize,
    /// All of them (and whatever they forked) by their cgroup's CPU
    /// accounting, when the group could be made.
    pub accounted: Option<Duration>,
    /// kubelet's evented PLEG stream after the window (its metrics
    /// `kubelet_evented_pleg_connection_success_count` and
    /// `..._error_count`): connections made and failed since its start.
    pub evented_stream: Option<(f64, f64)>,
}

impl Window {
    /// The figure judged: the cgroup's accounting, else the processes'
    /// on-CPU time (schedstat) summed.
    pub fn total(&self) -> Duration {
        self.accounted
            .unwrap_or_else(|| Duration::from_nanos(self.schedstat_total()))
    }

    /// kubelet + runtime + shims by schedstat, in ns.
    pub fn schedstat_total(&self) -> u64 {
        self.kubelet.map(|c| c.sched_ns).unwrap_or(0) + self.runtime.sched_ns + self.shims.sched_ns
    }

    /// The total as a percentage of one core.
    pub fn percent(&self) -> f64 {
        percent(self.total(), self.wall)
    }
}

/// `cpu` over `wall`, as a percentage of one core.
pub fn percent(cpu: Duration, wall: Duration) -> f64 {
    if wall.is_zero() {
        return 0.0;
    }
    cpu.as_secs_f64() / wall.as_secs_f64() * 100.0
}

/// Writing manifests for a size and waiting until every pod runs.
#[derive(Debug, Clone)]
pub struct Ramp {
    /// Pods before.
    pub from: usize,
    /// Pods after.
    pub to: usize,
    /// The PLEG mode meanwhile.
    pub pleg: Pleg,
    /// First manifest renamed into place → every pod running at `/pods`.
    pub took: Duration,
}

/// Memory of the node's processes at one size.
#[derive(Debug, Default, Clone)]
pub struct MemoryPoint {
    /// Running containers.
    pub containers: usize,
    /// kubelet (None for `petrel node`).
    pub kubelet: Option<Mem>,
    /// The runtime process.
    pub runtime: Mem,
    /// Every shim.
    pub shims: Vec<Mem>,
    /// containerd's pause containers (one per pod; containers, not node
    /// processes: shown apart, not in the sum).
    pub pause: Vec<Mem>,
}

impl MemoryPoint {
    /// kubelet + runtime + shims: RSS and PSS, KiB.
    pub fn sum(&self) -> (u64, u64) {
        let mut rss = self.runtime.rss_kib;
        let mut pss = self.runtime.pss_kib;
        for m in self.kubelet.iter().chain(self.shims.iter()) {
            rss += m.rss_kib;
            pss += m.pss_kib;
        }
        (rss, pss)
    }
}

/// One series of exits or starts.
#[derive(Debug, Default, Clone)]
pub struct Series {
    /// The mode.
    pub pleg: Option<Pleg>,
    /// Containers running meanwhile (the starts add to them).
    pub containers: usize,
    /// kill(2) → terminated at `/pods`, or manifest → running.
    pub samples: Samples,
    /// Round trips of the `/pods` GETs made meanwhile (the resolution of
    /// the figure).
    pub polls: Samples,
}

/// A restart of kubelet: were the pods adopted?
#[derive(Debug, Default, Clone)]
pub struct Adoption {
    /// Pods (running containers) before.
    pub before: usize,
    /// Of those, running with the same container id after.
    pub kept: usize,
    /// Running after with another id.
    pub new: usize,
    /// SIGTERM → every pod running at `/pods` again.
    pub took: Duration,
}

/// Everything measured on one setup.
#[derive(Debug, Clone)]
pub struct SetupRun {
    /// Which.
    pub setup: Setup,
    /// The runtime's version as it says (`v2.4.2`, `1.7.24~ds1`), or
    /// Petrel's.
    pub runtime_version: String,
    /// Idle windows: size, mode, figures.
    pub windows: Vec<(usize, Pleg, Window)>,
    /// Each size's ramp.
    pub ramps: Vec<Ramp>,
    /// At the largest size reached.
    pub memory: Option<MemoryPoint>,
    /// Exit → terminated, per mode.
    pub exits: Vec<Series>,
    /// Manifest → running, per mode.
    pub starts: Vec<Series>,
    /// kubelet's restarts.
    pub adoptions: Vec<Adoption>,
    /// Steps not taken, each with why (one line each).
    pub skipped: Vec<String>,
    /// kubelet's warnings about what it runs on (deprecated, unsupported).
    pub warnings: Vec<String>,
    /// What stopped this setup, if anything.
    pub error: Option<String>,
}

impl SetupRun {
    fn new(setup: Setup) -> SetupRun {
        SetupRun {
            setup,
            runtime_version: String::new(),
            windows: vec![],
            ramps: vec![],
            memory: None,
            exits: vec![],
            starts: vec![],
            adoptions: vec![],
            skipped: vec![],
            warnings: vec![],
            error: None,
        }
    }

    /// The window at `size` in `pleg`, if measured.
    pub fn window(&self, size: usize, pleg: Pleg) -> Option<&Window> {
        self.windows
            .iter()
            .find(|(s, p, _)| *s == size && *p == pleg)
            .map(|(_, _, w)| w)
    }

    /// The exit series in `pleg`.
    pub fn exits_in(&self, pleg: Pleg) -> Option<&Series> {
        self.exits
            .iter()
            .find(|s| s.pleg == Some(pleg) && s.samples.len() > 0)
    }

    /// The start series in `pleg`.
    pub fn starts_in(&self, pleg: Pleg) -> Option<&Series> {
        self.starts
            .iter()
            .find(|s| s.pleg == Some(pleg) && s.samples.len() > 0)
    }
}

/// critest counts for the report.
#[derive(Debug, Clone, Default)]
pub struct Critest {
    /// Where the counts come from (a file and its date, or this run).
    pub source: String,
    /// The count table (Markdown), if there is one.
    pub table: Option<String>,
    /// Why there is none.
    pub missing: Option<String>,
}

/// The whole kubelet section.
#[derive(Debug, Clone, Default)]
pub struct KubeletResults {
    /// One per setup, in the order run.
    pub runs: Vec<SetupRun>,
    /// `kubelet --version`.
    pub kubelet_version: String,
    /// critest side by side.
    pub critest: Critest,
    /// The sizes asked for.
    pub sizes: Vec<usize>,
    /// Idle window length.
    pub idle_seconds: u64,
    /// Exits timed per mode.
    pub exits: usize,
    /// Starts timed per mode.
    pub starts: usize,
    /// The ramp timeout.
    pub ramp_timeout: Duration,
    /// What stopped the whole section before any setup, if anything.
    pub error: Option<String>,
}

impl KubeletResults {
    /// The run of `setup`, if it was run.
    pub fn run(&self, setup: Setup) -> Option<&SetupRun> {
        self.runs.iter().find(|r| r.setup == setup)
    }
}

/// What the kubelet figures need, checked before anything runs, so that a
/// missing peer fails the bench at once with one line naming it.
/// containerd 1.7 is optional (`make containerd`): without it that setup
/// is reported as not measured.
pub fn preflight(args: &Args) -> Result<()> {
    preflight_setups(args, &args.kubelet_setups)
}

/// [`preflight`] for the stacks `setups` (the cluster figures' too).
pub fn preflight_setups(args: &Args, setups: &[Setup]) -> Result<()> {
    let needs_containerd = setups.contains(&Setup::KubeletContainerd)
        && !petrel_testkit::peers::left_out("containerd");
    let needs_kubelet =
        setups.iter().any(|s| s.is_kubelet()) && petrel_testkit::kubelet::left_out().is_none();
    if needs_kubelet {
        petrel_testkit::peers::peer_binary("kubelet")?;
    }
    if needs_containerd {
        petrel_testkit::containerd::binaries()?;
    }
    ConformanceImages::locate()?;
    let registry = Path::new(petrel_testkit::registry::REGISTRY_BIN);
    if !registry.is_file() {
        bail!(
            "docker-registry not found at {} (apt-get install docker-registry: `make deps`)",
            registry.display()
        );
    }
    runc_path(&args.runc)?;
    Ok(())
}

/// The OCI runtime as an absolute path (containerd's config names it).
fn runc_path(runc: &Path) -> Result<PathBuf> {
    if runc.components().count() > 1 {
        return std::path::absolute(runc).with_context(|| format!("resolve {}", runc.display()));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(runc))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!(
                "{} not found in PATH (apt-get install runc)",
                runc.display()
            )
        })
}

/// What every setup shares: the registry and its mirror configuration.
pub struct Shared {
    /// Serves the images until the last setup is done.
    _registry: LocalRegistry,
    /// hosts.toml files sending the upstream registries to it.
    pub mirrors: tempfile::TempDir,
    /// The OCI runtime, absolute.
    pub runc: PathBuf,
}

/// Measures every setup in `args.kubelet_setups`; a setup that fails is
/// recorded with its error and the next one runs.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> KubeletResults {
    let mut r = KubeletResults {
        sizes: args.kubelet_sizes.clone(),
        idle_seconds: args.kubelet_idle_seconds,
        exits: args.kubelet_exits,
        starts: args.kubelet_starts,
        ramp_timeout: Duration::from_secs(args.kubelet_ramp_timeout),
        kubelet_version: kubelet_version(),
        ..Default::default()
    };
    let shared = match share(args) {
        Ok(s) => s,
        Err(e) => {
            r.error = Some(format!("{e:#}"));
            return r;
        }
    };
    for (i, setup) in args.kubelet_setups.iter().enumerate() {
        progress(&format!("kubelet figures: {}", setup_name(*setup, "")));
        let mut run = SetupRun::new(*setup);
        if let Err(e) = drive(args, work, &shared, i, &mut run, progress).await {
            progress(&format!("{}: {e:#}", setup_name(*setup, "")));
            run.error = Some(format!("{e:#}"));
        }
        r.runs.push(run);
    }
    drop(shared);
    r.critest = crate::kubelet_critest::critest(args, progress);
    r
}

/// Serves the conformance kit's images read-only and writes the mirror
/// configuration that sends the runtimes to it.
pub fn share(args: &Args) -> Result<Shared> {
    let images = ConformanceImages::locate()?;
    let registry = LocalRegistry::serve_read_only(&images.registry_storage())?;
    let mirrors = petrel_testkit::process::kit_tempdir("petrel-kit-mirrors.")?;
    write_mirror_config(mirrors.path(), &registry.host())?;
    Ok(Shared {
        _registry: registry,
        mirrors,
        runc: runc_path(&args.runc)?,
    })
}

/// `kubelet --version`'s answer, or empty.
pub fn kubelet_version() -> String {
    petrel_testkit::peers::peer_binary("kubelet")
        .ok()
        .and_then(|b| std::process::Command::new(b).arg("--version").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The setup's name in the report.
pub fn setup_name(setup: Setup, version: &str) -> String {
    let v = if version.is_empty() {
        String::new()
    } else {
        format!(" {version}")
    };
    match setup {
        Setup::PetrelNode => "`petrel node`".to_string(),
        Setup::KubeletPetrel => "kubelet + `petrel runtime`".to_string(),
        Setup::KubeletContainerd => format!("kubelet + containerd{}", v_or(&v, " 2.x")),
        Setup::KubeletContainerd17 => format!("kubelet + containerd{}", v_or(&v, " 1.7")),
    }
}

fn v_or(v: &str, default: &str) -> String {
    if v.is_empty() {
        default.to_string()
    } else {
        v.to_string()
    }
}

/// Why `setup` is left out, if `PETREL_PEERS_SKIP` names what it needs.
pub fn left_out(setup: Setup) -> Option<String> {
    if setup.is_kubelet() {
        if let Some(why) = petrel_testkit::kubelet::left_out() {
            return Some(why);
        }
    }
    (setup == Setup::KubeletContainerd && petrel_testkit::peers::left_out("containerd"))
        .then(|| "containerd left out (PETREL_PEERS_SKIP)".to_string())
}

/// The setup's whole sequence; what it measured stays in `run` when it
/// fails part-way.
async fn drive(
    args: &Args,
    work: &Work,
    shared: &Shared,
    index: usize,
    run: &mut SetupRun,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let setup = run.setup;
    if let Some(why) = left_out(setup) {
        run.skipped.push(format!("the whole setup: {why}"));
        return Ok(());
    }
    let (mut stack, version) =
        tokio::task::block_in_place(|| start_stack(args, work, shared, index, setup))?;
    run.runtime_version = version;
    if let Some(k) = &stack.kubelet {
        run.warnings = kubelet_warnings(&k.log());
    }
    let name = setup_name(setup, &run.runtime_version);
    let ep = stack.pods_endpoint()?;
    let mut rng = StdRng::seed_from_u64(0x6b75_6265 + index as u64);
    let ramp_timeout = Duration::from_secs(args.kubelet_ramp_timeout);
    let mut sizes = args.kubelet_sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let mut names: Vec<String> = vec![];
    let cpu_group = |n: usize| format!("{}/{}-{index}-cpu-{n}", work.cgroup_parent, setup.tag());
    let mut windows = 0;
    for &size in &sizes {
        let from = names.len();
        let new: Vec<String> = (from..size).map(|j| format!("p{j:03}")).collect();
        progress(&format!("{name}: {size} pods ({} PLEG)", stack.pleg.name()));
        let t0 = Instant::now();
        for n in &new {
            write_manifest(&stack.manifest_dir(), n)?;
        }
        names.extend(new);
        let running = wait_all_running(&stack, &ep, &names, ramp_timeout).await?;
        if running < names.len() {
            run.skipped.push(format!(
                "{size} containers: {running} of {size} running {} s after their manifests were written; \
                 this setup's larger sizes and its memory, exit and start figures are skipped",
                ramp_timeout.as_secs()
            ));
            return Ok(());
        }
        run.ramps.push(Ramp {
            from,
            to: size,
            pleg: stack.pleg,
            took: t0.elapsed(),
        });
        tokio::time::sleep(SETTLE).await;
        progress(&format!(
            "{name}: {} s idle window at {size} containers, {} PLEG",
            args.kubelet_idle_seconds,
            stack.pleg.name()
        ));
        let w = window(&stack, args.kubelet_idle_seconds, &cpu_group(windows)).await?;
        windows += 1;
        run.windows.push((size, stack.pleg, w));
        if setup.is_kubelet() {
            let to = stack.pleg.other();
            run.adoptions
                .push(restart(&mut stack, &ep, &names, to, ramp_timeout).await?);
            tokio::time::sleep(SETTLE).await;
            progress(&format!(
                "{name}: {} s idle window at {size} containers, {} PLEG",
                args.kubelet_idle_seconds,
                stack.pleg.name()
            ));
            let w = window(&stack, args.kubelet_idle_seconds, &cpu_group(windows)).await?;
            windows += 1;
            run.windows.push((size, stack.pleg, w));
        }
    }
    let size = names.len();
    progress(&format!("{name}: memory at {size} containers"));
    run.memory = Some(memory(&stack, size)?);

    let mut cri = Clients::connect(&stack.cri_endpoint()).await?;
    // Exits first in the mode the windows ended in, then in the other:
    // each pod is killed once (a second kill of a container would meet
    // kubelet's crash-loop back-off), so the modes take turns on
    // disjoint halves of the pods where there are enough.
    let first = stack.pleg;
    let half = (size / 2).max(1);
    let (a, b) = names.split_at(half.min(names.len()));
    let victims_b = if b.is_empty() { a } else { b };
    progress(&format!(
        "{name}: {} exits, {} PLEG",
        args.kubelet_exits,
        first.name()
    ));
    run.exits.push(Series {
        pleg: Some(first),
        containers: size,
        ..Default::default()
    });
    exits(
        &stack,
        &ep,
        &mut cri,
        a,
        args.kubelet_exits,
        &mut rng,
        last(&mut run.exits),
    )
    .await?;
    if setup.is_kubelet() {
        run.adoptions
            .push(restart(&mut stack, &ep, &names, first.other(), ramp_timeout).await?);
        tokio::time::sleep(SETTLE).await;
        progress(&format!(
            "{name}: {} exits, {} PLEG",
            args.kubelet_exits,
            stack.pleg.name()
        ));
        run.exits.push(Series {
            pleg: Some(stack.pleg),
            containers: size,
            ..Default::default()
        });
        exits(
            &stack,
            &ep,
            &mut cri,
            victims_b,
            args.kubelet_exits,
            &mut rng,
            last(&mut run.exits),
        )
        .await?;
    }
    // Starts add pods: last, in the current mode, then (kubelet) in the
    // mode the exits began with.
    let mut modes = vec![stack.pleg];
    if setup.is_kubelet() {
        modes.push(stack.pleg.other());
    }
    for (k, pleg) in modes.into_iter().enumerate() {
        if stack.pleg != pleg {
            run.adoptions
                .push(restart(&mut stack, &ep, &names, pleg, ramp_timeout).await?);
            tokio::time::sleep(SETTLE).await;
        }
        progress(&format!(
            "{name}: {} starts, {} PLEG",
            args.kubelet_starts,
            pleg.name()
        ));
        run.starts.push(Series {
            pleg: Some(pleg),
            containers: names.len(),
            ..Default::default()
        });
        let series = last(&mut run.starts);
        for i in 0..args.kubelet_starts {
            let n = format!("s{k}-{i:03}");
            tokio::time::sleep(quiet(&mut rng)).await;
            start_one(&stack, &ep, &n, series).await?;
            names.push(n);
        }
    }
    progress(&format!("{name}: removing {} pods", names.len()));
    tokio::task::block_in_place(move || drop(stack));
    Ok(())
}

fn last(v: &mut [Series]) -> &mut Series {
    let n = v.len();
    &mut v[n - 1]
}

/// Restarts kubelet in `to`; waits until every pod runs again at `/pods`
/// and checks the containers were adopted.
async fn restart(
    stack: &mut Stack,
    ep: &http::Endpoint,
    names: &[String],
    to: Pleg,
    timeout: Duration,
) -> Result<Adoption> {
    let before = running_ids(stack, ep, names).await?;
    let t0 = Instant::now();
    let Some(k) = stack.kubelet.as_mut() else {
        bail!("no kubelet to restart");
    };
    tokio::task::block_in_place(|| k.restart(to == Pleg::Evented))?;
    stack.pleg = to;
    let running = wait_all_running(stack, ep, names, timeout).await?;
    if running < names.len() {
        bail!(
            "after kubelet's restart in {} mode, {running} of {} pods running within {} s:\n{}",
            to.name(),
            names.len(),
            timeout.as_secs(),
            stack.log_tail()
        );
    }
    let took = t0.elapsed();
    let after = running_ids(stack, ep, names).await?;
    let kept = before
        .iter()
        .filter(|(n, id)| after.get(*n) == Some(id))
        .count();
    Ok(Adoption {
        before: before.len(),
        kept,
        new: after.len() - kept,
        took,
    })
}

/// CPU of the stack's processes over a `secs` window, by a cpuacct group
/// `group` they are moved into for the window (and by schedstat each).
pub async fn window(stack: &Stack, secs: u64, group: &str) -> Result<Window> {
    let procs = stack.procs()?;
    let made = CpuGroup::create(group).and_then(|mut g| {
        g.enter(&procs.all())?;
        Ok(g)
    });
    let g = match made {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("petrel-bench: no cgroup CPU accounting for the window: {e:#}");
            None
        }
    };
    let g0 = g.as_ref().and_then(|g| g.usage().ok());
    let k0 = procs.kubelet.map(procfs::cpu).transpose()?;
    let r0 = procfs::cpu(procs.runtime)?;
    let s0 = sum_cpu(&procs.shims);
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let wall = t.elapsed();
    let k1 = procs.kubelet.map(procfs::cpu).transpose()?;
    let r1 = procfs::cpu(procs.runtime)?;
    let s1 = sum_cpu(&procs.shims);
    let g1 = g.as_ref().and_then(|g| g.usage().ok());
    if let Some(g) = g {
        // What cannot be undone goes with the run's cgroup tree at the end.
        if let Err(e) = g.leave() {
            eprintln!("petrel-bench: after the window: {e:#}");
        }
    }
    let after = stack.procs()?;
    if after != procs {
        bail!(
            "processes came or went during the idle window: {procs:?} -> {after:?}:\n{}",
            stack.log_tail()
        );
    }
    let evented_stream = stack.kubelet.as_ref().and_then(|k| {
        let m = k.metrics().ok()?;
        let metric = |n: &str| petrel_testkit::kubelet::metric_value(&m, n).unwrap_or(0.0);
        Some((
            metric("kubelet_evented_pleg_connection_success_count"),
            metric("kubelet_evented_pleg_connection_error_count"),
        ))
    });
    Ok(Window {
        evented_stream,
        wall,
        kubelet: k0.zip(k1).map(|(a, b)| b.since(a)),
        runtime: r1.since(r0),
        shims: s1.since(s0),
        shim_count: procs.shims.len(),
        accounted: g0.zip(g1).map(|(a, b)| b.saturating_sub(a)),
    })
}

fn sum_cpu(pids: &[u32]) -> Cpu {
    pids.iter()
        .filter_map(|p| procfs::cpu(*p).ok())
        .fold(Cpu::default(), Cpu::plus)
}

/// Memory of the stack's processes (and containerd's pause containers
/// apart) with `containers` running.
pub fn memory(stack: &Stack, containers: usize) -> Result<MemoryPoint> {
    let procs = stack.procs()?;
    let mut shims = vec![];
    for p in &procs.shims {
        shims.push(procfs::mem(*p)?);
    }
    let mut pause = vec![];
    if matches!(stack.runtime, Runtime::Containerd(_)) {
        for p in children_named(&procs.shims, "pause") {
            pause.push(procfs::mem(p)?);
        }
    }
    Ok(MemoryPoint {
        containers,
        kubelet: procs.kubelet.map(procfs::mem).transpose()?,
        runtime: procfs::mem(procs.runtime)?,
        shims,
        pause,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    #[test]
    fn window_total_should_prefer_the_cgroup_accounting() {
        let mut w = Window {
            wall: Duration::from_secs(10),
            runtime: Cpu {
                ticks: 0,
                sched_ns: 50_000_000,
            },
            ..Default::default()
        };
        assert_eq!(w.total(), Duration::from_millis(50));
        w.accounted = Some(Duration::from_millis(100));
        assert_eq!(w.total(), Duration::from_millis(100));
        assert!((w.percent() - 1.0).abs() < 1e-9);
    }
}
