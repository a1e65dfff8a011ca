//! Fixed figures of a made-up run, for rendering the report in tests
//! without measuring anything.

use std::time::Duration;

use clap::Parser;

use crate::agent::{
    Adoption, AgentResults, ExitReference, ExitRun, IdlePoint, IdleWindow, Large, RelistPoint,
    StartRun, TargetRun,
};
use crate::agent_proc::{Mode, ObserveMethod};
use crate::cluster_bench::{ClusterResults, StackRun};
use crate::eviction::{CpuWindow, EvictionResults};
use crate::kubelet::{
    Adoption as KubeletAdoption, Critest, KubeletResults, MemoryPoint, Pleg, Ramp, Series, Setup,
    SetupRun, Window,
};
use crate::large_image::{LargeImage, LayerInfo};
use crate::machine::Machine;
use crate::net::NetResults;
use crate::nri::NriResults;
use crate::procfs::{Cpu, Mem};
use crate::pull::PullResults;
use crate::queue::{Depth, QueueResults, Run, Throughput};
use crate::report::{Exits, Idle, Lifecycle, ListRound, Memory, Results, Scale};
use crate::stats::Samples;
use crate::Args;

/// Samples of the given milliseconds.
pub fn samples(ms: &[f64]) -> Samples {
    let mut s = Samples::default();
    for m in ms {
        s.push(Duration::from_secs_f64(m / 1e3));
    }
    s
}

/// Samples `base`, `base + step`, … (`n` of them).
pub fn ramp(n: usize, base: f64, step: f64) -> Samples {
    samples(&(0..n).map(|i| base + step * i as f64).collect::<Vec<_>>())
}

fn cpu(ticks: u64, sched_ns: u64) -> Cpu {
    Cpu { ticks, sched_ns }
}

fn mem(rss_kib: u64) -> Mem {
    Mem {
        rss_kib,
        pss_kib: rss_kib / 2,
        uss_kib: rss_kib / 3,
        anon_kib: rss_kib / 4,
    }
}

/// The machine of the sample run.
pub fn machine() -> Machine {
    Machine {
        kernel: "6.1.0-sample".into(),
        cpus: 2,
        cpu_model: "Sample CPU".into(),
        memory: "4 GiB".into(),
        load_before: "0.10 0.20 0.30".into(),
        cgroups: "v1 (hybrid)".into(),
        work_fs: "ext4".into(),
        runc: "runc version 1.1.5".into(),
        date: "2026-01-02 03:04:05 UTC".into(),
        commit: "abc1234".into(),
        command: "make bench".into(),
        shim: "target/release/petrel-shim (static)".into(),
    }
}

/// The default flags.
pub fn args() -> Args {
    Args::parse_from(["petrel-bench"])
}

fn lifecycle(steps: &[&'static str], raw_steps: &[&'static str], base: f64) -> Lifecycle {
    let mut l = Lifecycle {
        petrel: ramp(10, base * 1.1, 0.5),
        raw: ramp(10, base, 0.4),
        ..Default::default()
    };
    for i in 0..10 {
        for (k, s) in steps.iter().enumerate() {
            l.petrel_steps
                .push(s, Duration::from_micros(1000 + 100 * (k + i) as u64));
        }
        for (k, s) in raw_steps.iter().enumerate() {
            l.raw_steps
                .push(s, Duration::from_micros(900 + 100 * (k + i) as u64));
        }
    }
    l.runtime_side = steps
        .iter()
        .enumerate()
        .map(|(k, s)| (*s, (k != 1).then(|| Duration::from_micros(800 + k as u64))))
        .collect();
    l
}

fn window(containers: usize, relists: Option<(u64, f64)>, k: u64) -> IdleWindow {
    IdleWindow {
        containers,
        wall: Duration::from_secs(60),
        runtime: cpu(2 * k, 20_000_000 * k),
        agent: cpu(3 * k, 30_000_000 * k),
        shims: cpu(k, 10_000_000 * k),
        shim_count: containers,
        relists,
        accounted: (k != 2).then(|| Duration::from_millis(55 * k)),
    }
}

