//! P23-P27 in docs/PERFORMANCE.md: the summary rows and the sections,
//! from `templates/kubelet.md`.

use std::time::Duration;

use crate::kubelet::{
    setup_name, KubeletResults, MemoryPoint, Pleg, Series, Setup, SetupRun, Window, GAP, IMAGE,
    JITTER, POLL_GAP, SETTLE,
};
use crate::stats::{ms, one_line, ratio, verdict};
use crate::template::{render, TemplateError, Vars};

/// The rows and sections P23-P27.
const TEMPLATE: &str = include_str!("../templates/kubelet.md");

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

fn pct(w: &Window) -> String {
    format!("{:.3}", w.percent())
}

/// `a / b` of two windows' totals.
fn total_ratio(a: &Window, b: &Window) -> String {
    format!(
        "{:.3}",
        a.total().as_secs_f64() / b.total().as_secs_f64().max(1e-12)
    )
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

fn pleg_name(setup: Setup, p: Pleg) -> &'static str {
    match (setup, p) {
        (Setup::PetrelNode, _) => "events (`petrel node`)",
        (_, Pleg::Generic) => "generic",
        (_, Pleg::Evented) => "evented",
    }
}

/// An error's first line for a code span (backticks made quotes).
fn stopped(e: &str) -> Vars {
    let mut v = Vars::new();
    v.set("first", one_line(e).replace('`', "'"));
    v
}

/// The kubelet setups with windows, for the tables with a column per
/// setup.
fn kubelets(r: &KubeletResults) -> Vec<&SetupRun> {
    r.runs
        .iter()
        .filter(|x| x.setup.is_kubelet() && !x.windows.is_empty())
        .collect()
}

fn setup_vars(run: &SetupRun) -> Vars {
    let mut v = Vars::new();
    v.set("setup", name(run));
    v
}

/// "p50 … ms, p99 … ms" of a series, or "—".
fn p50_p99(s: Option<&Series>) -> String {
    s.map(|g| {
        format!(
            "p50 {} ms, p99 {} ms",
            ms(g.samples.p50()),
            ms(g.samples.p99())
        )
    })
    .unwrap_or_else(|| "—".into())
}

// ---- summary rows ----

/// P23 for each kubelet setup.
fn p23_rows(r: &KubeletResults) -> Vec<Vars> {
    [
        Setup::KubeletPetrel,
        Setup::KubeletContainerd,
        Setup::KubeletContainerd17,
    ]
    .into_iter()
    .map(|setup| {
        let run = r.run(setup);
        let label = format!(
            "Steady-state CPU of kubelet + runtime + shims, evented against generic PLEG ({})",
            run.map(name).unwrap_or_else(|| setup_name(setup, ""))
        );
        let mut v = Vars::new();
        v.set("label", &label);
        let Some(run) = run.filter(|x| !x.windows.is_empty()) else {
            v.flag("measured", false)
                .set("why", one_line(&why(r, run, &setup_name(setup, ""))));
            return v;
        };
        let cells: Vec<String> = sizes(run)
            .into_iter()
            .filter_map(|s| {
                let (g, e) = (run.window(s, Pleg::Generic)?, run.window(s, Pleg::Evented)?);
                Some(format!(
                    "{s}: {} → {} % of a core ({})",
                    pct(g),
                    pct(e),
                    red_cell(reduction(e.total().as_secs_f64(), g.total().as_secs_f64()))
                ))
            })
            .collect();
        v.flag("measured", !cells.is_empty())
            .set("cells", cells.join("; "))
            .set("why", one_line(&why(r, Some(run), &label)));
        v
    })
    .collect()
}

/// P24: the node's idle CPU against the reference's, at the largest size
/// both reached.
fn p24_row(node: Option<&SetupRun>, c: Option<&SetupRun>) -> Option<Vars> {
    let (n, c) = (node?, c?);
    let s = common_size(n, c, Pleg::Generic)?;
    let (nw, cg) = (n.window(s, Pleg::Evented)?, c.window(s, Pleg::Generic)?);
    let ce = c.window(s, Pleg::Evented);
    let q = nw.total().as_secs_f64() / cg.total().as_secs_f64().max(1e-12);
    let mut v = Vars::new();
    v.set("size", s)
        .set("percent", pct(nw))
        .set("cpu_ms", ms_f(nw.total()))
        .set("wall_s", format!("{:.0}", nw.wall.as_secs_f64()))
        .set("reference", name(c))
        .set("generic", pct(cg))
        .set(
            "evented",
            ce.map(|w| format!("{} %", pct(w)))
                .unwrap_or_else(|| "—".into()),
        )
        .set("vs_generic", format!("{q:.3}"))
        .flag("has_evented", ce.is_some())
        .set(
            "vs_evented",
            ce.map(|w| total_ratio(nw, w)).unwrap_or_default(),
        )
        .set("verdict", goal_verdict(s, q <= NODE_CPU_GOAL));
    Some(v)
}

