//! Connections that end when the client certificate changes: the API
//! server checks a client certificate on every request, so a pooled
//! connection made with a certificate that has since expired would fail
//! every request sent on it. Each connection remembers the certificate
//! generation it was made under; once [`Generation::bump`] moves on, its
//! next read or write fails, hyper drops it, and the caller's retry goes
//! out on a new connection with the new certificate (kubelet closes its
//! connections on rotation likewise).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};

/// The certificate generation, shared by the connector and the rotation.
#[derive(Debug, Clone, Default)]
pub struct Generation(Arc<AtomicU64>);

impl Generation {
    /// A new certificate: every connection made before it ends.
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A connector whose connections end at the next [`Generation::bump`].
#[derive(Debug, Clone)]
pub struct FreshConnector<C> {
    inner: C,
    generation: Generation,
}

impl<C> FreshConnector<C> {
    /// Wraps `inner`.
    pub fn new(inner: C, generation: Generation) -> Self {
        Self { inner, generation }
    }
}

impl<C> tower::Service<Uri> for FreshConnector<C>
where
    C: tower::Service<Uri>,
    C::Future: Send + 'static,
{
    type Response = FreshConn<C::Response>;
    type Error = C::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let generation = self.generation.clone();
        let made_at = generation.now();
        let fut = self.inner.call(uri);
        Box::pin(async move {
            let io = fut.await?;
            Ok(FreshConn {
                io,
                generation,
                made_at,
            })
        })
    }
}

/// A connection that fails once the certificate it was made with is
/// replaced.
#[derive(Debug)]
pub struct FreshConn<T> {
    io: T,
    generation: Generation,
    made_at: u64,
}

impl<T> FreshConn<T> {
    fn stale(&self) -> bool {
        self.generation.now() != self.made_at
    }
}

fn rotated() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "client certificate rotated: connection closed",
    )
}

impl<T: Read + Unpin> Read for FreshConn<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if self.stale() {
            return Poll::Ready(Err(rotated()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for FreshConn<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.stale() {
            return Poll::Ready(Err(rotated()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for FreshConn<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}
