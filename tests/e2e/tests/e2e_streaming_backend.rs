//! The runtime's streaming backend (exec, attach, port-forward) against real
//! runc containers, called directly with in-memory streams.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_runtime::RuntimeStreams;
use petrel_stream::{AttachSpec, BackendError, ExecSpec, StreamBackend, StreamIo, TermSize};
use petrel_testkit::clients::sh_container;
use petrel_testkit::in_process::{client_runtime, Daemon};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

/// The test's ends of a [`StreamIo`].
struct Client {
    stdin: Option<DuplexStream>,
    stdout: Option<DuplexStream>,
    stderr: Option<DuplexStream>,
    resize: Option<mpsc::Sender<TermSize>>,
}

/// In-memory streams: which ones exist follows the flags.
fn streams(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> (StreamIo, Client) {
    let pair = |on: bool| on.then(|| tokio::io::duplex(64 * 1024));
    let (i, o, e) = (pair(stdin), pair(stdout), pair(stderr));
    let (tx, rx) = if tty {
        let (tx, rx) = mpsc::channel(8);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    // Split the pairs: the backend reads stdin's far end and writes the
    // output's near ends; the test holds the others.
    let (io_stdin, c_stdin) = match i {
        Some((near, far)) => (Some(Box::pin(far) as petrel_stream::Reader), Some(near)),
        None => (None, None),
    };
    let (io_stdout, c_stdout) = match o {
        Some((near, far)) => (Some(Box::pin(near) as petrel_stream::Writer), Some(far)),
        None => (None, None),
    };
    let (io_stderr, c_stderr) = match e {
        Some((near, far)) => (Some(Box::pin(near) as petrel_stream::Writer), Some(far)),
        None => (None, None),
    };
    (
        StreamIo {
            stdin: io_stdin,
            stdout: io_stdout,
            stderr: io_stderr,
            resize: rx,
        },
        Client {
            stdin: c_stdin,
            stdout: c_stdout,
            stderr: c_stderr,
            resize: tx,
        },
    )
}

/// Reads a stream to its end in a task of its own.
fn collect(s: Option<DuplexStream>) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        if let Some(mut s) = s {
            let _ = s.read_to_end(&mut out).await;
        }
        String::from_utf8_lossy(&out).into_owned()
    })
}

/// Reads until `needle` has appeared (or panics after `within`); returns
/// everything read.
async fn read_until(s: &mut DuplexStream, needle: &str, within: Duration) -> String {
    let mut got = Vec::new();
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) => panic!(
                "stream ended before {needle:?}: {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("read: {e}"),
            Err(_) => panic!(
                "no {needle:?} within {within:?}: {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn exec_spec(id: &str, cmd: &[&str], stdin: bool, tty: bool) -> ExecSpec {
    ExecSpec {
        container_id: id.to_string(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty,
        stdin,
        stdout: true,
        stderr: !tty,
    }
}

/// A pod with one running container made from `config`.
async fn pod_with(
    d: &Daemon,
    name: &str,
    config: api::ContainerConfig,
) -> (petrel_testkit::prelude::Clients, String, String) {
    let mut c = d.clients().await;
    c.import_busybox().await;
    let pc = d.pod_config(name);
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, config).await;
    (c, pod, id)
}

#[test]
fn exec_should_stream_output_and_return_the_exit_code() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (_c, _pod, id) = pod_with(&d, "ex-out", sh_container("main", "sleep 1000")).await;
        let backend = d.streams();
        let (io, client) = streams(false, true, true, false);
        let out = collect(client.stdout);
        let err = collect(client.stderr);
        let code = backend
            .exec(
                exec_spec(
                    &id,
                    &["sh", "-c", "echo out; echo err >&2; exit 3"],
                    false,
                    false,
                ),
                io,
            )
            .await
            .expect("exec");
        assert_eq!(code, 3);
        assert_eq!(out.await.unwrap(), "out\n");
        assert_eq!(err.await.unwrap(), "err\n");
    });
}