/// P25: the node's memory against the reference's.
fn p25_row(nm: &MemoryPoint, c: &SetupRun, cm: &MemoryPoint) -> Vars {
    let (nr, np) = nm.sum();
    let (cr, cp) = cm.sum();
    let q = nr as f64 / cr.max(1) as f64;
    let mut v = Vars::new();
    v.set("size", nm.containers)
        .set("rss", mib(nr))
        .set("pss", mib(np))
        .set("processes", 1 + nm.shims.len())
        .set("reference", name(c))
        .set("ref_rss", mib(cr))
        .set("ref_pss", mib(cp))
        .set("ref_processes", 2 + cm.shims.len())
        .set("pause", cm.pause.len())
        .set("pause_rss", mib(cm.pause.iter().map(|m| m.rss_kib).sum()))
        .set("rss_ratio", format!("{q:.3}"))
        .set("pss_ratio", format!("{:.3}", np as f64 / cp.max(1) as f64))
        .set(
            "verdict",
            goal_verdict(nm.containers.min(cm.containers), q <= NODE_MEMORY_GOAL),
        );
    v
}

/// P26 and P27: the node's series against the reference's in evented
/// mode (and its generic one beside).
fn series_vs(n: &Series, c: &Series, c_generic: Option<&Series>, reference: &SetupRun) -> Vars {
    let mut v = Vars::new();
    v.set("size", n.containers)
        .set("p50", ms(n.samples.p50()))
        .set("p99", ms(n.samples.p99()))
        .set("count", n.samples.len())
        .set("reference", name(reference))
        .set("ref_p50", ms(c.samples.p50()))
        .set("ref_p99", ms(c.samples.p99()))
        .set("generic", p50_p99(c_generic))
        .set("ratio_p50", ratio(n.samples.p50(), c.samples.p50()));
    v
}

/// Every value of the summary rows.
fn row_vars(v: &mut Vars, r: &KubeletResults) {
    let node = r.run(Setup::PetrelNode);
    let reference = r.run(REFERENCE);
    v.list("p23", p23_rows(r))
        .set("cpu_goal", NODE_CPU_GOAL)
        .set("memory_goal", NODE_MEMORY_GOAL)
        .set("exit_goal", EXIT_P99_GOAL)
        .set("goal_size", GOAL_SIZE);

    v.list("p24", p24_row(node, reference).into_iter().collect())
        .set(
            "p24_why",
            one_line(&why(
                r,
                node.filter(|n| n.windows.is_empty() || n.error.is_some())
                    .or(reference),
                "a setup",
            )),
        );

    let p25 = match (
        node.and_then(|n| n.memory.as_ref()),
        reference.and_then(|c| c.memory.as_ref().map(|m| (c, m))),
    ) {
        (Some(nm), Some((c, cm))) => vec![p25_row(nm, c, cm)],
        _ => vec![],
    };
    v.list("p25", p25).set(
        "p25_why",
        one_line(&why(
            r,
            node.filter(|n| n.memory.is_none()).or(reference),
            "a setup",
        )),
    );

    let n_start = node.and_then(|n| n.starts_in(Pleg::Evented));
    let p26 = match (n_start, reference) {
        (Some(ns), Some(c)) => c
            .starts_in(Pleg::Evented)
            .map(|cs| {
                let mut v = series_vs(ns, cs, c.starts_in(Pleg::Generic), c);
                v.set("ratio_p99", ratio(ns.samples.p99(), cs.samples.p99()));
                v
            })
            .into_iter()
            .collect(),
        _ => vec![],
    };
    v.list("p26", p26).set(
        "p26_why",
        one_line(&why(
            r,
            node.filter(|n| n_start.is_none() && n.error.is_some())
                .or(reference),
            "a setup",
        )),
    );

    let n_exit = node.and_then(|n| n.exits_in(Pleg::Evented));
    let p27 = match (n_exit, reference) {
        (Some(ne), Some(c)) => c
            .exits_in(Pleg::Evented)
            .map(|ce| {
                let q = ne.samples.p99().as_secs_f64() / ce.samples.p99().as_secs_f64().max(1e-12);
                let mut v = series_vs(ne, ce, c.exits_in(Pleg::Generic), c);
                v.set("ratio_p99", format!("{q:.2}")).set(
                    "verdict",
                    goal_verdict(ne.containers.min(ce.containers), q <= EXIT_P99_GOAL),
                );
                v
            })
            .into_iter()
            .collect(),
        _ => vec![],
    };
    v.list("p27", p27).set(
        "p27_why",
        one_line(&why(
            r,
            node.filter(|n| n_exit.is_none() && n.error.is_some())
                .or(reference),
            "a setup",
        )),
    );
}

