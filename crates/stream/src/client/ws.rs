//! The WebSocket side of the client.

use std::collections::HashMap;

use ::http::HeaderValue;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Error as WsError;

use super::{
    collect, upgrade, ClientError, Closer, CommandOptions, ForwardError, ForwardedStream,
    RemoteCommand,
};
use crate::pipe::{ChunkReader, QUEUE};
use crate::protocol::status::Outcome;
use crate::protocol::{channel, resize, Version, PORT, V4, V5};
use crate::ws::conn::{close_signal, WsConn};

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn connect(url: &str, protocols: &[&str]) -> Result<(Ws, String), ClientError> {
    let target = upgrade::parse(url)?;
    let ws_url = format!("ws://{}{}", target.authority, target.path);
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| ClientError::Url {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
    let offer = HeaderValue::from_str(&protocols.join(", "))
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    request
        .headers_mut()
        .insert(http_header::SEC_WEBSOCKET_PROTOCOL, offer);
    let tcp = upgrade::connect(&target.authority).await?;
    let (ws, resp) = match tokio_tungstenite::client_async(request, tcp).await {
        Ok(r) => r,
        Err(WsError::Http(resp)) => {
            let status = resp.status().as_u16();
            let body = resp
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).trim().to_owned())
                .unwrap_or_default();
            return Err(ClientError::Refused { status, body });
        }
        Err(e) => return Err(ClientError::Protocol(e.to_string())),
    };
    let negotiated = resp
        .headers()
        .get(http_header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Ok((ws, negotiated))
}

use ::http::header as http_header;

pub(super) async fn remote_command(
    url: &str,
    opts: CommandOptions,
) -> Result<RemoteCommand, ClientError> {
    let (ws, negotiated) = connect(url, &[V5, V4]).await?;
    let version = Version::of(&negotiated).ok_or_else(|| {
        ClientError::Protocol(format!("server chose unknown protocol {negotiated:?}"))
    })?;
    let mut inputs = HashMap::new();
    let mut add = |ch: u8| {
        let (tx, rx) = mpsc::channel::<Bytes>(QUEUE);
        inputs.insert(ch, tx);
        ChunkReader::new(rx)
    };
    let stdout = opts.stdout.then(|| add(channel::STDOUT));
    let stderr = (opts.stderr && !opts.tty).then(|| add(channel::STDERR));
    let error = add(channel::ERROR);
    let conn = WsConn::start(ws, version.base64, inputs, false, None);
    let stdin = opts.stdin.then(|| {
        let close = (version.number >= 5).then(|| close_signal(channel::STDIN));
        Box::pin(conn.writer(channel::STDIN, close)) as crate::Writer
    });
    let resize = (opts.tty && version.resize()).then(|| {
        let (tx, mut rx) = mpsc::channel::<crate::TermSize>(8);
        let conn = conn.clone();
        tokio::spawn(async move {
            while let Some(size) = rx.recv().await {
                if !conn.send(channel::RESIZE, &resize::encode(size)).await {
                    return;
                }
            }
        });
        tx
    });
    // The error channel ends with the connection: the server closes it
    // after writing the status.
    let (status_tx, status_rx) = oneshot::channel();
    let collected = collect(error);
    tokio::spawn(async move {
        if let Ok(bytes) = collected.await {
            // From v4 on a server always writes a status: none means the
            // connection ended early (the sender is dropped: `NoStatus`).
            if version.json_status() && bytes.iter().all(u8::is_ascii_whitespace) {
                return;
            }
            let _ = status_tx.send(Outcome::parse(&bytes, version.json_status()));
        }
    });
    Ok(RemoteCommand {
        stdin,
        stdout: stdout.map(|r| Box::pin(r) as crate::Reader),
        stderr: stderr.map(|r| Box::pin(r) as crate::Reader),
        resize,
        protocol: negotiated,
        status: status_rx,
        closer: Closer::Ws(conn),
    })
}

/// Drops the first two bytes of a channel (the port number the server
/// writes first) and forwards the rest.
fn skip_port_prefix(mut input: ChunkReader) -> ChunkReader {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        let mut skip = 2usize;
        while let Some(mut chunk) = input.next_chunk().await {
            if skip > 0 {
                let n = skip.min(chunk.len());
                let _ = chunk.split_to(n);
                skip -= n;
            }
            if !chunk.is_empty() && tx.send(chunk).await.is_err() {
                return;
            }
        }
    });
    ChunkReader::new(rx)
}

pub(super) async fn port_forward(
    url: &str,
    ports: &[u16],
) -> Result<Vec<ForwardedStream>, ClientError> {
    let query: Vec<String> = ports.iter().map(|p| format!("{PORT}={p}")).collect();
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}{}", query.join("&"));
    let (ws, negotiated) = connect(&url, &[V4]).await?;
    if negotiated != V4 {
        return Err(ClientError::Protocol(format!(
            "server chose protocol {negotiated:?} for port-forward"
        )));
    }
    let mut inputs = HashMap::new();
    let mut pairs = Vec::new();
    for i in 0..ports.len() {
        let data_ch = (2 * i) as u8;
        let (dtx, drx) = mpsc::channel::<Bytes>(QUEUE);
        let (etx, erx) = mpsc::channel::<Bytes>(QUEUE);
        inputs.insert(data_ch, dtx);
        inputs.insert(data_ch + 1, etx);
        pairs.push((data_ch, ChunkReader::new(drx), ChunkReader::new(erx)));
    }
    let conn = WsConn::start(ws, false, inputs, false, None);
    let mut out = Vec::new();
    for (data_ch, data, error) in pairs {
        let (tx, rx) = oneshot::channel();
        let collected = collect(skip_port_prefix(error));
        tokio::spawn(async move {
            if let Ok(bytes) = collected.await {
                let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
            }
        });
        out.push(ForwardedStream {
            reader: Box::pin(skip_port_prefix(data)),
            writer: Box::pin(conn.writer(data_ch, None)),
            error: ForwardError(rx),
        });
    }
    Ok(out)
}