#[test]
fn exec_should_round_trip_stdin() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (_c, _pod, id) = pod_with(&d, "ex-in", sh_container("main", "sleep 1000")).await;
        let backend = d.streams();
        let (io, mut client) = streams(true, true, true, false);
        let out = collect(client.stdout.take());
        let mut stdin = client.stdin.take().unwrap();
        let exec = tokio::spawn(async move {
            backend
                .exec(exec_spec(&id, &["cat"], true, false), io)
                .await
        });
        stdin.write_all(b"hello\nworld\n").await.unwrap();
        drop(stdin); // EOF: cat exits
        let code = tokio::time::timeout(Duration::from_secs(10), exec)
            .await
            .expect("exec ends after stdin ends")
            .unwrap()
            .expect("exec");
        assert_eq!(code, 0);
        assert_eq!(out.await.unwrap(), "hello\nworld\n");
    });
}

#[test]
fn exec_with_tty_should_apply_terminal_sizes() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (_c, _pod, id) = pod_with(&d, "ex-tty", sh_container("main", "sleep 1000")).await;
        let backend = d.streams();

        // A size sent before the start is the terminal's from the beginning.
        let (io, client) = streams(false, true, false, true);
        let resize = client.resize.unwrap();
        resize
            .send(TermSize {
                width: 123,
                height: 45,
            })
            .await
            .unwrap();
        let out = collect(client.stdout);
        let code = backend
            .exec(exec_spec(&id, &["stty", "size"], false, true), io)
            .await
            .expect("exec");
        assert_eq!(code, 0);
        assert_eq!(out.await.unwrap().trim(), "45 123");

        // A size sent while it runs reaches it too.
        let (io, mut client) = streams(true, true, false, true);
        let resize = client.resize.take().unwrap();
        let mut stdout = client.stdout.take().unwrap();
        let mut stdin = client.stdin.take().unwrap();
        let exec = tokio::spawn(async move {
            backend
                .exec(
                    exec_spec(
                        &id,
                        &["sh", "-c", "echo ready; read x; stty size"],
                        true,
                        true,
                    ),
                    io,
                )
                .await
        });
        read_until(&mut stdout, "ready", Duration::from_secs(10)).await;
        resize
            .send(TermSize {
                width: 100,
                height: 30,
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stdin.write_all(b"go\n").await.unwrap();
        let rest = read_until(&mut stdout, "30 100", Duration::from_secs(10)).await;
        assert!(rest.contains("30 100"), "{rest:?}");
        let code = tokio::time::timeout(Duration::from_secs(10), exec)
            .await
            .expect("exec ends")
            .unwrap()
            .expect("exec");
        assert_eq!(code, 0);
    });
}

#[test]
fn exec_of_a_missing_binary_should_fail_like_a_shell() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (_c, _pod, id) = pod_with(&d, "ex-nope", sh_container("main", "sleep 1000")).await;
        let backend = d.streams();
        let (io, client) = streams(false, true, true, false);
        let out = collect(client.stdout);
        let err = collect(client.stderr);
        match backend
            .exec(exec_spec(&id, &["nope"], false, false), io)
            .await
        {
            Err(BackendError::CommandFailed { message, exit_code }) => {
                assert_eq!(exit_code, 127);
                assert!(message.contains("\"nope\""), "{message}");
                assert!(message.contains("not found"), "{message}");
            }
            other => panic!("expected CommandFailed, got {other:?}"),
        }
        // runc's own complaint is the error, not the command's output.
        assert_eq!(out.await.unwrap(), "");
        assert_eq!(err.await.unwrap(), "");
    });
}

