//! P33-P35: a node of a real cluster (issue 31). One etcd and
//! kube-apiserver with an audit log, kube-scheduler and
//! kube-controller-manager (the test kit's `Cluster`), and three node
//! stacks joined to it one after the other, each with its own node name,
//! runtime, directories, cgroups and CNI network (started by
//! `kubelet_stack` as the kubelet figures start theirs):
//!
//! - `petrel node --kubeconfig` (agent and runtime in one process);
//! - kubelet on containerd 2.x, joined with the node's credentials;
//! - kubelet on `petrel runtime`, joined the same way.
//!
//! The same pods on each: busybox `sleep` (the kubelet figures' image from
//! the conformance kit's registry), one container, no service account
//! token, a grace period of 1 s, bound with `spec.nodeName`, so the
//! scheduler is not in the measured path. The bench sees them through a
//! kube-rs watch of the node's pods (`spec.nodeName=<node>`), which stamps
//! each pod's first event with phase Running and its container ready.
//!
//! - P33: pods created one after the other (quiet gaps as P26's), each
//!   timed from the moment its create request is sent to that event;
//! - P34: a burst of pods created at once, from the first create sent to
//!   the last pod's event;
//! - P35: the node idle with the burst's pods: API requests of
//!   `system:node:<name>` in the audit log, CPU of the whole node by cgroup
//!   accounting and its memory, as P23-P25 take them;
//! - P36-P37: pods reading a ConfigMap and a Secret
//!   (`cluster_objects_bench`).
//!
//! `cluster_bench_report` renders it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use petrel_testkit::cluster::Cluster;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;

use crate::controller_bench::{client, count_requests, for_each};
use crate::kubelet::{self, MemoryPoint, Setup, Shared, Window, CONTAINER, IMAGE, NAMESPACE};
use crate::kubelet_pods::quiet;
use crate::kubelet_stack::{node_name, start_stack_with, Stack, StackSpec};
use crate::stats::Samples;
use crate::sweep::Work;
use crate::Args;

/// The controllers kube-controller-manager runs (as the e2e test's
/// cluster): the node's heartbeat watched, owners' garbage collected.
const CONTROLLERS: [&str; 4] = [
    "nodelifecycle",
    "deployment",
    "replicaset",
    "garbagecollector",
];
/// The longest wait for a node to register and turn Ready.
const READY_WITHIN: Duration = Duration::from_secs(120);
/// The longest wait for the warm-up pod (its image is pulled first).
const WARM_WITHIN: Duration = Duration::from_secs(180);
/// The longest wait for one pod of P33 to run.
const START_WITHIN: Duration = Duration::from_secs(60);
/// The longest wait for P34's pods to run.
const BURST_WITHIN: Duration = Duration::from_secs(300);
/// The longest wait for deleted pods to go from the API.
const GONE_WITHIN: Duration = Duration::from_secs(120);
/// How often a wait looks at what the watch has seen (the samples are
/// the watch's own stamps, not these looks).
const LOOK_GAP: Duration = Duration::from_millis(5);

/// P34: the burst.
#[derive(Debug, Clone, Default)]
pub struct Burst {
    /// Pods created.
    pub pods: usize,
    /// First create sent → last create answered.
    pub sent: Duration,
    /// First create sent → the last pod's Running event.
    pub all_running: Duration,
}

/// P35: the idle node.
#[derive(Debug, Clone)]
pub struct IdleNode {
    /// Pods running.
    pub pods: usize,
    /// CPU of the node's processes over the window (its wall included).
    pub window: Window,
    /// Requests by `system:node:<name>` in the audit log over the window.
    pub requests: usize,
    /// Memory of the node's processes after the window.
    pub memory: MemoryPoint,
}

impl IdleNode {
    /// Requests per minute.
    pub fn requests_per_min(&self) -> f64 {
        let secs = self.window.wall.as_secs_f64();
        if secs <= 0.0 {
            return 0.0;
        }
        self.requests as f64 * 60.0 / secs
    }
}

