//! What a pod of a Petrel node learns of its cluster, as kubelet tells it
//! (issue 32): its resolver config by `dnsPolicy` (`--cluster-dns`,
//! `--cluster-domain`), its `/etc/hosts` with `hostAliases`, and the
//! service environment variables (`KUBERNETES_SERVICE_HOST`, a Service
//! made with kubectl), read through `kubectl exec` on pods bound to the
//! node by `spec.nodeName`, against a real kube-apiserver and etcd.
//!
//! A missing peer fails this test unless `PETREL_PEERS_SKIP` leaves it out
//! (then it skips, saying so).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_testkit::agent::Agent;
use petrel_testkit::cluster::{self, node_name, Cluster};
use petrel_testkit::kubectl::Kubectl;
use petrel_testkit::kubelet;
use petrel_testkit::prelude::*;
use petrel_testkit::wait::wait_for;
use serde_json::Value;

/// The cluster DNS address the node is given (in the test cluster's
/// service range; nothing answers there, only the files are checked).
const CLUSTER_DNS: &str = "10.0.0.10";

fn skip() -> bool {
    if let Some(why) = cluster::left_out() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

/// A busybox pod bound to `node`, with `extra` spec lines (indented two
/// spaces).
fn bound_pod(name: &str, node: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  nodeName: {node}\n  automountServiceAccountToken: false\n\
         \x20 terminationGracePeriodSeconds: 1\n{extra}  containers:\n  - name: main\n\
         \x20   image: {BUSYBOX}\n    imagePullPolicy: Never\n\
         \x20   command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']\n"
    )
}

/// The output of `cmd` run in pod `pod` through the API server.
fn exec(kc: &Kubectl, pod: &str, cmd: &str) -> String {
    kc.ok(&["exec", pod, "--", "sh", "-c", cmd])
        .unwrap_or_else(|e| panic!("exec {cmd:?} in {pod}: {e}"))
}

