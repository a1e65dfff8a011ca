//! One SPDY/3.1 connection: a reader task that decodes frames and routes
//! stream data to per-stream queues, and a writer task that owns the
//! socket's write half and the header compressor. Both roles use it: the
//! server accepts streams the client opens, the client opens them.
//!
//! Flow control: the session replenishes the peer's send window
//! (WINDOW_UPDATE) as each stream's bounded queue takes the data, so a peer
//! that honours windows never stalls. It does not hold its own writes to
//! the peer's window: Kubernetes' SPDY library (moby/spdystream) never sends
//! WINDOW_UPDATE, so a sender that waited for one would stop after the
//! first 64 KiB. Back-pressure comes from TCP and the bounded queues.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::frame::{self, data_header, rst, Frame, Headers, FLAG_FIN};
use super::zlib::{Deflater, Inflater};
use crate::idle::Activity;
use crate::pipe::{FrameWriter, QUEUE};

/// Read buffer growth: at least this much room per read...
const MIN_READ: usize = 64 * 1024;
/// ...and at most this much: room for eight of the largest DATA frames
/// seen, so that a frame cut by a read is rarely copied when the buffer
/// is renewed, while a session with small frames keeps a small buffer.
const MAX_READ: usize = 2 * 1024 * 1024;
/// Window credit returned to the peer once this much of a stream was taken.
const WINDOW_REFILL: u32 = 32 * 1024;
/// Items queued for the writer task.
const OUT_QUEUE: usize = 64;

/// Which end of the connection this is; decides stream id parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Server,
}

/// Something for the writer task to put on the wire.
pub(crate) enum Out {
    Control(Frame),
    Data {
        stream_id: u32,
        fin: bool,
        payload: Bytes,
    },
    /// Flush and shut down the write half.
    Close,
}

/// A stream the peer opened.
pub(crate) struct Incoming {
    pub(crate) id: u32,
    pub(crate) headers: Headers,
    pub(crate) data: mpsc::Receiver<Bytes>,
}

impl Incoming {
    /// The value of header `name`.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        frame::header(&self.headers, name)
    }
}

/// A stream this end opened and the peer accepted.
pub(crate) struct Opened {
    pub(crate) id: u32,
    pub(crate) data: mpsc::Receiver<Bytes>,
}

struct StreamState {
    /// Where the stream's data goes; `None` once the peer finished it.
    data_tx: Option<mpsc::Sender<Bytes>>,
    /// For streams this end opened: told when the peer replies or resets.
    reply: Option<oneshot::Sender<Result<(), u32>>>,
    /// Cancelled when the peer resets the stream.
    reset: CancellationToken,
    /// Data taken since the last WINDOW_UPDATE.
    unacked: u32,
}

