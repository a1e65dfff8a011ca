//! The controller kit's leader election against a real kube-apiserver (the
//! kit's local cluster: etcd + kube-apiserver from the peers):
//! * two Petrel lease candidates: one leads; a graceful release hands over
//!   within 1 s; a crash (the elector's task aborted, no release) within
//!   the lease duration + 1 s; never two leaders;
//! * a client-go candidate (peer `leader-elect`, client-go's own
//!   `leaderelection`) and Petrel candidates on one Lease through repeated
//!   handovers, graceful and crashed: never both leading;
//! * leader-for-life: the lock ConfigMap is owned by the leader's Pod and
//!   deleted on release, when a standby takes over at once; a leader that
//!   crashed keeps the lock until its Pod is deleted, then the real
//!   garbage collector (kube-controller-manager) deletes the lock and a
//!   standby takes over.
//!
//! A missing etcd, kube-apiserver or leader-elect fails these tests unless
//! `PETREL_PEERS_SKIP` leaves it out (then they skip, saying so).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use petrel_controller::leader::{
    pod_ref, Backoff, ForLifeConfig, ForLifeElector, KubeConfigMapLock, KubeLease, LeaderMetrics,
    Leadership, LeaseConfig, LeaseElector,
};
use petrel_testkit::cluster::{self, Cluster};
use petrel_testkit::leader_elect::{self, GoCandidate, GoCandidateOptions, GoEvent};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(500);

