use std::sync::{Arc, Mutex};

use clap::Parser;
use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use petrel_agent::health::Health;
use petrel_agent::server::{serve, Listeners, ServerState};
use petrel_agent::status::StatusStore;
use tokio::io::AsyncWriteExt;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: GetArgs,
}

fn parse(args: &[&str]) -> Result<GetArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("get").chain(args.iter().copied())).map(|c| c.args)
}

fn pod(ns: &str, name: &str, phase: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Default::default()],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }),
    }
}

/// The agent's real server on its unix socket in a directory of the test
/// (removed when the returned guard is dropped).
async fn agent() -> (Server, Arc<StatusStore>, tempfile::TempDir) {
    let (server, store, _, dir) = agent_with_node().await;
    (server, store, dir)
}

/// The agent's real server, with its node state.
async fn agent_with_node() -> (
    Server,
    Arc<StatusStore>,
    Arc<petrel_agent::eviction::NodeState>,
    tempfile::TempDir,
) {
    let node = Arc::new(petrel_agent::eviction::NodeState::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent/agent.sock");
    let socket = petrel_agent::server::socket::bind(&path, None).unwrap();
    let url = format!("unix://{}", path.display());
    let store = Arc::new(StatusStore::new());
    store.upsert(pod("default", "web", "Running"));
    store.upsert(pod("default", "db", "Pending"));
    store.upsert(pod("kube-system", "dns", "Running"));
    let state = ServerState {
        store: store.clone(),
        health: Arc::new(Health::new(Duration::from_secs(60))),
        registry: Arc::new(Default::default()),
        // A lazily connecting client: these tests never reach a runtime.
        runtime: Arc::new(
            petrel_agent::cri::CriRuntime::new(
                "unix:///nonexistent/petrel.sock",
                petrel_agent::metrics::AgentMetrics::new(),
                Duration::from_secs(1),
            )
            .unwrap(),
        ),
        cache: Arc::new(petrel_agent::cache::PodCache::new()),
        node: node.clone(),
        node_name: "test-node".to_string(),
    };
    let listeners = Listeners {
        tcp: listener,
        tls: None,
        names: Default::default(),
        unix: Some(socket),
        webhook: None,
    };
    tokio::spawn(serve(listeners, state, std::future::pending()));
    (Server::parse(&url).unwrap(), store, node, dir)
}

#[tokio::test]
async fn get_node_should_show_the_pressure_conditions() {
    use petrel_agent::eviction::NodeCondition;
    let (server, _, node, _dir) = agent_with_node().await;
    node.update(
        std::collections::BTreeSet::from([NodeCondition::DiskPressure]),
        None,
    );
    let n = fetch_node(&server, None).await.unwrap();
    let mut out = Vec::new();
    print_node(&mut out, None, &n).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        vec![
            vec!["NAME", "MEMORYPRESSURE", "DISKPRESSURE", "PIDPRESSURE"],
            vec!["test-node", "False", "True", "False"],
        ]
    );
    let mut out = Vec::new();
    print_node(&mut out, Some(Output::Json), &n).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["metadata"]["name"], "test-node");
    let e = fetch_node(&server, Some("other")).await.unwrap_err();
    assert!(e.to_string().contains("\"other\" not found"), "{e}");
    assert!(parse(&["no"]).is_ok());
}

async fn show(server: &Server, args: &[&str]) -> Result<String, GetError> {
    let q = Query::from_args(&parse(args).unwrap())?;
    let pods = fetch(server, &q).await?;
    let mut out = Vec::new();
    print_initial(&mut out, &q, &pods, &mut Vec::new())?;
    Ok(String::from_utf8(out).unwrap())
}

