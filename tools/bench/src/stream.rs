//! Streaming figures (P18, P19): an exec round trip through a runtime's
//! streaming server, and port-forward throughput into a pod, each against the
//! same thing on the reference in the same run.
//!
//! The port-forward target is the bench's own server, bound inside the pod's
//! network namespace (a thread `setns`es into it just to create the listening
//! socket), so the figure is the forwarding path's and not a busybox tool's.
//! A connection sends a big-endian u64 length and that many bytes; the
//! server answers with the count it read.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use petrel_cri::api;
use petrel_stream::client::{self, CommandOptions, Outcome, Transport};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::node::Clients;

/// The port the bench's server listens on in the pod.
pub const SINK_PORT: u16 = 7000;

/// One exec of `true` through the streaming server: the Exec call, the SPDY
/// session (stdout only, as `kubectl exec` without -i), its exit status.
pub async fn exec_round_trip(c: &mut Clients, container: &str) -> Result<Duration> {
    let t = Instant::now();
    let url =
        c.rt.exec(api::ExecRequest {
            container_id: container.to_string(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .context("Exec")?
        .into_inner()
        .url;
    let mut cmd = client::remote_command(
        &url,
        CommandOptions {
            stdout: true,
            transport: Transport::Spdy,
            ..Default::default()
        },
    )
    .await
    .with_context(|| format!("exec session at {url}"))?;
    if let Some(mut out) = cmd.stdout.take() {
        let mut sink = Vec::new();
        out.read_to_end(&mut sink).await.context("exec stdout")?;
    }
    let outcome = cmd.wait().await.context("exec status")?;
    let d = t.elapsed();
    anyhow::ensure!(
        matches!(outcome, Outcome::Success),
        "exec of true ended {outcome:?}"
    );
    Ok(d)
}

/// The pid of a running container's init, from its verbose status (both
/// runtimes put it in the `info` JSON).
pub async fn container_pid(c: &mut Clients, container: &str) -> Result<u32> {
    let st =
        c.rt.container_status(api::ContainerStatusRequest {
            container_id: container.to_string(),
            verbose: true,
        })
        .await
        .context("ContainerStatus")?
        .into_inner();
    let info = st.info.get("info").context("no verbose info")?;
    let v: serde_json::Value = serde_json::from_str(info).context("verbose info")?;
    v.get("pid")
        .and_then(|p| p.as_u64())
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
        .context("no pid in the verbose info")
}

/// Starts the counting server on 0.0.0.0:[`SINK_PORT`] in the network
/// namespace of process `pid` (reachable on the pod's loopback for
/// port-forward and on the pod IP for the direct reference).
pub fn start_sink(pid: u32) -> Result<()> {
    let ns = Path::new("/proc").join(pid.to_string()).join("ns/net");
    let listener = std::thread::scope(|s| {
        s.spawn(|| -> Result<std::net::TcpListener> {
            let f = std::fs::File::open(&ns).with_context(|| format!("open {}", ns.display()))?;
            // Only this short-lived thread changes namespace; the socket
            // keeps the pod's namespace after the thread is gone.
            rustix::thread::move_into_link_name_space(
                f.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .with_context(|| format!("setns {}", ns.display()))?;
            let l = std::net::TcpListener::bind(("0.0.0.0", SINK_PORT))
                .context("bind the sink in the pod")?;
            l.set_nonblocking(true).context("nonblocking")?;
            Ok(l)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("sink thread panicked"))?
    })?;
    let listener = TcpListener::from_std(listener).context("sink listener")?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The length comes first: a forwarder need not pass a
                // half-close on (containerd 1.7's does not).
                let mut len = [0u8; 8];
                if s.read_exact(&mut len).await.is_err() {
                    return;
                }
                let want = u64::from_be_bytes(len);
                let mut buf = vec![0u8; 256 << 10];
                let mut n: u64 = 0;
                while n < want {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k as u64,
                    }
                }
                let _ = s.write_all(&n.to_be_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Ok(())
}

/// Sends `total` bytes through one connection to the sink and waits for its
/// count: the time from the first byte to the count's arrival. The writer is
/// only dropped afterwards (with the connection).
async fn push(
    mut reader: impl AsyncRead + Unpin,
    mut writer: impl AsyncWrite + Unpin,
    total: u64,
) -> Result<Duration> {
    let block = vec![7u8; 1 << 20];
    let t = Instant::now();
    writer
        .write_all(&total.to_be_bytes())
        .await
        .context("send")?;
    let mut left = total;
    while left > 0 {
        let k = left.min(block.len() as u64) as usize;
        writer.write_all(&block[..k]).await.context("send")?;
        left -= k as u64;
    }
    writer.flush().await.context("send")?;
    let mut count = [0u8; 8];
    reader
        .read_exact(&mut count)
        .await
        .context("sink's count")?;
    let d = t.elapsed();
    let got = u64::from_be_bytes(count);
    anyhow::ensure!(got == total, "the sink counted {got} of {total} bytes");
    Ok(d)
}

/// `total` bytes through the runtime's port-forward (SPDY, as kubectl).
pub async fn port_forward_push(c: &mut Clients, pod: &str, total: u64) -> Result<Duration> {
    let url =
        c.rt.port_forward(api::PortForwardRequest {
            pod_sandbox_id: pod.to_string(),
            port: vec![i32::from(SINK_PORT)],
        })
        .await
        .context("PortForward")?
        .into_inner()
        .url;
    let fw = client::PortForwarder::connect(&url)
        .await
        .with_context(|| format!("port-forward session at {url}"))?;
    let s = fw.open(SINK_PORT).await.context("open a forward")?;
    let d = push(s.reader, s.writer, total).await;
    fw.close().await;
    d
}

/// `total` bytes over TCP straight to the pod IP: the reference.
pub async fn direct_push(ip: &str, total: u64) -> Result<Duration> {
    let s = TcpStream::connect((ip, SINK_PORT))
        .await
        .with_context(|| format!("connect {ip}:{SINK_PORT}"))?;
    let (r, w) = s.into_split();
    push(r, w, total).await
}

/// The pod's IP from its status.
pub async fn pod_ip(c: &mut Clients, pod: &str) -> Result<String> {
    let st =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.to_string(),
            verbose: false,
        })
        .await
        .context("PodSandboxStatus")?
        .into_inner();
    st.status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .filter(|ip| !ip.is_empty())
        .context("the pod has no IP")
}
