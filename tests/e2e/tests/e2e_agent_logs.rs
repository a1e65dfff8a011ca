//! End-to-end: the agent's kubelet endpoints on a real `petrel runtime`
//! with real runc containers: `/containerLogs` (plain, tailLines,
//! timestamps, follow, previous, 404s), exec proxied to the runtime's
//! streaming server over WebSocket and SPDY (on the agent's unix socket;
//! its plain TCP port refuses them), and the exposure rule (a
//! non-loopback `--listen` refused without client-certificate TLS,
//! accepted with it, a client without a certificate refused).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use petrel_testkit::agent::{container_status, running, Agent};
use petrel_testkit::prelude::{petrel_bin, Node, BUSYBOX};

const T: Duration = Duration::from_secs(60);

/// Polls `path` until its body satisfies `f`.
fn wait_body(agent: &Agent, path: &str, what: &str, f: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < T {
        if let Some((200, body)) = agent.get(path) {
            if f(&body) {
                return body;
            }
            last = Some(body);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "{path}: not {what} within {T:?}; last: {last:?}\n{}",
        agent.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn container_logs_should_serve_plain_tail_timestamps_follow_and_previous() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &["--backoff-initial", "1s"]);
    let out = node.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Prints three lines, waits for /out/go, prints a fourth and fails.
    let script = "echo one; echo two; echo three >&2; while [ ! -f /out/go ]; do sleep 0.1; done; rm /out/go; echo four; sleep 0.3; exit 1";
    agent.write_manifest(
        "logs.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: logs\n  namespace: default\nspec:\n  volumes:\n  - name: out\n    hostPath:\n      path: {}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - name: out\n      mountPath: /out\n",
            out.display()
        ),
    );
    agent.wait_pod("default", "logs", T, "running", |p| running(p, "app"));
    let base = "/containerLogs/default/logs/app";
    let all = wait_body(&agent, base, "three lines", |b| b.contains("three"));
    assert_eq!(all, "one\ntwo\nthree\n");
    assert_eq!(
        agent.get(&format!("{base}?tailLines=1")),
        Some((200, "three\n".into()))
    );
    let (code, ts) = agent.get(&format!("{base}?timestamps=true")).unwrap();
    assert_eq!(code, 200);
    for (line, text) in ts.lines().zip(["one", "two", "three"]) {
        let (stamp, rest) = line.split_once(' ').unwrap();
        assert_eq!(rest, text, "{ts}");
        assert!(
            stamp.len() >= 20 && stamp.ends_with('Z') && stamp.contains('T'),
            "{ts}"
        );
    }
    assert_eq!(
        agent.get(&format!("{base}?limitBytes=5")),
        Some((200, "one\nt".into()))
    );

    // follow: the lines so far, then a line written later, then the end
    // of the stream when the container exits.
    let mut s = UnixStream::connect(&agent.socket).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "GET {base}?follow=true HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("three") {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    std::fs::write(out.join("go"), "").unwrap();
    let start = Instant::now();
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        assert!(start.elapsed() < T, "follow did not end");
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("four"), "{text}");
    let four = text.find("four").unwrap();
    assert!(text.find("three").unwrap() < four, "{text}");

    // previous: after the restart, the first instance's output.
    agent.wait_pod("default", "logs", T, "restarted and running", |p| {
        running(p, "app")
            && container_status(p, "app").is_some_and(|c| c["restartCount"].as_i64() >= Some(1))
    });
    let prev = wait_body(
        &agent,
        &format!("{base}?previous=true"),
        "the first run",
        |b| b.contains("four"),
    );
    assert_eq!(prev, "one\ntwo\nthree\nfour\n");
    let cur = wait_body(&agent, base, "the second run", |b| b.contains("three"));
    assert_eq!(cur, "one\ntwo\nthree\n");

    // exec, attach, port-forward resolve the pod on the real runtime: unknown
    // names are 404 before the runtime is asked; for the running
    // container the runtime's answer decides (a 101 from its streaming
    // server, or its error as kubelet's status: 500 for UNIMPLEMENTED).
    for (path, want) in [
        ("/exec/default/nope/app?command=true&output=1", Some(404)),
        ("/exec/default/logs/nope?command=true&output=1", Some(404)),
        ("/exec/default/logs/app?output=1", Some(400)),
        ("/exec/default/logs/app?command=true&output=1", None),
        ("/attach/default/logs/app?output=1", None),
        ("/portForward/default/logs?port=80", None),
    ] {
        let (code, head) = upgrade(UnixStream::connect(&agent.socket).unwrap(), path);
        match want {
            Some(w) => assert_eq!(code, w, "{path}: {head}"),
            None => assert_eq!(code, 101, "{path}: {head}"),
        }
    }

    // The TCP port serves none of it.
    let (code, head) = upgrade(
        TcpStream::connect(("127.0.0.1", agent.port)).unwrap(),
        "/exec/default/logs/app?command=true&output=1",
    );
    assert_eq!(code, 403, "{head}");

    // A whole exec session through the agent's proxy, over both transports
    // (the client speaks TCP: a local bridge carries it to the socket).
    let bridge = petrel_testkit::agent::tcp_bridge(&agent.socket).await;
    for transport in [
        petrel_stream::client::Transport::WebSocket,
        petrel_stream::client::Transport::Spdy,
    ] {
        let url = format!(
            "http://127.0.0.1:{bridge}/exec/default/logs/app?command=sh&command=-c&command=echo%20via-agent%3B%20exit%205&output=1&error=1",
        );
        let opts = petrel_stream::client::CommandOptions {
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
            transport,
        };
        let mut rc = petrel_stream::client::remote_command(&url, opts)
            .await
            .unwrap_or_else(|e| panic!("{transport:?}: {e}"));
        let mut out = String::new();
        if let Some(mut r) = rc.stdout.take() {
            tokio::io::AsyncReadExt::read_to_string(&mut r, &mut out)
                .await
                .unwrap();
        }
        drop(rc.stderr.take());
        assert_eq!(out, "via-agent\n", "{transport:?}");
        match rc.wait().await.unwrap() {
            petrel_stream::client::Outcome::Exited { code, .. } => assert_eq!(code, 5),
            o => panic!("{transport:?}: {o:?}"),
        }
    }

    for path in [
        "/containerLogs/default/nope/app",
        "/containerLogs/default/logs/nope",
    ] {
        let (code, body) = agent.get(path).unwrap();
        assert_eq!(code, 404, "{path}: {body}");
        assert!(body.contains("nope"), "{path}: {body}");
    }
    let (code, body) = agent.get(&format!("{base}?tailLines=many")).unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("tailLines"), "{body}");
}

