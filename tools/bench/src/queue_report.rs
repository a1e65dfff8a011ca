//! The queue figures (P6-P9) as rows of the summary and sections of
//! docs/PERFORMANCE.md, from `templates/queue.md`.

use std::time::Duration;

use crate::queue::{
    Depth, QueueResults, Run, Throughput, KEYS, MAX_WAIT, RECONCILE, RESYNC_AT, RESYNC_PHASE_END,
    RESYNC_WINDOW, THROUGHPUT_BATCH, THROUGHPUT_KEYS, USER_RATE, WORKERS,
};
use crate::stats::{ms, ratio, verdict};
use crate::template::{render, TemplateError, Vars};

/// The rows and sections P6-P9.
const TEMPLATE: &str = include_str!("../templates/queue.md");

/// Goal of P6: user-event p99.9 in the storm over its no-storm value.
const USER_P999_RATIO_GOAL: f64 = 1.2;
/// Goal of P7: how much lower the depth in front of user events is.
const DEPTH_REDUCTION_GOAL: f64 = 0.97;
/// Goal of P9: adds + gets per second on one thread.
const THROUGHPUT_GOAL: f64 = 1_000_000.0;

fn p999(r: &Run) -> Duration {
    r.user.percentile(99.9)
}

fn user_pass(r: &QueueResults) -> bool {
    let calm = p999(&r.calm_priority);
    r.storm_priority.user.len() > 0
        && !calm.is_zero()
        && p999(&r.storm_priority).as_secs_f64() <= calm.as_secs_f64() * USER_P999_RATIO_GOAL
}

fn reduction(ours: &Depth, fifo: &Depth) -> f64 {
    if fifo.mean == 0.0 {
        return 0.0;
    }
    1.0 - ours.mean / fifo.mean
}

fn depth_pass(r: &QueueResults) -> bool {
    r.storm_fifo.front_resync.samples > 0
        && reduction(&r.storm_priority.front_resync, &r.storm_fifo.front_resync)
            >= DEPTH_REDUCTION_GOAL
}

fn starvation_pass(r: &QueueResults) -> bool {
    r.storm_priority.storm_served > 0 && r.storm_priority.storm_max_wait <= MAX_WAIT
}

fn throughput_pass(r: &QueueResults) -> bool {
    r.throughput_priority.median() >= THROUGHPUT_GOAL
}