fn target(name: &str, reference: ExitReference, error: Option<&str>) -> TargetRun {
    let exit = |base: f64| ExitRun {
        agent: ramp(20, base, 0.3),
        runtime: ramp(20, base / 4.0, 0.05),
        wrong_codes: vec![],
        reference,
    };
    TargetRun {
        name: name.into(),
        idle: [10, 100]
            .iter()
            .map(|&n| IdlePoint {
                containers: n,
                relist: window(n, Some((60, 0.3)), 10),
                events: window(n, Some((0, 0.0)), 1),
            })
            .collect(),
        exits: vec![
            (Mode::Events, exit(3.0)),
            (
                Mode::Relist,
                ExitRun {
                    wrong_codes: vec![1, 143],
                    ..exit(500.0)
                },
            ),
        ],
        exits_always: Some(exit(4.0)),
        starts: vec![
            (
                Mode::Events,
                StartRun {
                    agent: ramp(20, 90.0, 1.0),
                    direct: ramp(10, 80.0, 1.0),
                    agent_metric_mean: Some(Duration::from_millis(85)),
                },
            ),
            (
                Mode::Relist,
                StartRun {
                    agent: ramp(20, 600.0, 10.0),
                    direct: ramp(10, 80.0, 1.0),
                    agent_metric_mean: None,
                },
            ),
        ],
        adoptions: vec![Adoption {
            to: Some(Mode::Events),
            before: 100,
            kept: 100,
            new: 0,
            took: Duration::from_millis(1500),
            startup: Duration::from_millis(120),
        }],
        deletes: vec![(20, Duration::from_millis(900))],
        error: error.map(str::to_string),
    }
}

/// The agent section of the sample run.
pub fn agent() -> AgentResults {
    AgentResults {
        petrel: target("petrel runtime", ExitReference::Event, None),
        relist: vec![
            RelistPoint {
                pods: 100,
                containers: 500,
                wall: Duration::from_secs(30),
                count: 30,
                mean: Duration::from_millis(4),
                reference: ramp(50, 2.0, 0.01),
            },
            RelistPoint {
                pods: 1000,
                containers: 5000,
                wall: Duration::from_secs(30),
                count: 29,
                mean: Duration::from_millis(40),
                reference: ramp(50, 30.0, 0.1),
            },
        ],
        large: Large {
            target_pods: 1000,
            per_pod: 5,
            written: 1000,
            running: 5000,
            grown_from: 100,
            grow: Duration::from_secs(300),
            note: Some("sample note".into()),
            teardown: Duration::from_secs(120),
        },
        containerd: Ok(target(
            "containerd 1.7.24",
            ExitReference::StatusPoll,
            Some("sample error\nsecond line"),
        )),
        method: Some(ObserveMethod::Watch),
        watch_error: None,
        idle_seconds: 60,
        relist_seconds: 30,
        pods: 20,
        relist_pods: 20,
    }
}

/// The NRI section of the sample run.
pub fn nri() -> NriResults {
    NriResults {
        error: Some("sample `error`\nsecond line".into()),
        create: [
            ramp(30, 20.0, 0.1),
            ramp(30, 20.1, 0.1),
            ramp(30, 20.3, 0.1),
        ],
        call_mean: Some(Duration::from_micros(45)),
        hook_p50: [
            Some(Duration::from_micros(60)),
            Some(Duration::from_micros(150)),
        ],
        wait_p50: [
            Some(Duration::from_micros(40)),
            Some(Duration::from_micros(120)),
        ],
        hook_count: [30, 30],
        floor: ramp(100, 0.03, 0.0001),
        sync_containers: 1000,
        sync: ramp(5, 12.0, 0.5),
        list: ramp(5, 3.0, 0.1),
    }
}

/// The eviction section of the sample run.
pub fn eviction() -> EvictionResults {
    let w = |secs: u64, ms: u64| CpuWindow {
        wall: Duration::from_secs(secs),
        agent: Duration::from_millis(ms),
        runtime: Duration::from_millis(ms / 10),
    };
    EvictionResults {
        error: None,
        notified: ramp(20, 40.0, 1.0),
        notified_decision: ramp(20, 35.0, 1.0),
        polled: ramp(5, 4000.0, 500.0),
        polled_decision: ramp(5, 3990.0, 500.0),
        hog_peak: Some(300 << 20),
        realtime_stamps: 24,
        early_stops: 1,
        idle: Some(w(60, 33)),
        parked: Some(w(60, 30)),
        fast: Some(w(20, 110)),
    }
}

