//! P16 to P18 in docs/PERFORMANCE.md: the summary rows and the sections.

use std::fmt::Write;

use crate::net::{NetResults, CNI_BIN};
use crate::stats::{ms, ratio, samples_row, verdict, why_cell, within, Samples};

/// Goal of P16 and P17: Petrel over containerd 1.7, at p50.
const RATIO_GOAL: f64 = 1.0;
/// Goal of P18 in GB/s (10^9 bytes per second).
const FORWARD_GOAL_GBPS: f64 = 1.0;

fn why(r: &NetResults) -> String {
    why_cell(r.containerd_missing.as_deref().or(r.error.as_deref()))
}

/// One summary row comparing `petrel` with `containerd` at p50 and p99.
fn row(
    o: &mut String,
    id: &str,
    promise: &str,
    r: &NetResults,
    petrel: &Samples,
    containerd: &Samples,
    what: &str,
) -> std::fmt::Result {
    if petrel.len() == 0 || containerd.len() == 0 {
        return writeln!(
            o,
            "| {id} | {promise} | ≤ {RATIO_GOAL:.1}× containerd 1.7 at p50 | {} | — | — | not measured: {} |",
            if petrel.len() == 0 {
                "not measured".to_string()
            } else {
                format!("p50 {} ms, p99 {} ms", ms(petrel.p50()), ms(petrel.p99()))
            },
            why(r)
        );
    }
    writeln!(
        o,
        "| {id} | {promise} | ≤ {RATIO_GOAL:.1}× containerd 1.7 at p50 | p50 {} ms, p99 {} ms ({} {what}) | {}: p50 {} ms, p99 {} ms | p50 {}×, p99 {}× | {} |",
        ms(petrel.p50()),
        ms(petrel.p99()),
        petrel.len(),
        r.containerd_version,
        ms(containerd.p50()),
        ms(containerd.p99()),
        ratio(petrel.p50(), containerd.p50()),
        ratio(petrel.p99(), containerd.p99()),
        verdict(within(petrel.p50(), containerd.p50(), RATIO_GOAL))
    )
}

/// The rows of P16 to P18 in the summary table.
pub fn summary_rows(o: &mut String, r: &NetResults) -> std::fmt::Result {
    row(
        o,
        "P16",
        "RunPodSandbox with a CNI network (bridge + host-local + loopback + portmap)",
        r,
        &r.run_petrel,
        &r.run_containerd,
        "pods",
    )?;
    row(
        o,
        "P16",
        "StopPodSandbox + RemovePodSandbox of those pods (CNI DEL)",
        r,
        &r.down_petrel,
        &r.down_containerd,
        "pods",
    )?;
    row(
        o,
        "P17",
        "ExecSync round trip (`true` in a running busybox container)",
        r,
        &r.exec_petrel,
        &r.exec_containerd,
        "calls",
    )?;
    row(
        o,
        "P17",
        "Exec round trip through the streaming server (Exec + SPDY session, `true`)",
        r,
        &r.stream_petrel,
        &r.stream_containerd,
        "sessions",
    )?;
    forward_row(o, r)
}

