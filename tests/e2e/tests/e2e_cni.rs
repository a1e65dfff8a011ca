//! Pod networking through real CNI plugins (Debian's
//! containernetworking-plugins): each test has its own bridge, subnet and
//! lease directory. Pods get addresses, reach each other over ICMP and
//! TCP, are reachable through port mappings, and leave nothing behind:
//! no veth on the bridge, no lease, no iptables rule, no namespace pin.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::network::{iptables_rules_with, PodNetwork, LOOPBACK_PORTMAP};
use petrel_testkit::prelude::*;

async fn exec(c: &mut Clients, id: &str, script: &str) -> (i32, String) {
    let r = c.exec_sh(id, script, 20).await;
    (
        r.exit_code,
        format!(
            "{}{}",
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        ),
    )
}

async fn pod_ip(c: &mut Clients, pod: &str) -> String {
    c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
        pod_sandbox_id: pod.to_string(),
        verbose: false,
    })
    .await
    .expect("PodSandboxStatus")
    .into_inner()
    .status
    .and_then(|s| s.network)
    .map(|n| n.ip)
    .unwrap_or_default()
}

async fn network_condition(c: &mut Clients) -> api::RuntimeCondition {
    c.rt.status(api::StatusRequest { verbose: false })
        .await
        .expect("Status")
        .into_inner()
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.r#type == "NetworkReady")
        .expect("NetworkReady condition")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An HTTP GET of `/` on 127.0.0.1:`port`, as raw text.
fn http_get(port: u16) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// A shell loop fetching `/index.html` from `ip`:8080 with `nc` until it
/// answers (busybox-static's wget crashes in a container without glibc's
/// NSS libraries); prints the body's last line.
fn fetch(ip: &str) -> String {
    format!(
        "for i in $(seq 50); do printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} 8080 > /tmp/out 2>&1 && grep -q hello /tmp/out && tail -n 1 /tmp/out && exit 0; sleep 0.1; done; cat /tmp/out; exit 1"
    )
}

const WEB: &str =
    "mkdir -p /www && echo hello-from-$(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www";

#[tokio::test]
async fn pods_should_talk_over_the_bridge_and_leave_no_debris() {
    let net = PodNetwork::with_chain(LOOPBACK_PORTMAP);
    let node = Node::start_with(&net.cri_config());
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let cond = network_condition(&mut c).await;
    assert!(cond.status, "{cond:?}");

    let host_port = free_port();
    let mut pa = node.pod_config("neta");
    pa.dns_config = Some(api::DnsConfig {
        servers: vec!["10.0.0.10".into()],
        searches: vec!["e2e.svc.cluster.local".into()],
        options: vec!["ndots:5".into()],
    });
    let mut pb = node.pod_config("netb");
    pb.port_mappings = vec![api::PortMapping {
        protocol: api::Protocol::Tcp as i32,
        container_port: 8080,
        host_port: i32::from(host_port),
        host_ip: String::new(),
    }];
    let a = c.run_pod(pa.clone()).await;
    let b = c.run_pod(pb.clone()).await;
    let ip_a = pod_ip(&mut c, &a).await;
    let ip_b = pod_ip(&mut c, &b).await;
    for ip in [&ip_a, &ip_b] {
        assert!(
            ip.starts_with(&format!("{}.", net.prefix)),
            "{ip} not in {}.0/24",
            net.prefix
        );
    }
    assert_ne!(ip_a, ip_b);
    assert_eq!(net.leased().len(), 2, "{:?}", net.leased());
    assert_eq!(net.bridge_ports().len(), 2, "{:?}", net.bridge_ports());

    let ca = c.run(&a, &pa, sh_container("client", "sleep 1000")).await;
    let cb = c.run(&b, &pb, sh_container("web", WEB)).await;

    // ICMP and TCP between the pods.
    let (code, out) = exec(&mut c, &ca, &format!("ping -c 1 -W 5 {ip_b}")).await;
    assert_eq!(code, 0, "ping: {out}");
    let (code, out) = exec(&mut c, &ca, &fetch(&ip_b)).await;
    assert_eq!((code, out.trim()), (0, "hello-from-netb"), "{out}");

    // The port mapping, from the host's loopback.
    let mut got = String::new();
    for _ in 0..50 {
        match http_get(host_port) {
            Ok(r) if r.contains("hello-from-netb") => {
                got = r;
                break;
            }
            Ok(r) => got = r,
            Err(e) => got = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        got.contains("hello-from-netb"),
        "127.0.0.1:{host_port}: {got}"
    );

    // /etc/hosts names the pod on its address; resolv.conf is the pod's DNS.
    let (_, hosts) = exec(&mut c, &ca, "cat /etc/hosts").await;
    assert!(hosts.contains(&format!("{ip_a}\tneta")), "{hosts}");
    let (_, resolv) = exec(&mut c, &ca, "cat /etc/resolv.conf").await;
    assert_eq!(
        resolv,
        "search e2e.svc.cluster.local\nnameserver 10.0.0.10\noptions ndots:5\n"
    );
    let (_, ifs) = exec(&mut c, &ca, "ip -o addr show eth0").await;
    assert!(ifs.contains(&format!("{ip_a}/24")), "{ifs}");

    let dirs: Vec<_> = [&a, &b]
        .iter()
        .map(|id| node.state.join("sandboxes").join(id))
        .collect();
    assert!(dirs.iter().all(|d| d.join("net").exists()));
    assert!(
        !iptables_rules_with(&b).is_empty(),
        "portmap made no rule naming the pod"
    );

    // Stop is idempotent; remove tears everything down.
    for pod in [&a, &b] {
        c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.to_string(),
        })
        .await
        .unwrap();
    }
    assert!(
        net.leased().is_empty(),
        "leases after stop: {:?}",
        net.leased()
    );
    assert!(
        net.bridge_ports().is_empty(),
        "veths after stop: {:?}",
        net.bridge_ports()
    );
    for pod in [&a, &b] {
        c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.to_string(),
        })
        .await
        .unwrap();
        c.remove_pod(pod).await.unwrap();
    }
    assert!(dirs.iter().all(|d| !d.exists()), "sandbox directories left");
    for pod in [&a, &b] {
        assert!(
            iptables_rules_with(pod).is_empty(),
            "{:?}",
            iptables_rules_with(pod)
        );
    }
    assert!(
        http_get(host_port).is_err(),
        "the port mapping outlived its pod"
    );
    let _ = (cb, node);
}

