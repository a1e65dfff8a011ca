//! One WebSocket connection carrying numbered channels: each message starts
//! with its channel number (binary protocols) or the channel digit followed
//! by base64 (the `base64.` protocols). A reader task routes incoming
//! messages to per-channel queues; a writer task sends what the channels'
//! writers queue, so a blocked reader never stops writes and vice versa.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use crate::pipe::FrameWriter;
use crate::protocol::channel;

/// Messages queued for the writer task.
const OUT_QUEUE: usize = 64;

/// Encodes `data` for `channel`.
pub(crate) fn encode(channel: u8, data: &[u8], base64: bool) -> Message {
    if base64 {
        let mut s = String::with_capacity(1 + data.len().div_ceil(3) * 4);
        s.push(char::from(b'0'.wrapping_add(channel)));
        base64::engine::general_purpose::STANDARD.encode_string(data, &mut s);
        Message::Text(s.into())
    } else {
        let mut v = Vec::with_capacity(1 + data.len());
        v.push(channel);
        v.extend_from_slice(data);
        Message::Binary(v.into())
    }
}

/// The channel and payload of an incoming message, if it is a data message.
fn decode(msg: Message, base64: bool) -> Option<(u8, Bytes)> {
    match msg {
        Message::Binary(b) if !base64 && !b.is_empty() => Some((b[0], b.slice(1..))),
        Message::Text(t) if base64 && !t.is_empty() => {
            let bytes = t.as_bytes();
            let ch = bytes[0].wrapping_sub(b'0');
            let data = base64::engine::general_purpose::STANDARD
                .decode(&bytes[1..])
                .ok()?;
            Some((ch, Bytes::from(data)))
        }
        _ => None,
    }
}

/// The running connection.
#[derive(Clone)]
pub(crate) struct WsConn {
    out: mpsc::Sender<Message>,
    base64: bool,
    /// Cancelled when the read side has ended (peer closed or failed).
    closed: CancellationToken,
}

impl WsConn {
    /// Starts the reader and writer tasks. `inputs` receive the payloads of
    /// their channels (messages for other channels are dropped);
    /// `close_signal` (protocol v5) lets the peer end one channel with
    /// `[255, n]`.
    pub(crate) fn start<S>(
        ws: WebSocketStream<S>,
        base64: bool,
        mut inputs: HashMap<u8, mpsc::Sender<Bytes>>,
        close_signal: bool,
        idle_timeout: Option<Duration>,
    ) -> WsConn
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (mut sink, mut stream) = ws.split();
        let (out_tx, mut out_rx) = mpsc::channel::<Message>(OUT_QUEUE);
        let closed = CancellationToken::new();
        let (activity, idle) = crate::idle::watch(idle_timeout, closed.clone());
        let write_activity = activity.clone();
        let write_closed = closed.clone();
        tokio::spawn(async move {
            let result: Result<(), tokio_tungstenite::tungstenite::Error> = async {
                while let Some(first) = out_rx.recv().await {
                    let mut item = Some(first);
                    while let Some(msg) = item.take() {
                        let is_close = matches!(msg, Message::Close(_));
                        sink.feed(msg).await?;
                        if is_close {
                            sink.flush().await?;
                            return Ok(());
                        }
                        item = out_rx.try_recv().ok();
                    }
                    sink.flush().await?;
                    write_activity.touch();
                }
                sink.close().await
            }
            .await;
            if let Err(e) = result {
                tracing::debug!(error = %e, "WebSocket write failed");
                write_closed.cancel();
            }
        });
        let read_closed = closed.clone();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = stream.next() => m,
                    _ = idle.cancelled() => break,
                };
                let Some(msg) = msg else { break };
                activity.touch();
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::debug!(error = %e, "WebSocket read failed");
                        break;
                    }
                };
                if matches!(msg, Message::Close(_)) {
                    // End every channel now; keep polling so the library
                    // answers the close and the stream ends by itself.
                    inputs.clear();
                    continue;
                }
                let Some((ch, payload)) = decode(msg, base64) else {
                    continue;
                };
                if close_signal && ch == channel::CLOSE {
                    if let Some(&target) = payload.first() {
                        inputs.remove(&target);
                    }
                    continue;
                }
                if payload.is_empty() {
                    continue;
                }
                if let Some(tx) = inputs.get(&ch) {
                    if tx.send(payload).await.is_err() {
                        // The consumer is gone: drop its data from now on.
                        inputs.remove(&ch);
                    }
                }
            }
            drop(inputs);
            read_closed.cancel();
        });
        WsConn {
            out: out_tx,
            base64,
            closed,
        }
    }

    /// Whether the messages are base64 text.
    pub(crate) fn base64(&self) -> bool {
        self.base64
    }

    /// Resolves when the read side has ended.
    pub(crate) async fn closed(&self) {
        self.closed.cancelled().await
    }

    /// The read side's end, as a token.
    pub(crate) fn closed_token(&self) -> CancellationToken {
        self.closed.clone()
    }

    /// Sends `data` on `channel`.
    pub(crate) async fn send(&self, channel: u8, data: &[u8]) -> bool {
        self.out
            .send(encode(channel, data, self.base64))
            .await
            .is_ok()
    }

    /// Sends a prepared message.
    pub(crate) async fn send_message(&self, msg: Message) -> bool {
        self.out.send(msg).await.is_ok()
    }

    /// An `AsyncWrite` for `channel`; `close` is sent on shutdown (the v5
    /// close signal from a client), if given.
    pub(crate) fn writer(&self, channel: u8, close: Option<Message>) -> FrameWriter<Message> {
        let base64 = self.base64;
        FrameWriter::new(
            self.out.clone(),
            Box::new(move |b: &[u8]| encode(channel, b, base64)),
            close,
        )
    }

    /// Sends a normal close and waits (at most `linger`) for the peer's.
    pub(crate) async fn close(&self, linger: Duration) {
        let frame = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = self.out.send(Message::Close(Some(frame))).await;
        let _ = tokio::time::timeout(linger, self.closed()).await;
    }
}

/// The v5 signal that this end will write no more on `channel`.
pub(crate) fn close_signal(channel: u8) -> Message {
    Message::Binary(vec![channel::CLOSE, channel].into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codecs_round_trip() {
        for b64 in [false, true] {
            let m = encode(2, b"hello", b64);
            assert_eq!(decode(m, b64), Some((2, Bytes::from_static(b"hello"))));
        }
        assert!(matches!(encode(1, b"\n", true), Message::Text(t) if t.as_str() == "1Cg=="));
    }
}
