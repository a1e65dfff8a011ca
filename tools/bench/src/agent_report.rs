//! P10-P13 in docs/PERFORMANCE.md: the summary rows and the sections.

use std::fmt::Write;
use std::time::Duration;

use crate::agent::{
    AgentResults, ExitReference, IdlePoint, TargetRun, GAP, KILLED, LIST_ROUNDS, RELIST_JITTER,
    SETTLE, STATUS_POLL,
};
use crate::agent_proc::{Mode, ObserveMethod, POLL_EVERY, RELIST_PERIOD};
use crate::procfs::{self, Cpu};
use crate::stats::{ms, one_line, ratio, verdict, Samples};

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

fn lat(s: &Samples) -> String {
    format!("p50 {} ms, p99 {} ms", ms(s.p50()), ms(s.p99()))
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

fn not_measured(o: &mut String, n: &str, what: &str, why: &str) -> std::fmt::Result {
    writeln!(
        o,
        "| {n} | {what} | — | not measured | — | — | not measured: {} |",
        one_line(why)
    )
}

fn why_missing(run: &TargetRun) -> String {
    run.error
        .clone()
        .unwrap_or_else(|| "the run stopped before this figure".to_string())
}

fn idle_row(o: &mut String, run: &TargetRun, with_goal: bool) -> std::fmt::Result {
    let what = format!(
        "Agent: idle CPU of agent + runtime + shims, event mode against relist mode ({})",
        run.name
    );
    let Some(p) = at_100(run) else {
        return not_measured(o, "P10", &what, &why_missing(run));
    };
    let sizes: Vec<String> = run
        .idle
        .iter()
        .map(|q| format!("{}: {}", q.containers, red_text(point_reduction(q))))
        .collect();
    let (events_ms, relist_ms) = totals_ms(p);
    writeln!(
        o,
        "| P10 | {what} | {} | {} containers: events {:.3} % of a core, relist {:.3} % by {} (change by size: {}) | relist mode, same run: {:.3} %; published (seed 000, iSulad evented PLEG): runtime −30 %, kubelet −10 % | events / relist {} | {} |",
        if with_goal {
            format!(
                "≥ {:.0} % less than relist mode, and ≤ {IDLE_EVENTS_PERCENT_GOAL} % of one core at 100 containers",
                IDLE_REDUCTION_GOAL * 100.0
            )
        } else {
            "— (figure for comparison)".to_string()
        },
        p.containers,
        pct_ms(events_ms, p.events.wall),
        pct_ms(relist_ms, p.relist.wall),
        measure_name(p),
        sizes.join(", "),
        pct_ms(relist_ms, p.relist.wall),
        if relist_ms > 0.0 {
            format!("{:.3}×", events_ms / relist_ms)
        } else {
            "n/a".to_string()
        },
        if !with_goal {
            "—"
        } else if p.containers == 100 {
            verdict(idle_pass(p))
        } else {
            "n/a (not measured at 100 containers)"
        }
    )
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

fn exit_rows(o: &mut String, run: &TargetRun, with_goal: bool) -> std::fmt::Result {
    for mode in [Mode::Events, Mode::Relist] {
        let what = format!(
            "Agent: container exit → terminated at /pods, {} mode ({})",
            mode.arg(),
            run.name
        );
        let Some(e) = mode_of(&run.exits, mode).filter(|e| e.agent.len() > 0) else {
            not_measured(o, "P11", &what, &why_missing(run))?;
            continue;
        };
        let goal = mode == Mode::Events && with_goal;
        writeln!(
            o,
            "| P11 | {what} | {} | {} ({} exits) | {} for the same exits: {} | p50 {}×, p99 {}× | {} |",
            if goal {
                format!("p99 ≤ {} ms", EXIT_P99_GOAL.as_millis())
            } else {
                "—".to_string()
            },
            lat(&e.agent),
            e.agent.len(),
            reference_name(e.reference),
            lat(&e.runtime),
            ratio(e.agent.p50(), e.runtime.p50()),
            ratio(e.agent.p99(), e.runtime.p99()),
            if goal {
                verdict(e.agent.p99() <= EXIT_P99_GOAL && e.wrong_codes.is_empty())
            } else {
                "—"
            }
        )?;
    }
    Ok(())
}

fn start_rows(o: &mut String, run: &TargetRun) -> std::fmt::Result {
    for mode in [Mode::Events, Mode::Relist] {
        let what = format!(
            "Agent: manifest written → all containers running at /pods, {} mode",
            mode.arg()
        );
        let Some(s) = mode_of(&run.starts, mode).filter(|s| s.agent.len() > 0) else {
            not_measured(o, "P12", &what, &why_missing(run))?;
            continue;
        };
        let goal = mode == Mode::Events;
        let pass = s.direct.len() > 0
            && s.agent.p50().as_secs_f64() <= s.direct.p50().as_secs_f64() * START_RATIO_GOAL
            && s.agent.p99().as_secs_f64() <= s.direct.p99().as_secs_f64() * START_RATIO_GOAL;
        writeln!(
            o,
            "| P12 | {what} | {} | {} ({} pods) | RunPodSandbox + CreateContainer + StartContainer direct: {} | p50 {}×, p99 {}× | {} |",
            if goal {
                format!("≤ {START_RATIO_GOAL}× the runtime's own at p50 and p99")
            } else {
                "—".to_string()
            },
            lat(&s.agent),
            s.agent.len(),
            lat(&s.direct),
            ratio(s.agent.p50(), s.direct.p50()),
            ratio(s.agent.p99(), s.direct.p99()),
            if goal { verdict(pass) } else { "—" }
        )?;
    }
    Ok(())
}

fn relist_rows(o: &mut String, r: &AgentResults) -> std::fmt::Result {
    if r.relist.is_empty() {
        return not_measured(
            o,
            "P13",
            "Agent: one full relist (relist mode, idle)",
            &why_missing(&r.petrel),
        );
    }
    for p in &r.relist {
        let at_goal = p.pods >= RELIST_GOAL_PODS;
        let last = r.relist.last().is_some_and(|l| std::ptr::eq(l, p));
        writeln!(
            o,
            "| P13 | Agent: one full relist, {} pods ({} containers) | ≤ {} ms at {RELIST_GOAL_PODS} pods | mean {} ms ({} relists) | ListPodSandbox + ListContainers from the bench, same selector: {}, mean {} ms | mean {}× | {} |",
            p.pods,
            p.containers,
            RELIST_GOAL.as_millis(),
            ms(p.mean),
            p.count,
            lat(&p.reference),
            ms(p.reference.mean()),
            ratio(p.mean, p.reference.mean()),
            if at_goal {
                verdict(p.count > 0 && p.mean <= RELIST_GOAL)
            } else if last {
                "not measured at 1000 pods (see P13)"
            } else {
                "—"
            }
        )?;
    }
    Ok(())
}

/// The summary rows P10-P13.
pub fn summary_rows(o: &mut String, r: &AgentResults) -> std::fmt::Result {
    idle_row(o, &r.petrel, true)?;
    exit_rows(o, &r.petrel, true)?;
    start_rows(o, &r.petrel)?;
    relist_rows(o, r)?;
    match &r.containerd {
        Ok(cd) => {
            idle_row(o, cd, false)?;
            exit_rows(o, cd, false)?;
        }
        Err(why) => {
            not_measured(o, "P10", "Agent on containerd 1.7: idle CPU", why)?;
            not_measured(o, "P11", "Agent on containerd 1.7: exit → /pods", why)?;
        }
    }
    Ok(())
}

fn idle_table(o: &mut String, run: &TargetRun) -> std::fmt::Result {
    writeln!(
        o,
        "| containers | mode | window s | runtime ms | shims ms (count) | agent ms | total ms | total % of one core | all by cgroup accounting ms | agent schedstat ms | runtime + shims schedstat ms | relists in window | mean relist ms |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for p in &run.idle {
        for (mode, w) in [(Mode::Relist, &p.relist), (Mode::Events, &p.events)] {
            writeln!(
                o,
                "| {} | {} | {:.1} | {:.0} | {:.0} ({}) | {:.0} | {:.0} | {:.3} | {} | {:.1} | {:.1} | {} | {} |",
                w.containers,
                mode.arg(),
                w.wall.as_secs_f64(),
                cpu_ms(w.runtime),
                cpu_ms(w.shims),
                w.shim_count,
                cpu_ms(w.agent),
                cpu_ms(w.total()),
                pct(w.total(), w.wall),
                w.accounted
                    .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
                    .unwrap_or_else(|| "—".to_string()),
                w.agent.sched_ns as f64 / 1e6,
                w.runtime_side().sched_ns as f64 / 1e6,
                w.relists
                    .map(|(n, _)| n.to_string())
                    .unwrap_or_else(|| "—".to_string()),
                match w.relists {
                    Some((n, sum)) if n > 0 => format!("{:.3}", sum / n as f64 * 1e3),
                    _ => "—".to_string(),
                }
            )?;
        }
    }
    writeln!(o)?;
    writeln!(
        o,
        "| containers | runtime + shims: events against relist (ticks) | agent: events against relist (ticks) | all: events against relist (ticks) | all: events against relist (cgroup accounting) | seed 000: iSulad | seed 000: kubelet |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|")?;
    for p in &run.idle {
        let seed = ISULAD.iter().find(|(n, _, _)| *n == p.containers);
        writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            p.containers,
            red_text(reduction(p.events.runtime_side(), p.relist.runtime_side())),
            red_text(reduction(p.events.agent, p.relist.agent)),
            red_text(reduction(p.events.total(), p.relist.total())),
            if both_accounted(p) {
                red_text(point_reduction(p))
            } else {
                "—".to_string()
            },
            seed.map(|s| format!("−{} %", s.1))
                .unwrap_or_else(|| "—".into()),
            seed.map(|s| format!("−{} %", s.2))
                .unwrap_or_else(|| "—".into()),
        )?;
    }
    writeln!(o)?;
    Ok(())
}

fn adoption_lines(o: &mut String, run: &TargetRun) -> std::fmt::Result {
    for a in &run.adoptions {
        writeln!(
            o,
            "- restart into {} mode: {} of {} running containers kept their ids, {} new; the new agent served /healthz and had relisted {} ms after it was spawned; every pod running at /pods {} ms after SIGTERM to the old agent.",
            a.to.map(Mode::arg).unwrap_or("?"),
            a.kept,
            a.before,
            a.new,
            ms(a.startup),
            ms(a.took)
        )?;
    }
    writeln!(o)?;
    Ok(())
}

fn exit_table(o: &mut String, run: &TargetRun) -> std::fmt::Result {
    writeln!(
        o,
        "| mode | exits | kill(2) → /pods terminated: p50 ms | p99 ms | max ms | reference | kill(2) → reference: p50 ms | p99 ms | max ms | exit codes other than {KILLED} |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|---|---|---|")?;
    for (mode, e) in &run.exits {
        writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            mode.arg(),
            e.agent.len(),
            ms(e.agent.p50()),
            ms(e.agent.p99()),
            ms(e.agent.max()),
            reference_name(e.reference),
            ms(e.runtime.p50()),
            ms(e.runtime.p99()),
            ms(e.runtime.max()),
            if e.wrong_codes.is_empty() {
                "none".to_string()
            } else {
                format!("{:?}", e.wrong_codes)
            }
        )?;
    }
    writeln!(o)?;
    Ok(())
}

