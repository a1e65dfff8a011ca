//! CRI Exec, Attach and PortForward end to end: the runtime hands out URLs
//! of its streaming server; real clients (Petrel's WebSocket and SPDY
//! clients, and `petrel ctl`) use them against real runc containers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use petrel_cri::api;
use petrel_stream::client::{self, CommandOptions, Outcome, PortForwarder, Transport};
use petrel_testkit::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn exec_url(c: &mut Clients, id: &str, cmd: &[&str], stdin: bool, tty: bool) -> String {
    c.rt.exec(api::ExecRequest {
        container_id: id.to_string(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty,
        stdin,
        stdout: true,
        stderr: !tty,
    })
    .await
    .expect("Exec")
    .into_inner()
    .url
}

async fn read_all(r: Option<petrel_stream::Reader>) -> String {
    let mut out = Vec::new();
    if let Some(mut r) = r {
        r.read_to_end(&mut out).await.unwrap();
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_should_stream_over_websocket_and_spdy_with_exit_codes_stdin_and_tty() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("stream");
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("box", "sleep 1000")).await;

    for transport in [Transport::WebSocket, Transport::Spdy] {
        // stdout, stderr, exit code.
        let url = exec_url(
            &mut c,
            &id,
            &["sh", "-c", "echo out; echo err >&2; exit 3"],
            false,
            false,
        )
        .await;
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        let opts = CommandOptions {
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
            transport,
        };
        let mut rc = client::remote_command(&url, opts).await.unwrap();
        let (out, err) = tokio::join!(read_all(rc.stdout.take()), read_all(rc.stderr.take()));
        assert_eq!(
            (out.as_str(), err.as_str()),
            ("out\n", "err\n"),
            "{transport:?}"
        );
        match rc.wait().await.unwrap() {
            Outcome::Exited { code, .. } => assert_eq!(code, 3),
            o => panic!("{transport:?}: {o:?}"),
        }
        // The URL is single-use.
        let again = client::remote_command(&url, opts).await;
        assert!(again.is_err(), "{transport:?}: a used URL must be refused");

        // stdin round trip, stdin closed ends the command.
        let url = exec_url(&mut c, &id, &["cat"], true, false).await;
        let opts = CommandOptions {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
            transport,
        };
        let mut rc = client::remote_command(&url, opts).await.unwrap();
        let mut w = rc.stdin.take().unwrap();
        w.write_all(b"ping\n").await.unwrap();
        w.shutdown().await.unwrap();
        let out = read_all(rc.stdout.take()).await;
        assert_eq!(out, "ping\n", "{transport:?}");
        assert!(matches!(rc.wait().await.unwrap(), Outcome::Success));

        // A terminal, resized before the command reads its size.
        let url = exec_url(
            &mut c,
            &id,
            &["sh", "-c", "sleep 0.5; stty size"],
            true,
            true,
        )
        .await;
        let opts = CommandOptions {
            stdin: true,
            stdout: true,
            stderr: false,
            tty: true,
            transport,
        };
        let mut rc = client::remote_command(&url, opts).await.unwrap();
        rc.resize
            .as_ref()
            .unwrap()
            .send(petrel_stream::TermSize {
                width: 123,
                height: 45,
            })
            .await
            .unwrap();
        let out = read_all(rc.stdout.take()).await;
        assert_eq!(out.trim(), "45 123", "{transport:?}");
        let _ = rc.wait().await;

        // A missing binary: the error and exit code reach the client.
        let url = exec_url(&mut c, &id, &["/no/such/binary"], false, false).await;
        let opts = CommandOptions {
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
            transport,
        };
        let mut rc = client::remote_command(&url, opts).await.unwrap();
        let _ = tokio::join!(read_all(rc.stdout.take()), read_all(rc.stderr.take()));
        match rc.wait().await.unwrap() {
            Outcome::Exited { code, message } => {
                assert_ne!(code, 0);
                assert!(
                    message.contains("no/such/binary") || !message.is_empty(),
                    "{message}"
                );
            }
            Outcome::Failed(msg) => assert!(msg.contains("binary"), "{msg}"),
            o => panic!("{transport:?}: {o:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn attach_and_port_forward_should_reach_the_container_and_the_pod() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("attach");
    let pod = c.run_pod(pc.clone()).await;
    let mut cfg = sh_container("reader", "read line; echo got:$line; sleep 1000");
    cfg.stdin = true;
    cfg.stdin_once = true;
    let reader = c.run(&pod, &pc, cfg).await;
    let web = c
        .run(
            &pod,
            &pc,
            sh_container(
                "web",
                "mkdir -p /www && echo hello-pf > /www/index.html && exec httpd -f -p 8080 -h /www",
            ),
        )
        .await;

    // Attach: input reaches the container's stdin, its output comes back.
    let url =
        c.rt.attach(api::AttachRequest {
            container_id: reader.clone(),
            stdin: true,
            tty: false,
            stdout: true,
            stderr: true,
        })
        .await
        .unwrap()
        .into_inner()
        .url;
    let opts = CommandOptions {
        stdin: true,
        stdout: true,
        stderr: true,
        tty: false,
        transport: Transport::WebSocket,
    };
    let mut rc = client::remote_command(&url, opts).await.unwrap();
    let mut w = rc.stdin.take().unwrap();
    w.write_all(b"hello\n").await.unwrap();
    let mut out = rc.stdout.take().unwrap();
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), out.read(&mut buf))
        .await
        .expect("attach output")
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&buf[..n]), "got:hello\n");
    drop(w);
    drop(out);
    drop(rc);

    // Attach to a container without a terminal asking for one is refused.
    let err =
        c.rt.attach(api::AttachRequest {
            container_id: reader.clone(),
            stdin: true,
            tty: true,
            stdout: true,
            stderr: false,
        })
        .await;
    assert!(err.is_err(), "tty attach to a non-tty container: {err:?}");

    // Port-forward over SPDY: a connection to 8080 in the pod; a closed
    // port reports the error on the forward's error stream.
    let url =
        c.rt.port_forward(api::PortForwardRequest {
            pod_sandbox_id: pod.clone(),
            port: vec![8080],
        })
        .await
        .unwrap()
        .into_inner()
        .url;
    let fwd = PortForwarder::connect(&url).await.unwrap();
    let mut body = String::new();
    for _ in 0..50 {
        let s = fwd.open(8080).await.unwrap();
        let (mut r, mut w) = (s.reader, s.writer);
        w.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let _ = r.read_to_end(&mut got).await;
        body = String::from_utf8_lossy(&got).into_owned();
        if body.contains("hello-pf") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(body.contains("hello-pf"), "{body}");
    let s = fwd.open(9).await.unwrap();
    drop(s.writer);
    let mut sink = Vec::new();
    let mut r = s.reader;
    let _ = r.read_to_end(&mut sink).await;
    let msg = s.error.wait().await.unwrap_or_default();
    assert!(msg.contains("9"), "closed port error: {msg:?}");
    fwd.close().await;

    // Through `petrel ctl`: exec -i, attach -i and port-forward.
    let endpoint = format!("unix://{}", node.socket.display());
    let mut child = Command::new(petrel_bin())
        .args([
            "ctl",
            "--endpoint",
            &endpoint,
            "exec",
            "-i",
            &web,
            "--",
            "cat",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"via-ctl\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "via-ctl\n");

    let mut pf = Command::new(petrel_bin())
        .args([
            "ctl",
            "--endpoint",
            &endpoint,
            "port-forward",
            &pod,
            ":8080",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(pf.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "Forwarding from 127.0.0.1:PORT -> 8080"
    let port: u16 = line
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert!(got.contains("hello-pf"), "{got}");
    let _ = pf.kill();
    let _ = pf.wait();
}
