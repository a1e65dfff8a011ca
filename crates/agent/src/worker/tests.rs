//! The pod workers under injected faults (issue 4, item 6: no interleaving
//! of events, relists and syncs may create a container twice).
//!
//! The real pipeline runs in-process: the manifest source on a temporary
//! directory, the PLEG (event and relist modes), the cache, the work queue
//! and the pod workers, wired as `agent.rs` wires them, against the fake
//! runtime with seeded random faults: slow calls, calls failing with
//! UNAVAILABLE before or after they took effect, events late, duplicated,
//! reordered and dropped, streams cut, containers and sandboxes dying by
//! themselves. Meanwhile manifests change, disappear and come back. On
//! every create and start the fake checks that no container name has two
//! live instances in a sandbox, that no pod gets a second ready sandbox,
//! and that init containers never run beside other containers of their
//! sandbox. Then the faults stop and every pod must converge to its spec.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_controller::{ItemExponential, MaxOf, QueueConfig, TokenBucket, WorkQueue};
use petrel_cri::api::ContainerState;
use tokio::task::JoinSet;

use super::{PodWorkers, WorkerConfig};
use crate::cache::PodCache;
use crate::config::PlegMode;
use crate::convert::container_hash;
use crate::cri::RuntimeActuator;
use crate::health::Health;
use crate::metrics::AgentMetrics;
use crate::pleg::fake::{FakeRuntime, Faults, TICK};
use crate::pleg::PlegConfig;
use crate::source::PodSource;
use crate::status::StatusStore;
use crate::types::{DesiredPod, ANNOTATION_CONTAINER_HASH};

const NODE: &str = "node-faults";
/// How long the faults last at least.
const CHAOS: Duration = Duration::from_millis(4000);
/// The faults last until the workers have restarted this many containers
/// (a test whose faults never struck could not fail), up to four times
/// [`CHAOS`]: a slow machine gets through less work per second.
const MIN_RECREATES: usize = 12;
/// How long convergence may take once they stop.
const CONVERGE: Duration = Duration::from_secs(10);
const SYNC_PERIOD: Duration = Duration::from_millis(800);

fn faults() -> Faults {
    Faults {
        max_delay: Duration::from_millis(3),
        slow: 0.1,
        slow_delay: Duration::from_millis(30),
        fail_before: 0.03,
        fail_after: 0.03,
        event_drop: 0.1,
        event_dup: 0.1,
        event_max_delay: Duration::from_millis(40),
        stream_cut: 0.005,
        cut_all: 0.002,
        app_exit: 0.01,
        sandbox_death: 0.002,
        init_failure: 0.2,
        remove_exited: 0.002,
        // Most events carry the whole pod (the payload is cached as its
        // status); some only the sandbox (the pod is inspected).
        thin_events: 0.3,
    }
}

/// A pod manifest: init and app containers (`name=image` or
/// `name=image;args`; an init container whose name ends in `+` is a
/// sidecar), restart policy, and a postStart/preStop hook on the first app
/// container.
fn manifest(name: &str, policy: &str, init: &[&str], apps: &[&str]) -> String {
    fn containers(list: &[&str], hooks: bool) -> String {
        let mut out = String::new();
        for (i, c) in list.iter().enumerate() {
            let (n, rest) = c.split_once('=').unwrap_or((c, "busybox:1.36"));
            let (image, arg) = rest.split_once(';').unwrap_or((rest, "run"));
            let sidecar = n.ends_with('+');
            let n = n.trim_end_matches('+');
            out.push_str(&format!(
                "  - name: {n}\n    image: {image}\n    command: [sh, -c]\n    args: [\"{arg}\"]\n"
            ));
            if sidecar {
                out.push_str("    restartPolicy: Always\n");
            }
            if hooks && i == 0 {
                out.push_str(
                    "    lifecycle:\n      postStart: {exec: {command: [\"true\"]}}\n      preStop: {exec: {command: [\"true\"]}}\n",
                );
            }
        }
        out
    }
    let mut y = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 1\n"
    );
    if !init.is_empty() {
        y.push_str("  initContainers:\n");
        y.push_str(&containers(init, false));
    }
    y.push_str("  containers:\n");
    y.push_str(&containers(apps, true));
    y
}

/// Writes a manifest atomically (the watcher never reads half a file).
fn put(dir: &Path, file: &str, text: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}

fn delete(dir: &Path, file: &str) {
    std::fs::remove_file(dir.join(file)).unwrap();
}

/// The agent's pipeline minus the HTTP server, wired as in `agent.rs`.
struct Running {
    source: PodSource,
    store: Arc<StatusStore>,
    queue: WorkQueue<String>,
    tasks: JoinSet<()>,
    cache: Arc<PodCache>,
    workers: Arc<PodWorkers>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.queue.shut_down();
        self.tasks.abort_all();
    }
}

async fn start(rt: Arc<FakeRuntime>, manifests: &Path, root: &Path, mode: PlegMode) -> Running {
    start_with(rt, manifests, root, mode, None).await
}

