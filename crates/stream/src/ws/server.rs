//! Serving exec, attach and port-forward to a WebSocket client.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;

use super::conn::WsConn;
use crate::command::{self, Command};
use crate::forward::{self, ToClient};
use crate::pipe::{ChunkReader, QUEUE};
use crate::protocol::{channel, Version};
use crate::server::Ctx;
use crate::StreamIo;

/// Serves an exec or attach on an upgraded connection.
pub(crate) async fn remote_command<S>(
    ws: WebSocketStream<S>,
    version: Version,
    cmd: Command,
    ctx: Arc<Ctx>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut inputs = HashMap::new();
    let stdin = cmd.stdin().then(|| {
        let (tx, rx) = mpsc::channel(QUEUE);
        inputs.insert(channel::STDIN, tx);
        ChunkReader::new(rx)
    });
    let resize_in = (cmd.tty() && version.resize()).then(|| {
        let (tx, rx) = mpsc::channel(QUEUE);
        inputs.insert(channel::RESIZE, tx);
        ChunkReader::new(rx)
    });
    let conn = WsConn::start(
        ws,
        version.base64,
        inputs,
        version.number >= 5,
        ctx.config.idle_timeout,
    );

    // An empty message on the lowest channel this end writes tells the
    // client the streams are ready (kubelet does the same).
    let first = if cmd.stdout() {
        channel::STDOUT
    } else if cmd.stderr() {
        channel::STDERR
    } else {
        channel::ERROR
    };
    conn.send(first, &[]).await;

    let resize = resize_in.map(|input| {
        let (tx, rx) = mpsc::channel(8);
        command::spawn_resize_decoder(input, tx);
        rx
    });
    let io = StreamIo {
        stdin: stdin.map(|r| Box::pin(r) as crate::Reader),
        stdout: cmd
            .stdout()
            .then(|| Box::pin(conn.writer(channel::STDOUT, None)) as crate::Writer),
        stderr: cmd
            .stderr()
            .then(|| Box::pin(conn.writer(channel::STDERR, None)) as crate::Writer),
        resize,
    };
    let stop = ctx.stop.child_token();
    let closed = conn.closed_token();
    let watch = stop.clone();
    let watcher = tokio::spawn(async move {
        closed.cancelled().await;
        watch.cancel();
    });
    let outcome = command::run(ctx.backend.clone(), cmd, io, stop).await;
    watcher.abort();
    if let Some(outcome) = outcome {
        let payload = if version.json_status() {
            outcome.to_json()
        } else {
            outcome.to_text()
        };
        if !payload.is_empty() {
            conn.send(channel::ERROR, &payload).await;
        }
    }
    conn.close(ctx.config.linger).await;
}

/// Serves a port-forward: channels 2i (data) and 2i+1 (error) for port i.
pub(crate) async fn port_forward<S>(
    ws: WebSocketStream<S>,
    base64: bool,
    pod: String,
    ports: Vec<u16>,
    ctx: Arc<Ctx>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut inputs = HashMap::new();
    let mut readers = Vec::new();
    for (i, _) in ports.iter().enumerate() {
        let (tx, rx) = mpsc::channel(QUEUE);
        // Channel numbers are one byte: at most 128 ports per connection
        // (checked when the request was accepted).
        inputs.insert((2 * i) as u8, tx);
        readers.push(ChunkReader::new(rx));
    }
    let conn = WsConn::start(ws, base64, inputs, false, ctx.config.idle_timeout);
    let stop = ctx.stop.child_token();
    let mut tasks = Vec::new();
    for (i, (port, from_client)) in ports.into_iter().zip(readers).enumerate() {
        let data_ch = (2 * i) as u8;
        let err_ch = data_ch + 1;
        // Each channel starts with its port, little endian.
        conn.send(data_ch, &port.to_le_bytes()).await;
        conn.send(err_ch, &port.to_le_bytes()).await;
        let conn = conn.clone();
        let ctx = ctx.clone();
        let pod = pod.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let result = match ctx.backend.port_forward(&pod, port).await {
                Ok(tcp) => {
                    let to = ToClient::Ws {
                        conn: conn.clone(),
                        channel: data_ch,
                    };
                    let pair_stop = stop.child_token();
                    let closed = conn.closed_token();
                    let s = pair_stop.clone();
                    let watcher = tokio::spawn(async move {
                        closed.cancelled().await;
                        s.cancel();
                    });
                    let r = forward::forward(tcp, from_client, to, false, pair_stop)
                        .await
                        .map_err(|e| (e.to_string(), !forward::is_benign(&e)));
                    watcher.abort();
                    r
                }
                Err(e) => Err((e.to_string(), true)),
            };
            if let Err((msg, fatal)) = result {
                tracing::debug!(port, pod = %pod, error = %msg, "port-forward failed");
                conn.send(err_ch, &forward::error_message(port, &pod, &msg, fatal))
                    .await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    conn.close(ctx.config.linger).await;
}