fn names_in(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

#[test]
fn args_should_parse_like_kubectl_and_reject_bad_flags_with_2() {
    let a = parse(&["pods", "web", "-n", "x", "-o", "wide", "-w"]).unwrap();
    assert_eq!(a.resource, Resource::Pods);
    assert_eq!(a.name.as_deref(), Some("web"));
    assert_eq!(a.namespace.as_deref(), Some("x"));
    assert_eq!(a.output, Some(Output::Wide));
    assert!(a.watch);
    assert_eq!(a.server, "unix:///run/petrel-agent/agent.sock");
    assert_eq!(parse(&["po", "-A"]).unwrap().resource, Resource::Pods);
    assert!(parse(&["pod"]).is_ok());
    for bad in [
        &["deployments"][..],
        &["pods", "-o", "table"],
        &["pods", "-n", "x", "-A"],
        &["pods", "--bogus"],
        &[],
    ] {
        let e = parse(bad).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
    }
    let e = Query::from_args(&parse(&["pods", "web", "-A"]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("across all namespaces"));
}

#[tokio::test]
async fn get_should_show_a_namespace_or_all() {
    let (server, _, _dir) = agent().await;
    let t = show(&server, &["pods"]).await.unwrap();
    assert!(
        t.starts_with("NAME   READY   STATUS    RESTARTS   AGE\n"),
        "{t}"
    );
    assert_eq!(names_in(&t), ["db", "web"]);
    assert!(
        t.contains("web    0/1     Running   0          <unknown>"),
        "{t}"
    );

    let t = show(&server, &["pods", "-n", "kube-system", "-o", "wide"])
        .await
        .unwrap();
    assert!(t.lines().next().unwrap().ends_with("IP       NODE"), "{t}");
    assert_eq!(names_in(&t), ["dns"]);

    let t = show(&server, &["pods", "-A"]).await.unwrap();
    assert!(t.starts_with("NAMESPACE     NAME"), "{t}");
    assert_eq!(names_in(&t), ["default", "default", "kube-system"]);

    // Nothing to show: the table is left out (the note goes to stderr).
    assert_eq!(show(&server, &["pods", "-n", "empty"]).await.unwrap(), "");
}

#[tokio::test]
async fn get_should_fetch_one_pod_or_say_not_found() {
    let (server, _, _dir) = agent().await;
    let t = show(&server, &["pods", "dns", "-n", "kube-system"])
        .await
        .unwrap();
    assert_eq!(names_in(&t), ["dns"]);
    let e = show(&server, &["pods", "x"]).await.unwrap_err();
    assert_eq!(format!("Error: {e}"), r#"Error: pods "x" not found"#);
    // A name in another namespace is not found in the default one.
    assert!(show(&server, &["pods", "dns"]).await.is_err());
}

#[tokio::test]
async fn get_should_print_json_and_yaml() {
    let (server, _, _dir) = agent().await;
    let t = show(&server, &["pods", "web", "-o", "json"]).await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    assert_eq!(v["kind"], "Pod");
    assert_eq!(v["metadata"]["name"], "web");

    let t = show(&server, &["pods", "-o", "json"]).await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    assert_eq!(v["kind"], "List");
    assert_eq!(v["items"].as_array().unwrap().len(), 2);
    assert_eq!(v["items"][0]["kind"], "Pod");

    let t = show(&server, &["pods", "web", "-o", "yaml"]).await.unwrap();
    let p: Pod = serde_yaml::from_str(&t).unwrap();
    assert_eq!(p, pod("default", "web", "Running"));
}

#[tokio::test]
async fn get_should_name_the_agent_it_cannot_reach() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let url = format!("http://{addr}");
    let e = show(&Server::parse(&url).unwrap(), &["pods"])
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("cannot reach the agent at {url}")),
        "{msg}"
    );
    assert!(matches!(
        Server::parse("https://x:1"),
        Err(HttpError::BadUrl(_))
    ));
    assert!(matches!(
        Server::parse("unix://"),
        Err(HttpError::BadUrl(_))
    ));
    let gone = "unix:///nonexistent/petrel-agent/agent.sock";
    let e = show(&Server::parse(gone).unwrap(), &["pods"])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("cannot reach the agent at {gone}")),
        "{e}"
    );
    assert!(matches!(
        Server::parse("http://x:1/api"),
        Err(HttpError::BadUrl(_))
    ));
}

