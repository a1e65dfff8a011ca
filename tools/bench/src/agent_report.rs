//! P10-P13 in docs/PERFORMANCE.md: the summary rows and the sections.

use std::time::Duration;

use crate::agent::{
    AgentResults, ExitReference, ExitRun, IdlePoint, TargetRun, GAP, KILLED, LIST_ROUNDS,
    RELIST_JITTER, SETTLE, STATUS_POLL,
};
use crate::agent_proc::{Mode, ObserveMethod, POLL_EVERY, RELIST_PERIOD};
use crate::procfs::{self, Cpu};
use crate::stats::{ms, one_line, ratio, verdict, Samples};
use crate::template::{render, TemplateError, Vars};

/// The summary rows P10-P13.
const ROWS: &str = include_str!("../templates/agent_rows.md");
/// The sections P10-P13.
const SECTIONS: &str = include_str!("../templates/agent.md");

/// Goal of P10: how much less CPU event mode uses than relist mode.
const IDLE_REDUCTION_GOAL: f64 = 0.90;
/// Goal of P10: event mode at 100 containers, percent of one core.
const IDLE_EVENTS_PERCENT_GOAL: f64 = 1.0;
/// Goal of P11: event mode p99.
const EXIT_P99_GOAL: Duration = Duration::from_millis(20);
/// Goal of P12: over the runtime's own create + start.
const START_RATIO_GOAL: f64 = 1.3;
/// Goal of P13: one relist at 1000 pods.
const RELIST_GOAL: Duration = Duration::from_millis(50);
/// The size P13's goal is stated at.
const RELIST_GOAL_PODS: usize = 1000;
/// Seed 000 (iSulad with evented PLEG, busybox containers): CPU reduction
/// of iSulad and kubelet against the generic PLEG, in percent.
const ISULAD: [(usize, f64, f64); 3] = [(10, 30.5, 11.0), (50, 27.5, 10.4), (100, 28.5, 10.1)];

fn cpu_ms(c: Cpu) -> f64 {
    c.ticks as f64 * 1000.0 / procfs::ticks_per_second().max(1) as f64
}

fn pct(c: Cpu, wall: Duration) -> f64 {
    if wall.is_zero() {
        return 0.0;
    }
    cpu_ms(c) / (wall.as_secs_f64() * 1000.0) * 100.0
}

/// 1 − a/b as a percentage, or None when b is zero.
fn reduction(a: Cpu, b: Cpu) -> Option<f64> {
    (b.ticks > 0).then(|| (1.0 - a.ticks as f64 / b.ticks as f64) * 100.0)
}

/// Total CPU of both modes' windows at one size, in ms, on one measure:
/// the cgroup's nanosecond accounting when both windows have it, else the
/// processes' clock ticks.
fn totals_ms(p: &IdlePoint) -> (f64, f64) {
    match (p.events.accounted, p.relist.accounted) {
        (Some(e), Some(r)) => (e.as_secs_f64() * 1e3, r.as_secs_f64() * 1e3),
        _ => (cpu_ms(p.events.total()), cpu_ms(p.relist.total())),
    }
}

/// Whether both windows at `p` have the cgroup's accounting.
fn both_accounted(p: &IdlePoint) -> bool {
    p.events.accounted.is_some() && p.relist.accounted.is_some()
}

/// The measure [`totals_ms`] used at `p`.
fn measure_name(p: &IdlePoint) -> &'static str {
    if both_accounted(p) {
        "cgroup CPU accounting"
    } else {
        "clock ticks"
    }
}

/// 1 − events/relist as a percentage on [`totals_ms`].
fn point_reduction(p: &IdlePoint) -> Option<f64> {
    let (e, r) = totals_ms(p);
    (r > 0.0).then(|| (1.0 - e / r) * 100.0)
}

/// Percent of one core of `ms` over `wall`.
fn pct_ms(ms: f64, wall: Duration) -> f64 {
    if wall.is_zero() {
        return 0.0;
    }
    ms / (wall.as_secs_f64() * 1000.0) * 100.0
}

fn red_text(r: Option<f64>) -> String {
    match r {
        Some(r) if r.abs() < 0.05 => "±0.0 %".to_string(),
        Some(r) => format!("{:+.1} %", -r),
        None => "n/a (relist mode used no measurable CPU)".to_string(),
    }
}

fn at_100(run: &TargetRun) -> Option<&IdlePoint> {
    run.idle
        .iter()
        .find(|p| p.containers == 100)
        .or(run.idle.last())
}

