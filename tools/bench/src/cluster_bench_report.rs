//! P33-P37 in docs/PERFORMANCE.md: the summary rows and the section, from
//! `templates/cluster_bench.md`.

use std::time::Duration;

use crate::cluster_bench::{ClusterResults, StackRun};
use crate::cluster_objects_bench::ObjectsRun;
use crate::kubelet::{setup_name, Setup, GAP, IMAGE, JITTER, SETTLE};
use crate::stats::{ms, one_line, ratio, stopped_vars, verdict, within};
use crate::template::{render, TemplateError, Vars};

/// The rows and section P33-P35.
const TEMPLATE: &str = include_str!("../templates/cluster_bench.md");

/// P33: `petrel node`'s p50 and p99 over kubelet + containerd's.
const START_GOAL: f64 = 0.5;
/// P35: the idle node's CPU over kubelet + containerd's.
const CPU_GOAL: f64 = 0.1;
/// P35: the idle node's RSS over kubelet + containerd's.
const RSS_GOAL: f64 = 0.25;

/// P36: a changed ConfigMap or Secret in the pod's file, p99 at most this.
const OBJECT_GOAL: Duration = Duration::from_secs(2);

/// The stack judged and the reference it is judged against.
const SUBJECT: Setup = Setup::PetrelNode;
const REFERENCE: Setup = Setup::KubeletContainerd;

fn name(r: &StackRun) -> String {
    setup_name(r.setup, &r.runtime_version)
}

/// Seconds with three decimals.
fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// `a / b` of plain numbers, three decimals.
fn fratio(a: f64, b: f64) -> String {
    if b <= 0.0 {
        return "n/a".into();
    }
    format!("{:.3}", a / b)
}

/// Why `setup` has no figure: the section's error, the stack's, or what
/// it skipped.
fn why(r: &ClusterResults, setup: Setup) -> String {
    if let Some(e) = &r.error {
        return one_line(e);
    }
    match r.run(setup) {
        None => format!("{} was not run (--cluster-setups)", setup_name(setup, "")),
        Some(run) => one_line(
            run.error
                .as_deref()
                .or(run.skipped.first().map(String::as_str))
                .unwrap_or("the run stopped before this figure"),
        ),
    }
}

/// The other kubelet stacks than the reference, for the reference column.
fn others(r: &ClusterResults, cell: impl Fn(&StackRun) -> Option<String>) -> String {
    r.runs
        .iter()
        .filter(|x| x.setup != SUBJECT && x.setup != REFERENCE)
        .map(|x| {
            let c = cell(x).unwrap_or_else(|| format!("not measured ({})", why(r, x.setup)));
            format!("; {}: {c}", name(x))
        })
        .collect()
}

fn p33_row(r: &ClusterResults, n: &StackRun, c: &StackRun) -> Vars {
    let (ns, cs) = (&n.starts, &c.starts);
    let pass = within(ns.p50(), cs.p50(), START_GOAL) && within(ns.p99(), cs.p99(), START_GOAL);
    let mut v = Vars::new();
    v.set("p50", ms(ns.p50()))
        .set("p99", ms(ns.p99()))
        .set("count", ns.len())
        .set("reference", name(c))
        .set("ref_p50", ms(cs.p50()))
        .set("ref_p99", ms(cs.p99()))
        .set(
            "others",
            others(r, |x| {
                (x.starts.len() > 0).then(|| {
                    format!(
                        "p50 {} ms, p99 {} ms",
                        ms(x.starts.p50()),
                        ms(x.starts.p99())
                    )
                })
            }),
        )
        .set("ratio_p50", ratio(ns.p50(), cs.p50()))
        .set("ratio_p99", ratio(ns.p99(), cs.p99()))
        .set("verdict", verdict(pass));
    v
}

fn p34_row(r: &ClusterResults, n: &StackRun, c: &StackRun) -> Option<Vars> {
    let (nb, cb) = (n.burst.as_ref()?, c.burst.as_ref()?);
    let mut v = Vars::new();
    v.set("pods", nb.pods)
        .set("took", secs(nb.all_running))
        .set("reference", name(c))
        .set("ref_took", secs(cb.all_running))
        .set(
            "others",
            others(r, |x| {
                x.burst
                    .as_ref()
                    .map(|b| format!("{} s", secs(b.all_running)))
            }),
        )
        .set("ratio", ratio(nb.all_running, cb.all_running));
    Some(v)
}

