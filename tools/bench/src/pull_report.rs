//! P14 and P15 in docs/PERFORMANCE.md: the summary rows and the sections,
//! from `templates/pull.md`.

use std::time::Duration;

use crate::pull::PullResults;
use crate::stats::{ms, one_line, ratio, verdict, why_cell, within, Samples};
use crate::template::{render, TemplateError, Vars};

/// The rows and sections P14-P15.
const TEMPLATE: &str = include_str!("../templates/pull.md");

/// Goal of P14: Petrel's pull over skopeo copy + umoci unpack, at p50.
const PULL_RATIO_GOAL: f64 = 1.0;
/// Goal of P15: CreateContainer on the large image over the small one, at
/// p50 ("independent of the image's size", with room for noise).
const CREATE_RATIO_GOAL: f64 = 1.1;

/// Seconds with three decimals.
fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn why(r: &PullResults) -> String {
    why_cell(r.error.as_deref())
}

fn what_image(r: &PullResults) -> String {
    match &r.image {
        Some(i) => format!("{} ({} layers)", mb(i.compressed()), i.layers.len()),
        None => "large".to_string(),
    }
}

/// A row of a samples table, in ms (`unit_ms`) or seconds.
fn sample_vars(name: &str, s: &Samples, unit_ms: bool) -> Vars {
    let f = |d: Duration| if unit_ms { ms(d) } else { secs(d) };
    let mut v = Vars::new();
    v.set("name", name)
        .set("n", s.len())
        .set("p50", f(s.p50()))
        .set("min", f(s.min()))
        .set("max", f(s.max()))
        .set("mean", f(s.mean()));
    v
}

/// Every value of the template; `rows` or `sections` says which half
/// to render.
fn vars(r: &PullResults, rows: bool) -> Vars {
    let image = what_image(r);
    let mut v = Vars::new();
    v.flag("rows", rows)
        .flag("sections", !rows)
        .set("why", why(r))
        .set("what_image", &image)
        .set(
            "p14",
            format!(
                "Pull and unpack a {image} image from a local registry: CRI PullImage into an empty root"
            ),
        )
        .set(
            "p15",
            format!("CreateContainer on a warm image: the {image} image against busybox"),
        );

    // P14
    let (p, t) = (&r.petrel, &r.reference_total);
    v.flag("pull_measured", p.len() > 0 && t.len() > 0)
        .set("pull_goal", format!("{PULL_RATIO_GOAL:.1}"))
        .set("petrel_p50", secs(p.p50()))
        .set("petrel_min", secs(p.min()))
        .set("pulls", p.len())
        .set("reference_p50", secs(t.p50()))
        .set("reference_min", secs(t.min()))
        .set("pull_ratio", ratio(p.p50(), t.p50()))
        .set("pull_ratio_min", ratio(p.min(), t.min()))
        .set("pull_ratio_max", ratio(p.max(), t.max()))
        .set("pull_ratio_mean", ratio(p.mean(), t.mean()))
        .set(
            "pull_verdict",
            verdict(within(p.p50(), t.p50(), PULL_RATIO_GOAL)),
        )
        .set("registry_version", &r.registry_version)
        .set("rounds", p.len().max(t.len()))
        .set("reference", &r.reference)
        .set("skopeo_version", &r.skopeo_version)
        .set("umoci_version", &r.umoci_version);
    let image_vars = r
        .image
        .as_ref()
        .map(|img| {
            let layers = img
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let mut lv = Vars::new();
                    lv.set("index", i + 1)
                        .set("source", &l.source)
                        .set(
                            "files",
                            if l.files > 0 {
                                l.files.to_string()
                            } else {
                                "—".to_string()
                            },
                        )
                        .set("uncompressed", mb(l.uncompressed))
                        .set("compressed", mb(l.compressed))
                        .set(
                            "ratio",
                            format!(
                                "{:.2}",
                                if l.compressed > 0 {
                                    l.uncompressed as f64 / l.compressed as f64
                                } else {
                                    0.0
                                }
                            ),
                        );
                    lv
                })
                .collect();
            let mut iv = Vars::new();
            iv.set("compressed", mb(img.compressed()))
                .set("uncompressed", mb(img.uncompressed()))
                .set("build_s", secs(r.build))
                .set("petrel_size", mb(r.petrel_size))
                .list("layers", layers);
            iv
        })
        .into_iter()
        .collect();
    v.list("image", image_vars).list(
        "pull_rows",
        vec![
            sample_vars("**Petrel: PullImage**", p, false),
            sample_vars("**reference: skopeo copy + umoci unpack**", t, false),
            sample_vars("&nbsp;&nbsp;skopeo copy", &r.skopeo, false),
            sample_vars("&nbsp;&nbsp;umoci unpack", &r.umoci, false),
            sample_vars(
                "then sync(2) of umoci's bundle (not in the reference)",
                &r.umoci_sync,
                false,
            ),
        ],
    );
    let stopped = r
        .error
        .as_ref()
        .map(|e| {
            let mut s = Vars::new();
            s.set("error", one_line(e));
            s
        })
        .into_iter()
        .collect();
    v.list("stopped", stopped);

    // P15
    let (large, small) = (&r.create_large, &r.create_small);
    v.flag("create_measured", large.len() > 0 && small.len() > 0)
        .set("create_goal", CREATE_RATIO_GOAL)
        .set("large_p50", ms(large.p50()))
        .set("large_p99", ms(large.p99()))
        .set("large_count", large.len())
        .set("small_p50", ms(small.p50()))
        .set("small_p99", ms(small.p99()))
        .set("create_ratio_p50", ratio(large.p50(), small.p50()))
        .set("create_ratio_p99", ratio(large.p99(), small.p99()))
        .set("create_ratio_min", ratio(large.min(), small.min()))
        .set("create_ratio_max", ratio(large.max(), small.max()))
        .set("create_ratio_mean", ratio(large.mean(), small.mean()))
        .set(
            "create_verdict",
            verdict(within(large.p50(), small.p50(), CREATE_RATIO_GOAL)),
        )
        .list(
            "create_rows",
            vec![
                sample_vars(&format!("**{image} image**"), large, true),
                sample_vars("busybox image (1 layer)", small, true),
            ],
        );
    v
}

/// The rows of P14 and P15 in the summary table.
pub fn summary_rows(r: &PullResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The P14 and P15 sections.
pub fn sections(r: &PullResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
}
