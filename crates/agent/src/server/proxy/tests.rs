//! The proxy against a small upstream HTTP server in the test: it records
//! the request it got, answers 101 and echoes bytes (or refuses).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::wants_upgrade;
use crate::server::test_support::{get, head, send, start, At, Instance, TestServer};

/// An upstream that serves one connection: sends the request head it
/// received on the channel, then answers `answer` and, if that is a 101,
/// echoes every byte until the peer closes.
async fn upstream(answer: &'static str) -> (SocketAddr, oneshot::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut r = BufReader::new(s);
        let mut headers = String::new();
        loop {
            let mut line = String::new();
            r.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            headers.push_str(&line);
        }
        let _ = tx.send(headers);
        r.get_mut().write_all(answer.as_bytes()).await.unwrap();
        if answer.starts_with("HTTP/1.1 101") {
            let mut buf = [0u8; 1024];
            loop {
                let n = r.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                r.get_mut().write_all(&buf[..n]).await.unwrap();
            }
        }
    });
    (addr, rx)
}

const SWITCH: &str = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n";

async fn server_with_running(uid: &str) -> (TestServer, String, String) {
    let s = start().await;
    let (sb, id) = s.run_container(uid, "app").await;
    s.put_pod(
        uid,
        &["app"],
        Some(&sb),
        &[Instance {
            id: id.clone(),
            name: "app".into(),
            restart_count: 0,
            running: true,
            log_path: String::new(),
        }],
    );
    (s, sb, id)
}

fn upgrade_request(method: &str, path: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: v3.channel.k8s.io\r\n\r\n"
    )
}

#[test]
fn upgrade_detection_should_need_both_headers() {
    let mut h = axum::http::HeaderMap::new();
    h.insert("connection", "keep-alive, Upgrade".parse().unwrap());
    assert!(!wants_upgrade(&h));
    h.insert("upgrade", "websocket".parse().unwrap());
    assert!(wants_upgrade(&h));
    h.insert("connection", "close".parse().unwrap());
    assert!(!wants_upgrade(&h));
}

#[tokio::test]
async fn exec_should_proxy_the_upgrade_and_copy_bytes_both_ways() {
    let (s, _, id) = server_with_running("u1").await;
    let (up, seen) = upstream(SWITCH).await;
    s.rt.set_stream_base(&format!("http://{up}"));
    let mut c = send(
        &s.addr,
        &upgrade_request(
            "POST",
            "/exec/ns/p/app?command=sh&command=-c&command=true&input=1&output=1&tty=1",
        ),
    )
    .await;
    let (code, headers) = head(&mut c).await;
    assert_eq!(code, 101);
    assert!(
        headers.contains(&("upgrade".into(), "SPDY/3.1".into())),
        "{headers:?}"
    );
    assert!(
        headers.contains(&(
            "x-stream-protocol-version".into(),
            "v4.channel.k8s.io".into()
        )),
        "{headers:?}"
    );
    let req = seen.await.unwrap();
    assert!(
        req.starts_with(&format!("POST /exec/{id} HTTP/1.1\r\n")),
        "{req}"
    );
    let lower = req.to_ascii_lowercase();
    assert!(lower.contains("connection: upgrade"), "{req}");
    assert!(lower.contains("upgrade: spdy/3.1"), "{req}");
    assert!(
        lower.contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{req}"
    );
    assert!(
        lower.contains("x-stream-protocol-version: v3.channel.k8s.io"),
        "{req}"
    );
    assert!(lower.contains(&format!("host: {up}")), "{req}");

    for msg in [&b"hello"[..], b"\x00\x01binary\xff"] {
        c.get_mut().write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg);
    }
    // Closing our side closes the upstream, which closes the rest.
    c.get_mut().shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn attach_and_port_forward_should_go_to_their_urls() {
    let (s, sb, id) = server_with_running("u2").await;
    let (up, seen) = upstream(SWITCH).await;
    s.rt.set_stream_base(&format!("http://{up}"));
    let mut c = send(
        &s.addr,
        &upgrade_request("GET", "/attach/ns/p/app?output=1&error=1"),
    )
    .await;
    assert_eq!(head(&mut c).await.0, 101);
    assert!(seen
        .await
        .unwrap()
        .starts_with(&format!("GET /attach/{id} ")));

    let (up, seen) = upstream(SWITCH).await;
    s.rt.set_stream_base(&format!("http://{up}"));
    let mut c = send(
        &s.addr,
        &upgrade_request("POST", "/portForward/ns/p?port=8080"),
    )
    .await;
    assert_eq!(head(&mut c).await.0, 101);
    assert!(seen
        .await
        .unwrap()
        .starts_with(&format!("POST /portforward/{sb} ")));
}

