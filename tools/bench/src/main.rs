//! `petrel-bench`: measures a Petrel runtime and writes docs/PERFORMANCE.md.
//!
//! Every figure is taken next to a reference measured in the same run on
//! the same machine (plain runc, a `sleep` process, the Version RPC, the
//! kernel's own exit notification), because a 2-core VM is noisy and the
//! ratio is what carries over between machines. Everything the bench
//! creates is removed on every path (guards with `Drop`).

mod agent;
mod agent_proc;
mod agent_report;
mod cluster_bench;
mod cluster_bench_report;
mod cluster_objects_bench;
mod containerd;
mod controller_bench;
mod controller_bench_report;
mod cpugroup;
mod critest_bench;
mod critest_bench_report;
mod eviction;
mod eviction_report;
mod floor;
mod http;
mod kubelet;
mod kubelet_critest;
mod kubelet_pods;
mod kubelet_report;
mod kubelet_stack;
mod large_image;
mod machine;
mod metrics;
mod net;
mod net_report;
mod node;
mod nri;
mod nri_report;
mod procfs;
mod pull;
mod pull_report;
mod queue;
mod queue_report;
mod raw;
mod registry;
mod report;
#[cfg(test)]
mod report_sample;
mod stats;
mod stream;
mod sweep;
mod template;
mod vm_bench;
mod vm_bench_report;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use petrel_cri::api;
use prost::Message;
use rustix::process::{Pid, PidfdFlags, Signal};

use metrics::OpTotals;
use node::{pod_config, sleep_container, Clients, Node};
use raw::RawRunc;
use report::{Exits, Idle, Lifecycle, ListRound, Memory, Results, Scale};
use stats::Samples;
use sweep::Work;

