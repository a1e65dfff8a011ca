//! P29-P32: the controller kit (issue 30) beside controller-runtime, both
//! running the PodSet sample controller (Petrel's under
//! examples/podset-controller, controller-runtime's built by `make peers`)
//! against one kube-apiserver, one after the other in the same run:
//!
//! - P29: user change → reconcile latency with the controller idle, then
//!   while a restart lists 10 000 PodSets whose status must be rewritten and
//!   a resync of all of them runs (Pinterest's SLI);
//! - P30: the queue depth in front of user changes in that storm, against
//!   Petrel's own sample run as one FIFO (`--fifo`);
//! - P31: leader handoff on SIGTERM and on kill -9;
//! - P32: resident memory with 100 and with 10 100 PodSets in the caches,
//!   and API requests per minute at idle (the API server's audit log).
//!
//! A change is a merge patch of a user PodSet's changed-at annotation with
//! the time it is sent; the controller prints the stamp it reconciled (the
//! samples' stdout protocol, `petrel_testkit::podset`). A reconcile that
//! sees a stamp serves every earlier stamp of that PodSet still waiting.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use petrel_testkit::cluster::Cluster;
use petrel_testkit::peers::peer_binary;
use petrel_testkit::podset::{self, Controller, Event, CHANGED_AT};
use serde_json::json;
use tokio::sync::Mutex;

use crate::stats::Samples;
use crate::sweep::Work;
use crate::Args;

/// The namespace of every PodSet.
const NS: &str = "bench";
/// PodSets the user changes go to.
const USERS: usize = 100;
/// How many changes a second the user sends.
const RATE: u32 = 40;
/// How long changes are sent after a restart into the storm.
const STORM_WINDOW: Duration = Duration::from_secs(45);
/// Changes measured with the controller idle: as many as in the storm, so
/// both p99.9 are the same rank (the second-worst of 1800).
const QUIET_CHANGES: usize = STORM_WINDOW.as_secs() as usize * RATE as usize;
/// The informers' resync period in the storm: two resyncs of everything
/// fall inside the window.
const STORM_SYNC: &str = "20s";
/// How many of the storm's slowest changes the report names.
const SLOWEST: usize = 3;
/// How long the idle controller's API requests are counted.
const IDLE_WINDOW: Duration = Duration::from_secs(30);
/// Handoffs measured per implementation and kind.
const HANDOFFS_GRACEFUL: usize = 5;
const HANDOFFS_CRASH: usize = 3;
/// The handoff runs' lease (as the e2e tests': `podset::LEASE_TIMING`).
pub const HANDOFF_LEASE: Duration = podset::LEASE_DURATION;
/// Concurrent reconciles of every controller (Petrel's tiered sample keeps
/// one of them for urgent items).
pub const WORKERS: usize = 2;
/// The share of time Petrel's tiered sample gives its background work
/// (`--background-share`): the storm's status writes are paced so the API
/// server keeps room for user changes.
pub const BACKGROUND_SHARE: f64 = 0.3;
/// How many writes the bench sends at once when it fills the API server.
pub const FILL_CONCURRENCY: usize = 16;

/// One sample controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Impl {
    /// Petrel's sample, its queue tiered by event class.
    Petrel,
    /// Petrel's sample with one FIFO for every event (P30's reference).
    PetrelFifo,
    /// controller-runtime's sample (its priority queue on, the default).
    ControllerRuntime,
}

impl Impl {
    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Petrel => "Petrel",
            Impl::PetrelFifo => "Petrel, one FIFO",
            Impl::ControllerRuntime => "controller-runtime",
        }
    }

    /// The tier a user change goes to: depth at or above it is in front.
    fn user_tier(self) -> Tier {
        match self {
            Impl::Petrel => Tier::Named(3),
            Impl::PetrelFifo => Tier::Named(2),
            Impl::ControllerRuntime => Tier::Number(0),
        }
    }
}

/// A queue tier as the metrics name it.
#[derive(Debug, Clone, Copy)]
enum Tier {
    /// Petrel's: background 1, normal 2, urgent 3.
    Named(u8),
    /// controller-runtime's integer priorities.
    Number(i64),
}