fn idle_pass(p: &IdlePoint) -> bool {
    let r = point_reduction(p);
    r.is_some_and(|r| r >= IDLE_REDUCTION_GOAL * 100.0)
        && pct_ms(totals_ms(p).0, p.events.wall) <= IDLE_EVENTS_PERCENT_GOAL
}

fn mode_of<T>(v: &[(Mode, T)], m: Mode) -> Option<&T> {
    v.iter().find(|(k, _)| *k == m).map(|(_, t)| t)
}

fn why_missing(run: &TargetRun) -> String {
    run.error
        .clone()
        .unwrap_or_else(|| "the run stopped before this figure".to_string())
}

/// A summary row of kind `kind` (the flag its template block tests).
fn row(kind: &str) -> Vars {
    let mut v = Vars::new();
    v.flag(kind, true);
    v
}

/// A summary row for a figure that was not measured.
fn missing(n: &str, what: &str, why: &str) -> Vars {
    let mut v = row("missing");
    v.set("n", n).set("what", what).set("why", one_line(why));
    v
}

/// `p50`, `p99` and `count` of the measured samples `s`, `ref_p50` and
/// `ref_p99` of the reference `r`, and their ratios.
fn versus(v: &mut Vars, s: &Samples, r: &Samples) {
    v.set("p50", ms(s.p50()))
        .set("p99", ms(s.p99()))
        .set("max", ms(s.max()))
        .set("count", s.len())
        .set("ref_p50", ms(r.p50()))
        .set("ref_p99", ms(r.p99()))
        .set("ref_max", ms(r.max()))
        .set("ratio_p50", ratio(s.p50(), r.p50()))
        .set("ratio_p99", ratio(s.p99(), r.p99()));
}

fn idle_row(run: &TargetRun, with_goal: bool) -> Vars {
    let Some(p) = at_100(run) else {
        return missing(
            "P10",
            &format!(
                "Agent: idle CPU of agent + runtime + shims, event mode against relist mode ({})",
                run.name
            ),
            &why_missing(run),
        );
    };
    let sizes: Vec<String> = run
        .idle
        .iter()
        .map(|q| format!("{}: {}", q.containers, red_text(point_reduction(q))))
        .collect();
    let (events_ms, relist_ms) = totals_ms(p);
    let mut v = row("idle");
    v.set("name", &run.name)
        .set(
            "goal",
            if with_goal {
                format!(
                    "≥ {:.0} % less than relist mode, and ≤ {IDLE_EVENTS_PERCENT_GOAL} % of one core at 100 containers",
                    IDLE_REDUCTION_GOAL * 100.0
                )
            } else {
                "— (figure for comparison)".to_string()
            },
        )
        .set("containers", p.containers)
        .set("events_pct", format!("{:.3}", pct_ms(events_ms, p.events.wall)))
        .set("relist_pct", format!("{:.3}", pct_ms(relist_ms, p.relist.wall)))
        .set("measure", measure_name(p))
        .set("by_size", sizes.join(", "))
        .set(
            "ratio",
            if relist_ms > 0.0 {
                format!("{:.3}×", events_ms / relist_ms)
            } else {
                "n/a".to_string()
            },
        )
        .set(
            "verdict",
            if !with_goal {
                "—"
            } else if p.containers == 100 {
                verdict(idle_pass(p))
            } else {
                "n/a (not measured at 100 containers)"
            },
        );
    v
}

fn reference_name(r: ExitReference) -> String {
    match r {
        ExitReference::Event => "the runtime's STOPPED event at the bench's subscriber".to_string(),
        ExitReference::StatusPoll => format!(
            "the runtime's ContainerStatus EXITED (polled every {} ms)",
            STATUS_POLL.as_millis()
        ),
    }
}

/// Whether an exit run keeps P11's goal.
fn exit_pass(e: &ExitRun) -> bool {
    e.agent.p99() <= EXIT_P99_GOAL && e.wrong_codes.is_empty()
}

/// The P11 rows of one runtime: event and relist mode with
/// `restartPolicy: Never`, then event mode with `Always`.
fn exit_rows(rows: &mut Vec<Vars>, run: &TargetRun, with_goal: bool) {
    let never = [Mode::Events, Mode::Relist]
        .into_iter()
        .map(|m| (m, mode_of(&run.exits, m), "", "terminated"));
    let always = std::iter::once((
        Mode::Events,
        run.exits_always.as_ref(),
        ", restartPolicy Always",
        "exit shown",
    ));
    for (mode, e, policy, shown) in never.chain(always) {
        let Some(e) = e.filter(|e| e.agent.len() > 0) else {
            rows.push(missing(
                "P11",
                &format!(
                    "Agent: container exit → {shown} at /pods, {} mode{policy} ({})",
                    mode.arg(),
                    run.name
                ),
                &why_missing(run),
            ));
            continue;
        };
        let goal = mode == Mode::Events && with_goal;
        let mut v = row("exit");
        versus(&mut v, &e.agent, &e.runtime);
        v.set("name", &run.name)
            .set("mode", mode.arg())
            .set("policy", policy)
            .set("shown", shown)
            .set(
                "goal",
                if goal {
                    format!("p99 ≤ {} ms", EXIT_P99_GOAL.as_millis())
                } else {
                    "—".to_string()
                },
            )
            .set("reference", reference_name(e.reference))
            .set("verdict", if goal { verdict(exit_pass(e)) } else { "—" });
        rows.push(v);
    }
}