// ---- sections ----

/// P23's table of windows and its table of changes beside seed 000.
fn p23_vars(v: &mut Vars, r: &KubeletResults) {
    let windows = r
        .runs
        .iter()
        .flat_map(|run| {
            run.windows.iter().map(move |(s, p, w)| {
                let mut x = setup_vars(run);
                x.set("size", s)
                    .set("pleg", pleg_name(run.setup, *p))
                    .set("wall_s", format!("{:.1}", w.wall.as_secs_f64()))
                    .set(
                        "kubelet_ms",
                        w.kubelet
                            .map(|c| sched_ms(c.sched_ns))
                            .unwrap_or_else(|| "—".into()),
                    )
                    .set("runtime_ms", sched_ms(w.runtime.sched_ns))
                    .set("shims_ms", sched_ms(w.shims.sched_ns))
                    .set("shim_count", w.shim_count)
                    .set(
                        "cgroup_ms",
                        w.accounted.map(ms_f).unwrap_or_else(|| "—".into()),
                    )
                    .set("percent", pct(w));
                x
            })
        })
        .collect();
    let kubelets = kubelets(r);
    let mut all: Vec<usize> = r.sizes.clone();
    for (s, _, _) in SEED {
        if !all.contains(&s) {
            all.push(s);
        }
    }
    all.sort_unstable();
    let changes = all
        .into_iter()
        .map(|s| {
            let seed = SEED.iter().find(|(n, _, _)| *n == s);
            let seed_cell = |f: fn(&(usize, f64, f64)) -> f64| {
                seed.map(|x| format!("−{:.1} %", f(x)))
                    .unwrap_or_else(|| "—".into())
            };
            let cells = kubelets
                .iter()
                .map(|k| {
                    let mut c = Vars::new();
                    let side = |w: &Window| (w.runtime.sched_ns + w.shims.sched_ns) as f64;
                    let kub = |w: &Window| w.kubelet.map(|c| c.sched_ns).unwrap_or(0) as f64;
                    let (rs, ks, all) =
                        match (k.window(s, Pleg::Generic), k.window(s, Pleg::Evented)) {
                            (Some(g), Some(e)) => (
                                red_cell(reduction(side(e), side(g))),
                                red_cell(reduction(kub(e), kub(g))),
                                red_cell(reduction(
                                    e.total().as_secs_f64(),
                                    g.total().as_secs_f64(),
                                )),
                            ),
                            _ => ("—".into(), "—".into(), "—".into()),
                        };
                    c.set("runtime_side", rs)
                        .set("kubelet_side", ks)
                        .set("all", all);
                    c
                })
                .collect();
            let mut x = Vars::new();
            x.set("size", s)
                .set("isulad", seed_cell(|x| x.1))
                .set("seed_kubelet", seed_cell(|x| x.2))
                .list("cells", cells);
            x
        })
        .collect();
    v.list("windows", windows)
        .list("kubelets", kubelets.iter().map(|k| setup_vars(k)).collect())
        .list("changes", changes);
}

/// P24's table: each stack's total at each size.
fn p24_vars(v: &mut Vars, r: &KubeletResults) {
    let node = r.run(Setup::PetrelNode);
    let others = kubelets(r);
    let mut all: Vec<usize> = r.runs.iter().flat_map(sizes).collect();
    all.sort_unstable();
    all.dedup();
    let totals = all
        .into_iter()
        .map(|s| {
            let nw = node.and_then(|n| n.window(s, Pleg::Evented));
            let cells = others
                .iter()
                .flat_map(|k| [Pleg::Generic, Pleg::Evented].map(|p| k.window(s, p)))
                .map(|w| {
                    let cell = match (w, nw) {
                        (Some(w), Some(n)) => format!("{} % ({}×)", pct(w), total_ratio(n, w)),
                        (Some(w), None) => format!("{} %", pct(w)),
                        _ => "—".into(),
                    };
                    let mut c = Vars::new();
                    c.set("cell", cell);
                    c
                })
                .collect();
            let mut x = Vars::new();
            x.set("size", s)
                .set(
                    "node",
                    nw.map(|w| format!("{} %", pct(w)))
                        .unwrap_or_else(|| "—".into()),
                )
                .list("cells", cells);
            x
        })
        .collect();
    v.list("others", others.iter().map(|k| setup_vars(k)).collect())
        .list("totals", totals);
}

