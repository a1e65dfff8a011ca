//! P19-P20: NRI in Petrel's runtime, with plugins on Petrel's SDK running
//! in this process and dialling the runtime's NRI socket.
//!
//! - P19: CreateContainer with 0, 1 and 3 plugins subscribed to it (each
//!   adds one environment variable). The three configurations alternate in
//!   rounds, so a slow moment of the machine falls on all alike. What a
//!   plugin adds is read from the runtime's own histogram of the time NRI
//!   takes inside CreateContainer (the end-to-end difference is far below
//!   CreateContainer's noise on a small machine), shown beside it.
//! - P20: Synchronize of 1000 containers (10 pods of 100, created): from
//!   the plugin's Configure to its Synchronize handler holding every pod
//!   and container, against ListPodSandbox + ListContainers of the same
//!   objects over CRI in the same run.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use petrel_cri::admin::NriPluginsRequest;
use petrel_cri::api;
use petrel_nri::api as nri;
use petrel_nri::stub::{Stub, StubHandle};

use crate::node::{pod_config, sleep_container, Clients, Node};
use crate::stats::Samples;
use crate::sweep::Work;
use crate::Args;

/// The runtime's histogram of the time NRI adds to CreateContainer.
const HOOK_METRIC: &str = "petrel_runtime_nri_create_container_duration_seconds";
/// The runtime's histogram of the time NRI adds to CreateContainer.
const WAIT_METRIC: &str = "petrel_runtime_nri_create_container_wait_seconds";

/// The median of one series of a Prometheus histogram in the text format
/// (linear within the bucket it falls in), and its count.
pub fn histogram_median(
    text: &str,
    name: &str,
    label: &str,
    value: &str,
) -> Option<(Duration, u64)> {
    let want = format!("{label}=\"{value}\"");
    let prefix = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, u64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&want))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let n = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, n))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let count = buckets.last()?.1;
    if count == 0 {
        return None;
    }
    let target = count as f64 / 2.0;
    let (mut lo, mut below) = (0.0, 0u64);
    for (le, n) in buckets {
        if n as f64 >= target {
            if !le.is_finite() {
                return Some((Duration::from_secs_f64(lo), count));
            }
            let inside = (n - below) as f64;
            let frac = if inside > 0.0 {
                (target - below as f64) / inside
            } else {
                1.0
            };
            return Some((Duration::from_secs_f64(lo + (le - lo) * frac), count));
        }
        (lo, below) = (le, n);
    }
    None
}

/// Idle time before each round trip of the P19 floor: about what a plugin
/// waits between two CreateContainer calls in this bench.
pub const FLOOR_GAP: Duration = Duration::from_millis(50);
/// Round trips of the P19 floor.
const FLOOR_ROUND_TRIPS: usize = 100;

/// The plugin counts P19 compares.
pub const PLUGIN_COUNTS: [usize; 3] = [0, 1, 3];

/// What the section measured.
#[derive(Debug, Default)]
pub struct NriResults {
    /// Why the section stopped early.
    pub error: Option<String>,
    /// P19: CreateContainer, by index into [`PLUGIN_COUNTS`].
    pub create: [Samples; 3],
    /// P19: the runtime's mean time per CreateContainer plugin call.
    pub call_mean: Option<Duration>,
    /// P19: the time NRI's part of the runtime's CreateContainer takes (its
    /// histogram's median, interpolated), with 1 and 3 plugins.
    pub hook_p50: [Option<Duration>; 2],
    /// P19: the time NRI adds to the runtime's CreateContainer (NRI's span
    /// after the rootfs is mounted; median, interpolated), with 1 and 3
    /// plugins.
    pub wait_p50: [Option<Duration>; 2],
    /// P19: how many creates that histogram holds, with 1 and 3 plugins.
    pub hook_count: [u64; 2],
    /// P19 reference: the machine's floor for a call to another process, a
    /// raw unix-socket round trip after the same idle time.
    pub floor: Samples,
    /// P20: containers in the runtime while synchronizing.
    pub sync_containers: usize,
    /// P20: Configure → Synchronize handler with everything.
    pub sync: Samples,
    /// P20 reference: ListPodSandbox + ListContainers over CRI.
    pub list: Samples,
}

/// Measures P19-P20; failures end up in `error`.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> NriResults {
    let mut res = NriResults::default();
    if let Err(e) = measure_into(args, work, &mut res, progress).await {
        progress(&format!("nri section failed: {e:#}"));
        res.error = Some(format!("{e:#}"));
    }
    res
}

