//! Interoperability with a real Kubernetes client: `kubectl exec` (client-go's
//! WebSocket v5 executor, and its SPDY executor) against the streaming
//! server, through a minimal stand-in for the API server that answers the
//! pod lookup and turns the exec request into a streaming URL, as kubelet
//! does. kubectl is the peer `make peers` builds, found as every peer is
//! (`PETREL_PEER_KUBECTL`, else `$PETREL_PEERS_BIN/kubectl`): missing, it
//! fails the tests, unless `PETREL_PEERS_SKIP` names `kubernetes` or
//! `kubectl` (then they skip, saying so).

use std::process::Stdio;
use std::sync::Arc;

use petrel_stream::{
    AttachSpec, BackendError, ExecSpec, StreamBackend, StreamConfig, StreamIo, StreamServer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Runs commands with `/bin/sh`, as the round-trip tests' backend does.
struct ShellBackend;

#[async_trait::async_trait]
impl StreamBackend for ShellBackend {
    async fn exec(&self, spec: ExecSpec, io: StreamIo) -> Result<i32, BackendError> {
        let (prog, args) = spec
            .cmd
            .split_first()
            .ok_or_else(|| BackendError::Internal("empty command".into()))?;
        let mut child = tokio::process::Command::new(prog)
            .args(args)
            .stdin(if io.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| BackendError::CommandFailed {
                message: e.to_string(),
                exit_code: 127,
            })?;
        if let (Some(mut from), Some(mut to)) = (io.stdin, child.stdin.take()) {
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from, &mut to).await;
            });
        }
        let mut copies = Vec::new();
        if let (Some(mut from), Some(mut to)) = (child.stdout.take(), io.stdout) {
            copies.push(tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from, &mut to).await;
                let _ = to.shutdown().await;
            }));
        }
        if let (Some(mut from), Some(mut to)) = (child.stderr.take(), io.stderr) {
            copies.push(tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from, &mut to).await;
                let _ = to.shutdown().await;
            }));
        }
        let status = child
            .wait()
            .await
            .map_err(|e| BackendError::Internal(e.to_string()))?;
        for c in copies {
            let _ = c.await;
        }
        Ok(status.code().unwrap_or(128))
    }

    async fn attach(&self, _spec: AttachSpec, _io: StreamIo) -> Result<(), BackendError> {
        Err(BackendError::FailedPrecondition("no attach here".into()))
    }

    async fn port_forward(&self, _pod: &str, port: u16) -> Result<TcpStream, BackendError> {
        TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| BackendError::Internal(e.to_string()))
    }
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default","uid":"u1"},"spec":{"containers":[{"name":"c","image":"busybox"}]},"status":{"phase":"Running"}}"#;

/// Sends the request on to the streaming server with `path` in place of
/// the API server's, then copies both ways (as kubelet's proxy does).
async fn splice(
    mut c: TcpStream,
    server: &StreamServer,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) {
    let mut upstream = TcpStream::connect(server.local_addr())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let rewritten = format!("{method} {path} HTTP/1.1{headers}");
    let _ = upstream.write_all(rewritten.as_bytes()).await;
    let _ = upstream.write_all(body).await;
    let _ = tokio::io::copy_bidirectional(&mut c, &mut upstream).await;
}

/// The transports kubectl chose (`Upgrade:` headers), one log per test's
/// server, so tests sharing a process (`cargo test`) never see each other's.
#[derive(Clone, Default)]
struct Upgrades(Arc<std::sync::Mutex<Vec<String>>>);

impl Upgrades {
    fn push(&self, upgrade: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(upgrade.to_owned());
    }

    fn seen(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

const VERSION: &str =
    r#"{"major":"1","minor":"32","gitVersion":"v1.32.0","platform":"linux/amd64"}"#;

// Just enough discovery for kubectl to find pods and their subresources.
const API: &str = r#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"127.0.0.1"}]}"#;
const APIS: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#;
const API_V1: &str = r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"pods","singularName":"pod","namespaced":true,"kind":"Pod","verbs":["get","list"],"shortNames":["po"]},{"name":"pods/exec","singularName":"","namespaced":true,"kind":"PodExecOptions","verbs":["create","get"]},{"name":"pods/portforward","singularName":"","namespaced":true,"kind":"PodPortForwardOptions","verbs":["create","get"]}]}"#;