fn lat3(r: &Run) -> String {
    format!(
        "p50 {} ms, p99 {} ms, p99.9 {} ms",
        ms(r.user.p50()),
        ms(r.user.p99()),
        ms(p999(r))
    )
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn mops(t: &Throughput) -> String {
    format!("{:.2} M ops/s", t.median() / 1e6)
}

fn ratio_f(a: f64, b: f64) -> String {
    if b == 0.0 {
        return "n/a".to_string();
    }
    format!("{:.2}×", a / b)
}

fn depth_cells(d: &Depth) -> String {
    format!("{:.2} / {}", d.mean, d.peak)
}

/// A row of the runs table.
fn run_vars(queue: &str, run: &str, x: &Run) -> Vars {
    let mut v = Vars::new();
    v.set("queue", queue)
        .set("run", run)
        .set("runs", x.runs)
        .set("events", x.user.len())
        .set("p50", ms(x.user.p50()))
        .set("p99", ms(x.user.p99()))
        .set("p999", ms(p999(x)))
        .set("max", ms(x.user.max()))
        .set("front_initial", depth_cells(&x.front_initial))
        .set("front_resync", depth_cells(&x.front_resync))
        .set("total_resync", depth_cells(&x.total_resync))
        .set("served", x.storm_served)
        .set(
            "longest_wait",
            if x.storm_served > 0 {
                secs(x.storm_max_wait)
            } else {
                "—".to_string()
            },
        );
    v
}

/// Every value of the template; `rows` or `sections` says which half
/// to render.
fn vars(r: &QueueResults, rows: bool) -> Vars {
    let (sp, cp, nr) = (&r.storm_priority, &r.calm_priority, &r.storm_no_reserve);
    let (sf, cf) = (&r.storm_fifo, &r.calm_fifo);
    let mut v = Vars::new();
    v.flag("rows", rows)
        .flag("sections", !rows)
        .set("keys", KEYS)
        .set("workers", WORKERS)
        .set("kept_workers", WORKERS - 1)
        .set("user_goal", USER_P999_RATIO_GOAL)
        .set(
            "depth_goal_pct",
            format!("{:.0}", DEPTH_REDUCTION_GOAL * 100.0),
        )
        .set("max_wait_s", MAX_WAIT.as_secs())
        .set("reconcile_ms", RECONCILE.as_millis())
        .set("resync_at_s", RESYNC_AT.as_secs())
        .set("resync_end_s", RESYNC_PHASE_END.as_secs())
        .set("resync_window_s", RESYNC_WINDOW.as_secs())
        .set("user_rate", USER_RATE)
        .set("throughput_batch", THROUGHPUT_BATCH)
        .set("throughput_keys", THROUGHPUT_KEYS);

    // P6
    v.set("storm_lat", lat3(sp))
        .set("calm_lat", lat3(cp))
        .set("storm_p999", ms(p999(sp)))
        .set("calm_p999", ms(p999(cp)))
        .set("fifo_storm_p999", ms(p999(sf)))
        .set("fifo_calm_p999", ms(p999(cf)))
        .set("no_reserve_p999", ms(p999(nr)))
        .set("storm_vs_calm", ratio(p999(sp), p999(cp)))
        .set("fifo_storm_vs_calm", ratio(p999(sf), p999(cf)))
        .set("no_reserve_vs_calm", ratio(p999(nr), p999(cp)))
        .set("user_verdict", verdict(user_pass(r)));

    // P7
    v.set("front_resync_mean", format!("{:.2}", sp.front_resync.mean))
        .set("front_resync_peak", sp.front_resync.peak)
        .set(
            "fifo_front_resync_mean",
            format!("{:.1}", sf.front_resync.mean),
        )
        .set("fifo_front_resync_peak", sf.front_resync.peak)
        .set(
            "front_initial_mean",
            format!("{:.2}", sp.front_initial.mean),
        )
        .set("front_initial_peak", sp.front_initial.peak)
        .set(
            "fifo_front_initial_mean",
            format!("{:.1}", sf.front_initial.mean),
        )
        .set("fifo_front_initial_peak", sf.front_initial.peak)
        .set("total_resync_mean", format!("{:.1}", sp.total_resync.mean))
        .set("total_resync_peak", sp.total_resync.peak)
        .set(
            "depth_reduction_pct",
            format!(
                "{:.2}",
                reduction(&sp.front_resync, &sf.front_resync) * 100.0
            ),
        )
        .set("depth_verdict", verdict(depth_pass(r)));

    // P8
    v.set("storm_served", sp.storm_served)
        .set("storm_max_wait", secs(sp.storm_max_wait))
        .set("fifo_storm_max_wait", secs(sf.storm_max_wait))
        .set("no_reserve_max_wait", secs(nr.storm_max_wait))
        .set("wait_vs_bound", ratio(sp.storm_max_wait, MAX_WAIT))
        .set("starvation_verdict", verdict(starvation_pass(r)))
        .set(
            "initial_list_s",
            format!(
                "{:.1}",
                KEYS as f64 * sp.reconcile.mean().as_secs_f64() / (WORKERS - 1) as f64
            ),
        );

    // P9
    v.set("throughput", mops(&r.throughput_priority))
        .set("throughput_rounds", r.throughput_priority.rounds.len())
        .set("fifo_throughput", mops(&r.throughput_fifo))
        .set(
            "throughput_ratio",
            ratio_f(r.throughput_priority.median(), r.throughput_fifo.median()),
        )
        .set("throughput_verdict", verdict(throughput_pass(r)))
        .list(
            "throughputs",
            [
                ("priority (three tiers)", &r.throughput_priority),
                ("FIFO (one tier)", &r.throughput_fifo),
            ]
            .into_iter()
            .map(|(name, t)| {
                let rounds: Vec<String> =
                    t.rounds.iter().map(|x| format!("{:.2}", x / 1e6)).collect();
                let mut tv = Vars::new();
                tv.set("name", name)
                    .set("median", mops(t))
                    .set("rounds", rounds.join(", "));
                tv
            })
            .collect(),
        );

    // The scenario and the runs.
    v.set("events_per_run", sp.user.len() / sp.runs.max(1))
        .set("wall_s", format!("{:.0}", sp.wall.as_secs_f64()))
        .set("reconcile_mean", ms(sp.reconcile.mean()))
        .set("reconcile_p99", ms(sp.reconcile.p99()))
        .set("priority_runs", sp.runs)
        .set("storm_events", sp.user.len())
        .set("p999_rank", nearest_rank(sp.user.len(), 99.9))
        .list(
            "runs",
            vec![
                run_vars("priority", "no storm", cp),
                run_vars("priority", "storm", sp),
                run_vars("priority, no kept worker", "storm", nr),
                run_vars("FIFO (reference)", "no storm", cf),
                run_vars("FIFO (reference)", "storm", sf),
            ],
        );
    v
}

/// The summary rows P6-P9.
pub fn summary_rows(r: &QueueResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The sections P6-P9.
pub fn sections(r: &QueueResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
}

fn nearest_rank(n: usize, p: f64) -> usize {
    // As `Samples::percentile` ranks.
    (((p / 100.0) * n as f64 - 1e-9).ceil() as usize).clamp(1, n.max(1))
}