/// [`start`], with admission against `facts` when given.
async fn start_with(
    rt: Arc<FakeRuntime>,
    manifests: &Path,
    root: &Path,
    mode: PlegMode,
    facts: Option<crate::admission::NodeFacts>,
) -> Running {
    let runtime: Arc<dyn RuntimeActuator> = rt;
    let metrics = AgentMetrics::new();
    let cache = Arc::new(PodCache::new());
    let health = Arc::new(Health::new(Duration::from_secs(180)));
    let store = Arc::new(StatusStore::new());
    let source = PodSource::load(manifests, NODE).unwrap();
    // agent.rs retries from 50 ms to 5 s; shorter here so that a pod that
    // failed many times under faults converges within the test.
    let queue: WorkQueue<String> = WorkQueue::new(
        QueueConfig::default()
            .name("pods")
            .resync_window(SYNC_PERIOD / 2)
            .rate_limiter(MaxOf::new(vec![
                Box::new(ItemExponential::<String>::new(
                    Duration::from_millis(10),
                    Duration::from_millis(300),
                )),
                Box::new(TokenBucket::new(50.0, 200)),
            ])),
    );
    let mut tasks = JoinSet::new();
    while runtime.version().await.is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let core = crate::agent::Core {
        runtime: Arc::clone(&runtime),
        cache: Arc::clone(&cache),
        health,
        metrics,
        source: source.clone(),
        store: Arc::clone(&store),
        queue: queue.clone(),
    };
    let workers = crate::agent::build_workers(
        &core,
        PlegConfig {
            mode,
            relist_period: Duration::from_millis(50),
            // Dropped events are found by the safety net (and by relists
            // after stream cuts).
            event_relist_period: Duration::from_secs(1),
            inspect_concurrency: 4,
            node_name: NODE.into(),
        },
        WorkerConfig {
            node_name: NODE.into(),
            host_ip: "127.0.0.1".into(),
            runtime_name: "fake".into(),
            cgroups: crate::qos_cgroups::CgroupLayout::new(
                crate::qos_cgroups::CgroupDriver::Cgroupfs,
                "/petrel-test",
            )
            .unwrap(),
            root: root.to_path_buf(),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(160),
            seccomp_root: root.join("seccomp"),
            seccomp_default: false,
            recursive_read_only: false,
            dns: crate::convert::DnsSettings::default(),
        },
    );
    if let Some(facts) = facts {
        workers.set_node_facts(facts);
    }
    let pleg = workers.pleg().clone();
    tasks.spawn(pleg.clone().run());
    pleg.wait_ready().await;
    crate::agent::start_pipeline(
        crate::agent::Pipeline {
            queue: &queue,
            source: &source,
            cache: &cache,
            workers: &workers,
            sync_period: SYNC_PERIOD,
        },
        &mut tasks,
    )
    .unwrap();
    Running {
        source,
        store,
        queue,
        tasks,
        cache,
        workers,
    }
}

/// Why the runtime does not (yet) match the desired pods; None when it
/// does: each pod has one ready sandbox in which its init containers
/// completed and its app containers run their current spec (or, with
/// OnFailure, completed), nothing else of it is live, and pods no longer
/// wanted are gone.
fn divergence(rt: &FakeRuntime, desired: &[DesiredPod]) -> Option<String> {
    let sandboxes = rt.sandboxes();
    let containers = rt.containers();
    let wanted: HashMap<&str, &DesiredPod> = desired.iter().map(|d| (d.uid.as_str(), d)).collect();
    for sb in &sandboxes {
        if !wanted.contains_key(sb.uid.as_str()) {
            return Some(format!(
                "sandbox {} of deleted pod {} remains",
                sb.id, sb.uid
            ));
        }
    }
    for c in &containers {
        if !wanted.contains_key(c.uid.as_str()) {
            return Some(format!(
                "container {} ({}) of deleted pod {} remains",
                c.name, c.id, c.uid
            ));
        }
    }
    for d in desired {
        let Some(spec) = d.pod.spec.as_ref() else {
            return Some(format!("pod {} has no spec", d.name));
        };
        let on_failure = spec.restart_policy.as_deref() == Some("OnFailure");
        // A pod that completed (OnFailure, every app container succeeded)
        // keeps nothing running, not even its sandbox.
        let newest_sandbox = sandboxes.iter().rev().find(|s| s.uid == d.uid);
        if let Some(sb) = newest_sandbox.filter(|s| on_failure && !s.ready) {
            let completed = spec.containers.iter().all(|c| {
                containers
                    .iter()
                    .rev()
                    .find(|i| i.sandbox == sb.id && i.name == c.name)
                    .is_some_and(|i| i.state == ContainerState::ContainerExited && i.exit_code == 0)
            });
            let live = containers.iter().find(|c| {
                c.uid == d.uid
                    && matches!(
                        c.state,
                        ContainerState::ContainerCreated | ContainerState::ContainerRunning
                    )
            });
            match live {
                Some(c) if completed => {
                    return Some(format!("pod {} completed, but {} lives", d.name, c.name))
                }
                None if completed => continue,
                _ => {}
            }
        }
        let ready: Vec<_> = sandboxes
            .iter()
            .filter(|s| s.uid == d.uid && s.ready)
            .collect();
        let [sb] = ready.as_slice() else {
            return Some(format!("pod {}: {} ready sandboxes", d.name, ready.len()));
        };
        let newest = |name: &str| {
            containers
                .iter()
                .rev()
                .find(|c| c.sandbox == sb.id && c.name == name)
        };
        let runs_its_spec = |c: &k8s_openapi::api::core::v1::Container| match newest(&c.name) {
            Some(i) if i.state == ContainerState::ContainerRunning => {
                let hash = i.annotations.get(ANNOTATION_CONTAINER_HASH);
                (hash != Some(&container_hash(c)))
                    .then(|| format!("pod {}: {} runs an old spec", d.name, c.name))
            }
            other => Some(format!(
                "pod {}: container {} is {:?}",
                d.name,
                c.name,
                other.map(|i| (i.state, i.exit_code))
            )),
        };
        // An init container added to the manifest after the pod started
        // runs with the next sandbox only. Once app containers exist, the
        // init containers' newest instance may be gone or an older failed
        // one (the runtime removed the completed one): that apps were only
        // created after every init container completed is the fake's check
        // on each create. Sidecars run beside the apps, to their spec.
        let apps_created = spec.containers.iter().any(|c| newest(&c.name).is_some());
        for c in spec.init_containers.iter().flatten() {
            if crate::convert::is_sidecar(c) {
                if let Some(why) = runs_its_spec(c) {
                    return Some(why);
                }
                continue;
            }
            match newest(&c.name) {
                Some(i) if i.state == ContainerState::ContainerExited && i.exit_code == 0 => {}
                Some(i) if apps_created && i.state == ContainerState::ContainerExited => {}
                None if apps_created => {}
                other => {
                    return Some(format!(
                        "pod {}: init container {} is {:?}",
                        d.name,
                        c.name,
                        other.map(|i| (i.state, i.exit_code))
                    ))
                }
            }
        }
        for c in &spec.containers {
            match newest(&c.name) {
                Some(i) if i.state == ContainerState::ContainerRunning => {
                    let hash = i.annotations.get(ANNOTATION_CONTAINER_HASH);
                    if hash != Some(&container_hash(c)) {
                        return Some(format!("pod {}: {} runs an old spec", d.name, c.name));
                    }
                }
                Some(i)
                    if on_failure
                        && i.state == ContainerState::ContainerExited
                        && i.exit_code == 0 => {}
                other => {
                    return Some(format!(
                        "pod {}: container {} is {:?}",
                        d.name,
                        c.name,
                        other.map(|i| (i.state, i.exit_code))
                    ))
                }
            }
        }
        let names: HashSet<&str> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| c.name.as_str())
            .collect();
        for c in containers.iter().filter(|c| c.uid == d.uid) {
            let live = matches!(
                c.state,
                ContainerState::ContainerCreated | ContainerState::ContainerRunning
            );
            if live && (c.sandbox != sb.id || !names.contains(c.name.as_str())) {
                return Some(format!(
                    "pod {}: {} ({}) live outside its spec or sandbox",
                    d.name, c.name, c.id
                ));
            }
        }
    }
    None
}

