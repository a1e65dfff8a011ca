//! P14 and P15: pulling and unpacking a large multi-layer image from a
//! local registry, against `skopeo copy` + `umoci unpack` of the same
//! image in the same run; and CreateContainer on that image once pulled,
//! against the busybox image.
//!
//! Everything lives in `<work>/pull`: the image's OCI layout (removed once
//! pushed), the registry (`registry/`, its storage removed when it stops),
//! the runtime of each pull (`node/`, a fresh root every time) and the
//! reference's layout and bundle (`ref/`).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use petrel_cri::api;

use crate::large_image::{self, LargeImage};
use crate::node::{pod_config, sleep_container, Clients, Node};
use crate::registry::{Registry, REGISTRY_BIN};
use crate::stats::Samples;
use crate::sweep::Work;
use crate::Args;

/// The large image's repository and tag in the registry.
pub const LARGE_NAME: &str = "petrel-bench/large:latest";

/// What the pull section measured; figures it did not reach are empty and
/// `error` says why.
#[derive(Debug, Default)]
pub struct PullResults {
    /// Why the section stopped early.
    pub error: Option<String>,
    /// The image as built (absent if building it failed).
    pub image: Option<LargeImage>,
    /// Building the image and pushing it with skopeo.
    pub build: Duration,
    /// The image's reference, with the registry's port of this run.
    pub reference: String,
    /// P14: CRI PullImage into a runtime with an empty root.
    pub petrel: Samples,
    /// P14: `skopeo copy docker://… oci:…` + `umoci unpack`, per repetition.
    pub reference_total: Samples,
    /// P14: the `skopeo copy` part.
    pub skopeo: Samples,
    /// P14: the `umoci unpack` part.
    pub umoci: Samples,
    /// P14: sync(2) right after `umoci unpack` (not part of the reference:
    /// umoci does not flush what it wrote, PullImage does).
    pub umoci_sync: Samples,
    /// The image's size as Petrel's ImageStatus reports it (unpacked bytes).
    pub petrel_size: u64,
    /// Layer directories in Petrel's store after a pull.
    pub petrel_layers: usize,
    /// P15: CreateContainer on the busybox image.
    pub create_small: Samples,
    /// P15: CreateContainer on the large image.
    pub create_large: Samples,
    /// `skopeo --version`.
    pub skopeo_version: String,
    /// `umoci --version`.
    pub umoci_version: String,
    /// `docker-registry --version`.
    pub registry_version: String,
}

/// The pull section. Never fails: what went wrong is in `error`.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> PullResults {
    let mut res = PullResults {
        skopeo_version: version("skopeo", &["--version"]),
        umoci_version: version("umoci", &["--version"]),
        registry_version: version(REGISTRY_BIN, &["--version"]),
        ..Default::default()
    };
    if let Err(e) = measure_into(args, work, &mut res, progress).await {
        progress(&format!("pull section failed: {e:#}"));
        res.error = Some(format!("{e:#}"));
    }
    res
}

fn version(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "not found".to_string())
}

async fn measure_into(
    args: &Args,
    work: &Work,
    res: &mut PullResults,
    progress: &dyn Fn(&str),
) -> Result<()> {
    ensure!(
        args.pull_repetitions > 0 && args.create_containers > 0,
        "--pull-repetitions and --create-containers must be at least 1"
    );
    let dir = work.dir.join("pull");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let cgroup = format!("{}/pull", work.cgroup_parent);

    progress(&format!(
        "pull: building a {} MB image of {} generated layers and pushing it",
        args.pull_image_mb, args.pull_layers
    ));
    let t = Instant::now();
    let layout = dir.join("layout");
    let image = large_image::build(
        &args.image,
        &layout,
        args.pull_layers,
        args.pull_image_mb.saturating_mul(1_000_000),
    )?;
    res.image = Some(image.clone());
    let registry = Registry::start(&dir.join("registry"))?;
    registry.push_layout(&layout, large_image::TAG, LARGE_NAME)?;
    res.build = t.elapsed();
    std::fs::remove_dir_all(&layout).with_context(|| format!("remove {}", layout.display()))?;
    res.reference = format!("{}/{LARGE_NAME}", registry.host());

    let node_dir = dir.join("node");
    let ref_dir = dir.join("ref");
    for i in 0..args.pull_repetitions {
        progress(&format!(
            "P14 pull {}/{}: Petrel and skopeo + umoci",
            i + 1,
            args.pull_repetitions
        ));
        // Alternating which goes first, so that a slow moment of the
        // machine falls on both alike.
        if i % 2 == 1 {
            reference_pull(&ref_dir, res).await?;
        }
        petrel_pull(args, &node_dir, &cgroup, image.layers.len(), res).await?;
        if i % 2 == 0 {
            reference_pull(&ref_dir, res).await?;
        }
    }

    progress(&format!(
        "P15 CreateContainer: {} containers on each image",
        args.create_containers
    ));
    measure_create(args, &node_dir, &cgroup, res).await?;
    drop(registry);
    Ok(())
}

/// Flushes every dirty page of the machine, untimed, before a timed step:
/// PullImage syncs the file system after each layer, and would otherwise
/// also pay for what the step before it (umoci's bundle, a removed root)
/// left unwritten.
fn settle() {
    rustix::fs::sync();
}

/// Removes `dir` if present and creates it empty.
fn fresh_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove {}", dir.display())),
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))
}