#[tokio::test]
async fn a_failing_plugin_should_fail_the_pod_without_debris() {
    // The tuning plugin fails after the bridge made a veth and host-local
    // leased an address: both must be released.
    let net = PodNetwork::with_chain(
        r#"{"type":"tuning","sysctl":{"net.ipv4.conf.eth0.petrel_no_such_key":"1"}}"#,
    );
    let node = Node::start_with(&net.cri_config());
    let mut c = node.clients().await;
    let err =
        c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(node.pod_config("failing")),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("the chain fails");
    assert!(err.message().contains("tuning"), "{err:?}");
    assert!(err.message().contains("petrel_no_such_key"), "{err:?}");
    assert!(net.leased().is_empty(), "{:?}", net.leased());
    assert!(net.bridge_ports().is_empty(), "{:?}", net.bridge_ports());
    let left: Vec<_> = std::fs::read_dir(node.state.join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    let pods =
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
            .await
            .unwrap()
            .into_inner()
            .items;
    assert!(pods.is_empty());
}

#[tokio::test]
async fn a_missing_or_broken_config_should_make_the_network_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("net.d");
    let node = Node::start_with(&format!(
        "pod_network = \"cni\"\n[cri.cni]\nconf_dir = {conf:?}\n"
    ));
    let mut c = node.clients().await;
    let cond = network_condition(&mut c).await;
    assert!(!cond.status);
    assert_eq!(cond.reason, "NetworkPluginNotReady");
    assert!(cond.message.contains("no network config found"), "{cond:?}");
    let run = |name: &str| api::RunPodSandboxRequest {
        config: Some(node.pod_config(name)),
        runtime_handler: String::new(),
    };
    let err =
        c.rt.run_pod_sandbox(run("nonet"))
            .await
            .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");

    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("00-broken.conflist"), "{\"name\": ").unwrap();
    let cond = network_condition(&mut c).await;
    assert!(!cond.status);
    assert!(cond.message.contains("00-broken.conflist"), "{cond:?}");
    let err =
        c.rt.run_pod_sandbox(run("broken"))
            .await
            .expect_err("refused");
    assert!(err.message().contains("00-broken.conflist"), "{err:?}");

    // A host-network pod needs no CNI.
    let mut host = node.pod_config("hostnet");
    pod_namespaces(&mut host).network = api::NamespaceMode::Node as i32;
    let id = c.run_pod(host).await;
    c.remove_pod(&id).await.unwrap();
    let left: Vec<_> = std::fs::read_dir(node.state.join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn networked_pods_should_survive_a_restart_and_a_lost_namespace() {
    let net = PodNetwork::with_chain(LOOPBACK_PORTMAP);
    let mut node = Node::start_with(&net.cri_config());
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pa = node.pod_config("keep");
    let pb = node.pod_config("lost");
    let a = c.run_pod(pa.clone()).await;
    let b = c.run_pod(pb.clone()).await;
    let ca = c.run(&a, &pa, sh_container("box", "sleep 1000")).await;
    let cb = c.run(&b, &pb, sh_container("web", WEB)).await;
    let ip_a = pod_ip(&mut c, &a).await;
    let ip_b = pod_ip(&mut c, &b).await;

    node.terminate();
    // The configuration changes while the runtime is down: teardown must
    // still use the network the pods were set up with.
    std::fs::remove_file(&net.conf_file).unwrap();
    node.restart();
    let mut c = node.clients().await;
    assert_eq!(pod_ip(&mut c, &a).await, ip_a);
    let (code, out) = exec(&mut c, &ca, &fetch(&ip_b)).await;
    assert_eq!((code, out.trim()), (0, "hello-from-lost"), "{out}");
    // The CNI CHECK run after the restart (off the start-up path) passed;
    // verbose status shows its verdict.
    let mut check = None;
    for _ in 0..100 {
        let st =
            c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
                pod_sandbox_id: a.clone(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        check = st.info.get("networkCheck").cloned();
        if check.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(check.as_deref(), Some("ok"));

    // Pod b's namespace disappears behind the runtime's back: DEL still
    // releases its address.
    c.stop(&cb, 0).await.unwrap();
    let pin = node.state.join("sandboxes").join(&b).join("net");
    let st = std::process::Command::new("umount")
        .arg("-l")
        .arg(&pin)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_file(&pin).unwrap();
    c.remove_pod(&b).await.unwrap();
    assert_eq!(net.leased(), vec![ip_a.clone()]);
    c.remove_pod(&a).await.unwrap();
    assert!(net.leased().is_empty(), "{:?}", net.leased());
    assert!(net.bridge_ports().is_empty(), "{:?}", net.bridge_ports());
}

/// The agent on a CNI network: status.podIP is the pod's CNI address, the
/// downward API sees it, and httpGet/tcpSocket probes reach the pod there.
#[tokio::test(flavor = "multi_thread")]
async fn agent_should_probe_pods_on_their_cni_address() {
    use petrel_testkit::agent::{container_id, container_status, Agent};
    let net = PodNetwork::with_chain(LOOPBACK_PORTMAP);
    let node = Node::start_with(&net.cri_config());
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let agent = Agent::for_node(&node, &[]);
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: web\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {WEB:?}]\n    env:\n    - {{name: MY_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}\n    ports:\n    - {{name: http, containerPort: 8080}}\n    readinessProbe:\n      httpGet: {{path: /index.html, port: http}}\n      periodSeconds: 1\n    livenessProbe:\n      tcpSocket: {{port: 8080}}\n      periodSeconds: 1\n"
    );
    agent.write_manifest("web.yaml", &manifest);
    let pod = agent.wait_pod(
        "default",
        "web",
        Duration::from_secs(60),
        "web ready",
        |p| container_status(p, "web").is_some_and(|c| c["ready"] == true),
    );
    let ip = pod["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(ip.starts_with(&format!("{}.", net.prefix)), "{pod}");
    let full = container_id(&pod, "web");
    let id = full.rsplit("://").next().unwrap_or_default();
    let (code, env_ip) = exec(&mut c, id, "echo $MY_IP").await;
    assert_eq!((code, env_ip.trim()), (0, ip.as_str()));
    // The liveness probe passes: no restarts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = agent.pod("default", "web").unwrap();
    assert_eq!(container_status(&pod, "web").unwrap()["restartCount"], 0);
    agent.remove_manifest("web.yaml");
    agent.wait_gone("default", "web", Duration::from_secs(30));
    // A terminated pod's sandbox is stopped: its lease goes at once.
    let released = eventually(Duration::from_secs(30), || net.leased().is_empty()).await;
    assert!(released, "{:?}", net.leased());
}

/// A chained CNI plugin that writes each command it runs to `calls` beside
/// itself and passes the previous result on.
const COUNTING_PLUGIN: &str = r#"#!/usr/bin/python3
import json, os, sys
conf = json.load(sys.stdin)
cmd = os.environ.get("CNI_COMMAND", "")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls"), "a") as f:
    f.write(cmd + "\n")
if cmd == "ADD":
    json.dump(conf["prevResult"], sys.stdout)
elif cmd == "VERSION":
    json.dump({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}, sys.stdout)
"#;

/// Verbose PodSandboxStatus answers from what the runtime holds: no CNI
/// CHECK per call (only recovery's, once, after a restart, whose verdict
/// status then shows).
#[tokio::test]
async fn verbose_pod_status_should_not_run_a_cni_check_per_call() {
    let net = PodNetwork::with_chain(r#"{"type":"loopback"},{"type":"petrel-count"}"#);
    let bin = net.dir().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let plugin = bin.join("petrel-count");
    std::fs::write(&plugin, COUNTING_PLUGIN).unwrap();
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let calls = |cmd: &str| {
        std::fs::read_to_string(bin.join("calls"))
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == cmd)
            .count()
    };
    let cri = format!(
        "pod_network = \"cni\"\n[cri.cni]\nconf_dir = {:?}\nbin_dirs = [{:?}, {:?}]\n",
        net.conf_dir, bin, net.bin_dir
    );
    let mut node = Node::start_with(&cri);
    let mut c = node.clients().await;
    let id = c.run_pod(node.pod_config("counted")).await;
    assert_eq!(calls("ADD"), 1, "the counting plugin is in the chain");
    let verbose = |id: &str| api::PodSandboxStatusRequest {
        pod_sandbox_id: id.to_string(),
        verbose: true,
    };
    for _ in 0..5 {
        let st =
            c.rt.pod_sandbox_status(verbose(&id))
                .await
                .unwrap()
                .into_inner();
        assert!(st.info["info"].contains("\"ips\""), "{:?}", st.info);
    }
    assert_eq!(calls("CHECK"), 0, "a verbose status ran a CNI CHECK");

    // After a restart recovery checks the pod's network once; status shows
    // that verdict and runs no CHECK of its own.
    node.terminate();
    node.restart();
    let mut c = node.clients().await;
    let mut check = None;
    for _ in 0..100 {
        let st =
            c.rt.pod_sandbox_status(verbose(&id))
                .await
                .unwrap()
                .into_inner();
        check = st.info.get("networkCheck").cloned();
        if check.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(check.as_deref(), Some("ok"));
    for _ in 0..5 {
        c.rt.pod_sandbox_status(verbose(&id)).await.unwrap();
    }
    assert_eq!(calls("CHECK"), 1);
    c.remove_pod(&id).await.unwrap();
    assert_eq!(calls("DEL"), 1);
    assert!(net.leased().is_empty(), "{:?}", net.leased());
}
