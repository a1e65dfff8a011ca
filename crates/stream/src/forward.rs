//! Copies one forwarded connection both ways between a client stream and a
//! TCP connection the backend opened in the pod.

use std::io;

use bytes::{BufMut, BytesMut};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::pipe::ChunkReader;
use crate::spdy::session::Session;
use crate::ws::conn::WsConn;

/// Bytes read from the pod's connection per chunk sent to the client.
const CHUNK: usize = 256 * 1024;

/// Where data from the pod goes.
pub(crate) enum ToClient {
    /// A SPDY data stream.
    Spdy { session: Session, id: u32 },
    /// A WebSocket channel.
    Ws { conn: WsConn, channel: u8 },
}

impl ToClient {
    /// Bytes kept free at the front of each chunk for the message prefix.
    fn headroom(&self) -> usize {
        match self {
            ToClient::Spdy { .. } => 0,
            ToClient::Ws { conn, .. } if !conn.base64() => 1,
            ToClient::Ws { .. } => 0,
        }
    }

    async fn send(&self, mut chunk: BytesMut) -> bool {
        match self {
            ToClient::Spdy { session, id } => {
                session.data(*id, chunk.freeze(), false).await.is_ok()
            }
            ToClient::Ws { conn, channel } if !conn.base64() => {
                chunk[0] = *channel;
                conn.send_message(tokio_tungstenite::tungstenite::Message::Binary(
                    chunk.freeze(),
                ))
                .await
            }
            ToClient::Ws { conn, channel } => conn.send(*channel, &chunk).await,
        }
    }

    async fn finish(&self) {
        if let ToClient::Spdy { session, id } = self {
            let _ = session.finish(*id).await;
        }
    }
}

/// Copies until the pod's side has ended and (if `await_client`) the
/// client's side has ended too, or `stop` fires. Returns the first I/O
/// error on the pod's connection.
pub(crate) async fn forward(
    tcp: TcpStream,
    mut from_client: ChunkReader,
    to_client: ToClient,
    await_client: bool,
    stop: CancellationToken,
) -> io::Result<()> {
    let _ = tcp.set_nodelay(true);
    let (mut r, mut w) = tcp.into_split();
    let up = async {
        loop {
            let chunk = tokio::select! {
                c = from_client.next_chunk() => c,
                _ = stop.cancelled() => None,
            };
            match chunk {
                Some(c) => w.write_all(&c).await?,
                None => {
                    // The client finished (or reset) its side: pass the
                    // half-close on to the pod.
                    let _ = w.shutdown().await;
                    return Ok::<(), io::Error>(());
                }
            }
        }
    };
    let down = async {
        let headroom = to_client.headroom();
        let mut buf = BytesMut::new();
        loop {
            buf.reserve(CHUNK + headroom);
            buf.put_bytes(0, headroom);
            let n = tokio::select! {
                n = r.read_buf(&mut buf) => n?,
                _ = stop.cancelled() => 0,
            };
            if n == 0 {
                to_client.finish().await;
                return Ok::<(), io::Error>(());
            }
            if !to_client.send(buf.split()).await {
                return Ok(());
            }
        }
    };
    if await_client {
        let (a, b) = tokio::join!(up, down);
        return b.and(a);
    }
    // Without a way for the client to half-close (WebSocket), the pod's
    // side ending ends the forward; the client's side ending only stops
    // the upward copy.
    tokio::pin!(up, down);
    let mut up_done = false;
    loop {
        tokio::select! {
            r = &mut down => return r,
            r = &mut up, if !up_done => {
                up_done = true;
                r?;
            }
        }
    }
}

/// The error stream's message for a failed forward, as kubelet writes it.
pub(crate) fn error_message(port: u16, pod: &str, err: &str, close_connection: bool) -> Vec<u8> {
    #[derive(Serialize)]
    struct Resp<'a> {
        #[serde(rename = "closeConnection", skip_serializing_if = "std::ops::Not::not")]
        close_connection: bool,
        message: &'a str,
    }
    let message = format!("error forwarding port {port} to pod {pod}, uid : {err}");
    let mut v = serde_json::to_vec(&Resp {
        close_connection,
        message: &message,
    })
    .unwrap_or_else(|_| message.clone().into_bytes());
    v.push(b'\n');
    v
}

/// Whether a forwarding error leaves the rest of the connection usable
/// (kubelet: the pod reset the connection, or stopped reading).
pub(crate) fn is_benign(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}