/// The pids of processes whose command line is exactly `args`.
fn pids_running(args: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = args.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

#[test]
fn dropping_an_exec_should_kill_and_reap_its_process() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (mut c, _pod, id) = pod_with(&d, "ex-drop", sh_container("main", "sleep 1000")).await;
        let backend = d.streams();
        let (io, mut client) = streams(false, true, true, false);
        let mut stdout = client.stdout.take().unwrap();
        let marker = ["sleep", "7654321"];
        let exec_id = id.clone();
        let exec = tokio::spawn(async move {
            backend
                .exec(
                    exec_spec(
                        &exec_id,
                        &["sh", "-c", "echo started; exec sleep 7654321"],
                        false,
                        false,
                    ),
                    io,
                )
                .await
        });
        read_until(&mut stdout, "started", Duration::from_secs(10)).await;
        let start = Instant::now();
        let pids = loop {
            let pids = pids_running(&marker);
            if !pids.is_empty() || start.elapsed() > Duration::from_secs(5) {
                break pids;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(pids.len(), 1, "the exec'd sleep runs");
        let pid = pids[0];

        // The client goes away.
        exec.abort();
        let _ = exec.await;
        let start = Instant::now();
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "exec'd process {pid} still exists (running or a zombie)"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Nothing holds the container up.
        let start = Instant::now();
        c.rt.stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 1,
        })
        .await
        .expect("StopContainer");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "stop took {:?}",
            start.elapsed()
        );
        c.wait_state(
            &id,
            api::ContainerState::ContainerExited,
            Duration::from_secs(5),
        )
        .await;
    });
}

#[test]
fn exec_should_refuse_containers_that_do_not_run() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let mut c = d.clients().await;
        c.import_busybox().await;
        let pc = d.pod_config("ex-state");
        let pod = c.run_pod(pc.clone()).await;
        let created = c
            .create(&pod, &pc, sh_container("main", "sleep 1000"))
            .await
            .expect("CreateContainer");
        let backend = d.streams();
        let (io, _client) = streams(false, true, true, false);
        let r = backend
            .exec(exec_spec(&created, &["true"], false, false), io)
            .await;
        assert!(
            matches!(r, Err(BackendError::FailedPrecondition(_))),
            "{r:?}"
        );
        let (io, _client) = streams(false, true, true, false);
        let r = backend
            .exec(exec_spec("0123456789abcdef", &["true"], false, false), io)
            .await;
        assert!(matches!(r, Err(BackendError::NotFound(_))), "{r:?}");
    });
}

fn attach_spec(id: &str, stdin: bool, tty: bool) -> AttachSpec {
    AttachSpec {
        container_id: id.to_string(),
        tty,
        stdin,
        stdout: true,
        stderr: !tty,
    }
}

/// A container reading lines on stdin and answering each.
fn echo_container(name: &str, stdin_once: bool, tty: bool) -> api::ContainerConfig {
    api::ContainerConfig {
        stdin: true,
        stdin_once,
        tty,
        ..sh_container(
            name,
            "while read l; do echo \"got $l\"; echo \"err $l\" >&2; stty size 2>/dev/null; done; echo bye",
        )
    }
}

#[test]
fn attach_should_carry_output_and_input() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (mut c, _pod, id) = pod_with(&d, "at-io", echo_container("main", false, false)).await;
        let backend = d.streams();

        let spec = attach_spec(&id, true, false);
        let (io, mut client) = streams(true, true, true, false);
        let mut stdout = client.stdout.take().unwrap();
        let mut stderr = client.stderr.take().unwrap();
        let mut stdin = client.stdin.take().unwrap();
        let b = backend.clone();
        let attach = tokio::spawn(async move { b.attach(spec, io).await });
        stdin.write_all(b"one\n").await.unwrap();
        read_until(&mut stdout, "got one", Duration::from_secs(10)).await;
        read_until(&mut stderr, "err one", Duration::from_secs(10)).await;
        // Without stdin_once the container's stdin outlives the attach.
        drop(stdin);
        attach.abort();
        let _ = attach.await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(c.state(&id).await, api::ContainerState::ContainerRunning);

        // A second attach still reaches it.
        let (io, mut client) = streams(true, true, true, false);
        let mut stdout = client.stdout.take().unwrap();
        let mut stdin = client.stdin.take().unwrap();
        let attach =
            tokio::spawn(async move { backend.attach(attach_spec(&id, true, false), io).await });
        stdin.write_all(b"two\n").await.unwrap();
        read_until(&mut stdout, "got two", Duration::from_secs(10)).await;
        attach.abort();
    });
}