/// Everything measured on one stack.
#[derive(Debug, Clone)]
pub struct StackRun {
    /// Which.
    pub setup: Setup,
    /// The runtime's version as it says it.
    pub runtime_version: String,
    /// The node's name.
    pub node: String,
    /// Stack started → Node Ready in the API.
    pub ready_after: Option<Duration>,
    /// P33: create sent → Running event.
    pub starts: Samples,
    /// P33's create calls: sent → answered.
    pub creates: Samples,
    /// P34.
    pub burst: Option<Burst>,
    /// P33's pods (and the warm-up's) deleted with their grace period →
    /// gone from the API (the node stops them and deletes their objects).
    pub deleted: Option<(usize, Duration)>,
    /// P35.
    pub idle: Option<IdleNode>,
    /// P36-P37 (the node's logic: `petrel node` and kubelet on containerd).
    pub objects: Option<crate::cluster_objects_bench::ObjectsRun>,
    /// Steps not taken, with why.
    pub skipped: Vec<String>,
    /// What stopped this stack, if anything.
    pub error: Option<String>,
}

impl StackRun {
    fn new(setup: Setup) -> StackRun {
        StackRun {
            setup,
            runtime_version: String::new(),
            node: String::new(),
            ready_after: None,
            starts: Samples::default(),
            creates: Samples::default(),
            burst: None,
            deleted: None,
            idle: None,
            objects: None,
            skipped: vec![],
            error: None,
        }
    }
}

/// The whole section.
#[derive(Debug, Clone, Default)]
pub struct ClusterResults {
    /// One per stack, in the order run.
    pub runs: Vec<StackRun>,
    /// `kubelet --version`.
    pub kubelet_version: String,
    /// P33's pods per stack.
    pub starts: usize,
    /// P34's pods per stack.
    pub burst: usize,
    /// P35's window, in seconds.
    pub idle_seconds: u64,
    /// What stopped the whole section before any stack, if anything.
    pub error: Option<String>,
}

impl ClusterResults {
    /// The run of `setup`, if it was run.
    pub fn run(&self, setup: Setup) -> Option<&StackRun> {
        self.runs.iter().find(|r| r.setup == setup)
    }
}

/// What the cluster figures need beyond the kubelet figures' peers:
/// etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
/// kubectl. Checked before anything runs.
pub fn preflight(args: &Args) -> Result<()> {
    if petrel_testkit::cluster::left_out().is_none() {
        for peer in [
            "etcd",
            "kube-apiserver",
            "kube-scheduler",
            "kube-controller-manager",
            "kubectl",
        ] {
            petrel_testkit::peers::peer_binary(peer)?;
        }
    }
    kubelet::preflight_setups(args, &args.cluster_setups)
}

/// Measures P33-P35 on every stack of `args.cluster_setups`; a stack that
/// fails is recorded with its error and the next one runs.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> ClusterResults {
    let mut r = ClusterResults {
        kubelet_version: kubelet::kubelet_version(),
        starts: args.cluster_starts,
        burst: args.cluster_burst,
        idle_seconds: args.cluster_idle_seconds,
        ..ClusterResults::default()
    };
    if let Err(e) = measure_into(args, work, progress, &mut r).await {
        r.error = Some(format!("{e:#}"));
    }
    r
}

async fn measure_into(
    args: &Args,
    work: &Work,
    progress: &dyn Fn(&str),
    r: &mut ClusterResults,
) -> Result<()> {
    if let Some(why) = petrel_testkit::cluster::left_out() {
        bail!("not measured: {why}");
    }
    let shared = tokio::task::block_in_place(|| kubelet::share(args))?;
    progress(
        "cluster: starting etcd, kube-apiserver (audited), kube-scheduler, kube-controller-manager",
    );
    let cluster = tokio::task::spawn_blocking(|| {
        let mut c = Cluster::start_audited()?;
        c.start_controller_manager(&CONTROLLERS)?;
        c.start_scheduler()?;
        Ok::<_, petrel_testkit::KitError>(c)
    })
    .await?
    .map_err(|e| anyhow!("{e}"))?;
    let outcome = stacks(args, work, &shared, &cluster, progress, r).await;
    // Both stop processes and wait for them.
    tokio::task::block_in_place(move || {
        drop(cluster);
        drop(shared);
    });
    outcome
}