fn p35_row(r: &ClusterResults, n: &StackRun, c: &StackRun) -> Option<Vars> {
    let (ni, ci) = (n.idle.as_ref()?, c.idle.as_ref()?);
    let (nw, cw) = (&ni.window, &ci.window);
    let cpu_q = nw.total().as_secs_f64() / cw.total().as_secs_f64().max(1e-12);
    let ((nr, np), (cr, cp)) = (ni.memory.sum(), ci.memory.sum());
    let rss_q = nr as f64 / cr.max(1) as f64;
    let mut v = Vars::new();
    v.set("pods", ni.pods)
        .set("wall_s", format!("{:.0}", nw.wall.as_secs_f64()))
        .set("percent", format!("{:.3}", nw.percent()))
        .set("cpu_ms", format!("{:.1}", nw.total().as_secs_f64() * 1e3))
        .set("reference", name(c))
        .set("ref_percent", format!("{:.3}", cw.percent()))
        .set(
            "cpu_others",
            others(r, |x| {
                x.idle
                    .as_ref()
                    .map(|i| format!("{:.3} %", i.window.percent()))
            }),
        )
        .set("cpu_ratio", format!("{cpu_q:.3}"))
        .set("cpu_verdict", verdict(cpu_q <= CPU_GOAL))
        .set("rss", mib(nr))
        .set("pss", mib(np))
        .set("ref_rss", mib(cr))
        .set("ref_pss", mib(cp))
        .set(
            "rss_others",
            others(r, |x| {
                x.idle
                    .as_ref()
                    .map(|i| format!("RSS {} MiB", mib(i.memory.sum().0)))
            }),
        )
        .set("rss_ratio", format!("{rss_q:.3}"))
        .set("pss_ratio", fratio(np as f64, cp as f64))
        .set("rss_verdict", verdict(rss_q <= RSS_GOAL))
        .set("requests", format!("{:.1}", ni.requests_per_min()))
        .set("ref_requests", format!("{:.1}", ci.requests_per_min()))
        .set(
            "requests_others",
            others(r, |x| {
                x.idle
                    .as_ref()
                    .map(|i| format!("{:.1} requests/min", i.requests_per_min()))
            }),
        )
        .set(
            "requests_ratio",
            fratio(ni.requests_per_min(), ci.requests_per_min()),
        );
    Some(v)
}

/// Both rounds of P36.
fn changes(o: &ObjectsRun) -> crate::stats::Samples {
    let mut all = o.config_map.clone();
    all.extend(&o.secret);
    all
}

/// P36's figures of one stack, for a cell.
fn p36_cell(o: &ObjectsRun) -> String {
    let all = changes(o);
    format!(
        "ConfigMap p50 {} ms, p99 {} ms; Secret p50 {} ms, p99 {} ms; all p99 {} ms ({} changes{})",
        ms(o.config_map.p50()),
        ms(o.config_map.p99()),
        ms(o.secret.p50()),
        ms(o.secret.p99()),
        ms(all.p99()),
        all.len(),
        if o.missed > 0 {
            format!(", {} not seen", o.missed)
        } else {
            String::new()
        }
    )
}

/// P37: requests per minute per pod of the node (P35's and P36's).
fn per_pod(x: &StackRun) -> Option<f64> {
    let o = x.objects.as_ref()?;
    Some(o.per_pod(x.idle.as_ref().map_or(0, |i| i.pods)))
}

fn p36_row(n: &StackRun, c: &StackRun) -> Option<Vars> {
    let (no, co) = (n.objects.as_ref()?, c.objects.as_ref()?);
    let (na, ca) = (changes(no), changes(co));
    let pass = no.missed == 0 && na.len() > 0 && na.p99() <= OBJECT_GOAL;
    let mut v = Vars::new();
    v.set("pods", no.pods)
        .set("goal_s", OBJECT_GOAL.as_secs())
        .set("measured", p36_cell(no))
        .set("reference", name(c))
        .set("ref_measured", p36_cell(co))
        .set("ratio", ratio(na.p99(), ca.p99()))
        .set("verdict", verdict(pass));
    Some(v)
}

