//! The real kubelet (from the peers, `make peers`) drives Petrel's runtime:
//! standalone with static pods, and joined to a local cluster (etcd +
//! kube-apiserver from the test kit) where kubectl creates, reads logs of,
//! execs in, port-forwards to and deletes a pod. Each with kubelet's
//! generic PLEG and with `EventedPLEG=true` (kubelet subscribes to
//! Petrel's GetContainerEvents). Throughout, a census of Petrel's
//! containers checks that kubelet never has two containers for one (pod,
//! container, attempt), nor two running at once for one (pod, container)
//! — the duplicate containers of upstream kubelet bug #123087 (static pods
//! under evented PLEG).
//!
//! A missing kubelet, etcd, kube-apiserver or kubectl fails these tests
//! unless `PETREL_PEERS_SKIP` leaves it out (then they skip, saying so).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_testkit::cluster::{self, node_name, Cluster};
use petrel_testkit::kubectl::PortForward;
use petrel_testkit::kubelet::{self, metric_value, Kubelet, KubeletOptions};
use petrel_testkit::prelude::*;

const POD_UID: &str = "io.kubernetes.pod.uid";
const POD_NAME: &str = "io.kubernetes.pod.name";
const CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// Restarts of a crashed container come at most this long after its exit.
const MAX_RESTART_PERIOD: Duration = Duration::from_secs(1);
/// How many restarts of the crashing container each test waits for.
const RESTARTS: u32 = 3;

fn skip(needs_cluster: bool) -> bool {
    let why = kubelet::left_out().or_else(|| {
        if needs_cluster {
            cluster::left_out()
        } else {
            None
        }
    });
    if let Some(why) = why {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

fn endpoint(node: &Node) -> String {
    format!("unix://{}", node.socket.display())
}

/// A pod manifest: busybox containers `(name, script)`, pulled never (the
/// image is imported), stopped within a second.
fn pod_yaml(name: &str, extra_spec: &str, containers: &[(&str, &str)]) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n\
         spec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 1\n{extra_spec}  containers:\n"
    );
    for (c, script) in containers {
        y.push_str(&format!(
            "  - name: {c}\n    image: {BUSYBOX}\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", {script:?}]\n"
        ));
    }
    y
}

/// Exits after a second, forever.
const CRASH: &str = "echo attempt; sleep 1; exit 3";
/// Runs until told to stop (busybox sh as PID 1 ignores an untrapped TERM).
const STEADY: &str = "trap 'exit 0' TERM; echo steady; while true; do sleep 1; done";

/// What Petrel held over a test, sampled every 100 ms.
#[derive(Default)]
struct Census {
    /// (pod uid, container name, attempt) -> every container id seen.
    ids: BTreeMap<(String, String, u32), BTreeSet<String>>,
    /// (pod uid, container name) -> the most seen running at once.
    running: BTreeMap<(String, String), usize>,
    /// pod uid -> the most sandboxes seen ready at once.
    ready_sandboxes: BTreeMap<String, usize>,
    /// pod uid -> pod name.
    names: BTreeMap<String, String>,
    samples: usize,
}

impl Census {
    fn record(&mut self, containers: &[api::Container], sandboxes: &[api::PodSandbox]) {
        self.samples += 1;
        let mut running: BTreeMap<(String, String), usize> = BTreeMap::new();
        for c in containers {
            let (Some(uid), Some(m)) = (c.labels.get(POD_UID), c.metadata.as_ref()) else {
                continue;
            };
            if let Some(n) = c.labels.get(POD_NAME) {
                self.names.insert(uid.clone(), n.clone());
            }
            self.ids
                .entry((uid.clone(), m.name.clone(), m.attempt))
                .or_default()
                .insert(c.id.clone());
            if c.state == api::ContainerState::ContainerRunning as i32 {
                *running.entry((uid.clone(), m.name.clone())).or_default() += 1;
            }
        }
        for (k, n) in running {
            let e = self.running.entry(k).or_default();
            *e = (*e).max(n);
        }
        let mut ready: BTreeMap<String, usize> = BTreeMap::new();
        for s in sandboxes {
            if s.state == api::PodSandboxState::SandboxReady as i32 {
                if let Some(m) = &s.metadata {
                    *ready.entry(m.uid.clone()).or_default() += 1;
                }
            }
        }
        for (k, n) in ready {
            let e = self.ready_sandboxes.entry(k).or_default();
            *e = (*e).max(n);
        }
    }