/// Measure the Petrel runtime against same-run references.
#[derive(Debug, Parser)]
#[command(name = "petrel-bench")]
pub struct Args {
    /// The `petrel` binary.
    #[arg(long, default_value = "target/release/petrel")]
    pub petrel: PathBuf,
    /// The shim binary the runtime is told to use [default: the one beside petrel].
    #[arg(long)]
    pub shim: Option<PathBuf>,
    /// The busybox OCI archive (`make image`).
    #[arg(long, default_value = "build/images/busybox-oci.tar")]
    pub image: PathBuf,
    /// The OCI runtime, for the raw reference.
    #[arg(long, default_value = "runc")]
    pub runc: PathBuf,
    /// Work directory (created, then removed) [default: a new one in /tmp].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Random suffix of the cgroup parent `/petrel-bench-<id>` [default: random].
    #[arg(long)]
    pub id: Option<String>,
    /// Pods (one `sleep` container each) for the lifecycle and memory figures.
    #[arg(long, default_value_t = 100)]
    pub pods: usize,
    /// Containers added to every pod for the scale figures (100 pods × (1 + 9) = 1000).
    #[arg(long, default_value_t = 9)]
    pub extra_per_pod: usize,
    /// Calls of each List RPC per round. 1000 so that ten samples lie above
    /// p99 (nearest rank), which two or three hiccups of the VM do not set
    /// (each call takes about a millisecond, so this costs seconds).
    #[arg(long, default_value_t = 1000)]
    pub list_calls: usize,
    /// Container exits timed for the event latency (at most the added
    /// containers). 500 so that five samples lie above p99 (nearest rank):
    /// with 100 it is the second-largest, set by any two scheduling hiccups
    /// of the VM.
    #[arg(long, default_value_t = 500)]
    pub exits: usize,
    /// Length of the idle CPU window, in seconds.
    #[arg(long, default_value_t = 60)]
    pub idle_seconds: u64,
    /// Length of each run of the queue scenario (P6-P8), in seconds.
    #[arg(long, default_value_t = 20)]
    pub queue_seconds: u64,
    /// Idle window of each agent CPU figure (P10), in seconds.
    #[arg(long, default_value_t = 60)]
    pub agent_idle_seconds: u64,
    /// Running containers (one per pod) of the agent CPU figures (P10).
    #[arg(long, value_delimiter = ',', default_value = "10,50,100")]
    pub agent_sizes: Vec<usize>,
    /// Running containers of the agent CPU figures on containerd 1.7 (P10;
    /// one size by default, to keep `make bench` near 30 minutes).
    #[arg(long, value_delimiter = ',', default_value = "100")]
    pub agent_containerd_sizes: Vec<usize>,
    /// Pods in event mode for the agent's exit and start figures (P11, P12).
    #[arg(long, default_value_t = 50)]
    pub agent_pods: usize,
    /// Pods in relist mode for the same figures (each waits for a relist,
    /// about a second: fewer by default, to keep `make bench` near 30
    /// minutes).
    #[arg(long, default_value_t = 20)]
    pub agent_relist_pods: usize,
    /// Pods of the large relist figure (P13).
    #[arg(long, default_value_t = 1000)]
    pub agent_large_pods: usize,
    /// Containers per pod of the relist figures (P13).
    #[arg(long, default_value_t = 5)]
    pub agent_containers_per_pod: usize,
    /// Window over which relists are averaged (P13), in seconds.
    #[arg(long, default_value_t = 20)]
    pub agent_relist_seconds: u64,
    /// Longest wait for the large layout to run (P13), in seconds.
    #[arg(long, default_value_t = 1800)]
    pub agent_grow_timeout: u64,
    /// Pulls of the large image timed by Petrel and by the reference (P14).
    #[arg(long, default_value_t = 5)]
    pub pull_repetitions: usize,
    /// Compressed size of the large image of P14 and P15, in MB (10^6
    /// bytes), the busybox layer included.
    #[arg(long, default_value_t = 50)]
    pub pull_image_mb: u64,
    /// Layers of files of this machine in the large image, on top of the
    /// busybox layer.
    #[arg(long, default_value_t = 5)]
    pub pull_layers: usize,
    /// Containers created on each image for P15.
    #[arg(long, default_value_t = 30)]
    pub create_containers: usize,
    /// Pods brought up and down on each runtime for P16.
    #[arg(long, default_value_t = 50)]
    pub net_pods: usize,
    /// ExecSync calls on each runtime for P17.
    #[arg(long, default_value_t = 100)]
    pub net_execs: usize,
    /// MiB pushed through each port-forward (and direct) run for P18.
    #[arg(long, default_value_t = 256)]
    pub net_forward_mib: u64,
    /// Port-forward runs of each kind for P18.
    #[arg(long, default_value_t = 5)]
    pub net_forward_runs: usize,
    /// P19: rounds of CreateContainer with 0, 1 and 3 NRI plugins.
    #[arg(long, default_value_t = 10)]
    pub nri_rounds: usize,
    /// P19: CreateContainer calls per plugin count in each round.
    #[arg(long, default_value_t = 30)]
    pub nri_creates: usize,
    /// P20: containers in the runtime for the Synchronize figure.
    #[arg(long, default_value_t = 1000)]
    pub nri_sync_containers: usize,
    /// P20: measured Synchronize runs.
    #[arg(long, default_value_t = 5)]
    pub nri_sync_rounds: usize,
    /// P21: rounds of memory pressure with notifications.
    #[arg(long, default_value_t = 20)]
    pub eviction_rounds: usize,
    /// P21: rounds of memory pressure with polling only (each waits up to
    /// two 10 s periods).
    #[arg(long, default_value_t = 5)]
    pub eviction_polling_rounds: usize,
    /// P22: idle windows (default settings, passes parked), in seconds.
    #[arg(long, default_value_t = 60)]
    pub eviction_idle_seconds: u64,
    /// P22: the window with a pass every 100 ms, in seconds.
    #[arg(long, default_value_t = 20)]
    pub eviction_pass_seconds: u64,
    /// P23-P24: running containers (one busybox `sleep` per pod) of the
    /// kubelet and whole-node idle windows, ascending.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100")]
    pub kubelet_sizes: Vec<usize>,
    /// P23-P24: each idle window, in seconds.
    #[arg(long, default_value_t = 60)]
    pub kubelet_idle_seconds: u64,
    /// P27: container exits timed per PLEG mode (at least 20 for a p99
    /// that is not the maximum).
    #[arg(long, default_value_t = 20)]
    pub kubelet_exits: usize,
    /// P26: pods started one by one per PLEG mode.
    #[arg(long, default_value_t = 20)]
    pub kubelet_starts: usize,
    /// Longest wait for one size's pods to run, in seconds: past it that
    /// setup's larger sizes are skipped (the report says so).
    #[arg(long, default_value_t = 600)]
    pub kubelet_ramp_timeout: u64,
    /// The node stacks of P23-P27, in the order run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "petrel-node,kubelet-petrel,kubelet-containerd,kubelet-containerd-1.7"
    )]
    pub kubelet_setups: Vec<kubelet::Setup>,
    /// Run critest against Petrel's runtime and containerd 2.x in the bench
    /// (about 30 minutes; into `<build-dir>/conformance`) instead of reading
    /// the summary of the last `make conformance`.
    #[arg(long)]
    pub kubelet_critest: bool,
    /// P28: pod lifecycles critest's benchmark mode times per runtime.
    #[arg(long, default_value_t = 100)]
    pub critest_pods: usize,
    /// P28: container lifecycles per runtime.
    #[arg(long, default_value_t = 100)]
    pub critest_containers: usize,
    /// P28: image lifecycles (and image listings) per runtime.
    #[arg(long, default_value_t = 10)]
    pub critest_images: usize,
    /// P29-P32: PodSets a controller restart lists.
    #[arg(long, default_value_t = 10_000)]
    pub controller_objects: usize,
    /// P29-P32: Petrel's PodSet sample controller.
    #[arg(long, default_value = "target/release/petrel-podset-controller")]
    pub podset_controller: PathBuf,
    /// P33: pods created one after the other on each cluster node stack.
    #[arg(long, default_value_t = 30)]
    pub cluster_starts: usize,
    /// P34-P35: pods created at once on each cluster node stack (and
    /// running through its idle window).
    #[arg(long, default_value_t = 100)]
    pub cluster_burst: usize,
    /// P35: the idle window of each cluster node stack, in seconds.
    #[arg(long, default_value_t = 60)]
    pub cluster_idle_seconds: u64,
    /// The node stacks of P33-P35, in the order run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "petrel-node,kubelet-containerd,kubelet-petrel"
    )]
    pub cluster_setups: Vec<kubelet::Setup>,
    /// P38: pods brought up and down (and as many raw runc containers) in
    /// each test VM guest.
    #[arg(long, default_value_t = 24)]
    pub vm_pods: usize,
    /// P39: eviction rounds in each test VM guest.
    #[arg(long, default_value_t = 10)]
    pub vm_eviction_rounds: usize,
    /// Where `--only vm-guest` writes its figures (set by the host side).
    #[arg(long, hide = true)]
    pub vm_guest_out: Option<PathBuf>,
    /// Do not run the agent against containerd 1.7.
    #[arg(long)]
    pub agent_skip_containerd: bool,
    /// Do not run the agent against Petrel's runtime (P10-P13 on it are
    /// then reported as not measured; for quick runs of the containerd
    /// figures).
    #[arg(long)]
    pub agent_skip_petrel: bool,
    /// The workspace's build directory (`make containerd` unpacks
    /// containerd 1.7 into build/containerd-1.7).
    #[arg(long, default_value = "build")]
    pub build_dir: PathBuf,
    /// Run one part only: `runtime` (P1-P5), `queue` (P6-P9: in-process,
    /// needs neither root nor runc; prints its partial report unless --out
    /// is given), `agent` (P10-P13), `pull` (P14-P15), `net` (P16-P18),
    /// `nri` (P19-P20), `eviction` (P21-P22), `kubelet` (P23-P27 and
    /// the critest counts), `critest` (P28), `controller` (P29-P32),
    /// `cluster` (P33-P37) or `vm` (P38-P39, in test VM guests: `make
    /// vm`; these ten print their partial report to standard output
    /// unless --out is given).
    #[arg(long, value_enum, default_value_t = Part::All)]
    pub only: Part,
    /// Where to write the report [default: docs/PERFORMANCE.md; standard
    /// output with --only queue].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The command that ran the bench, as recorded in the report.
    #[arg(long)]
    pub command: Option<String>,
}