/// The namespace, then each stack in turn.
async fn stacks(
    args: &Args,
    work: &Work,
    shared: &Shared,
    cluster: &Cluster,
    progress: &dyn Fn(&str),
    r: &mut ClusterResults,
) -> Result<()> {
    let audit = cluster
        .audit_log()
        .ok_or_else(|| anyhow!("the cluster has no audit log"))?
        .to_path_buf();
    tokio::task::block_in_place(|| {
        let kc = cluster.kubectl()?;
        kc.ok(&["create", "namespace", NAMESPACE])?;
        // No service account controller runs: the admission of a pod
        // still wants its (default) service account to exist.
        kc.ok(&["create", "serviceaccount", "default", "-n", NAMESPACE])?;
        Ok::<_, petrel_testkit::KitError>(())
    })
    .map_err(|e| anyhow!("{e}"))?;
    let client = client(cluster.admin_kubeconfig()).await?;
    let ctx = Ctx {
        args,
        work,
        shared,
        cluster,
        client,
        audit: &audit,
        progress,
    };
    for (index, setup) in args.cluster_setups.iter().enumerate() {
        progress(&format!(
            "cluster figures: {}",
            kubelet::setup_name(*setup, "")
        ));
        let mut run = StackRun::new(*setup);
        if let Some(why) = kubelet::left_out(*setup) {
            run.skipped.push(format!("the whole stack: {why}"));
        } else if let Err(e) = ctx.drive(index, &mut run).await {
            progress(&format!("{}: {e:#}", kubelet::setup_name(*setup, "")));
            run.error = Some(format!("{e:#}"));
        }
        r.runs.push(run);
    }
    Ok(())
}

/// What every stack shares.
struct Ctx<'a> {
    args: &'a Args,
    work: &'a Work,
    shared: &'a Shared,
    cluster: &'a Cluster,
    client: kube::Client,
    audit: &'a Path,
    progress: &'a dyn Fn(&str),
}

