//! The NRI connection multiplexer.
//!
//! NRI runs two ttRPC conversations over one unix socket (the "trunk"): on logical
//! connection [`PLUGIN_SERVICE_CONN`] the runtime calls the plugin, on
//! [`RUNTIME_SERVICE_CONN`] the plugin calls the runtime. Every write on a logical
//! connection becomes one or more frames on the trunk:
//!
//! ```text
//! +----------------------+----------------------+-------------------+
//! | conn id (u32, BE)    | payload length (u32) | payload bytes ... |
//! +----------------------+----------------------+-------------------+
//! ```
//!
//! A write longer than [`MAX_PAYLOAD`] (one maximal ttRPC message with its header,
//! 4 MiB + 10 bytes) is split into several frames, as containerd's multiplexer does; the
//! receiver treats each logical connection as a byte stream, so frame boundaries carry no
//! meaning.
//!
//! Incoming data goes to each logical connection's `Sink`, called by the trunk's
//! reader task itself: the ttRPC client and server of `rpc` decode messages
//! right there (a response reaches its caller, a request its handler, with no task in
//! between, which is most of a call's latency on an idle machine), and a
//! [`ConnReader`] queue serves everything else.
//!
//! Differences from containerd's Go multiplexer, on purpose:
//! - A sink that cannot take more (a full [`ConnReader`] queue against its byte budget,
//!   [`MuxOptions::queue_bytes`]; a server with all its request slots busy) stops the
//!   reader until it can (backpressure through the kernel socket buffer) instead of
//!   closing everything.
//! - A frame for a connection id that was not opened, or with a length above the limit,
//!   closes the trunk with a typed [`MuxError`] (Go silently drops unknown ids and
//!   allocates whatever length the peer announces).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex as StdMutex};

use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;
use tokio::io::AsyncReadExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::ttrpc;

/// Identifies one logical connection on a trunk.
pub type ConnId = u32;

/// Logical connection carrying the Plugin service (the runtime is the client).
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// Logical connection carrying the Runtime service (the plugin is the client).
pub const RUNTIME_SERVICE_CONN: ConnId = 2;
/// Connection id 0 is reserved by the protocol and never opened.
pub const RESERVED_CONN: ConnId = 0;

/// Length of a frame header: connection id and payload length.
pub const FRAME_HEADER_LEN: usize = 8;
/// Largest payload of one frame: a maximal ttRPC message including its header.
pub const MAX_PAYLOAD: usize = ttrpc::MESSAGE_HEADER_LEN + ttrpc::MAX_MESSAGE_LEN;
/// Largest first frame of a ttRPC message a Go peer can read.
///
/// containerd's multiplexer hands a reader one whole frame per `Read` and fails with
/// ENOMEM if the reader's buffer is smaller than the frame; Go's ttRPC reads a message
/// header through a 4096-byte `bufio.Reader`. So a frame that starts a message must not
/// exceed 4096 bytes. Go's own writer (a 4096-byte `bufio.Writer`) emits the header
/// plus the first 4086 payload bytes as one frame and the rest as another; Petrel frames
/// its ttRPC messages the same way ([`ttrpc_message_parts`]). A reader's buffer is
/// empty at message boundaries then, and the second frame is read straight into the
/// message buffer, which it fits exactly.
pub const GO_READ_BUFFER: usize = 4096;

/// Splits one encoded ttRPC message (header and payload) into the parts Go's ttRPC
/// writer would have produced as frames: at most [`GO_READ_BUFFER`] bytes, then the
/// rest.
pub fn ttrpc_message_parts(message: &[u8]) -> [&[u8]; 2] {
    let first = message.len().min(GO_READ_BUFFER);
    [&message[..first], &message[first..]]
}

/// Default per-connection budget of queued, not yet consumed, incoming bytes.
pub const DEFAULT_QUEUE_BYTES: usize = 16 << 20;