/// The parts of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// Everything: the whole docs/PERFORMANCE.md.
    All,
    /// The runtime (P1-P5).
    Runtime,
    /// The controller kit's queue (P6-P9).
    Queue,
    /// The agent (P10-P13).
    Agent,
    /// Image pull and create on a warm image (P14-P15).
    Pull,
    /// Pod network and exec against containerd 1.7 (P16-P18).
    Net,
    /// NRI: CreateContainer with plugins, Synchronize (P19-P20).
    Nri,
    /// The agent's eviction manager: reaction to memory pressure, idle
    /// CPU (P21-P22).
    Eviction,
    /// The real kubelet beside Petrel: steady-state CPU by PLEG mode,
    /// the whole node's CPU, memory, start and exit latency (P23-P27),
    /// critest counts.
    Kubelet,
    /// critest's own benchmarks against Petrel's runtime and containerd
    /// 2.x (P28).
    Critest,
    /// The controller kit's sample beside controller-runtime's: latency in
    /// a restart's storm, queue depth, leader handoff, memory and idle
    /// requests (P29-P32).
    Controller,
    /// Nodes of a real cluster: `petrel node` beside kubelet on
    /// containerd 2.x and on `petrel runtime`, pod start latency in the
    /// API, a burst of pods, the idle node's requests, CPU and memory
    /// (P33-P35).
    Cluster,
    /// cgroup v2 against v1 in test VM guests of one kernel: pod up and
    /// down against raw runc, the eviction reaction (P38-P39).
    Vm,
    /// The guest side of `vm`, run by it inside each guest.
    #[value(hide = true)]
    VmGuest,
}

/// The default report.
const DEFAULT_OUT: &str = "docs/PERFORMANCE.md";

fn main() -> ExitCode {
    // The echo child of the P19 floor (see floor.rs): not a bench run.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.len() == 3 && argv[1] == floor::ECHO_ARG {
        return match floor::serve_echo(std::path::Path::new(&argv[2])) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("petrel-bench echo: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("petrel-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    if args.only == Part::Queue {
        return run_queue_only(args);
    }
    if args.only == Part::Agent {
        return run_agent_only(args);
    }
    if args.only == Part::Pull {
        return run_pull_only(args);
    }
    if args.only == Part::Net {
        return run_net_only(args);
    }
    if args.only == Part::Nri {
        return run_nri_only(args);
    }
    if args.only == Part::Eviction {
        return run_eviction_only(args);
    }
    if args.only == Part::Kubelet {
        return run_kubelet_only(args);
    }
    if args.only == Part::Critest {
        return run_critest_only(args);
    }
    if args.only == Part::Controller {
        return run_controller_only(args);
    }
    if args.only == Part::Cluster {
        return run_cluster_only(args);
    }
    if args.only == Part::Vm {
        return run_vm_only(args);
    }
    if args.only == Part::VmGuest {
        return vm_bench::run_guest(args);
    }
    if args.only == Part::All {
        // A missing peer fails the whole run now, not after an hour.
        kubelet::preflight(args)?;
        cluster_bench::preflight(args)?;
    }
    ensure!(args.pods > 0, "--pods must be at least 1");
    ensure!(args.list_calls > 0, "--list-calls must be at least 1");
    // Inits of the raw runc containers (and anything orphaned by a failure)
    // are reparented to us, so we can wait for them and reap them.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .context("become a child subreaper")?;
    let id = match &args.id {
        Some(id) => id.clone(),
        None => random_id()?,
    };
    let dir = args
        .work_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("petrel-bench.{id}")));
    let work = Work::create(dir, format!("/petrel-bench-{id}"))?;
    let machine = machine::Machine::collect(args, &work.dir)?;

    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start tokio")?;
    let results = tokio.block_on(async {
        tokio::select! {
            r = bench(args, &work) => r,
            s = interrupted() => bail!("interrupted by {s}"),
        }
    });
    drop(tokio);
    let results = results?;
    let text = report::render(&machine, args, &results)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    write_atomically(&out, &text)?;
    eprintln!("petrel-bench: wrote {}", out.display());
    drop(work);
    Ok(())
}

