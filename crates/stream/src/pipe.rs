//! The byte-stream ends handed to backends and client callers, built on
//! bounded channels to and from a connection's reader and writer tasks.
//! Bounded queues give back-pressure: a slow consumer slows its producer.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

/// Largest chunk one write turns into one message or frame: big enough that
/// per-message overhead vanishes, small enough to interleave streams.
pub(crate) const MAX_CHUNK: usize = 256 * 1024;

/// Chunks queued per direction of a stream.
pub(crate) const QUEUE: usize = 16;

/// Reads the chunks a connection's reader task received for one stream;
/// end of file when the sender is dropped (the peer closed the stream).
pub(crate) struct ChunkReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl ChunkReader {
    pub(crate) fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        ChunkReader {
            rx,
            current: Bytes::new(),
        }
    }

    /// The next whole chunk, without copying; `None` at end of stream.
    pub(crate) async fn next_chunk(&mut self) -> Option<Bytes> {
        if !self.current.is_empty() {
            return Some(std::mem::take(&mut self.current));
        }
        self.rx.recv().await
    }
}

impl AsyncRead for ChunkReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.current.is_empty() {
            match ready!(self.rx.poll_recv(cx)) {
                Some(chunk) => self.current = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.current.len().min(buf.remaining());
        buf.put_slice(&self.current[..n]);
        self.current.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// Builds the connection-level item for a chunk of one stream's bytes.
pub(crate) type Encode<O> = Box<dyn Fn(&[u8]) -> O + Send + Sync>;

/// Writes one stream's bytes as items for a connection's writer task.
/// `shutdown` sends the stream's close item, if the protocol has one.
pub(crate) struct FrameWriter<O: Send + Unpin + 'static> {
    tx: PollSender<O>,
    encode: Encode<O>,
    close: Option<O>,
}

impl<O: Send + Unpin + 'static> FrameWriter<O> {
    pub(crate) fn new(tx: mpsc::Sender<O>, encode: Encode<O>, close: Option<O>) -> Self {
        FrameWriter {
            tx: PollSender::new(tx),
            encode,
            close,
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "stream connection closed")
}

impl<O: Send + Unpin + 'static> AsyncWrite for FrameWriter<O> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(self.tx.poll_reserve(cx)).map_err(|_| gone())?;
        let n = buf.len().min(MAX_CHUNK);
        let item = (self.encode)(&buf[..n]);
        self.tx.send_item(item).map_err(|_| gone())?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.close.is_some() {
            ready!(self.tx.poll_reserve(cx)).map_err(|_| gone())?;
            if let Some(item) = self.close.take() {
                self.tx.send_item(item).map_err(|_| gone())?;
            }
        }
        self.tx.close();
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reader_joins_chunks_and_ends() {
        let (tx, rx) = mpsc::channel(4);
        let mut r = ChunkReader::new(rx);
        tx.send(Bytes::from_static(b"ab")).await.ok();
        tx.send(Bytes::from_static(b"cd")).await.ok();
        drop(tx);
        let mut s = String::new();
        r.read_to_string(&mut s).await.ok();
        assert_eq!(s, "abcd");
    }

    #[tokio::test]
    async fn writer_encodes_and_closes() {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(4);
        let mut w = FrameWriter::new(
            tx,
            Box::new(|b: &[u8]| [&[1u8][..], b].concat()),
            Some(vec![255, 1]),
        );
        w.write_all(b"hi").await.ok();
        w.shutdown().await.ok();
        assert_eq!(rx.recv().await, Some(vec![1, b'h', b'i']));
        assert_eq!(rx.recv().await, Some(vec![255, 1]));
        assert!(w.write_all(b"x").await.is_err());
    }
}
