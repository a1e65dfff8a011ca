//! The controller kit's reference (issue 30): `podset-controller`, the
//! PodSet sample controller written with controller-runtime and built by
//! `make peers`, against a real kube-apiserver. The benchmark compares
//! Petrel's kit with it, so it must do the same work: keep a PodSet's Pods,
//! write its status, stamp its reconciles on stdout, and hand leadership
//! over on a Lease when its leader stops.
//!
//! A missing etcd, kube-apiserver, kubectl or podset-controller fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_testkit::cluster::Cluster;
use petrel_testkit::peers::peer_binary;
use petrel_testkit::podset::{self, Controller, Event};

const NS: &str = "default";

fn controller(cluster: &Cluster, name: &str, lease: &str) -> Controller {
    let bin = peer_binary("podset-controller").unwrap_or_else(|e| panic!("{e}"));
    let args: Vec<String> = [
        "--kubeconfig",
        &cluster.admin_kubeconfig().display().to_string(),
        "--leader-elect",
        "--leader-election-id",
        lease,
        "--leader-election-namespace",
        NS,
        "--lease-duration",
        "4s",
        "--renew-deadline",
        "3s",
        "--retry-period",
        "250ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = cluster.dir().join(format!("{name}.log"));
    Controller::start(&bin, &args, &log).unwrap_or_else(|e| panic!("{e}"))
}

fn pods_of(kc: &petrel_testkit::kubectl::Kubectl, set: &str) -> Vec<serde_json::Value> {
    let sel = format!("{}={set}", podset::POD_LABEL);
    let list = kc.get_json(&["pods", "-n", NS, "-l", &sel]).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn podset_controller_should_keep_pods_write_status_and_hand_over_its_lease() {
    let cluster = Cluster::start().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.apply(podset::CRD).unwrap();
    kc.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/podsets.bench.petrel.dev",
    ])
    .unwrap();
    // No controller-manager runs: Pod admission wants the ServiceAccount.
    kc.ok(&["create", "serviceaccount", "default", "-n", NS])
        .unwrap();

    let mut a = controller(&cluster, "a", "podset-ref");
    a.wait_for(Duration::from_secs(60), "a leads", |e| {
        matches!(e, Event::Leading(_))
    })
    .unwrap();

    // A user change is reconciled and reported with its stamp.
    let stamp = podset::unix_nanos();
    kc.apply(&podset::manifest(NS, "web", 2, stamp)).unwrap();
    let seen = a
        .wait_for(
            Duration::from_secs(30),
            "web reconciled",
            |e| matches!(e, Event::Reconciled { changed_at, .. } if *changed_at == stamp),
        )
        .unwrap();
    let Event::Reconciled { key, at, .. } = seen else {
        unreachable!()
    };
    assert_eq!(key, format!("{NS}/web"));
    assert!(at >= stamp, "reconciled before the change: {at} < {stamp}");
    wait_until("2 pods owned by web", Duration::from_secs(30), || {
        let pods = pods_of(&kc, "web");
        pods.len() == 2
            && pods.iter().all(|p| {
                p["metadata"]["ownerReferences"][0]["kind"] == "PodSet"
                    && p["metadata"]["ownerReferences"][0]["name"] == "web"
            })
    });
    wait_until("status observed", Duration::from_secs(30), || {
        let ps = kc.get_json(&["podsets.bench.petrel.dev", "web", "-n", NS]);
        ps.is_ok_and(|ps| {
            ps["status"]["replicas"] == 2
                && ps["status"]["observedGeneration"] == ps["metadata"]["generation"]
        })
    });

    // A standby does not lead while the leader renews.
    let mut b = controller(&cluster, "b", "podset-ref");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !b.drain().iter().any(|e| matches!(e, Event::Leading(_))),
        "two leaders"
    );

    // SIGTERM: the leader gives its Lease up and the standby takes over.
    let t_term = podset::unix_nanos();
    assert!(a.terminate(Duration::from_secs(10)), "a did not exit");
    let took = b
        .wait_for(Duration::from_secs(10), "b leads", |e| {
            matches!(e, Event::Leading(_))
        })
        .unwrap();
    let Event::Leading(t) = took else {
        unreachable!()
    };
    eprintln!(
        "controller-runtime handover after SIGTERM: {:.3} s",
        (t - t_term) as f64 / 1e9
    );

    // The new leader reconciles the next change: scaled to 0.
    let stamp = podset::unix_nanos();
    kc.apply(&podset::manifest(NS, "web", 0, stamp)).unwrap();
    b.wait_for(
        Duration::from_secs(30),
        "web scaled down",
        |e| matches!(e, Event::Reconciled { changed_at, .. } if *changed_at == stamp),
    )
    .unwrap();
    wait_until("no pods left", Duration::from_secs(30), || {
        pods_of(&kc, "web").is_empty()
    });
}
