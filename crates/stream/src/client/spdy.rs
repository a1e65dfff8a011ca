//! The SPDY side of the client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{
    collect, upgrade, ClientError, Closer, CommandOptions, ForwardError, ForwardedStream,
    PortForwarder, RemoteCommand,
};
use crate::pipe::ChunkReader;
use crate::protocol::status::Outcome;
use crate::protocol::{
    resize, stream_type, Version, PORT, PORT_FORWARD, REQUEST_ID, STREAM_TYPE, V4, V5,
};
use crate::spdy::session::Session;

/// How long the server may take to accept a stream.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

fn headers(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn proto(e: impl std::fmt::Display) -> ClientError {
    ClientError::Protocol(e.to_string())
}

pub(super) async fn remote_command(
    url: &str,
    opts: CommandOptions,
) -> Result<RemoteCommand, ClientError> {
    let (session, _incoming, negotiated) = upgrade::spdy_upgrade(url, &[V5, V4]).await?;
    let version = Version::of(&negotiated).ok_or_else(|| {
        ClientError::Protocol(format!("server chose unknown protocol {negotiated:?}"))
    })?;
    let open = |kind: &'static str| {
        let session = session.clone();
        async move {
            session
                .open(headers(&[(STREAM_TYPE, kind.to_owned())]), OPEN_TIMEOUT)
                .await
                .map_err(proto)
        }
    };
    // The error stream first, as client-go does.
    let error = open(stream_type::ERROR).await?;
    let _ = session.finish(error.id).await;
    let stdin = if opts.stdin {
        let s = open(stream_type::STDIN).await?;
        Some(Box::pin(session.writer(s.id)) as crate::Writer)
    } else {
        None
    };
    let stdout = if opts.stdout {
        let s = open(stream_type::STDOUT).await?;
        Some(Box::pin(ChunkReader::new(s.data)) as crate::Reader)
    } else {
        None
    };
    let stderr = if opts.stderr && !opts.tty {
        let s = open(stream_type::STDERR).await?;
        Some(Box::pin(ChunkReader::new(s.data)) as crate::Reader)
    } else {
        None
    };
    let resize = if opts.tty && version.resize() {
        let s = open(stream_type::RESIZE).await?;
        let (tx, mut rx) = mpsc::channel::<crate::TermSize>(8);
        let session = session.clone();
        tokio::spawn(async move {
            while let Some(size) = rx.recv().await {
                if session
                    .data(s.id, resize::encode(size).into(), false)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let _ = session.finish(s.id).await;
        });
        Some(tx)
    } else {
        None
    };
    let (status_tx, status_rx) = oneshot::channel();
    let collected = collect(ChunkReader::new(error.data));
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
        stdout,
        stderr,
        resize,
        protocol: negotiated,
        status: status_rx,
        closer: Closer::Spdy(session),
    })
}

pub(super) async fn port_forwarder(url: &str) -> Result<PortForwarder, ClientError> {
    let (session, _incoming, negotiated) = upgrade::spdy_upgrade(url, &[PORT_FORWARD]).await?;
    if negotiated != PORT_FORWARD {
        return Err(ClientError::Protocol(format!(
            "server chose protocol {negotiated:?} for port-forward"
        )));
    }
    Ok(PortForwarder {
        session,
        next_request: AtomicU64::new(0),
    })
}

pub(super) async fn open_forward(
    pf: &PortForwarder,
    port: u16,
) -> Result<ForwardedStream, ClientError> {
    let session: &Session = &pf.session;
    let request = pf.next_request.fetch_add(1, Ordering::Relaxed).to_string();
    let mut h = headers(&[
        (STREAM_TYPE, stream_type::ERROR.to_owned()),
        (PORT, port.to_string()),
        (REQUEST_ID, request),
    ]);
    let error = session.open(h.clone(), OPEN_TIMEOUT).await.map_err(proto)?;
    // Nothing is ever written to the error stream by the client.
    let _ = session.finish(error.id).await;
    h[0].1 = stream_type::DATA.to_owned();
    let data = session.open(h, OPEN_TIMEOUT).await.map_err(proto)?;
    let (tx, rx) = oneshot::channel();
    let collected = collect(ChunkReader::new(error.data));
    let forget = session.clone();
    let (error_id, data_id) = (error.id, data.id);
    tokio::spawn(async move {
        if let Ok(bytes) = collected.await {
            let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
        }
        // The server finishes the data stream before the error stream, so
        // both are done with here (queued data stays with the reader).
        forget.forget(error_id);
        forget.forget(data_id);
    });
    Ok(ForwardedStream {
        reader: Box::pin(ChunkReader::new(data.data)),
        writer: Box::pin(session.writer(data.id)),
        error: ForwardError(rx),
    })
}