/// Why a multiplexed trunk stopped working. The first cause is kept and reported to
/// every user of the trunk.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum MuxError {
    /// The peer closed the trunk between two frames.
    #[error("connection closed by the peer")]
    Eof,
    /// The trunk ended in the middle of a frame.
    #[error("connection closed in the middle of a frame ({got} of {want} bytes)")]
    Truncated {
        /// Bytes of the frame received.
        got: usize,
        /// Bytes the frame announced (header included).
        want: usize,
    },
    /// The peer sent a frame for a connection id that is not open on this side.
    #[error("frame for unknown connection id {0}")]
    UnknownConnection(ConnId),
    /// The peer announced a payload longer than the protocol allows.
    #[error("frame payload of {len} bytes for connection {conn} exceeds the limit of {max} bytes")]
    Oversized {
        /// Connection the frame was for.
        conn: ConnId,
        /// Announced payload length.
        len: usize,
        /// The limit ([`MAX_PAYLOAD`]).
        max: usize,
    },
    /// Reading or writing the trunk failed.
    #[error("trunk i/o error: {0}")]
    Io(String),
    /// This side closed the multiplexer.
    #[error("multiplexer closed")]
    Closed,
    /// Writing on a connection id that was not opened.
    #[error("connection id {0} is not open")]
    NotOpen(ConnId),
}

/// Tunables of a multiplexer.
#[derive(Debug, Clone)]
pub struct MuxOptions {
    /// Per-connection budget of received bytes waiting to be consumed. When it is used
    /// up the trunk is not read until the consumer catches up.
    pub queue_bytes: usize,
}

impl Default for MuxOptions {
    fn default() -> Self {
        MuxOptions {
            queue_bytes: DEFAULT_QUEUE_BYTES,
        }
    }
}

/// Encodes one logical write as trunk frames, splitting payloads longer than
/// [`MAX_PAYLOAD`]. An empty write yields one empty frame.
pub fn encode_frames(conn: ConnId, data: &[u8]) -> Vec<u8> {
    let frames = data.len().div_ceil(MAX_PAYLOAD).max(1);
    let mut out = Vec::with_capacity(data.len() + frames * FRAME_HEADER_LEN);
    let mut chunks = data.chunks(MAX_PAYLOAD);
    let mut first = true;
    loop {
        let chunk = match chunks.next() {
            Some(chunk) => chunk,
            None if first => &[][..],
            None => break,
        };
        first = false;
        out.extend_from_slice(&conn.to_be_bytes());
        // A chunk is at most MAX_PAYLOAD (< 2^32) bytes long.
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
        if chunk.is_empty() {
            break;
        }
    }
    out
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Logical connection.
    pub conn: ConnId,
    /// Payload bytes.
    pub payload: Bytes,
}

/// Takes the next complete frame off the front of `buf`. `Ok(None)` means more bytes
/// are needed. The header is checked before the payload has arrived, so an oversized
/// or misaddressed frame is refused without buffering it.
pub fn decode_frame(
    buf: &mut BytesMut,
    is_open: impl Fn(ConnId) -> bool,
) -> Result<Option<Frame>, MuxError> {
    if buf.len() < FRAME_HEADER_LEN {
        return Ok(None);
    }
    let conn = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let len = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(MuxError::Oversized {
            conn,
            len,
            max: MAX_PAYLOAD,
        });
    }
    if conn == RESERVED_CONN || !is_open(conn) {
        return Err(MuxError::UnknownConnection(conn));
    }
    if buf.len() < FRAME_HEADER_LEN + len {
        buf.reserve(FRAME_HEADER_LEN + len - buf.len());
        return Ok(None);
    }
    buf.advance(FRAME_HEADER_LEN);
    let payload = buf.split_to(len).freeze();
    Ok(Some(Frame { conn, payload }))
}

/// Bytes received for one logical connection, in order. Returns `None` once the trunk
/// is closed; [`Mux::error`] then tells why.
pub struct ConnReader {
    conn: ConnId,
    rx: mpsc::UnboundedReceiver<(Bytes, OwnedSemaphorePermit)>,
}