/// One implementation's figures (P29, P30, P32).
#[derive(Debug, Clone, Default)]
pub struct ImplRun {
    /// Which.
    pub name: String,
    /// User change → reconcile, the controller idle.
    pub quiet: Samples,
    /// The same during the restart's storm.
    pub storm: Samples,
    /// The API server's answer to each change's patch (send → response),
    /// idle: the write path every change goes through before a watch can
    /// carry it.
    pub quiet_patch: Samples,
    /// The same in the storm.
    pub storm_patch: Samples,
    /// Changes sent in the storm window that were never reconciled.
    pub storm_unserved: usize,
    /// The storm's slowest changes: when each was sent (after the
    /// controller led) and its latency, slowest first.
    pub storm_slowest: Vec<(Duration, Duration)>,
    /// From the restart to the last of the 10 000 PodSets reconciled.
    pub drained_after: Option<Duration>,
    /// Queue depth in front of user changes, sampled every 100 ms in the
    /// storm window: mean and maximum.
    pub depth_mean: f64,
    /// The maximum.
    pub depth_max: f64,
    /// Depth samples taken.
    pub depth_samples: usize,
    /// Resident set with the 100 user PodSets cached (KiB).
    pub rss_small_kib: Option<u64>,
    /// With 10 100 PodSets cached (KiB).
    pub rss_full_kib: Option<u64>,
    /// API requests per minute at idle (leader election included).
    pub idle_requests_per_min: Option<f64>,
    /// What failed, if anything.
    pub error: Option<String>,
}

/// One implementation's handoffs (P31).
#[derive(Debug, Clone, Default)]
pub struct Handoff {
    /// Which.
    pub name: String,
    /// SIGTERM of the leader → new leader's first reconcile.
    pub graceful: Samples,
    /// kill -9 of the leader → new leader's first reconcile.
    pub crash: Samples,
    /// What failed, if anything.
    pub error: Option<String>,
}

/// P29-P32's results.
#[derive(Debug, Clone, Default)]
pub struct ControllerResults {
    /// PodSets listed by a restart.
    pub objects: usize,
    /// One run per implementation.
    pub runs: Vec<ImplRun>,
    /// Handoffs of Petrel's sample and controller-runtime's.
    pub handoffs: Vec<Handoff>,
    /// controller-runtime's version (`podset-controller --version`).
    pub controller_runtime_version: String,
    /// Why nothing was measured, if so.
    pub error: Option<String>,
}

impl ControllerResults {
    /// The run of `which`, if it was made.
    pub fn run(&self, which: Impl) -> Option<&ImplRun> {
        self.runs.iter().find(|r| r.name == which.name())
    }

    /// The handoffs of `which`, if measured.
    pub fn handoff(&self, which: Impl) -> Option<&Handoff> {
        self.handoffs.iter().find(|r| r.name == which.name())
    }
}

/// The figures' constants, for the report.
pub struct Params;

impl Params {
    /// User PodSets.
    pub const USERS: usize = USERS;
    /// Changes a second.
    pub const RATE: u32 = RATE;
    /// Quiet changes.
    pub const QUIET_CHANGES: usize = QUIET_CHANGES;
    /// Storm window (s).
    pub const STORM_SECS: u64 = STORM_WINDOW.as_secs();
    /// Storm resync period.
    pub const STORM_SYNC: &'static str = STORM_SYNC;
    /// Idle window (s).
    pub const IDLE_SECS: u64 = IDLE_WINDOW.as_secs();
    /// Handoffs per kind.
    pub const GRACEFUL: usize = HANDOFFS_GRACEFUL;
    /// Crash handoffs.
    pub const CRASH: usize = HANDOFFS_CRASH;
}

/// Measures P29-P32 on a cluster of its own.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> ControllerResults {
    let mut r = ControllerResults {
        objects: args.controller_objects,
        ..ControllerResults::default()
    };
    if let Err(e) = measure_into(args, work, progress, &mut r).await {
        r.error = Some(format!("{e:#}"));
    }
    r
}

/// The binaries of each implementation.
struct Bins {
    petrel: PathBuf,
    reference: PathBuf,
}

