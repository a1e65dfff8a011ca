//! Any `:authority` is answered: a connection adapter for gRPC clients that
//! send one the server's HTTP/2 layer refuses.
//!
//! grpc C-core clients (Python's grpcio, C++, Ruby) send the unix socket's
//! path, percent-encoded, as `:authority`; others send `unix:///x` or
//! nothing. The `h2` crate under hyper and tonic parses `:authority` as a URI
//! authority and resets the stream with PROTOCOL_ERROR when it is not one,
//! before any service sees the request, and it has no option to be lenient
//! (hyperium/h2#487 is still open). Go's gRPC server, containerd's, answers.
//!
//! [`AuthorityFix`] sits between the accepted socket and the server. The
//! server-to-client direction is untouched (writes go straight to the
//! socket). In the other direction every frame passes unchanged except
//! header blocks, which are decoded ([`crate::hpack`], following the
//! client's dynamic table) and:
//! - passed as they came while every `:authority` so far was acceptable;
//! - from the first one that is not, re-encoded, with the bad `:authority`
//!   replaced by `localhost`, as literals that never enter the server's
//!   table, so that the server's table (frozen from then on) can no longer
//!   disagree with what the re-encoded blocks mean. Padding is dropped,
//!   priority kept, and blocks are split into frames of at most 16 KiB.
//!
//! A connection that does not start with the HTTP/2 preface, or whose
//! framing or HPACK is malformed before any rewrite, is passed through as
//! it is from there on, so the server answers it exactly as it would
//! without the adapter; after a rewrite a malformed block ends the
//! connection.

mod rewrite;

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::Stream;

pub use rewrite::{acceptable_authority, Rewriter, REPLACEMENT};

/// How much to read from the socket at a time.
const READ_CHUNK: usize = 16 << 10;

/// A client connection whose request headers are made acceptable to the
/// server's HTTP/2 layer (see the module documentation).
#[derive(Debug)]
pub struct AuthorityFix<T> {
    inner: T,
    rewriter: Rewriter,
    /// Processed bytes not yet read by the server.
    ready: BytesMut,
    eof: bool,
}

impl<T> AuthorityFix<T> {
    /// Wraps an accepted connection.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(),
            ready: BytesMut::new(),
            eof: false,
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for AuthorityFix<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let input = this.rewriter.input();
            input.reserve(READ_CHUNK);
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.inner),
                cx,
                input
            ))?;
            if n == 0 {
                this.eof = true;
                this.rewriter.finish(&mut this.ready);
            } else {
                this.rewriter.process(&mut this.ready)?;
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<T>
{
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The connections of a listening unix socket, each behind [`AuthorityFix`]:
/// what a tonic server's `serve_with_incoming` takes.
#[derive(Debug)]
pub struct UnixIncoming {
    listener: UnixListener,
}

impl UnixIncoming {
    /// Serves the connections of `listener`.
    pub fn new(listener: UnixListener) -> Self {
        Self { listener }
    }
}

impl Stream for UnixIncoming {
    type Item = io::Result<AuthorityFix<UnixStream>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let (stream, _) = ready!(self.listener.poll_accept(cx))?;
        Poll::Ready(Some(Ok(AuthorityFix::new(stream))))
    }
}