impl ConnReader {
    /// The logical connection this reader belongs to.
    pub fn conn(&self) -> ConnId {
        self.conn
    }

    /// Next chunk of received bytes. Consuming it returns its bytes to the queue budget.
    pub async fn recv(&mut self) -> Option<Bytes> {
        // The permit is dropped here, which frees the budget the reader task waits on.
        self.rx.recv().await.map(|(bytes, _permit)| bytes)
    }
}

/// What a [`Sink`] asks the reader to wait for before it reads the trunk again.
pub(crate) type SinkWait<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Receives the bytes of one logical connection, in order, on the trunk's reader task.
///
/// `push` must not block; when the sink cannot take more for now it returns a future,
/// and the trunk is not read again until that future completes. The sink is dropped
/// when the trunk ends (after [`Mux::error`] tells why).
pub(crate) trait Sink: Send + 'static {
    /// Takes the next bytes received on the connection.
    fn push<'a>(&'a mut self, mux: &'a Mux, data: Bytes) -> Option<SinkWait<'a>>;
}

/// The sink behind a [`ConnReader`]: a queue against a byte budget.
struct QueueSink {
    conn: ConnId,
    tx: mpsc::UnboundedSender<(Bytes, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
    queue_bytes: usize,
}

impl Sink for QueueSink {
    fn push<'a>(&'a mut self, _mux: &'a Mux, data: Bytes) -> Option<SinkWait<'a>> {
        let cost = (data.len() + FRAME_HEADER_LEN).min(self.queue_bytes);
        let permits = u32::try_from(cost).unwrap_or(u32::MAX);
        match self.budget.clone().try_acquire_many_owned(permits) {
            Ok(permit) => {
                if self.tx.send((data, permit)).is_err() {
                    self.dropped();
                }
                None
            }
            Err(_) => Some(Box::pin(self.wait_and_queue(data, permits))),
        }
    }
}

impl QueueSink {
    /// The queue is full: waits for budget (backpressure) unless the consumer went away,
    /// in which case nobody would ever free it.
    async fn wait_and_queue(&mut self, data: Bytes, permits: u32) {
        tokio::select! {
            permit = self.budget.clone().acquire_many_owned(permits) => {
                if let Ok(permit) = permit {
                    if self.tx.send((data, permit)).is_ok() {
                        return;
                    }
                }
            }
            _ = self.tx.closed() => {}
        }
        self.dropped();
    }

    fn dropped(&self) {
        tracing::debug!(
            conn = self.conn,
            "nri mux: data for a connection nobody reads dropped"
        );
    }
}

/// One write handed to the writer task: whole frames from `offset` on (what the
/// caller could not write at once), written without interruption.
struct Outgoing {
    frames: Vec<u8>,
    offset: usize,
    done: oneshot::Sender<Result<(), MuxError>>,
}

/// The trunk's write side: the socket half (gone once the trunk failed) and how many
/// writes the writer task still has to finish. A caller writes directly only when
/// none is outstanding, so frames stay in the order callers got the lock.
struct WriteSide {
    half: Option<Arc<OwnedWriteHalf>>,
    queued: usize,
}

struct Inner {
    writes: mpsc::UnboundedSender<Outgoing>,
    writer: StdMutex<WriteSide>,
    /// The logical connections opened; fixed once the trunk is read.
    conns: Vec<ConnId>,
    state: watch::Sender<Option<MuxError>>,
    tasks: StdMutex<Vec<JoinHandle<()>>>,
}

/// A multiplexed trunk. Cloning gives another handle on the same trunk.
#[derive(Clone)]
pub struct Mux {
    inner: Arc<Inner>,
}

/// The read side of a trunk opened with [`Mux::open`], not yet read.
pub(crate) struct Reading {
    mux: Mux,
    half: OwnedReadHalf,
}

impl Reading {
    /// Starts reading the trunk, each open connection's bytes going to its sink.
    /// Every connection opened needs exactly one sink.
    pub(crate) fn start(self, sinks: Vec<(ConnId, Box<dyn Sink>)>) -> Result<(), MuxError> {
        let mut by_conn: HashMap<ConnId, Box<dyn Sink>> = HashMap::with_capacity(sinks.len());
        for (conn, sink) in sinks {
            if !self.mux.inner.conns.contains(&conn) || by_conn.insert(conn, sink).is_some() {
                self.mux.fail(MuxError::NotOpen(conn));
                return Err(MuxError::NotOpen(conn));
            }
        }
        if let Some(&missing) = self
            .mux
            .inner
            .conns
            .iter()
            .find(|c| !by_conn.contains_key(c))
        {
            self.mux.fail(MuxError::NotOpen(missing));
            return Err(MuxError::NotOpen(missing));
        }
        let mux = self.mux;
        let reader = tokio::spawn(read_trunk(mux.clone(), self.half, by_conn));
        if let Ok(mut tasks) = mux.inner.tasks.lock() {
            tasks.push(reader);
        }
        // The reader may already have failed (garbage waiting on the socket) before its
        // handle was stored: stop the tasks now that they can be found.
        if mux.error().is_some() {
            mux.fail(MuxError::Closed);
        }
        Ok(())
    }
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux").field("error", &self.error()).finish()
    }
}