impl Bins {
    fn of(&self, which: Impl) -> (&Path, Vec<String>) {
        match which {
            Impl::Petrel => (
                &self.petrel,
                vec![
                    "--background-share".to_string(),
                    BACKGROUND_SHARE.to_string(),
                ],
            ),
            Impl::PetrelFifo => (&self.petrel, vec!["--fifo".to_string()]),
            Impl::ControllerRuntime => (&self.reference, vec![]),
        }
    }
}

async fn measure_into(
    args: &Args,
    work: &Work,
    progress: &dyn Fn(&str),
    r: &mut ControllerResults,
) -> Result<()> {
    let bins = Bins {
        petrel: std::path::absolute(&args.podset_controller)
            .with_context(|| format!("{}", args.podset_controller.display()))?,
        reference: peer_binary("podset-controller").map_err(|e| anyhow!("{e}"))?,
    };
    if !bins.petrel.is_file() {
        bail!(
            "{} is missing (make release builds it)",
            bins.petrel.display()
        );
    }
    r.controller_runtime_version = version_of(&bins.reference);
    progress("controller: starting etcd and kube-apiserver");
    let cluster = tokio::task::spawn_blocking(Cluster::start_audited)
        .await?
        .map_err(|e| anyhow!("{e}"))?;
    let kc = cluster.kubectl().map_err(|e| anyhow!("{e}"))?;
    kc.ok(&["create", "namespace", NS])
        .map_err(|e| anyhow!("{e}"))?;
    podset::prepare(&cluster, NS).map_err(|e| anyhow!("{e}"))?;
    let client = client(cluster.admin_kubeconfig()).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &resource());
    let users: Vec<String> = (0..USERS).map(|i| format!("user-{i:03}")).collect();
    fill(&api, &users).await?;
    let logs = work.dir.join("controllers");
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    let ctx = Ctx {
        cluster: &cluster,
        api: &api,
        users: &users,
        logs: &logs,
        bins: &bins,
        progress,
    };
    for which in [Impl::Petrel, Impl::PetrelFifo, Impl::ControllerRuntime] {
        let mut run = ImplRun {
            name: which.name().to_string(),
            ..ImplRun::default()
        };
        if let Err(e) = ctx.quiet(which, &mut run).await {
            run.error = Some(format!("idle: {e:#}"));
        }
        r.runs.push(run);
    }
    progress(&format!("controller: creating {} PodSets", r.objects));
    let storm: Vec<String> = (0..r.objects).map(|i| format!("obj-{i:05}")).collect();
    fill(&api, &storm).await?;
    for which in [Impl::Petrel, Impl::PetrelFifo, Impl::ControllerRuntime] {
        let Some(run) = r.runs.iter_mut().find(|x| x.name == which.name()) else {
            continue;
        };
        if run.error.is_some() {
            continue;
        }
        if let Err(e) = ctx.storm(which, &storm, run).await {
            run.error = Some(format!("storm: {e:#}"));
        }
    }
    for which in [Impl::Petrel, Impl::ControllerRuntime] {
        let mut h = Handoff {
            name: which.name().to_string(),
            ..Handoff::default()
        };
        if let Err(e) = ctx.handoffs(which, &mut h).await {
            h.error = Some(format!("{e:#}"));
        }
        r.handoffs.push(h);
    }
    Ok(())
}

/// `podset-controller --version`'s output, or `unknown`.
fn version_of(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// The PodSet resource.
fn resource() -> ApiResource {
    ApiResource {
        group: "bench.petrel.dev".into(),
        version: "v1".into(),
        api_version: "bench.petrel.dev/v1".into(),
        kind: "PodSet".into(),
        plural: "podsets".into(),
    }
}

/// A client on the admin kubeconfig.
pub async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("kubeconfig")?;
    Client::try_from(config).context("client")
}

