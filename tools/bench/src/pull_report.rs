//! P14 and P15 in docs/PERFORMANCE.md: the summary rows and the sections.

use std::fmt::Write;
use std::time::Duration;

use crate::pull::PullResults;
use crate::stats::{ms, one_line, ratio, verdict, why_cell, within, Samples};

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

/// The rows of P14 and P15 in the summary table.
pub fn summary_rows(o: &mut String, r: &PullResults) -> std::fmt::Result {
    let image = what_image(r);
    let p14 = format!(
        "Pull and unpack a {image} image from a local registry: CRI PullImage into an empty root"
    );
    if r.petrel.len() == 0 || r.reference_total.len() == 0 {
        writeln!(
            o,
            "| P14 | {p14} | — | not measured | — | — | not measured: {} |",
            why(r)
        )?;
    } else {
        writeln!(
            o,
            "| P14 | {p14} | ≤ {PULL_RATIO_GOAL:.1}× the reference at p50 | p50 {} s (min {} s, {} pulls) | `skopeo copy` to an OCI layout + `umoci unpack`: p50 {} s (min {} s) | p50 {}× | {} |",
            secs(r.petrel.p50()),
            secs(r.petrel.min()),
            r.petrel.len(),
            secs(r.reference_total.p50()),
            secs(r.reference_total.min()),
            ratio(r.petrel.p50(), r.reference_total.p50()),
            verdict(within(
                r.petrel.p50(),
                r.reference_total.p50(),
                PULL_RATIO_GOAL
            ))
        )?;
    }
    let p15 = format!("CreateContainer on a warm image: the {image} image against busybox");
    if r.create_large.len() == 0 || r.create_small.len() == 0 {
        writeln!(
            o,
            "| P15 | {p15} | — | not measured | — | — | not measured: {} |",
            why(r)
        )?;
    } else {
        writeln!(
            o,
            "| P15 | {p15} | ≤ {CREATE_RATIO_GOAL}× busybox's at p50 (independent of image size) | p50 {} ms, p99 {} ms ({} containers) | busybox (1 layer): p50 {} ms, p99 {} ms | p50 {}×, p99 {}× | {} |",
            ms(r.create_large.p50()),
            ms(r.create_large.p99()),
            r.create_large.len(),
            ms(r.create_small.p50()),
            ms(r.create_small.p99()),
            ratio(r.create_large.p50(), r.create_small.p50()),
            ratio(r.create_large.p99(), r.create_small.p99()),
            verdict(within(
                r.create_large.p50(),
                r.create_small.p50(),
                CREATE_RATIO_GOAL
            ))
        )?;
    }
    Ok(())
}

fn sample_row(o: &mut String, name: &str, s: &Samples, unit_ms: bool) -> std::fmt::Result {
    let f = |d: Duration| if unit_ms { ms(d) } else { secs(d) };
    writeln!(
        o,
        "| {name} | {} | {} | {} | {} | {} |",
        s.len(),
        f(s.p50()),
        f(s.min()),
        f(s.max()),
        f(s.mean())
    )
}