fn start_rows(rows: &mut Vec<Vars>, run: &TargetRun) {
    for mode in [Mode::Events, Mode::Relist] {
        let Some(s) = mode_of(&run.starts, mode).filter(|s| s.agent.len() > 0) else {
            rows.push(missing(
                "P12",
                &format!(
                    "Agent: manifest written → all containers running at /pods, {} mode",
                    mode.arg()
                ),
                &why_missing(run),
            ));
            continue;
        };
        let goal = mode == Mode::Events;
        let pass = s.direct.len() > 0
            && s.agent.p50().as_secs_f64() <= s.direct.p50().as_secs_f64() * START_RATIO_GOAL
            && s.agent.p99().as_secs_f64() <= s.direct.p99().as_secs_f64() * START_RATIO_GOAL;
        let mut v = row("start");
        versus(&mut v, &s.agent, &s.direct);
        v.set("mode", mode.arg())
            .set(
                "goal",
                if goal {
                    format!("≤ {START_RATIO_GOAL}× the runtime's own at p50 and p99")
                } else {
                    "—".to_string()
                },
            )
            .set("verdict", if goal { verdict(pass) } else { "—" });
        rows.push(v);
    }
}

fn relist_rows(rows: &mut Vec<Vars>, r: &AgentResults) {
    if r.relist.is_empty() {
        rows.push(missing(
            "P13",
            "Agent: one full relist (relist mode, idle)",
            &why_missing(&r.petrel),
        ));
        return;
    }
    for (i, p) in r.relist.iter().enumerate() {
        let at_goal = p.pods >= RELIST_GOAL_PODS;
        let last = i + 1 == r.relist.len();
        let mut v = row("relist");
        v.set("pods", p.pods)
            .set("containers", p.containers)
            .set("mean", ms(p.mean))
            .set("count", p.count)
            .set("ref_p50", ms(p.reference.p50()))
            .set("ref_p99", ms(p.reference.p99()))
            .set("ref_mean", ms(p.reference.mean()))
            .set("ratio_mean", ratio(p.mean, p.reference.mean()))
            .set(
                "verdict",
                if at_goal {
                    verdict(p.count > 0 && p.mean <= RELIST_GOAL)
                } else if last {
                    "not measured at 1000 pods (see P13)"
                } else {
                    "—"
                },
            );
        rows.push(v);
    }
}

/// The summary rows P10-P13.
pub fn summary_rows(r: &AgentResults) -> Result<String, TemplateError> {
    let mut rows = vec![idle_row(&r.petrel, true)];
    exit_rows(&mut rows, &r.petrel, true);
    start_rows(&mut rows, &r.petrel);
    relist_rows(&mut rows, r);
    match &r.containerd {
        Ok(cd) => {
            rows.push(idle_row(cd, false));
            exit_rows(&mut rows, cd, false);
        }
        Err(why) => {
            rows.push(missing("P10", "Agent on containerd 1.7: idle CPU", why));
            rows.push(missing("P11", "Agent on containerd 1.7: exit → /pods", why));
        }
    }
    let mut v = Vars::new();
    for kind in ["idle", "exit", "start", "relist", "missing"] {
        v.flag(kind, false);
    }
    v.set("relist_goal_ms", RELIST_GOAL.as_millis())
        .set("relist_goal_pods", RELIST_GOAL_PODS)
        .list("rows", rows);
    render(ROWS, &v)
}

/// The P12 table's rows of one runtime.
fn starts_vars(run: &TargetRun) -> Vec<Vars> {
    run.starts
        .iter()
        .map(|(mode, s)| {
            let mut v = Vars::new();
            versus(&mut v, &s.agent, &s.direct);
            v.set("mode", mode.arg()).set(
                "metric_mean",
                s.agent_metric_mean.map(ms).unwrap_or_else(|| "—".into()),
            );
            v
        })
        .collect()
}