/// A writer the test reads while the watch writes.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    async fn wait_for(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !self.text().contains(needle) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {needle:?} in {:?}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn watch_should_print_changes_and_reconnect() {
    let (server, store, _dir) = agent().await;
    let q = Query::from_args(&parse(&["pods", "-w"]).unwrap()).unwrap();
    let pods = fetch(&server, &q).await.unwrap();
    let mut out = Shared::default();
    let mut widths = Vec::new();
    print_initial(&mut out, &q, &pods, &mut widths).unwrap();
    let initial = out.text();
    let reader = out.clone();
    let driver = async {
        // The stream's replay of unchanged pods prints nothing.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(reader.text(), initial);
        store.upsert(pod("default", "db", "Running"));
        reader.wait_for("db     0/1     Running").await;
        // Other namespaces are not shown.
        store.upsert(pod("kube-system", "dns", "Failed"));
        store.upsert(pod("default", "new", "Pending"));
        reader.wait_for("new    0/1     Pending").await;
        assert!(!reader.text().contains("dns"));
        // Overflow the feed: the agent ends the stream, the watch lists
        // and watches again.
        for i in 0..1100 {
            store.upsert(pod("default", "busy", &format!("P{i}")));
        }
        store.remove("default", "new");
        reader.wait_for("busy   0/1     P1099").await;
        let busy = reader
            .text()
            .lines()
            .filter(|l| l.starts_with("busy"))
            .count();
        assert!(
            busy < 1100,
            "the stream did not lag ({busy} lines): nothing was skipped"
        );
        store.upsert(pod("default", "late", "Running"));
        reader.wait_for("late   0/1     Running").await;
    };
    tokio::select! {
        r = watch(&server, &q, pods, widths, &mut out) => panic!("watch ended: {r:?}"),
        _ = driver => {}
    }
}

#[tokio::test]
async fn watch_should_print_each_change_once() {
    let (server, store, _dir) = agent().await;
    store.upsert(pod("default", "web", "Pending"));
    let q = Query::from_args(&parse(&["pods", "-w"]).unwrap()).unwrap();
    let pods = fetch(&server, &q).await.unwrap();
    let mut out = Shared::default();
    let mut widths = Vec::new();
    print_initial(&mut out, &q, &pods, &mut widths).unwrap();
    let reader = out.clone();
    let lines = |r: &Shared| r.text().lines().filter(|l| l.starts_with("web")).count();
    let driver = async {
        // Changes the table does not show (an IP, a condition): no line.
        let mut p = pod("default", "web", "Pending");
        p.status.as_mut().unwrap().pod_ip = Some("10.0.0.7".into());
        store.upsert(p.clone());
        p.status.as_mut().unwrap().conditions = Some(vec![Default::default()]);
        store.upsert(p.clone());
        // A change it shows: one line.
        p.status.as_mut().unwrap().phase = Some("Running".into());
        store.upsert(p.clone());
        reader.wait_for("web    0/1     Running").await;
        // A marker pod after it: every event before it has been handled.
        store.upsert(pod("default", "zz", "Running"));
        reader.wait_for("zz").await;
        assert_eq!(lines(&reader), 2, "{}", reader.text());
    };
    tokio::select! {
        r = watch(&server, &q, pods, widths, &mut out) => panic!("watch ended: {r:?}"),
        _ = driver => {}
    }
}

/// Serves one raw HTTP answer.
async fn raw_server(answer: &'static [u8]) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
        s.write_all(answer).await.unwrap();
    });
    Server::parse(&url).unwrap()
}

#[tokio::test]
async fn http_should_read_every_body_framing() {
    let s = raw_server(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n world\n\r\n0\r\nX-Trailer: 1\r\n\r\n").await;
    let mut r = s.get("/").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body().await.unwrap(), b"hello world\n");

    let s = raw_server(b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\n\r\nabcdef").await;
    let mut r = s.get("/").await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.body().await.unwrap(), b"abc");

    let s = raw_server(b"HTTP/1.0 200 OK\r\n\r\nuntil close").await;
    assert_eq!(
        s.get("/").await.unwrap().body().await.unwrap(),
        b"until close"
    );

    let s = raw_server(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").await;
    assert!(s.get("/").await.unwrap().body().await.is_err());

    let s = raw_server(b"SSH-2.0-OpenSSH\r\n").await;
    assert!(matches!(s.get("/").await, Err(HttpError::Protocol { .. })));

    let s = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").await;
    assert!(s.get("/").await.unwrap().body().await.is_err());
}

#[test]
fn lines_should_split_across_pieces() {
    let mut l = Lines::default();
    assert!(l.push(b"{\"a\"").is_empty());
    assert_eq!(
        l.push(b":1}\n{\"b\":2}\r\n\n{"),
        vec![b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()]
    );
    assert_eq!(l.push(b"}\n"), vec![b"{}".to_vec()]);
}

#[test]
fn escape_should_keep_dns_names_and_encode_the_rest() {
    assert_eq!(escape("web-1.a"), "web-1.a");
    assert_eq!(escape("a/b c"), "a%2Fb%20c");
}