impl Ctx<'_> {
    /// One stack: started, measured, then its pods and Node deleted and
    /// the stack torn down, also when a measurement failed.
    async fn drive(&self, index: usize, run: &mut StackRun) -> Result<()> {
        let setup = run.setup;
        let node = node_name(self.work, setup);
        run.node = node.clone();
        let ip = petrel_testkit::kubelet::node_ip().map_err(|e| anyhow!("{e}"))?;
        let creds = self
            .cluster
            .node_credentials(&node, ip)
            .map_err(|e| anyhow!("{e}"))?;
        let spec = StackSpec {
            cgroup: format!(
                "{}/cluster-{}-{index}",
                self.work.cgroup_parent,
                setup.tag()
            ),
            node_name: node.clone(),
            join: Some(&creds),
            // P33's pods and the warm-up may still be going when the burst
            // comes.
            max_pods: self.args.cluster_starts + 1 + self.args.cluster_burst,
        };
        let t0 = Instant::now();
        let (stack, version) =
            tokio::task::block_in_place(|| start_stack_with(self.args, self.shared, setup, &spec))?;
        run.runtime_version = version;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let measured = self.measure(index, &stack, &pods, t0, run).await;
        let name = kubelet::setup_name(setup, &run.runtime_version);
        (self.progress)(&format!("{name}: deleting its pods and Node"));
        // Gone from the API first: a node would start them again while
        // the kit removes them through the runtime.
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let deleted = pods.delete_collection(&dp, &on_node).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::block_in_place(move || drop(stack));
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node_deleted = nodes.delete(&node, &DeleteParams::default()).await;
        measured?;
        deleted.with_context(|| format!("delete the pods of node {node}"))?;
        node_deleted.with_context(|| format!("delete node {node}"))?;
        Ok(())
    }

    /// Node Ready, the warm-up pod, P33, the deletion, P34, P35.
    async fn measure(
        &self,
        index: usize,
        stack: &Stack,
        pods: &Api<Pod>,
        started: Instant,
        run: &mut StackRun,
    ) -> Result<()> {
        let name = kubelet::setup_name(run.setup, &run.runtime_version);
        let node = run.node.clone();
        wait_ready(&self.client, &node, stack).await?;
        run.ready_after = Some(started.elapsed());
        let watch = PodWatch::start(pods.clone(), &node).await?;

        // The image is pulled here, not in the first sample.
        (self.progress)(&format!("{name}: warm-up pod"));
        let warm = "warm".to_string();
        pods.create(&PostParams::default(), &pod(&warm, &node)?)
            .await
            .context("create the warm-up pod")?;
        watch
            .until("the warm-up pod running", WARM_WITHIN, stack, |s| {
                s.running.contains_key(&warm)
            })
            .await?;

        (self.progress)(&format!(
            "{name}: P33, {} pods one after the other",
            self.args.cluster_starts
        ));
        let mut rng = StdRng::seed_from_u64(0x636c_7573 + index as u64);
        let mut made = vec![warm];
        for i in 0..self.args.cluster_starts {
            let p = format!("s{i:03}");
            tokio::time::sleep(quiet(&mut rng)).await;
            let object = pod(&p, &node)?;
            let t0 = Instant::now();
            pods.create(&PostParams::default(), &object)
                .await
                .with_context(|| format!("create pod {p}"))?;
            run.creates.push(t0.elapsed());
            made.push(p.clone());
            watch
                .until(&format!("pod {p} running"), START_WITHIN, stack, |s| {
                    s.running.contains_key(&p)
                })
                .await?;
            if let Some(at) = watch.running_at(&p) {
                run.starts.push(at.saturating_duration_since(t0));
            }
        }

        // The burst's pods alone for the idle figures.
        (self.progress)(&format!("{name}: deleting {} pods", made.len()));
        let t0 = Instant::now();
        for p in &made {
            pods.delete(p, &DeleteParams::default())
                .await
                .with_context(|| format!("delete pod {p}"))?;
        }
        watch
            .until(
                &format!("{} deleted pods gone from the API", made.len()),
                GONE_WITHIN,
                stack,
                |s| made.iter().all(|p| s.gone.contains_key(p)),
            )
            .await?;
        run.deleted = Some((made.len(), t0.elapsed()));
        tokio::time::sleep(kubelet::SETTLE).await;

        (self.progress)(&format!(
            "{name}: P34, {} pods at once",
            self.args.cluster_burst
        ));
        let names: Vec<String> = (0..self.args.cluster_burst)
            .map(|i| format!("b{i:03}"))
            .collect();
        let t0 = Instant::now();
        for_each(&names, |p| {
            let pods = pods.clone();
            let object = pod(&p, &node);
            async move {
                pods.create(&PostParams::default(), &object?)
                    .await
                    .with_context(|| format!("create pod {p}"))?;
                Ok(())
            }
        })
        .await?;
        let sent = t0.elapsed();
        watch
            .until(
                &format!("{} pods running", names.len()),
                BURST_WITHIN,
                stack,
                |s| names.iter().all(|p| s.running.contains_key(p)),
            )
            .await?;
        let last = names
            .iter()
            .filter_map(|p| watch.running_at(p))
            .max()
            .unwrap_or(t0);
        run.burst = Some(Burst {
            pods: names.len(),
            sent,
            all_running: last.saturating_duration_since(t0),
        });
        drop(watch);
        tokio::time::sleep(kubelet::SETTLE).await;

        (self.progress)(&format!(
            "{name}: P35, {} s idle window at {} pods",
            self.args.cluster_idle_seconds,
            names.len()
        ));
        let from = std::fs::metadata(self.audit)
            .with_context(|| format!("stat {}", self.audit.display()))?
            .len();
        let group = format!(
            "{}/cluster-{}-{index}-cpu",
            self.work.cgroup_parent,
            run.setup.tag()
        );
        let window = kubelet::window(stack, self.args.cluster_idle_seconds, &group).await?;
        let requests = count_requests(self.audit, from, &format!("system:node:{node}"))?;
        let memory = kubelet::memory(stack, names.len())?;
        run.idle = Some(IdleNode {
            pods: names.len(),
            window,
            requests,
            memory,
        });

        // P36-P37 measure the node's logic: kubelet's on one runtime is
        // enough.
        if run.setup == Setup::KubeletPetrel {
            run.skipped
                .push("P36-P37: kubelet's logic, measured on kubelet + containerd".to_string());
            return Ok(());
        }
        (self.progress)(&format!(
            "{name}: P36-P37, {} pods with a ConfigMap and a Secret each",
            crate::cluster_objects_bench::OBJECT_PODS
        ));
        run.objects = Some(
            crate::cluster_objects_bench::measure(
                &self.client,
                stack,
                &node,
                &format!("{}-{index}", run.setup.tag()),
                self.audit,
                self.args.cluster_idle_seconds,
            )
            .await?,
        );
        Ok(())
    }
}