/// The P14 and P15 sections.
pub fn sections(o: &mut String, r: &PullResults) -> std::fmt::Result {
    writeln!(o, "## P14 Pull and unpack: no slower than skopeo + umoci")?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** Pulling a multi-layer image of about 50 MB (compressed) from a registry \
         and unpacking it, as PullImage does before it answers, takes no longer at the median \
         than the usual tools doing the same in the same run: `skopeo copy` from the \
         registry to an OCI layout, then `umoci unpack` of that layout into a bundle."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** The bench builds the image itself from files of this machine, so that \
         compression and unpacking meet real content: the busybox test image's layer (so \
         that the image runs the same `sleep` as the small one, for P15), then layers of \
         regular files and symlinks from the directories below in name order, each gzip \
         stream (default level) cut once it reaches its share of the size (files above a \
         quarter of that share are left out, so that one file cannot overshoot it); owners, \
         modes and times as on disk. It writes an OCI layout and pushes it with `skopeo copy` \
         to Debian's `docker-registry` ({}), which the bench starts on 127.0.0.1 on a free \
         port with its storage in the work directory, and stops and deletes after the \
         section (on every path). Then {} rounds, the order alternating round by round: \
         Petrel starts a `petrel runtime` on an empty root and state (not timed), answers a \
         Version call, and the bench times one CRI PullImage of \
         `{}` (plain HTTP: loopback registries need no configuration), checks that \
         ImageStatus knows the image and that the store holds one unpacked directory per \
         layer, stops the runtime and deletes its root. The reference times `skopeo copy \
         --src-tls-verify=false docker://… oci:DIR:large` ({}) and then `umoci unpack --image \
         DIR:large BUNDLE` ({}) into an empty directory, checks the bundle's \
         `rootfs/bin/busybox` and deletes both. umoci applies every layer onto one root \
         file system and records an mtree manifest of it (with a SHA-256 of each file); \
         Petrel unpacks each layer into its own directory, to be stacked by overlayfs, and \
         makes each one durable (syncfs) before it is renamed into place, so PullImage \
         answers with the image on disk; skopeo and umoci leave their writes to the kernel's \
         write-back (the sync(2) after umoci, timed separately, shows what that leaves). \
         Before every timed step the bench calls sync(2), untimed, so that no step pays for \
         the previous one's unwritten data. The registry's blobs were just written, so both \
         read them from the page cache: the figures are the transfer, verification and \
         unpacking, not the registry's disk.",
        r.registry_version,
        r.petrel.len().max(r.reference_total.len()),
        r.reference,
        r.skopeo_version,
        r.umoci_version
    )?;
    writeln!(o)?;
    if let Some(img) = &r.image {
        writeln!(
            o,
            "The image ({} compressed, {} of tar streams; built and pushed in {} s; Petrel's \
             ImageStatus size: {}):",
            mb(img.compressed()),
            mb(img.uncompressed()),
            secs(r.build),
            mb(r.petrel_size)
        )?;
        writeln!(o)?;
        writeln!(
            o,
            "| layer | files from | files and symlinks | tar stream | gzip blob | ratio |"
        )?;
        writeln!(o, "|---|---|---|---|---|---|")?;
        for (i, l) in img.layers.iter().enumerate() {
            writeln!(
                o,
                "| {} | {} | {} | {} | {} | {:.2} |",
                i + 1,
                l.source,
                if l.files > 0 {
                    l.files.to_string()
                } else {
                    "—".to_string()
                },
                mb(l.uncompressed),
                mb(l.compressed),
                if l.compressed > 0 {
                    l.uncompressed as f64 / l.compressed as f64
                } else {
                    0.0
                }
            )?;
        }
        writeln!(o)?;
    }
    writeln!(o, "| seconds | runs | p50 | min | max | mean |")?;
    writeln!(o, "|---|---|---|---|---|---|")?;
    sample_row(o, "**Petrel: PullImage**", &r.petrel, false)?;
    sample_row(
        o,
        "**reference: skopeo copy + umoci unpack**",
        &r.reference_total,
        false,
    )?;
    sample_row(o, "&nbsp;&nbsp;skopeo copy", &r.skopeo, false)?;
    sample_row(o, "&nbsp;&nbsp;umoci unpack", &r.umoci, false)?;
    sample_row(
        o,
        "then sync(2) of umoci's bundle (not in the reference)",
        &r.umoci_sync,
        false,
    )?;
    writeln!(
        o,
        "| **ratio Petrel / reference** | | **{}** | {} | {} | {} |",
        ratio(r.petrel.p50(), r.reference_total.p50()),
        ratio(r.petrel.min(), r.reference_total.min()),
        ratio(r.petrel.max(), r.reference_total.max()),
        ratio(r.petrel.mean(), r.reference_total.mean())
    )?;
    writeln!(o)?;
    if let Some(e) = &r.error {
        writeln!(o, "The section stopped early: {}", one_line(e))?;
        writeln!(o)?;
    }

    writeln!(
        o,
        "## P15 Container create on a warm image: independent of the image's size"
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Promise.** Once an image is pulled, creating a container from it costs the same \
         whatever the image's size and number of layers: the layers are already unpacked and \
         shared, CreateContainer only stacks them in an overlay mount (within \
         {CREATE_RATIO_GOAL}× of the small image's figure at p50)."
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "**Method.** A fresh `petrel runtime` with both images: busybox (one layer, \
         imported) and the image of P14 ({}, pulled). In one pod, {} containers of each, \
         created one after the other and alternating between the images (the order swapped \
         every round), each a `sleep 3600` with the same config but the image; CreateContainer \
         as the client sees it (overlay mount, OCI spec, shim start, `runc create`, commit), \
         after one unmeasured create and remove of each. The containers stay created, not \
         started, until all are measured, then are removed with the pod.",
        what_image(r),
        r.create_large.len()
    )?;
    writeln!(o)?;
    writeln!(o, "| CreateContainer, ms | runs | p50 | min | max | mean |")?;
    writeln!(o, "|---|---|---|---|---|---|")?;
    sample_row(
        o,
        &format!("**{} image**", what_image(r)),
        &r.create_large,
        true,
    )?;
    sample_row(o, "busybox image (1 layer)", &r.create_small, true)?;
    writeln!(
        o,
        "| **ratio large / busybox** | | **{}** | {} | {} | {} |",
        ratio(r.create_large.p50(), r.create_small.p50()),
        ratio(r.create_large.min(), r.create_small.min()),
        ratio(r.create_large.max(), r.create_small.max()),
        ratio(r.create_large.mean(), r.create_small.mean())
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "p99 of {} samples (nearest rank: below 100 samples, the largest): large {} ms, \
         busybox {} ms.",
        r.create_large.len(),
        ms(r.create_large.p99()),
        ms(r.create_small.p99())
    )?;
    writeln!(o)?;
    Ok(())
}