#[tokio::test]
async fn a_refusal_should_be_relayed_with_its_status_and_body() {
    let (s, _, _) = server_with_running("u3").await;
    let (up, _seen) = upstream(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nnope\n",
    )
    .await;
    s.rt.set_stream_base(&format!("http://{up}"));
    let mut c = send(
        &s.addr,
        &upgrade_request("GET", "/exec/ns/p/app?command=ls&output=1"),
    )
    .await;
    let (code, headers) = head(&mut c).await;
    assert_eq!(code, 403);
    assert!(
        headers.contains(&("content-type".into(), "text/plain".into())),
        "{headers:?}"
    );
    let mut body = [0u8; 5];
    c.read_exact(&mut body).await.unwrap();
    assert_eq!(&body, b"nope\n");
}

async fn status_of(addr: &At, req: &str) -> (u16, String) {
    let mut c = send(addr, req).await;
    let (code, headers) = head(&mut c).await;
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).await.unwrap();
    (code, String::from_utf8(body).unwrap())
}

#[tokio::test]
async fn errors_should_map_to_kubelet_statuses() {
    let (s, _, _) = server_with_running("u4").await;
    let exec = |path: &str| upgrade_request("POST", path);
    let cases = [
        ("/exec/ns/ghost/app?command=ls&output=1", 404, "ns/ghost"),
        ("/exec/ns/p/ghost?command=ls&output=1", 404, "ghost"),
        ("/exec/ns/p/app?output=1", 400, "command"),
        ("/exec/ns/p/app?command=ls", 400, "at least 1"),
        ("/exec/ns/p/app?command=ls&output=maybe", 400, "output"),
        ("/portForward/ns/p?port=0", 400, "port"),
        ("/portForward/ns/ghost", 404, "ns/ghost"),
    ];
    for (path, code, text) in cases {
        let (got, body) = status_of(&s.addr, &exec(path)).await;
        assert_eq!(got, code, "{path}: {body}");
        assert!(body.contains(text), "{path}: {body}");
    }
    // Without an upgrade the request is refused before the runtime is asked.
    let (code, body) = get(&s.addr, "/exec/ns/p/app?command=ls&output=1").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("upgrade"), "{body}");
    // The runtime's errors.
    s.rt.fail("exec", Some(tonic::Code::Unimplemented));
    let (code, body) = status_of(&s.addr, &exec("/exec/ns/p/app?command=ls&output=1")).await;
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("Unimplemented"), "{body}");
    s.rt.fail("exec", Some(tonic::Code::NotFound));
    let (code, _) = status_of(&s.addr, &exec("/exec/ns/p/app?command=ls&output=1")).await;
    assert_eq!(code, 404);
    s.rt.fail("exec", None);
    // A streaming server that is not there.
    s.rt.set_stream_base("http://127.0.0.1:1");
    let (code, body) = status_of(&s.addr, &exec("/exec/ns/p/app?command=ls&output=1")).await;
    assert_eq!(code, 502, "{body}");
    // A container that is not running.
    s.put_pod(
        "u4",
        &["app"],
        Some("sb"),
        &[Instance {
            id: "gone".into(),
            name: "app".into(),
            restart_count: 0,
            running: false,
            log_path: String::new(),
        }],
    );
    let (code, body) = status_of(&s.addr, &exec("/attach/ns/p/app?output=1")).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("not running"), "{body}");
}

/// A WebSocket upgrade as a browser sends it: with an Origin.
fn browser_upgrade(path: &str, host: &str, origin: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
    )
}

#[tokio::test]
async fn a_cross_origin_upgrade_should_be_refused_before_the_runtime_is_asked() {
    let (s, _, _) = server_with_running("u5").await;
    let (up, seen) = upstream(SWITCH).await;
    s.rt.set_stream_base(&format!("http://{up}"));
    let path = "/exec/ns/p/app?command=id&output=1";
    let (code, body) = status_of(
        &s.addr,
        &browser_upgrade(path, "localhost", "http://evil.example"),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("cross-origin"), "{body}");
    // Over TCP: no exec at all, whatever the origin.
    for origin in ["http://evil.example", "http://127.0.0.1"] {
        let (code, body) = status_of(&s.tcp, &browser_upgrade(path, "127.0.0.1", origin)).await;
        assert_eq!(code, 403, "{origin}: {body}");
    }
    let (code, body) = status_of(&s.tcp, &upgrade_request("POST", path)).await;
    assert_eq!(code, 403, "{body}");
    // The upstream was never reached.
    let mut seen = seen;
    assert!(matches!(
        seen.try_recv(),
        Err(oneshot::error::TryRecvError::Empty)
    ));
    // A same-origin request passes, and its Origin stays with the agent.
    let mut c = send(
        &s.addr,
        &browser_upgrade(path, "localhost", "http://localhost"),
    )
    .await;
    assert_eq!(head(&mut c).await.0, 101);
    let req = seen.await.unwrap().to_ascii_lowercase();
    assert!(!req.contains("origin:"), "{req}");
    assert!(req.contains("upgrade: websocket"), "{req}");
}