impl Mux {
    /// Starts multiplexing `trunk` with the given logical connections open. Frames for
    /// any other id close the trunk. Returns the readers in the order of `conns`.
    pub fn start(
        trunk: UnixStream,
        conns: &[ConnId],
        options: MuxOptions,
    ) -> Result<(Mux, Vec<ConnReader>), MuxError> {
        let (mux, reading) = Mux::open(trunk, conns)?;
        let queue_bytes = options.queue_bytes.max(FRAME_HEADER_LEN + 1);
        let mut readers = Vec::with_capacity(conns.len());
        let mut sinks: Vec<(ConnId, Box<dyn Sink>)> = Vec::with_capacity(conns.len());
        for &conn in conns {
            let (tx, rx) = mpsc::unbounded_channel();
            let budget = Arc::new(Semaphore::new(queue_bytes));
            sinks.push((
                conn,
                Box::new(QueueSink {
                    conn,
                    tx,
                    budget,
                    queue_bytes,
                }),
            ));
            readers.push(ConnReader { conn, rx });
        }
        reading.start(sinks)?;
        Ok((mux, readers))
    }

    /// Opens the trunk for writing on `conns`; nothing is read until
    /// [`Reading::start`] is given a sink for each of them (sinks may hold this `Mux`).
    pub(crate) fn open(trunk: UnixStream, conns: &[ConnId]) -> Result<(Mux, Reading), MuxError> {
        let mut open = Vec::with_capacity(conns.len());
        for &conn in conns {
            if conn == RESERVED_CONN || open.contains(&conn) {
                return Err(MuxError::NotOpen(conn));
            }
            open.push(conn);
        }
        let (read_half, write_half) = trunk.into_split();
        let (state, _) = watch::channel(None);
        let (writes, write_rx) = mpsc::unbounded_channel();
        let write_half = Arc::new(write_half);
        let inner = Arc::new(Inner {
            writes,
            writer: StdMutex::new(WriteSide {
                half: Some(write_half.clone()),
                queued: 0,
            }),
            conns: open,
            state,
            tasks: StdMutex::new(Vec::new()),
        });
        let mux = Mux { inner };
        let writer = tokio::spawn(write_trunk(mux.clone(), write_half, write_rx));
        if let Ok(mut tasks) = mux.inner.tasks.lock() {
            tasks.push(writer);
        }
        let reading = Reading {
            mux: mux.clone(),
            half: read_half,
        };
        Ok((mux, reading))
    }

    /// Writes `data` on logical connection `conn` as one or more frames. Writes from
    /// concurrent callers never interleave within a frame sequence.
    pub async fn write(&self, conn: ConnId, data: &[u8]) -> Result<(), MuxError> {
        self.write_parts(conn, &[data]).await
    }

