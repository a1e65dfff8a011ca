//! P16 to P18 in docs/PERFORMANCE.md: the summary rows and the sections,
//! from `templates/net.md`.

use crate::net::{NetResults, CNI_BIN};
use crate::stats::{ms, ratio, samples_vars, verdict, why_cell, within, Samples};
use crate::template::{render, TemplateError, Vars};

/// The rows and sections P16-P18.
const TEMPLATE: &str = include_str!("../templates/net.md");

/// Goal of P16 and P17: Petrel over containerd 1.7, at p50.
const RATIO_GOAL: f64 = 1.0;
/// Goal of P18 in GB/s (10^9 bytes per second).
const FORWARD_GOAL_GBPS: f64 = 1.0;

fn why(r: &NetResults) -> String {
    why_cell(r.containerd_missing.as_deref().or(r.error.as_deref()))
}

/// One summary row comparing `petrel` with `containerd` at p50 and p99.
fn compared(id: &str, promise: &str, petrel: &Samples, containerd: &Samples, what: &str) -> Vars {
    let mut v = Vars::new();
    v.set("id", id)
        .set("promise", promise)
        .flag("measured", petrel.len() > 0 && containerd.len() > 0)
        .set(
            "petrel_cell",
            if petrel.len() == 0 {
                "not measured".to_string()
            } else {
                format!("p50 {} ms, p99 {} ms", ms(petrel.p50()), ms(petrel.p99()))
            },
        )
        .set("p50", ms(petrel.p50()))
        .set("p99", ms(petrel.p99()))
        .set("count", petrel.len())
        .set("what", what)
        .set("c_p50", ms(containerd.p50()))
        .set("c_p99", ms(containerd.p99()))
        .set("ratio_p50", ratio(petrel.p50(), containerd.p50()))
        .set("ratio_p99", ratio(petrel.p99(), containerd.p99()))
        .set(
            "verdict",
            verdict(within(petrel.p50(), containerd.p50(), RATIO_GOAL)),
        );
    v
}

/// Decimal GB/s of `bytes` moved in `d`.
fn gbps(bytes: u64, d: std::time::Duration) -> f64 {
    if d.is_zero() {
        return 0.0;
    }
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// Every value of the template; `rows` or `sections` says which half
/// to render.
fn vars(r: &NetResults, rows: bool) -> Vars {
    let mut v = Vars::new();
    v.flag("rows", rows)
        .flag("sections", !rows)
        .set("why", why(r))
        .set("ratio_goal", format!("{RATIO_GOAL:.1}"))
        .set("containerd_version", &r.containerd_version)
        .list(
            "compared",
            vec![
                compared(
                    "P16",
                    "RunPodSandbox with a CNI network (bridge + host-local + loopback + portmap)",
                    &r.run_petrel,
                    &r.run_containerd,
                    "pods",
                ),
                compared(
                    "P16",
                    "StopPodSandbox + RemovePodSandbox of those pods (CNI DEL)",
                    &r.down_petrel,
                    &r.down_containerd,
                    "pods",
                ),
                compared(
                    "P17",
                    "ExecSync round trip (`true` in a running busybox container)",
                    &r.exec_petrel,
                    &r.exec_containerd,
                    "calls",
                ),
                compared(
                    "P17",
                    "Exec round trip through the streaming server (Exec + SPDY session, `true`)",
                    &r.stream_petrel,
                    &r.stream_containerd,
                    "sessions",
                ),
            ],
        );

    // P18: port-forward throughput against the goal, next to the direct
    // path and containerd's port-forward in the same run.
    let b = r.forward_bytes;
    let petrel = gbps(b, r.forward_petrel.p50());
    let direct = gbps(b, r.forward_direct.p50());
    v.set(
        "forward_promise",
        "Port-forward throughput, one connection into a pod (loopback client)",
    )
    .set(
        "forward_goal",
        format!("≥ {FORWARD_GOAL_GBPS:.1} GB/s at p50"),
    )
    .flag("forward_measured", r.forward_petrel.len() > 0)
    .set("forward_gbps", format!("{petrel:.3}"))
    .set("forward_runs", r.forward_petrel.len())
    .set("forward_mib", b >> 20)
    .set("direct_gbps", format!("{direct:.3}"))
    .set(
        "containerd_forward",
        if r.forward_containerd.len() == 0 {
            String::new()
        } else {
            format!(
                "; {} port-forward: {:.3} GB/s",
                r.containerd_version,
                gbps(b, r.forward_containerd.p50())
            )
        },
    )
    .set(
        "vs_direct",
        format!("{:.2}", if direct > 0.0 { petrel / direct } else { 0.0 }),
    )
    .set("forward_verdict", verdict(petrel >= FORWARD_GOAL_GBPS));

    // The sections.
    v.set("cni_bin", CNI_BIN)
        .set("conflist", &r.conflist)
        .list(
            "pod_rows",
            vec![
                samples_vars("Petrel RunPodSandbox", &r.run_petrel),
                samples_vars("containerd RunPodSandbox", &r.run_containerd),
                samples_vars("Petrel stop + remove", &r.down_petrel),
                samples_vars("containerd stop + remove", &r.down_containerd),
            ],
        )
        .list(
            "exec_rows",
            vec![
                samples_vars("Petrel ExecSync", &r.exec_petrel),
                samples_vars("containerd ExecSync", &r.exec_containerd),
                samples_vars("Petrel Exec + SPDY session", &r.stream_petrel),
                samples_vars("containerd Exec + SPDY session", &r.stream_containerd),
            ],
        )
        .list(
            "forward_rows",
            vec![
                samples_vars("Petrel port-forward", &r.forward_petrel),
                samples_vars("direct to the pod IP", &r.forward_direct),
                samples_vars("containerd port-forward", &r.forward_containerd),
            ],
        );
    let stopped = r
        .error
        .as_ref()
        .map(|e| {
            let mut s = Vars::new();
            s.set("error", e.replace('\n', " "));
            s
        })
        .into_iter()
        .collect();
    v.list("stopped", stopped);
    v
}

/// The rows of P16 to P18 in the summary table.
pub fn summary_rows(r: &NetResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, true))
}

/// The P16 to P18 sections.
pub fn sections(r: &NetResults) -> Result<String, TemplateError> {
    render(TEMPLATE, &vars(r, false))
}
