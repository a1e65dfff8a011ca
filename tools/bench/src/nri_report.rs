//! P19 and P20 in docs/PERFORMANCE.md: the summary rows and the sections.

use std::fmt::Write;
use std::time::Duration;

use crate::nri::{NriResults, FLOOR_GAP, PLUGIN_COUNTS};
use crate::stats::{ms, ratio, samples_row, stopped_early, verdict, why_cell};

/// Goal of P19: time added per subscribed plugin at p50.
const PER_PLUGIN_GOAL: Duration = Duration::from_micros(100);
/// Goal of P20: Synchronize of 1000 containers.
const SYNC_GOAL: Duration = Duration::from_millis(50);

fn why(r: &NriResults) -> String {
    why_cell(r.error.as_deref())
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// The rows of P19 and P20 in the summary table.
pub fn summary_rows(o: &mut String, r: &NriResults) -> std::fmt::Result {
    let promise = "CreateContainer with NRI plugins subscribed to it: time added per plugin";
    let goal = format!("≤ {} per plugin at p50", us(PER_PLUGIN_GOAL));
    let [zero, one, three] = &r.create;
    match (r.wait_p50, r.hook_p50, zero.len()) {
        ([Some(w1), Some(w3)], [Some(h1), Some(h3)], n) if n > 0 => {
            let per3 = w3 / 3;
            let call = r
                .call_mean
                .map(|d| format!("; mean plugin call {}", us(d)))
                .unwrap_or_default();
            let (reference, vs) = if r.floor.len() > 0 {
                (
                    format!(
                        "raw unix-socket round trip between two processes after {} ms idle (the floor of any plugin call): p50 {}; CreateContainer with 0 plugins: p50 {} ms",
                        FLOOR_GAP.as_millis(),
                        us(r.floor.p50()),
                        ms(zero.p50()),
                    ),
                    format!(
                        "{}× (time per plugin / raw round trip)",
                        ratio(per3, r.floor.p50())
                    ),
                )
            } else {
                (
                    format!("CreateContainer with 0 plugins: p50 {} ms", ms(zero.p50())),
                    format!(
                        "{}× (3 plugins' added time / CreateContainer)",
                        ratio(w3, zero.p50())
                    ),
                )
            };
            writeln!(
                o,
                "| P19 | {promise} | {goal} | {} per plugin with 3 plugins (time added p50 {}; NRI's part, which runs while the rootfs is mounted, p50 {}), {} added with 1 (NRI's part {}){call}; CreateContainer p50 {} / {} / {} ms with 0 / 1 / 3 plugins ({} creates each) | {reference} | {vs} | {} |",
                us(per3),
                us(w3),
                us(h3),
                us(w1),
                us(h1),
                ms(zero.p50()),
                ms(one.p50()),
                ms(three.p50()),
                zero.len(),
                verdict(per3 <= PER_PLUGIN_GOAL && w1 <= PER_PLUGIN_GOAL)
            )?;
        }
        _ => writeln!(
            o,
            "| P19 | {promise} | {goal} | not measured | — | — | not measured: {} |",
            why(r)
        )?,
    }
    let promise = format!(
        "Synchronize of {} containers to a new plugin",
        r.sync_containers
    );
    let goal = format!("≤ {} ms", SYNC_GOAL.as_millis());
    if r.sync.len() == 0 {
        return writeln!(
            o,
            "| P20 | {promise} | {goal} | not measured | — | — | not measured: {} |",
            why(r)
        );
    }
    writeln!(
        o,
        "| P20 | {promise} | {goal} | p50 {} ms, max {} ms ({} runs) | ListPodSandbox + ListContainers over CRI: p50 {} ms | {}× | {} |",
        ms(r.sync.p50()),
        ms(r.sync.max()),
        r.sync.len(),
        ms(r.list.p50()),
        ratio(r.sync.p50(), r.list.p50()),
        verdict(r.sync.p50() <= SYNC_GOAL)
    )
}

/// The P19 and P20 sections.
pub fn sections(o: &mut String, r: &NriResults) -> std::fmt::Result {
    writeln!(o, "## P19 NRI: a plugin costs little per container")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** Each NRI plugin subscribed to CreateContainer adds at most 100 µs to \
         CreateContainer at the median."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** One `petrel runtime` with NRI on its own socket; plugins built on \
         Petrel's SDK run in the bench process, dial that socket and each add one environment \
         variable to every container. In rounds, the bench connects 0, 1 and 3 plugins in \
         turn (waiting until the runtime lists them), times CreateContainer of a busybox \
         container in one pod, disconnects the plugins and removes the containers \
         (unmeasured); one unmeasured round first. NRI's part of a CreateContainer is \
         everything NRI does (the container shown to the plugins, the calls in index order, \
         merging, validation, the adjustment applied to the spec); with no plugin subscribed \
         NRI does nothing there. From an image's second container on (the runtime keeps each \
         image's user and group databases, read from its first container), the runtime mounts \
         the rootfs on a blocking thread while it builds the spec and asks the plugins, so \
         the time NRI adds to CreateContainer is the part of NRI's span after the mount is \
         done (all of it for an image's first container). Both are read inside the runtime, \
         from its histograms `petrel_runtime_nri_create_container_wait_seconds` (the time \
         added: the figure judged) and `petrel_runtime_nri_create_container_duration_seconds` \
         (NRI's part), buckets 25 % apart, the median interpolated within its bucket. The \
         warm-up round's creates make the image known. The end-to-end CreateContainer times \
         below show the same creates from the client: their spread (rootfs mount, `runc \
         create`, a busy 2-core machine) is far larger than what a plugin adds, so their \
         differences do not measure it. The reference is the machine's floor for any call to \
         another process, measured after the creates: a 32-byte round trip over a unix \
         socket between the bench and a child process, both blocking in `read`, each after \
         {} ms idle (about what a plugin waits between two creates here; a process woken \
         after idling pays for its CPU's wake-up, most of this figure on a VM).",
        FLOOR_GAP.as_millis()
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "Time added with 1 plugin: p50 {} (NRI's part {}, {} creates); with 3: p50 {} (NRI's \
         part {}, {} creates). The runtime's mean time per plugin call (round trip, from \
         `petrel ctl nri`): {}.",
        r.wait_p50[0].map(us).unwrap_or_else(|| "—".into()),
        r.hook_p50[0].map(us).unwrap_or_else(|| "—".into()),
        r.hook_count[0],
        r.wait_p50[1].map(us).unwrap_or_else(|| "—".into()),
        r.hook_p50[1].map(us).unwrap_or_else(|| "—".into()),
        r.hook_count[1],
        r.call_mean.map(us).unwrap_or_else(|| "—".into()),
    )?;
    writeln!(o)?;
    writeln!(o, "| samples (ms) | n | p50 | p99 | min | max | mean |")?;
    writeln!(o, "|---|---|---|---|---|---|---|")?;
    for (n, s) in PLUGIN_COUNTS.iter().zip(&r.create) {
        samples_row(o, &format!("CreateContainer, {n} plugins"), s)?;
    }
    if r.floor.len() > 0 {
        samples_row(o, "raw unix-socket round trip (floor)", &r.floor)?;
    }
    writeln!(o)?;
    writeln!(o, "## P20 NRI: a new plugin is synchronized quickly")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** A plugin connecting to a runtime with 1000 containers receives all of \
         them (Synchronize) within 50 ms."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** The runtime holds 10 pods of 100 created busybox containers each. A \
         plugin on the SDK dials the NRI socket; the figure is the time from its Configure \
         handler being called to its Synchronize handler holding every pod and container \
         (the runtime's snapshot under the sync lock, encoding, the transfer, split into \
         several messages when larger than one may be, and reassembly). The reference is \
         ListPodSandbox + ListContainers of the same objects over CRI, timed just before \
         each run. One unmeasured run first."
    )?;
    writeln!(o)?;
    writeln!(o, "| samples (ms) | n | p50 | p99 | min | max | mean |")?;
    writeln!(o, "|---|---|---|---|---|---|---|")?;
    samples_row(o, "Synchronize (Configure → handler)", &r.sync)?;
    samples_row(o, "ListPodSandbox + ListContainers", &r.list)?;
    writeln!(o)?;
    stopped_early(o, r.error.as_deref())
}