/// A connection to the agent that can time out its reads.
trait Conn: Read + Write {
    fn set_timeout(&self, t: Duration);
}
impl Conn for TcpStream {
    fn set_timeout(&self, t: Duration) {
        self.set_read_timeout(Some(t)).unwrap();
    }
}
impl Conn for UnixStream {
    fn set_timeout(&self, t: Duration) {
        self.set_read_timeout(Some(t)).unwrap();
    }
}

/// Sends an upgrade request (SPDY, as kubectl does) on `s`; returns the
/// status and what was read of the answer.
fn upgrade(mut s: impl Conn, path: &str) -> (u16, String) {
    let protocol = if path.starts_with("/portForward") {
        "portforward.k8s.io"
    } else {
        "v4.channel.k8s.io"
    };
    s.set_timeout(Duration::from_secs(10));
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {protocol}\r\n\r\n"
    )
    .unwrap();
    // The head, then (unless the connection switched protocols) the body
    // as long as its Content-Length says.
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        let n = s.read(&mut buf).unwrap_or(0);
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            if n == 0 {
                break;
            }
            continue;
        };
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if n == 0 || head.starts_with("http/1.1 101") || body.len() >= len {
            break;
        }
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// A `petrel agent` started by hand (the harness's waits on plain HTTP).
struct RawAgent(std::process::Child);