fn p37_row(n: &StackRun, c: &StackRun) -> Option<Vars> {
    let (np, cp) = (per_pod(n)?, per_pod(c)?);
    let (no, co) = (n.objects.as_ref()?, c.objects.as_ref()?);
    let mut v = Vars::new();
    let on_node = no.pods + n.idle.as_ref().map_or(0, |i| i.pods);
    v.set("pods", no.pods)
        .set("on_node", on_node)
        .set("per_pod", format!("{np:.3}"))
        .set("total", format!("{:.1}", no.requests_per_min()))
        .set("reference", name(c))
        .set("ref_per_pod", format!("{cp:.3}"))
        .set("ref_total", format!("{:.1}", co.requests_per_min()))
        .set("ratio", fratio(np, cp))
        .set("verdict", verdict(np <= cp));
    Some(v)
}

/// One stack's row of the section's table.
fn stack_row(x: &StackRun) -> Vars {
    let dash = || "—".to_string();
    let mut v = Vars::new();
    v.set("name", name(x))
        .set("ready", x.ready_after.map_or_else(dash, secs))
        .set(
            "starts",
            if x.starts.len() > 0 {
                format!(
                    "{} / {} / {} ({})",
                    ms(x.starts.p50()),
                    ms(x.starts.p99()),
                    ms(x.starts.max()),
                    x.starts.len()
                )
            } else {
                dash()
            },
        )
        .set(
            "creates",
            if x.creates.len() > 0 {
                format!("{} / {}", ms(x.creates.p50()), ms(x.creates.p99()))
            } else {
                dash()
            },
        )
        .set(
            "deleted",
            x.deleted
                .map_or_else(dash, |(n, d)| format!("{} ({n} pods)", secs(d))),
        )
        .set(
            "burst_cell",
            x.burst.as_ref().map_or_else(dash, |b| {
                format!("{} (sent in {})", secs(b.all_running), secs(b.sent))
            }),
        )
        .set("objects", x.objects.as_ref().map_or_else(dash, p36_cell))
        .set(
            "per_pod",
            per_pod(x).map_or_else(dash, |p| format!("{p:.3}")),
        );
    match &x.idle {
        Some(i) => {
            let (rss, pss) = i.memory.sum();
            v.set(
                "requests",
                format!(
                    "{:.1} ({} in {:.0} s)",
                    i.requests_per_min(),
                    i.requests,
                    i.window.wall.as_secs_f64()
                ),
            )
            .set(
                "cpu",
                format!(
                    "{:.1} ms, {:.3} %",
                    i.window.total().as_secs_f64() * 1e3,
                    i.window.percent()
                ),
            )
            .set("rss", mib(rss))
            .set("pss", mib(pss))
            .set(
                "processes",
                usize::from(i.memory.kubelet.is_some()) + 1 + i.memory.shims.len(),
            );
        }
        None => {
            for k in ["requests", "cpu", "rss", "pss", "processes"] {
                v.set(k, dash());
            }
        }
    }
    v
}

/// One stack's ratios to the reference.
fn ratio_row(x: &StackRun, c: &StackRun) -> Vars {
    let dash = || "—".to_string();
    let (p50, p99) = if x.starts.len() > 0 && c.starts.len() > 0 {
        (
            ratio(x.starts.p50(), c.starts.p50()),
            ratio(x.starts.p99(), c.starts.p99()),
        )
    } else {
        (dash(), dash())
    };
    let mut v = Vars::new();
    v.set("name", name(x)).set("p50", p50).set("p99", p99).set(
        "burst_cell",
        match (&x.burst, &c.burst) {
            (Some(a), Some(b)) => ratio(a.all_running, b.all_running),
            _ => dash(),
        },
    );
    match (&x.idle, &c.idle) {
        (Some(a), Some(b)) => {
            let ((ar, ap), (br, bp)) = (a.memory.sum(), b.memory.sum());
            v.set(
                "requests",
                fratio(a.requests_per_min(), b.requests_per_min()),
            )
            .set(
                "cpu",
                fratio(
                    a.window.total().as_secs_f64(),
                    b.window.total().as_secs_f64(),
                ),
            )
            .set("rss", fratio(ar as f64, br as f64))
            .set("pss", fratio(ap as f64, bp as f64));
        }
        _ => {
            for k in ["requests", "cpu", "rss", "pss"] {
                v.set(k, dash());
            }
        }
    }
    v
}

