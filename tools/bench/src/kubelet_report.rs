//! P23-P27 in docs/PERFORMANCE.md: the summary rows and the sections.

use std::fmt::Write;
use std::time::Duration;

use crate::kubelet::{
    setup_name, KubeletResults, MemoryPoint, Pleg, Series, Setup, SetupRun, Window, GAP, IMAGE,
    JITTER, POLL_GAP, SETTLE,
};
use crate::stats::{ms, one_line, ratio, verdict};

/// Seed 000 (iSulad with evented PLEG, busybox containers): steady-state
/// CPU reduction of iSulad and of kubelet against the generic PLEG, %.
const SEED: [(usize, f64, f64); 3] = [(10, 30.5, 11.0), (50, 27.5, 10.4), (100, 28.5, 10.1)];
/// The size the goals are stated at.
const GOAL_SIZE: usize = 100;
/// P24: Petrel's node against kubelet + containerd 2.x, idle CPU.
const NODE_CPU_GOAL: f64 = 0.1;
/// P25: the same, memory.
const NODE_MEMORY_GOAL: f64 = 0.25;
/// P27: Petrel's node p99 against kubelet's in evented mode.
const EXIT_P99_GOAL: f64 = 0.1;

/// The reference of P24-P27: kubelet on containerd 2.x.
const REFERENCE: Setup = Setup::KubeletContainerd;

fn name(r: &SetupRun) -> String {
    setup_name(r.setup, &r.runtime_version)
}

fn ms_f(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn sched_ms(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e6)
}

/// 1 − a/b in percent.
fn reduction(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| (1.0 - a / b) * 100.0)
}

/// A reduction as seed 000 writes it: "28.5 %" for less, "+3.0 %" (more
/// CPU) when evented used more.
fn red_cell(v: Option<f64>) -> String {
    match v {
        None => "—".to_string(),
        Some(v) if v >= 0.0 => format!("−{v:.1} %"),
        Some(v) => format!("+{:.1} %", -v),
    }
}

/// The largest size at which both runs have a window (in `pleg_b` for
/// `b`).
fn common_size(a: &SetupRun, b: &SetupRun, pleg_b: Pleg) -> Option<usize> {
    a.windows
        .iter()
        .map(|(s, _, _)| *s)
        .filter(|s| b.window(*s, pleg_b).is_some())
        .max()
}

fn not_measured(o: &mut String, id: &str, what: &str, why: &str) -> std::fmt::Result {
    writeln!(
        o,
        "| {id} | {what} | — | not measured: {} | — | — | — |",
        one_line(why)
    )
}

/// Why `run` (or the whole section) has no figure.
fn why(r: &KubeletResults, run: Option<&SetupRun>, what: &str) -> String {
    if let Some(e) = &r.error {
        return e.clone();
    }
    match run {
        None => format!("{what} was not run (--kubelet-setups)"),
        Some(run) => run
            .error
            .clone()
            .or_else(|| run.skipped.first().cloned())
            .unwrap_or_else(|| "the run stopped before this figure".to_string()),
    }
}