/// `--only queue`: the queue figures alone, in this process.
fn run_queue_only(args: &Args) -> Result<()> {
    let machine = machine::Machine::collect(args, &std::env::temp_dir())?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start tokio")?;
    let results = tokio.block_on(async {
        tokio::select! {
            r = queue::measure(args.queue_seconds, progress) => r,
            s = interrupted() => bail!("interrupted by {s}"),
        }
    });
    drop(tokio);
    let text = report::render_queue_only(&machine, &results?)?;
    match &args.out {
        Some(out) => {
            write_atomically(out, &text)?;
            eprintln!("petrel-bench: wrote {}", out.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// `--only agent`: the agent figures alone, with their own work directory.
fn run_agent_only(args: &Args) -> Result<()> {
    ensure!(
        args.agent_pods > 0 && args.agent_relist_pods > 0,
        "--agent-pods and --agent-relist-pods must be at least 1"
    );
    let results = run_one_section(
        args,
        async |work: &Work| agent::measure(args, work, &progress).await,
        report::render_agent_only,
    )?;
    let failed = (results.petrel.error.is_some() && !args.agent_skip_petrel)
        || results.containerd.as_ref().is_ok_and(|c| c.error.is_some());
    ensure!(!failed, "the agent figures are incomplete (see the report)");
    Ok(())
}

/// `--only pull`: the pull figures alone, with their own work directory.
fn run_pull_only(args: &Args) -> Result<()> {
    let results = run_one_section(
        args,
        async |work: &Work| pull::measure(args, work, &progress).await,
        report::render_pull_only,
    )?;
    ensure!(
        results.error.is_none(),
        "the pull figures are incomplete (see the report)"
    );
    Ok(())
}

/// `--only net`: the network and exec figures alone.
fn run_net_only(args: &Args) -> Result<()> {
    let results = run_one_section(
        args,
        async |work: &Work| net::measure(args, work, &progress).await,
        report::render_net_only,
    )?;
    ensure!(
        results.error.is_none(),
        "the net figures are incomplete (see the report)"
    );
    Ok(())
}

/// `--only nri`: the NRI figures alone.
fn run_nri_only(args: &Args) -> Result<()> {
    let results = run_one_section(
        args,
        async |work: &Work| nri::measure(args, work, &progress).await,
        report::render_nri_only,
    )?;
    ensure!(
        results.error.is_none(),
        "the NRI figures are incomplete (see the report)"
    );
    Ok(())
}

/// `--only eviction`: the eviction manager's figures alone.
fn run_eviction_only(args: &Args) -> Result<()> {
    let results = run_one_section(
        args,
        async |work: &Work| eviction::measure(args, work, &progress).await,
        report::render_eviction_only,
    )?;
    ensure!(
        results.error.is_none(),
        "the eviction figures are incomplete (see the report)"
    );
    Ok(())
}

/// `--only critest`: critest's benchmarks alone.
fn run_critest_only(args: &Args) -> Result<()> {
    let results = run_one_section(
        args,
        async |work: &Work| critest_bench::measure(args, work, &progress).await,
        report::render_critest_only,
    )?;
    if let Err(e) = results.petrel.as_ref().and(results.containerd.as_ref()) {
        bail!("critest's benchmarks were not measured: {e}");
    }
    Ok(())
}

/// `--only controller`: the controller kit's figures alone.
fn run_controller_only(args: &Args) -> Result<()> {
    let results = run_one_section(
        args,
        async |work: &Work| controller_bench::measure(args, work, &progress).await,
        report::render_controller_only,
    )?;
    if let Some(e) = &results.error {
        bail!("the controller figures were not measured: {e}");
    }
    Ok(())
}

/// `--only cluster`: the cluster node figures alone.
fn run_cluster_only(args: &Args) -> Result<()> {
    ensure!(
        args.cluster_starts > 0 && args.cluster_burst > 0,
        "--cluster-starts and --cluster-burst must be at least 1"
    );
    cluster_bench::preflight(args)?;
    let results = run_one_section(
        args,
        async |work: &Work| cluster_bench::measure(args, work, &progress).await,
        report::render_cluster_only,
    )?;
    if let Some(e) = &results.error {
        bail!("the cluster figures were not measured: {e}");
    }
    let failed: Vec<String> = results
        .runs
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| kubelet::setup_name(r.setup, &r.runtime_version))
        .collect();
    ensure!(
        failed.is_empty(),
        "the cluster figures are incomplete for {} (see the report)",
        failed.join(", ")
    );
    Ok(())
}

/// `--only vm`: the cgroup v2 against v1 figures alone.
fn run_vm_only(args: &Args) -> Result<()> {
    let results = run_one_section(
        args,
        async |work: &Work| vm_bench::measure(args, work, &progress).await,
        report::render_vm_only,
    )?;
    if let Some(e) = &results.error {
        bail!("the VM figures were not measured: {e}");
    }
    let failed: Vec<&str> = results
        .runs
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| r.cgroup.as_str())
        .collect();
    ensure!(
        failed.is_empty(),
        "the VM figures are incomplete in the {} guest (see the report)",
        failed.join(" and ")
    );
    Ok(())
}

/// `--only kubelet`: the kubelet figures alone.
fn run_kubelet_only(args: &Args) -> Result<()> {
    kubelet::preflight(args)?;
    let results = run_one_section(
        args,
        async |work: &Work| kubelet::measure(args, work, &progress).await,
        report::render_kubelet_only,
    )?;
    if let Some(e) = &results.error {
        bail!("the kubelet figures were not measured: {e}");
    }
    let failed: Vec<String> = results
        .runs
        .iter()
        .filter(|r| r.error.is_some() && r.setup != kubelet::Setup::KubeletContainerd17)
        .map(|r| kubelet::setup_name(r.setup, &r.runtime_version))
        .collect();
    ensure!(
        failed.is_empty(),
        "the kubelet figures are incomplete for {} (see the report)",
        failed.join(", ")
    );
    Ok(())
}

/// One section run alone: its own work directory and cgroup, measured
/// until done or interrupted, its report written to `--out` (or stdout).
fn run_one_section<R>(
    args: &Args,
    measure: impl AsyncFnOnce(&Work) -> R,
    render: impl FnOnce(&machine::Machine, &R) -> Result<String, template::TemplateError>,
) -> Result<R> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .context("become a child subreaper")?;
    let id = match &args.id {
        Some(id) => id.clone(),
        None => random_id()?,
    };
    let dir = args
        .work_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("petrel-bench.{id}")));
    let work = Work::create(dir, format!("/petrel-bench-{id}"))?;
    let machine = machine::Machine::collect(args, &work.dir)?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start tokio")?;
    let results = tokio.block_on(async {
        tokio::select! {
            r = measure(&work) => Ok(r),
            s = interrupted() => bail!("interrupted by {s}"),
        }
    });
    drop(tokio);
    let results = results?;
    let text = render(&machine, &results)?;
    match &args.out {
        Some(out) => {
            write_atomically(out, &text)?;
            eprintln!("petrel-bench: wrote {}", out.display());
        }
        None => print!("{text}"),
    }
    drop(work);
    Ok(results)
}

