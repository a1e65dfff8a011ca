//! Serving exec, attach and port-forward to a SPDY client: the client opens
//! one stream per standard stream (by `streamtype` header), or a data and
//! an error stream per forwarded connection.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::frame::rst;
use super::session::{Incoming, Session};
use crate::command::{self, Command};
use crate::forward::{self, ToClient};
use crate::pipe::ChunkReader;
use crate::protocol::{stream_type, Version, PORT, REQUEST_ID, STREAM_TYPE};
use crate::server::Ctx;
use crate::StreamIo;

/// The streams of one exec or attach.
#[derive(Default)]
struct CommandStreams {
    error: Option<u32>,
    stdin: Option<Incoming>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<Incoming>,
}

/// Serves an exec or attach on an upgraded connection.
pub(crate) async fn remote_command(
    session: Session,
    mut incoming: mpsc::Receiver<Incoming>,
    version: Version,
    cmd: Command,
    ctx: Arc<Ctx>,
) {
    let expected = 1
        + usize::from(cmd.stdin())
        + usize::from(cmd.stdout())
        + usize::from(cmd.stderr())
        + usize::from(cmd.tty() && version.resize());
    let mut streams = CommandStreams::default();
    let mut received = 0;
    let deadline = tokio::time::sleep(ctx.config.stream_creation_timeout);
    tokio::pin!(deadline);
    while received < expected {
        let stream = tokio::select! {
            s = incoming.recv() => s,
            _ = &mut deadline => {
                tracing::warn!("timed out waiting for the client to create streams");
                None
            }
            _ = ctx.stop.cancelled() => None,
        };
        let Some(stream) = stream else {
            session.go_away().await;
            return;
        };
        // Every stream is accepted (as kubelet does); unknown ones are
        // then ignored.
        if session.reply(stream.id).await.is_err() {
            return;
        }
        let kind = stream.header(STREAM_TYPE).unwrap_or_default().to_owned();
        let slot_taken = match kind.as_str() {
            stream_type::ERROR => streams.error.replace(stream.id).is_some(),
            stream_type::STDOUT => streams.stdout.replace(stream.id).is_some(),
            stream_type::STDERR => streams.stderr.replace(stream.id).is_some(),
            stream_type::STDIN => streams.stdin.replace(stream).is_some(),
            stream_type::RESIZE => streams.resize.replace(stream).is_some(),
            other => {
                tracing::warn!(stream_type = other, "unexpected SPDY stream type");
                continue;
            }
        };
        if !slot_taken {
            received += 1;
        }
    }
    let resize = streams.resize.take().map(|s| {
        let (tx, rx) = mpsc::channel(8);
        command::spawn_resize_decoder(ChunkReader::new(s.data), tx);
        rx
    });
    let io = StreamIo {
        stdin: streams
            .stdin
            .take()
            .map(|s| Box::pin(ChunkReader::new(s.data)) as crate::Reader),
        stdout: streams
            .stdout
            .filter(|_| cmd.stdout())
            .map(|id| Box::pin(session.writer(id)) as crate::Writer),
        stderr: streams
            .stderr
            .filter(|_| cmd.stderr())
            .map(|id| Box::pin(session.writer(id)) as crate::Writer),
        resize,
    };
    let stop = ctx.stop.child_token();
    let watch = stop.clone();
    let s2 = session.clone();
    let watcher = tokio::spawn(async move {
        s2.closed().await;
        watch.cancel();
    });
    let outcome = command::run(ctx.backend.clone(), cmd, io, stop).await;
    watcher.abort();
    for id in [streams.stdout, streams.stderr].into_iter().flatten() {
        let _ = session.finish(id).await;
    }
    if let (Some(outcome), Some(id)) = (outcome, streams.error) {
        let payload = if version.json_status() {
            outcome.to_json()
        } else {
            outcome.to_text()
        };
        if !payload.is_empty() {
            let _ = session.data(id, payload.into(), false).await;
        }
        let _ = session.finish(id).await;
    }
    session.go_away().await;
    let _ = tokio::time::timeout(ctx.config.linger, session.closed()).await;
}

/// A forwarded connection's two streams, as they arrive.
#[derive(Default)]
struct Pair {
    data: Option<Incoming>,
    error: Option<Incoming>,
}