/// The P10 tables, adoptions and P11 table of one runtime.
fn target_vars(run: &TargetRun, petrel: bool) -> Vars {
    let mut idle = Vec::new();
    for p in &run.idle {
        for (mode, w) in [(Mode::Relist, &p.relist), (Mode::Events, &p.events)] {
            let mut v = Vars::new();
            v.set("containers", w.containers)
                .set("mode", mode.arg())
                .set("wall", format!("{:.1}", w.wall.as_secs_f64()))
                .set("runtime_ms", format!("{:.0}", cpu_ms(w.runtime)))
                .set("shims_ms", format!("{:.0}", cpu_ms(w.shims)))
                .set("shim_count", w.shim_count)
                .set("agent_ms", format!("{:.0}", cpu_ms(w.agent)))
                .set("total_ms", format!("{:.0}", cpu_ms(w.total())))
                .set("total_pct", format!("{:.3}", pct(w.total(), w.wall)))
                .set(
                    "accounted_ms",
                    w.accounted
                        .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
                        .unwrap_or_else(|| "—".to_string()),
                )
                .set(
                    "agent_sched_ms",
                    format!("{:.1}", w.agent.sched_ns as f64 / 1e6),
                )
                .set(
                    "runtime_sched_ms",
                    format!("{:.1}", w.runtime_side().sched_ns as f64 / 1e6),
                )
                .set(
                    "relists",
                    w.relists
                        .map(|(n, _)| n.to_string())
                        .unwrap_or_else(|| "—".to_string()),
                )
                .set(
                    "mean_relist_ms",
                    match w.relists {
                        Some((n, sum)) if n > 0 => format!("{:.3}", sum / n as f64 * 1e3),
                        _ => "—".to_string(),
                    },
                );
            idle.push(v);
        }
    }
    let reductions = run
        .idle
        .iter()
        .map(|p| {
            let seed = ISULAD.iter().find(|(n, _, _)| *n == p.containers);
            let mut v = Vars::new();
            v.set("containers", p.containers)
                .set(
                    "runtime_side",
                    red_text(reduction(p.events.runtime_side(), p.relist.runtime_side())),
                )
                .set("agent", red_text(reduction(p.events.agent, p.relist.agent)))
                .set(
                    "all_ticks",
                    red_text(reduction(p.events.total(), p.relist.total())),
                )
                .set(
                    "all_accounted",
                    if both_accounted(p) {
                        red_text(point_reduction(p))
                    } else {
                        "—".to_string()
                    },
                )
                .set(
                    "isulad",
                    seed.map(|s| format!("−{} %", s.1))
                        .unwrap_or_else(|| "—".into()),
                )
                .set(
                    "kubelet",
                    seed.map(|s| format!("−{} %", s.2))
                        .unwrap_or_else(|| "—".into()),
                );
            v
        })
        .collect();
    let adoptions = run
        .adoptions
        .iter()
        .map(|a| {
            let mut v = Vars::new();
            v.set("to", a.to.map(Mode::arg).unwrap_or("?"))
                .set("kept", a.kept)
                .set("before", a.before)
                .set("new", a.new)
                .set("startup_ms", ms(a.startup))
                .set("took_ms", ms(a.took));
            v
        })
        .collect();
    let exit_row = |mode: String, e: &ExitRun| {
        let mut v = Vars::new();
        versus(&mut v, &e.agent, &e.runtime);
        v.set("mode", mode)
            .set("reference", reference_name(e.reference))
            .set(
                "wrong_codes",
                if e.wrong_codes.is_empty() {
                    "none".to_string()
                } else {
                    format!("{:?}", e.wrong_codes)
                },
            );
        v
    };
    let mut exits: Vec<Vars> = run
        .exits
        .iter()
        .map(|(mode, e)| exit_row(mode.arg().to_string(), e))
        .collect();
    if let Some(e) = &run.exits_always {
        exits.push(exit_row(
            "events, restartPolicy Always (exit shown)".to_string(),
            e,
        ));
    }
    let mut v = Vars::new();
    v.flag("petrel", petrel)
        .set("name", &run.name)
        .list("idle", idle)
        .list("reductions", reductions)
        .list("adoptions", adoptions)
        .list("exits", exits)
        .list("starts", starts_vars(run));
    v
}