async fn measure_into(
    args: &Args,
    work: &Work,
    res: &mut NriResults,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let dir = work.dir.join("nri");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let cgroup = format!("{}/nri", work.cgroup_parent);
    progress("NRI: starting a runtime");
    let mut node = Node::start(&args.petrel, args.shim.as_deref(), &cgroup)?;
    let r = async {
        let mut c = node.connect().await?;
        c.import(&args.image).await?;
        let socket = node.nri_socket.clone();
        measure_create(args, &mut c, &socket, &dir, &cgroup, res, progress).await?;
        measure_sync(args, &mut c, &socket, &dir, &cgroup, res, progress).await
    }
    .await;
    node.shutdown();
    r
}

/// A plugin adding `NRI_BENCH_<n>=1` to every container it sees created.
fn env_plugin(socket: &Path, n: usize) -> Result<Stub<usize>> {
    Stub::builder(n)
        .name(format!("bench{n}"))
        .index(format!("{:02}", 10 + n))
        .socket_path(socket)
        .no_reconnect()
        .on_create_container(|n: Arc<usize>, _req| async move {
            let mut adjust = nri::ContainerAdjustment::default();
            adjust.env.push(nri::KeyValue {
                key: format!("NRI_BENCH_{n}"),
                value: "1".into(),
            });
            Ok(nri::CreateContainerResponse {
                adjust: Some(adjust),
                ..Default::default()
            })
        })
        .build()
        .context("build a bench plugin")
}