/// Creates PodSets `names` (0 replicas, stamp 0), FILL_CONCURRENCY at once.
async fn fill(api: &Api<DynamicObject>, names: &[String]) -> Result<()> {
    for_each(names, |name| {
        let api = api.clone();
        async move {
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "bench.petrel.dev/v1",
                "kind": "PodSet",
                "metadata": {"name": name, "annotations": {CHANGED_AT: "0"}},
                "spec": {"replicas": 0, "template": {"spec": {"containers": [
                    {"name": "main", "image": "busybox", "command": ["sleep", "3600"]}
                ]}}},
            }))?;
            api.create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("create PodSet {name}"))?;
            Ok(())
        }
    })
    .await
}

/// Rewrites the status of PodSets `names` as never reconciled, so a
/// restart has a status to write for each.
async fn unreconcile(api: &Api<DynamicObject>, names: &[String]) -> Result<()> {
    for_each(names, |name| {
        let api = api.clone();
        async move {
            let patch = json!({"status": {"replicas": 0, "observedGeneration": 0}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("reset the status of PodSet {name}"))?;
            Ok(())
        }
    })
    .await
}

/// Runs `f` on each name, FILL_CONCURRENCY at once; the first error wins.
pub async fn for_each<F, Fut>(names: &[String], f: F) -> Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for name in names {
        if set.len() >= FILL_CONCURRENCY {
            if let Some(r) = set.join_next().await {
                r??;
            }
        }
        set.spawn(f(name.clone()));
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

/// What every measurement shares.
struct Ctx<'a> {
    cluster: &'a Cluster,
    api: &'a Api<DynamicObject>,
    users: &'a [String],
    logs: &'a Path,
    bins: &'a Bins,
    progress: &'a dyn Fn(&str),
}

/// A started controller and every event it printed so far.
struct Running {
    c: Controller,
    events: Vec<Event>,
    /// Its `/metrics` address.
    metrics: SocketAddr,
}

impl Running {
    /// Collects what it printed since the last call.
    fn pump(&mut self) {
        self.events.extend(self.c.drain());
    }

    /// Waits until `ok` holds for the events so far.
    async fn until(
        &mut self,
        what: &str,
        within: Duration,
        ok: impl Fn(&[Event]) -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            self.pump();
            if ok(&self.events) {
                return Ok(());
            }
            if start.elapsed() >= within {
                bail!(
                    "{what}: not within {within:?} (log {})",
                    self.c.log().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its resident set (KiB).
    fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.c.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }
}

/// The distinct keys reconciled at least once.
fn keys_seen(events: &[Event]) -> HashSet<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Reconciled { key, .. } => Some(key.as_str()),
            _ => None,
        })
        .collect()
}