/// The sections P10-P13.
pub fn sections(r: &AgentResults) -> Result<String, TemplateError> {
    let observe = match r.method {
        Some(ObserveMethod::Watch) => {
            "the watch stream `GET /pods?watch=true` (newline-delimited JSON events), each event \
             stamped when its last byte was read"
                .to_string()
        }
        Some(ObserveMethod::Poll) => format!(
            "polling `GET /pods/{{namespace}}/{{name}}` every {} ms, stamped on each answer (the \
             watch stream was not usable: {})",
            POLL_EVERY.as_millis(),
            one_line(r.watch_error.as_deref().unwrap_or("?"))
        ),
        None => "—".to_string(),
    };
    let mut targets = vec![target_vars(&r.petrel, true)];
    let mut containerd = Vec::new();
    let mut containerd_missing = Vec::new();
    match &r.containerd {
        Ok(cd) => {
            let t = target_vars(cd, false);
            targets.push(t.clone());
            containerd.push(t);
        }
        Err(why) => {
            let mut v = Vars::new();
            v.set("why", one_line(why));
            containerd_missing.push(v);
        }
    }
    let idle_result = at_100(&r.petrel)
        .map(|p| {
            let mut v = Vars::new();
            v.set("containers", p.containers)
                .set(
                    "events_pct",
                    format!("{:.3}", pct_ms(totals_ms(p).0, p.events.wall)),
                )
                .set(
                    "relist_pct",
                    format!("{:.3}", pct_ms(totals_ms(p).1, p.relist.wall)),
                )
                .set("reduction", red_text(point_reduction(p)))
                .set("measure", measure_name(p))
                .set(
                    "verdict",
                    if p.containers == 100 {
                        verdict(idle_pass(p))
                    } else {
                        "not measured at 100 containers"
                    },
                );
            v
        })
        .into_iter()
        .collect();
    let deletes = r
        .petrel
        .deletes
        .iter()
        .map(|(n, d)| {
            let mut v = Vars::new();
            v.set("count", n).set("took_ms", ms(*d));
            v
        })
        .collect();
    let relist = r
        .relist
        .iter()
        .map(|p| {
            let mut v = Vars::new();
            v.set("pods", p.pods)
                .set("containers", p.containers)
                .set("wall", format!("{:.1}", p.wall.as_secs_f64()))
                .set("count", p.count)
                .set("mean", ms(p.mean))
                .set("ref_p50", ms(p.reference.p50()))
                .set("ref_p99", ms(p.reference.p99()))
                .set("ref_mean", ms(p.reference.mean()))
                .set("ratio_mean", ratio(p.mean, p.reference.mean()));
            v
        })
        .collect();
    let stopped = [
        ("petrel runtime", Some(&r.petrel)),
        ("containerd", r.containerd.as_ref().ok()),
    ]
    .into_iter()
    .filter_map(|(who, run)| {
        let e = run.and_then(|x| x.error.as_ref())?;
        let mut v = Vars::new();
        v.set("who", who).set("error", e.trim());
        Some(v)
    })
    .collect();
    let l = &r.large;
    let mut v = Vars::new();
    v.set("relist_period", RELIST_PERIOD)
        .set("observe", observe)
        .set(
            "reduction_goal",
            format!("{:.0}", IDLE_REDUCTION_GOAL * 100.0),
        )
        .set("events_pct_goal", IDLE_EVENTS_PERCENT_GOAL)
        .set("settle_s", SETTLE.as_secs())
        .set("hz", procfs::ticks_per_second())
        .set("idle_seconds", r.idle_seconds)
        .list("targets", targets)
        .list("containerd", containerd)
        .list("containerd_missing", containerd_missing)
        .list("idle_result", idle_result)
        .set("exit_goal_ms", EXIT_P99_GOAL.as_millis())
        .set("pods", r.pods)
        .set("relist_pods", r.relist_pods)
        .set("gap_ms", GAP.as_millis())
        .set("jitter_ms", RELIST_JITTER.as_millis())
        .set("killed", KILLED)
        .set("status_poll_ms", STATUS_POLL.as_millis())
        .set("start_goal", START_RATIO_GOAL)
        .list("starts", starts_vars(&r.petrel))
        .list("deletes", deletes)
        .set("relist_goal_ms", RELIST_GOAL.as_millis())
        .set("relist_goal_pods", RELIST_GOAL_PODS)
        .set("per_pod", l.per_pod)
        .set("written", l.written)
        .set("target_pods", l.target_pods)
        .set("grown_from", l.grown_from)
        .set("running", l.running)
        .set("grow_s", format!("{:.1}", l.grow.as_secs_f64()))
        .set("teardown_s", format!("{:.1}", l.teardown.as_secs_f64()))
        .set(
            "note",
            l.note
                .as_ref()
                .map(|n| format!(" Note: {n}."))
                .unwrap_or_default(),
        )
        .set("relist_seconds", r.relist_seconds)
        .set("list_rounds", LIST_ROUNDS)
        .list("relist", relist)
        .list("stopped", stopped);
    render(SECTIONS, &v)
}