impl Drop for RawAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent_cmd(dir: &Path, listen: &str, extra: &[&str]) -> Command {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let mut c = Command::new(petrel_bin());
    c.arg("agent")
        .args([
            "--runtime-endpoint",
            &format!("unix://{}", dir.join("none.sock").display()),
        ])
        .arg("--manifests")
        .arg(&manifests)
        .arg("--root")
        .arg(dir.join("root"))
        .args(["--listen", listen])
        .arg("--agent-socket")
        .arg(dir.join("agent/agent.sock"))
        .args(["--node-name", "tls-test"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn non_loopback_listen_should_be_refused_without_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("0.0.0.0:{}", free_port());
    let out = agent_cmd(dir.path(), &listen, &[]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to serve on"), "{err}");
    assert!(err.contains("--client-ca-file"), "{err}");
    // A missing file is named with its flag.
    let absent = dir.path().join("absent.pem");
    let absent = absent.to_str().unwrap();
    let out = agent_cmd(
        dir.path(),
        &listen,
        &[
            "--tls-cert-file",
            absent,
            "--tls-private-key-file",
            absent,
            "--client-ca-file",
            absent,
        ],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tls-cert-file") && err.contains("absent.pem"),
        "{err}"
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`name`-ca.pem/key) and, signed by it, certificates for `leaves`
/// (file stem, extension lines).
fn make_ca(dir: &Path, name: &str, leaves: &[(&str, &str)]) {
    let ca = format!("{name}-ca");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
            "-days",
            "1",
            "-subj",
            &format!("/CN={ca}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    for (leaf, ext) in leaves {
        std::fs::write(dir.join(format!("{leaf}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{leaf}.key"),
                "-out",
                &format!("{leaf}.csr"),
                "-subj",
                &format!("/CN={leaf}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{leaf}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-out",
                &format!("{leaf}.pem"),
                "-days",
                "1",
                "-extfile",
                &format!("{leaf}.ext"),
            ],
        );
    }
}

/// curl's HTTP status for `url` (0 when the connection failed).
fn curl(dir: &Path, url: &str, cert: Option<&str>) -> (u16, String) {
    let mut c = Command::new("curl");
    c.current_dir(dir).args([
        "-sS",
        "--max-time",
        "10",
        "--cacert",
        "good-ca.pem",
        "-o",
        "body",
        "-w",
        "%{http_code}",
    ]);
    if let Some(stem) = cert {
        c.args([
            "--cert",
            &format!("{stem}.pem"),
            "--key",
            &format!("{stem}.key"),
        ]);
    }
    let out = c.arg(url).output().expect("curl");
    let code = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    let body = std::fs::read_to_string(dir.join("body")).unwrap_or_default();
    let _ = std::fs::remove_file(dir.join("body"));
    (
        code,
        format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn tls_with_client_ca_should_require_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_ca(
        d,
        "good",
        &[
            (
                "server",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ],
    );
    make_ca(d, "other", &[("stranger", "extendedKeyUsage=clientAuth\n")]);
    let port = free_port();
    let p = |f: &str| d.join(f).display().to_string();
    let mut cmd = agent_cmd(
        d,
        &format!("0.0.0.0:{port}"),
        &[
            "--tls-cert-file",
            &p("server.pem"),
            "--tls-private-key-file",
            &p("server.key"),
            "--client-ca-file",
            &p("good-ca.pem"),
        ],
    );
    cmd.stderr(std::fs::File::create(d.join("agent.log")).unwrap());
    let _agent = RawAgent(cmd.spawn().unwrap());
    let url = format!("https://127.0.0.1:{port}/pods");
    let start = Instant::now();
    let (code, body) = loop {
        let r = curl(d, &url, Some("client"));
        if r.0 != 0 || start.elapsed() > Duration::from_secs(20) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if code != 200 {
        let log = std::fs::read_to_string(d.join("agent.log")).unwrap_or_default();
        panic!("with a client certificate: {code} {body}\n{log}");
    }
    assert!(body.contains("PodList"), "{body}");
    let (code, body) = curl(d, &url, None);
    assert_eq!(code, 0, "without a client certificate: {body}");
    let (code, body) = curl(d, &url, Some("stranger"));
    assert_eq!(code, 0, "with a certificate of another CA: {body}");
    // Plain HTTP on the TLS port gets nothing either.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /pods HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    assert!(!String::from_utf8_lossy(&resp).contains("PodList"));
}