fn skip(go: bool) -> bool {
    let why = cluster::left_out().or_else(|| if go { leader_elect::left_out() } else { None });
    if let Some(why) = why {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

fn suffix() -> String {
    petrel_testkit::process::random_suffix().to_lowercase()
}

async fn start_cluster() -> (Cluster, Client) {
    let cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    let kc = kube::config::Kubeconfig::read_from(cluster.admin_kubeconfig()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(cfg).unwrap();
    (cluster, client)
}

/// One term as its worker saw it, in wall-clock time (comparable with the
/// client-go candidate's): from the term's start to its token's
/// cancellation (or now, if still open).
type Terms = Arc<Mutex<Vec<(String, SystemTime, Option<SystemTime>)>>>;

/// A Petrel candidate in this process.
struct Candidate {
    id: String,
    leadership: Leadership,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Candidate {
    fn lease(client: &Client, lease: &str, id: &str, terms: &Terms) -> Self {
        let cfg = LeaseConfig::new(id)
            .timing(LEASE, RENEW, RETRY)
            .backoff(Backoff::fixed(RETRY, 0.2));
        let (e, l) = LeaseElector::new(
            KubeLease::new(client.clone(), NS, lease),
            cfg,
            LeaderMetrics::new(),
        )
        .unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(e.run(stop.clone()));
        Self::follow(id, l, stop, task, terms)
    }

    fn follow(
        id: &str,
        l: Leadership,
        stop: CancellationToken,
        task: JoinHandle<()>,
        terms: &Terms,
    ) -> Self {
        tokio::spawn(record(id.to_owned(), l.clone(), terms.clone()));
        Self {
            id: id.to_owned(),
            leadership: l,
            stop,
            task,
        }
    }

    fn leads(&self) -> bool {
        self.leadership.is_leader()
    }

    /// Graceful shutdown: the elector releases and returns.
    async fn release(mut self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("elector stops")
            .expect("elector joins");
    }

    /// A crash: the elector is gone without releasing.
    fn crash(self) {
        self.task.abort();
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A worker obeying the terms of `l`: logs each term's wall-clock span.
async fn record(id: String, mut l: Leadership, terms: Terms) {
    while let Some(term) = l.leading().await {
        let start = SystemTime::now() - term.since().elapsed();
        let i = {
            let mut t = terms.lock().unwrap();
            t.push((id.clone(), start, None));
            t.len() - 1
        };
        term.lost().await;
        terms.lock().unwrap()[i].2 = Some(SystemTime::now());
    }
}

/// Waits up to `within` for `pred`, polling every 10 ms; the time it took.
async fn wait_for(within: Duration, what: &str, mut pred: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !pred() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t0.elapsed()
}

/// Fails if two spans of different holders overlap.
fn assert_never_both(spans: &[(String, SystemTime, Option<SystemTime>)]) {
    let now = SystemTime::now();
    for (i, (a, s1, e1)) in spans.iter().enumerate() {
        for (b, s2, e2) in &spans[i + 1..] {
            if a == b {
                continue;
            }
            let (e1, e2) = (e1.unwrap_or(now), e2.unwrap_or(now));
            assert!(
                e1 <= *s2 || e2 <= *s1,
                "{a} led {s1:?}..{e1:?} while {b} led {s2:?}..{e2:?}"
            );
        }
    }
}

async fn lease_record(client: &Client, name: &str) -> (String, i32) {
    let l = Api::<Lease>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .unwrap();
    let spec = l.spec.unwrap_or_default();
    (
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or(0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_election_should_hand_over_on_release_within_1s_and_on_crash_within_lease() {
    if skip(false) {
        return;
    }
    let (_cluster, client) = start_cluster().await;
    let lease = format!("petrel-e2e-{}", suffix());
    let terms: Terms = Arc::default();
    let mut a = Candidate::lease(&client, &lease, "a", &terms);
    let mut b = Candidate::lease(&client, &lease, "b", &terms);
    wait_for(Duration::from_secs(20), "a leader", || {
        a.leads() || b.leads()
    })
    .await;
    // Both stay up for a while: exactly one leads throughout.
    let t0 = Instant::now();
    while t0.elapsed() < LEASE {
        assert!(a.leads() ^ b.leads(), "exactly one leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if b.leads() {
        std::mem::swap(&mut a, &mut b);
    }
    let (holder, transitions) = lease_record(&client, &lease).await;
    assert_eq!(holder, a.id);

    // Graceful: a releases; b leads within 1 s.
    let released = Instant::now();
    a.release().await;
    let took = wait_for(Duration::from_secs(1), "b after release", || b.leads()).await;
    eprintln!(
        "handover after release: {:?} (release itself {:?})",
        took,
        released.elapsed() - took
    );
    assert!(
        released.elapsed() <= Duration::from_secs(1),
        "handover took {:?}",
        released.elapsed()
    );
    let (holder, t2) = lease_record(&client, &lease).await;
    assert_eq!(holder, b.id);
    assert_eq!(t2, transitions + 1, "leaseTransitions counts the handover");

    // A new standby; then b crashes: c leads within the lease duration + 1 s,
    // but not before b's lease could have expired.
    let c = Candidate::lease(&client, &lease, "c", &terms);
    tokio::time::sleep(LEASE).await;
    assert!(b.leads() && !c.leads());
    let crashed = Instant::now();
    b.crash();
    let took = wait_for(LEASE + Duration::from_secs(1), "c after crash", || {
        c.leads()
    })
    .await;
    eprintln!("handover after crash: {took:?}");
    assert!(
        took >= LEASE - RETRY - Duration::from_millis(300),
        "c took over after only {took:?}"
    );
    assert!(crashed.elapsed() <= LEASE + Duration::from_secs(1));
    let (holder, t3) = lease_record(&client, &lease).await;
    assert_eq!(holder, "c");
    assert_eq!(t3, t2 + 1);
    c.release().await;
    assert_never_both(&terms.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_election_should_never_let_client_go_and_petrel_both_lead() {
    if skip(true) {
        return;
    }
    let (cluster, client) = start_cluster().await;
    let lease = format!("petrel-e2e-{}", suffix());
    let terms: Terms = Arc::default();
    let go_opts = |n: u32| GoCandidateOptions {
        kubeconfig: cluster.admin_kubeconfig().to_path_buf(),
        namespace: NS.into(),
        name: lease.clone(),
        identity: format!("go-{n}"),
        timing: (LEASE, RENEW, RETRY),
        log: cluster.dir().join(format!("leader-elect-{n}.log")),
    };
    let mut gos: Vec<GoCandidate> = Vec::new();
    let mut go = GoCandidate::start(&go_opts(0)).unwrap_or_else(|e| panic!("{e}"));
    let mut petrel = Candidate::lease(&client, &lease, "petrel-0", &terms);
    wait_for(Duration::from_secs(20), "a leader", || {
        go.is_leading() || petrel.leads()
    })
    .await;
    // client-go polls at its retry period with jitter (up to 2.2 x).
    let go_takes = RETRY * 3;
    for round in 1..=6u32 {
        let crash = round % 3 == 0;
        let bound = if crash {
            LEASE + go_takes + Duration::from_secs(1)
        } else {
            go_takes + Duration::from_secs(1)
        };
        if go.is_leading() {
            assert!(!petrel.leads(), "round {round}: both lead");
            let t0 = Instant::now();
            if crash {
                go.kill();
            } else {
                assert!(
                    go.terminate(Duration::from_secs(10)),
                    "round {round}: leader-elect exits on SIGTERM"
                );
            }
            wait_for(bound, "petrel after client-go", || petrel.leads()).await;
            eprintln!(
                "round {round}: client-go → petrel ({}) in {:?}",
                if crash { "crash" } else { "release" },
                t0.elapsed()
            );
            gos.push(std::mem::replace(
                &mut go,
                GoCandidate::start(&go_opts(round)).unwrap_or_else(|e| panic!("{e}")),
            ));
        } else {
            assert!(petrel.leads(), "round {round}: someone leads");
            let t0 = Instant::now();
            if crash {
                petrel.crash();
            } else {
                petrel.release().await;
            }
            wait_for(bound, "client-go after petrel", || go.is_leading()).await;
            // The next Petrel standby joins once client-go leads.
            petrel = Candidate::lease(&client, &lease, &format!("petrel-{round}"), &terms);
            eprintln!(
                "round {round}: petrel → client-go ({}) in {:?}",
                if crash { "crash" } else { "release" },
                t0.elapsed()
            );
        }
        // Let the standby settle before the next handover.
        tokio::time::sleep(RETRY * 2).await;
    }
    petrel.release().await;
    go.terminate(Duration::from_secs(10));
    gos.push(go);
    // Every span, Petrel's and client-go's, on one wall clock.
    let mut spans = terms.lock().unwrap().clone();
    for (n, g) in gos.iter().enumerate() {
        let mut open = None;
        for (ev, at) in g.events() {
            match ev {
                GoEvent::Lead => open = Some(at),
                GoEvent::Stop => {
                    if let Some(s) = open.take() {
                        spans.push((format!("go-{n}"), s, Some(at)));
                    }
                }
            }
        }
        if let Some(s) = open {
            // Killed while leading: it led until it was reaped at most.
            spans.push((
                format!("go-{n}"),
                s,
                Some(g.exited().expect("every candidate was stopped")),
            ));
        }
    }
    let go_terms = spans.iter().filter(|s| s.0.starts_with("go-")).count();
    let petrel_terms = spans.len() - go_terms;
    assert!(
        go_terms >= 3 && petrel_terms >= 3,
        "{go_terms} client-go and {petrel_terms} Petrel terms"
    );
    assert_never_both(&spans);
}

/// Two leader-for-life candidates on `lock`, each owned by its own new Pod
/// of `names`, retrying every `backoff_secs`: the first leads (waited for),
/// the second is its standby.
async fn for_life_pair(
    client: &Client,
    lock: &str,
    names: [&str; 2],
    backoff_secs: u64,
    terms: &Terms,
) -> Vec<Candidate> {
    let mut cands = Vec::new();
    for name in names {
        make_pod(client, name).await;
        let owner = pod_ref(client.clone(), NS, name).await.unwrap();
        let backoff = Backoff::fixed(Duration::from_secs(backoff_secs), 0.0);
        let (e, l) = ForLifeElector::new(
            KubeConfigMapLock::new(client.clone(), NS, lock),
            ForLifeConfig::new(owner).backoff(backoff),
            LeaderMetrics::new(),
        )
        .unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(e.run(stop.clone()));
        cands.push(Candidate::follow(name, l, stop, task, terms));
        if cands.len() == 1 {
            let first = format!("{name} leads");
            wait_for(Duration::from_secs(10), &first, || cands[0].leads()).await;
        }
    }
    cands
}

async fn make_pod(client: &Client, name: &str) {
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "default" }, "automountServiceAccountToken": false
    }))
    .unwrap();
    match Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &sa)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_already_exists() => {}
        Err(e) => panic!("create service account: {e}"),
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{ "name": "c", "image": "busybox" }]
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_for_life_should_own_configmap_by_pod_and_delete_it_on_release() {
    if skip(false) {
        return;
    }
    let (_cluster, client) = start_cluster().await;
    let lock = format!("petrel-lock-{}", suffix());
    let terms: Terms = Arc::default();
    // A long backoff: only the watch on the lock explains a takeover
    // within 1 s.
    let mut cands = for_life_pair(&client, &lock, ["pod-a", "pod-b"], 30, &terms).await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), NS);
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    let owner_of = |cm: &ConfigMap| {
        let o = &cm
            .metadata
            .owner_references
            .as_ref()
            .expect("owner references")[0];
        (o.kind.clone(), o.name.clone(), o.uid.clone())
    };
    let cm = cms.get(&lock).await.unwrap();
    let pod_a = pods.get("pod-a").await.unwrap();
    assert_eq!(
        owner_of(&cm),
        (
            "Pod".into(),
            "pod-a".into(),
            pod_a.metadata.uid.clone().unwrap()
        )
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!cands[1].leads(), "the lock is held for life");

    let b = cands.pop().unwrap();
    let a = cands.pop().unwrap();
    let released = Instant::now();
    a.release().await;
    wait_for(Duration::from_secs(1), "pod-b after release", || b.leads()).await;
    assert!(
        released.elapsed() <= Duration::from_secs(1),
        "took {:?}",
        released.elapsed()
    );
    let cm = cms.get(&lock).await.unwrap();
    assert_eq!(owner_of(&cm).1, "pod-b");
    b.release().await;
    assert!(
        cms.get_opt(&lock).await.unwrap().is_none(),
        "released lock deleted"
    );
    assert_never_both(&terms.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_for_life_should_be_released_by_garbage_collection_when_its_pod_goes() {
    if skip(false) {
        return;
    }
    let (cluster, client) = start_cluster().await;
    let _cluster = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        cluster
            .start_controller_manager(&["garbagecollector"])
            .map(|()| cluster)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{e}"));
    let lock = format!("petrel-gc-lock-{}", suffix());
    let terms: Terms = Arc::default();
    // A long backoff: only the watch on the lock explains a takeover.
    let mut cands = for_life_pair(&client, &lock, ["gc-pod-a", "gc-pod-b"], 300, &terms).await;
    let b = cands.pop().unwrap();
    let a = cands.pop().unwrap();
    // A crash: no release, so the lock outlives the process...
    a.crash();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b.leads(), "a crashed leader-for-life keeps its lock");
    let cms = Api::<ConfigMap>::namespaced(client.clone(), NS);
    assert!(cms.get_opt(&lock).await.unwrap().is_some());
    // ...until its Pod is gone: the garbage collector deletes the lock.
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete("gc-pod-a", &DeleteParams::background().grace_period(0))
        .await
        .unwrap();
    let took = wait_for(Duration::from_secs(60), "gc-pod-b leads after GC", || {
        b.leads()
    })
    .await;
    eprintln!("gc-pod-b led {took:?} after gc-pod-a's Pod was deleted");
    let cm = cms.get(&lock).await.unwrap();
    let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.name, "gc-pod-b");
    b.release().await;
    assert_never_both(&terms.lock().unwrap());
}