/// What one seed did.
struct Outcome {
    creates: usize,
    recreates: usize,
    sandboxes: usize,
    converged_in: Duration,
}

/// One seed: chaos with manifest changes, then convergence. Err names the
/// first problem.
async fn run_seed(seed: u64, mode: PlegMode) -> Result<Outcome, String> {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    let web = |image: &str| {
        manifest(
            "web",
            "Always",
            &["init-a", "logger+", "init-b"],
            &[&format!("app={image}"), "side", "log"],
        )
    };
    put(&dir, "web.yaml", &web("busybox:1.36"));
    put(
        &dir,
        "job.yaml",
        &manifest("job", "OnFailure", &["setup"], &["work", "helper"]),
    );
    put(
        &dir,
        "plain.yaml",
        &manifest("plain", "Always", &[], &["one", "two"]),
    );
    put(&dir, "gone.yaml", &manifest("gone", "Always", &[], &["x"]));
    let flap = manifest("flap", "OnFailure", &["prep"], &["main"]);
    put(&dir, "flap.yaml", &flap);

    let rt = Arc::new(FakeRuntime::live(seed));
    rt.set_faults(faults());
    let pipeline = start(Arc::clone(&rt), &dir, &root, mode).await;

    // The script of manifest changes, at fractions of the chaos.
    let t0 = Instant::now();
    let mut step = 0;
    let check = |rt: &FakeRuntime| -> Result<(), String> {
        match rt.violations().first() {
            Some(v) => Err(format!("seed {seed} {mode:?}: {v}")),
            None => Ok(()),
        }
    };
    while t0.elapsed() < CHAOS || (rt.recreates() < MIN_RECREATES && t0.elapsed() < 4 * CHAOS) {
        rt.chaos_tick();
        check(&rt)?;
        let frac = t0.elapsed().as_secs_f64() / CHAOS.as_secs_f64();
        if step == 0 && frac > 0.25 {
            put(&dir, "web.yaml", &web("busybox:1.37"));
            put(
                &dir,
                "plain.yaml",
                &manifest("plain", "Always", &[], &["one", "two=busybox:1.36;changed"]),
            );
            delete(&dir, "gone.yaml");
            step += 1;
        } else if step == 1 && frac > 0.5 {
            delete(&dir, "flap.yaml");
            put(
                &dir,
                "late.yaml",
                &manifest("late", "Always", &["init-l"], &["l1", "l2"]),
            );
            step += 1;
        } else if step == 2 && frac > 0.75 {
            put(&dir, "flap.yaml", &flap);
            // An init container added to a running pod: it must not run
            // beside the app containers.
            put(
                &dir,
                "late.yaml",
                &manifest("late", "Always", &["init-l", "init-m"], &["l1", "l2"]),
            );
            // A container removed from a running pod, another added.
            put(
                &dir,
                "plain.yaml",
                &manifest(
                    "plain",
                    "Always",
                    &[],
                    &["two=busybox:1.36;changed", "three"],
                ),
            );
            put(
                &dir,
                "job.yaml",
                &manifest(
                    "job",
                    "OnFailure",
                    &["setup"],
                    &["work=busybox:1.36;v2", "helper"],
                ),
            );
            step += 1;
        }
        tokio::time::sleep(TICK).await;
    }
    if rt.recreates() < MIN_RECREATES {
        return Err(format!(
            "seed {seed} {mode:?}: the faults made only {} restarts in {:?}",
            rt.recreates(),
            t0.elapsed()
        ));
    }

    // Faults off: everything must converge, and stay converged.
    rt.set_faults(Faults::default());
    let t1 = Instant::now();
    let expected: HashSet<&str> = ["web", "job", "plain", "flap", "late"].into();
    let mut stable_since: Option<Instant> = None;
    loop {
        rt.chaos_tick();
        check(&rt)?;
        let desired = pipeline.source.all();
        let names: HashSet<&str> = desired.iter().map(|d| d.name.as_str()).collect();
        let why = if names != expected {
            Some(format!("the source has {names:?}"))
        } else {
            divergence(&rt, &desired)
        };
        match why {
            None if stable_since.is_some_and(|t| t.elapsed() > Duration::from_millis(500)) => break,
            None => {
                stable_since.get_or_insert_with(Instant::now);
            }
            Some(why) => {
                stable_since = None;
                if t1.elapsed() > CONVERGE {
                    return Err(format!(
                        "seed {seed} {mode:?}: no convergence within {CONVERGE:?}: {why}"
                    ));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let converged_in = t1.elapsed() - Duration::from_millis(500);
    drop(pipeline);
    Ok(Outcome {
        creates: rt.calls("create_container"),
        recreates: rt.recreates(),
        sandboxes: rt.calls("run_podsandbox"),
        converged_in,
    })
}

/// Runs several seeds at once and reports every failure.
async fn run_seeds(mode: PlegMode, seeds: &[u64]) {
    let mut set = JoinSet::new();
    for &seed in seeds {
        set.spawn(async move { (seed, run_seed(seed, mode).await) });
    }
    let mut failures = Vec::new();
    while let Some(r) = set.join_next().await {
        let (seed, r) = r.unwrap();
        match r {
            Ok(o) => {
                eprintln!(
                    "seed {seed} {mode:?}: {} creates ({} restarts), {} sandboxes, converged in {:?}",
                    o.creates, o.recreates, o.sandboxes, o.converged_in
                );
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_should_never_create_twice_and_should_converge_in_events_mode() {
    run_seeds(PlegMode::Events, &[1, 2, 3, 4, 5]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_should_never_create_twice_and_should_converge_in_relist_mode() {
    run_seeds(PlegMode::Relist, &[11, 12, 13, 14, 15]).await;
}

/// Waits up to 10 s for `done`; panics with `what` otherwise.
async fn wait_for(what: &str, done: impl FnMut() -> Option<String>) {
    wait_within(CONVERGE, what, done).await;
}

/// Waits up to `within` for `done`; panics with `what` otherwise.
async fn wait_within(within: Duration, what: &str, mut done: impl FnMut() -> Option<String>) {
    let t = Instant::now();
    loop {
        let Some(why) = done() else { return };
        assert!(t.elapsed() < within, "{what} within {within:?}: {why}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The race behind a pod that never came back: an inspection that began
/// while the pod ran ends after its manifest was deleted and the worker
/// removed and forgot it. Its status must not stand for the pod when the
/// manifest (same UID) comes back, or the worker sees it running and
/// never starts it. Deterministic: the late write is made by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_inspection_should_not_hide_a_pod_that_came_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    let flap = manifest("flap", "Always", &[], &["main"]);
    put(&dir, "flap.yaml", &flap);
    let rt = Arc::new(FakeRuntime::live(1));
    let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
    let uid = pipeline.source.all()[0].uid.clone();
    wait_for("the pod starts", || divergence(&rt, &pipeline.source.all())).await;
    // The runtime may run the pod a moment before the cache has inspected
    // it: wait for the cache too, or the "running" status below is stale.
    let ready = petrel_cri::api::PodSandboxState::SandboxReady as i32;
    wait_for("the cache sees the pod running", || {
        let status = pipeline.cache.get(&uid).status?;
        let sandbox = status.sandboxes.iter().any(|s| s.state == ready);
        let running = petrel_cri::api::ContainerState::ContainerRunning as i32;
        let main = status.containers.iter().any(|c| c.state == running);
        (!(sandbox && main)).then(|| format!("{status:?}"))
    })
    .await;

    // An inspection begins now and finds the pod running...
    let began = crate::cache::now_ns();
    let running = pipeline.cache.get(&uid).status.unwrap();
    // ...the manifest goes, the worker removes and forgets the pod...
    delete(&dir, "flap.yaml");
    wait_for("the pod is removed and forgotten", || {
        let left = rt.sandboxes().iter().filter(|s| s.uid == uid).count()
            + rt.containers().iter().filter(|c| c.uid == uid).count();
        let known = pipeline.workers.known_uids().contains(&uid);
        (left > 0 || known || !pipeline.queue.is_empty())
            .then(|| format!("{left} left, known {known}"))
    })
    .await;
    // (late syncs of the removal have run)
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...and the inspection ends.
    pipeline.cache.set(&uid, Ok(running), began);

    put(&dir, "flap.yaml", &flap);
    wait_for("the pod comes back", || {
        let desired = pipeline.source.all();
        if desired.is_empty() {
            return Some("not in the source yet".into());
        }
        divergence(&rt, &desired)
    })
    .await;
}

/// Init containers run one at a time, in order: once a later one has an
/// instance, an earlier one whose completed instance the runtime removed
/// (garbage collection, `crictl rm`) must not run again beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_init_instance_should_not_run_again_beside_a_later_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    put(
        &dir,
        "steps.yaml",
        &manifest("steps", "Always", &["init-a", "init-b"], &["app"]),
    );
    let rt = Arc::new(FakeRuntime::live(1));
    let uid = crate::source::uid::derive(NODE, "default", "steps");
    let sb = rt.add_sandbox(&uid, NODE);
    // init-a completed and was removed since; init-b runs.
    let b = rt.add_container(&sb, "init-b", ContainerState::ContainerRunning);
    let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Relist).await;
    assert_eq!(pipeline.source.all()[0].uid, uid);
    tokio::time::sleep(SYNC_PERIOD).await;
    assert_eq!(rt.violations(), Vec::<String>::new());
    assert_eq!(rt.calls("create_container"), 0);
    // init-b completes: the app starts.
    rt.set_state(&b, ContainerState::ContainerExited);
    wait_for("the app starts", || divergence(&rt, &pipeline.source.all())).await;
    assert_eq!(rt.violations(), Vec::<String>::new());
    assert_eq!(rt.calls("create_container"), 1);
}

/// A change of a pod-level field (here a label and the hostname) gives the
/// pod a new sandbox, once, with its containers in it; the old sandbox is
/// stopped. A static pod does the same under kubelet (its UID changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_level_change_should_move_the_pod_to_a_new_sandbox_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    let before = manifest("moving", "Never", &["setup"], &["main"]);
    put(&dir, "moving.yaml", &before);
    let rt = Arc::new(FakeRuntime::live(1));
    let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
    // Time passes on the runtime: the init container completes.
    let ticker = {
        let rt = Arc::clone(&rt);
        tokio::spawn(async move {
            loop {
                rt.chaos_tick();
                tokio::time::sleep(TICK).await;
            }
        })
    };
    wait_for("the pod starts", || divergence(&rt, &pipeline.source.all())).await;
    let old: Vec<String> = rt.sandboxes().into_iter().map(|s| s.id).collect();
    assert_eq!(old.len(), 1);
    let creates = rt.calls("create_container");

    let after = before
        .replace(
            "  name: moving\n",
            "  name: moving\n  labels: {tier: two}\n",
        )
        .replace("spec:\n", "spec:\n  hostname: elsewhere\n");
    assert_ne!(after, before);
    put(&dir, "moving.yaml", &after);
    wait_for("the pod moves", || {
        let ready: Vec<String> = rt
            .sandboxes()
            .into_iter()
            .filter(|s| s.ready)
            .map(|s| s.id)
            .collect();
        if ready.iter().any(|id| old.contains(id)) || ready.len() != 1 {
            return Some(format!("ready sandboxes {ready:?}"));
        }
        divergence(&rt, &pipeline.source.all())
    })
    .await;
    // Settled: no further sandbox, and init + app ran once more each.
    tokio::time::sleep(SYNC_PERIOD * 2).await;
    assert_eq!(rt.calls("run_podsandbox"), 2);
    assert_eq!(rt.calls("create_container"), creates + 2);
    assert_eq!(rt.violations(), Vec::<String>::new());
    ticker.abort();
}

/// The state (`running`, `waiting`, `terminated`) of container `name` of
/// pod `default/pod` as published, with its JSON.
fn published_state(
    store: &StatusStore,
    pod: &str,
    name: &str,
) -> Option<(String, serde_json::Value)> {
    let p = store.get("default", pod)?;
    let v = serde_json::to_value(&*p).ok()?;
    let c = v["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)?
        .clone();
    let (k, st) = c["state"].as_object()?.iter().next()?;
    Some((k.clone(), st.clone()))
}

/// A container that dies is shown terminated as soon as the PLEG sees it,
/// before its worker restarts it (restartPolicy Always): here the
/// restart's CreateContainer takes 3 s, and the death shows long before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_should_show_a_dead_container_before_its_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    put(
        &dir,
        "plain.yaml",
        &manifest("plain", "Always", &[], &["one"]),
    );
    let rt = Arc::new(FakeRuntime::live(1));
    let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
    wait_for("the pod runs", || {
        match published_state(&pipeline.store, "plain", "one") {
            Some((k, _)) if k == "running" => None,
            other => Some(format!("{other:?}")),
        }
    })
    .await;
    let id = rt.containers()[0].id.clone();
    rt.delay("create_container", Duration::from_secs(3));
    rt.stop_container(&id, 0).await.unwrap();
    wait_within(
        Duration::from_millis(1500),
        "the death shown",
        || match published_state(&pipeline.store, "plain", "one") {
            Some((k, st)) if k == "terminated" && st["exitCode"] == 137 => None,
            other => Some(format!("{other:?}")),
        },
    )
    .await;
    assert_eq!(rt.containers().len(), 1, "shown before the restart");
    // Then it restarts.
    wait_for("the restart", || {
        match published_state(&pipeline.store, "plain", "one") {
            Some((k, _)) if k == "running" => None,
            other => Some(format!("{other:?}")),
        }
    })
    .await;
}

/// A container the runtime refuses to create, or to start, keeps being
/// retried, and the pod is shown meanwhile with kubelet's waiting reason
/// and the runtime's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_should_show_containers_that_cannot_be_created_or_started() {
    for (op, reason) in [
        ("create_container", "CreateContainerError"),
        ("start_container", "RunContainerError"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir: PathBuf = tmp.path().join("manifests");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&dir).unwrap();
        let rt = Arc::new(FakeRuntime::live(1));
        rt.fail(op, Some(tonic::Code::Unknown));
        put(&dir, "bad.yaml", &manifest("bad", "Always", &[], &["one"]));
        let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
        wait_for(reason, || {
            match published_state(&pipeline.store, "bad", "one") {
                Some((k, st))
                    if k == "waiting"
                        && st["reason"] == reason
                        && st["message"] == "injected failure" =>
                {
                    None
                }
                other => Some(format!("{other:?}")),
            }
        })
        .await;
        let pod = pipeline.store.get("default", "bad").unwrap();
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        assert_eq!(phase.as_deref(), Some("Pending"));
        // Retried, and still shown.
        let tried = rt.calls(op);
        wait_for("a retry", || {
            (rt.calls(op) < tried + 2).then(|| format!("{} calls", rt.calls(op)))
        })
        .await;
        assert!(matches!(
            published_state(&pipeline.store, "bad", "one"),
            Some((k, st)) if k == "waiting" && st["reason"] == reason
        ));
        // Once the runtime cooperates, it runs.
        rt.fail(op, None);
        wait_for("running", || {
            match published_state(&pipeline.store, "bad", "one") {
                Some((k, _)) if k == "running" => None,
                other => Some(format!("{other:?}")),
            }
        })
        .await;
    }
}

/// The published status of pod `default/name`, as JSON.
fn published(store: &StatusStore, name: &str) -> Option<serde_json::Value> {
    serde_json::to_value(&*store.get("default", name)?).ok()
}

/// Lets time act on the fake runtime (init containers exit by themselves)
/// until the returned guard is dropped.
fn ticking(rt: &Arc<FakeRuntime>) -> impl Drop {
    struct Ticker(tokio::task::JoinHandle<()>);
    impl Drop for Ticker {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let rt = Arc::clone(rt);
    Ticker(tokio::spawn(async move {
        loop {
            rt.chaos_tick();
            tokio::time::sleep(TICK).await;
        }
    }))
}

/// Native sidecars (init containers with `restartPolicy: Always`) start in
/// order with the other init containers, the next one once they run; they
/// run on beside the app containers and are restarted when they exit,
/// whatever the pod's restartPolicy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_should_start_in_order_and_keep_running_beside_the_apps() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    put(
        &dir,
        "mesh.yaml",
        &manifest("mesh", "Never", &["init-a", "proxy+", "init-b"], &["main"]),
    );
    let rt = Arc::new(FakeRuntime::live(1));
    let _time = ticking(&rt);
    let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
    wait_for("the pod runs", || divergence(&rt, &pipeline.source.all())).await;
    let order: Vec<String> = rt.containers().into_iter().map(|c| c.name).collect();
    assert_eq!(order, ["init-a", "proxy", "init-b", "main"]);
    assert_eq!(rt.violations(), Vec::<String>::new());
    wait_for("the sidecar shown running", || {
        let p = published(&pipeline.store, "mesh")?;
        let proxy = &p["status"]["initContainerStatuses"][1];
        (p["status"]["phase"] != "Running"
            || proxy["state"]["running"].is_null()
            || proxy["ready"] != true)
            .then(|| p["status"].to_string())
    })
    .await;

    // The sidecar dies: it comes back, though the pod's policy is Never.
    let proxy = rt
        .containers()
        .into_iter()
        .find(|c| c.name == "proxy")
        .unwrap();
    rt.exit(&proxy.id, 1);
    wait_for("the sidecar restarted", || {
        let again = rt.containers().into_iter().any(|c| {
            c.name == "proxy" && c.id != proxy.id && c.state == ContainerState::ContainerRunning
        });
        (!again).then(|| format!("{:?}", rt.containers()))
    })
    .await;
    wait_for("its restart shown", || {
        let p = published(&pipeline.store, "mesh")?;
        let proxy = &p["status"]["initContainerStatuses"][1];
        (proxy["restartCount"] != 1 || proxy["state"]["running"].is_null())
            .then(|| proxy.to_string())
    })
    .await;
    // The app was left alone, and the regular init containers never ran
    // again.
    let creates: HashMap<String, usize> =
        rt.containers()
            .into_iter()
            .fold(HashMap::new(), |mut m, c| {
                *m.entry(c.name).or_default() += 1;
                m
            });
    assert_eq!(creates.get("main"), Some(&1));
    assert_eq!(rt.calls("create_container"), 5);
    assert_eq!(rt.violations(), Vec::<String>::new());
}

/// A pod that completed (restartPolicy Never, or OnFailure once every app
/// container succeeded) keeps nothing running: its sidecars are stopped,
/// the last first, then its sandbox (which releases its network and IP).
/// It is not started again, and its status stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_pod_should_stop_its_sidecars_in_reverse_order_and_its_sandbox() {
    for policy in ["Never", "OnFailure"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir: PathBuf = tmp.path().join("manifests");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&dir).unwrap();
        put(
            &dir,
            "job.yaml",
            &manifest("job", policy, &["first+", "second+"], &["main"]),
        );
        let rt = Arc::new(FakeRuntime::live(1));
        let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
        wait_for("the pod runs", || divergence(&rt, &pipeline.source.all())).await;
        let id = |name: &str| {
            rt.containers()
                .into_iter()
                .find(|c| c.name == name)
                .unwrap()
                .id
        };
        let (first, second) = (id("first"), id("second"));
        // Were the sidecars stopped together, `first` would stop first.
        rt.delay_stop(&second, Duration::from_millis(300));
        rt.exit(&id("main"), 0);
        wait_for("the pod stopped", || {
            let live = rt.containers().into_iter().filter(|c| {
                matches!(
                    c.state,
                    ContainerState::ContainerRunning | ContainerState::ContainerCreated
                )
            });
            let ready = rt.sandboxes().into_iter().filter(|s| s.ready).count();
            let live: Vec<String> = live.map(|c| c.name).collect();
            (ready > 0 || !live.is_empty()).then(|| format!("{ready} ready sandboxes, {live:?}"))
        })
        .await;
        assert_eq!(rt.stopped(), [second, first], "{policy}: the last first");
        wait_for("shown Succeeded", || {
            let p = published(&pipeline.store, "job")?;
            (p["status"]["phase"] != "Succeeded").then(|| p["status"].to_string())
        })
        .await;
        // It stays so: no new sandbox, nothing started again.
        let creates = rt.calls("create_container");
        tokio::time::sleep(SYNC_PERIOD * 2).await;
        assert_eq!(rt.calls("run_podsandbox"), 1, "{policy}");
        assert_eq!(rt.calls("create_container"), creates, "{policy}");
        let p = published(&pipeline.store, "job").unwrap();
        assert_eq!(p["status"]["phase"], "Succeeded", "{policy}");
        assert_eq!(rt.violations(), Vec::<String>::new());
    }
}

/// A deleted pod's sidecars stop after its app containers, the last
/// first; the app containers stop together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_pod_should_stop_sidecars_after_the_apps_in_reverse_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    put(
        &dir,
        "mesh.yaml",
        &manifest("mesh", "Always", &["first+", "second+"], &["main", "other"]),
    );
    let rt = Arc::new(FakeRuntime::live(1));
    let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
    wait_for("the pod runs", || divergence(&rt, &pipeline.source.all())).await;
    let id = |name: &str| {
        rt.containers()
            .into_iter()
            .find(|c| c.name == name)
            .unwrap()
            .id
    };
    let (first, second, main, other) = (id("first"), id("second"), id("main"), id("other"));
    // `main` is slow to stop: the sidecars wait for it.
    rt.delay_stop(&main, Duration::from_millis(300));
    delete(&dir, "mesh.yaml");
    wait_for("the pod gone", || {
        let left = rt.containers().len() + rt.sandboxes().len();
        (left > 0).then(|| format!("{left} left"))
    })
    .await;
    assert_eq!(rt.stopped(), [other, main, second, first]);
}

/// A pod manifest with one container asking for `cpu`, and `extra` spec
/// lines (indented two spaces).
fn requesting(name: &str, cpu: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n{extra}\
         \x20 containers:\n  - name: main\n    image: busybox:1.36\n    command: [sh, -c]\n    args: [\"run\"]\n\
         \x20   resources: {{requests: {{cpu: \"{cpu}\"}}}}\n"
    )
}

/// A node of one CPU, 1 GiB and room for 10 pods, labelled `disk=ssd`.
fn small_node() -> crate::admission::NodeFacts {
    let map = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    crate::admission::NodeFacts {
        name: NODE.to_string(),
        labels: map(&[("kubernetes.io/hostname", NODE), ("disk", "ssd")]),
        taints: Vec::new(),
        allocatable: [("cpu", 1000), ("memory", 1 << 30), ("pods", 10)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    }
}

/// The published phase, reason and message of pod `default/name`.
fn verdict(store: &StatusStore, name: &str) -> Option<(String, String, String)> {
    let p = published(store, name)?;
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    Some((
        s(&p["status"]["phase"]),
        s(&p["status"]["reason"]),
        s(&p["status"]["message"]),
    ))
}

/// Admission: a pod asking for more cpu than is left, or for labels the
/// node lacks, is never started and shows Failed with kubelet's reason
/// and message, while a pod that fits runs beside them; a refused pod
/// stays refused until its manifest changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_pods_should_never_start_and_show_their_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    put(&dir, "fits.yaml", &requesting("fits", "600m", ""));
    let rt = Arc::new(FakeRuntime::live(1));
    let pipeline = start_with(
        Arc::clone(&rt),
        &dir,
        &root,
        PlegMode::Events,
        Some(small_node()),
    )
    .await;
    wait_for("fits runs", || {
        match published_state(&pipeline.store, "fits", "main") {
            Some((k, _)) if k == "running" => None,
            other => Some(format!("{other:?}")),
        }
    })
    .await;
    // Beside the running 600m, 500m more does not fit in one CPU.
    put(&dir, "big.yaml", &requesting("big", "500m", ""));
    put(
        &dir,
        "picky.yaml",
        &requesting("picky", "1m", "  nodeSelector: {disk: hdd}\n"),
    );
    wait_for("big refused", || {
        let v = verdict(&pipeline.store, "big");
        (v.as_ref().map(|v| (v.0.as_str(), v.1.as_str())) != Some(("Failed", "OutOfcpu")))
            .then(|| format!("{v:?}"))
    })
    .await;
    assert_eq!(
        verdict(&pipeline.store, "big").unwrap().2,
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 500, used: 600, capacity: 1000"
    );
    wait_for("picky refused", || {
        let v = verdict(&pipeline.store, "picky");
        (v.as_ref().map(|v| (v.0.as_str(), v.1.as_str())) != Some(("Failed", "NodeAffinity")))
            .then(|| format!("{v:?}"))
    })
    .await;
    let p = published(&pipeline.store, "big").unwrap();
    assert!(p["status"]["containerStatuses"].is_null(), "{p}");
    // They stay refused: nothing of theirs is ever made.
    tokio::time::sleep(SYNC_PERIOD * 2).await;
    let uid_of = |name: &str| {
        pipeline
            .source
            .all()
            .into_iter()
            .find(|d| d.name == name)
            .unwrap()
            .uid
    };
    let (big, picky) = (uid_of("big"), uid_of("picky"));
    let sandboxes: Vec<String> = rt.sandboxes().into_iter().map(|s| s.uid).collect();
    assert!(
        !sandboxes.contains(&big) && !sandboxes.contains(&picky),
        "{sandboxes:?}"
    );
    assert_eq!(rt.calls("run_podsandbox"), 1);
    assert_eq!(verdict(&pipeline.store, "big").unwrap().1, "OutOfcpu");
    // A changed manifest is a new pod, admitted anew: this one fits.
    put(&dir, "big.yaml", &requesting("big", "400m", ""));
    wait_for("big runs once changed", || {
        match published_state(&pipeline.store, "big", "main") {
            Some((k, _)) if k == "running" => None,
            other => Some(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(verdict(&pipeline.store, "picky").unwrap().1, "NodeAffinity");
    assert_eq!(rt.violations(), Vec::<String>::new());
}

/// Pods that arrive together are admitted oldest first, whichever worker
/// runs first; a pod already running is never admitted again, even on a
/// node that no longer has room for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_should_follow_creation_order_and_spare_running_pods() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    let at = |name: &str, cpu: &str, t: &str| {
        requesting(name, cpu, "").replace(
            &format!("  name: {name}\n"),
            &format!("  name: {name}\n  creationTimestamp: \"{t}\"\n"),
        )
    };
    // Alone, each fits; together only the oldest does.
    put(&dir, "a.yaml", &at("young", "700m", "2024-01-01T00:00:09Z"));
    put(&dir, "b.yaml", &at("old", "700m", "2024-01-01T00:00:01Z"));
    let rt = Arc::new(FakeRuntime::live(1));
    let pipeline = start_with(
        Arc::clone(&rt),
        &dir,
        &root,
        PlegMode::Events,
        Some(small_node()),
    )
    .await;
    wait_for("old runs, young refused", || {
        let old = published_state(&pipeline.store, "old", "main").map(|s| s.0);
        let young = verdict(&pipeline.store, "young").map(|v| v.1);
        (old.as_deref() != Some("running") || young.as_deref() != Some("OutOfcpu"))
            .then(|| format!("old {old:?}, young {young:?}"))
    })
    .await;
    // The node shrinks under the running pod (new facts): it keeps
    // running, since it is never admitted again.
    let mut tiny = small_node();
    tiny.allocatable.insert("cpu".to_string(), 100);
    pipeline.workers.set_node_facts(tiny);
    let uid = pipeline
        .source
        .all()
        .into_iter()
        .find(|d| d.name == "old")
        .unwrap()
        .uid;
    pipeline.queue.add(uid, petrel_controller::Priority::Urgent);
    tokio::time::sleep(SYNC_PERIOD * 2).await;
    assert_eq!(
        published_state(&pipeline.store, "old", "main").map(|s| s.0),
        Some("running".to_string())
    );
    assert_eq!(verdict(&pipeline.store, "old").unwrap().0, "Running");
}

/// API objects that cannot be had until `ready` is set; then a pod's
/// ConfigMap `cfg` holds `v: 1`, and every release is counted.
#[derive(Default)]
struct GatedObjects {
    ready: std::sync::atomic::AtomicBool,
    prepared: std::sync::atomic::AtomicUsize,
    released: std::sync::Mutex<Vec<String>>,
}

impl crate::convert::ObjectView for GatedObjects {
    fn config_map(
        &self,
        _ns: &str,
        _name: &str,
    ) -> crate::convert::Lookup<k8s_openapi::api::core::v1::ConfigMap> {
        crate::convert::Lookup::NotFound
    }
    fn secret(
        &self,
        _ns: &str,
        _name: &str,
    ) -> crate::convert::Lookup<k8s_openapi::api::core::v1::Secret> {
        crate::convert::Lookup::NotFound
    }
    fn token(&self, _uid: &str, _key: &crate::convert::TokenKey) -> Option<String> {
        None
    }
    fn trust_bundles(&self) -> crate::convert::Lookup<Vec<crate::convert::TrustBundle>> {
        crate::convert::Lookup::NotFound
    }
}

#[async_trait::async_trait]
impl super::PodObjects for GatedObjects {
    async fn prepare(&self, _pod: &DesiredPod) -> Result<(), String> {
        self.prepared
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.ready.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err("failed to fetch token for service account \"runner\": forbidden".into())
        }
    }
    fn release(&self, uid: &str) {
        self.released.lock().unwrap().push(uid.to_string());
    }
}

/// A pod whose API objects cannot be had (a token request refused) never
/// gets a sandbox: it waits, saying why, is tried again, and runs once
/// they can be had; when it goes, its objects are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_should_wait_for_its_api_objects_and_release_them_when_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    let rt = Arc::new(FakeRuntime::live(1));
    let objects = Arc::new(GatedObjects::default());
    put(&dir, "p.yaml", &manifest("p", "Always", &[], &["one"]));
    let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
    pipeline.workers.set_objects(objects.clone());
    // (The pod may have started before the objects were set: a fresh one
    // comes after.)
    put(&dir, "q.yaml", &manifest("q", "Always", &[], &["one"]));
    wait_for("q waits, saying why", || {
        let pod = pipeline.store.get("default", "q")?;
        let msg = pod.status.as_ref()?.message.clone().unwrap_or_default();
        (!msg.contains("failed to fetch token")).then(|| format!("message {msg:?}"))
    })
    .await;
    let tried = objects.prepared.load(std::sync::atomic::Ordering::SeqCst);
    wait_for("tried again", || {
        let n = objects.prepared.load(std::sync::atomic::Ordering::SeqCst);
        (n < tried + 2).then(|| format!("{n} preparations"))
    })
    .await;
    let uid = pipeline
        .store
        .get("default", "q")
        .unwrap()
        .metadata
        .uid
        .clone()
        .unwrap();
    let q_sandboxes = rt.sandboxes().iter().filter(|s| s.uid == uid).count();
    assert_eq!(q_sandboxes, 0, "a sandbox was made for a waiting pod");
    objects
        .ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    wait_for("q running", || {
        match published_state(&pipeline.store, "q", "one") {
            Some((k, _)) if k == "running" => None,
            other => Some(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(rt.sandboxes().iter().filter(|s| s.uid == uid).count(), 1);
    delete(&dir, "q.yaml");
    wait_for("q's objects released", || {
        let r = objects.released.lock().unwrap();
        (!r.contains(&uid)).then(|| format!("released {r:?}"))
    })
    .await;
}

/// What a pod cgroup host saw, with what the runtime had at that moment.
#[derive(Default)]
struct OrderHost {
    rt: std::sync::OnceLock<Arc<FakeRuntime>>,
    /// (call, path, sandboxes RunPodSandbox had made, sandboxes left).
    seen: std::sync::Mutex<Vec<(&'static str, String, usize, usize)>>,
}

impl OrderHost {
    fn note(&self, call: &'static str, path: &str) {
        let rt = self.rt.get().unwrap();
        let made = rt.calls("run_pod_sandbox");
        let left = rt.sandboxes().len();
        self.seen
            .lock()
            .unwrap()
            .push((call, path.to_string(), made, left));
    }
}

impl crate::qos_cgroups::CgroupHost for OrderHost {
    fn exists(&self, _path: &str) -> bool {
        false
    }
    fn create(&self, path: &str) -> Result<(), crate::qos_cgroups::HostError> {
        self.note("create", path);
        Ok(())
    }
    fn apply(
        &self,
        _path: &str,
        _config: &crate::qos_cgroups::ResourceConfig,
    ) -> Result<(), crate::qos_cgroups::HostError> {
        Ok(())
    }
    fn remove(&self, path: &str) -> Result<(), crate::qos_cgroups::HostError> {
        self.note("remove", path);
        Ok(())
    }
}

/// The pod's slice (any driver's cgroup) is made before its first
/// sandbox, and removed only once its sandboxes are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cgroup_should_be_made_before_the_sandbox_and_removed_after() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&dir).unwrap();
    let rt = Arc::new(FakeRuntime::live(1));
    let host = Arc::new(OrderHost::default());
    let _ = host.rt.set(Arc::clone(&rt));
    let pipeline = start(Arc::clone(&rt), &dir, &root, PlegMode::Events).await;
    let layout =
        crate::qos_cgroups::CgroupLayout::new(crate::qos_cgroups::CgroupDriver::Systemd, "/")
            .unwrap();
    pipeline
        .workers
        .set_qos_cgroups(Arc::new(crate::qos_cgroups::QosCgroups::new(
            host.clone(),
            layout,
            -1,
            None,
        )));
    put(&dir, "p.yaml", &manifest("p", "Always", &[], &["main"]));
    wait_for("the pod starts", || {
        let desired = pipeline.source.all();
        if desired.is_empty() {
            return Some("not in the source yet".into());
        }
        divergence(&rt, &desired)
    })
    .await;
    let uid = pipeline.source.all()[0].uid.replace('-', "_");
    let slice =
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice");
    delete(&dir, "p.yaml");
    wait_for("the pod's cgroup is removed", || {
        let seen = host.seen.lock().unwrap().clone();
        (!seen.iter().any(|s| s.0 == "remove")).then(|| format!("{seen:?}"))
    })
    .await;
    let seen = host.seen.lock().unwrap().clone();
    let made: Vec<_> = seen.iter().filter(|s| s.0 == "create").collect();
    assert_eq!(made.len(), 1, "{seen:?}");
    assert_eq!(made[0].1, slice);
    assert_eq!(made[0].2, 0, "made before RunPodSandbox: {seen:?}");
    let removed: Vec<_> = seen.iter().filter(|s| s.0 == "remove").collect();
    assert_eq!(removed[0].1, slice);
    assert_eq!(removed[0].3, 0, "removed once no sandbox is left: {seen:?}");
}
