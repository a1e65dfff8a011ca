use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::test_support::get as get_body;
use tokio::sync::oneshot;

use super::test_support::{connect, serve_both, At, Conn};
use super::*;

struct Running {
    /// The unix socket: the whole API.
    addr: At,
    /// The TCP port: health and metrics.
    tcp: At,
    store: Arc<StatusStore>,
    health: Arc<Health>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let store = Arc::new(StatusStore::new());
    let health = Arc::new(Health::new(Duration::from_secs(60)));
    let mut registry = Registry::with_prefix("kubelet");
    let c = Counter::<u64>::default();
    c.inc();
    registry.register("test_events", "a test counter", c);
    let (stop, stopped) = oneshot::channel::<()>();
    let state = ServerState {
        store: store.clone(),
        health: health.clone(),
        registry: Arc::new(registry),
        runtime: Arc::new(crate::pleg::fake::FakeRuntime::default()),
        cache: Arc::new(crate::cache::PodCache::new()),
        node: Arc::new(crate::eviction::NodeState::new()),
        node_name: "test-node".to_string(),
    };
    let (addr, tcp, dir, task) = serve_both(state, async move {
        let _ = stopped.await;
    })
    .await;
    Running {
        addr,
        tcp,
        store,
        health,
        stop: Some(stop),
        task,
        _dir: dir,
    }
}

fn pod(ns: &str, name: &str, phase: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Status, lower-cased headers and the whole body of a GET (de-chunked).
async fn get(addr: &At, path: &str) -> (u16, Vec<(String, String)>, String) {
    let (status, headers, mut r) = open(addr, path).await;
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v == "chunked");
    let mut body = Vec::new();
    if chunked {
        while let Some(chunk) = next_chunk(&mut r).await {
            body.extend(chunk);
        }
    } else {
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or(0);
        body.resize(len, 0);
        r.read_exact(&mut body).await.unwrap();
    }
    (status, headers, String::from_utf8(body).unwrap())
}

async fn open(addr: &At, path: &str) -> (u16, Vec<(String, String)>, Conn) {
    open_with(addr, path, "Host: localhost\r\n").await
}

/// A GET with these header lines (each ending in CRLF).
async fn open_with(addr: &At, path: &str, headers: &str) -> (u16, Vec<(String, String)>, Conn) {
    let mut s = connect(addr).await;
    s.write_all(format!("GET {path} HTTP/1.1\r\n{headers}\r\n").as_bytes())
        .await
        .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).await.unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    (status, headers, r)
}

/// One chunk of a chunked body; None at the end (or a closed connection).
async fn next_chunk(r: &mut Conn) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let n = usize::from_str_radix(line.trim(), 16).ok()?;
    let mut buf = vec![0; n + 2];
    r.read_exact(&mut buf).await.ok()?;
    buf.truncate(n);
    (n > 0).then_some(buf)
}

/// Reads watch events until `n` arrived.
async fn events(r: &mut Conn, pending: &mut String, n: usize) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    while out.len() < n {
        while let Some(i) = pending.find('\n') {
            let line: String = pending.drain(..=i).collect();
            out.push(serde_json::from_str(&line).unwrap());
        }
        if out.len() >= n {
            break;
        }
        let chunk = tokio::time::timeout(Duration::from_secs(5), next_chunk(r))
            .await
            .expect("watch event in time")
            .expect("stream still open");
        pending.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    out
}

fn header<'a>(h: &'a [(String, String)], k: &str) -> &'a str {
    h.iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