/// The sections P10-P13.
pub fn sections(o: &mut String, r: &AgentResults) -> std::fmt::Result {
    writeln!(o, "## P10-P13 The agent (`petrel agent`)")?;
    writeln!(o)?;
    let method = match r.method {
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
    writeln!(
        o,
        "**The setup.** A `petrel runtime` of its own (root, state and cgroup parent inside the \
         bench's) and a `petrel agent` beside it (`--runtime-endpoint` on its socket, its own \
         manifest directory, root, `--node-name bench-<id>`, `--cgroup-root \
         /petrel-bench-<id>/agent`), started by the bench in event mode (`--pleg events`, \
         safety-net relist every 5 min) or relist mode (`--pleg relist --relist-period \
         {RELIST_PERIOD}`). Switching modes stops the agent (SIGTERM) and starts it again on \
         the same runtime: pods are adopted, not recreated (checked by container id, below). \
         After each start the bench waits for `/healthz` to answer 200 and for the agent's \
         first relist (its relist counter at `/metrics`): pods are adopted only after it. \
         Pods are Kubernetes v1 Pod manifests in namespace `bench`, busybox containers running \
         `sleep`, `imagePullPolicy: IfNotPresent` (the image is imported into the runtime \
         first), `terminationGracePeriodSeconds: 0`; each manifest is written to a hidden \
         temporary file and renamed into place. The bench sees the pods through {method}. Then \
         the same against containerd 1.7 where `make containerd` has unpacked it (its pods in \
         the host network: no CNI)."
    )?;
    writeln!(o)?;

    // ---- P10 ----
    writeln!(o, "### P10 Idle CPU: events instead of relisting")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** With pods running and nothing happening, the agent in event mode and its \
         runtime use at least {:.0} % less CPU than in relist mode, and at most \
         {IDLE_EVENTS_PERCENT_GOAL} % of one core at 100 containers (seed 000: iSulad's evented \
         PLEG cut iSulad's steady-state CPU by about 30 % and kubelet's by about 10 %).",
        IDLE_REDUCTION_GOAL * 100.0
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** Pods of one container each, grown to each size through manifests; after \
         {} s of quiet, utime + stime from `/proc/<pid>/stat` of the runtime, the agent and \
         every shim of the runtime (ticks, {} per second, exited threads included), read before \
         and after an idle window of {} s; for the window the same processes are also moved \
         into a cgroup of their own in the cpuacct hierarchy (moved back after it), whose \
         `cpuacct.usage` counts nanoseconds, children such as a `runc` they start included: \
         the verdict is judged on that figure where both modes have it (ticks are too coarse \
         for an idle minute's 10-20 ms), else on ticks; then the agent is restarted in the other mode, \
         {} s of quiet, and the same window again. The first mode alternates from size to size. \
         Both modes' windows contain the agent's periodic resync (every 10 s). Relists in the \
         window are the agent's own `kubelet_pleg_relist_duration_seconds_count` (read outside \
         the CPU window). The containers' own processes (`sleep`) are not counted.",
        SETTLE.as_secs(),
        procfs::ticks_per_second(),
        r.idle_seconds,
        SETTLE.as_secs()
    )?;
    writeln!(o)?;
    writeln!(o, "**Petrel's runtime.**")?;
    writeln!(o)?;
    idle_table(o, &r.petrel)?;
    writeln!(o, "Agent restarts (adoption):")?;
    writeln!(o)?;
    adoption_lines(o, &r.petrel)?;
    match &r.containerd {
        Ok(cd) => {
            writeln!(o, "**{}.**", cd.name)?;
            writeln!(o)?;
            idle_table(o, cd)?;
            adoption_lines(o, cd)?;
        }
        Err(why) => {
            writeln!(o, "**containerd 1.7: not measured** — {}.", one_line(why))?;
            writeln!(o)?;
        }
    }
    if let Some(p) = at_100(&r.petrel) {
        writeln!(
            o,
            "**Result.** At {} containers: event mode {:.3} % of a core, relist mode {:.3} % \
             ({}, by {}) — {}.",
            p.containers,
            pct_ms(totals_ms(p).0, p.events.wall),
            pct_ms(totals_ms(p).1, p.relist.wall),
            red_text(point_reduction(p)),
            measure_name(p),
            if p.containers == 100 {
                verdict(idle_pass(p))
            } else {
                "not measured at 100 containers"
            }
        )?;
        writeln!(o)?;
    }

    // ---- P11 ----
    writeln!(o, "### P11 Exit → status at /pods")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** In event mode a container's death shows at `/pods` (state terminated, \
         with its exit code) within {} ms at p99.",
        EXIT_P99_GOAL.as_millis()
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** {} pods in event mode and {} in relist mode, each with one `sleep` container and `restartPolicy: Never` (the \
         pods of P12). For each in turn, after {} ms of quiet (in relist mode plus a uniformly \
         random part of {} ms, so that exits do not fall at one phase of the relist loop): the \
         init's pid from the runtime's \
         verbose ContainerStatus, the time, SIGKILL to that pid with kill(2); the end is the \
         arrival of the pod's status with the container terminated (exit code {KILLED} \
         expected). The reference is the runtime's own STOPPED event for the same exit at the \
         bench's GetContainerEvents subscriber, timed from the same kill(2). On containerd 1.7 \
         the bench cannot subscribe beside the agent: its GetContainerEvents hands each event to \
         one subscriber only (containerd#7318, fixed in 2.0), so the bench would take events \
         from the agent; its reference there is ContainerStatus reporting EXITED, polled every \
         {} ms from just before the kill(2).",
        r.pods,
        r.relist_pods,
        GAP.as_millis(),
        RELIST_JITTER.as_millis(),
        STATUS_POLL.as_millis()
    )?;
    writeln!(o)?;
    writeln!(o, "**Petrel's runtime.**")?;
    writeln!(o)?;
    exit_table(o, &r.petrel)?;
    match &r.containerd {
        Ok(cd) => {
            writeln!(o, "**{}.**", cd.name)?;
            writeln!(o)?;
            exit_table(o, cd)?;
        }
        Err(why) => {
            writeln!(o, "**containerd 1.7: not measured** — {}.", one_line(why))?;
            writeln!(o)?;
        }
    }
    writeln!(
        o,
        "In relist mode the agent learns of an exit at its next relist ({RELIST_PERIOD} \
         period): half a period on average, a whole one at worst."
    )?;
    writeln!(o)?;

    // ---- P12 ----
    writeln!(o, "### P12 Manifest → running")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** A pod written as a manifest runs (all containers running at `/pods`) \
         within {START_RATIO_GOAL}× the time the runtime itself takes to run it."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** {} pods in event mode and {} in relist mode, one at a time after {} ms of quiet (plus up to {} ms at \
         random in relist mode, as for P11): the time just before \
         the manifest's rename into the directory, to the arrival of the pod's status with its \
         container running. The reference, alternating pod by pod, is the same pod (one busybox \
         `sleep` container, network and IPC namespaces per pod) made by the bench directly: \
         RunPodSandbox + CreateContainer + StartContainer on the same runtime, then removed \
         untimed. The agent's own `kubelet_pod_start_duration_seconds` (first seen → all \
         running) over the same pods is shown beside.",
        r.pods,
        r.relist_pods,
        GAP.as_millis(),
        RELIST_JITTER.as_millis()
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| mode | pods | manifest → running: p50 ms | p99 ms | max ms | direct CRI: p50 ms | p99 ms | ratio p50 | ratio p99 | agent's pod_start_duration mean ms |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|---|---|---|")?;
    for (mode, s) in &r.petrel.starts {
        writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            mode.arg(),
            s.agent.len(),
            ms(s.agent.p50()),
            ms(s.agent.p99()),
            ms(s.agent.max()),
            ms(s.direct.p50()),
            ms(s.direct.p99()),
            ratio(s.agent.p50(), s.direct.p50()),
            ratio(s.agent.p99(), s.direct.p99()),
            s.agent_metric_mean.map(ms).unwrap_or_else(|| "—".into())
        )?;
    }
    writeln!(o)?;
    if let Ok(cd) = &r.containerd {
        for (mode, s) in &cd.starts {
            writeln!(
                o,
                "On {} ({} mode, no direct reference): manifest → running {} over {} pods.",
                cd.name,
                mode.arg(),
                lat(&s.agent),
                s.agent.len()
            )?;
        }
        writeln!(o)?;
    }
    for (n, d) in &r.petrel.deletes {
        writeln!(
            o,
            "Deleting {n} manifests → those pods gone from `/pods` and from the runtime: {} ms.",
            ms(*d)
        )?;
    }
    writeln!(o)?;

    // ---- P13 ----
    writeln!(o, "### P13 One relist")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** One full relist (list this node's sandboxes and containers, diff, inspect \
         what changed) takes at most {} ms with {RELIST_GOAL_PODS} pods of 5 containers.",
        RELIST_GOAL.as_millis()
    )?;
    writeln!(o)?;
    let l = &r.large;
    writeln!(
        o,
        "**Method.** Pods of {} containers, grown through manifests with the agent in event \
         mode (100 pods, then {}); at each size the agent is restarted in relist mode, {} s of \
         quiet, then the sum and count of its `kubelet_pleg_relist_duration_seconds` over {} s \
         give the mean relist (nothing changes, so each relist is the two List calls and the \
         diff). The reference is {LIST_ROUNDS} rounds of the same two calls with the same label \
         selector from the bench (after 5 unmeasured), 20 ms apart. The smaller sizes of P10 \
         give relist figures too (its table's relist column).",
        l.per_pod,
        l.written,
        SETTLE.as_secs(),
        r.relist_seconds
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| pods | containers | window s | relists | mean relist ms | reference p50 ms | p99 ms | mean ms | mean / reference mean |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|---|---|")?;
    for p in &r.relist {
        writeln!(
            o,
            "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            p.pods,
            p.containers,
            p.wall.as_secs_f64(),
            p.count,
            ms(p.mean),
            ms(p.reference.p50()),
            ms(p.reference.p99()),
            ms(p.reference.mean()),
            ratio(p.mean, p.reference.mean())
        )?;
    }
    writeln!(o)?;
    writeln!(
        o,
        "The large layout: {} of {} pods written; the last step, {} → {} pods, ran {} \
         containers {:.1} s after its manifests were written (per the runtime's ListContainers, \
         polled every 2 s); removing every pod of the agent through CRI at the end (four at a \
         time) took {:.1} s.{}",
        l.written,
        l.target_pods,
        l.grown_from,
        l.written,
        l.running,
        l.grow.as_secs_f64(),
        l.teardown.as_secs_f64(),
        l.note
            .as_ref()
            .map(|n| format!(" Note: {n}."))
            .unwrap_or_default()
    )?;
    writeln!(o)?;
    for (who, run) in [
        ("petrel runtime", Some(&r.petrel)),
        ("containerd", r.containerd.as_ref().ok()),
    ] {
        if let Some(e) = run.and_then(|x| x.error.as_ref()) {
            writeln!(o, "**The run against {who} stopped early:**")?;
            writeln!(o)?;
            writeln!(o, "```text\n{}\n```", e.trim())?;
            writeln!(o)?;
        }
    }
    Ok(())
}