async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}

fn random_id() -> Result<String> {
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).context("random id")?;
    Ok(hex::encode(b))
}

fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("md.tmp");
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

fn progress(msg: &str) {
    eprintln!("petrel-bench: {msg}");
}

/// One pod of the bench and its containers.
struct Pod {
    id: String,
    config: api::PodSandboxConfig,
    main: String,
    extras: Vec<String>,
}

async fn bench(args: &Args, work: &Work) -> Result<Results> {
    // The queue runs in this process and needs no runtime: first, on a
    // machine not yet busy with containers.
    let queue = match args.only {
        Part::All => Some(queue::measure(args.queue_seconds, progress).await?),
        Part::Runtime
        | Part::Queue
        | Part::Agent
        | Part::Pull
        | Part::Net
        | Part::Nri
        | Part::Eviction
        | Part::Kubelet
        | Part::Critest
        | Part::Controller
        | Part::Cluster
        | Part::Vm
        | Part::VmGuest => None,
    };
    let fsync = probe_fsync(&work.dir, 100)?;

    progress("starting the runtime");
    // Pods under a cgroup of their own, beside raw runc's: the runtime's
    // sweep removes it.
    let pods_cgroup = format!("{}/petrel", work.cgroup_parent);
    let mut node = Node::start(&args.petrel, args.shim.as_deref(), &pods_cgroup)?;
    let mut c = node.connect().await?;
    c.import(&args.image).await?;
    let layer = single_layer(&node.root)?;
    let mut raw = RawRunc::prepare(
        &args.runc,
        &work.dir.join("raw"),
        &layer,
        &format!("{}/raw", work.cgroup_parent),
    )?;

    // One unmeasured round trip each, so that first-use costs (page cache,
    // lazily built state) are not charged to the first sample.
    progress("warm-up");
    {
        let mut up = Lifecycle::default();
        let mut down = Lifecycle::default();
        let pod = petrel_up(&mut c, "warmup", &pods_cgroup, &work.dir, &mut up).await?;
        petrel_down(&mut c, &pod, &mut down).await?;
        raw_up(&mut raw, "warmup", &mut up)?;
        raw_down(&mut raw, "warmup", &mut down)?;
    }

    // P1 (up): sequential; the order of Petrel and runc alternates so that
    // a slow moment of the machine falls on both alike.
    progress(&format!(
        "P1 up: {} pods and {} raw runc containers",
        args.pods, args.pods
    ));
    let mut up = Lifecycle::default();
    let mut pods = Vec::with_capacity(args.pods);
    let before = OpTotals::read(&mut c).await?;
    for i in 0..args.pods {
        let raw_id = format!("r{i:04}");
        if i % 2 == 1 {
            raw_up(&mut raw, &raw_id, &mut up)?;
        }
        let name = format!("p{i:04}");
        pods.push(petrel_up(&mut c, &name, &pods_cgroup, &work.dir, &mut up).await?);
        if i % 2 == 0 {
            raw_up(&mut raw, &raw_id, &mut up)?;
        }
    }
    up.set_runtime_side(&OpTotals::read(&mut c).await?, &before);

    progress("P2 memory with one container per pod");
    let rt_pid = node.pid();
    let memory = measure_memory(&mut c, &node, &pods).await?;

    progress(&format!("P5 idle CPU for {} s", args.idle_seconds));
    let idle = measure_idle(&node, args.idle_seconds).await?;

    progress("P3 list latency at one container per pod");
    let mut lists = vec![list_round(&mut c, args.list_calls, pods.len()).await?];

    let mut scale = Scale::default();
    if args.extra_per_pod > 0 {
        progress(&format!(
            "adding {} containers",
            args.extra_per_pod * pods.len()
        ));
        for j in 1..=args.extra_per_pod {
            for pod in pods.iter_mut() {
                let t = Instant::now();
                let id = c
                    .create(&pod.id, &pod.config, sleep_container(&format!("x{j}")))
                    .await?;
                scale.create.push(t.elapsed());
                let t = Instant::now();
                c.start(&id).await?;
                scale.start.push(t.elapsed());
                pod.extras.push(id);
            }
        }
        let total = pods.len() * (1 + args.extra_per_pod);
        scale.containers = total;
        scale.runtime = procfs::mem(rt_pid)?;
        let shims = procfs::shims_of(&node.state)?;
        scale.shims = shims.iter().filter_map(|p| procfs::mem(*p).ok()).collect();
        progress(&format!("P3 list latency at {total} containers"));
        lists.push(list_round(&mut c, args.list_calls, total).await?);
    }

    let exits = if args.extra_per_pod > 0 && args.exits > 0 {
        progress("P4 exit events");
        measure_exits(&mut c, &pods, args.exits).await?
    } else {
        Exits::default()
    };

    progress("removing the added containers");
    for pod in pods.iter_mut() {
        for id in pod.extras.drain(..) {
            c.remove(&id).await?;
        }
    }

    progress("P1 down");
    let mut down = Lifecycle::default();
    let before = OpTotals::read(&mut c).await?;
    for (i, pod) in pods.iter().enumerate() {
        let raw_id = format!("r{i:04}");
        if i % 2 == 1 {
            raw_down(&mut raw, &raw_id, &mut down)?;
        }
        petrel_down(&mut c, pod, &mut down).await?;
        if i % 2 == 0 {
            raw_down(&mut raw, &raw_id, &mut down)?;
        }
    }
    down.set_runtime_side(&OpTotals::read(&mut c).await?, &before);
    let shims_left = procfs::shims_of(&node.state)?.len();
    let runtime_after = procfs::mem(rt_pid)?;

    progress("stopping the runtime");
    drop(c);
    node.shutdown();
    raw.sweep();

    // The other sections run after the runtime's only in a whole run.
    let (pull, net, nri, eviction, agent, kubelet, critest, controller, cluster, vm) =
        if args.only == Part::All {
            // In this order: the tuple's elements are awaited one after another.
            (
                Some(pull::measure(args, work, &progress).await),
                Some(net::measure(args, work, &progress).await),
                Some(nri::measure(args, work, &progress).await),
                Some(eviction::measure(args, work, &progress).await),
                Some(agent::measure(args, work, &progress).await),
                Some(kubelet::measure(args, work, &progress).await),
                Some(critest_bench::measure(args, work, &progress).await),
                Some(controller_bench::measure(args, work, &progress).await),
                Some(cluster_bench::measure(args, work, &progress).await),
                Some(vm_bench::measure(args, work, &progress).await),
            )
        } else {
            (None, None, None, None, None, None, None, None, None, None)
        };
    Ok(Results {
        fsync,
        up,
        down,
        memory,
        idle,
        lists,
        scale,
        exits,
        shims_left,
        runtime_after,
        load_after: machine::load_average(),
        queue,
        pull,
        agent,
        net,
        nri,
        eviction,
        kubelet,
        critest,
        controller,
        cluster,
        vm,
    })
}

