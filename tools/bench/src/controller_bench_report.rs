//! P29-P32 in docs/PERFORMANCE.md: the summary rows and the section, from
//! `templates/controller_bench.md`.

use std::time::Duration;

use crate::controller_bench::{
    ControllerResults, Handoff, Impl, ImplRun, Params, BACKGROUND_SHARE, HANDOFF_LEASE, WORKERS,
};
use crate::stats::{ratio, stopped_vars, verdict, Samples};
use crate::template::{render, TemplateError, Vars};

/// The rows and section P29-P32.
const TEMPLATE: &str = include_str!("../templates/controller_bench.md");

/// Every single value the template names, "—" until measured.
const NAMES: &[&str] = &[
    "p_storm",
    "p_quiet",
    "cr_storm",
    "storm_vs_quiet",
    "storm_vs_cr",
    "verdict_storm",
    "depth_petrel",
    "depth_fifo",
    "depth_below",
    "depth_ratio",
    "verdict_depth",
    "graceful_max",
    "crash_max",
    "cr_graceful_max",
    "cr_crash_max",
    "graceful_ratio",
    "crash_ratio",
    "verdict_handoff",
    "mem_per_10k",
    "idle_petrel",
    "cr_mem_per_10k",
    "idle_cr",
    "mem_ratio",
    "idle_ratio",
    "verdict_cost",
    "why",
];