/// The network section of the sample run.
pub fn net() -> NetResults {
    NetResults {
        error: Some("sample error\nsecond line".into()),
        containerd_missing: None,
        containerd_version: "containerd 1.7.24".into(),
        conflist: "{\"cniVersion\":\"1.0.0\",\"name\":\"sample\"}".into(),
        run_petrel: ramp(10, 20.0, 1.0),
        run_containerd: ramp(10, 60.0, 1.0),
        down_petrel: ramp(10, 10.0, 1.0),
        down_containerd: ramp(10, 30.0, 1.0),
        exec_petrel: ramp(20, 8.0, 0.1),
        exec_containerd: ramp(20, 12.0, 0.1),
        stream_petrel: ramp(20, 9.0, 0.1),
        stream_containerd: ramp(20, 14.0, 0.1),
        forward_bytes: 256 << 20,
        forward_petrel: ramp(5, 200.0, 5.0),
        forward_containerd: ramp(5, 400.0, 5.0),
        forward_direct: ramp(5, 100.0, 5.0),
    }
}

/// The pull section of the sample run.
pub fn pull() -> PullResults {
    let layer = |source: &str, files: usize, mb: u64| LayerInfo {
        source: source.into(),
        files,
        uncompressed: mb * 3_000_000,
        compressed: mb * 1_000_000,
    };
    PullResults {
        error: Some("sample error | with a bar\nsecond line".into()),
        image: Some(LargeImage {
            layers: vec![
                layer("busybox test image", 0, 1),
                layer("/usr/share", 1200, 10),
                layer("/usr/lib", 300, 0),
            ],
        }),
        build: Duration::from_millis(12_345),
        reference: "127.0.0.1:5000/petrel-bench/large:latest".into(),
        petrel: ramp(5, 1500.0, 50.0),
        reference_total: ramp(5, 2500.0, 50.0),
        skopeo: ramp(5, 1000.0, 20.0),
        umoci: ramp(5, 1500.0, 30.0),
        umoci_sync: ramp(5, 300.0, 10.0),
        petrel_size: 33_000_000,
        petrel_layers: 3,
        create_small: ramp(30, 20.0, 0.2),
        create_large: ramp(30, 21.0, 0.2),
        skopeo_version: "skopeo version 1.9.3".into(),
        umoci_version: "umoci version 0.4.7".into(),
        registry_version: "docker-registry 2.8.2".into(),
    }
}

/// The queue section of the sample run.
pub fn queue() -> QueueResults {
    let depth = |peak: usize, mean: f64| Depth {
        peak,
        mean,
        samples: 1000,
    };
    let run = |runs: usize, base: f64, served: usize, scale: usize| Run {
        runs,
        wall: Duration::from_secs(8),
        user: ramp(400 * runs, base, 0.001),
        front_initial: depth(3 * scale, 0.5 * scale as f64),
        front_resync: depth(2 * scale, 0.25 * scale as f64),
        total_resync: depth(40 * scale, 12.5 * scale as f64),
        storm_served: served,
        storm_max_wait: Duration::from_millis(1500 + served as u64),
        reconcile: ramp(100, 1.05, 0.001),
    };
    QueueResults {
        calm_priority: run(3, 0.05, 0, 1),
        storm_priority: run(3, 0.06, 2000, 1),
        storm_no_reserve: run(1, 0.5, 2000, 2),
        calm_fifo: run(1, 0.05, 0, 1),
        storm_fifo: run(1, 50.0, 2000, 100),
        throughput_priority: Throughput {
            rounds: vec![2.5e6, 2.6e6, 2.4e6],
        },
        throughput_fifo: Throughput {
            rounds: vec![3.0e6, 3.1e6, 2.9e6],
        },
    }
}

/// One idle window of the kubelet figures: `ms` of CPU in 60 s, split
/// kubelet 2 : runtime 2 : shims 1 by schedstat.
fn kubelet_window(ms: u64, kubelet: bool, containers: usize) -> Window {
    let part = ms * 200_000;
    Window {
        wall: Duration::from_secs(60),
        kubelet: kubelet.then(|| cpu(0, 2 * part)),
        runtime: cpu(0, 2 * part),
        shims: cpu(0, part),
        shim_count: containers,
        accounted: (ms != 2).then(|| Duration::from_millis(ms)),
        evented_stream: None,
    }
}