fn image_spec(image: &str) -> Option<api::ImageSpec> {
    Some(api::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

async fn pull(c: &mut Clients, image: &str) -> Result<()> {
    c.img
        .pull_image(api::PullImageRequest {
            image: image_spec(image),
            auth: None,
            sandbox_config: None,
        })
        .await
        .with_context(|| format!("PullImage {image}"))?;
    Ok(())
}

/// One timed PullImage into a runtime started on an empty root (its start
/// is not timed), which is stopped and removed afterwards.
async fn petrel_pull(
    args: &Args,
    dir: &Path,
    cgroup: &str,
    layers: usize,
    res: &mut PullResults,
) -> Result<()> {
    fresh_dir(dir)?;
    let mut node = Node::start(&args.petrel, args.shim.as_deref(), cgroup)?;
    let mut c = node.connect().await?;
    // The connection is up and the runtime answers before the clock runs.
    c.rt.version(api::VersionRequest::default())
        .await
        .context("Version")?;
    settle();
    let t = Instant::now();
    pull(&mut c, &res.reference).await?;
    res.petrel.push(t.elapsed());
    let st = c
        .img
        .image_status(api::ImageStatusRequest {
            image: image_spec(&res.reference),
            verbose: false,
        })
        .await
        .context("ImageStatus")?
        .into_inner();
    res.petrel_size = st.image.map(|i| i.size).unwrap_or(0);
    ensure!(res.petrel_size > 0, "ImageStatus: no image after PullImage");
    // The answer comes once every layer is unpacked in the store.
    let store = node.root.join("images").join("layers");
    res.petrel_layers = std::fs::read_dir(&store)
        .with_context(|| format!("read {}", store.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .count();
    ensure!(
        res.petrel_layers == layers,
        "{} layer directories in {} after PullImage, expected {layers}",
        res.petrel_layers,
        store.display()
    );
    drop(c);
    node.shutdown();
    drop(node);
    std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))
}

/// Runs a reference tool; killed if the bench is interrupted.
async fn tool(cmd: &str, args: &[String]) -> Result<()> {
    let out = tokio::process::Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("run {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// One timed `skopeo copy` from the registry to an OCI layout and `umoci
/// unpack` of it into a bundle, both removed afterwards.
async fn reference_pull(dir: &Path, res: &mut PullResults) -> Result<()> {
    fresh_dir(dir)?;
    let reference = res.reference.clone();
    let layout = format!("{}:{}", dir.join("oci").display(), large_image::TAG);
    let bundle = dir.join("bundle");
    settle();
    let t = Instant::now();
    tool(
        "skopeo",
        &[
            "copy".into(),
            "--quiet".into(),
            "--src-tls-verify=false".into(),
            format!("docker://{reference}"),
            format!("oci:{layout}"),
        ],
    )
    .await?;
    let skopeo = t.elapsed();
    let t = Instant::now();
    tool(
        "umoci",
        &[
            "unpack".into(),
            "--image".into(),
            layout,
            bundle.display().to_string(),
        ],
    )
    .await?;
    let umoci = t.elapsed();
    let t = Instant::now();
    rustix::fs::sync();
    res.umoci_sync.push(t.elapsed());
    let busybox = bundle.join("rootfs").join("bin").join("busybox");
    ensure!(
        busybox.is_file(),
        "umoci unpack left no {}",
        busybox.display()
    );
    res.skopeo.push(skopeo);
    res.umoci.push(umoci);
    res.reference_total.push(skopeo + umoci);
    std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))
}

/// P15: CreateContainer alternately on the busybox image and on the large
/// one, in one pod of a runtime that has both.
async fn measure_create(
    args: &Args,
    dir: &Path,
    cgroup: &str,
    res: &mut PullResults,
) -> Result<()> {
    fresh_dir(dir)?;
    let mut node = Node::start(&args.petrel, args.shim.as_deref(), cgroup)?;
    let mut c = node.connect().await?;
    c.import(&args.image).await?;
    pull(&mut c, &res.reference).await?;
    let config = pod_config("create", cgroup, dir);
    let pod = c.run_pod(&config).await?;
    let container = |name: &str, large: bool| {
        let mut cfg = sleep_container(name);
        if large {
            cfg.image = image_spec(&res.reference);
        }
        cfg
    };
    // One unmeasured create of each first (first-use costs: page cache,
    // lazily built state).
    for (name, large) in [("warm-small", false), ("warm-large", true)] {
        let id = c.create(&pod, &config, container(name, large)).await?;
        c.remove(&id).await?;
    }
    settle();
    let mut small = Samples::default();
    let mut large = Samples::default();
    let mut ids: Vec<String> = vec![];
    for i in 0..args.create_containers {
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for is_large in order {
            let name = format!("{}{i:03}", if is_large { "l" } else { "s" });
            let t = Instant::now();
            let id = c.create(&pod, &config, container(&name, is_large)).await?;
            let d = t.elapsed();
            if is_large {
                large.push(d);
            } else {
                small.push(d);
            }
            ids.push(id);
        }
    }
    res.create_small = small;
    res.create_large = large;
    for id in &ids {
        c.remove(id).await?;
    }
    c.stop_pod(&pod).await?;
    c.remove_pod(&pod).await?;
    drop(c);
    node.shutdown();
    drop(node);
    std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))
}