    fn name<'a>(&'a self, uid: &'a str) -> &'a str {
        self.names.get(uid).map(String::as_str).unwrap_or(uid)
    }

    /// Everything that should not have been: duplicates of any kind.
    fn duplicates(&self) -> Vec<String> {
        let mut out = Vec::new();
        for ((uid, c, attempt), ids) in &self.ids {
            if ids.len() > 1 {
                out.push(format!(
                    "pod {} container {c} attempt {attempt}: {} containers {ids:?}",
                    self.name(uid),
                    ids.len()
                ));
            }
        }
        for ((uid, c), n) in &self.running {
            if *n > 1 {
                out.push(format!(
                    "pod {} container {c}: {n} running at once",
                    self.name(uid)
                ));
            }
        }
        for (uid, n) in &self.ready_sandboxes {
            if *n > 1 {
                out.push(format!(
                    "pod {}: {n} ready sandboxes at once",
                    self.name(uid)
                ));
            }
        }
        out
    }

    /// The highest attempt of container `c` in the pod named `pod`.
    fn max_attempt(&self, pod: &str, c: &str) -> Option<u32> {
        self.ids
            .keys()
            .filter(|(uid, name, _)| self.name(uid) == pod && name == c)
            .map(|(_, _, a)| *a)
            .max()
    }
}