fn series(pleg: Pleg, containers: usize, samples: Samples) -> Series {
    Series {
        pleg: Some(pleg),
        containers,
        samples,
        polls: ramp(20, 0.4, 0.01),
    }
}

fn setup_run(setup: Setup, version: &str) -> SetupRun {
    SetupRun {
        setup,
        runtime_version: version.into(),
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

/// A kubelet setup measured at 10 and 100 containers in both PLEG modes
/// (`petrel node`: its one mode), `base` ms of CPU per window.
fn kubelet_run(setup: Setup, version: &str, base: u64) -> SetupRun {
    let kubelet = setup.is_kubelet();
    let mut r = setup_run(setup, version);
    for (i, size) in [10, 100].into_iter().enumerate() {
        let k = base * (1 + 4 * i as u64);
        if kubelet {
            r.windows
                .push((size, Pleg::Generic, kubelet_window(k, true, size)));
        }
        let mut e = kubelet_window(k * 9 / 10, kubelet, size);
        if kubelet {
            e.evented_stream = Some(if i == 0 { (1.0, 0.0) } else { (2.0, 1.0) });
        }
        r.windows.push((size, Pleg::Evented, e));
        r.ramps.push(Ramp {
            from: [0, 10][i],
            to: size,
            pleg: if kubelet && i == 0 {
                Pleg::Generic
            } else {
                Pleg::Evented
            },
            took: Duration::from_millis(2_000 + 9_000 * i as u64),
        });
    }
    r.memory = Some(MemoryPoint {
        containers: 100,
        kubelet: kubelet.then(|| mem(60_000)),
        runtime: mem(if kubelet { 40_000 } else { 30_000 }),
        shims: (0..100).map(|i| mem(900 + i)).collect(),
        pause: if setup == Setup::KubeletContainerd {
            (0..100).map(|_| mem(400)).collect()
        } else {
            vec![]
        },
    });
    let plegs: &[Pleg] = if kubelet {
        &[Pleg::Generic, Pleg::Evented]
    } else {
        &[Pleg::Evented]
    };
    for (i, p) in plegs.iter().enumerate() {
        let scale = if kubelet { 100.0 * (2 - i) as f64 } else { 5.0 };
        r.exits
            .push(series(*p, 100, ramp(20, scale, scale / 100.0)));
        r.starts
            .push(series(*p, 100, ramp(20, 2.0 * scale, scale / 50.0)));
    }
    if kubelet {
        r.adoptions = vec![
            KubeletAdoption {
                before: 10,
                kept: 10,
                new: 0,
                took: Duration::from_millis(1_500),
            },
            KubeletAdoption {
                before: 100,
                kept: 99,
                new: 1,
                took: Duration::from_millis(4_200),
            },
        ];
    }
    r
}

/// The kubelet section of a sample run: every setup measured, containerd
/// 1.7 stopped after its first size.
pub fn kubelet() -> KubeletResults {
    let mut kp = kubelet_run(Setup::KubeletPetrel, "0.1.0", 100);
    kp.warnings
        .push("runtime `petrel` is not tested | here\nsecond line".into());
    let mut c17 = kubelet_run(Setup::KubeletContainerd17, "1.7.24~ds1", 150);
    c17.windows.retain(|(s, _, _)| *s == 10);
    c17.memory = None;
    c17.exits.clear();
    c17.starts.clear();
    c17.skipped
        .push("100 containers: not all running after 300 s".into());
    c17.error = Some("kubelet exited: `status 1`\nmore".into());
    KubeletResults {
        runs: vec![
            kubelet_run(Setup::PetrelNode, "", 3),
            kp,
            kubelet_run(Setup::KubeletContainerd, "v2.4.2", 120),
            c17,
        ],
        kubelet_version: "Kubernetes v1.37.2".into(),
        critest: Critest {
            source: "build/conformance/summary.md (2026-01-01)".into(),
            table: Some(
                "| runtime | passed | failed | skipped |\n|---|---|---|---|\n| petrel | 80 | 2 | 5 |\n| containerd v2.4.2 | 82 | 0 | 5 |\n"
                    .into(),
            ),
            missing: None,
        },
        sizes: vec![10, 100],
        idle_seconds: 60,
        exits: 20,
        starts: 20,
        ramp_timeout: Duration::from_secs(300),
        error: None,
    }
}

/// The kubelet section of a run cut short: `petrel node` measured at one
/// size only, kubelet + containerd stopped before any figure, no critest
/// counts.
pub fn kubelet_partial() -> KubeletResults {
    let mut node = kubelet_run(Setup::PetrelNode, "", 3);
    node.windows.retain(|(s, _, _)| *s == 10);
    node.memory = None;
    node.exits.clear();
    let mut c2 = setup_run(Setup::KubeletContainerd, "");
    c2.error = Some("containerd did not start | in 30 s\nits log: ...".into());
    KubeletResults {
        runs: vec![node, c2],
        kubelet_version: String::new(),
        critest: Critest {
            source: String::new(),
            table: None,
            missing: Some("no build/conformance/summary.md (`make conformance`)".into()),
        },
        sizes: vec![10],
        idle_seconds: 5,
        exits: 4,
        starts: 4,
        ramp_timeout: Duration::from_secs(60),
        error: None,
    }
}

/// A whole sample run: the runtime's figures and the agent's; the other
/// sections as they are before they measured anything.
pub fn results() -> Results {
    let up = ["RunPodSandbox", "CreateContainer", "StartContainer"];
    let down = [
        "StopContainer",
        "RemoveContainer",
        "StopPodSandbox",
        "RemovePodSandbox",
    ];
    let mut r = Results {
        fsync: ramp(10, 1.0, 0.1),
        up: lifecycle(&up, &["runc create", "runc start"], 50.0),
        down: lifecycle(&down, &["runc kill", "wait", "runc delete"], 40.0),
        memory: Memory {
            containers: 100,
            shims: (0..100).map(|i| mem(900 + i)).collect(),
            shims_parented: 0,
            runtime: mem(20_000),
            inits: (0..100).map(|_| mem(300)).collect(),
            sleep: mem(1_000),
        },
        idle: Idle {
            wall: Duration::from_secs(60),
            runtime: cpu(1, 1_000_000),
            shims: cpu(0, 500_000),
            shim_count: 100,
            sleep: cpu(0, 10_000),
            ticks_per_second: 100,
        },
        lists: [100, 1000]
            .iter()
            .map(|&n| ListRound {
                containers: n,
                version: ramp(50, 0.1, 0.001),
                list_containers: ramp(50, 0.2 * n as f64 / 100.0, 0.002),
                list_pods: ramp(50, 0.15, 0.001),
                response_bytes: 300 * n,
                encode: ramp(50, 0.01, 0.0),
                decode: ramp(50, 0.02, 0.0),
                free: ramp(50, 0.005, 0.0),
                runtime_side: [
                    Some(Duration::from_micros(5)),
                    Some(Duration::from_micros(50)),
                    None,
                ],
            })
            .collect(),
        scale: Scale {
            containers: 1000,
            create: ramp(900, 20.0, 0.01),
            start: ramp(900, 15.0, 0.01),
            runtime: mem(25_000),
            shims: (0..1000).map(|_| mem(950)).collect(),
        },
        exits: Exits {
            petrel: ramp(300, 1.0, 0.01),
            kernel: ramp(300, 0.1, 0.001),
            to_reaped: ramp(300, 0.3, 0.001),
            to_published: ramp(300, 0.4, 0.001),
            to_received: ramp(300, 0.2, 0.001),
        },
        shims_left: 0,
        runtime_after: mem(18_000),
        load_after: "1.00 0.50 0.25".into(),
        ..Default::default()
    };
    r.queue = Some(queue());
    r.agent = Some(agent());
    r.pull = Some(pull());
    r.net = Some(net());
    r.nri = Some(nri());
    r.eviction = Some(eviction());
    r.kubelet = Some(Default::default());
    r.critest = Some(critest());
    r.controller = Some(controller());
    r.vm = Some(vm());
    r
}

/// One guest's P38-P39: Petrel's up `up` ms against raw runc's 100 ms,
/// its down 60 ms against 40, the stop call `reaction` ms after the
/// crossing.
fn vm_run(cgroup: &str, up: f64, reaction: f64) -> crate::vm_bench::GuestRun {
    use crate::vm_bench::{Direction, GuestRun};
    let steps = |names: &[&str], base: f64| {
        names
            .iter()
            .map(|n| (n.to_string(), ramp(24, base, 0.5)))
            .collect()
    };
    let mut reaction_figures = crate::eviction::GuestReaction {
        stop: ramp(10, reaction, 5.0),
        decision: ramp(10, reaction - 1.0, 5.0),
        early_stops: 0,
        realtime_stamps: 10,
        hog_peak: Some(230 << 20),
        ..Default::default()
    };
    if cgroup == "v2" {
        reaction_figures.windows = ramp(10, 1.1, 0.01);
    }
    GuestRun {
        cgroup: cgroup.into(),
        boot: Some(Duration::from_millis(6_500)),
        kernel: "6.1.0-50-amd64".into(),
        host_load: ("1.00 0.80 0.70".into(), "1.10 0.90 0.75".into()),
        guest_load: ("0.20 0.05 0.01".into(), "2.50 1.20 0.40".into()),
        up: Direction {
            petrel: ramp(24, up, 1.0),
            raw: ramp(24, 100.0, 1.0),
            steps: steps(
                &["RunPodSandbox", "CreateContainer", "StartContainer"],
                up / 3.0,
            ),
        },
        down: Direction {
            petrel: ramp(24, 60.0, 1.0),
            raw: ramp(24, 40.0, 1.0),
            steps: steps(&["StopContainer", "RemoveContainer"], 30.0),
        },
        reaction: reaction_figures,
        error: None,
    }
}

/// P38-P39 in both guests, v2 within its goals.
pub fn vm() -> crate::vm_bench::VmResults {
    crate::vm_bench::VmResults {
        pods: 24,
        rounds: 10,
        runs: vec![vm_run("v2", 110.0, 150.0), vm_run("v1", 108.0, 20.0)],
        error: None,
    }
}

/// `n` samples from `base` ms, 0.5 ms apart.
fn latency_samples(n: usize, base: f64) -> crate::stats::Samples {
    let mut s = crate::stats::Samples::default();
    for i in 0..n {
        s.push(Duration::from_secs_f64((base + i as f64 * 0.5) / 1e3));
    }
    s
}

/// The controller kit beside controller-runtime, every figure present.
pub fn controller() -> crate::controller_bench::ControllerResults {
    use crate::controller_bench::{ControllerResults, Handoff, ImplRun};
    let run = |name: &str, quiet: f64, storm: f64, depth: f64, rss: u64| ImplRun {
        name: name.into(),
        quiet: latency_samples(1000, quiet),
        storm: latency_samples(1800, storm),
        quiet_patch: latency_samples(1000, 1.5),
        storm_patch: latency_samples(1800, 1.6),
        storm_unserved: 0,
        storm_slowest: vec![(Duration::from_millis(20_400), Duration::from_millis(31))],
        drained_after: Some(Duration::from_secs(31)),
        depth_mean: depth,
        depth_max: depth * 3.0,
        depth_samples: 450,
        rss_small_kib: Some(rss),
        rss_full_kib: Some(rss + 20_000),
        idle_requests_per_min: Some(30.0),
        error: None,
    };
    let handoff = |name: &str, g: f64| Handoff {
        name: name.into(),
        graceful: latency_samples(5, g),
        crash: latency_samples(3, 4200.0),
        error: None,
    };
    ControllerResults {
        objects: 10_000,
        runs: vec![
            run("Petrel", 2.0, 2.1, 0.1, 9_000),
            run("Petrel, one FIFO", 2.0, 9.0, 500.0, 9_000),
            run("controller-runtime", 3.0, 6.0, 2.0, 40_000),
        ],
        handoffs: vec![
            handoff("Petrel", 120.0),
            handoff("controller-runtime", 300.0),
        ],
        controller_runtime_version: "v0.25.2".into(),
        error: None,
    }
}

/// One operation's samples, `ms` apart from `base` ms.
fn bench_op(name: &str, n: usize, base: f64) -> petrel_testkit::critest_bench::Operation {
    petrel_testkit::critest_bench::Operation {
        name: name.into(),
        samples: (0..n)
            .map(|i| Duration::from_secs_f64((base + i as f64 * 0.1) / 1e3))
            .collect(),
    }
}

/// A critest benchmark run of `name` with every operation `scale` times
/// the base figures.
fn bench_run(name: &str, scale: f64, seconds: f64) -> petrel_testkit::critest_bench::BenchRun {
    let ops = [
        ("CreatePod", 40.0),
        ("StatusPod", 0.5),
        ("StopPod", 20.0),
        ("RemovePod", 5.0),
        ("CreateContainer", 15.0),
        ("StartContainer", 30.0),
    ];
    petrel_testkit::critest_bench::BenchRun {
        name: name.into(),
        operations: ops
            .iter()
            .map(|(n, ms)| bench_op(n, 5, ms * scale))
            .collect(),
        specs: vec![],
        critest_seconds: seconds,
    }
}

/// P28 with Petrel faster on all but one operation.
pub fn critest() -> crate::critest_bench::CritestBenchResults {
    let mut petrel = bench_run("petrel", 0.5, 30.0);
    petrel.operations[1] = bench_op("StatusPod", 5, 0.9);
    crate::critest_bench::CritestBenchResults {
        params: petrel_testkit::critest_bench::BenchParams {
            pods: 5,
            containers: 5,
            images: 2,
            parallel: 1,
        },
        petrel: Ok(petrel),
        containerd: Ok(bench_run("containerd", 1.0, 60.0)),
        containerd_version: "v2.4.2".into(),
        critest_version: "1.37.0".into(),
    }
}

/// One cluster stack's run: `base` ms of P33's median, `cpu_ms` of idle
/// CPU, `rss` KiB of its runtime process.
fn cluster_run(setup: Setup, version: &str, base: f64, cpu_ms: u64, rss: u64) -> StackRun {
    use crate::cluster_bench::{Burst, IdleNode};
    let kubelet = setup.is_kubelet();
    StackRun {
        setup,
        runtime_version: version.into(),
        node: format!("bench-{}-0a1b2c3d", setup.tag()),
        ready_after: Some(Duration::from_millis(4_000 + base as u64)),
        starts: ramp(30, base, base / 100.0),
        creates: ramp(30, 8.0, 0.1),
        burst: Some(Burst {
            pods: 100,
            sent: Duration::from_millis(900),
            all_running: Duration::from_millis(base as u64 * 40),
        }),
        deleted: Some((31, Duration::from_millis(base as u64 * 5))),
        idle: Some(IdleNode {
            pods: 100,
            window: kubelet_window(cpu_ms, kubelet, 100),
            requests: if kubelet { 70 } else { 12 },
            memory: MemoryPoint {
                containers: 100,
                kubelet: kubelet.then(|| mem(70_000)),
                runtime: mem(rss),
                shims: (0..100).map(|i| mem(900 + i)).collect(),
                pause: if setup == Setup::KubeletContainerd {
                    (0..100).map(|_| mem(400)).collect()
                } else {
                    vec![]
                },
            },
        }),
        objects: (setup != Setup::KubeletPetrel).then(|| {
            crate::cluster_objects_bench::ObjectsRun {
                pods: 10,
                config_map: ramp(10, base / 2.0, base / 100.0),
                secret: ramp(10, base / 2.0 + 10.0, base / 100.0),
                missed: 0,
                requests: if kubelet { 90 } else { 13 },
                wall: Duration::from_secs(60),
            }
        }),
        skipped: vec![],
        error: None,
    }
}

/// The cluster figures of every stack.
pub fn cluster() -> ClusterResults {
    ClusterResults {
        runs: vec![
            cluster_run(Setup::PetrelNode, "petrel 0.1.0", 300.0, 30, 45_000),
            cluster_run(Setup::KubeletContainerd, "v2.4.2", 1_200.0, 30_000, 50_000),
            cluster_run(Setup::KubeletPetrel, "petrel 0.1.0", 1_000.0, 9_000, 30_000),
        ],
        kubelet_version: "Kubernetes v1.37.2".into(),
        starts: 30,
        burst: 100,
        idle_seconds: 60,
        error: None,
    }
}

/// The cluster figures with the reference stopped part-way and the last
/// stack skipped.
pub fn cluster_partial() -> ClusterResults {
    let mut r = cluster();
    let c = &mut r.runs[1];
    c.burst = None;
    c.idle = None;
    c.error = Some("100 pods running: not within 300 s | here\nkubelet log".into());
    let kp = &mut r.runs[2];
    *kp = StackRun {
        starts: Samples::default(),
        creates: Samples::default(),
        ready_after: None,
        burst: None,
        deleted: None,
        idle: None,
        objects: None,
        skipped: vec!["the whole stack: kubelet left out (PETREL_PEERS_SKIP)".into()],
        ..kp.clone()
    };
    r
}