#[test]
fn attach_with_stdin_once_should_close_stdin_after_the_first_attach() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (mut c, _pod, id) = pod_with(&d, "at-once", echo_container("main", true, false)).await;
        let backend = d.streams();
        let (io, mut client) = streams(true, true, true, false);
        let mut stdout = client.stdout.take().unwrap();
        let mut stdin = client.stdin.take().unwrap();
        let attach_id = id.clone();
        let attach = tokio::spawn(async move {
            backend
                .attach(attach_spec(&attach_id, true, false), io)
                .await
        });
        stdin.write_all(b"x\n").await.unwrap();
        read_until(&mut stdout, "got x", Duration::from_secs(10)).await;
        drop(stdin);
        // The container reads EOF, says bye and exits; the attach ends.
        read_until(&mut stdout, "bye", Duration::from_secs(10)).await;
        let r = tokio::time::timeout(Duration::from_secs(10), attach)
            .await
            .expect("attach ends with the container")
            .unwrap();
        assert!(r.is_ok(), "{r:?}");
        c.wait_state(
            &id,
            api::ContainerState::ContainerExited,
            Duration::from_secs(10),
        )
        .await;
    });
}

#[test]
fn attach_to_a_tty_container_should_resize_its_terminal() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (_c, _pod, id) = pod_with(&d, "at-tty", echo_container("main", false, true)).await;
        let backend = d.streams();
        let (io, mut client) = streams(true, true, false, true);
        let mut stdout = client.stdout.take().unwrap();
        let mut stdin = client.stdin.take().unwrap();
        let resize = client.resize.take().unwrap();
        let attach =
            tokio::spawn(async move { backend.attach(attach_spec(&id, true, true), io).await });
        resize
            .send(TermSize {
                width: 77,
                height: 22,
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stdin.write_all(b"hi\n").await.unwrap();
        let got = read_until(&mut stdout, "22 77", Duration::from_secs(10)).await;
        assert!(got.contains("got hi"), "{got:?}");
        // stderr goes to the terminal too.
        assert!(got.contains("err hi"), "{got:?}");
        attach.abort();
    });
}

#[test]
fn attach_should_be_refused_when_it_does_not_fit_the_container() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let (_c, _pod, id) = pod_with(&d, "at-refuse", sh_container("main", "sleep 1000")).await;
        let backend = d.streams();
        // A terminal the container does not have.
        let (io, _client) = streams(false, true, false, true);
        let r = backend.attach(attach_spec(&id, false, true), io).await;
        assert!(
            matches!(r, Err(BackendError::FailedPrecondition(_))),
            "{r:?}"
        );
        // Input the container was not made to take.
        let (io, _client) = streams(true, true, true, false);
        let r = backend.attach(attach_spec(&id, true, false), io).await;
        assert!(
            matches!(r, Err(BackendError::FailedPrecondition(_))),
            "{r:?}"
        );
    });
}

#[test]
fn attach_should_work_after_a_runtime_restart() {
    let mut d = Daemon::start();
    let crt = client_runtime();
    let id = crt.block_on(async {
        let (_c, _pod, id) = pod_with(&d, "at-restart", echo_container("main", false, false)).await;
        id
    });
    d.restart();
    crt.block_on(async {
        let backend = d.streams();
        let (io, mut client) = streams(true, true, true, false);
        let mut stdout = client.stdout.take().unwrap();
        let mut stdin = client.stdin.take().unwrap();
        let attach =
            tokio::spawn(async move { backend.attach(attach_spec(&id, true, false), io).await });
        stdin.write_all(b"again\n").await.unwrap();
        read_until(&mut stdout, "got again", Duration::from_secs(10)).await;
        attach.abort();
    });
}