/// The one unpacked layer of the busybox image in the runtime's store.
fn single_layer(root: &Path) -> Result<PathBuf> {
    let dir = root.join("images").join("layers");
    let layers: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    match layers.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "expected one unpacked layer in {}, found {}",
            dir.display(),
            layers.len()
        ),
    }
}

async fn petrel_up(
    c: &mut Clients,
    name: &str,
    cgroup_parent: &str,
    work: &Path,
    up: &mut Lifecycle,
) -> Result<Pod> {
    let config = pod_config(name, cgroup_parent, work);
    let t = Instant::now();
    let id = c.run_pod(&config).await?;
    let run = t.elapsed();
    let t = Instant::now();
    let main = c.create(&id, &config, sleep_container("main")).await?;
    let create = t.elapsed();
    let t = Instant::now();
    c.start(&main).await?;
    let start = t.elapsed();
    up.petrel.push(run + create + start);
    up.petrel_steps.push("RunPodSandbox", run);
    up.petrel_steps.push("CreateContainer", create);
    up.petrel_steps.push("StartContainer", start);
    Ok(Pod {
        id,
        config,
        main,
        extras: vec![],
    })
}

async fn petrel_down(c: &mut Clients, pod: &Pod, down: &mut Lifecycle) -> Result<()> {
    let t = Instant::now();
    c.stop(&pod.main, 0).await?;
    let stop = t.elapsed();
    let t = Instant::now();
    c.remove(&pod.main).await?;
    let remove = t.elapsed();
    let t = Instant::now();
    c.stop_pod(&pod.id).await?;
    let stop_pod = t.elapsed();
    let t = Instant::now();
    c.remove_pod(&pod.id).await?;
    let remove_pod = t.elapsed();
    down.petrel.push(stop + remove + stop_pod + remove_pod);
    down.petrel_steps.push("StopContainer", stop);
    down.petrel_steps.push("RemoveContainer", remove);
    down.petrel_steps.push("StopPodSandbox", stop_pod);
    down.petrel_steps.push("RemovePodSandbox", remove_pod);
    Ok(())
}