fn vars(r: &ClusterResults, rows: bool) -> Vars {
    let mut v = Vars::new();
    v.flag("rows", rows)
        .flag("sections", !rows)
        .set("start_goal", START_GOAL)
        .set("cpu_goal", CPU_GOAL)
        .set("rss_goal", RSS_GOAL)
        .set("starts", r.starts)
        .set("burst", r.burst)
        .set("idle_seconds", r.idle_seconds)
        .set("kubelet_version", &r.kubelet_version)
        .set("image", IMAGE)
        .set("gap_ms", GAP.as_millis())
        .set("jitter_ms", JITTER.as_millis())
        .set("settle_s", SETTLE.as_secs())
        .set("in_flight", crate::controller_bench::FILL_CONCURRENCY)
        .list("stopped", stopped_vars(r.error.as_deref()));
    let subject = r.run(SUBJECT);
    let reference = r.run(REFERENCE);
    let p33 = match (
        subject.filter(|x| x.starts.len() > 0),
        reference.filter(|x| x.starts.len() > 0),
    ) {
        (Some(n), Some(c)) => vec![p33_row(r, n, c)],
        _ => vec![],
    };
    let p34 = subject
        .zip(reference)
        .and_then(|(n, c)| p34_row(r, n, c))
        .into_iter()
        .collect();
    let p35 = subject
        .zip(reference)
        .and_then(|(n, c)| p35_row(r, n, c))
        .into_iter()
        .collect();
    // Why a row is missing: the first of the two stacks without it.
    let missing = |has: &dyn Fn(&StackRun) -> bool| {
        if subject.is_some_and(has) {
            why(r, REFERENCE)
        } else {
            why(r, SUBJECT)
        }
    };
    let p36 = subject
        .zip(reference)
        .and_then(|(n, c)| p36_row(n, c))
        .into_iter()
        .collect();
    let p37 = subject
        .zip(reference)
        .and_then(|(n, c)| p37_row(n, c))
        .into_iter()
        .collect();
    v.list("p33", p33)
        .list("p34", p34)
        .list("p35", p35)
        .list("p36", p36)
        .list("p37", p37)
        .set("p36_why", missing(&|x| x.objects.is_some()))
        .set("object_pods", crate::cluster_objects_bench::OBJECT_PODS)
        .set("object_goal_s", OBJECT_GOAL.as_secs())
        .set("p33_why", missing(&|x| x.starts.len() > 0))
        .set("p34_why", missing(&|x| x.burst.is_some()))
        .set("p35_why", missing(&|x| x.idle.is_some()));
    v.list("stacks", r.runs.iter().map(stack_row).collect());
    v.list(
        "ratios",
        match reference {
            Some(c) => r
                .runs
                .iter()
                .filter(|x| x.setup != REFERENCE)
                .map(|x| ratio_row(x, c))
                .collect(),
            None => vec![],
        },
    );
    let notes: Vec<Vars> = r
        .runs
        .iter()
        .flat_map(|x| {
            let n = name(x);
            x.error
                .iter()
                .map(|e| format!("Stopped on {n}: {}", one_line(e)))
                .chain(
                    x.skipped
                        .iter()
                        .map(move |s| format!("Skipped on {}: {}", name(x), one_line(s))),
                )
                .collect::<Vec<_>>()
        })
        .map(|line| {
            let mut row = Vars::new();
            row.set("line", line);
            row
        })
        .collect();
    v.list("notes", notes);
    v
}

/// The summary rows P33-P35.
pub fn summary_rows(r: &ClusterResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The section P33-P35.
pub fn sections(r: &ClusterResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
}