/// One API server connection: the pod lookup, or an exec request turned
/// into the streaming server's URL and spliced through to it.
async fn serve(mut c: TcpStream, server: Arc<StreamServer>, upgrades: Upgrades) {
    let mut head = Vec::new();
    let mut tmp = [0u8; 4096];
    let end = loop {
        let n = match c.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        head.extend_from_slice(&tmp[..n]);
        if let Some(p) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let line = text.lines().next().unwrap_or_default().to_owned();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let params: Vec<(String, String)> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), unescape(v)))
        .collect();
    let flag = |name: &str| {
        params
            .iter()
            .any(|(k, v)| k == name && (v == "true" || v == "1"))
    };
    let upgrade = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("upgrade:"))
        .map(|l| l[8..].trim().to_ascii_lowercase())
        .unwrap_or_default();
    if path.ends_with("/pods/p/portforward") {
        let url = server
            .port_forward_url("p".into(), Vec::new())
            .unwrap_or_else(|e| panic!("port_forward_url: {e}"));
        let token_path = url
            .split_once("/portforward/")
            .map(|(_, t)| format!("/portforward/{t}"))
            .unwrap_or_default();
        splice(
            c,
            &server,
            method,
            &token_path,
            &text[line.len()..end],
            &head[end..],
        )
        .await;
        return;
    }
    if path.ends_with("/pods/p/exec") {
        // Which transport kubectl chose, for the test to check.
        upgrades.push(&upgrade);
        let cmd = params
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        let url = server
            .exec_url(ExecSpec {
                container_id: "c".into(),
                cmd,
                tty: flag("tty"),
                stdin: flag("stdin"),
                stdout: flag("stdout"),
                stderr: flag("stderr"),
            })
            .unwrap_or_else(|e| panic!("exec_url: {e}"));
        let token_path = url
            .split_once("/exec/")
            .map(|(_, t)| format!("/exec/{t}"))
            .unwrap_or_default();
        splice(
            c,
            &server,
            method,
            &token_path,
            &text[line.len()..end],
            &head[end..],
        )
        .await;
        return;
    }
    let (status, body) = if method == "GET" && path == "/api/v1/namespaces/default/pods/p" {
        ("200 OK", POD.to_owned())
    } else if method == "GET" && path == "/api" {
        ("200 OK", API.to_owned())
    } else if method == "GET" && path == "/apis" {
        ("200 OK", APIS.to_owned())
    } else if method == "GET" && path == "/api/v1" {
        ("200 OK", API_V1.to_owned())
    } else if method == "GET" && path == "/version" {
        ("200 OK", VERSION.to_owned())
    } else {
        eprintln!("fake API server: unexpected {line}");
        (
            "404 Not Found",
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#
                .to_owned(),
        )
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = c.write_all(resp.as_bytes()).await;
}

async fn setup() -> (Arc<StreamServer>, tempdir::Dir, Upgrades) {
    let server = Arc::new(
        StreamServer::bind(StreamConfig::default(), Arc::new(ShellBackend))
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let api = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let port = api.local_addr().map(|a| a.port()).unwrap_or_default();
    let s = server.clone();
    let upgrades = Upgrades::default();
    let log = upgrades.clone();
    tokio::spawn(async move {
        while let Ok((c, _)) = api.accept().await {
            tokio::spawn(serve(c, s.clone(), log.clone()));
        }
    });
    let dir = tempdir::Dir::new();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: default\ncurrent-context: x\n"
    );
    std::fs::write(dir.path.join("kubeconfig"), kubeconfig).unwrap_or_else(|e| panic!("{e}"));
    (server, dir, upgrades)
}

