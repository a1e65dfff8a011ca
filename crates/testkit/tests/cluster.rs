//! The local cluster: etcd + kube-apiserver from the peers start, serve
//! kubectl with real-cluster authorization, run side by side, and leave
//! nothing when dropped. Needs `make peers` (or PETREL_PEERS_BIN);
//! PETREL_PEERS_SKIP=etcd or =kubernetes leaves these tests out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use petrel_testkit::cluster::{self, Cluster};
use petrel_testkit::kubeconfig::Kubeconfig;
use petrel_testkit::kubectl::{Kubectl, DEFAULT_DEADLINE};

fn skip() -> bool {
    if let Some(why) = cluster::left_out() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .map(|(_, t)| !t.trim_start().starts_with('Z'))
                .unwrap_or(false)
        })
        .unwrap_or(false)
}

fn pids_under(dir: &std::path::Path) -> Vec<u32> {
    // Our children started with arguments naming the cluster's directory.
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

#[test]
fn cluster_should_serve_kubectl_with_node_authorization_and_leave_nothing() {
    if skip() {
        return;
    }
    let t = Instant::now();
    let c = Cluster::start().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cluster ready in {:?} at {}", t.elapsed(), c.server());
    let k = c.kubectl().expect("kubectl");
    let ns = k.ok(&["get", "ns", "-o", "name"]).expect("get ns");
    assert!(ns.contains("namespace/default"), "{ns}");
    assert!(ns.contains("namespace/kube-system"), "{ns}");
    let who = k
        .ok(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.groups}"])
        .expect("whoami");
    assert!(who.contains("system:masters"), "{who}");

    // A node's identity is held to the Node authorizer: it may read its
    // own Node object only, never secrets.
    let ip = petrel_testkit::kubelet::node_ip().expect("node ip");
    let creds = c.node_credentials("n1", ip).expect("node credentials");
    let node = Kubectl::new(&creds.kubeconfig, c.dir(), &c.apiserver_log()).expect("kubectl");
    let who = node
        .ok(&[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .expect("whoami as node");
    assert_eq!(who, "system:node:n1");
    let secrets = node
        .run_with(&["get", "secrets", "-A"], None, DEFAULT_DEADLINE)
        .expect("kubectl");
    assert!(!secrets.status.success());
    assert!(
        String::from_utf8_lossy(&secrets.stderr).contains("Forbidden"),
        "{secrets:?}"
    );

    let dir = c.dir().to_path_buf();
    let pids = pids_under(&dir);
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver: {pids:?}");
    drop(c);
    assert!(!dir.exists(), "{} left", dir.display());
    for pid in pids {
        assert!(!alive(pid), "process {pid} left");
    }
}

#[test]
fn clusters_should_run_side_by_side_without_seeing_each_other() {
    if skip() {
        return;
    }
    let t = Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(Cluster::start);
        let b = s.spawn(Cluster::start);
        (
            a.join().expect("thread").unwrap_or_else(|e| panic!("{e}")),
            b.join().expect("thread").unwrap_or_else(|e| panic!("{e}")),
        )
    });
    eprintln!("two clusters ready in {:?}", t.elapsed());
    assert_ne!(a.server(), b.server());
    let (ka, kb) = (a.kubectl().unwrap(), b.kubectl().unwrap());
    ka.ok(&["create", "namespace", "only-in-a"])
        .expect("create ns");
    assert!(ka
        .ok(&["get", "ns", "-o", "name"])
        .unwrap()
        .contains("only-in-a"));
    assert!(!kb
        .ok(&["get", "ns", "-o", "name"])
        .unwrap()
        .contains("only-in-a"));
    // Each CA is its own: a's admin certificate is a stranger to b.
    let cross = a.dir().join("cross.kubeconfig");
    Kubeconfig {
        server: b.server().to_string(),
        ca: b.ca_cert().to_path_buf(),
        cert: a.dir().join("pki/admin.crt"),
        key: a.dir().join("pki/admin.key"),
        user: "a-admin".into(),
    }
    .write(&cross)
    .unwrap();
    let out = Kubectl::new(&cross, a.dir(), &b.apiserver_log())
        .unwrap()
        .run_with(&["get", "ns"], None, DEFAULT_DEADLINE)
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Unauthorized") || err.contains("must be logged in"),
        "{err}"
    );
}