fn raw_up(raw: &mut RawRunc, id: &str, up: &mut Lifecycle) -> Result<()> {
    let r = raw.up(id)?;
    up.raw.push(r.create + r.start);
    up.raw_steps.push("runc create", r.create);
    up.raw_steps.push("runc start", r.start);
    Ok(())
}

fn raw_down(raw: &mut RawRunc, id: &str, down: &mut Lifecycle) -> Result<()> {
    let r = raw.down(id)?;
    down.raw.push(r.kill + r.wait + r.delete);
    down.raw_steps.push("runc kill KILL", r.kill);
    down.raw_steps.push("wait for exit + reap", r.wait);
    down.raw_steps.push("runc delete", r.delete);
    Ok(())
}

/// A reference process (`sleep`), killed and reaped on drop.
struct RefProcess(Child);

impl RefProcess {
    fn sleep(secs: u64) -> Result<RefProcess> {
        let child = Command::new("sleep")
            .arg(secs.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start sleep")?;
        Ok(RefProcess(child))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for RefProcess {
    fn drop(&mut self) {
        // Our own child, by its handle.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn measure_memory(c: &mut Clients, node: &Node, pods: &[Pod]) -> Result<Memory> {
    let rt_pid = node.pid();
    let shim_pids = procfs::shims_of(&node.state)?;
    let shims_parented = shim_pids
        .iter()
        .filter(|p| procfs::ppid(**p) == Some(rt_pid))
        .count();
    let mut shims = vec![];
    for p in &shim_pids {
        shims.push(procfs::mem(*p)?);
    }
    let mut inits = vec![];
    for pod in pods {
        let (pid, _) = c.init_pid(&pod.main).await?;
        inits.push(procfs::mem(pid)?);
    }
    let sleep = RefProcess::sleep(3600)?;
    // Let it finish exec and settle into its sleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sleep_mem = procfs::mem(sleep.pid())?;
    Ok(Memory {
        containers: pods.len(),
        shims,
        shims_parented,
        runtime: procfs::mem(rt_pid)?,
        inits,
        sleep: sleep_mem,
    })
}

fn shims_cpu(state: &Path) -> Result<(procfs::Cpu, usize)> {
    let mut total = procfs::Cpu::default();
    let pids = procfs::shims_of(state)?;
    for p in &pids {
        total = total.plus(procfs::cpu(*p)?);
    }
    Ok((total, pids.len()))
}

async fn measure_idle(node: &Node, secs: u64) -> Result<Idle> {
    let rt_pid = node.pid();
    let sleep = RefProcess::sleep(secs + 3600)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rt0 = procfs::cpu(rt_pid)?;
    let (sh0, n0) = shims_cpu(&node.state)?;
    let sl0 = procfs::cpu(sleep.pid())?;
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let wall = t.elapsed();
    let rt1 = procfs::cpu(rt_pid)?;
    let (sh1, n1) = shims_cpu(&node.state)?;
    let sl1 = procfs::cpu(sleep.pid())?;
    ensure!(
        n0 == n1,
        "shims came or went during the idle window ({n0} -> {n1})"
    );
    Ok(Idle {
        wall,
        runtime: rt1.since(rt0),
        shims: sh1.since(sh0),
        shim_count: n1,
        sleep: sl1.since(sl0),
        ticks_per_second: procfs::ticks_per_second(),
    })
}

/// One Version, ListContainers and ListPodSandbox call, timed until the
/// decoded answer is in hand: freeing it afterwards is the caller's business
/// after the call, not part of the call's latency.
async fn list_calls(c: &mut Clients) -> Result<(Duration, Duration, Duration)> {
    let t = Instant::now();
    let answer = c.rt.version(api::VersionRequest::default()).await;
    let version = t.elapsed();
    drop(answer.context("Version")?);
    let t = Instant::now();
    let answer =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await;
    let containers = t.elapsed();
    drop(answer.context("ListContainers")?);
    let t = Instant::now();
    let answer =
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest::default())
            .await;
    let pods = t.elapsed();
    drop(answer.context("ListPodSandbox")?);
    Ok((version, containers, pods))
}

async fn list_round(c: &mut Clients, calls: usize, expect: usize) -> Result<ListRound> {
    let mut round = ListRound {
        containers: expect,
        ..Default::default()
    };
    let first =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .context("ListContainers")?
            .into_inner();
    let n = first.containers.len();
    ensure!(
        n == expect,
        "ListContainers returned {n}, expected {expect}"
    );
    // The protobuf share of a call: encoding and decoding the same response
    // in this process, without any transport.
    round.response_bytes = first.encoded_len();
    for _ in 0..50 {
        let t = Instant::now();
        let bytes = first.encode_to_vec();
        round.encode.push(t.elapsed());
        let t = Instant::now();
        let back = api::ListContainersResponse::decode(bytes.as_slice())
            .context("decode ListContainersResponse")?;
        round.decode.push(t.elapsed());
        ensure!(back.containers.len() == n, "decoding lost containers");
        let t = Instant::now();
        drop(back);
        round.free.push(t.elapsed());
    }
    // Warm-up calls, then the three calls interleaved so that each sees the
    // same moments of the machine.
    for _ in 0..10 {
        list_calls(c).await?;
    }
    let before = OpTotals::read(c).await?;
    for _ in 0..calls {
        let (version, containers, pods) = list_calls(c).await?;
        round.version.push(version);
        round.list_containers.push(containers);
        round.list_pods.push(pods);
    }
    let after = OpTotals::read(c).await?;
    round.runtime_side =
        ["Version", "ListContainers", "ListPodSandbox"].map(|op| after.mean_since(&before, op));
    Ok(round)
}

/// Quiet time before each measured exit.
pub const EXIT_GAP: Duration = Duration::from_millis(100);

async fn measure_exits(c: &mut Clients, pods: &[Pod], n: usize) -> Result<Exits> {
    // One added container of each pod in turn.
    let extras = pods.iter().map(|p| p.extras.len()).max().unwrap_or(0);
    let victims: Vec<&String> = (0..extras)
        .flat_map(|j| pods.iter().filter_map(move |p| p.extras.get(j)))
        .take(n)
        .collect();

    let mut stream =
        c.rt.get_container_events(api::GetEventsRequest {})
            .await
            .context("GetContainerEvents")?
            .into_inner();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Received>();
    let reader = tokio::spawn(async move {
        while let Ok(Some(ev)) = stream.message().await {
            let at = Instant::now();
            let at_ns = realtime_ns();
            if ev.container_event_type == api::ContainerEventType::ContainerStoppedEvent as i32
                && tx
                    .send(Received {
                        id: ev.container_id,
                        at,
                        at_ns,
                        created_ns: ev.created_at,
                    })
                    .is_err()
            {
                break;
            }
        }
    });
    // The subscription exists once the call is answered; leave a margin.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut exits = Exits::default();
    for (i, id) in victims.iter().enumerate() {
        // Each exit is measured alone: what the runtime does after the
        // previous one (its `runc delete`) is over by now.
        tokio::time::sleep(EXIT_GAP).await;
        let (pid, bundle) = c.init_pid(id).await?;
        if i % 2 == 1 {
            exits.kernel.push(kernel_exit_floor()?);
        }
        let target = Pid::from_raw(pid as i32).context("init pid")?;
        let kill_ns = realtime_ns();
        let t0 = Instant::now();
        rustix::process::kill_process(target, Signal::KILL)
            .with_context(|| format!("kill init {pid} of container {id}"))?;
        let ev = loop {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some(ev)) if &ev.id == *id => break ev,
                Ok(Some(_)) => continue,
                Ok(None) => bail!("the event stream ended"),
                Err(_) => bail!("no STOPPED event for container {id} within 10 s"),
            }
        };
        exits.petrel.push(ev.at.saturating_duration_since(t0));
        // Where the time went, by the wall clock the shim and the runtime
        // stamp their records with.
        if let Some(reaped_ns) = exit_record_ns(&bundle) {
            exits.to_reaped.push(ns_between(kill_ns, reaped_ns));
            exits
                .to_published
                .push(ns_between(reaped_ns, ev.created_ns));
            exits.to_received.push(ns_between(ev.created_ns, ev.at_ns));
        }
        if i % 2 == 0 {
            exits.kernel.push(kernel_exit_floor()?);
        }
    }
    reader.abort();
    Ok(exits)
}

/// A STOPPED event as the subscriber received it.
struct Received {
    id: String,
    at: Instant,
    at_ns: i64,
    created_ns: i64,
}

fn realtime_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn ns_between(from: i64, to: i64) -> Duration {
    Duration::from_nanos(u64::try_from(to.saturating_sub(from)).unwrap_or(0))
}

/// When the shim reaped the init, from the exit record in its bundle.
fn exit_record_ns(bundle: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(bundle.join(petrel_shim::EXIT_FILE)).ok()?;
    petrel_shim::ExitRecord::parse(&text).map(|r| r.exited_at_ns)
}

/// The kernel's floor for "a process died, a waiter knows": kill(2) of a
/// child we spawned until its pidfd turns readable.
fn kernel_exit_floor() -> Result<Duration> {
    let child = RefProcess::sleep(3600)?;
    let pid = Pid::from_raw(child.pid() as i32).context("child pid")?;
    let fd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).context("pidfd_open")?;
    // Let it get past exec, as a container's init is.
    std::thread::sleep(Duration::from_millis(5));
    let t0 = Instant::now();
    rustix::process::kill_process(pid, Signal::KILL).context("kill")?;
    raw::wait_readable(&fd, Duration::from_secs(5))?;
    let d = t0.elapsed();
    drop(child);
    Ok(d)
}

/// Write + fsync of a small file in the work directory (the runtime's root
/// is on the same file system): the floor of a durable commit.
fn probe_fsync(dir: &Path, n: usize) -> Result<Samples> {
    let path = dir.join("fsync-probe");
    let mut s = Samples::default();
    for i in 0..n {
        let t = Instant::now();
        let mut f =
            std::fs::File::create(&path).with_context(|| format!("create {}", path.display()))?;
        f.write_all(format!("{i:0128}").as_bytes())
            .and_then(|()| f.sync_all())
            .with_context(|| format!("write {}", path.display()))?;
        s.push(t.elapsed());
    }
    std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
    Ok(s)
}