/// A private temporary directory, removed on drop.
mod tempdir {
    pub struct Dir {
        pub path: std::path::PathBuf,
    }
    impl Dir {
        pub fn new() -> Dir {
            let mut raw = [0u8; 8];
            let _ = getrandom::getrandom(&mut raw);
            let name: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            let path = std::env::temp_dir().join(format!("petrel-stream-kubectl-{name}"));
            std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("{e}"));
            Dir { path }
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The kubectl to run, or None (after saying why) when it was left out.
fn kubectl_bin() -> Option<std::path::PathBuf> {
    if let Some(c) = ["kubernetes", "kubectl"]
        .into_iter()
        .find(|c| petrel_testkit::peers::left_out(c))
    {
        eprintln!("skipped: {c} left out (PETREL_PEERS_SKIP)");
        return None;
    }
    Some(petrel_testkit::peers::peer_binary("kubectl").unwrap_or_else(|e| panic!("{e}")))
}

async fn kubectl(
    bin: &std::path::Path,
    dir: &tempdir::Dir,
    websocket: bool,
    stdin: Option<&[u8]>,
    args: &[&str],
) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--kubeconfig")
        .arg(dir.path.join("kubeconfig"))
        .args(args)
        .env(
            "KUBECTL_REMOTE_COMMAND_WEBSOCKETS",
            if websocket { "true" } else { "false" },
        )
        .env("HOME", &dir.path)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("kubectl: {e}"));
    if let (Some(data), Some(mut w)) = (stdin, child.stdin.take()) {
        w.write_all(data).await.unwrap_or_else(|e| panic!("{e}"));
        drop(w);
    }
    tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl hung"))
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn exec_round_trip(websocket: bool) {
    let Some(bin) = kubectl_bin() else {
        return;
    };
    let (server, dir, upgrades) = setup().await;
    let out = kubectl(
        &bin,
        &dir,
        websocket,
        None,
        &[
            "exec",
            "p",
            "--",
            "/bin/sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "stdout {stdout:?} stderr {stderr:?}"
    );
    assert_eq!(stdout, "out\n");
    assert!(stderr.starts_with("err\n"), "{stderr:?}");
    let out = kubectl(
        &bin,
        &dir,
        websocket,
        Some(b"from stdin\n"),
        &["exec", "-i", "p", "--", "cat"],
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from stdin\n",
        "stderr {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
    let want = if websocket { "websocket" } else { "spdy/3.1" };
    let used = upgrades.seen();
    assert_eq!(used.len(), 2, "{used:?}");
    assert!(used.iter().all(|u| u == want), "{used:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn kubectl_exec_over_websocket() {
    exec_round_trip(true).await;
}

#[tokio::test]
async fn kubectl_exec_over_spdy() {
    exec_round_trip(false).await;
}

#[tokio::test]
async fn kubectl_port_forward_over_spdy() {
    use tokio::io::AsyncBufReadExt;

    let Some(bin) = kubectl_bin() else {
        return;
    };
    let (server, dir, _) = setup().await;
    // The pod's port: an echo server.
    let echo = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let port = echo.local_addr().map(|a| a.port()).unwrap_or_default();
    tokio::spawn(async move {
        while let Ok((s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let mut child = tokio::process::Command::new(&bin)
        .arg("--kubeconfig")
        .arg(dir.path.join("kubeconfig"))
        .args(["port-forward", "pod/p", &format!(":{port}")])
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")
        .env("HOME", &dir.path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // "Forwarding from 127.0.0.1:LOCAL -> PORT"
    let local = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if let Some(rest) = l.strip_prefix("Forwarding from 127.0.0.1:") {
                return rest.split(' ').next().and_then(|p| p.parse::<u16>().ok());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_else(|| panic!("kubectl did not start forwarding"));
    for round in 0..3 {
        let mut c = TcpStream::connect(("127.0.0.1", local))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let msg = format!("round {round} through kubectl");
        c.write_all(msg.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, msg.as_bytes());
    }
    let _ = child.kill().await;
    server.shutdown().await;
}
