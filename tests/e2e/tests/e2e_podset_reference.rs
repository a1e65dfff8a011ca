//! The controller kit's reference (issue 30): `podset-controller`, the
//! PodSet sample controller written with controller-runtime and built by
//! `make peers`, against a real kube-apiserver. The benchmark compares
//! Petrel's kit with it, so it must do the same work: keep a PodSet's Pods,
//! write its status, stamp its reconciles on stdout, and hand leadership
//! over on a Lease when its leader stops. (`e2e_podset` holds Petrel's
//! sample to the same.)
//!
//! A missing etcd, kube-apiserver, kubectl or podset-controller fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use petrel_testkit::cluster::Cluster;
use petrel_testkit::peers::peer_binary;
use petrel_testkit::podset::{self, wait_until, Controller, Event};

const NS: &str = "default";

fn controller(cluster: &Cluster, name: &str, lease: &str) -> Controller {
    let bin = peer_binary("podset-controller").unwrap_or_else(|e| panic!("{e}"));
    let args = podset::args(cluster, NS, Some(lease));
    let log = cluster.dir().join(format!("{name}.log"));
    Controller::start(&bin, &args, &log).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn podset_controller_should_keep_pods_write_status_and_hand_over_its_lease() {
    let cluster = Cluster::start().unwrap_or_else(|e| panic!("{e}"));
    let kc = podset::prepare(&cluster, NS).unwrap_or_else(|e| panic!("{e}"));

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
    wait_until("web has 2 pods and status", Duration::from_secs(30), || {
        podset::converged(&kc, NS, "web", 2)
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
        podset::pods_of(&kc, NS, "web").is_ok_and(|p| p.is_empty())
    });
}