/// A TCP port nothing on the host listens on.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn port_forward_should_reach_a_server_in_the_pods_network() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        let port = free_port();
        let script = format!(
            "mkdir -p /tmp/www && echo hello-from-pod > /tmp/www/index.html && \
             exec httpd -f -p 127.0.0.1:{port} -h /tmp/www"
        );
        let (_c, pod, _id) = pod_with(&d, "pf", sh_container("web", &script)).await;
        let backend: RuntimeStreams = d.streams();

        // The server is in the pod's namespace only.
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());

        let start = Instant::now();
        let mut conn = loop {
            match backend.port_forward(&pod, port).await {
                Ok(c) => break c,
                Err(_) if start.elapsed() < Duration::from_secs(10) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("port-forward never connected: {e}"),
            }
        };
        conn.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut answer))
            .await
            .expect("answer")
            .unwrap();
        assert!(answer.starts_with("HTTP/1."), "{answer:?}");
        assert!(answer.contains("hello-from-pod"), "{answer:?}");

        // A closed port is an error naming it.
        let closed = free_port();
        match backend.port_forward(&pod, closed).await {
            Err(BackendError::Internal(msg)) => {
                assert!(msg.contains(&closed.to_string()), "{msg}");
                assert!(msg.to_lowercase().contains("refused"), "{msg}");
            }
            other => panic!("expected an error, got {other:?}"),
        }
        // An unknown pod is not found.
        assert!(matches!(
            backend.port_forward("0123456789abcdef", port).await,
            Err(BackendError::NotFound(_))
        ));
    });
}

#[test]
fn a_stalled_attach_should_not_slow_the_container_or_other_attaches() {
    let d = Daemon::start();
    let crt = client_runtime();
    crt.block_on(async {
        // Output starts once both clients are attached: a 3 MB burst, then
        // (after the reading client has caught up) a marker.
        let script = "read go; head -c 3000000 /dev/zero | tr '\\0' x; echo; sleep 1; \
                      echo done-writing; sleep 1000";
        let config = api::ContainerConfig {
            stdin: true,
            ..sh_container("main", script)
        };
        let (_c, _pod, id) = pod_with(&d, "at-slow", config).await;
        let backend = d.streams();

        // A client that never reads its output.
        let (io, stalled) = streams(false, true, true, false);
        let b = backend.clone();
        let stalled_id = id.clone();
        let stalled_attach =
            tokio::spawn(async move { b.attach(attach_spec(&stalled_id, false, false), io).await });
        // A client that reads, and starts the output.
        let (io, mut reader) = streams(true, true, true, false);
        let mut stdout = reader.stdout.take().unwrap();
        let mut stdin = reader.stdin.take().unwrap();
        let attach =
            tokio::spawn(async move { backend.attach(attach_spec(&id, true, false), io).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        stdin.write_all(b"go\n").await.unwrap();

        // The reading client gets the marker, and the log has every byte,
        // while the other client has not read one.
        read_until(&mut stdout, "done-writing", Duration::from_secs(20)).await;
        let log = d.dir.path().join("logs/at-slow/main.log");
        let start = Instant::now();
        let text = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("done-writing") {
                break text;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the log never got the marker"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Records are `<time> stdout <P|F> <content>`.
        let xs: usize = text
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3))
            .map(|content| content.bytes().filter(|&b| b == b'x').count())
            .sum();
        assert_eq!(xs, 3_000_000);
        assert!(!stalled_attach.is_finished());
        drop(stalled);
        stalled_attach.abort();
        attach.abort();
    });
}