/// Decimal GB/s of `bytes` moved in `d`.
fn gbps(bytes: u64, d: std::time::Duration) -> f64 {
    if d.is_zero() {
        return 0.0;
    }
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// P18: port-forward throughput against the goal, next to the direct path
/// and containerd's port-forward in the same run.
fn forward_row(o: &mut String, r: &NetResults) -> std::fmt::Result {
    let promise = "Port-forward throughput, one connection into a pod (loopback client)";
    let goal = format!("≥ {FORWARD_GOAL_GBPS:.1} GB/s at p50");
    if r.forward_petrel.len() == 0 {
        return writeln!(
            o,
            "| P18 | {promise} | {goal} | not measured | — | — | not measured: {} |",
            why(r)
        );
    }
    let b = r.forward_bytes;
    let petrel = gbps(b, r.forward_petrel.p50());
    let direct = gbps(b, r.forward_direct.p50());
    let containerd = if r.forward_containerd.len() == 0 {
        String::new()
    } else {
        format!(
            "; {} port-forward: {:.3} GB/s",
            r.containerd_version,
            gbps(b, r.forward_containerd.p50())
        )
    };
    writeln!(
        o,
        "| P18 | {promise} | {goal} | {petrel:.3} GB/s ({} runs of {} MiB) | TCP straight to the pod IP, same server: {direct:.3} GB/s{containerd} | {:.2}× direct | {} |",
        r.forward_petrel.len(),
        b >> 20,
        if direct > 0.0 { petrel / direct } else { 0.0 },
        verdict(petrel >= FORWARD_GOAL_GBPS)
    )
}

/// The P16 to P18 sections.
pub fn sections(o: &mut String, r: &NetResults) -> std::fmt::Result {
    writeln!(o, "## P16 Pod networking: no slower than containerd")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** A pod with its own network namespace on a CNI network is up \
         (RunPodSandbox returns) no later than with containerd 1.7 at the median, on the same \
         network configuration and the same plugins; the teardown (StopPodSandbox + \
         RemovePodSandbox, which runs CNI DEL) is shown beside it."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** One `petrel runtime` and one containerd 1.7 (binaries from `make \
         containerd`, its own root, state, socket and runc root in the work directory, sandbox \
         image `pause-oci.tar` from `make image`) run side by side, each with a copy of the \
         configuration below whose only difference is host-local's lease directory; the \
         plugins are Debian's in `{CNI_BIN}`. Pod by pod, alternating which runtime goes \
         first, the bench times RunPodSandbox (Petrel: network, IPC and UTS namespaces \
         pinned, /dev/shm, the pod cgroup, CNI ADD; containerd: the same plus its pause \
         container), then StopPodSandbox + RemovePodSandbox. One unmeasured pod on each \
         first. The bridge is the bench's own (`pbn<id>`, 10.198.0.0/24) and is deleted \
         afterwards."
    )?;
    writeln!(o)?;
    writeln!(o, "```json")?;
    writeln!(o, "{}", r.conflist)?;
    writeln!(o, "```")?;
    writeln!(o)?;
    writeln!(o, "| samples (ms) | n | p50 | p99 | min | max | mean |")?;
    writeln!(o, "|---|---|---|---|---|---|---|")?;
    samples_row(o, "Petrel RunPodSandbox", &r.run_petrel)?;
    samples_row(o, "containerd RunPodSandbox", &r.run_containerd)?;
    samples_row(o, "Petrel stop + remove", &r.down_petrel)?;
    samples_row(o, "containerd stop + remove", &r.down_containerd)?;
    writeln!(o)?;
    writeln!(o, "## P17 Exec: no slower than containerd")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** ExecSync of a trivial command returns no later than with containerd \
         1.7 at the median."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** One pod with a busybox container running `sleep 3600` on each runtime \
         (same network as P16); the bench alternates ExecSync `[\"true\"]` (timeout 10 s) \
         between them, one unmeasured call each first, and checks each exit code. Both run \
         `runc exec`; the figure is the CRI call as the client sees it."
    )?;
    writeln!(o)?;
    writeln!(o, "| samples (ms) | n | p50 | p99 | min | max | mean |")?;
    writeln!(o, "|---|---|---|---|---|---|---|")?;
    samples_row(o, "Petrel ExecSync", &r.exec_petrel)?;
    samples_row(o, "containerd ExecSync", &r.exec_containerd)?;
    samples_row(o, "Petrel Exec + SPDY session", &r.stream_petrel)?;
    samples_row(o, "containerd Exec + SPDY session", &r.stream_containerd)?;
    writeln!(o)?;
    writeln!(
        o,
        "The streaming figure is what `kubectl exec` without `-i` costs: the Exec call, the \
         SPDY/3.1 upgrade at the URL it returns (protocol v5 or v4, as negotiated), stdout \
         read to its end and the exit status; the same client (`petrel-stream`) for both."
    )?;
    writeln!(o)?;
    writeln!(o, "## P18 Port-forward: 1 GB/s into a pod")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** One forwarded connection carries at least 1 GB/s (10^9 bytes/s) on \
         loopback."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** The bench binds its own server on port 7000 inside each P17 pod's network \
         namespace (it reads a length and that many bytes and answers with the count, so the figure \
         is the forwarding path's, not a tool's). Each run pushes {} MiB through one \
         connection in 1 MiB writes and waits for the count: through Petrel's \
         PortForward URL (SPDY, as kubectl), straight to the Petrel pod's IP over the \
         bridge (the reference: the same kernel path without the forwarder), and through \
         containerd's PortForward URL with the same client. One unmeasured run each first.",
        r.forward_bytes >> 20
    )?;
    writeln!(o)?;
    writeln!(o, "| run time (ms) | n | p50 | p99 | min | max | mean |")?;
    writeln!(o, "|---|---|---|---|---|---|---|")?;
    samples_row(o, "Petrel port-forward", &r.forward_petrel)?;
    samples_row(o, "direct to the pod IP", &r.forward_direct)?;
    samples_row(o, "containerd port-forward", &r.forward_containerd)?;
    writeln!(o)?;
    if let Some(e) = &r.error {
        writeln!(o, "**The section stopped early:** {}", e.replace('\n', " "))?;
        writeln!(o)?;
    }
    Ok(())
}