    /// Writes each non-empty part as its own frame(s), all in one go (no frame of
    /// another writer in between). ttRPC messages use this to frame like Go's ttRPC
    /// does, see [`GO_READ_BUFFER`].
    ///
    /// Cancel-safe: the caller writes what the socket takes at once without waiting
    /// (the common case: no task switch on the way out); the rest is finished by the
    /// trunk's writer task, so a caller that gives up (a call's timeout) never leaves
    /// half a frame on the wire; once begun, a write completes. Writes reach the wire
    /// in the order callers get here.
    pub async fn write_parts(&self, conn: ConnId, parts: &[&[u8]]) -> Result<(), MuxError> {
        if !self.is_open(conn) {
            return Err(self.error().unwrap_or(MuxError::NotOpen(conn)));
        }
        let mut frames = Vec::new();
        for part in parts.iter().filter(|p| !p.is_empty()) {
            frames.extend_from_slice(&encode_frames(conn, part));
        }
        if frames.is_empty() {
            return Ok(());
        }
        let gone = || self.error().unwrap_or(MuxError::Closed);
        let written = {
            let mut side = self.inner.writer.lock().map_err(|_| gone())?;
            let half = side.half.clone().ok_or_else(gone)?;
            let mut offset = 0;
            if side.queued == 0 {
                while offset < frames.len() {
                    match half.try_write(&frames[offset..]) {
                        Ok(n) => offset += n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            drop(side);
                            let err = MuxError::Io(e.to_string());
                            self.fail(err.clone());
                            return Err(err);
                        }
                    }
                }
                if offset == frames.len() {
                    return Ok(());
                }
            }
            let (done, written) = oneshot::channel();
            self.inner
                .writes
                .send(Outgoing {
                    frames,
                    offset,
                    done,
                })
                .map_err(|_| gone())?;
            side.queued += 1;
            written
        };
        written.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Closes the trunk: pending and later operations fail with [`MuxError::Closed`].
    pub async fn close(&self) {
        self.fail(MuxError::Closed);
    }

    /// [`close`](Self::close) for places that cannot wait, such as `Drop`.
    pub fn close_now(&self) {
        self.fail(MuxError::Closed);
    }

    /// Records the first cause of the trunk's end; true if it was the first.
    fn record(&self, err: MuxError) -> bool {
        let first = self.inner.state.send_if_modified(|state| {
            if state.is_none() {
                *state = Some(err.clone());
                true
            } else {
                false
            }
        });
        if first {
            match &err {
                MuxError::Closed | MuxError::Eof => tracing::debug!(error = %err, "nri mux closed"),
                _ => tracing::warn!(error = %err, "nri mux closed"),
            }
        }
        first
    }

    /// Why the trunk stopped, or `None` while it works.
    pub fn error(&self) -> Option<MuxError> {
        self.inner.state.borrow().clone()
    }

    /// Waits until the trunk stops working and returns why.
    pub async fn closed(&self) -> MuxError {
        let mut rx = self.inner.state.subscribe();
        loop {
            if let Some(err) = rx.borrow_and_update().clone() {
                return err;
            }
            if rx.changed().await.is_err() {
                return MuxError::Closed;
            }
        }
    }

    fn is_open(&self, conn: ConnId) -> bool {
        self.inner.conns.contains(&conn) && self.inner.state.borrow().is_none()
    }

    /// Records the first error and stops the reader and writer tasks: the sinks go
    /// with the reader (readers see the end), the socket halves with both, so the peer
    /// sees the trunk closed at once.
    fn fail(&self, err: MuxError) {
        self.record(err);
        if let Ok(mut side) = self.inner.writer.lock() {
            side.half = None;
        }
        let tasks = self
            .inner
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for task in tasks {
            // A task calling this about itself is cancelled only at its next await,
            // and it has nothing left to do by then.
            task.abort();
        }
    }
}

