//! Round trips through a real streaming server on loopback TCP, with both
//! protocols, against a test backend that runs real processes
//! (`/bin/sh -c ...`) and real TCP connections. The backend is a stand-in
//! for the runtime (tested elsewhere): this crate is protocol logic.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use petrel_stream::client::{self, ClientError, CommandOptions, PortForwarder, Transport};
use petrel_stream::{
    AttachSpec, BackendError, ExecSpec, Outcome, StreamBackend, StreamConfig, StreamIo,
    StreamServer, TermSize,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct TestBackend {
    ttys: Mutex<Vec<bool>>,
    sizes: Arc<Mutex<Vec<TermSize>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TestBackend {
    fn watch_resizes(&self, resize: Option<tokio::sync::mpsc::Receiver<TermSize>>) {
        if let Some(mut rx) = resize {
            let sizes = self.sizes.clone();
            tokio::spawn(async move {
                while let Some(s) = rx.recv().await {
                    lock(&sizes).push(s);
                }
            });
        }
    }
}

#[async_trait::async_trait]
impl StreamBackend for TestBackend {
    async fn exec(&self, spec: ExecSpec, io: StreamIo) -> Result<i32, BackendError> {
        if spec.container_id == "missing" {
            return Err(BackendError::NotFound(
                "container \"missing\" not found".into(),
            ));
        }
        lock(&self.ttys).push(spec.tty);
        self.watch_resizes(io.resize);
        let (prog, args) = spec
            .cmd
            .split_first()
            .ok_or_else(|| BackendError::Internal("empty command".into()))?;
        let mut child = tokio::process::Command::new(prog)
            .args(args)
            .stdin(if io.stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
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
        let out = match (child.stdout.take(), io.stdout) {
            (Some(mut from), Some(mut to)) => Some(tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from, &mut to).await;
                let _ = to.shutdown().await;
            })),
            _ => None,
        };
        let err = match (child.stderr.take(), io.stderr) {
            (Some(mut from), Some(mut to)) => Some(tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from, &mut to).await;
                let _ = to.shutdown().await;
            })),
            _ => None,
        };
        let status = child
            .wait()
            .await
            .map_err(|e| BackendError::Internal(e.to_string()))?;
        for t in [out, err].into_iter().flatten() {
            let _ = t.await;
        }
        Ok(status.code().unwrap_or(128))
    }

    async fn attach(&self, spec: AttachSpec, io: StreamIo) -> Result<(), BackendError> {
        lock(&self.ttys).push(spec.tty);
        self.watch_resizes(io.resize);
        // An "attached process" that echoes its input.
        if let (Some(mut from), Some(mut to)) = (io.stdin, io.stdout) {
            tokio::io::copy(&mut from, &mut to)
                .await
                .map_err(|e| BackendError::Internal(e.to_string()))?;
            let _ = to.shutdown().await;
        }
        Ok(())
    }

    async fn port_forward(&self, _pod: &str, port: u16) -> Result<TcpStream, BackendError> {
        TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| BackendError::Internal(e.to_string()))
    }
}

fn server_with(config: StreamConfig) -> (StreamServer, Arc<TestBackend>) {
    let backend = Arc::new(TestBackend::default());
    let server =
        StreamServer::bind(config, backend.clone()).unwrap_or_else(|e| panic!("bind: {e}"));
    (server, backend)
}

fn server() -> (StreamServer, Arc<TestBackend>) {
    server_with(StreamConfig::default())
}

fn exec_spec(cmd: &str, stdin: bool, tty: bool) -> ExecSpec {
    ExecSpec {
        container_id: "c1".into(),
        cmd: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
        tty,
        stdin,
        stdout: true,
        stderr: !tty,
    }
}

fn opts(transport: Transport, stdin: bool, tty: bool) -> CommandOptions {
    CommandOptions {
        stdin,
        stdout: true,
        stderr: !tty,
        tty,
        transport,
    }
}

async fn read_all(r: Option<petrel_stream::Reader>) -> String {
    let mut s = String::new();
    if let Some(mut r) = r {
        let _ = r.read_to_string(&mut s).await;
    }
    s
}

