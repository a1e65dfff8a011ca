//! Petrel's PodSet sample controller (`petrel-podset-controller`,
//! examples/podset-controller) against a real kube-apiserver: the same
//! contract `e2e_podset_reference` holds controller-runtime's to — Pods and
//! status follow a change, the change's reconcile is reported with its
//! stamp, scaling to 0 removes the Pods, a standby does not lead while the
//! leader renews and leads within 1 s of the leader's SIGTERM — plus the
//! kit's readiness gate, client-go's workqueue metrics, a standby leading
//! within the Lease's duration of the leader's kill -9, and a user change
//! served ahead of a restart's 10 000 existing PodSets.
//!
//! A missing etcd, kube-apiserver or kubectl fails; so does a missing
//! controller binary (`cargo build --bins`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use petrel_testkit::bins;
use petrel_testkit::cluster::Cluster;
use petrel_testkit::http;
use petrel_testkit::kubectl::Kubectl;
use petrel_testkit::podset::{self, wait_until, Controller, Event};
use petrel_testkit::process::free_port;

const NS: &str = "default";

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn controller(cluster: &Cluster, name: &str, lease: Option<&str>, extra: &[String]) -> Controller {
    let bin = bins::find("petrel-podset-controller").unwrap_or_else(|e| panic!("{e}"));
    let mut args = podset::args(cluster, NS, lease);
    args.extend_from_slice(extra);
    let log = cluster.dir().join(format!("{name}.log"));
    Controller::start(&bin, &args, &log).unwrap_or_else(|e| panic!("{e}"))
}

/// A standby on `lease` whose `/readyz` answers 200: its caches are synced.
fn ready_standby(cluster: &Cluster, name: &str, lease: Option<&str>) -> Controller {
    let probes = free_port().unwrap();
    let extra = [
        "--health-probe-bind-address".to_string(),
        local(probes).to_string(),
    ];
    let ctl = controller(cluster, name, lease, &extra);
    wait_until(
        &format!("standby {name} ready"),
        Duration::from_secs(60),
        || {
            http::get(local(probes), "/readyz", Duration::from_secs(2))
                .is_ok_and(|r| r.status == 200)
        },
    );
    ctl
}

/// Sets PodSet `web` to `replicas` with a fresh stamp and waits until `ctl`
/// reports reconciling that change.
fn change_web(kc: &Kubectl, ctl: &mut Controller, replicas: u32, what: &str) {
    let stamp = podset::unix_nanos();
    kc.apply(&podset::manifest(NS, "web", replicas, stamp))
        .unwrap();
    ctl.wait_for(
        Duration::from_secs(30),
        what,
        |e| matches!(e, Event::Reconciled { changed_at, .. } if *changed_at == stamp),
    )
    .unwrap();
}