/// Samples Petrel's containers and sandboxes every 100 ms until dropped.
struct Watch {
    census: Arc<Mutex<Census>>,
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Watch {
    fn start(c: &Clients) -> Watch {
        let census = Arc::new(Mutex::new(Census::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (mut rt, census2, stop2) = (c.rt.clone(), census.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !stop2.load(Ordering::Relaxed) {
                let cs = rt
                    .list_containers(api::ListContainersRequest::default())
                    .await
                    .map(|r| r.into_inner().containers);
                let ss = rt
                    .list_pod_sandbox(api::ListPodSandboxRequest::default())
                    .await
                    .map(|r| r.into_inner().items);
                if let (Ok(cs), Ok(ss)) = (cs, ss) {
                    census2.lock().unwrap().record(&cs, &ss);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Watch {
            census,
            stop,
            task: Some(task),
        }
    }

    fn max_attempt(&self, pod: &str, c: &str) -> Option<u32> {
        self.census.lock().unwrap().max_attempt(pod, c)
    }

    /// Stops sampling and asserts that nothing was duplicated.
    async fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        let c = self.census.lock().unwrap();
        let dups = c.duplicates();
        assert!(dups.is_empty(), "duplicates in Petrel: {dups:#?}");
        c.samples
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Petrel's containers whose label `key` is `value`.
async fn containers_labelled(c: &mut Clients, key: &str, value: &str) -> Vec<api::Container> {
    c.rt.list_containers(api::ListContainersRequest {
        filter: Some(api::ContainerFilter {
            label_selector: [(key.to_string(), value.to_string())].into(),
            ..Default::default()
        }),
    })
    .await
    .unwrap()
    .into_inner()
    .containers
}

/// Petrel's sandboxes of the pod named `pod`.
async fn sandboxes_of(c: &mut Clients, pod: &str) -> Vec<api::PodSandbox> {
    c.rt.list_pod_sandbox(api::ListPodSandboxRequest {
        filter: Some(api::PodSandboxFilter {
            label_selector: [(POD_NAME.to_string(), pod.to_string())].into(),
            ..Default::default()
        }),
    })
    .await
    .unwrap()
    .into_inner()
    .items
}

/// Waits up to `within` for `f` to give Some, checking every 200 ms.
async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until Petrel runs container `c` of pod `pod` (kubelet's labels).
async fn wait_running(cl: &mut Clients, pod: &str, c: &str, within: Duration) -> api::Container {
    wait_for(&format!("{pod}/{c} running in Petrel"), within, || {
        let mut cl = cl.clone();
        async move {
            containers_labelled(&mut cl, POD_NAME, pod)
                .await
                .into_iter()
                .find(|x| {
                    x.labels.get(CONTAINER_NAME).map(String::as_str) == Some(c)
                        && x.state == api::ContainerState::ContainerRunning as i32
                })
        }
    })
    .await
}

/// Waits until container `c` of pod `pod` was restarted `n` times.
async fn wait_restarts(w: &Watch, pod: &str, c: &str, n: u32, within: Duration) {
    wait_for(
        &format!("{pod}/{c} restarted {n} times"),
        within,
        || async { w.max_attempt(pod, c).filter(|a| *a >= n) },
    )
    .await;
}

/// Checks what kubelet's metrics (`m`) say about the PLEG it used; returns
/// the events kubelet received from Petrel's stream (evented) or 0.
async fn check_pleg_mode(m: &str, c: &mut Clients, evented: bool) -> f64 {
    let conns = metric_value(m, "kubelet_evented_pleg_connection_success_count").unwrap_or(0.0);
    let errors = metric_value(m, "kubelet_evented_pleg_connection_error_count").unwrap_or(0.0);
    let events =
        metric_value(m, "kubelet_evented_pleg_connection_latency_seconds_count").unwrap_or(0.0);
    let petrel = c.metrics().await;
    let subscribers = metric_value(&petrel, "petrel_runtime_event_subscribers").unwrap_or(0.0);
    if evented {
        assert!(
            conns >= 1.0,
            "kubelet never connected to GetContainerEvents:\n{m}"
        );
        assert_eq!(errors, 0.0, "kubelet's event stream failed");
        assert!(events >= 1.0, "kubelet received no event from Petrel");
        assert!(subscribers >= 1.0, "Petrel has no event subscriber");
    } else {
        assert_eq!(conns, 0.0, "generic PLEG subscribed to events");
        assert_eq!(subscribers, 0.0, "someone subscribed to Petrel's events");
    }
    events
}

/// Prints the CRI calls kubelet made that Petrel refused, by operation,
/// and kubelet's distinct error lines (for the reader of a test run).
async fn report_errors(c: &mut Clients, node: &Node, k: &Kubelet) {
    let m = c.metrics().await;
    let errors: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("petrel_runtime_operations_errors_total{"))
        .collect();
    eprintln!("runtime errors by operation: {errors:#?}");
    let runtime_log = node.log();
    let failed: BTreeSet<String> = runtime_log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        // Without the timestamp, so that repeats fold.
        .map(|l| {
            let rest = l.split_once(' ').map_or(l, |(_, r)| r.trim_start());
            rest.chars().take(300).collect()
        })
        .collect();
    eprintln!("runtime warnings and errors: {failed:#?}");
    // A CreateContainer for a (pod, container, attempt) that exists already:
    // kubelet asked for a duplicate, Petrel's name reservation refused it.
    let refused = runtime_log
        .lines()
        .filter(|l| l.contains("op=\"CreateContainer\"") && l.contains("is reserved by"))
        .count();
    eprintln!("duplicate CreateContainer calls refused by Petrel: {refused}");
    // klog: "E1127 15:46:42.988304   20537 file.go:498] message"
    let kubelet_errors: BTreeSet<String> = k
        .log()
        .lines()
        .filter(|l| l.starts_with('E'))
        .filter_map(|l| {
            l.split_once("] ")
                .map(|(_, m)| m.chars().take(300).collect())
        })
        .collect();
    eprintln!("kubelet errors: {kubelet_errors:#?}");
}

async fn standalone(evented: bool) {
    if skip(false) {
        return;
    }
    let t0 = Instant::now();
    let node = Node::start_with_busybox().await;
    let mut c = node.clients().await;
    let name = node_name(if evented { "sa-ev" } else { "sa-gen" });
    let k = Kubelet::start(
        KubeletOptions::standalone(&name, &endpoint(&node))
            .evented_pleg(evented)
            .max_restart_period(MAX_RESTART_PERIOD),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("kubelet healthy after {:?}", t0.elapsed());
    let watch = Watch::start(&c);

    k.write_manifest("steady", &pod_yaml("steady", "", &[("main", STEADY)]))
        .unwrap();
    k.write_manifest("crasher", &pod_yaml("crasher", "", &[("crash", CRASH)]))
        .unwrap();
    // Static pods are named <manifest name>-<node name>.
    let steady = format!("steady-{name}");
    let crasher = format!("crasher-{name}");

    let main = wait_running(&mut c, &steady, "main", Duration::from_secs(60)).await;
    assert_eq!(
        main.labels.get("io.kubernetes.pod.namespace").unwrap(),
        "default"
    );
    eprintln!("static pod running after {:?}", t0.elapsed());
    wait_restarts(&watch, &crasher, "crash", RESTARTS, Duration::from_secs(60)).await;
    eprintln!("{RESTARTS} restarts after {:?}", t0.elapsed());

    // kubelet's own view (read-only port) says Running, with the restarts.
    let pods = wait_for(
        "kubelet's /pods shows both pods running",
        Duration::from_secs(30),
        || {
            let pods = k.pods().unwrap();
            let find = |n: &str| {
                pods["items"]
                    .as_array()
                    .and_then(|a| a.iter().find(|p| p["metadata"]["name"] == n))
                    .cloned()
            };
            let (s, cr) = (find(&steady), find(&crasher));
            let ok = s.as_ref().is_some_and(|s| {
                s["status"]["phase"] == "Running"
                    && !s["status"]["containerStatuses"][0]["state"]["running"].is_null()
            }) && cr.as_ref().is_some_and(|c| {
                c["status"]["phase"] == "Running"
                    && c["status"]["containerStatuses"][0]["restartCount"]
                        .as_u64()
                        .is_some_and(|n| n >= 2)
            });
            async move { ok.then_some((s, cr)) }
        },
    )
    .await;
    assert_eq!(
        pods.0.unwrap()["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .unwrap(),
        format!("petrel://{}", main.id),
        "kubelet names Petrel's container"
    );
    let events = check_pleg_mode(&k.metrics().unwrap(), &mut c, evented).await;

    // Removing the manifests stops the pods; kubelet's garbage collection
    // (every minute, from its start) removes their containers and sandboxes.
    k.remove_manifest("steady").unwrap();
    k.remove_manifest("crasher").unwrap();
    for pod in [&steady, &crasher] {
        wait_for(&format!("{pod} stopped"), Duration::from_secs(60), || {
            let mut c = c.clone();
            async move {
                let running = containers_labelled(&mut c, POD_NAME, pod)
                    .await
                    .iter()
                    .any(|x| x.state == api::ContainerState::ContainerRunning as i32);
                let ready = sandboxes_of(&mut c, pod)
                    .await
                    .iter()
                    .any(|s| s.state == api::PodSandboxState::SandboxReady as i32);
                (!running && !ready).then_some(())
            }
        })
        .await;
    }
    eprintln!("pods stopped after {:?}", t0.elapsed());
    for pod in [&steady, &crasher] {
        wait_for(&format!("{pod} removed"), Duration::from_secs(90), || {
            let mut c = c.clone();
            async move {
                let gone = containers_labelled(&mut c, POD_NAME, pod).await.is_empty()
                    && sandboxes_of(&mut c, pod).await.is_empty();
                gone.then_some(())
            }
        })
        .await;
    }
    eprintln!("pods removed after {:?}", t0.elapsed());
    let samples = watch.finish().await;
    eprintln!(
        "standalone evented={evented}: {samples} samples, no duplicates, {events} events; done after {:?}",
        t0.elapsed()
    );
    report_errors(&mut c, &node, &k).await;
    let (cgroup_root, root_dir) = (k.cgroup_root().to_string(), k.root_dir().to_path_buf());
    drop(k);
    assert!(!kubelet::cgroup_exists(&cgroup_root), "{cgroup_root} left");
    assert!(
        mounts_under(&root_dir).is_empty(),
        "mounts left under {}",
        root_dir.display()
    );
    assert!(!root_dir.exists(), "{} left", root_dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_standalone_should_run_static_pods_on_petrel_with_generic_pleg() {
    standalone(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_standalone_should_run_static_pods_on_petrel_with_evented_pleg() {
    standalone(true).await;
}

async fn joined(evented: bool) {
    if skip(true) {
        return;
    }
    let t0 = Instant::now();
    // The cluster starts while the runtime does.
    let cluster = std::thread::spawn(Cluster::start);
    let node = Node::start_with_busybox().await;
    let mut c = node.clients().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cluster ready after {:?}", t0.elapsed());
    let name = node_name(if evented { "j-ev" } else { "j-gen" });
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let k = Kubelet::start(
        KubeletOptions::joined(creds, &endpoint(&node))
            .evented_pleg(evented)
            .max_restart_period(MAX_RESTART_PERIOD),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let watch = Watch::start(&c);
    let kc = cluster.kubectl().unwrap();

    // The node registers and reports Ready.
    wait_for(
        &format!("node {name} Ready"),
        Duration::from_secs(90),
        || {
            let ready = kc.get_json(&["node", &name]).ok().is_some_and(|n| {
                n["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            });
            async move { ready.then_some(()) }
        },
    )
    .await;
    eprintln!("node Ready after {:?}", t0.elapsed());

    // A static pod shows as a mirror pod; its crashing container restarts.
    k.write_manifest(
        "static",
        &pod_yaml("static", "", &[("main", STEADY), ("crash", CRASH)]),
    )
    .unwrap();
    // No controller-manager runs: the ServiceAccount admission plugin wants
    // the `default` ServiceAccount to exist, and no token could be mounted.
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let script = "echo hello from petrel; mkdir -p /www; echo pf-ok > /www/index.html; \
                  exec httpd -f -p 8080 -h /www";
    kc.apply(&pod_yaml(
        "web",
        &format!("  nodeName: {name}\n  automountServiceAccountToken: false\n"),
        &[("web", script), ("crash", CRASH)],
    ))
    .unwrap();
    wait_for("pod web Running", Duration::from_secs(90), || {
        let running = kc.get_json(&["pod", "web"]).ok().is_some_and(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["name"] == "web" && c["ready"] == true))
        });
        async move { running.then_some(()) }
    })
    .await;
    eprintln!("pod web Running after {:?}", t0.elapsed());
    let web = wait_running(&mut c, "web", "web", Duration::from_secs(10)).await;
    let uid = kc
        .ok(&["get", "pod", "web", "-o", "jsonpath={.metadata.uid}"])
        .unwrap();
    assert_eq!(
        web.labels.get(POD_UID),
        Some(&uid),
        "Petrel runs the API's pod"
    );

    // logs, exec (with stdin), port-forward: API server -> kubelet ->
    // Petrel's streaming server.
    let logs = kc.ok(&["logs", "web", "-c", "web"]).unwrap();
    assert!(logs.contains("hello from petrel"), "{logs:?}");
    let out = kc
        .ok(&[
            "exec",
            "web",
            "-c",
            "web",
            "--",
            "sh",
            "-c",
            "echo exec-$((6*7)); hostname",
        ])
        .unwrap();
    assert_eq!(out, "exec-42\nweb\n");
    let out = kc
        .ok_with(
            &["exec", "-i", "web", "-c", "web", "--", "cat"],
            Some(b"through stdin\n"),
        )
        .unwrap();
    assert_eq!(out, "through stdin\n");
    let failed = kc
        .run_with(
            &["exec", "web", "-c", "web", "--", "sh", "-c", "exit 7"],
            None,
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(failed.status.code(), Some(7), "{failed:?}");
    {
        let (_pf, local) = PortForward::start(&kc, "web", 8080).unwrap();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], local));
        let r = petrel_testkit::http::get(addr, "/", Duration::from_secs(20)).unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "pf-ok\n"));
    }
    eprintln!("logs, exec, port-forward done after {:?}", t0.elapsed());

    // Restarts, seen by kubelet and reported to the API.
    let mirror = format!("static-{name}");
    wait_restarts(&watch, &mirror, "crash", RESTARTS, Duration::from_secs(60)).await;
    wait_restarts(&watch, "web", "crash", RESTARTS, Duration::from_secs(60)).await;
    wait_for(
        "restarts reported to the API",
        Duration::from_secs(60),
        || {
            let counts: Vec<u64> = [mirror.as_str(), "web"]
                .iter()
                .filter_map(|p| {
                    kc.ok(&[
                        "get",
                        "pod",
                        p,
                        "-o",
                        "jsonpath={.status.containerStatuses[?(@.name==\"crash\")].restartCount}",
                    ])
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                })
                .collect();
            let ok = counts.len() == 2 && counts.iter().all(|n| *n >= 2);
            async move { ok.then_some(()) }
        },
    )
    .await;
    // The read-only port is off on a joined kubelet: its metrics come
    // through the API server's node proxy (kubelet authorizes the API
    // server by webhook).
    let metrics = kc
        .ok(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{name}/proxy/metrics"),
        ])
        .unwrap();
    let events = check_pleg_mode(&metrics, &mut c, evented).await;
    eprintln!("restarts after {:?}", t0.elapsed());

    // Deleting the pod ends it: its containers stop at once and are
    // removed from Petrel. (With EventedPLEG kubelet sees them die before
    // its pod worker has finished the pod, keeps them, and its container
    // garbage collection, every minute, removes them.)
    kc.ok(&["delete", "pod", "web", "--wait=true", "--timeout=60s"])
        .unwrap();
    wait_for("web stopped in Petrel", Duration::from_secs(30), || {
        let mut c = c.clone();
        let uid = uid.clone();
        async move {
            let running = containers_labelled(&mut c, POD_UID, &uid)
                .await
                .iter()
                .any(|x| x.state == api::ContainerState::ContainerRunning as i32);
            let ready = sandboxes_of(&mut c, "web")
                .await
                .iter()
                .any(|s| s.state == api::PodSandboxState::SandboxReady as i32);
            (!running && !ready).then_some(())
        }
    })
    .await;
    eprintln!("web stopped after {:?}", t0.elapsed());
    wait_for(
        "web's containers removed from Petrel",
        Duration::from_secs(90),
        || {
            let mut c = c.clone();
            let uid = uid.clone();
            async move {
                containers_labelled(&mut c, POD_UID, &uid)
                    .await
                    .is_empty()
                    .then_some(())
            }
        },
    )
    .await;
    eprintln!("web's containers removed after {:?}", t0.elapsed());
    let samples = watch.finish().await;
    eprintln!(
        "joined evented={evented}: {samples} samples, no duplicates, {events} events; done after {:?}",
        t0.elapsed()
    );
    report_errors(&mut c, &node, &k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_joined_should_run_kubectl_pods_on_petrel_with_generic_pleg() {
    joined(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_joined_should_run_kubectl_pods_on_petrel_with_evented_pleg() {
    joined(true).await;
}