/// The nameserver lines of a resolv.conf text.
fn nameservers(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("nameserver "))
        .map(|s| s.trim().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_petrel_node_should_give_pods_cluster_dns_hosts_and_service_variables() {
    if skip() {
        return;
    }
    let t0 = Instant::now();
    let cluster = std::thread::spawn(Cluster::start);
    let node = Node::start_with_busybox().await;
    let cluster = cluster.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let kc = cluster.kubectl().unwrap();
    kc.ok(&["create", "serviceaccount", "default"]).unwrap();
    let name = node_name("petrel-dns");
    let creds = cluster
        .node_credentials(&name, kubelet::node_ip().unwrap())
        .unwrap();
    let agent = Agent::in_cluster(
        &node,
        &creds,
        &[
            "--cluster-dns",
            CLUSTER_DNS,
            "--cluster-domain",
            "cluster.local",
        ],
    );
    wait_for("node Ready", Duration::from_secs(90), || {
        kc.get_json(&["node", &name]).ok().filter(|n| {
            n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    })
    .await;
    eprintln!("node Ready after {:?}", t0.elapsed());

    // A Service made with kubectl: its cluster IP is the API server's pick.
    kc.ok(&[
        "create",
        "service",
        "clusterip",
        "dns-e2e-web",
        "--tcp=80:8080,8443:8443",
    ])
    .unwrap();
    let svc_ip = |svc: &str| -> String {
        let s = kc.get_json(&["service", svc]).unwrap();
        s["spec"]["clusterIP"].as_str().unwrap().to_string()
    };
    let web_ip = svc_ip("dns-e2e-web");
    let api_ip = wait_for("the kubernetes service", Duration::from_secs(30), || {
        kc.get_json(&["service", "kubernetes"])
            .ok()
            .and_then(|s| s["spec"]["clusterIP"].as_str().map(str::to_string))
    })
    .await;

    let pods = [
        (
            "cf",
            "  hostname: www\n  subdomain: team\n  hostAliases:\n  - {ip: 10.1.2.3, hostnames: [foo.local, bar.local]}\n",
        ),
        ("hn", "  hostNetwork: true\n  dnsPolicy: ClusterFirst\n"),
        ("hnc", "  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n"),
        (
            "none",
            "  dnsPolicy: None\n  dnsConfig:\n    nameservers: [192.0.2.53]\n    searches: [my.example]\n    options: [{name: ndots, value: '2'}, {name: edns0}]\n",
        ),
        ("nolinks", "  enableServiceLinks: false\n"),
    ];
    for (pod, extra) in pods {
        kc.apply(&bound_pod(pod, &name, extra)).unwrap();
    }
    for (pod, _) in pods {
        wait_for(
            &format!("pod {pod} Running"),
            Duration::from_secs(60),
            || {
                kc.get_json(&["pod", pod])
                    .ok()
                    .filter(|p| p["status"]["phase"] == "Running")
            },
        )
        .await;
    }
    eprintln!("pods Running after {:?}", t0.elapsed());

    // ClusterFirst: the cluster DNS only, the cluster's search paths first
    // (then the host's), ndots:5.
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let resolv = exec(&kc, "cf", "cat /etc/resolv.conf");
    assert_eq!(nameservers(&resolv), vec![CLUSTER_DNS], "{resolv}");
    let search = resolv
        .lines()
        .find_map(|l| l.strip_prefix("search "))
        .unwrap_or_else(|| panic!("no search line: {resolv}"));
    assert!(
        search.starts_with("default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    assert!(resolv.contains("options ndots:5\n"), "{resolv}");

    // On the host's network ClusterFirst is Default: the host's servers.
    let resolv = exec(&kc, "hn", "cat /etc/resolv.conf");
    let mut host_servers = nameservers(&host_resolv);
    host_servers.truncate(3);
    assert_eq!(nameservers(&resolv), host_servers, "{resolv}");
    assert!(!resolv.contains("ndots:5"), "{resolv}");
    // ClusterFirstWithHostNet asks for the cluster DNS anyway.
    let resolv = exec(&kc, "hnc", "cat /etc/resolv.conf");
    assert_eq!(nameservers(&resolv), vec![CLUSTER_DNS], "{resolv}");
    assert!(resolv.contains("options ndots:5\n"), "{resolv}");
    // None: the pod's dnsConfig alone.
    let resolv = exec(&kc, "none", "cat /etc/resolv.conf");
    assert_eq!(
        resolv,
        "search my.example\nnameserver 192.0.2.53\noptions ndots:2 edns0\n"
    );

    // /etc/hosts: kubelet's file, the pod's fully qualified name, its
    // aliases; a host-network pod's is the host's file.
    let hosts = exec(&kc, "cf", "cat /etc/hosts");
    assert!(
        hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"),
        "{hosts}"
    );
    let cf = kc.get_json(&["pod", "cf"]).unwrap();
    let ip = cf["status"]["podIP"].as_str().unwrap_or("127.0.1.1");
    assert!(
        hosts.contains(&format!("{ip}\twww.team.default.svc.cluster.local\twww\n")),
        "{hosts}"
    );
    assert!(
        hosts.ends_with("\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"),
        "{hosts}"
    );
    let hosts = exec(&kc, "hn", "cat /etc/hosts");
    let host_hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    assert_eq!(
        hosts,
        format!("# Kubernetes-managed hosts file (host network).\n{host_hosts}")
    );

    // Service variables: the namespace's services and the API server's.
    let env = exec(&kc, "cf", "env");
    for line in [
        format!("KUBERNETES_SERVICE_HOST={api_ip}"),
        "KUBERNETES_SERVICE_PORT=443".to_string(),
        "KUBERNETES_SERVICE_PORT_HTTPS=443".to_string(),
        format!("KUBERNETES_PORT=tcp://{api_ip}:443"),
        format!("DNS_E2E_WEB_SERVICE_HOST={web_ip}"),
        "DNS_E2E_WEB_SERVICE_PORT=80".to_string(),
        "DNS_E2E_WEB_SERVICE_PORT_80_8080=80".to_string(),
        format!("DNS_E2E_WEB_PORT=tcp://{web_ip}:80"),
        format!("DNS_E2E_WEB_PORT_8443_TCP=tcp://{web_ip}:8443"),
        "DNS_E2E_WEB_PORT_8443_TCP_PROTO=tcp".to_string(),
        "DNS_E2E_WEB_PORT_8443_TCP_PORT=8443".to_string(),
        format!("DNS_E2E_WEB_PORT_8443_TCP_ADDR={web_ip}"),
    ] {
        assert!(env.lines().any(|l| l == line), "{line} not in:\n{env}");
    }
    // enableServiceLinks: false keeps only the API server's.
    let env = exec(&kc, "nolinks", "env");
    assert!(
        env.lines()
            .any(|l| l == format!("KUBERNETES_SERVICE_HOST={api_ip}")),
        "{env}"
    );
    assert!(!env.contains("DNS_E2E_WEB"), "{env}");

    // The pods go with the test: deleted, then gone from the runtime.
    let names: Vec<&str> = pods.iter().map(|(p, _)| *p).collect();
    let mut args = vec!["delete", "pod", "--wait=false"];
    args.extend(&names);
    kc.ok(&args).unwrap();
    wait_for("the pods gone", Duration::from_secs(30), || {
        let list: Value = kc.get_json(&["pods"]).ok()?;
        list["items"]
            .as_array()
            .is_some_and(|a| a.is_empty())
            .then_some(())
    })
    .await;
    eprintln!("done after {:?}", t0.elapsed());
    drop(agent);
}
