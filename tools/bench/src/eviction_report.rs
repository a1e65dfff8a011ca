//! P21 and P22 in docs/PERFORMANCE.md: the summary rows and the sections.

use std::time::Duration;

use crate::eviction::{
    passes_in, CpuWindow, EvictionResults, FAST_PERIOD, HOG, NODE_MEMORY, POLL_PERIOD, STEADY_PODS,
    THRESHOLD,
};
use crate::stats::{ms, ratio, samples_vars, stopped_vars, verdict, why_cell};
use crate::template::{render, TemplateError, Vars};

/// The rows and sections P21-P22.
const TEMPLATE: &str = include_str!("../templates/eviction.md");

/// Goal of P21: crossing → stop call with notifications, at p99.
const REACTION_GOAL: Duration = Duration::from_millis(200);
/// Goal of P22: the manager's CPU per 60 s idle (0.1 % of one core, the
/// "≈ 0" of P5).
const IDLE_GOAL: Duration = Duration::from_millis(60);
/// The window P22 is stated for.
const MINUTE: f64 = 60.0;

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn ms1(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// P22's figures: the manager's CPU per 60 s from the cost of one pass,
/// and the difference between the default and the parked windows.
struct IdleCost {
    per_pass: Duration,
    estimate: Duration,
    idle: Duration,
    parked: Duration,
    difference: f64,
}

fn idle_cost(r: &EvictionResults) -> Option<IdleCost> {
    let per_pass = r.per_pass()?;
    let (idle, parked) = (r.idle?, r.parked?);
    let passes = passes_in(Duration::from_secs_f64(MINUTE), POLL_PERIOD);
    let (i, p) = (idle.agent_per(MINUTE), parked.agent_per(MINUTE));
    Some(IdleCost {
        per_pass,
        estimate: per_pass.mul_f64(passes),
        idle: i,
        parked: p,
        difference: (i.as_secs_f64() - p.as_secs_f64()) * 1e3,
    })
}

/// A row of P22's window table.
fn window_vars(what: &str, w: Option<CpuWindow>) -> Vars {
    let mut v = Vars::new();
    v.set("what", what).flag("measured", w.is_some());
    if let Some(w) = w {
        v.set("wall", format!("{:.1}", w.wall.as_secs_f64()))
            .set("agent", format!("{:.3}", w.agent.as_secs_f64() * 1e3))
            .set(
                "agent_per_minute",
                format!("{:.3}", w.agent_per(MINUTE).as_secs_f64() * 1e3),
            )
            .set("runtime", format!("{:.3}", w.runtime.as_secs_f64() * 1e3));
    }
    v
}

/// Every value of the template; `rows` or `sections` says which half
/// to render.
fn vars(r: &EvictionResults, rows: bool) -> Vars {
    let passes = passes_in(Duration::from_secs_f64(MINUTE), POLL_PERIOD);
    let (n, p) = (&r.notified, &r.polled);
    let mut v = Vars::new();
    v.flag("rows", rows)
        .flag("sections", !rows)
        .set("why", why_cell(r.error.as_deref()))
        .set("poll_s", POLL_PERIOD.as_secs())
        .set("fast_ms", FAST_PERIOD.as_millis())
        .set("steady_pods", STEADY_PODS)
        .set("passes", format!("{passes:.0}"));

    // P21
    v.set(
        "reaction_promise",
        "Eviction: memory threshold crossing → the eviction's StopContainer call, with notifications (cgroup v1 memory threshold)",
    )
    .set("reaction_goal", format!("p99 ≤ {} ms", REACTION_GOAL.as_millis()))
    .flag("reaction_measured", n.len() > 0)
    .set("n_p50", ms(n.p50()))
    .set("n_p99", ms(n.p99()))
    .set("n_max", ms(n.max()))
    .set("n_rounds", n.len())
    .flag("polled", p.len() > 0)
    .set("p_p50", ms(p.p50()))
    .set("p_p99", ms(p.p99()))
    .set("p_rounds", p.len())
    .set("ratio_p50", ratio(n.p50(), p.p50()))
    .set("ratio_p99", ratio(n.p99(), p.p99()))
    .set("reaction_verdict", verdict(n.p99() <= REACTION_GOAL))
    .set("node_mib", NODE_MEMORY >> 20)
    .set("threshold_mib", THRESHOLD >> 20)
    .set("crossing_mib", (NODE_MEMORY - THRESHOLD) >> 20)
    .set("hog_mib", HOG >> 20)
    .set("realtime_stamps", r.realtime_stamps)
    .set("rounds", n.len() + p.len())
    .set(
        "hog_peak",
        r.hog_peak
            .map(|b| format!("{:.1} MiB", b as f64 / (1 << 20) as f64))
            .unwrap_or_else(|| "—".into()),
    )
    .list(
        "reaction_rows",
        vec![
            samples_vars("notifications: crossing → StopContainer", n),
            samples_vars(
                "notifications: crossing → eviction decided",
                &r.notified_decision,
            ),
            samples_vars("polling only: crossing → StopContainer", p),
            samples_vars(
                "polling only: crossing → eviction decided",
                &r.polled_decision,
            ),
        ],
    )
    .set("early_stops", r.early_stops);

    // P22
    let cost = idle_cost(r)
        .map(|c| {
            let mut v = Vars::new();
            v.set("per_pass", us(c.per_pass))
                .set("estimate", ms1(c.estimate))
                .set("idle", ms1(c.idle))
                .set("parked", ms1(c.parked))
                .set("difference", format!("{:.1}", c.difference))
                .set("signed_difference", format!("{:+.1}", c.difference))
                .set(
                    "idle_verdict",
                    verdict(
                        c.estimate <= IDLE_GOAL && c.difference <= IDLE_GOAL.as_secs_f64() * 1e3,
                    ),
                );
            v
        })
        .into_iter()
        .collect();
    v.set(
        "idle_promise",
        format!(
            "Eviction manager's idle CPU over 60 s ({STEADY_PODS} pods, default settings: a pass every {} s, notifications armed)",
            POLL_PERIOD.as_secs()
        ),
    )
    .set(
        "idle_goal",
        format!(
            "≤ {} ms per 60 s (0.1 % of one core, ≈ 0)",
            IDLE_GOAL.as_millis()
        ),
    )
    .list("cost", cost)
    .list(
        "windows",
        vec![
            window_vars("default settings (pass every 10 s)", r.idle),
            window_vars("passes parked (1 h period)", r.parked),
            window_vars("a pass every 100 ms", r.fast),
        ],
    );
    v.list("stopped", stopped_vars(r.error.as_deref()));
    v
}

/// The rows of P21 and P22 in the summary table.
pub fn summary_rows(r: &EvictionResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The P21 and P22 sections.
pub fn sections(r: &EvictionResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_should_say_not_measured_with_the_reason() {
        let r = EvictionResults {
            error: Some("no v1 memory controller\nmore".into()),
            ..Default::default()
        };
        let o = summary_rows(&r).unwrap_or_default();
        assert_eq!(
            o.matches("not measured: no v1 memory controller |").count(),
            2
        );
    }

    #[test]
    fn p22_should_scale_one_pass_to_a_minute() {
        let w = |secs: u64, ms: u64| CpuWindow {
            wall: Duration::from_secs(secs),
            agent: Duration::from_millis(ms),
            runtime: Duration::ZERO,
        };
        let r = EvictionResults {
            idle: Some(w(60, 33)),
            parked: Some(w(60, 30)),
            fast: Some(w(20, 110)),
            ..Default::default()
        };
        let c = idle_cost(&r).unwrap_or_else(|| panic!("no cost"));
        // 500 µs per pass × 6 passes.
        assert_eq!(c.estimate, Duration::from_millis(3));
        assert!((c.difference - 3.0).abs() < 1e-9);
        let o = summary_rows(&r).unwrap_or_default();
        assert!(
            o.contains("3.0 ms per 60 s (6 passes × 500 µs per pass)"),
            "{o}"
        );
        assert!(o.contains("**PASS**"), "{o}");
    }
}