/// The rows of P23-P27 in the summary table.
pub fn summary_rows(o: &mut String, r: &KubeletResults) -> std::fmt::Result {
    for setup in [
        Setup::KubeletPetrel,
        Setup::KubeletContainerd,
        Setup::KubeletContainerd17,
    ] {
        let run = r.run(setup);
        let label = format!(
            "Steady-state CPU of kubelet + runtime + shims, evented against generic PLEG ({})",
            run.map(name).unwrap_or_else(|| setup_name(setup, ""))
        );
        let Some(run) = run.filter(|x| !x.windows.is_empty()) else {
            not_measured(o, "P23", &label, &why(r, run, &setup_name(setup, "")))?;
            continue;
        };
        let mut cells = vec![];
        for s in sizes(run) {
            if let (Some(g), Some(e)) = (run.window(s, Pleg::Generic), run.window(s, Pleg::Evented))
            {
                cells.push(format!(
                    "{s}: {:.3} → {:.3} % of a core ({})",
                    g.percent(),
                    e.percent(),
                    red_cell(reduction(e.total().as_secs_f64(), g.total().as_secs_f64()))
                ));
            }
        }
        if cells.is_empty() {
            not_measured(o, "P23", &label, &why(r, Some(run), &label))?;
            continue;
        }
        writeln!(
            o,
            "| P23 | {label} | — (seed 000's table, reproduced) | {} | published (seed 000): kubelet −11.0 / −10.4 / −10.1 %, iSulad −30.5 / −27.5 / −28.5 % at 10 / 50 / 100 containers | see P23 | — |",
            cells.join("; ")
        )?;
    }
    let node = r.run(Setup::PetrelNode);
    let reference = r.run(REFERENCE);
    match (node, reference) {
        (Some(n), Some(c)) if common_size(n, c, Pleg::Generic).is_some() => {
            let s = common_size(n, c, Pleg::Generic).unwrap_or(0);
            let (nw, cg) = (n.window(s, Pleg::Evented), c.window(s, Pleg::Generic));
            if let (Some(nw), Some(cg)) = (nw, cg) {
                let ce = c.window(s, Pleg::Evented);
                let q = nw.total().as_secs_f64() / cg.total().as_secs_f64().max(1e-12);
                writeln!(
                    o,
                    "| P24 | Whole node idle CPU at {s} containers: `petrel node` against kubelet + containerd | ≤ {NODE_CPU_GOAL}× kubelet + containerd (default, generic PLEG) at {GOAL_SIZE} containers | {:.3} % of a core ({} ms in {:.0} s) | {}: generic {:.3} %, evented {} | {:.3}× generic{} | {} |",
                    nw.percent(),
                    ms_f(nw.total()),
                    nw.wall.as_secs_f64(),
                    name(c),
                    cg.percent(),
                    ce.map(|w| format!("{:.3} %", w.percent())).unwrap_or_else(|| "—".into()),
                    q,
                    ce.map(|w| format!(", {:.3}× evented", nw.total().as_secs_f64() / w.total().as_secs_f64().max(1e-12))).unwrap_or_default(),
                    goal_verdict(s, q <= NODE_CPU_GOAL)
                )?;
            }
        }
        _ => not_measured(
            o,
            "P24",
            "Whole node idle CPU: `petrel node` against kubelet + containerd",
            &why(
                r,
                node.filter(|n| n.windows.is_empty() || n.error.is_some())
                    .or(reference),
                "a setup",
            ),
        )?,
    }
    match (
        node.and_then(|n| n.memory.as_ref()),
        reference.and_then(|c| c.memory.as_ref()),
    ) {
        (Some(nm), Some(cm)) => {
            let (nr, np) = nm.sum();
            let (cr, cp) = cm.sum();
            let q = nr as f64 / cr.max(1) as f64;
            let size = nm.containers.min(cm.containers);
            writeln!(
                o,
                "| P25 | Whole node memory at {} containers: `petrel node` + shims against kubelet + containerd + shims | ≤ {NODE_MEMORY_GOAL}× kubelet + containerd's RSS at {GOAL_SIZE} containers | RSS {}, PSS {} ({} processes) | {}: RSS {}, PSS {} ({} processes; its {} pause containers add RSS {}) | RSS {:.3}×, PSS {:.3}× | {} |",
                nm.containers,
                mib(nr),
                mib(np),
                1 + nm.shims.len(),
                reference.map(name).unwrap_or_default(),
                mib(cr),
                mib(cp),
                2 + cm.shims.len(),
                cm.pause.len(),
                mib(cm.pause.iter().map(|m| m.rss_kib).sum()),
                q,
                np as f64 / cp.max(1) as f64,
                goal_verdict(size, q <= NODE_MEMORY_GOAL)
            )?;
        }
        _ => not_measured(
            o,
            "P25",
            "Whole node memory: `petrel node` against kubelet + containerd",
            &why(
                r,
                node.filter(|n| n.memory.is_none()).or(reference),
                "a setup",
            ),
        )?,
    }
    let n_start = node.and_then(|n| n.starts_in(Pleg::Evented));
    let c_start = reference.and_then(|c| c.starts_in(Pleg::Evented));
    match (n_start, c_start) {
        (Some(ns), Some(cs)) => writeln!(
            o,
            "| P26 | Manifest written → container running at `/pods`: `petrel node` against kubelet (evented) + containerd | — (figure for comparison) | p50 {} ms, p99 {} ms ({} pods) | {} evented: p50 {} ms, p99 {} ms; generic: {} | p50 {}×, p99 {}× | — |",
            ms(ns.samples.p50()),
            ms(ns.samples.p99()),
            ns.samples.len(),
            reference.map(name).unwrap_or_default(),
            ms(cs.samples.p50()),
            ms(cs.samples.p99()),
            reference
                .and_then(|c| c.starts_in(Pleg::Generic))
                .map(|g| format!("p50 {} ms, p99 {} ms", ms(g.samples.p50()), ms(g.samples.p99())))
                .unwrap_or_else(|| "—".into()),
            ratio(ns.samples.p50(), cs.samples.p50()),
            ratio(ns.samples.p99(), cs.samples.p99()),
        )?,
        _ => not_measured(
            o,
            "P26",
            "Manifest written → container running: `petrel node` against kubelet + containerd",
            &why(r, node.filter(|n| n_start.is_none() && n.error.is_some()).or(reference), "a setup"),
        )?,
    }
    let n_exit = node.and_then(|n| n.exits_in(Pleg::Evented));
    let c_exit = reference.and_then(|c| c.exits_in(Pleg::Evented));
    match (n_exit, c_exit) {
        (Some(ne), Some(ce)) => {
            let q = ne.samples.p99().as_secs_f64() / ce.samples.p99().as_secs_f64().max(1e-12);
            writeln!(
                o,
                "| P27 | Container exit → terminated at `/pods` at {} containers: `petrel node` against kubelet (evented) + containerd | p99 ≤ {EXIT_P99_GOAL}× kubelet's in evented mode | p50 {} ms, p99 {} ms ({} exits) | {} evented: p50 {} ms, p99 {} ms; generic: {} | p50 {}×, p99 {:.2}× | {} |",
                ne.containers,
                ms(ne.samples.p50()),
                ms(ne.samples.p99()),
                ne.samples.len(),
                reference.map(name).unwrap_or_default(),
                ms(ce.samples.p50()),
                ms(ce.samples.p99()),
                reference
                    .and_then(|c| c.exits_in(Pleg::Generic))
                    .map(|g| format!("p50 {} ms, p99 {} ms", ms(g.samples.p50()), ms(g.samples.p99())))
                    .unwrap_or_else(|| "—".into()),
                ratio(ne.samples.p50(), ce.samples.p50()),
                q,
                goal_verdict(ne.containers.min(ce.containers), q <= EXIT_P99_GOAL)
            )?;
        }
        _ => not_measured(
            o,
            "P27",
            "Container exit → terminated at `/pods`: `petrel node` against kubelet + containerd",
            &why(
                r,
                node.filter(|n| n_exit.is_none() && n.error.is_some())
                    .or(reference),
                "a setup",
            ),
        )?,
    }
    Ok(())
}

