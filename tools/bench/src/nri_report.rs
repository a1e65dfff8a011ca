//! P19 and P20 in docs/PERFORMANCE.md: the summary rows and the sections,
//! from `templates/nri.md`.

use std::time::Duration;

use crate::nri::{NriResults, FLOOR_GAP, PLUGIN_COUNTS};
use crate::stats::{ms, ratio, samples_vars, stopped_vars, verdict, why_cell};
use crate::template::{render, TemplateError, Vars};

/// The rows and sections P19-P20.
const TEMPLATE: &str = include_str!("../templates/nri.md");

/// Goal of P19: time added per subscribed plugin at p50.
const PER_PLUGIN_GOAL: Duration = Duration::from_micros(100);
/// Goal of P20: Synchronize of 1000 containers.
const SYNC_GOAL: Duration = Duration::from_millis(50);

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn us_or_dash(d: Option<Duration>) -> String {
    d.map(us).unwrap_or_else(|| "—".into())
}

/// Every value of the template; `rows` or `sections` says which half
/// to render.
fn vars(r: &NriResults, rows: bool) -> Vars {
    let mut v = Vars::new();
    v.flag("rows", rows)
        .flag("sections", !rows)
        .set("why", why_cell(r.error.as_deref()))
        .set("floor_gap_ms", FLOOR_GAP.as_millis());

    // P19
    let [zero, one, three] = &r.create;
    v.set(
        "create_promise",
        "CreateContainer with NRI plugins subscribed to it: time added per plugin",
    )
    .set(
        "create_goal",
        format!("≤ {} per plugin at p50", us(PER_PLUGIN_GOAL)),
    );
    match (r.wait_p50, r.hook_p50, zero.len()) {
        ([Some(w1), Some(w3)], [Some(h1), Some(h3)], n) if n > 0 => {
            let per3 = w3 / 3;
            v.flag("create_measured", true)
                .set("per3", us(per3))
                .set("w1", us(w1))
                .set("w3", us(w3))
                .set("h1", us(h1))
                .set("h3", us(h3))
                .set(
                    "call",
                    r.call_mean
                        .map(|d| format!("; mean plugin call {}", us(d)))
                        .unwrap_or_default(),
                )
                .set("zero_p50", ms(zero.p50()))
                .set("one_p50", ms(one.p50()))
                .set("three_p50", ms(three.p50()))
                .set("creates", zero.len())
                .flag("floor", r.floor.len() > 0)
                .set("floor_p50", us(r.floor.p50()))
                .set("per_plugin_vs_floor", ratio(per3, r.floor.p50()))
                .set("added_vs_create", ratio(w3, zero.p50()))
                .set(
                    "create_verdict",
                    verdict(per3 <= PER_PLUGIN_GOAL && w1 <= PER_PLUGIN_GOAL),
                );
        }
        _ => {
            v.flag("create_measured", false);
        }
    }
    let mut create_rows: Vec<Vars> = PLUGIN_COUNTS
        .iter()
        .zip(&r.create)
        .map(|(n, s)| samples_vars(&format!("CreateContainer, {n} plugins"), s))
        .collect();
    if r.floor.len() > 0 {
        create_rows.push(samples_vars("raw unix-socket round trip (floor)", &r.floor));
    }
    v.set("wait1", us_or_dash(r.wait_p50[0]))
        .set("hook1", us_or_dash(r.hook_p50[0]))
        .set("count1", r.hook_count[0])
        .set("wait3", us_or_dash(r.wait_p50[1]))
        .set("hook3", us_or_dash(r.hook_p50[1]))
        .set("count3", r.hook_count[1])
        .set("call_mean", us_or_dash(r.call_mean))
        .list("create_rows", create_rows);

    // P20
    v.set(
        "sync_promise",
        format!(
            "Synchronize of {} containers to a new plugin",
            r.sync_containers
        ),
    )
    .set("sync_goal", format!("≤ {} ms", SYNC_GOAL.as_millis()))
    .flag("sync_measured", r.sync.len() > 0)
    .set("sync_p50", ms(r.sync.p50()))
    .set("sync_max", ms(r.sync.max()))
    .set("sync_runs", r.sync.len())
    .set("list_p50", ms(r.list.p50()))
    .set("sync_ratio", ratio(r.sync.p50(), r.list.p50()))
    .set("sync_verdict", verdict(r.sync.p50() <= SYNC_GOAL))
    .list(
        "sync_rows",
        vec![
            samples_vars("Synchronize (Configure → handler)", &r.sync),
            samples_vars("ListPodSandbox + ListContainers", &r.list),
        ],
    );
    v.list("stopped", stopped_vars(r.error.as_deref()));
    v
}

/// The rows of P19 and P20 in the summary table.
pub fn summary_rows(r: &NriResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The P19 and P20 sections.
pub fn sections(r: &NriResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
}