impl Ctx<'_> {
    /// Starts `which` on lease `lease` with `extra` arguments.
    fn start(&self, which: Impl, lease: &str, tag: &str, extra: &[&str]) -> Result<Running> {
        let (bin, mut args) = self.bins.of(which);
        let port = petrel_testkit::process::free_port().map_err(|e| anyhow!("{e}"))?;
        let metrics = SocketAddr::from(([127, 0, 0, 1], port));
        let mut all = vec![
            "--kubeconfig".to_string(),
            self.cluster.admin_kubeconfig().display().to_string(),
            "--namespace".into(),
            NS.into(),
            "--leader-elect".into(),
            "--leader-election-id".into(),
            lease.into(),
            "--leader-election-namespace".into(),
            NS.into(),
            "--metrics-bind-address".into(),
            metrics.to_string(),
            "--workers".into(),
            WORKERS.to_string(),
        ];
        all.append(&mut args);
        all.extend(extra.iter().map(|s| s.to_string()));
        let slug: String = which
            .name()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let log = self.logs.join(format!("{slug}-{tag}.log"));
        let c = Controller::start(bin, &all, &log).map_err(|e| anyhow!("{e}"))?;
        Ok(Running {
            c,
            events: Vec::new(),
            metrics,
        })
    }

    /// The idle figures: the controller started on the user PodSets alone,
    /// its memory and idle requests, then QUIET_CHANGES changes.
    async fn quiet(&self, which: Impl, run: &mut ImplRun) -> Result<()> {
        (self.progress)(&format!("controller: {} idle", which.name()));
        let mut c = self.start(which, &format!("quiet-{}", slug(which)), "quiet", &[])?;
        let users = self.users.len();
        c.until(
            "leading and every user PodSet reconciled",
            Duration::from_secs(120),
            |ev| keys_seen(ev).len() >= users,
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        run.rss_small_kib = c.rss_kib();
        if which != Impl::PetrelFifo {
            run.idle_requests_per_min = Some(self.idle_requests().await?);
        }
        let (sent, patch) = send_changes(self.api, self.users, QUIET_CHANGES).await?;
        run.quiet_patch = patch;
        let (samples, unserved) = collect(&mut c, &sent, Duration::from_secs(30)).await;
        if unserved > 0 {
            bail!("{unserved} of {} changes never reconciled", sent.len());
        }
        run.quiet = samples;
        c.c.terminate(Duration::from_secs(10));
        Ok(())
    }

    /// Counts the requests the running controller sends in IDLE_WINDOW.
    async fn idle_requests(&self) -> Result<f64> {
        let log = self
            .cluster
            .audit_log()
            .ok_or_else(|| anyhow!("the cluster keeps no audit log"))?
            .to_path_buf();
        let from = std::fs::metadata(&log)
            .with_context(|| format!("stat {}", log.display()))?
            .len();
        tokio::time::sleep(IDLE_WINDOW).await;
        let n = count_requests(&log, from, "petrel-admin")?;
        Ok(n as f64 * 60.0 / IDLE_WINDOW.as_secs_f64())
    }

    /// The storm: status of every storm PodSet reset, the controller
    /// restarted on everything with a short resync, changes sent for
    /// STORM_WINDOW meanwhile, queue depth sampled.
    async fn storm(&self, which: Impl, storm: &[String], run: &mut ImplRun) -> Result<()> {
        (self.progress)(&format!("controller: {} storm", which.name()));
        unreconcile(self.api, storm).await?;
        let mut c = self.start(
            which,
            &format!("storm-{}", slug(which)),
            "storm",
            &["--sync-period", STORM_SYNC],
        )?;
        c.until("leading", Duration::from_secs(120), |ev| {
            ev.iter().any(|e| matches!(e, Event::Leading(_)))
        })
        .await?;
        let started = Instant::now();
        let led_ns = podset::unix_nanos();
        let depth = Arc::new(Mutex::new(Vec::<f64>::new()));
        let sampler = {
            let depth = depth.clone();
            let addr = c.metrics;
            let tier = which.user_tier();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    if let Ok(resp) =
                        crate::http::get(addr, "/metrics", Duration::from_secs(2)).await
                    {
                        let text = String::from_utf8_lossy(&resp.body);
                        if let Some(d) = depth_in_front(&text, tier) {
                            depth.lock().await.push(d);
                        }
                    }
                }
            })
        };
        let n = (STORM_WINDOW.as_secs() * u64::from(RATE)) as usize;
        let sent = send_changes(self.api, self.users, n).await;
        sampler.abort();
        let (sent, patch) = sent?;
        run.storm_patch = patch;
        let (samples, unserved) = collect(&mut c, &sent, Duration::from_secs(60)).await;
        run.storm = samples;
        run.storm_unserved = unserved;
        run.storm_slowest = slowest(&sent, &c.events, led_ns, SLOWEST);
        let want: HashSet<&str> = storm.iter().map(String::as_str).collect();
        let drained = c
            .until(
                "every storm PodSet reconciled",
                Duration::from_secs(300),
                |ev| {
                    let seen = keys_seen(ev);
                    want.iter()
                        .all(|k| seen.contains(format!("{NS}/{k}").as_str()))
                },
            )
            .await;
        if drained.is_ok() {
            // The last storm key's reconcile time.
            run.drained_after = last_storm_reconcile(&c.events, started);
        }
        let d = depth.lock().await;
        run.depth_samples = d.len();
        run.depth_mean = if d.is_empty() {
            0.0
        } else {
            d.iter().sum::<f64>() / d.len() as f64
        };
        run.depth_max = d.iter().copied().fold(0.0, f64::max);
        drop(d);
        run.rss_full_kib = c.rss_kib();
        c.c.terminate(Duration::from_secs(10));
        drained
    }

    /// Leader handoffs between two replicas on one Lease.
    async fn handoffs(&self, which: Impl, h: &mut Handoff) -> Result<()> {
        (self.progress)(&format!("controller: {} handoffs", which.name()));
        let lease = format!("handoff-{}", slug(which));
        let mut n = 0;
        let start = |n: &mut usize| -> Result<Running> {
            *n += 1;
            self.start(
                which,
                &lease,
                &format!("handoff-{n}"),
                &podset::LEASE_TIMING,
            )
        };
        let mut leader = start(&mut n)?;
        leader
            .until("the first replica leads", Duration::from_secs(120), |ev| {
                ev.iter().any(|e| matches!(e, Event::FirstReconcile(_)))
            })
            .await?;
        let mut standby = start(&mut n)?;
        for round in 0..HANDOFFS_GRACEFUL + HANDOFFS_CRASH {
            let crash = round >= HANDOFFS_GRACEFUL;
            // The standby's caches are synced well before this.
            tokio::time::sleep(Duration::from_secs(5)).await;
            standby.pump();
            standby.events.clear();
            // From the signal: a leader that releases its Lease may be
            // replaced before its process has exited.
            let gone = podset::unix_nanos();
            if crash {
                leader.c.kill();
            } else {
                leader.c.terminate(Duration::from_secs(10));
            }
            standby
                .until(
                    "the standby's first reconcile",
                    HANDOFF_LEASE * 3 + Duration::from_secs(10),
                    |ev| ev.iter().any(|e| matches!(e, Event::FirstReconcile(_))),
                )
                .await?;
            let first = standby.events.iter().find_map(|e| match e {
                Event::FirstReconcile(t) => Some(*t),
                _ => None,
            });
            let took =
                Duration::from_nanos(first.unwrap_or(gone).saturating_sub(gone).max(0) as u64);
            if crash {
                h.crash.push(took);
            } else {
                h.graceful.push(took);
            }
            leader = std::mem::replace(&mut standby, start(&mut n)?);
        }
        leader.c.terminate(Duration::from_secs(10));
        standby.c.terminate(Duration::from_secs(10));
        Ok(())
    }
}