struct Shared {
    streams: Mutex<HashMap<u32, StreamState>>,
    next_id: AtomicU32,
    /// Held from picking a stream id to queueing its SYN_STREAM: ids must
    /// reach the wire in increasing order.
    open_lock: tokio::sync::Mutex<()>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, StreamState>> {
        // Map operations are single inserts/removes: poison is harmless.
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The handle both roles use to act on a connection. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Session {
    out: mpsc::Sender<Out>,
    shared: Arc<Shared>,
    closed: CancellationToken,
}

/// The connection is gone.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("SPDY connection closed")]
    Closed,
    #[error("SPDY stream refused by the peer (status {0})")]
    Refused(u32),
    #[error("timed out waiting for the peer to accept a SPDY stream")]
    Timeout,
}

impl Session {
    /// Starts the reader and writer tasks on a connection. `buffered` holds
    /// bytes already read from `read` (after the HTTP upgrade). Returns the
    /// session and the streams the peer opens.
    pub(crate) fn start<R, W>(
        read: R,
        write: W,
        buffered: BytesMut,
        role: Role,
        idle_timeout: Option<Duration>,
    ) -> Result<(Session, mpsc::Receiver<Incoming>), super::zlib::ZlibError>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let deflater = Deflater::new()?;
        let (out_tx, out_rx) = mpsc::channel(OUT_QUEUE);
        let (in_tx, in_rx) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared {
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(if role == Role::Client { 1 } else { 2 }),
            open_lock: tokio::sync::Mutex::new(()),
        });
        let closed = CancellationToken::new();
        let session = Session {
            out: out_tx,
            shared,
            closed,
        };
        let (activity, idle) = crate::idle::watch(idle_timeout, session.closed.clone());
        tokio::spawn(write_loop(
            write,
            out_rx,
            deflater,
            session.closed.clone(),
            activity.clone(),
        ));
        tokio::spawn(read_loop(
            read,
            buffered,
            role,
            session.clone(),
            in_tx,
            (activity, idle),
        ));
        Ok((session, in_rx))
    }

    /// Resolves when the connection has ended (read side gone).
    pub(crate) async fn closed(&self) {
        self.closed.cancelled().await
    }

    /// Accepts a stream the peer opened.
    pub(crate) async fn reply(&self, id: u32) -> Result<(), SessionError> {
        self.send(Out::Control(Frame::SynReply {
            stream_id: id,
            flags: 0,
            headers: Vec::new(),
        }))
        .await
    }

    /// Resets a stream (refuses or abandons it).
    pub(crate) async fn reset(&self, id: u32, status: u32) {
        self.forget(id);
        // A closed connection needs no reset.
        let _ = self
            .send(Out::Control(Frame::RstStream {
                stream_id: id,
                status,
            }))
            .await;
    }

    /// Forgets a stream this end is done with (data for it is dropped).
    pub(crate) fn forget(&self, id: u32) {
        self.shared.lock().remove(&id);
    }

    /// Cancelled when the peer resets stream `id` (or already gone).
    pub(crate) fn reset_token(&self, id: u32) -> CancellationToken {
        match self.shared.lock().get(&id) {
            Some(s) => s.reset.clone(),
            None => {
                let t = CancellationToken::new();
                t.cancel();
                t
            }
        }
    }

    /// Opens a stream with `headers` and waits for the peer to accept it.
    pub(crate) async fn open(
        &self,
        headers: Headers,
        timeout: Duration,
    ) -> Result<Opened, SessionError> {
        let guard = self.shared.open_lock.lock().await;
        let id = self.shared.next_id.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(QUEUE);
        let (reply_tx, reply_rx) = oneshot::channel();
        self.shared.lock().insert(
            id,
            StreamState {
                data_tx: Some(tx),
                reply: Some(reply_tx),
                reset: CancellationToken::new(),
                unacked: 0,
            },
        );
        self.send(Out::Control(Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers,
        }))
        .await?;
        drop(guard);
        match tokio::time::timeout(timeout, reply_rx).await {
            Ok(Ok(Ok(()))) => Ok(Opened { id, data: rx }),
            Ok(Ok(Err(status))) => Err(SessionError::Refused(status)),
            Ok(Err(_)) => Err(SessionError::Closed),
            Err(_) => {
                self.reset(id, rst::CANCEL).await;
                Err(SessionError::Timeout)
            }
        }
    }

    /// Sends one DATA frame (the payload is not copied).
    pub(crate) async fn data(
        &self,
        id: u32,
        payload: Bytes,
        fin: bool,
    ) -> Result<(), SessionError> {
        self.send(Out::Data {
            stream_id: id,
            fin,
            payload,
        })
        .await
    }

    /// Finishes this end's side of stream `id` (idempotent).
    pub(crate) async fn finish(&self, id: u32) -> Result<(), SessionError> {
        self.data(id, Bytes::new(), true).await
    }

    /// An `AsyncWrite` for stream `id`; shutting it down finishes the stream.
    pub(crate) fn writer(&self, id: u32) -> FrameWriter<Out> {
        FrameWriter::new(
            self.out.clone(),
            Box::new(move |b: &[u8]| Out::Data {
                stream_id: id,
                fin: false,
                payload: Bytes::copy_from_slice(b),
            }),
            Some(Out::Data {
                stream_id: id,
                fin: true,
                payload: Bytes::new(),
            }),
        )
    }

    /// Tells the peer no more streams will be accepted, then closes this
    /// end's write half once everything queued is written.
    pub(crate) async fn go_away(&self) {
        let _ = self
            .send(Out::Control(Frame::GoAway {
                last_good: 0,
                status: 0,
            }))
            .await;
        let _ = self.out.send(Out::Close).await;
    }

    async fn send(&self, item: Out) -> Result<(), SessionError> {
        self.out.send(item).await.map_err(|_| SessionError::Closed)
    }

    fn try_send(&self, item: Out) {
        // Used from the reader task, which must never wait for the writer
        // (both could be stuck on full socket buffers): a dropped PING
        // answer or window update is harmless.
        let _ = self.out.try_send(item);
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    write: W,
    mut rx: mpsc::Receiver<Out>,
    mut deflater: Deflater,
    closed: CancellationToken,
    activity: Arc<Activity>,
) {
    let mut w = BufWriter::with_capacity(64 * 1024, write);
    let mut finished: HashSet<u32> = HashSet::new();
    let mut scratch = BytesMut::new();
    let result: std::io::Result<()> = async {
        while let Some(first) = rx.recv().await {
            let mut item = Some(first);
            while let Some(it) = item.take() {
                match it {
                    Out::Close => {
                        w.flush().await?;
                        w.shutdown().await?;
                        return Ok(());
                    }
                    Out::Data {
                        stream_id,
                        fin,
                        payload,
                    } => {
                        if finished.contains(&stream_id) {
                            // Already finished: a second FIN or late data.
                        } else {
                            if fin {
                                finished.insert(stream_id);
                            }
                            let mut rest = payload;
                            loop {
                                let n = rest.len().min(frame::MAX_PAYLOAD);
                                let chunk = rest.split_to(n);
                                let last = rest.is_empty();
                                let header = data_header(stream_id, fin && last, n);
                                // Header and payload in one (vectored) write;
                                // big payloads bypass the buffer uncopied.
                                let mut frame = Buf::chain(&header[..], chunk);
                                w.write_all_buf(&mut frame).await?;
                                if last {
                                    break;
                                }
                            }
                        }
                    }
                    Out::Control(f) => {
                        if let Frame::RstStream { stream_id, .. } = f {
                            finished.insert(stream_id);
                        }
                        scratch.clear();
                        frame::encode_control(&f, &mut deflater, &mut scratch)
                            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                        w.write_all(&scratch).await?;
                    }
                }
                item = rx.try_recv().ok();
            }
            w.flush().await?;
            activity.touch();
        }
        w.flush().await
    }
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "SPDY connection write failed");
        closed.cancel();
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut read: R,
    mut buf: BytesMut,
    role: Role,
    session: Session,
    incoming: mpsc::Sender<Incoming>,
    (activity, idle): (Arc<Activity>, CancellationToken),
) {
    let mut inflater = Inflater::new();
    let mut going_away = false;
    let mut read_size = MIN_READ;
    let result: Result<(), String> = async {
        loop {
            let frame = match frame::decode(&mut buf, &mut inflater) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    // Room for the rest of a cut frame and a big read; a
                    // new buffer (the old one is still shared with frames
                    // handed out) copies only the cut frame's start.
                    let need = frame::frame_len(&buf).unwrap_or(frame::HEADER_LEN);
                    let spare = buf.capacity() - buf.len();
                    if buf.len() + spare < need || spare < read_size / 4 {
                        buf.reserve(need.max(buf.len() + read_size) - buf.len());
                    }
                    let n = tokio::select! {
                        n = read.read_buf(&mut buf) => n.map_err(|e| e.to_string())?,
                        _ = idle.cancelled() => return Err("idle timeout".into()),
                    };
                    if n == 0 {
                        return Ok(());
                    }
                    activity.touch();
                    continue;
                }
                Err(e) => return Err(e.to_string()),
            };
            match frame {
                Frame::SynStream {
                    stream_id,
                    flags,
                    headers,
                    ..
                } => {
                    let theirs = match role {
                        Role::Server => stream_id % 2 == 1,
                        Role::Client => stream_id % 2 == 0,
                    };
                    let duplicate = session.shared.lock().contains_key(&stream_id);
                    if !theirs || duplicate || going_away || stream_id == 0 {
                        session.try_send(Out::Control(Frame::RstStream {
                            stream_id,
                            status: rst::PROTOCOL_ERROR,
                        }));
                        continue;
                    }
                    let (tx, rx) = mpsc::channel(QUEUE);
                    session.shared.lock().insert(
                        stream_id,
                        StreamState {
                            data_tx: (flags & FLAG_FIN == 0).then_some(tx),
                            reply: None,
                            reset: CancellationToken::new(),
                            unacked: 0,
                        },
                    );
                    let stream = Incoming {
                        id: stream_id,
                        headers,
                        data: rx,
                    };
                    if incoming.send(stream).await.is_err() {
                        session.forget(stream_id);
                        session.try_send(Out::Control(Frame::RstStream {
                            stream_id,
                            status: rst::REFUSED_STREAM,
                        }));
                    }
                }
                Frame::SynReply {
                    stream_id, flags, ..
                } => {
                    let mut streams = session.shared.lock();
                    if let Some(s) = streams.get_mut(&stream_id) {
                        if let Some(r) = s.reply.take() {
                            let _ = r.send(Ok(()));
                        }
                        if flags & FLAG_FIN != 0 {
                            s.data_tx = None;
                        }
                    }
                }
                Frame::Headers {
                    stream_id, flags, ..
                } => {
                    if flags & FLAG_FIN != 0 {
                        if let Some(s) = session.shared.lock().get_mut(&stream_id) {
                            s.data_tx = None;
                        }
                    }
                }
                Frame::RstStream { stream_id, status } => {
                    if let Some(mut s) = session.shared.lock().remove(&stream_id) {
                        s.reset.cancel();
                        if let Some(r) = s.reply.take() {
                            let _ = r.send(Err(status));
                        }
                    }
                }
                Frame::Data {
                    stream_id,
                    fin,
                    payload,
                } => {
                    let len = payload.len() as u32;
                    read_size = read_size.max(payload.len() * 8).min(MAX_READ);
                    let tx = match session.shared.lock().get_mut(&stream_id) {
                        Some(s) => {
                            let tx = s.data_tx.clone();
                            if fin {
                                s.data_tx = None;
                            }
                            Some(tx)
                        }
                        None => None,
                    };
                    // An unknown stream (never opened, or forgotten by
                    // this end) or one the peer finished: drop the data.
                    if let Some(Some(tx)) = tx {
                        if !payload.is_empty() {
                            // Waits while the consumer is behind:
                            // back-pressure all the way to the peer.
                            let _ = tx.send(payload).await;
                            refill_window(&session, stream_id, len);
                        }
                    }
                }
                Frame::Ping(id) => {
                    let peers = match role {
                        Role::Server => id % 2 == 1,
                        Role::Client => id % 2 == 0,
                    };
                    if peers {
                        session.try_send(Out::Control(Frame::Ping(id)));
                    }
                }
                Frame::GoAway { .. } => going_away = true,
                Frame::Unknown(kind) => {
                    tracing::debug!(kind, "ignoring an unknown SPDY control frame");
                }
                Frame::Settings { .. } | Frame::WindowUpdate { .. } => {}
            }
        }
    }
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "SPDY connection read failed");
    }
    // End every stream: readers see end of file, openers an error.
    let streams: Vec<StreamState> = session.shared.lock().drain().map(|(_, s)| s).collect();
    for s in streams {
        s.reset.cancel();
    }
    // The peer is gone or done: close this end too once what is queued is
    // written (if the queue is full, the writer ends with its senders).
    session.try_send(Out::Close);
    session.closed.cancel();
}

fn refill_window(session: &Session, stream_id: u32, len: u32) {
    let delta = {
        let mut streams = session.shared.lock();
        let Some(s) = streams.get_mut(&stream_id) else {
            return;
        };
        s.unacked = s.unacked.saturating_add(len);
        if s.unacked < WINDOW_REFILL {
            return;
        }
        std::mem::take(&mut s.unacked)
    };
    session.try_send(Out::Control(Frame::WindowUpdate { stream_id, delta }));
}