#[test]
fn petrel_podset_controller_should_keep_pods_write_status_and_report_changes() {
    let cluster = Cluster::start().unwrap_or_else(|e| panic!("{e}"));
    let kc = podset::prepare(&cluster, NS).unwrap_or_else(|e| panic!("{e}"));
    let (metrics, probes) = (free_port().unwrap(), free_port().unwrap());
    let extra = [
        "--metrics-bind-address".to_string(),
        local(metrics).to_string(),
        "--health-probe-bind-address".to_string(),
        local(probes).to_string(),
    ];
    let mut ctl = controller(&cluster, "solo", None, &extra);
    ctl.wait_for(Duration::from_secs(60), "leads", |e| {
        matches!(e, Event::Leading(_))
    })
    .unwrap();
    // Ready once the informers have synced.
    wait_until("readyz 200", Duration::from_secs(60), || {
        http::get(local(probes), "/readyz", Duration::from_secs(2)).is_ok_and(|r| r.status == 200)
    });

    // A user change is reconciled and reported with its stamp.
    let stamp = podset::unix_nanos();
    kc.apply(&podset::manifest(NS, "web", 2, stamp)).unwrap();
    let seen = ctl
        .wait_for(
            Duration::from_secs(30),
            "web reconciled",
            |e| matches!(e, Event::Reconciled { changed_at, .. } if *changed_at == stamp),
        )
        .unwrap();
    let Event::Reconciled {
        key,
        at,
        generation,
        ..
    } = seen
    else {
        unreachable!()
    };
    assert_eq!(key, format!("{NS}/web"));
    assert_eq!(generation, 1);
    assert!(at >= stamp, "reconciled before the change: {at} < {stamp}");
    wait_until("web has 2 pods and status", Duration::from_secs(30), || {
        podset::converged(&kc, NS, "web", 2)
    });

    // Scale up, then to 0: each change reported once, the Pods follow.
    for replicas in [3, 0] {
        change_web(&kc, &mut ctl, replicas, "web scaled");
        wait_until(
            &format!("web has {replicas} pods"),
            Duration::from_secs(30),
            || podset::converged(&kc, NS, "web", replicas),
        );
    }
    let reported = ctl.drain();
    assert!(
        !reported
            .iter()
            .any(|e| matches!(e, Event::Reconciled { .. })),
        "a stamp reported twice: {reported:?}"
    );

    // client-go's workqueue metrics, under the controller's queue name.
    let m = http::get(local(metrics), "/metrics", Duration::from_secs(5)).unwrap();
    assert_eq!(m.status, 200);
    assert!(
        m.body.contains("workqueue_adds_total{") && m.body.contains("name=\"podset\""),
        "{}",
        m.body
    );

    // SIGTERM: it stops leading and exits by itself.
    assert!(ctl.terminate(Duration::from_secs(10)), "did not exit");
    ctl.wait_for(Duration::from_secs(5), "stopped-leading", |e| {
        matches!(e, Event::StoppedLeading(_))
    })
    .unwrap();
}

#[test]
fn petrel_podset_controller_should_hand_over_its_lease_within_a_second_of_sigterm() {
    let cluster = Cluster::start().unwrap_or_else(|e| panic!("{e}"));
    let kc = podset::prepare(&cluster, NS).unwrap_or_else(|e| panic!("{e}"));
    let lease = Some("podset-petrel");
    let mut a = controller(&cluster, "a", lease, &[]);
    a.wait_for(Duration::from_secs(60), "a leads", |e| {
        matches!(e, Event::Leading(_))
    })
    .unwrap();
    change_web(&kc, &mut a, 2, "web reconciled by a");
    wait_until("web has 2 pods and status", Duration::from_secs(30), || {
        podset::converged(&kc, NS, "web", 2)
    });

    // A standby (its readiness served: warm) does not lead while the
    // leader renews.
    let mut b = ready_standby(&cluster, "b", lease);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !b.drain().iter().any(|e| matches!(e, Event::Leading(_))),
        "two leaders"
    );

    // SIGTERM: a stops leading and releases the Lease; b leads within 1 s.
    let t_term = podset::unix_nanos();
    assert!(a.terminate(Duration::from_secs(10)), "a did not exit");
    a.wait_for(Duration::from_secs(5), "a stopped leading", |e| {
        matches!(e, Event::StoppedLeading(_))
    })
    .unwrap();
    let Event::Leading(t) = b
        .wait_for(Duration::from_secs(10), "b leads", |e| {
            matches!(e, Event::Leading(_))
        })
        .unwrap()
    else {
        unreachable!()
    };
    let took = (t - t_term) as f64 / 1e9;
    eprintln!("petrel handover after SIGTERM: {took:.3} s");
    assert!(took <= 1.0, "b led {took:.3} s after a's SIGTERM");

    // The new leader reconciles the next change: scaled to 0.
    change_web(&kc, &mut b, 0, "web scaled down by b");
    wait_until("no pods left", Duration::from_secs(30), || {
        podset::converged(&kc, NS, "web", 0)
    });

    // kill -9 of the leader: nothing is released, so a standby leads once
    // the Lease (4 s) runs out, and not much later.
    let mut c = ready_standby(&cluster, "c", lease);
    let t_kill = podset::unix_nanos();
    b.kill();
    let Event::Leading(t) = c
        .wait_for(Duration::from_secs(15), "c leads", |e| {
            matches!(e, Event::Leading(_))
        })
        .unwrap()
    else {
        unreachable!()
    };
    let took = (t - t_kill) as f64 / 1e9;
    eprintln!("petrel handover after kill -9: {took:.3} s");
    assert!(
        took <= 5.0,
        "c led {took:.3} s after b's kill -9 (lease 4 s)"
    );
    change_web(&kc, &mut c, 1, "web scaled up by c");
}