#[tokio::test]
async fn healthz_should_report_ok_or_the_reasons() {
    let s = start().await;
    s.health.relisted();
    let (code, _, body) = get(&s.tcp, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    s.health
        .set_runtime_error(Some("connection refused".into()));
    let (code, _, body) = get(&s.tcp, "/healthz").await;
    assert_eq!(code, 500);
    assert_eq!(body, "container runtime is down: connection refused\n");
}

#[tokio::test]
async fn metrics_should_be_openmetrics_text() {
    let s = start().await;
    let (code, h, body) = get(&s.tcp, "/metrics").await;
    assert_eq!(code, 200);
    assert!(header(&h, "content-type").starts_with("application/openmetrics-text"));
    assert!(body.contains("kubelet_test_events_total 1"), "{body}");
    assert!(body.ends_with("# EOF\n"));
}

#[tokio::test]
async fn pods_should_list_and_get_like_the_api_server() {
    let s = start().await;
    s.store.upsert(pod("default", "b", "Running"));
    s.store.upsert(pod("kube-system", "a", "Pending"));
    let (code, h, body) = get(&s.addr, "/pods").await;
    assert_eq!(code, 200);
    assert_eq!(header(&h, "content-type"), "application/json");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "PodList");
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["metadata"], serde_json::json!({}));
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["kind"], "Pod");
    assert_eq!(items[0]["apiVersion"], "v1");
    assert_eq!(items[0]["metadata"]["name"], "b");
    assert_eq!(items[1]["status"]["phase"], "Pending");

    let (code, _, body) = get(&s.addr, "/pods/kube-system/a").await;
    assert_eq!(code, 200);
    let p: Pod = serde_json::from_str(&body).unwrap();
    assert_eq!(p, pod("kube-system", "a", "Pending"));

    let (code, _, body) = get(&s.addr, "/pods/default/x").await;
    assert_eq!(code, 404);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["status"], "Failure");
    assert_eq!(v["message"], "pods \"x\" not found");
    assert_eq!(v["reason"], "NotFound");
    assert_eq!(v["code"], 404);

    let (code, _, _) = get(&s.addr, "/nope").await;
    assert_eq!(code, 404);
    let (code, _, _) = get(&s.addr, "/pods/a/b/c").await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn watch_should_stream_current_pods_then_changes() {
    let s = start().await;
    s.store.upsert(pod("default", "a", "Pending"));
    for q in ["watch=true", "watch=1"] {
        let (code, h, mut r) = open(&s.addr, &format!("/pods?{q}")).await;
        assert_eq!(code, 200);
        assert_eq!(header(&h, "transfer-encoding"), "chunked");
        let mut pending = String::new();
        let ev = events(&mut r, &mut pending, 1).await;
        assert_eq!(ev[0]["type"], "ADDED");
        assert_eq!(ev[0]["object"]["metadata"]["name"], "a");
        assert_eq!(ev[0]["object"]["kind"], "Pod");
    }

    let (_, _, mut r) = open(&s.addr, "/pods?watch=true").await;
    let mut pending = String::new();
    events(&mut r, &mut pending, 1).await;
    s.store.upsert(pod("default", "a", "Running"));
    s.store.upsert(pod("default", "b", "Pending"));
    s.store.remove("default", "a");
    let ev = events(&mut r, &mut pending, 3).await;
    let got: Vec<(String, String)> = ev
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(ev[0]["object"]["status"]["phase"], "Running");
}

#[tokio::test]
async fn watch_should_end_when_the_watcher_lags() {
    let s = start().await;
    let (_, _, mut r) = open(&s.addr, "/pods?watch=true").await;
    // The watcher's subscription exists once the response head arrived;
    // overflow the feed (1024) before it reads anything.
    for i in 0..1100 {
        s.store.upsert(pod("default", "a", &format!("P{i}")));
    }
    let mut n = 0;
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while next_chunk(&mut r).await.is_some() {
            n += 1;
        }
    })
    .await;
    assert!(ended.is_ok(), "stream did not end");
    assert!(n < 1100, "got {n} events of 1100");
}

#[tokio::test]
async fn serve_should_stop_on_shutdown_even_with_open_watches() {
    let mut s = start().await;
    let (_, _, mut r) = open(&s.addr, "/pods?watch=true").await;
    s.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), &mut s.task)
        .await
        .expect("server stopped")
        .unwrap()
        .unwrap();
    // The watch ended cleanly (terminating chunk or close).
    assert!(
        tokio::time::timeout(Duration::from_secs(1), next_chunk(&mut r))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn tcp_should_serve_health_and_metrics_only() {
    let s = start().await;
    s.health.relisted();
    s.store.upsert(pod("default", "secret-pod", "Running"));
    for path in ["/healthz", "/metrics"] {
        let (code, _, body) = get(&s.tcp, path).await;
        assert_eq!(code, 200, "{path}: {body}");
        assert!(!body.contains("secret-pod"), "{path}: {body}");
    }
    for path in [
        "/pods",
        "/pods?watch=true",
        "/pods/default/secret-pod",
        "/node",
        "/stats/summary",
        "/containerLogs/default/secret-pod/c",
        "/exec/default/secret-pod/c?command=id&output=1",
        "/attach/default/secret-pod/c?output=1",
        "/portForward/default/secret-pod?port=80",
        "/nope",
    ] {
        let (code, body) = get_body(&s.tcp, path).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(!body.contains("Running"), "{path}: {body}");
        assert!(body.contains("agent.sock"), "{path}: {body}");
    }
    // The same on the socket.
    let (code, _, body) = get(&s.addr, "/pods/default/secret-pod").await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn tcp_should_refuse_other_hosts_and_origins() {
    let s = start().await;
    s.health.relisted();
    for host in ["127.0.0.1", "localhost:10255", "[::1]:1"] {
        let (code, _, _) = open_with(&s.tcp, "/healthz", &format!("Host: {host}\r\n")).await;
        assert_eq!(code, 200, "{host}");
    }
    // DNS rebinding: a page's own name pointed at 127.0.0.1.
    let (code, _, _) = open_with(&s.tcp, "/metrics", "Host: evil.example:10255\r\n").await;
    assert_eq!(code, 403);
    let (code, _, _) = open_with(
        &s.tcp,
        "/metrics",
        "Host: 127.0.0.1\r\nOrigin: http://evil.example\r\n",
    )
    .await;
    assert_eq!(code, 403);
    // The socket checks no Host (no browser reaches it), but Origin.
    let (code, _, _) = open_with(&s.addr, "/pods", "Host: anything\r\n").await;
    assert_eq!(code, 200);
    let (code, _, _) = open_with(
        &s.addr,
        "/pods",
        "Host: localhost\r\nOrigin: http://evil.example\r\n",
    )
    .await;
    assert_eq!(code, 403);
}
