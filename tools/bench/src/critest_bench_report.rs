//! P28 in docs/PERFORMANCE.md: the summary row and the section, from
//! `templates/critest_bench.md`.

use std::time::Duration;

use petrel_testkit::critest_bench::BenchRun;

use crate::critest_bench::CritestBenchResults;
use crate::stats::{ms, one_line, ratio, stopped_vars, verdict};
use crate::template::{render, TemplateError, Vars};

/// The row and section P28.
const TEMPLATE: &str = include_str!("../templates/critest_bench.md");

/// One operation both runtimes measured: (name, samples, Petrel's
/// median, containerd's median), in Petrel's order.
fn compared(p: &BenchRun, c: &BenchRun) -> Vec<(String, usize, Duration, Duration)> {
    p.operations
        .iter()
        .filter_map(|op| {
            let theirs = c.operation(&op.name)?;
            Some((
                op.name.clone(),
                op.samples.len(),
                op.median()?,
                theirs.median()?,
            ))
        })
        .collect()
}

/// The median of CreateContainer + StartContainer, summed per sample
/// (critest times both in one datapoint).
fn create_and_start(r: &BenchRun) -> Option<Duration> {
    let (c, s) = (
        r.operation("CreateContainer")?,
        r.operation("StartContainer")?,
    );
    let mut sums: Vec<Duration> = c
        .samples
        .iter()
        .zip(&s.samples)
        .map(|(a, b)| *a + *b)
        .collect();
    sums.sort();
    sums.get(sums.len() / 2).copied()
}

/// Every value of the template; `rows` or `sections` says which half to
/// render.
fn vars(r: &CritestBenchResults, rows: bool) -> Vars {
    let mut v = Vars::new();
    v.flag("rows", rows)
        .flag("sections", !rows)
        .set("pods", r.params.pods)
        .set("containers", r.params.containers)
        .set("images", r.params.images)
        .set("containerd_version", &r.containerd_version)
        .set("critest_version", &r.critest_version);
    let (p, c) = match (&r.petrel, &r.containerd) {
        (Ok(p), Ok(c)) => (p, c),
        (Err(e), _) => return missing(v, &format!("Petrel's run: {e}")),
        (_, Err(e)) => return missing(v, &format!("containerd's run: {e}")),
    };
    let ops = compared(p, c);
    if ops.is_empty() {
        return missing(v, "no operation was measured on both runtimes");
    }
    let below = ops.iter().filter(|(_, _, a, b)| a <= b).count();
    let worst = ops
        .iter()
        .max_by(|x, y| {
            let rx = x.2.as_secs_f64() / x.3.as_secs_f64().max(f64::MIN_POSITIVE);
            let ry = y.2.as_secs_f64() / y.3.as_secs_f64().max(f64::MIN_POSITIVE);
            rx.total_cmp(&ry)
        })
        .map(|(name, _, a, b)| (name.clone(), ratio(*a, *b)))
        .unwrap_or_default();
    let failures: Vec<String> = p
        .failures()
        .into_iter()
        .map(|f| format!("Petrel: {f}"))
        .chain(c.failures().into_iter().map(|f| format!("containerd: {f}")))
        .collect();
    match (create_and_start(p), create_and_start(c)) {
        (Some(a), Some(b)) => v
            .flag("create_start", true)
            .set("create_start_petrel", ms(a))
            .set("create_start_containerd", ms(b))
            .set("create_start_ratio", ratio(a, b)),
        _ => v.flag("create_start", false),
    };
    v.flag("measured", true)
        .set("at_or_below", below)
        .set("compared", ops.len())
        .set("worst_op", worst.0)
        .set("worst_ratio", worst.1)
        .set(
            "verdict",
            verdict(below == ops.len() && failures.is_empty()),
        )
        .set("petrel_seconds", format!("{:.0}", p.critest_seconds))
        .set("containerd_seconds", format!("{:.0}", c.critest_seconds))
        .list(
            "ops",
            ops.iter()
                .map(|(name, n, a, b)| {
                    let mut row = Vars::new();
                    row.set("name", name)
                        .set("n", n)
                        .set("petrel", ms(*a))
                        .set("containerd", ms(*b))
                        .set("ratio", ratio(*a, *b))
                        .set("verdict", verdict(a <= b));
                    row
                })
                .collect(),
        )
        .list(
            "failures",
            failures
                .iter()
                .map(|f| {
                    let mut row = Vars::new();
                    row.set("line", one_line(f));
                    row
                })
                .collect(),
        )
        .list("stopped", Vec::new());
    v
}

/// The values when the comparison cannot be made.
fn missing(mut v: Vars, why: &str) -> Vars {
    v.flag("measured", false)
        .flag("create_start", false)
        .set("why", one_line(why))
        .set("petrel_seconds", "—")
        .set("containerd_seconds", "—")
        .list("ops", Vec::new())
        .list("failures", Vec::new())
        .list("stopped", stopped_vars(Some(why)));
    v
}

/// The row of P28 in the summary table.
pub fn summary_rows(r: &CritestBenchResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The P28 section.
pub fn sections(r: &CritestBenchResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
}