/// A bench pod bound to `node`: one busybox container sleeping a day, no
/// service account token, stopped within a second.
fn pod(name: &str, node: &str) -> Result<Pod> {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": CONTAINER,
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "86400"],
            }],
        },
    }))
    .with_context(|| format!("pod object {name}"))
}

/// Phase Running with the container ready.
pub fn running_ready(p: &Pod) -> bool {
    let Some(st) = &p.status else {
        return false;
    };
    st.phase.as_deref() == Some("Running")
        && st.container_statuses.as_ref().is_some_and(|cs| {
            cs.iter().any(|c| {
                c.name == CONTAINER
                    && c.ready
                    && c.state.as_ref().is_some_and(|s| s.running.is_some())
            })
        })
}

/// Waits until Node `node` is Ready in the API.
async fn wait_ready(client: &kube::Client, node: &str, stack: &Stack) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let t0 = Instant::now();
    loop {
        let ready = nodes.get_opt(node).await.ok().flatten().is_some_and(|n| {
            n.status
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        if ready {
            return Ok(());
        }
        if t0.elapsed() > READY_WITHIN {
            bail!(
                "node {node} not Ready within {} s:\n{}",
                READY_WITHIN.as_secs(),
                stack.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first moment the watch saw each pod running (and deleted).
#[derive(Debug, Default)]
pub struct Seen {
    /// Pod name → its first event with phase Running and the container
    /// ready.
    pub running: HashMap<String, Instant>,
    /// Pod name → its DELETED event.
    pub gone: HashMap<String, Instant>,
}

impl Seen {
    /// Notes `p` as seen at `at`.
    fn note(&mut self, p: &Pod, at: Instant) {
        let Some(name) = p.metadata.name.clone() else {
            return;
        };
        if running_ready(p) {
            self.running.entry(name).or_insert(at);
        }
    }
}

/// A kube-rs watch of the pods bound to one node: listed, then watched
/// from the list's resourceVersion (again from the last one seen when a
/// watch ends, listed again after 410 Gone). Stopped on drop.
struct PodWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    async fn start(api: Api<Pod>, node: &str) -> Result<PodWatch> {
        let selector = format!("spec.nodeName={node}");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let rv = list_into(&api, &selector, &seen)
            .await
            .with_context(|| format!("list the pods of node {node}"))?;
        let task = tokio::spawn(watch_loop(api, selector, rv, seen.clone()));
        Ok(PodWatch { seen, task })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        lock(&self.seen)
    }

    /// When pod `name` was first seen running.
    fn running_at(&self, name: &str) -> Option<Instant> {
        self.lock().running.get(name).copied()
    }

    /// Waits until `done` holds for what the watch has seen.
    async fn until(
        &self,
        what: &str,
        within: Duration,
        stack: &Stack,
        done: impl Fn(&Seen) -> bool,
    ) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if done(&self.lock()) {
                return Ok(());
            }
            if self.task.is_finished() {
                bail!("the watch of the node's pods ended");
            }
            if t0.elapsed() > within {
                bail!(
                    "{what}: not within {} s:\n{}",
                    within.as_secs(),
                    stack.log_tail()
                );
            }
            tokio::time::sleep(LOOK_GAP).await;
        }
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    // A panic elsewhere leaves the map as it was: still good to read.
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lists the pods of `selector` into `seen`; returns the list's
/// resourceVersion.
async fn list_into(api: &Api<Pod>, selector: &str, seen: &Mutex<Seen>) -> Result<String> {
    let list = api
        .list(&ListParams::default().fields(selector))
        .await
        .context("list pods")?;
    let at = Instant::now();
    let mut s = lock(seen);
    for p in &list.items {
        s.note(p, at);
    }
    Ok(list.metadata.resource_version.unwrap_or_default())
}

/// Watches until aborted; a broken watch is made again.
async fn watch_loop(api: Api<Pod>, selector: String, mut rv: String, seen: Arc<Mutex<Seen>>) {
    loop {
        // Under the API server's own limit, so the server never cuts it.
        let wp = WatchParams::default().fields(&selector).timeout(290);
        let stream = match api.watch(&wp, &rv).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("petrel-bench: watch pods: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        let mut relist = false;
        while let Some(ev) = stream.next().await {
            let at = Instant::now();
            match ev {
                Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => {
                    rv = p.metadata.resource_version.clone().unwrap_or(rv);
                    lock(&seen).note(&p, at);
                }
                Ok(WatchEvent::Deleted(p)) => {
                    rv = p.metadata.resource_version.clone().unwrap_or(rv);
                    if let Some(name) = p.metadata.name {
                        lock(&seen).gone.entry(name).or_insert(at);
                    }
                }
                Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                Ok(WatchEvent::Error(e)) => {
                    relist = e.code == 410;
                    break;
                }
                Err(_) => break,
            }
        }
        if relist {
            match list_into(&api, &selector, &seen).await {
                Ok(v) => rv = v,
                Err(e) => {
                    eprintln!("petrel-bench: {e:#}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn with_status(phase: &str, ready: bool, running: bool) -> Pod {
        let state = if running {
            json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
        } else {
            json!({"waiting": {"reason": "ContainerCreating"}})
        };
        let mut p = pod("p", "n").unwrap();
        p.status = Some(
            serde_json::from_value(json!({
                "phase": phase,
                "containerStatuses": [{
                    "name": CONTAINER, "ready": ready, "restartCount": 0,
                    "image": IMAGE, "imageID": "", "state": state,
                }],
            }))
            .unwrap(),
        );
        p
    }

    #[test]
    fn running_ready_should_want_the_phase_and_a_ready_running_container() {
        assert!(running_ready(&with_status("Running", true, true)));
        assert!(!running_ready(&with_status("Running", false, true)));
        assert!(!running_ready(&with_status("Pending", false, false)));
        assert!(!running_ready(&pod("p", "n").unwrap()));
    }

    #[test]
    fn pod_should_be_bound_without_a_token_and_stop_within_a_second() {
        let v = serde_json::to_value(pod("s001", "node-a").unwrap()).unwrap();
        assert_eq!(v["spec"]["nodeName"], "node-a");
        assert_eq!(v["spec"]["automountServiceAccountToken"], false);
        assert_eq!(v["spec"]["terminationGracePeriodSeconds"], 1);
        assert_eq!(v["spec"]["containers"][0]["image"], IMAGE);
        assert_eq!(v["metadata"]["namespace"], NAMESPACE);
    }

    #[test]
    fn seen_should_keep_the_first_running_moment() {
        let mut s = Seen::default();
        let t0 = Instant::now();
        s.note(&with_status("Pending", false, false), t0);
        assert!(s.running.is_empty());
        let t1 = t0 + Duration::from_millis(5);
        s.note(&with_status("Running", true, true), t1);
        s.note(
            &with_status("Running", true, true),
            t1 + Duration::from_secs(1),
        );
        assert_eq!(s.running.get("p"), Some(&t1));
    }
}