/// Seconds with three decimals.
fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// Milliseconds with one decimal.
fn ms1(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// p99.9.
fn p999(s: &Samples) -> Duration {
    s.percentile(99.9)
}

/// MiB from KiB.
fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// The resident set the storm's objects added, scaled to 10 000 (MiB).
fn per_10k(run: &ImplRun, objects: usize) -> Option<f64> {
    let (small, full) = (run.rss_small_kib?, run.rss_full_kib?);
    if objects == 0 {
        return None;
    }
    Some((full as f64 - small as f64) / 1024.0 * 10_000.0 / objects as f64)
}

/// `a / b` for plain numbers, two decimals.
fn fratio(a: f64, b: f64) -> String {
    if b <= 0.0 {
        return "n/a".into();
    }
    format!("{:.2}", a / b)
}

fn vars(r: &ControllerResults, rows: bool) -> Vars {
    let mut v = Vars::new();
    for n in NAMES {
        v.set(n, "—");
    }
    v.flag("rows", rows)
        .flag("sections", !rows)
        .set("objects", r.objects)
        .set("objects_all", r.objects + Params::USERS)
        .set("users", Params::USERS)
        .set("rate", Params::RATE)
        .set("quiet_changes", Params::QUIET_CHANGES)
        .set("storm_secs", Params::STORM_SECS)
        .set("sync", Params::STORM_SYNC)
        .set("idle_secs", Params::IDLE_SECS)
        .set("graceful_n", Params::GRACEFUL)
        .set("crash_n", Params::CRASH)
        .set("lease", HANDOFF_LEASE.as_secs())
        .set("workers", WORKERS)
        .set("share", BACKGROUND_SHARE)
        .set("cr_version", &r.controller_runtime_version)
        .list("stopped", stopped_vars(r.error.as_deref()));
    let errors: Vec<Vars> = r
        .runs
        .iter()
        .filter_map(|x| Some((x.name.as_str(), x.error.as_deref()?)))
        .chain(
            r.handoffs
                .iter()
                .filter_map(|h| Some((h.name.as_str(), h.error.as_deref()?))),
        )
        .map(|(name, e)| {
            let mut row = Vars::new();
            row.set("name", name).set("line", crate::stats::one_line(e));
            row
        })
        .collect();
    v.list("errors", errors);
    let complete = |x: &ImplRun| x.error.is_none() && x.storm.len() > 0 && x.quiet.len() > 0;
    let (p, fifo, cr) = match (
        r.run(Impl::Petrel),
        r.run(Impl::PetrelFifo),
        r.run(Impl::ControllerRuntime),
    ) {
        (Some(p), Some(f), Some(c)) if complete(p) && complete(f) && complete(c) => (p, f, c),
        _ => {
            let why = r
                .error
                .clone()
                .or_else(|| {
                    r.runs
                        .iter()
                        .find_map(|x| x.error.as_ref().map(|e| format!("{}: {e}", x.name)))
                })
                .unwrap_or_else(|| "a controller's run is missing".into());
            v.flag("measured", false)
                .set("why", crate::stats::one_line(&why))
                .list("runs", Vec::new())
                .list("costs", Vec::new());
            return v;
        }
    };
    v.flag("measured", true);
    // P29.
    let (storm, quiet, cr_storm) = (p999(&p.storm), p999(&p.quiet), p999(&cr.storm));
    let storm_ok = crate::stats::within(storm, quiet, 1.2)
        && crate::stats::within(storm, cr_storm, 0.5)
        && p.storm_unserved == 0;
    v.set("p_storm", ms1(storm))
        .set("p_quiet", ms1(quiet))
        .set("cr_storm", ms1(cr_storm))
        .set("storm_vs_quiet", ratio(storm, quiet))
        .set("storm_vs_cr", ratio(storm, cr_storm))
        .set("verdict_storm", verdict(storm_ok));
    // P30.
    let below = if fifo.depth_mean > 0.0 {
        (1.0 - p.depth_mean / fifo.depth_mean) * 100.0
    } else {
        0.0
    };
    v.set("depth_petrel", format!("{:.2}", p.depth_mean))
        .set("depth_fifo", format!("{:.1}", fifo.depth_mean))
        .set("depth_below", format!("{below:.1}"))
        .set("depth_ratio", fratio(p.depth_mean, fifo.depth_mean))
        .set(
            "verdict_depth",
            verdict(fifo.depth_mean > 0.0 && below >= 97.0 && p.depth_samples > 0),
        );
    // P31.
    let none = Handoff::default();
    let (ph, ch) = (
        r.handoff(Impl::Petrel).unwrap_or(&none),
        r.handoff(Impl::ControllerRuntime).unwrap_or(&none),
    );
    let measured = |h: &Handoff| h.error.is_none() && h.graceful.len() > 0 && h.crash.len() > 0;
    if measured(ph) {
        let ok = ph.graceful.max() <= Duration::from_secs(1)
            && ph.crash.max() <= HANDOFF_LEASE + Duration::from_secs(1);
        v.set("graceful_max", secs(ph.graceful.max()))
            .set("crash_max", secs(ph.crash.max()))
            .set("verdict_handoff", verdict(ok));
    } else {
        v.set("verdict_handoff", "not measured");
    }
    if measured(ch) {
        v.set("cr_graceful_max", secs(ch.graceful.max()))
            .set("cr_crash_max", secs(ch.crash.max()));
        if measured(ph) {
            v.set(
                "graceful_ratio",
                ratio(ph.graceful.max(), ch.graceful.max()),
            )
            .set("crash_ratio", ratio(ph.crash.max(), ch.crash.max()));
        }
    }
    // P32.
    let (pm, cm) = (per_10k(p, r.objects), per_10k(cr, r.objects));
    if let Some(m) = pm {
        v.set("mem_per_10k", format!("{m:.1}"));
    }
    if let Some(m) = cm {
        v.set("cr_mem_per_10k", format!("{m:.1}"));
    }
    if let (Some(a), Some(b)) = (pm, cm) {
        v.set("mem_ratio", fratio(a, b));
    }
    if let Some(n) = p.idle_requests_per_min {
        v.set("idle_petrel", format!("{n:.0}"));
    }
    if let Some(n) = cr.idle_requests_per_min {
        v.set("idle_cr", format!("{n:.0}"));
    }
    if let (Some(a), Some(b)) = (p.idle_requests_per_min, cr.idle_requests_per_min) {
        v.set("idle_ratio", fratio(a, b));
    }
    let cost_ok = matches!((pm, cm), (Some(a), Some(b)) if a <= b)
        && matches!(
            (p.idle_requests_per_min, cr.idle_requests_per_min),
            (Some(a), Some(b)) if a <= b
        );
    v.set("verdict_cost", verdict(cost_ok));
    // The tables.
    let runs = [p, fifo, cr]
        .iter()
        .map(|x| {
            let mut row = Vars::new();
            row.set("name", &x.name)
                .set("quiet_p50", ms1(x.quiet.p50()))
                .set("quiet_p999", ms1(p999(&x.quiet)))
                .set("storm_p50", ms1(x.storm.p50()))
                .set("storm_p99", ms1(x.storm.p99()))
                .set("storm_p999", ms1(p999(&x.storm)))
                .set("ratio", ratio(p999(&x.storm), p999(&x.quiet)))
                .set("patch_quiet", ms1(p999(&x.quiet_patch)))
                .set("patch_storm", ms1(p999(&x.storm_patch)))
                .set(
                    "patch_ratio",
                    ratio(p999(&x.storm_patch), p999(&x.quiet_patch)),
                )
                .set("quiet_n", x.quiet.len())
                .set("storm_n", x.storm.len())
                .set(
                    "unserved",
                    if x.storm_unserved > 0 {
                        format!(" ({} never served)", x.storm_unserved)
                    } else {
                        String::new()
                    },
                )
                .set(
                    "drained",
                    x.drained_after.map_or_else(|| "—".to_string(), secs),
                )
                .set(
                    "slowest",
                    x.storm_slowest
                        .iter()
                        .map(|(at, took)| format!("{:.1} s: {}", at.as_secs_f64(), ms1(*took)))
                        .collect::<Vec<_>>()
                        .join("; "),
                )
                .set("depth_mean", format!("{:.2}", x.depth_mean))
                .set("depth_max", format!("{:.0}", x.depth_max));
            row
        })
        .collect();
    let handoff_cell = |s: &Samples| {
        if s.len() == 0 {
            "—".to_string()
        } else {
            format!("{} / {}", secs(s.p50()), secs(s.max()))
        }
    };
    let costs = [(p, ph), (cr, ch)]
        .iter()
        .map(|(x, h)| {
            let mut row = Vars::new();
            row.set("name", &x.name)
                .set("rss_small", x.rss_small_kib.map_or_else(|| "—".into(), mib))
                .set("rss_full", x.rss_full_kib.map_or_else(|| "—".into(), mib))
                .set(
                    "per_10k",
                    per_10k(x, r.objects).map_or_else(|| "—".into(), |m| format!("{m:.1}")),
                )
                .set(
                    "idle",
                    x.idle_requests_per_min
                        .map_or_else(|| "—".into(), |n| format!("{n:.0}")),
                )
                .set("graceful", handoff_cell(&h.graceful))
                .set("crash", handoff_cell(&h.crash));
            row
        })
        .collect();
    v.list("runs", runs).list("costs", costs);
    v
}

/// The summary rows P29-P32.
pub fn summary_rows(r: &ControllerResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The section P29-P32.
pub fn sections(r: &ControllerResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
}