/// P25's table: each stack's memory.
fn p25_vars(v: &mut Vars, r: &KubeletResults) {
    let memory = r
        .runs
        .iter()
        .filter_map(|run| {
            let m = run.memory.as_ref()?;
            let (rss, pss) = m.sum();
            let shims: u64 = m.shims.iter().map(|s| s.rss_kib).sum();
            let mut x = setup_vars(run);
            x.set("containers", m.containers)
                .set(
                    "kubelet_rss",
                    m.kubelet
                        .map(|k| mib(k.rss_kib))
                        .unwrap_or_else(|| "— (in the runtime process)".into()),
                )
                .set("runtime_rss", mib(m.runtime.rss_kib))
                .set("shims", m.shims.len())
                .set("shims_rss", mib(shims))
                .set("shim_mean", mib(shims / (m.shims.len().max(1) as u64)))
                .set("total_rss", mib(rss))
                .set("total_pss", mib(pss))
                .set(
                    "pause",
                    if m.pause.is_empty() {
                        "—".to_string()
                    } else {
                        format!(
                            "{}, {}",
                            m.pause.len(),
                            mib(m.pause.iter().map(|p| p.rss_kib).sum())
                        )
                    },
                );
            Some(x)
        })
        .collect();
    v.list("memory", memory);
}

/// A row of P26's or P27's table.
fn series_row(run: &SetupRun, s: &Series) -> Vars {
    let mut x = setup_vars(run);
    x.set(
        "pleg",
        s.pleg.map(|p| pleg_name(run.setup, p)).unwrap_or("—"),
    )
    .set("containers", s.containers)
    .set("n", s.samples.len())
    .set("p50", ms(s.samples.p50()))
    .set("p99", ms(s.samples.p99()))
    .set("max", ms(s.samples.max()))
    .set("mean", ms(s.samples.mean()))
    .set("polls", ms(s.polls.p50()));
    x
}

/// P26's and P27's tables.
fn p26_p27_vars(v: &mut Vars, r: &KubeletResults) {
    let rows = |f: fn(&SetupRun) -> &Vec<Series>| -> Vec<Vars> {
        r.runs
            .iter()
            .flat_map(|run| f(run).iter().map(move |s| series_row(run, s)))
            .collect()
    };
    let ramps = r
        .runs
        .iter()
        .flat_map(|run| {
            run.ramps.iter().map(move |ramp| {
                let mut x = setup_vars(run);
                x.set("from", ramp.from)
                    .set("to", ramp.to)
                    .set("pleg", pleg_name(run.setup, ramp.pleg))
                    .set("took_s", format!("{:.1}", ramp.took.as_secs_f64()));
                x
            })
        })
        .collect();
    v.list("start_rows", rows(|run| &run.starts))
        .list("exit_rows", rows(|run| &run.exits))
        .list("ramps", ramps)
        .set("starts", r.starts)
        .set("exits", r.exits)
        .set("gap_ms", GAP.as_millis())
        .set("jitter_ms", JITTER.as_millis())
        .set("poll_ms", POLL_GAP.as_millis());
}