/// A verdict where the goal's size was reached; a plain note elsewhere.
fn goal_verdict(size: usize, pass: bool) -> &'static str {
    if size >= GOAL_SIZE {
        verdict(pass)
    } else {
        "— (goal stated at 100 containers)"
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The sizes with windows, ascending.
fn sizes(run: &SetupRun) -> Vec<usize> {
    let mut v: Vec<usize> = run.windows.iter().map(|(s, _, _)| *s).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The sections of P23-P27 and the critest counts.
pub fn sections(o: &mut String, r: &KubeletResults) -> std::fmt::Result {
    writeln!(
        o,
        "## P23-P27 The real kubelet beside Petrel ({})",
        if r.kubelet_version.is_empty() {
            "kubelet from `make peers`"
        } else {
            r.kubelet_version.as_str()
        }
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** Four node stacks run one after the other, each on its own CNI bridge network, directories, ports and cgroups (`/petrel-bench-<id>/…`), all started by the test kit (crates/testkit): `petrel node` (agent and runtime in one process, `--pleg events`); the real kubelet, standalone (static pods from its `staticPodPath`, no API server, the kit's KubeletConfiguration with kubelet's default log verbosity), on `petrel runtime`, on containerd 2.x (`make peers`) and on containerd 1.7 (`make containerd`). All use the same OCI runtime (`runc` from PATH) and the same pods: one container per pod, `{IMAGE}` (the conformance kit's busybox, pulled once by each runtime from the kit's read-only registry through its mirror configuration) running `sleep 86400`, `restartPolicy: Always`. For each size in {:?}, the bench writes the missing manifests (renamed into place whole) and waits until every pod shows its container running at `/pods` (timeout {} s: past it the setup's larger sizes are skipped, said below), then waits {} s and measures a {} s window with nothing happening; kubelet is then restarted in the other PLEG mode (generic ↔ `EventedPLEG=true`; its pods are adopted, checked by container id), {} s more, and a second window. The modes alternate in order from size to size (generic first at the first size). A window's CPU is that of kubelet (or none: `petrel node`'s agent is in the runtime process) + the runtime process + all its shims (containerd's pause containers are containers and not counted), by the CPU accounting of a cpuacct cgroup they are moved into for the window (children they fork included); per process by schedstat beside it.",
        r.sizes,
        r.ramp_timeout.as_secs(),
        SETTLE.as_secs(),
        r.idle_seconds,
        SETTLE.as_secs()
    )?;
    writeln!(o)?;
    if let Some(e) = &r.error {
        writeln!(
            o,
            "The section did not run: `{}`.",
            one_line(e).replace('`', "'")
        )?;
        writeln!(o)?;
    }
    p23(o, r)?;
    p24(o, r)?;
    p25(o, r)?;
    p26_p27(o, r)?;
    notes(o, r)?;
    critest(o, r)
}

fn p23(o: &mut String, r: &KubeletResults) -> std::fmt::Result {
    writeln!(
        o,
        "### P23 Steady-state CPU: generic against evented PLEG (seed 000's table, with kubelet)"
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| setup | containers | PLEG | window s | kubelet ms | runtime ms | shims ms (count) | all by cgroup ms | % of one core |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|---|---|")?;
    for run in &r.runs {
        for (s, p, w) in &run.windows {
            writeln!(
                o,
                "| {} | {s} | {} | {:.1} | {} | {} | {} ({}) | {} | {:.3} |",
                name(run),
                pleg_name(run.setup, *p),
                w.wall.as_secs_f64(),
                w.kubelet
                    .map(|c| sched_ms(c.sched_ns))
                    .unwrap_or_else(|| "—".into()),
                sched_ms(w.runtime.sched_ns),
                sched_ms(w.shims.sched_ns),
                w.shim_count,
                w.accounted.map(ms_f).unwrap_or_else(|| "—".into()),
                w.percent()
            )?;
        }
    }
    writeln!(o)?;
    writeln!(
        o,
        "Change from the generic to the evented PLEG (negative: evented used less), as seed 000's table gives it for iSulad and kubelet; the runtime side is the runtime process and its shims, by schedstat, the total by the cgroup:"
    )?;
    writeln!(o)?;
    let kubelets: Vec<&SetupRun> = r
        .runs
        .iter()
        .filter(|x| x.setup.is_kubelet() && !x.windows.is_empty())
        .collect();
    let mut head = "| busybox containers | seed 000: iSulad | seed 000: kubelet |".to_string();
    let mut rule = "|---|---|---|".to_string();
    for k in &kubelets {
        let n = name(k);
        let _ = write!(head, " {n}: runtime + shims | {n}: kubelet | {n}: all |");
        rule.push_str("---|---|---|");
    }
    writeln!(o, "{head}")?;
    writeln!(o, "{rule}")?;
    let mut all: Vec<usize> = r.sizes.clone();
    for (s, _, _) in SEED {
        if !all.contains(&s) {
            all.push(s);
        }
    }
    all.sort_unstable();
    for s in all {
        let seed = SEED.iter().find(|(n, _, _)| *n == s);
        let mut row = format!(
            "| {s} | {} | {} |",
            seed.map(|x| format!("−{:.1} %", x.1))
                .unwrap_or_else(|| "—".into()),
            seed.map(|x| format!("−{:.1} %", x.2))
                .unwrap_or_else(|| "—".into())
        );
        for k in &kubelets {
            match (k.window(s, Pleg::Generic), k.window(s, Pleg::Evented)) {
                (Some(g), Some(e)) => {
                    let side = |w: &Window| (w.runtime.sched_ns + w.shims.sched_ns) as f64;
                    let kub = |w: &Window| w.kubelet.map(|c| c.sched_ns).unwrap_or(0) as f64;
                    let _ = write!(
                        row,
                        " {} | {} | {} |",
                        red_cell(reduction(side(e), side(g))),
                        red_cell(reduction(kub(e), kub(g))),
                        red_cell(reduction(e.total().as_secs_f64(), g.total().as_secs_f64()))
                    );
                }
                _ => row.push_str(" — | — | — |"),
            }
        }
        writeln!(o, "{row}")?;
    }
    writeln!(o)?;
    Ok(())
}

fn pleg_name(setup: Setup, p: Pleg) -> &'static str {
    match (setup, p) {
        (Setup::PetrelNode, _) => "events (`petrel node`)",
        (_, Pleg::Generic) => "generic",
        (_, Pleg::Evented) => "evented",
    }
}

fn p24(o: &mut String, r: &KubeletResults) -> std::fmt::Result {
    writeln!(
        o,
        "### P24 Idle CPU of the whole node: `petrel node` against kubelet + a runtime"
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "The same windows as P23, total of each stack, % of one core (ratio: `petrel node` / that stack):"
    )?;
    writeln!(o)?;
    let node = r.run(Setup::PetrelNode);
    let others: Vec<&SetupRun> = r
        .runs
        .iter()
        .filter(|x| x.setup.is_kubelet() && !x.windows.is_empty())
        .collect();
    let mut head = "| containers | `petrel node` |".to_string();
    let mut rule = "|---|---|".to_string();
    for k in &others {
        let n = name(k);
        let _ = write!(head, " {n}, generic | {n}, evented |");
        rule.push_str("---|---|");
    }
    writeln!(o, "{head}")?;
    writeln!(o, "{rule}")?;
    let mut all: Vec<usize> = r.runs.iter().flat_map(sizes).collect();
    all.sort_unstable();
    all.dedup();
    for s in all {
        let nw = node.and_then(|n| n.window(s, Pleg::Evented));
        let mut row = format!(
            "| {s} | {} |",
            nw.map(|w| format!("{:.3} %", w.percent()))
                .unwrap_or_else(|| "—".into())
        );
        for k in &others {
            for p in [Pleg::Generic, Pleg::Evented] {
                let cell = match (k.window(s, p), nw) {
                    (Some(w), Some(n)) => format!(
                        "{:.3} % ({:.3}×)",
                        w.percent(),
                        n.total().as_secs_f64() / w.total().as_secs_f64().max(1e-12)
                    ),
                    (Some(w), None) => format!("{:.3} %", w.percent()),
                    _ => "—".into(),
                };
                let _ = write!(row, " {cell} |");
            }
        }
        writeln!(o, "{row}")?;
    }
    writeln!(o)?;
    Ok(())
}

fn p25(o: &mut String, r: &KubeletResults) -> std::fmt::Result {
    writeln!(o, "### P25 Memory of the whole node")?;
    writeln!(o)?;
    writeln!(
        o,
        "At the largest size each stack reached, after its windows: RSS and PSS (`/proc/<pid>/smaps_rollup`) of kubelet, the runtime process and every shim, summed (RSS counts shared pages once per process, so PSS is the fairer sum). containerd's pause containers are containers, shown apart and not summed."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| setup | containers | kubelet RSS | runtime RSS | shims: count, RSS sum (mean) | total RSS | total PSS | pause containers: count, RSS sum |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|---|")?;
    for run in &r.runs {
        let Some(m) = &run.memory else { continue };
        let (rss, pss) = m.sum();
        writeln!(
            o,
            "| {} | {} | {} | {} | {}, {} ({}) | {} | {} | {} |",
            name(run),
            m.containers,
            m.kubelet
                .map(|k| mib(k.rss_kib))
                .unwrap_or_else(|| "— (in the runtime process)".into()),
            mib(m.runtime.rss_kib),
            m.shims.len(),
            mib(shim_sum(m)),
            mib(shim_sum(m) / (m.shims.len().max(1) as u64)),
            mib(rss),
            mib(pss),
            if m.pause.is_empty() {
                "—".to_string()
            } else {
                format!(
                    "{}, {}",
                    m.pause.len(),
                    mib(m.pause.iter().map(|p| p.rss_kib).sum())
                )
            }
        )?;
    }
    writeln!(o)?;
    Ok(())
}

fn shim_sum(m: &MemoryPoint) -> u64 {
    m.shims.iter().map(|s| s.rss_kib).sum()
}

fn series_row(o: &mut String, run: &SetupRun, s: &Series) -> std::fmt::Result {
    let p = s.pleg.map(|p| pleg_name(run.setup, p)).unwrap_or("—");
    writeln!(
        o,
        "| {} | {p} | {} | {} | {} | {} | {} | {} | {} |",
        name(run),
        s.containers,
        s.samples.len(),
        ms(s.samples.p50()),
        ms(s.samples.p99()),
        ms(s.samples.max()),
        ms(s.samples.mean()),
        ms(s.polls.p50())
    )
}

fn p26_p27(o: &mut String, r: &KubeletResults) -> std::fmt::Result {
    writeln!(o, "### P26 Manifest written → container running at `/pods`")?;
    writeln!(o)?;
    writeln!(
        o,
        "After the exits (P27), in each mode: {} new pods one after the other, each after {} ms + a random 0-{} ms of quiet; from the manifest's rename into the manifest directory to the first answer of `/pods` showing its container running. `/pods` is polled with a GET every {} ms (kubelet: its read-only port on 127.0.0.1, the whole pod list; `petrel node`: the agent's unix socket, the same list): the last column is the GET's own round trip, the figures' resolution.",
        r.starts,
        GAP.as_millis(),
        JITTER.as_millis(),
        POLL_GAP.as_millis()
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| setup | PLEG | containers before | n | p50 ms | p99 ms | max ms | mean ms | `/pods` GET p50 ms |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|---|---|")?;
    for run in &r.runs {
        for s in &run.starts {
            series_row(o, run, s)?;
        }
    }
    writeln!(o)?;
    writeln!(
        o,
        "Batches: manifests of a whole size step written at once → every pod running at `/pods` (each stack's first batch includes pulling the image, and containerd's its pause image):"
    )?;
    writeln!(o)?;
    writeln!(o, "| setup | pods | PLEG | took s |")?;
    writeln!(o, "|---|---|---|---|")?;
    for run in &r.runs {
        for ramp in &run.ramps {
            writeln!(
                o,
                "| {} | {} → {} | {} | {:.1} |",
                name(run),
                ramp.from,
                ramp.to,
                pleg_name(run.setup, ramp.pleg),
                ramp.took.as_secs_f64()
            )?;
        }
    }
    writeln!(o)?;
    writeln!(o, "### P27 Container exit → terminated at `/pods`")?;
    writeln!(o)?;
    writeln!(
        o,
        "At the largest size, {} exits per mode, each of another pod (the modes take disjoint halves of the pods where there are enough; kubelet restarted between them): the bench reads the container's init pid from the runtime (ContainerStatus, verbose), waits {} ms + a random 0-{} ms, kills it (SIGKILL) and times until `/pods` shows the exit (the container terminated, or as the last state of its restarted successor); then it waits for the restart before the next. The pods restart (`restartPolicy: Always`, as most pods do): an agent that shows the exit only once it has restarted the container is timed until then (P11 times the agent on pods that do not restart). Polled as in P26.",
        r.exits,
        GAP.as_millis(),
        JITTER.as_millis()
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| setup | PLEG | containers | n | p50 ms | p99 ms | max ms | mean ms | `/pods` GET p50 ms |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|---|---|")?;
    for run in &r.runs {
        for s in &run.exits {
            series_row(o, run, s)?;
        }
    }
    writeln!(o)?;
    Ok(())
}

fn notes(o: &mut String, r: &KubeletResults) -> std::fmt::Result {
    for run in &r.runs {
        let mut lines = vec![];
        if !run.adoptions.is_empty() {
            let kept: usize = run.adoptions.iter().map(|a| a.kept).sum();
            let before: usize = run.adoptions.iter().map(|a| a.before).sum();
            let new: usize = run.adoptions.iter().map(|a| a.new).sum();
            let slowest = run
                .adoptions
                .iter()
                .map(|a| a.took)
                .max()
                .unwrap_or_default();
            lines.push(format!(
                "{} kubelet restarts: {kept} of {before} running containers kept their id, {new} new; the slowest back to all running in {:.1} s.",
                run.adoptions.len(),
                slowest.as_secs_f64()
            ));
        }
        for w in &run.warnings {
            lines.push(format!(
                "kubelet warned at start: `{}`.",
                one_line(w).replace('`', "'")
            ));
        }
        if run.setup == Setup::KubeletContainerd17 && !run.windows.is_empty() {
            lines.push(format!(
                "kubelet {} accepted containerd {}: it started on it and ran the pods.",
                r.kubelet_version.trim_start_matches("Kubernetes "),
                run.runtime_version
            ));
        }
        let streams: Vec<(f64, f64)> = run
            .windows
            .iter()
            .filter(|(_, p, _)| *p == Pleg::Evented)
            .filter_map(|(_, _, w)| w.evented_stream)
            .collect();
        if run.setup.is_kubelet() && !streams.is_empty() {
            let ok = streams
                .iter()
                .filter(|(c, e)| *c >= 1.0 && *e == 0.0)
                .count();
            let errors: f64 = streams.iter().map(|(_, e)| e).sum();
            lines.push(format!(
                "After {ok} of its {} evented windows kubelet's GetContainerEvents stream was connected without errors{}.",
                streams.len(),
                if errors > 0.0 {
                    format!(" ({errors} connection errors in the others: kubelet falls back to relisting after them)")
                } else {
                    String::new()
                }
            ));
        }
        for s in &run.skipped {
            lines.push(format!("Skipped: {s}."));
        }
        if let Some(e) = &run.error {
            lines.push(format!("Stopped: `{}`.", one_line(e).replace('`', "'")));
        }
        if !lines.is_empty() {
            writeln!(o, "**{}.** {}", name(run), lines.join(" "))?;
            writeln!(o)?;
        }
    }
    Ok(())
}

fn critest(o: &mut String, r: &KubeletResults) -> std::fmt::Result {
    writeln!(
        o,
        "### critest: Petrel's runtime and containerd 2.x side by side"
    )?;
    writeln!(o)?;
    match (&r.critest.table, &r.critest.missing) {
        (Some(t), _) => {
            writeln!(
                o,
                "From {} (`petrel-conformance`: critest with the conformance kit's images, each runtime with its own network, registry mirror and runc; every spec of each run, and those on which they differ, are in `build/conformance/`):",
                r.critest.source
            )?;
            writeln!(o)?;
            o.push_str(t);
            writeln!(o)?;
        }
        (None, Some(why)) => {
            writeln!(o, "Not included: {}.", one_line(why))?;
            writeln!(o)?;
        }
        (None, None) => {
            writeln!(o, "Not included: the section stopped before it.")?;
            writeln!(o)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::kubelet::Window;
    use crate::procfs::{Cpu, Mem};
    use crate::stats::Samples;

    fn window(ms: u64) -> Window {
        Window {
            wall: Duration::from_secs(60),
            kubelet: Some(Cpu {
                ticks: 0,
                sched_ns: ms * 500_000,
            }),
            runtime: Cpu {
                ticks: 0,
                sched_ns: ms * 500_000,
            },
            accounted: Some(Duration::from_millis(ms)),
            ..Default::default()
        }
    }

    fn run(setup: Setup, generic: u64, evented: u64) -> SetupRun {
        let mut r = SetupRun {
            setup,
            runtime_version: "v2.4.2".into(),
            windows: vec![
                (100, Pleg::Generic, window(generic)),
                (100, Pleg::Evented, window(evented)),
            ],
            ramps: vec![],
            memory: Some(MemoryPoint {
                containers: 100,
                kubelet: Some(Mem {
                    rss_kib: 1000,
                    ..Default::default()
                }),
                runtime: Mem {
                    rss_kib: 1000,
                    ..Default::default()
                },
                shims: vec![],
                pause: vec![],
            }),
            exits: vec![],
            starts: vec![],
            adoptions: vec![],
            skipped: vec![],
            warnings: vec![],
            error: None,
        };
        if setup == Setup::PetrelNode {
            r.windows.retain(|(_, p, _)| *p == Pleg::Evented);
            if let Some(m) = r.memory.as_mut() {
                m.kubelet = None;
            }
        }
        let mut s = Samples::default();
        s.push(Duration::from_millis(if setup == Setup::PetrelNode {
            5
        } else {
            100
        }));
        r.exits.push(Series {
            pleg: Some(Pleg::Evented),
            containers: 100,
            samples: s,
            polls: Samples::default(),
        });
        r
    }

    fn results() -> KubeletResults {
        KubeletResults {
            runs: vec![
                run(Setup::PetrelNode, 0, 30),
                run(Setup::KubeletContainerd, 1200, 1000),
            ],
            sizes: vec![100],
            idle_seconds: 60,
            ..Default::default()
        }
    }

    #[test]
    fn red_cell_should_write_less_as_minus_and_more_as_plus() {
        assert_eq!(red_cell(Some(28.5)), "−28.5 %");
        assert_eq!(red_cell(Some(-3.0)), "+3.0 %");
        assert_eq!(red_cell(None), "—");
        assert!((reduction(90.0, 100.0).unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(reduction(1.0, 0.0), None);
    }

    #[test]
    fn summary_should_judge_the_node_against_kubelet_and_containerd() {
        let mut o = String::new();
        summary_rows(&mut o, &results()).unwrap();
        let p24 = o.lines().find(|l| l.starts_with("| P24 ")).unwrap();
        // 30 ms against 1200 ms: 0.025×.
        assert!(p24.contains("0.025× generic"), "{p24}");
        assert!(p24.contains("**PASS**"), "{p24}");
        let p25 = o.lines().find(|l| l.starts_with("| P25 ")).unwrap();
        // 1000 KiB against 2000 KiB: 0.5×, above the goal.
        assert!(p25.contains("RSS 0.500×"), "{p25}");
        assert!(p25.contains("MISS"), "{p25}");
        let p27 = o.lines().find(|l| l.starts_with("| P27 ")).unwrap();
        assert!(p27.contains("p99 0.05×"), "{p27}");
        // The setups not run say so.
        let p23 = o.lines().filter(|l| l.starts_with("| P23 ")).count();
        assert_eq!(p23, 3);
        assert!(
            o.contains("not measured: kubelet + `petrel runtime` was not run"),
            "{o}"
        );
    }

    #[test]
    fn sections_should_show_seed_000_beside_the_measured_change() {
        let mut o = String::new();
        sections(&mut o, &results()).unwrap();
        let row = o
            .lines()
            .find(|l| l.starts_with("| 100 | −28.5 % | −10.1 % |"))
            .unwrap();
        // kubelet + containerd: 1200 → 1000 ms, −16.7 %.
        assert!(row.contains("−16.7 %"), "{row}");
        assert!(o.contains("### critest"), "{o}");
    }
}