/// Waits until the runtime lists `n` connected plugins.
async fn wait_plugins(c: &mut Clients, n: usize) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let got = c
            .admin
            .nri_plugins(NriPluginsRequest {})
            .await
            .context("NriPlugins")?
            .into_inner()
            .plugins
            .iter()
            .filter(|p| p.health == "connected")
            .count();
        if got == n {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(20) {
            bail!("{got} NRI plugins connected, waiting for {n}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts plugins `0..n` and waits until all are admitted.
async fn start_plugins(c: &mut Clients, socket: &Path, n: usize) -> Result<Vec<StubHandle>> {
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let stub = env_plugin(socket, i)?;
        handles.push(stub.handle());
        tokio::spawn(stub.run());
    }
    wait_plugins(c, n).await?;
    Ok(handles)
}

async fn stop_plugins(c: &mut Clients, handles: Vec<StubHandle>) -> Result<()> {
    for h in handles {
        h.stop();
    }
    wait_plugins(c, 0).await
}

#[allow(clippy::too_many_arguments)]
async fn measure_create(
    args: &Args,
    c: &mut Clients,
    socket: &Path,
    dir: &Path,
    cgroup: &str,
    res: &mut NriResults,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let pod = pod_config("nri-create", cgroup, dir);
    let pod_id = c.run_pod(&pod).await?;
    progress(&format!(
        "P19 CreateContainer with 0, 1 and 3 NRI plugins: {} rounds of {}",
        args.nri_rounds, args.nri_creates
    ));
    let mut calls = (0u64, 0u64);
    let mut seq = 0usize;
    // One unmeasured round first: first-use costs fall on nobody.
    for round in 0..=args.nri_rounds {
        for (slot, &n) in PLUGIN_COUNTS.iter().enumerate() {
            let handles = start_plugins(c, socket, n).await?;
            let mut ids = Vec::with_capacity(args.nri_creates);
            for _ in 0..args.nri_creates {
                seq += 1;
                let t = Instant::now();
                let id = c
                    .create(&pod_id, &pod, sleep_container(&format!("c{seq}")))
                    .await?;
                if round > 0 {
                    res.create[slot].push(t.elapsed());
                }
                ids.push(id);
            }
            if round > 0 && n > 0 {
                let (n, micros) = call_totals(c).await?;
                calls.0 += n;
                calls.1 += micros;
            }
            stop_plugins(c, handles).await?;
            for id in ids {
                c.remove(&id).await?;
            }
        }
    }
    let text = c
        .admin
        .metrics(petrel_cri::admin::MetricsRequest {})
        .await
        .context("Metrics")?
        .into_inner()
        .text;
    for (i, n) in ["1", "3"].iter().enumerate() {
        if let Some((p50, count)) = histogram_median(&text, HOOK_METRIC, "plugins", n) {
            res.hook_p50[i] = Some(p50);
            res.hook_count[i] = count;
        }
        if let Some((p50, _)) = histogram_median(&text, WAIT_METRIC, "plugins", n) {
            res.wait_p50[i] = Some(p50);
        }
    }
    res.call_mean = calls.1.checked_div(calls.0).map(Duration::from_micros);
    progress("P19 reference: raw unix-socket round trips after 50 ms idle");
    let floor_dir = dir.to_path_buf();
    res.floor = tokio::task::spawn_blocking(move || {
        crate::floor::round_trips(&floor_dir, FLOOR_GAP, FLOOR_ROUND_TRIPS)
    })
    .await
    .context("the floor's thread")??;
    c.stop_pod(&pod_id).await?;
    c.remove_pod(&pod_id).await
}

/// Calls and total call time (µs) of the connected plugins so far.
async fn call_totals(c: &mut Clients) -> Result<(u64, u64)> {
    let ps = c
        .admin
        .nri_plugins(NriPluginsRequest {})
        .await
        .context("NriPlugins")?
        .into_inner()
        .plugins;
    Ok(ps.iter().fold((0, 0), |(n, us), p| {
        (n + p.calls, us + p.calls * p.mean_call_micros)
    }))
}

/// When a synchronizing plugin saw Configure and then the whole Synchronize.
#[derive(Default)]
struct SyncTimes {
    configured: Option<Instant>,
    synced: Option<(Instant, usize)>,
}

#[allow(clippy::too_many_arguments)]
async fn measure_sync(
    args: &Args,
    c: &mut Clients,
    socket: &Path,
    dir: &Path,
    cgroup: &str,
    res: &mut NriResults,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let pods = 10;
    let per_pod = args.nri_sync_containers.div_ceil(pods);
    res.sync_containers = pods * per_pod;
    progress(&format!(
        "P20 creating {} containers for Synchronize",
        res.sync_containers
    ));
    let mut pod_ids = Vec::with_capacity(pods);
    for p in 0..pods {
        let config = pod_config(&format!("nri-sync{p}"), cgroup, dir);
        let id = c.run_pod(&config).await?;
        for i in 0..per_pod {
            c.create(&id, &config, sleep_container(&format!("s{i}")))
                .await?;
        }
        pod_ids.push(id);
    }
    progress("P20 Synchronize against ListPodSandbox + ListContainers");
    for round in 0..=args.nri_sync_rounds {
        let t = Instant::now();
        let listed =
            c.rt.list_pod_sandbox(api::ListPodSandboxRequest::default())
                .await
                .context("ListPodSandbox")?
                .into_inner()
                .items
                .len();
        let ctrs =
            c.rt.list_containers(api::ListContainersRequest::default())
                .await
                .context("ListContainers")?
                .into_inner()
                .containers
                .len();
        let list_took = t.elapsed();
        if listed != pods || ctrs != res.sync_containers {
            bail!("listed {listed} pods and {ctrs} containers");
        }

        let times = Arc::new(Mutex::new(SyncTimes::default()));
        let stub = Stub::builder(times.clone())
            .name("benchsync")
            .index("50")
            .socket_path(socket)
            .no_reconnect()
            .on_configure(|s: Arc<Arc<Mutex<SyncTimes>>>, _req| async move {
                if let Ok(mut t) = s.lock() {
                    t.configured = Some(Instant::now());
                }
                Ok(None)
            })
            .on_synchronize(|s, _pods, containers| async move {
                if let Ok(mut t) = s.lock() {
                    t.synced = Some((Instant::now(), containers.len()));
                }
                Ok(Vec::new())
            })
            .on_remove_container(|_, _| async { Ok(()) })
            .build()
            .context("build the sync plugin")?;
        let handle = stub.handle();
        tokio::spawn(stub.run());
        wait_plugins(c, 1).await?;
        stop_plugins(c, vec![handle]).await?;
        let t = times
            .lock()
            .map_err(|_| anyhow::anyhow!("sync times poisoned"))?;
        let (Some(configured), Some((synced, n))) = (t.configured, t.synced) else {
            bail!("the plugin was not configured and synchronized");
        };
        if n != res.sync_containers {
            bail!(
                "Synchronize delivered {n} of {} containers",
                res.sync_containers
            );
        }
        if round > 0 {
            res.sync.push(synced - configured);
            res.list.push(list_took);
        }
    }
    for id in pod_ids {
        c.stop_pod(&id).await?;
        c.remove_pod(&id).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_median_should_interpolate_within_the_bucket() {
        let text = concat!(
            "x_bucket{plugins=\"1\",le=\"0.0001\"} 0\n",
            "x_bucket{plugins=\"1\",le=\"0.0002\"} 10\n",
            "x_bucket{plugins=\"1\",le=\"0.0004\"} 30\n",
            "x_bucket{plugins=\"1\",le=\"+Inf\"} 40\n",
            "x_bucket{plugins=\"3\",le=\"0.0001\"} 5\n",
            "x_bucket{plugins=\"3\",le=\"+Inf\"} 5\n",
        );
        let (p50, n) = histogram_median(text, "x", "plugins", "1").unwrap_or_default();
        assert_eq!(n, 40);
        // 20 of 40: half-way through the (200, 400] µs bucket.
        assert_eq!(p50.as_micros(), 300);
        let (p50, _) = histogram_median(text, "x", "plugins", "3").unwrap_or_default();
        assert_eq!(p50.as_micros(), 50);
        assert!(histogram_median(text, "x", "plugins", "2").is_none());
    }
}