/// A file-name-safe name of `which`.
fn slug(which: Impl) -> &'static str {
    match which {
        Impl::Petrel => "petrel",
        Impl::PetrelFifo => "fifo",
        Impl::ControllerRuntime => "controller-runtime",
    }
}

/// Sends `n` changes at RATE a second, round-robin over `users`, on a
/// warm connection; returns each change's key and stamp, and the patches'
/// round trips.
async fn send_changes(
    api: &Api<DynamicObject>,
    users: &[String],
    n: usize,
) -> Result<(Vec<(String, i64)>, Samples)> {
    // A user's client is connected already: the first patch must not pay
    // for opening one (a batch's first patch took 48 ms in one run, against
    // a median of 4.5 ms).
    if let Some(first) = users.first() {
        api.get(first)
            .await
            .with_context(|| format!("read PodSet {first}"))?;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
    let mut set = tokio::task::JoinSet::new();
    let mut sent = Vec::with_capacity(n);
    let mut rtt = Samples::default();
    let mut last = 0;
    for i in 0..n {
        tick.tick().await;
        let name = users[i % users.len()].clone();
        // Strictly increasing: each stamp names one change.
        let stamp = podset::unix_nanos().max(last + 1);
        last = stamp;
        sent.push((format!("{NS}/{name}"), stamp));
        let api = api.clone();
        set.spawn(async move {
            let patch = json!({"metadata": {"annotations": {CHANGED_AT: stamp.to_string()}}});
            let t = Instant::now();
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("change PodSet {name}"))
                .map(|_| t.elapsed())
        });
        while let Some(r) = set.try_join_next() {
            rtt.push(r??);
        }
    }
    while let Some(r) = set.join_next().await {
        rtt.push(r??);
    }
    Ok((sent, rtt))
}