/// Finishes the writes callers could not complete at once, in order.
async fn write_trunk(
    mux: Mux,
    trunk: Arc<OwnedWriteHalf>,
    mut writes: mpsc::UnboundedReceiver<Outgoing>,
) {
    while let Some(out) = writes.recv().await {
        let mut offset = out.offset;
        let r = loop {
            if offset >= out.frames.len() {
                break Ok(());
            }
            if let Err(e) = trunk.writable().await {
                break Err(e);
            }
            match trunk.try_write(&out.frames[offset..]) {
                Ok(n) => offset += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => break Err(e),
            }
        };
        if let Ok(mut side) = mux.inner.writer.lock() {
            side.queued = side.queued.saturating_sub(1);
        }
        match r {
            Ok(()) => {
                let _ = out.done.send(Ok(()));
            }
            Err(e) => {
                let err = MuxError::Io(e.to_string());
                let _ = out.done.send(Err(err.clone()));
                mux.fail(err);
                return;
            }
        }
    }
}

async fn read_trunk(mux: Mux, mut trunk: OwnedReadHalf, mut sinks: HashMap<ConnId, Box<dyn Sink>>) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let err = loop {
        let decoded = decode_frame(&mut buf, |id| sinks.contains_key(&id));
        match decoded {
            Ok(Some(frame)) => {
                if frame.payload.is_empty() {
                    continue;
                }
                let Some(sink) = sinks.get_mut(&frame.conn) else {
                    break MuxError::UnknownConnection(frame.conn);
                };
                if let Some(wait) = sink.push(&mux, frame.payload) {
                    wait.await;
                }
                continue;
            }
            Ok(None) => {}
            Err(err) => break err,
        }
        match trunk.read_buf(&mut buf).await {
            Ok(0) if buf.is_empty() => break MuxError::Eof,
            Ok(0) => {
                let want = if buf.len() >= FRAME_HEADER_LEN {
                    FRAME_HEADER_LEN + u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize
                } else {
                    FRAME_HEADER_LEN
                };
                break MuxError::Truncated {
                    got: buf.len(),
                    want,
                };
            }
            Ok(_) => {}
            Err(e) => break MuxError::Io(e.to_string()),
        }
    };
    // The cause is recorded before the sinks go, so their users can tell why.
    mux.record(err.clone());
    drop(sinks);
    mux.fail(err);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn open_1_2(id: ConnId) -> bool {
        id == 1 || id == 2
    }

    #[test]
    fn encodes_header_big_endian() {
        let got = encode_frames(2, b"abc");
        assert_eq!(got, vec![0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']);
        let got = encode_frames(0x0102_0304, b"");
        assert_eq!(got, vec![1, 2, 3, 4, 0, 0, 0, 0]);
    }

    #[test]
    fn splits_long_writes_at_the_payload_limit() {
        // MAX_PAYLOAD is 4 MiB + 10 = 0x0040_000A.
        assert_eq!(MAX_PAYLOAD, 0x0040_000A);
        let data: Vec<u8> = (0..MAX_PAYLOAD + 5).map(|i| (i % 251) as u8).collect();
        let got = encode_frames(1, &data);
        assert_eq!(got.len(), data.len() + 2 * FRAME_HEADER_LEN);
        assert_eq!(&got[..8], &[0, 0, 0, 1, 0x00, 0x40, 0x00, 0x0A]);
        let second = FRAME_HEADER_LEN + MAX_PAYLOAD;
        assert_eq!(&got[second..second + 8], &[0, 0, 0, 1, 0, 0, 0, 5]);
        assert_eq!(&got[second + 8..], &data[MAX_PAYLOAD..]);

        // Exactly the limit is one frame.
        let exact = vec![7u8; MAX_PAYLOAD];
        assert_eq!(
            encode_frames(1, &exact).len(),
            MAX_PAYLOAD + FRAME_HEADER_LEN
        );
    }

    #[test]
    fn ttrpc_messages_are_framed_as_go_frames_them() {
        let small = vec![1u8; 100];
        let [a, b] = ttrpc_message_parts(&small);
        assert_eq!((a.len(), b.len()), (100, 0));
        let big = vec![2u8; 10 + 5000];
        let [a, b] = ttrpc_message_parts(&big);
        assert_eq!((a.len(), b.len()), (4096, 914));
    }

    #[tokio::test]
    async fn write_parts_emits_one_frame_per_part() {
        let (a, mut raw) = UnixStream::pair().unwrap();
        let (m, _r) = Mux::start(a, &[1], MuxOptions::default()).unwrap();
        m.write_parts(1, &[b"ab", b"", b"c"]).await.unwrap();
        let mut got = [0u8; 19];
        raw.read_exact(&mut got).await.unwrap();
        assert_eq!(
            got,
            [0, 0, 0, 1, 0, 0, 0, 2, b'a', b'b', 0, 0, 0, 1, 0, 0, 0, 1, b'c']
        );
    }

    #[test]
    fn decodes_frames_from_hand_written_bytes() {
        let mut buf = BytesMut::from(&[0u8, 0, 0, 1, 0, 0, 0, 2, 0xAA, 0xBB, 0, 0, 0, 2][..]);
        let frame = decode_frame(&mut buf, open_1_2).unwrap().unwrap();
        assert_eq!(frame.conn, 1);
        assert_eq!(&frame.payload[..], &[0xAA, 0xBB]);
        // The second frame's header is incomplete.
        assert_eq!(decode_frame(&mut buf, open_1_2).unwrap(), None);
        buf.extend_from_slice(&[0, 0, 0, 1]);
        assert_eq!(decode_frame(&mut buf, open_1_2).unwrap(), None);
        buf.extend_from_slice(&[0x55]);
        let frame = decode_frame(&mut buf, open_1_2).unwrap().unwrap();
        assert_eq!((frame.conn, &frame.payload[..]), (2, &[0x55][..]));
        assert!(buf.is_empty());
    }

    #[test]
    fn refuses_unknown_and_reserved_ids() {
        let mut buf = BytesMut::from(&[0u8, 0, 0, 7, 0, 0, 0, 1, 9][..]);
        assert_eq!(
            decode_frame(&mut buf, open_1_2),
            Err(MuxError::UnknownConnection(7))
        );
        let mut buf = BytesMut::from(&[0u8, 0, 0, 0, 0, 0, 0, 0][..]);
        assert_eq!(
            decode_frame(&mut buf, |_| true),
            Err(MuxError::UnknownConnection(0))
        );
    }

    #[test]
    fn refuses_oversized_lengths_from_the_header_alone() {
        // 0x0040_000B = MAX_PAYLOAD + 1; no payload bytes are needed to refuse it.
        let mut buf = BytesMut::from(&[0u8, 0, 0, 1, 0x00, 0x40, 0x00, 0x0B][..]);
        assert_eq!(
            decode_frame(&mut buf, open_1_2),
            Err(MuxError::Oversized {
                conn: 1,
                len: MAX_PAYLOAD + 1,
                max: MAX_PAYLOAD
            })
        );
        let mut buf = BytesMut::from(&[0u8, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF][..]);
        assert!(matches!(
            decode_frame(&mut buf, open_1_2),
            Err(MuxError::Oversized { .. })
        ));
    }

    #[tokio::test]
    async fn round_trip_over_a_socketpair_with_split_payload() {
        let (a, b) = UnixStream::pair().unwrap();
        let (ma, _ra) = Mux::start(a, &[1, 2], MuxOptions::default()).unwrap();
        let (_mb, mut rb) = Mux::start(b, &[1, 2], MuxOptions::default()).unwrap();
        let big: Vec<u8> = (0..MAX_PAYLOAD + 100).map(|i| (i % 253) as u8).collect();
        let writer = {
            let ma = ma.clone();
            let big = big.clone();
            tokio::spawn(async move {
                ma.write(2, b"hello").await.unwrap();
                ma.write(1, &big).await.unwrap();
            })
        };
        let mut got2 = Vec::new();
        while got2.len() < 5 {
            got2.extend_from_slice(&rb[1].recv().await.unwrap());
        }
        assert_eq!(got2, b"hello");
        let mut got1 = Vec::new();
        while got1.len() < big.len() {
            got1.extend_from_slice(&rb[0].recv().await.unwrap());
        }
        assert_eq!(got1, big);
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_writer_giving_up_midway_leaves_whole_frames_in_order() {
        use std::time::Duration;
        let (a, b) = UnixStream::pair().unwrap();
        let (ma, _ra) = Mux::start(a, &[1, 2], MuxOptions::default()).unwrap();
        let (_mb, mut rb) = Mux::start(b, &[1, 2], MuxOptions::default()).unwrap();
        // Larger than the socket buffer: the writer task finishes it, after the
        // caller has given up waiting.
        let big: Vec<u8> = (0..3 * MAX_PAYLOAD).map(|i| (i % 251) as u8).collect();
        let gave_up = tokio::time::timeout(Duration::from_micros(1), ma.write(1, &big)).await;
        assert!(gave_up.is_err(), "the socket cannot take 12 MiB at once");
        // Later writes queue behind the rest of it, on both connections.
        ma.write(1, b"after").await.unwrap();
        ma.write(2, b"other").await.unwrap();
        let mut want = big.clone();
        want.extend_from_slice(b"after");
        let mut got1 = Vec::new();
        while got1.len() < want.len() {
            got1.extend_from_slice(&rb[0].recv().await.unwrap());
        }
        assert_eq!(got1.len(), want.len());
        assert!(got1 == want, "bytes out of order or torn");
        assert_eq!(&rb[1].recv().await.unwrap()[..], b"other");
        assert!(ma.error().is_none());
    }

    #[tokio::test]
    async fn truncated_frame_and_unknown_id_close_the_trunk() {
        use tokio::io::AsyncWriteExt;
        let (a, mut raw) = UnixStream::pair().unwrap();
        let (m, mut readers) = Mux::start(a, &[1, 2], MuxOptions::default()).unwrap();
        raw.write_all(&[0, 0, 0, 1, 0, 0, 0, 10, 1, 2, 3])
            .await
            .unwrap();
        drop(raw);
        assert_eq!(m.closed().await, MuxError::Truncated { got: 11, want: 18 });
        assert!(readers[0].recv().await.is_none());

        let (a, mut raw) = UnixStream::pair().unwrap();
        let (m, _readers) = Mux::start(a, &[1, 2], MuxOptions::default()).unwrap();
        raw.write_all(&[0, 0, 0, 3, 0, 0, 0, 1, 0]).await.unwrap();
        assert_eq!(m.closed().await, MuxError::UnknownConnection(3));
        // The peer sees the trunk closed.
        let mut rest = Vec::new();
        assert_eq!(raw.read_to_end(&mut rest).await.unwrap(), 0);
        assert!(m.write(1, b"x").await.is_err());
    }

    #[tokio::test]
    async fn full_queue_applies_backpressure_instead_of_growing() {
        let (a, b) = UnixStream::pair().unwrap();
        let (ma, _ra) = Mux::start(a, &[1], MuxOptions::default()).unwrap();
        let (mb, mut rb) = Mux::start(b, &[1], MuxOptions { queue_bytes: 1024 }).unwrap();
        // Nobody reads on b: after about 1 KiB queued plus the socket buffers the writer
        // must block rather than the queue growing without bound.
        let writer = tokio::spawn(async move {
            for _ in 0..10_000 {
                ma.write(1, &[0u8; 1000]).await.unwrap();
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!writer.is_finished(), "writer was never held back");
        assert!(mb.error().is_none());
        // Draining lets it finish.
        let mut total = 0usize;
        while total < 10_000 * 1000 {
            total += rb[0].recv().await.unwrap().len();
        }
        writer.await.unwrap();
    }
}