/// Serves port-forward streams until the connection ends.
pub(crate) async fn port_forward(
    session: Session,
    mut incoming: mpsc::Receiver<Incoming>,
    pod: String,
    ctx: Arc<Ctx>,
) {
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let (expire_tx, mut expire_rx) = mpsc::channel::<String>(16);
    loop {
        let stream = tokio::select! {
            s = incoming.recv() => match s {
                Some(s) => s,
                None => break,
            },
            Some(request) = expire_rx.recv() => {
                if let Some(pair) = pairs.remove(&request) {
                    time_out(&session, pair, &request).await;
                }
                continue;
            }
            _ = ctx.stop.cancelled() => break,
        };
        let port = match stream.header(PORT).map(str::parse::<u16>) {
            Some(Ok(p)) if p > 0 => p,
            other => {
                tracing::warn!(header = ?other, "port-forward stream without a valid port header");
                session.reset(stream.id, rst::PROTOCOL_ERROR).await;
                continue;
            }
        };
        let kind = stream.header(STREAM_TYPE).unwrap_or_default().to_owned();
        if kind != stream_type::DATA && kind != stream_type::ERROR {
            tracing::warn!(stream_type = %kind, "invalid port-forward stream type");
            session.reset(stream.id, rst::PROTOCOL_ERROR).await;
            continue;
        }
        if session.reply(stream.id).await.is_err() {
            break;
        }
        let request = match stream.header(REQUEST_ID) {
            Some(r) if !r.is_empty() => r.to_owned(),
            // Old clients send no request id: their data stream follows
            // its error stream with the next id (kubelet's fallback).
            _ if kind == stream_type::ERROR => stream.id.to_string(),
            _ => stream.id.saturating_sub(2).to_string(),
        };
        let pair = pairs.entry(request.clone()).or_insert_with(|| {
            let tx = expire_tx.clone();
            let request = request.clone();
            let timeout = ctx.config.stream_creation_timeout;
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                let _ = tx.send(request).await;
            });
            Pair::default()
        });
        let is_data = kind == stream_type::DATA;
        let taken = if is_data {
            pair.data.is_some()
        } else {
            pair.error.is_some()
        };
        if taken {
            let msg = format!(
                "error processing stream for request {request}: {kind} stream already assigned"
            );
            if let Some(err) = pair.error.as_ref() {
                let _ = session.data(err.id, msg.into_bytes().into(), false).await;
            }
            session.reset(stream.id, rst::PROTOCOL_ERROR).await;
            continue;
        }
        if is_data {
            pair.data = Some(stream);
        } else {
            pair.error = Some(stream);
        }
        if pair.data.is_some() && pair.error.is_some() {
            if let Some(Pair {
                data: Some(data),
                error: Some(error),
            }) = pairs.remove(&request)
            {
                tokio::spawn(forward_pair(
                    session.clone(),
                    data,
                    error,
                    port,
                    pod.clone(),
                    ctx.clone(),
                ));
            }
        }
    }
    session.go_away().await;
    let _ = tokio::time::timeout(ctx.config.linger, session.closed()).await;
}

async fn time_out(session: &Session, pair: Pair, request: &str) {
    if let Some(err) = pair.error {
        let msg = format!("timed out waiting for streams of request {request}");
        let _ = session.data(err.id, msg.into_bytes().into(), true).await;
        session.forget(err.id);
    }
    if let Some(data) = pair.data {
        session.reset(data.id, rst::CANCEL).await;
    }
}

async fn forward_pair(
    session: Session,
    data: Incoming,
    error: Incoming,
    port: u16,
    pod: String,
    ctx: Arc<Ctx>,
) {
    let result = match ctx.backend.port_forward(&pod, port).await {
        Ok(tcp) => {
            let stop = ctx.stop.child_token();
            let reset = session.reset_token(data.id);
            let s = stop.clone();
            let sess = session.clone();
            let watcher = tokio::spawn(async move {
                tokio::select! {
                    _ = reset.cancelled() => {}
                    _ = sess.closed() => {}
                }
                s.cancel();
            });
            let to = ToClient::Spdy {
                session: session.clone(),
                id: data.id,
            };
            let r = forward::forward(tcp, ChunkReader::new(data.data), to, true, stop)
                .await
                .map_err(|e| (e.to_string(), !forward::is_benign(&e)));
            watcher.abort();
            r
        }
        Err(e) => Err((e.to_string(), true)),
    };
    if let Err((msg, fatal)) = result {
        tracing::debug!(port, pod = %pod, error = %msg, "port-forward failed");
        let payload = forward::error_message(port, &pod, &msg, fatal);
        let _ = session.data(error.id, payload.into(), false).await;
    }
    let _ = session.finish(data.id).await;
    let _ = session.finish(error.id).await;
    session.forget(data.id);
    session.forget(error.id);
}
