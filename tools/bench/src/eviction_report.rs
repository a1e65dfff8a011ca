//! P21 and P22 in docs/PERFORMANCE.md: the summary rows and the sections.

use std::fmt::Write;
use std::time::Duration;

use crate::eviction::{
    passes_in, CpuWindow, EvictionResults, FAST_PERIOD, HOG, NODE_MEMORY, POLL_PERIOD, STEADY_PODS,
    THRESHOLD,
};
use crate::stats::{ms, ratio, samples_row, stopped_early, verdict, why_cell};

/// Goal of P21: crossing → stop call with notifications, at p99.
const REACTION_GOAL: Duration = Duration::from_millis(200);
/// Goal of P22: the manager's CPU per 60 s idle (0.1 % of one core, the
/// "≈ 0" of P5).
const IDLE_GOAL: Duration = Duration::from_millis(60);
/// The window P22 is stated for.
const MINUTE: f64 = 60.0;

fn why(r: &EvictionResults) -> String {
    why_cell(r.error.as_deref())
}

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

/// The rows of P21 and P22 in the summary table.
pub fn summary_rows(o: &mut String, r: &EvictionResults) -> std::fmt::Result {
    let promise = "Eviction: memory threshold crossing → the eviction's StopContainer call, with notifications (cgroup v1 memory threshold)";
    let goal = format!("p99 ≤ {} ms", REACTION_GOAL.as_millis());
    let (n, p) = (&r.notified, &r.polled);
    if n.len() == 0 {
        writeln!(
            o,
            "| P21 | {promise} | {goal} | not measured | — | — | not measured: {} |",
            why(r)
        )?;
    } else {
        let reference = if p.len() > 0 {
            format!(
                "polling only (`--eviction-notifications=false`, kubelet's {} s period), same run: p50 {} ms, p99 {} ms ({} rounds); kubelet: up to 10 s",
                POLL_PERIOD.as_secs(),
                ms(p.p50()),
                ms(p.p99()),
                p.len()
            )
        } else {
            "polling only: not measured; kubelet: up to 10 s".to_string()
        };
        writeln!(
            o,
            "| P21 | {promise} | {goal} | p50 {} ms, p99 {} ms, max {} ms ({} rounds) | {reference} | p50 {}×, p99 {}× | {} |",
            ms(n.p50()),
            ms(n.p99()),
            ms(n.max()),
            n.len(),
            ratio(n.p50(), p.p50()),
            ratio(n.p99(), p.p99()),
            verdict(n.p99() <= REACTION_GOAL)
        )?;
    }
    let promise = format!(
        "Eviction manager's idle CPU over 60 s ({STEADY_PODS} pods, default settings: a pass every {} s, notifications armed)",
        POLL_PERIOD.as_secs()
    );
    let goal = format!(
        "≤ {} ms per 60 s (0.1 % of one core, ≈ 0)",
        IDLE_GOAL.as_millis()
    );
    match idle_cost(r) {
        Some(c) => writeln!(
            o,
            "| P22 | {promise} | {goal} | {} per 60 s ({:.0} passes × {} per pass) | the same agent with its passes parked (1 h period), same run: agent {} per 60 s; with default settings: {} (difference {:.1} ms) | — | {} |",
            ms1(c.estimate),
            passes_in(Duration::from_secs_f64(MINUTE), POLL_PERIOD),
            us(c.per_pass),
            ms1(c.parked),
            ms1(c.idle),
            c.difference,
            verdict(c.estimate <= IDLE_GOAL && c.difference <= IDLE_GOAL.as_secs_f64() * 1e3)
        ),
        None => writeln!(
            o,
            "| P22 | {promise} | {goal} | not measured | — | — | not measured: {} |",
            why(r)
        ),
    }
}

fn window_row(o: &mut String, what: &str, w: Option<CpuWindow>) -> std::fmt::Result {
    match w {
        Some(w) => writeln!(
            o,
            "| {what} | {:.1} | {:.3} | {:.3} | {:.3} |",
            w.wall.as_secs_f64(),
            w.agent.as_secs_f64() * 1e3,
            w.agent_per(MINUTE).as_secs_f64() * 1e3,
            w.runtime.as_secs_f64() * 1e3
        ),
        None => writeln!(o, "| {what} | — | — | — | — |"),
    }
}