async fn run_exec_stdio(transport: Transport) {
    let (server, _) = server();
    let url = server
        .exec_url(exec_spec(
            "read x; echo out:$x; echo err:$x >&2; exit 3",
            true,
            false,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut rc = client::remote_command(&url, opts(transport, true, false))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(rc.protocol(), "v5.channel.k8s.io");
    let mut stdin = rc.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    stdin
        .write_all(b"hello\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stdin.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    let out = tokio::spawn(read_all(rc.stdout.take()));
    let err = tokio::spawn(read_all(rc.stderr.take()));
    let outcome = rc.wait().await.unwrap_or_else(|e| panic!("wait: {e}"));
    assert_eq!(out.await.unwrap_or_default(), "out:hello\n");
    assert_eq!(err.await.unwrap_or_default(), "err:hello\n");
    assert_eq!(outcome.exit_code(), Some(3), "{outcome:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn websocket_exec_stdio_and_exit_code() {
    run_exec_stdio(Transport::WebSocket).await;
}

#[tokio::test]
async fn spdy_exec_stdio_and_exit_code() {
    run_exec_stdio(Transport::Spdy).await;
}

async fn run_exec_cat(transport: Transport) {
    let (server, _) = server();
    let url = server
        .exec_url(exec_spec("cat", true, false))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut rc = client::remote_command(&url, opts(transport, true, false))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let input: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let expected = input.clone();
    let mut stdin = rc.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let writer = tokio::spawn(async move {
        stdin
            .write_all(&input)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        stdin.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    });
    let mut stdout = rc.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let _ = stdout.read_to_end(&mut got).await;
        got
    });
    let outcome = rc.wait().await.unwrap_or_else(|e| panic!("wait: {e}"));
    let _ = writer.await;
    let got = reader.await.unwrap_or_default();
    assert_eq!(outcome, Outcome::Success);
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "stdout differs from stdin");
    server.shutdown().await;
}

#[tokio::test]
async fn websocket_exec_stdin_to_stdout_4mib() {
    run_exec_cat(Transport::WebSocket).await;
}

#[tokio::test]
async fn spdy_exec_stdin_to_stdout_4mib() {
    run_exec_cat(Transport::Spdy).await;
}

async fn run_tty_resize(transport: Transport) {
    let (server, backend) = server();
    let url = server
        .exec_url(exec_spec("cat", true, true))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut rc = client::remote_command(&url, opts(transport, true, true))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    assert!(rc.stderr.is_none());
    let resize = rc
        .resize
        .take()
        .unwrap_or_else(|| panic!("no resize with a tty"));
    let size = TermSize {
        width: 123,
        height: 45,
    };
    resize.send(size).await.unwrap_or_else(|e| panic!("{e}"));
    // Wait for the backend to see it before ending the command.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lock(&backend.sizes).contains(&size) {
        assert!(
            Instant::now() < deadline,
            "resize never reached the backend"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut stdin = rc.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    stdin
        .write_all(b"typed\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stdin.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    let out = tokio::spawn(read_all(rc.stdout.take()));
    let outcome = rc.wait().await.unwrap_or_else(|e| panic!("wait: {e}"));
    assert_eq!(outcome, Outcome::Success);
    assert_eq!(out.await.unwrap_or_default(), "typed\n");
    assert_eq!(*lock(&backend.ttys), vec![true]);
    server.shutdown().await;
}

#[tokio::test]
async fn websocket_tty_flag_and_resize() {
    run_tty_resize(Transport::WebSocket).await;
}

#[tokio::test]
async fn spdy_tty_flag_and_resize() {
    run_tty_resize(Transport::Spdy).await;
}

async fn run_attach(transport: Transport) {
    let (server, backend) = server();
    let url = server
        .attach_url(AttachSpec {
            container_id: "c1".into(),
            tty: false,
            stdin: true,
            stdout: true,
            stderr: false,
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let o = CommandOptions {
        stdin: true,
        stdout: true,
        stderr: false,
        tty: false,
        transport,
    };
    let mut rc = client::remote_command(&url, o)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let mut stdin = rc.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    stdin
        .write_all(b"attached\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stdin.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    let out = tokio::spawn(read_all(rc.stdout.take()));
    let outcome = rc.wait().await.unwrap_or_else(|e| panic!("wait: {e}"));
    assert_eq!(outcome, Outcome::Success);
    assert_eq!(out.await.unwrap_or_default(), "attached\n");
    assert_eq!(*lock(&backend.ttys), vec![false]);
    server.shutdown().await;
}

#[tokio::test]
async fn websocket_attach() {
    run_attach(Transport::WebSocket).await;
}

#[tokio::test]
async fn spdy_attach() {
    run_attach(Transport::Spdy).await;
}

async fn run_backend_failure(transport: Transport) {
    let (server, _) = server();
    let mut spec = exec_spec("true", false, false);
    spec.container_id = "missing".into();
    let url = server.exec_url(spec).unwrap_or_else(|e| panic!("{e}"));
    let mut rc = client::remote_command(&url, opts(transport, false, false))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let out = tokio::spawn(read_all(rc.stdout.take()));
    let err = tokio::spawn(read_all(rc.stderr.take()));
    match rc.wait().await {
        Ok(Outcome::Failed(m)) => assert!(m.contains("not found"), "{m}"),
        other => panic!("unexpected {other:?}"),
    }
    let _ = (out.await, err.await);
    server.shutdown().await;
}

#[tokio::test]
async fn websocket_backend_error_reported() {
    run_backend_failure(Transport::WebSocket).await;
}

#[tokio::test]
async fn spdy_backend_error_reported() {
    run_backend_failure(Transport::Spdy).await;
}

/// A TCP echo server; returns its port.
async fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let port = l.local_addr().map(|a| a.port()).unwrap_or_default();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                // A big buffer: the echo must not be the bottleneck of the
                // throughput test.
                let mut r = tokio::io::BufReader::with_capacity(256 * 1024, r);
                let _ = tokio::io::copy_buf(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    port
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    l.local_addr().map(|a| a.port()).unwrap_or_default()
}

#[tokio::test]
async fn spdy_port_forward_echo_two_connections() {
    let (server, _) = server();
    let port = echo_server().await;
    let url = server
        .port_forward_url("pod1".into(), vec![port])
        .unwrap_or_else(|e| panic!("{e}"));
    let pf = PortForwarder::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut a = pf.open(port).await.unwrap_or_else(|e| panic!("{e}"));
    let mut b = pf.open(port).await.unwrap_or_else(|e| panic!("{e}"));
    for (s, msg) in [
        (&mut a, b"first".as_slice()),
        (&mut b, b"second".as_slice()),
    ] {
        s.writer
            .write_all(msg)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.writer.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    }
    for (s, msg) in [(a, "first"), (b, "second")] {
        let mut reader = s.reader;
        let mut got = String::new();
        reader
            .read_to_string(&mut got)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, msg);
        assert_eq!(s.error.wait().await, None);
    }
    pf.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spdy_port_forward_64mib() {
    let (server, _) = server();
    let port = echo_server().await;
    let url = server
        .port_forward_url("pod1".into(), vec![port])
        .unwrap_or_else(|e| panic!("{e}"));
    let pf = PortForwarder::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let s = pf.open(port).await.unwrap_or_else(|e| panic!("{e}"));
    const TOTAL: usize = 64 * 1024 * 1024;
    let block: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    let expected_block = block.clone();
    let mut writer = s.writer;
    let mut reader = s.reader;
    let start = Instant::now();
    let w = tokio::spawn(async move {
        for _ in 0..TOTAL / block.len() {
            writer
                .write_all(&block)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        writer.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    });
    let mut buf = vec![0u8; 1024 * 1024];
    let mut total = 0usize;
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if n == 0 {
            break;
        }
        // Compare against the repeating block, a slice at a time.
        let mut done = 0;
        while done < n {
            let pos = (total + done) % expected_block.len();
            let len = (n - done).min(expected_block.len() - pos);
            assert!(
                buf[done..done + len] == expected_block[pos..pos + len],
                "bytes from {} differ",
                total + done
            );
            done += len;
        }
        total += n;
    }
    let elapsed = start.elapsed();
    let _ = w.await;
    assert_eq!(total, TOTAL);
    eprintln!(
        "64 MiB echoed through SPDY port-forward in {:?} ({:.0} MiB/s each way)",
        elapsed,
        64.0 / elapsed.as_secs_f64()
    );
    assert_eq!(s.error.wait().await, None);
    pf.close().await;
    server.shutdown().await;
}

#[tokio::test]
async fn spdy_port_forward_refused_port_reports_error() {
    let (server, _) = server();
    let port = closed_port().await;
    let url = server
        .port_forward_url("pod1".into(), vec![port])
        .unwrap_or_else(|e| panic!("{e}"));
    let pf = PortForwarder::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let s = pf.open(port).await.unwrap_or_else(|e| panic!("{e}"));
    let msg = s
        .error
        .wait()
        .await
        .unwrap_or_else(|| panic!("no error reported"));
    assert!(
        msg.contains(&format!("error forwarding port {port} to pod pod1")),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
    let mut reader = s.reader;
    let mut rest = Vec::new();
    let _ = reader.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
    pf.close().await;
    server.shutdown().await;
}

/// A server that greets each connection and closes it.
async fn greeter() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let port = l.local_addr().map(|a| a.port()).unwrap_or_default();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(b"hello from pod").await;
        }
    });
    port
}

#[tokio::test]
async fn websocket_port_forward_two_ports() {
    let (server, _) = server();
    let echo = echo_server().await;
    let greet = greeter().await;
    let url = server
        .port_forward_url("pod1".into(), vec![echo, greet])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut streams = client::port_forward_websocket(&url, &[echo, greet])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(streams.len(), 2);
    let greeted = streams.pop().unwrap_or_else(|| panic!("two streams"));
    let mut echoed = streams.pop().unwrap_or_else(|| panic!("two streams"));
    echoed
        .writer
        .write_all(b"over websocket")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut got = vec![0u8; 14];
    echoed
        .reader
        .read_exact(&mut got)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, b"over websocket");
    // Over WebSocket a port's stream cannot end alone: read what the pod
    // said; the connection ends with the last forward (or the server).
    let mut reader = greeted.reader;
    let mut hello = vec![0u8; 14];
    reader
        .read_exact(&mut hello)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(hello, b"hello from pod");
    server.shutdown().await;
    assert_eq!(greeted.error.wait().await, None);
}

#[tokio::test]
async fn websocket_port_forward_refused() {
    let (server, _) = server();
    let bad = closed_port().await;
    let url = server
        .port_forward_url("pod1".into(), vec![bad])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut streams = client::port_forward_websocket(&url, &[bad])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let s = streams.pop().unwrap_or_else(|| panic!("one stream"));
    let msg = s
        .error
        .wait()
        .await
        .unwrap_or_else(|| panic!("no error reported"));
    assert!(
        msg.contains(&format!("error forwarding port {bad} to pod pod1")),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
    server.shutdown().await;
}

async fn expect_refused(url: &str, transport: Transport, status: u16, text: &str) {
    match client::remote_command(url, opts(transport, false, false)).await {
        Err(ClientError::Refused { status: s, body }) => {
            assert_eq!(s, status, "{body}");
            assert!(body.contains(text), "{body:?} lacks {text:?}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("connected with a spent token"),
    }
}

#[tokio::test]
async fn reused_token_is_refused() {
    for transport in [Transport::WebSocket, Transport::Spdy] {
        let (server, _) = server();
        let url = server
            .exec_url(exec_spec("true", false, false))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut rc = client::remote_command(&url, opts(transport, false, false))
            .await
            .unwrap_or_else(|e| panic!("first use: {e}"));
        let out = tokio::spawn(read_all(rc.stdout.take()));
        let err = tokio::spawn(read_all(rc.stderr.take()));
        assert_eq!(rc.wait().await.ok(), Some(Outcome::Success));
        let _ = (out.await, err.await);
        expect_refused(&url, transport, 404, "already used").await;
        server.shutdown().await;
    }
}

#[tokio::test]
async fn expired_token_is_refused() {
    let (server, _) = server_with(StreamConfig {
        token_ttl: Duration::from_millis(100),
        ..StreamConfig::default()
    });
    let url = server
        .exec_url(exec_spec("true", false, false))
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    expect_refused(&url, Transport::Spdy, 404, "expired").await;
    let bogus = format!("http://{}/exec/not-a-token", server.local_addr());
    expect_refused(&bogus, Transport::WebSocket, 404, "unknown").await;
    server.shutdown().await;
}

#[tokio::test]
async fn in_flight_limit() {
    let (server, _) = server_with(StreamConfig {
        max_in_flight: 2,
        ..StreamConfig::default()
    });
    for _ in 0..2 {
        server
            .exec_url(exec_spec("true", false, false))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let err = server.exec_url(exec_spec("true", false, false));
    assert!(
        matches!(err, Err(petrel_stream::StreamError::Token(_))),
        "{err:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn spdy_unsupported_protocol_is_forbidden() {
    let (server, _) = server();
    let url = server
        .exec_url(exec_spec("true", false, false))
        .unwrap_or_else(|e| panic!("{e}"));
    let path = url
        .split_once("/exec/")
        .map(|(_, t)| format!("/exec/{t}"))
        .unwrap_or_default();
    let mut tcp = TcpStream::connect(server.local_addr())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v9.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
    );
    tcp.write_all(req.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut resp = vec![0u8; 4096];
    let n = tcp.read(&mut resp).await.unwrap_or_else(|e| panic!("{e}"));
    let resp = String::from_utf8_lossy(&resp[..n]).to_lowercase();
    assert!(resp.starts_with("http/1.1 403"), "{resp}");
    assert!(
        resp.contains("x-accepted-stream-protocol-versions: v5.channel.k8s.io"),
        "{resp}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_serving() {
    let (server, _) = server();
    let addr = server.local_addr();
    server.shutdown().await;
    assert!(matches!(
        server.exec_url(exec_spec("true", false, false)),
        Err(petrel_stream::StreamError::ShutDown)
    ));
    assert!(TcpStream::connect(addr).await.is_err(), "still listening");
}

#[tokio::test]
async fn websocket_base64_v4_exec() {
    use base64::Engine as _;
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let (server, _) = server();
    let url = server
        .exec_url(exec_spec("echo hi; exit 2", false, false))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut req = url
        .replacen("http://", "ws://", 1)
        .into_client_request()
        .unwrap_or_else(|e| panic!("{e}"));
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        http::HeaderValue::from_static("v4.base64.channel.k8s.io"),
    );
    let tcp = TcpStream::connect(server.local_addr())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tcp)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok()),
        Some("v4.base64.channel.k8s.io")
    );
    let (mut stdout, mut status) = (Vec::new(), Vec::new());
    while let Some(Ok(msg)) = ws.next().await {
        let Message::Text(t) = msg else { continue };
        let (ch, data) = t.as_str().split_at(1);
        let data = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap_or_else(|e| panic!("{e}"));
        match ch {
            "1" => stdout.extend(data),
            "3" => status.extend(data),
            _ => {}
        }
    }
    assert_eq!(stdout, b"hi\n");
    let status = String::from_utf8_lossy(&status);
    assert!(status.contains(r#""reason":"NonZeroExitCode""#), "{status}");
    assert!(
        status.contains(r#"{"reason":"ExitCode","message":"2"}"#),
        "{status}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_a_running_exec() {
    for transport in [Transport::WebSocket, Transport::Spdy] {
        let (server, _) = server();
        let url = server
            .exec_url(exec_spec("sleep 1000", false, false))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut rc = client::remote_command(&url, opts(transport, false, false))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let out = tokio::spawn(read_all(rc.stdout.take()));
        let err = tokio::spawn(read_all(rc.stderr.take()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = Instant::now();
        server.shutdown().await;
        let r = tokio::time::timeout(Duration::from_secs(15), rc.wait())
            .await
            .unwrap_or_else(|_| panic!("client still waiting after shutdown"));
        assert!(matches!(r, Err(ClientError::NoStatus)), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(15));
        let _ = (out.await, err.await);
    }
}

/// Throughput of one forwarded connection, each direction alone, through
/// SPDY and WebSocket: `cargo nextest run --release -p petrel-stream
/// --run-ignored only -E 'test(throughput)' --no-capture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check: run in release for numbers"]
async fn port_forward_throughput() {
    const TOTAL: usize = 512 * 1024 * 1024;
    // A pod port that swallows everything and reports the count, and one
    // that sends TOTAL bytes and closes.
    let sink = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let sink_port = sink.local_addr().map(|a| a.port()).unwrap_or_default();
    let (count_tx, mut count_rx) = tokio::sync::mpsc::channel::<usize>(4);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = sink.accept().await {
            let tx = count_tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut n = 0;
                while let Ok(k) = s.read(&mut buf).await {
                    if k == 0 {
                        break;
                    }
                    n += k;
                }
                let _ = tx.send(n).await;
            });
        }
    });
    let source = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let source_port = source.local_addr().map(|a| a.port()).unwrap_or_default();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = source.accept().await {
            tokio::spawn(async move {
                let block = vec![5u8; 256 * 1024];
                for _ in 0..TOTAL / block.len() {
                    if s.write_all(&block).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let report = |what: &str, t: Duration| {
        eprintln!(
            "{what}: {} MiB in {t:?} = {:.0} MiB/s",
            TOTAL >> 20,
            (TOTAL >> 20) as f64 / t.as_secs_f64()
        )
    };
    let block = vec![9u8; 1024 * 1024];
    // The ceiling on this machine: the same two TCP hops through a plain
    // proxy that copies bytes and nothing else.
    let proxy = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let proxy_port = proxy.local_addr().map(|a| a.port()).unwrap_or_default();
    tokio::spawn(async move {
        if let Ok((mut a, _)) = proxy.accept().await {
            if let Ok(mut b) = TcpStream::connect(("127.0.0.1", sink_port)).await {
                let _ =
                    tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, 256 << 10, 256 << 10)
                        .await;
            }
        }
    });
    let mut c = TcpStream::connect(("127.0.0.1", proxy_port))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    for _ in 0..TOTAL / block.len() {
        c.write_all(&block).await.unwrap_or_else(|e| panic!("{e}"));
    }
    c.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(count_rx.recv().await, Some(TOTAL));
    report("plain TCP proxy, client -> pod (baseline)", start.elapsed());

    let (server, _) = server();
    let url = server
        .port_forward_url("pod1".into(), vec![sink_port])
        .unwrap_or_else(|e| panic!("{e}"));
    let pf = PortForwarder::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut s = pf.open(sink_port).await.unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    for _ in 0..TOTAL / block.len() {
        s.writer
            .write_all(&block)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    s.writer.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(count_rx.recv().await, Some(TOTAL));
    report("SPDY client -> pod", start.elapsed());
    let url = server
        .port_forward_url("pod1".into(), vec![source_port])
        .unwrap_or_else(|e| panic!("{e}"));
    let pf = PortForwarder::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut s = pf.open(source_port).await.unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    let mut buf = vec![0u8; 1024 * 1024];
    let mut n = 0;
    while n < TOTAL {
        let k = s
            .reader
            .read(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(k > 0, "ended early at {n}");
        n += k;
    }
    report("SPDY pod -> client", start.elapsed());
    let url = server
        .port_forward_url("pod1".into(), vec![source_port])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut streams = client::port_forward_websocket(&url, &[source_port])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut s = streams.pop().unwrap_or_else(|| panic!("one stream"));
    let start = Instant::now();
    let mut n = 0;
    while n < TOTAL {
        let k = s
            .reader
            .read(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(k > 0, "ended early at {n}");
        n += k;
    }
    report("WebSocket pod -> client", start.elapsed());
    server.shutdown().await;
}

#[tokio::test]
async fn base_url_with_a_path_prefix() {
    let port = closed_port().await;
    let (server, _) = server_with(StreamConfig {
        address: ([127, 0, 0, 1], port).into(),
        base_url: Some(format!("http://127.0.0.1:{port}/cri/")),
        ..StreamConfig::default()
    });
    let url = server
        .exec_url(exec_spec("echo prefixed", false, false))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        url.starts_with(&format!("http://127.0.0.1:{port}/cri/exec/")),
        "{url}"
    );
    let mut rc = client::remote_command(&url, opts(Transport::Spdy, false, false))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let out = tokio::spawn(read_all(rc.stdout.take()));
    let err = tokio::spawn(read_all(rc.stderr.take()));
    assert_eq!(rc.wait().await.ok(), Some(Outcome::Success));
    assert_eq!(out.await.unwrap_or_default(), "prefixed\n");
    let _ = err.await;
    server.shutdown().await;
}

#[tokio::test]
async fn idle_connections_are_closed_busy_ones_are_not() {
    for transport in [Transport::WebSocket, Transport::Spdy] {
        let (server, _) = server_with(StreamConfig {
            idle_timeout: Some(Duration::from_millis(1500)),
            ..StreamConfig::default()
        });
        // Output every 100 ms for a second: never idle for 1.5 s (the
        // margin is for machines that stall for hundreds of ms).
        let url = server
            .exec_url(exec_spec(
                "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; sleep 0.1; done",
                false,
                false,
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut rc = client::remote_command(&url, opts(transport, false, false))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let out = tokio::spawn(read_all(rc.stdout.take()));
        let err = tokio::spawn(read_all(rc.stderr.take()));
        assert_eq!(
            rc.wait().await.ok(),
            Some(Outcome::Success),
            "{transport:?}"
        );
        assert_eq!(out.await.unwrap_or_default().lines().count(), 10);
        let _ = err.await;
        // Silent for longer than the timeout: cut, no status.
        let url = server
            .exec_url(exec_spec("sleep 20", false, false))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut rc = client::remote_command(&url, opts(transport, false, false))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let out = tokio::spawn(read_all(rc.stdout.take()));
        let err = tokio::spawn(read_all(rc.stderr.take()));
        let start = Instant::now();
        let r = rc.wait().await;
        assert!(
            matches!(r, Err(ClientError::NoStatus)),
            "{transport:?}: {r:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{:?}",
            start.elapsed()
        );
        let _ = (out.await, err.await);
        server.shutdown().await;
    }
}

/// Sends a WebSocket handshake for `url` with these Host and Origin
/// headers (as a browser would) and returns the status code.
async fn browser_handshake(url: &str, host: &str, origin: &str) -> u16 {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("{url}"));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or_else(|| panic!("{url}")));
    let mut s = TcpStream::connect(authority)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    s.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let mut buf = vec![0u8; 1024];
    let n = s.read(&mut buf).await.unwrap_or_else(|e| panic!("{e}"));
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"))
}

#[tokio::test]
async fn web_pages_are_refused_and_the_url_still_serves_its_client() {
    let (server, _) = server();
    let url = server
        .exec_url(exec_spec("echo hi", false, false))
        .unwrap_or_else(|e| panic!("{e}"));
    let port = server.local_addr().port();
    // DNS rebinding: the page's own name, pointed at 127.0.0.1.
    let evil = format!("evil.example:{port}");
    assert_eq!(
        browser_handshake(&url, &evil, &format!("http://{evil}")).await,
        403
    );
    // Cross-origin: a page elsewhere opening ws://127.0.0.1:port.
    let own = format!("127.0.0.1:{port}");
    assert_eq!(
        browser_handshake(&url, &own, "http://evil.example").await,
        403
    );
    // Neither spent the token: a client without Origin (crictl, kubectl,
    // kubelet's proxy with its own Host) is served.
    let mut rc = client::remote_command(&url, opts(Transport::WebSocket, false, false))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let out = tokio::spawn(read_all(rc.stdout.take()));
    let err = tokio::spawn(read_all(rc.stderr.take()));
    assert_eq!(rc.wait().await.ok(), Some(Outcome::Success));
    assert_eq!(out.await.ok().as_deref(), Some("hi\n"));
    let _ = err.await;
    // A page of the server's own origin is let through (and then finds the
    // token spent).
    assert_eq!(
        browser_handshake(&url, &own, &format!("http://{own}")).await,
        404
    );
    server.shutdown().await;
}