/// The notes on one setup: its restarts, warnings, evented streams,
/// skipped steps and error; None when there is nothing to say.
fn note(r: &KubeletResults, run: &SetupRun) -> Option<Vars> {
    let mut x = setup_vars(run);
    let mut any = false;
    let mut entry = |x: &mut Vars, name: &str, entries: Vec<Vars>| {
        any |= !entries.is_empty();
        x.list(name, entries);
    };
    let adoptions = (!run.adoptions.is_empty()).then(|| {
        let sum = |f: fn(&crate::kubelet::Adoption) -> usize| -> usize {
            run.adoptions.iter().map(f).sum()
        };
        let slowest = run
            .adoptions
            .iter()
            .map(|a| a.took)
            .max()
            .unwrap_or_default();
        let mut a = Vars::new();
        a.set("restarts", run.adoptions.len())
            .set("kept", sum(|a| a.kept))
            .set("before", sum(|a| a.before))
            .set("new", sum(|a| a.new))
            .set("slowest_s", format!("{:.1}", slowest.as_secs_f64()));
        a
    });
    entry(&mut x, "adoptions", adoptions.into_iter().collect());
    let warnings = run
        .warnings
        .iter()
        .map(|w| {
            let mut a = Vars::new();
            a.set("warning", one_line(w).replace('`', "'"));
            a
        })
        .collect();
    entry(&mut x, "warnings", warnings);
    let accepted =
        (run.setup == Setup::KubeletContainerd17 && !run.windows.is_empty()).then(|| {
            let mut a = Vars::new();
            a.set(
                "kubelet",
                r.kubelet_version.trim_start_matches("Kubernetes "),
            )
            .set("containerd", &run.runtime_version);
            a
        });
    entry(&mut x, "accepted", accepted.into_iter().collect());
    let streams: Vec<(f64, f64)> = run
        .windows
        .iter()
        .filter(|(_, p, _)| *p == Pleg::Evented)
        .filter_map(|(_, _, w)| w.evented_stream)
        .collect();
    let stream = (run.setup.is_kubelet() && !streams.is_empty()).then(|| {
        let ok = streams
            .iter()
            .filter(|(c, e)| *c >= 1.0 && *e == 0.0)
            .count();
        let errors: f64 = streams.iter().map(|(_, e)| e).sum();
        let mut a = Vars::new();
        a.set("ok", ok)
            .set("windows", streams.len())
            .flag("has_errors", errors > 0.0)
            .set("errors", errors);
        a
    });
    entry(&mut x, "streams", stream.into_iter().collect());
    let skipped = run
        .skipped
        .iter()
        .map(|s| {
            let mut a = Vars::new();
            a.set("step", s);
            a
        })
        .collect();
    entry(&mut x, "skipped", skipped);
    entry(
        &mut x,
        "stopped",
        run.error.iter().map(|e| stopped(e)).collect(),
    );
    any.then_some(x)
}

/// The critest counts, or why there are none.
fn critest_vars(v: &mut Vars, r: &KubeletResults) {
    let c = &r.critest;
    let table = c.table.as_ref().map(|t| {
        let mut x = Vars::new();
        x.set("source", &c.source).set("table", t);
        x
    });
    v.list("critest", table.into_iter().collect()).set(
        "critest_missing",
        c.missing
            .as_deref()
            .map(one_line)
            .unwrap_or_else(|| "the section stopped before it".into()),
    );
}

/// Every value of the sections.
fn section_vars(v: &mut Vars, r: &KubeletResults) {
    v.set(
        "kubelet_version",
        if r.kubelet_version.is_empty() {
            "kubelet from `make peers`"
        } else {
            r.kubelet_version.as_str()
        },
    )
    .set("image", IMAGE)
    .set("sizes", format!("{:?}", r.sizes))
    .set("ramp_timeout_s", r.ramp_timeout.as_secs())
    .set("settle_s", SETTLE.as_secs())
    .set("idle_seconds", r.idle_seconds)
    .list("stopped", r.error.iter().map(|e| stopped(e)).collect());
    p23_vars(v, r);
    p24_vars(v, r);
    p25_vars(v, r);
    p26_p27_vars(v, r);
    v.list(
        "notes",
        r.runs.iter().filter_map(|run| note(r, run)).collect(),
    );
    critest_vars(v, r);
}

/// Every value of the template; `rows` or `sections` says which half
/// to render.
fn vars(r: &KubeletResults, rows: bool) -> Vars {
    let mut v = Vars::new();
    v.flag("rows", rows).flag("sections", !rows);
    if rows {
        row_vars(&mut v, r);
    } else {
        section_vars(&mut v, r);
    }
    v
}

/// The rows of P23-P27 in the summary table.
pub fn summary_rows(r: &KubeletResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The sections of P23-P27 and the critest counts.
pub fn sections(r: &KubeletResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
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
        let o = summary_rows(&results()).unwrap();
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
        let o = sections(&results()).unwrap();
        let row = o
            .lines()
            .find(|l| l.starts_with("| 100 | −28.5 % | −10.1 % |"))
            .unwrap();
        // kubelet + containerd: 1200 → 1000 ms, −16.7 %.
        assert!(row.contains("−16.7 %"), "{row}");
        assert!(o.contains("### critest"), "{o}");
    }
}