/// The P21 and P22 sections.
pub fn sections(o: &mut String, r: &EvictionResults) -> std::fmt::Result {
    writeln!(
        o,
        "## P21 Eviction: a memory threshold crossing is acted on within 200 ms"
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** With memory threshold notifications (the default), the agent's \
         eviction manager calls StopContainer for the pod it evicts within 200 ms (p99) of \
         the node's memory crossing a hard threshold; kubelet notices it at its next \
         housekeeping pass, up to 10 s later."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** One `petrel runtime` and one `petrel agent` whose node is a memory cgroup \
         of the bench with a {} MiB limit (`--node-cgroup`), hard threshold \
         `memory.available<{}Mi` (so a working set of {} MiB crosses it), {STEADY_PODS} \
         Guaranteed `sleep` pods running throughout. Each round, a Burstable pod (a \
         BestEffort one would be refused under the memory pressure the previous round left) \
         allocates {} MiB in one step 1 s after it starts (so that the agent knows it as a \
         running pod, as it would one that grows): busybox `dd` reads one block of that \
         size from /dev/zero, touching every page, and holds it while blocked writing to a \
         pipe that `sleep` never reads; its shell exits at SIGTERM. The crossing is stamped by the kernel: before each round the \
         bench registers its own cgroup v1 memory threshold (`cgroup.event_control`, an \
         eventfd, a thread blocked in poll and raised to SCHED_FIFO with `chrt`, so that its \
         wake-up is not queued behind the hog and the agent on the 2 cores: in {} of {} \
         rounds) on the node cgroup's `memory.usage_in_bytes` at \
         the usage where the signal meets the threshold as the agent computes it (capacity − \
         threshold + `total_inactive_file`). The stop call is stamped by the agent's log line \
         `stopping container … reason=\"pod evicted\"`, written just before its \
         StopContainer call; the decision by its `evicting pod` line (both wall clock, µs, \
         as the bench's stamp). Then the bench waits for the pod to be Failed/Evicted at \
         `/pods`, deletes its manifest and waits until it is gone and the node's usage is \
         back down. Rounds with notifications first (a 200 ms pause before each), then the \
         agent is restarted with `--eviction-notifications=false` (the pass every {} s \
         only, kubelet's housekeeping period) and each round waits a random 0-{} s first, so \
         that the crossing falls at a random phase of the pass period. Peak usage of the \
         node cgroup in any round: {}.",
        NODE_MEMORY >> 20,
        THRESHOLD >> 20,
        (NODE_MEMORY - THRESHOLD) >> 20,
        HOG >> 20,
        r.realtime_stamps,
        r.notified.len() + r.polled.len(),
        POLL_PERIOD.as_secs(),
        POLL_PERIOD.as_secs(),
        r.hog_peak
            .map(|b| format!("{:.1} MiB", b as f64 / (1 << 20) as f64))
            .unwrap_or_else(|| "—".into())
    )?;
    writeln!(o)?;
    writeln!(o, "| samples (ms) | n | p50 | p99 | min | max | mean |")?;
    writeln!(o, "|---|---|---|---|---|---|---|")?;
    samples_row(o, "notifications: crossing → StopContainer", &r.notified)?;
    samples_row(
        o,
        "notifications: crossing → eviction decided",
        &r.notified_decision,
    )?;
    samples_row(o, "polling only: crossing → StopContainer", &r.polled)?;
    samples_row(
        o,
        "polling only: crossing → eviction decided",
        &r.polled_decision,
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "Rounds whose StopContainer call was logged before the bench's stamp of the crossing \
         (each waiter is woken by the same kernel event; counted as 0): {}.",
        r.early_stops
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "## P22 Eviction: the manager costs nothing while the node is quiet"
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** With its default settings the eviction manager uses at most 0.1 % of \
         one core (60 ms of CPU per 60 s) on an idle node: a pass every {} s reads a few \
         cgroup and statfs figures, and the memory threshold notifications are threads \
         blocked in poll(2).",
        POLL_PERIOD.as_secs()
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** The same node and {STEADY_PODS} pods as P21, nothing else happening. The \
         agent is restarted three times (its pods adopted, then 5 s to settle) and its CPU \
         (the on-CPU time of its threads, `/proc/<pid>/task/*/schedstat`) read over a window: \
         with the default settings (a pass every {} s, memory thresholds armed); with \
         `--eviction-monitoring-interval=1h` (the manager's first pass at start-up, then \
         none: the reference, everything else the same); with a pass every {} ms. The cost \
         of one pass is the 100 ms window's CPU above the parked rate divided by its passes \
         (wall / period, an upper bound on their number); the figure is that times the {} \
         passes of 60 s. The difference between the default and the parked windows measures \
         the same directly, but is within the noise of two separate windows.",
        POLL_PERIOD.as_secs(),
        FAST_PERIOD.as_millis(),
        passes_in(Duration::from_secs_f64(MINUTE), POLL_PERIOD)
    )?;
    writeln!(o)?;
    if let Some(c) = idle_cost(r) {
        writeln!(
            o,
            "One pass: {}; 60 s at the default period: {}. Agent per 60 s, default settings \
             against parked: {} against {} ({:+.1} ms).",
            us(c.per_pass),
            ms1(c.estimate),
            ms1(c.idle),
            ms1(c.parked),
            c.difference
        )?;
        writeln!(o)?;
    }
    writeln!(
        o,
        "| window | wall (s) | agent CPU (ms) | agent CPU per 60 s (ms) | runtime CPU (ms) |"
    )?;
    writeln!(o, "|---|---|---|---|---|")?;
    window_row(o, "default settings (pass every 10 s)", r.idle)?;
    window_row(o, "passes parked (1 h period)", r.parked)?;
    window_row(o, "a pass every 100 ms", r.fast)?;
    writeln!(o)?;
    stopped_early(o, r.error.as_deref())
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
        let mut o = String::new();
        summary_rows(&mut o, &r).unwrap_or_default();
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
        let mut o = String::new();
        summary_rows(&mut o, &r).unwrap_or_default();
        assert!(
            o.contains("3.0 ms per 60 s (6 passes × 500 µs per pass)"),
            "{o}"
        );
        assert!(o.contains("**PASS**"), "{o}");
    }
}