/// Waits up to `within` for every change of `sent` to be reconciled; the
/// latencies, and how many were never served.
async fn collect(c: &mut Running, sent: &[(String, i64)], within: Duration) -> (Samples, usize) {
    let start = Instant::now();
    loop {
        c.pump();
        let (samples, unserved) = latencies(sent, &c.events);
        if unserved == 0 || start.elapsed() >= within {
            return (samples, unserved);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `n` slowest served changes: when each was sent after `from_ns`
/// (Unix ns) and its latency, slowest first. Where a tail comes from in
/// time (a resync round, the list) is what a p99.9 alone does not say.
pub fn slowest(
    sent: &[(String, i64)],
    events: &[Event],
    from_ns: i64,
    n: usize,
) -> Vec<(Duration, Duration)> {
    let ns = |v: i64| Duration::from_nanos(v.max(0) as u64);
    let mut all: Vec<(Duration, Duration)> = sent
        .iter()
        .zip(served_at(sent, events))
        .filter_map(|((_, stamp), at)| Some((ns(stamp - from_ns), ns(at? - stamp))))
        .collect();
    all.sort_by_key(|s| std::cmp::Reverse(s.1));
    all.truncate(n);
    all
}

/// When each sent change was served: the end of the first reconcile of its
/// PodSet that saw its stamp or a later one (Unix ns), if any yet.
fn served_at(sent: &[(String, i64)], events: &[Event]) -> Vec<Option<i64>> {
    // key → reconciles (stamp seen, at), in print order.
    let mut seen: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
    for e in events {
        if let Event::Reconciled {
            key,
            changed_at,
            at,
            ..
        } = e
        {
            seen.entry(key.as_str())
                .or_default()
                .push((*changed_at, *at));
        }
    }
    sent.iter()
        .map(|(key, stamp)| {
            seen.get(key.as_str())
                .and_then(|r| r.iter().find(|(s, _)| s >= stamp).map(|(_, at)| *at))
        })
        .collect()
}

/// Each sent change's latency ([`served_at`]). Returns the samples and the
/// count of changes not yet served.
pub fn latencies(sent: &[(String, i64)], events: &[Event]) -> (Samples, usize) {
    let mut samples = Samples::default();
    let mut unserved = 0;
    for ((_, stamp), at) in sent.iter().zip(served_at(sent, events)) {
        match at {
            Some(at) => samples.push(Duration::from_nanos(at.saturating_sub(*stamp).max(0) as u64)),
            None => unserved += 1,
        }
    }
    (samples, unserved)
}

/// When the last storm PodSet (`obj-*`) was first reconciled, from
/// `started`.
fn last_storm_reconcile(events: &[Event], started: Instant) -> Option<Duration> {
    let mut first: BTreeMap<&str, i64> = BTreeMap::new();
    for e in events {
        if let Event::Reconciled { key, at, .. } = e {
            if key.contains("/obj-") {
                first.entry(key.as_str()).or_insert(*at);
            }
        }
    }
    let last = first.values().copied().max()?;
    let now = podset::unix_nanos();
    let since_start = now - i64::try_from(started.elapsed().as_nanos()).ok()?;
    Some(Duration::from_nanos(
        last.saturating_sub(since_start).max(0) as u64,
    ))
}

/// The depth of the queue at or above `tier`, from `workqueue_depth` in a
/// Prometheus text exposition; None when the metric is absent.
fn depth_in_front(text: &str, tier: Tier) -> Option<f64> {
    let mut found = false;
    let mut sum = 0.0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("workqueue_depth{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let priority = labels.split(',').find_map(|l| {
            l.trim()
                .strip_prefix("priority=\"")
                .and_then(|v| v.strip_suffix('"'))
        });
        let counts = match (tier, priority) {
            (Tier::Named(min), Some(p)) => {
                let rank = match p {
                    "urgent" => 3,
                    "normal" => 2,
                    "background" => 1,
                    _ => 0,
                };
                rank >= min
            }
            (Tier::Number(min), Some(p)) => p.parse::<i64>().is_ok_and(|n| n >= min),
            // A queue without tiers: everything is in front.
            (_, None) => true,
        };
        found = true;
        if counts {
            sum += value;
        }
    }
    found.then_some(sum)
}

/// Requests of `user` in the audit log after byte `from`: each request
/// counted once (a watch when its response starts, any other when it
/// completes).
pub fn count_requests(log: &Path, from: u64, user: &str) -> Result<usize> {
    let mut f = std::fs::File::open(log).with_context(|| format!("open {}", log.display()))?;
    f.seek(SeekFrom::Start(from))
        .with_context(|| format!("seek {}", log.display()))?;
    let mut n = 0;
    for line in std::io::BufReader::new(f).lines() {
        let line = line.with_context(|| format!("read {}", log.display()))?;
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if ev["user"]["username"] != user {
            continue;
        }
        let watch = ev["verb"] == "watch";
        let stage = ev["stage"].as_str().unwrap_or_default();
        if (watch && stage == "ResponseStarted") || (!watch && stage == "ResponseComplete") {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &str, stamp: i64, at: i64) -> Event {
        Event::Reconciled {
            key: key.into(),
            generation: 1,
            changed_at: stamp,
            at,
        }
    }

    #[test]
    fn latencies_should_serve_every_earlier_stamp_with_a_later_reconcile() {
        let sent = vec![
            ("ns/a".to_string(), 100),
            ("ns/a".to_string(), 200),
            ("ns/b".to_string(), 150),
            ("ns/c".to_string(), 300),
        ];
        // a's first change was coalesced into the reconcile of its second.
        let events = vec![
            rec("ns/a", 0, 50),
            rec("ns/a", 200, 1200),
            rec("ns/b", 150, 400),
        ];
        let (s, unserved) = latencies(&sent, &events);
        assert_eq!(unserved, 1, "c is never reconciled");
        assert_eq!(s.len(), 3);
        assert_eq!(s.max(), Duration::from_nanos(1100));
        assert_eq!(s.min(), Duration::from_nanos(250));
        // Slowest first, sent times from 100 ns; c, unserved, is left out.
        let ns = Duration::from_nanos;
        assert_eq!(
            slowest(&sent, &events, 100, 2),
            [(ns(0), ns(1100)), (ns(100), ns(1000))]
        );
    }

    #[test]
    fn depth_in_front_should_count_the_user_tier_and_above() {
        let petrel = "# TYPE workqueue_depth gauge\n\
            workqueue_depth{name=\"podsets\",priority=\"urgent\"} 2\n\
            workqueue_depth{name=\"podsets\",priority=\"normal\"} 5\n\
            workqueue_depth{name=\"podsets\",priority=\"background\"} 900\n";
        assert_eq!(depth_in_front(petrel, Tier::Named(3)), Some(2.0));
        assert_eq!(depth_in_front(petrel, Tier::Named(2)), Some(7.0));
        let cr = "workqueue_depth{controller=\"podset\",name=\"podset\",priority=\"-100\"} 800\n\
            workqueue_depth{controller=\"podset\",name=\"podset\",priority=\"0\"} 3\n";
        assert_eq!(depth_in_front(cr, Tier::Number(0)), Some(3.0));
        let plain = "workqueue_depth{name=\"q\"} 4\n";
        assert_eq!(depth_in_front(plain, Tier::Number(0)), Some(4.0));
        assert_eq!(depth_in_front("other 1\n", Tier::Number(0)), None);
    }

    #[test]
    fn count_requests_should_count_each_request_of_the_user_once() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let log = dir.path().join("audit.log");
        let line = |user: &str, verb: &str, stage: &str| {
            format!(r#"{{"user":{{"username":"{user}"}},"verb":"{verb}","stage":"{stage}"}}"#)
        };
        let old = line("me", "get", "ResponseComplete");
        let text = [
            old.clone(),
            line("me", "update", "ResponseComplete"),
            line("me", "watch", "ResponseStarted"),
            line("me", "watch", "ResponseComplete"),
            line("other", "get", "ResponseComplete"),
            "not json".to_string(),
        ]
        .join("\n");
        std::fs::write(&log, text).unwrap_or_else(|e| panic!("{e}"));
        let from = old.len() as u64 + 1;
        assert_eq!(count_requests(&log, from, "me").ok(), Some(2));
        assert_eq!(count_requests(&log, 0, "me").ok(), Some(3));
    }
}