/// Creates PodSets `<prefix>-<i>` for i in 0..n (0 replicas, status never
/// written), 16 at once.
async fn create_podsets(cluster: &Cluster, prefix: &str, n: usize) {
    use kube::api::{Api, ApiResource, DynamicObject, PostParams};
    let kc = kube::config::Kubeconfig::read_from(cluster.admin_kubeconfig()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let ar = ApiResource {
        group: "bench.petrel.dev".into(),
        version: "v1".into(),
        api_version: "bench.petrel.dev/v1".into(),
        kind: "PodSet".into(),
        plural: "podsets".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &ar);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        if set.len() >= 16 {
            set.join_next().await.unwrap().unwrap();
        }
        let api = api.clone();
        let name = format!("{prefix}-{i:05}");
        set.spawn(async move {
            let obj: DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "bench.petrel.dev/v1",
                "kind": "PodSet",
                // A stamp, so that each reconcile is reported.
                "metadata": {"name": name, "annotations": {podset::CHANGED_AT: "0"}},
                "spec": {"replicas": 0, "template": {}},
            }))
            .unwrap();
            api.create(&PostParams::default(), &obj).await.unwrap();
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
}

#[test]
fn petrel_podset_controller_should_serve_a_user_change_before_10k_existing_objects() {
    let cluster = Cluster::start().unwrap_or_else(|e| panic!("{e}"));
    let kc = podset::prepare(&cluster, NS).unwrap_or_else(|e| panic!("{e}"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 10 000 PodSets whose status was never written: each needs a
    // reconcile that writes it when the controller starts.
    rt.block_on(create_podsets(&cluster, "old", 10_000));
    let mut ctl = controller(&cluster, "storm", Some("podset-storm"), &[]);
    ctl.wait_for(Duration::from_secs(120), "leads", |e| {
        matches!(e, Event::Leading(_))
    })
    .unwrap();
    // Let the initial list's reconciles start, then change something.
    ctl.wait_for(
        Duration::from_secs(60),
        "the storm starts",
        |e| matches!(e, Event::Reconciled { key, .. } if key.contains("/old-")),
    )
    .unwrap();
    let stamp = podset::unix_nanos();
    kc.apply(&podset::manifest(NS, "web", 0, stamp)).unwrap();
    let mut old_before = 0;
    let mut served = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while served.is_none() && std::time::Instant::now() < deadline {
        for e in ctl.drain() {
            match e {
                Event::Reconciled { key, .. } if key.contains("/old-") => old_before += 1,
                Event::Reconciled { changed_at, at, .. } if changed_at == stamp => {
                    served = Some(at)
                }
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let at = served.expect("the user change was never reconciled");
    let took = (at - stamp) as f64 / 1e9;
    eprintln!(
        "user change reconciled {took:.3} s after it was sent, {old_before} of 10000 old PodSets before it"
    );
    // kubectl apply itself takes a few hundred ms: the bound is generous,
    // the order is the point.
    assert!(took <= 2.0, "the user change waited {took:.3} s");
    assert!(
        old_before < 10_000,
        "the whole initial list went before the user change"
    );
}
