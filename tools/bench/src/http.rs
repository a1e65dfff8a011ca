//! A minimal HTTP/1.1 client for the agent's endpoints: one-shot GETs
//! (`Connection: close`) and the `/pods?watch=true` stream of
//! newline-delimited JSON events, each stamped with the moment its last
//! byte was read. Enough for a server on loopback or a unix socket (the
//! agent's pods are served only there); not a general client.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc;

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// TCP (the agent's: /healthz and /metrics).
    Tcp(SocketAddr),
    /// A unix socket (the agent's: everything).
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(a: SocketAddr) -> Self {
        Endpoint::Tcp(a)
    }
}

/// A connection, whichever transport.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

async fn connect(at: &Endpoint) -> Result<Box<dyn Io>> {
    Ok(match at {
        Endpoint::Tcp(a) => {
            let s = TcpStream::connect(a)
                .await
                .with_context(|| format!("connect to {a}"))?;
            s.set_nodelay(true).ok();
            Box::new(s)
        }
        Endpoint::Unix(p) => Box::new(
            UnixStream::connect(p)
                .await
                .with_context(|| format!("connect to {}", p.display()))?,
        ),
    })
}

/// A response to a one-shot GET.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// One line of a watch stream and when it arrived.
#[derive(Debug)]
pub struct Line {
    /// When the line's last byte was read.
    pub at: Instant,
    /// The line, without its newline.
    pub text: String,
}

/// The head of a response: status and whether the body is chunked.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    chunked: bool,
    content_length: Option<usize>,
}

fn parse_head(head: &str) -> Option<Head> {
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let mut chunked = false;
    let mut content_length = None;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if k == "content-length" {
            content_length = v.parse().ok();
        }
    }
    Some(Head {
        status,
        chunked,
        content_length,
    })
}

/// Incremental decoder of a chunked body.
#[derive(Debug, Default)]
pub struct Dechunker {
    buf: Vec<u8>,
    /// Bytes left in the current chunk (None: a size line is expected).
    left: Option<usize>,
    /// The CRLF after a chunk's data is still to be skipped.
    skip_crlf: bool,
    /// The terminating zero-size chunk was seen.
    pub done: bool,
}

impl Dechunker {
    /// Feeds raw bytes; returns the body bytes they complete.
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            if self.done {
                self.buf.clear();
                return out;
            }
            if self.skip_crlf {
                if self.buf.len() < 2 {
                    return out;
                }
                self.buf.drain(..2);
                self.skip_crlf = false;
            }
            match self.left {
                None => {
                    let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") else {
                        return out;
                    };
                    let line = String::from_utf8_lossy(&self.buf[..pos]).to_string();
                    self.buf.drain(..pos + 2);
                    // Chunk extensions after ';' are ignored.
                    let size = line.split(';').next().unwrap_or("").trim();
                    match usize::from_str_radix(size, 16) {
                        Ok(0) => self.done = true,
                        Ok(n) => self.left = Some(n),
                        // A malformed size: treat as the end.
                        Err(_) => self.done = true,
                    }
                }
                Some(n) => {
                    if self.buf.is_empty() {
                        return out;
                    }
                    let take = n.min(self.buf.len());
                    out.extend(self.buf.drain(..take));
                    if take == n {
                        self.left = None;
                        self.skip_crlf = true;
                    } else {
                        self.left = Some(n - take);
                    }
                }
            }
        }
    }
}

fn request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\nConnection: close\r\n\r\n")
}

/// Reads until the end of the head; returns it and the body bytes read
/// past it.
async fn read_head(s: &mut Box<dyn Io>) -> Result<(Head, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..pos]).to_string();
            let head = parse_head(&head).with_context(|| format!("bad response head {head:?}"))?;
            return Ok((head, buf[pos + 4..].to_vec()));
        }
        let n = s.read(&mut chunk).await.context("read response head")?;
        if n == 0 {
            bail!("connection closed before the response head");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A GET of `path` at `addr`, whole body, within `timeout`.
pub async fn get(addr: impl Into<Endpoint>, path: &str, timeout: Duration) -> Result<Response> {
    let addr = addr.into();
    tokio::time::timeout(timeout, get_inner(&addr, path))
        .await
        .with_context(|| format!("GET {path}: no answer within {timeout:?}"))?
}

async fn get_inner(addr: &Endpoint, path: &str) -> Result<Response> {
    let mut s = connect(addr).await?;
    s.write_all(request(path).as_bytes())
        .await
        .with_context(|| format!("send GET {path}"))?;
    let (head, rest) = read_head(&mut s).await?;
    let mut raw = rest;
    // Connection: close: the server ends the body by closing, whatever the
    // framing; a Content-Length lets us stop early.
    loop {
        if !head.chunked && head.content_length.is_some_and(|n| raw.len() >= n) {
            break;
        }
        let mut chunk = [0u8; 65536];
        let n = s
            .read(&mut chunk)
            .await
            .with_context(|| format!("read GET {path}"))?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
    }
    let body = if head.chunked {
        Dechunker::default().feed(&raw)
    } else {
        if let Some(n) = head.content_length {
            raw.truncate(n);
        }
        raw
    };
    Ok(Response {
        status: head.status,
        body,
    })
}

/// Opens a streaming GET (a watch). On a 200 answer, a task forwards every
/// complete line of the body, stamped on arrival, until the server closes
/// the stream or the receiver is dropped. Any other status is returned as
/// an error with the body.
pub async fn stream_lines(
    addr: impl Into<Endpoint>,
    path: &str,
) -> Result<mpsc::UnboundedReceiver<Line>> {
    let mut s = connect(&addr.into()).await?;
    s.write_all(request(path).as_bytes())
        .await
        .with_context(|| format!("send GET {path}"))?;
    let (head, rest) = tokio::time::timeout(Duration::from_secs(10), read_head(&mut s))
        .await
        .with_context(|| format!("GET {path}: no response head within 10 s"))??;
    if head.status != 200 {
        bail!("GET {path}: status {}", head.status);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut dechunk = head.chunked.then(Dechunker::default);
        let mut pending: Vec<u8> = Vec::new();
        let mut data = rest;
        loop {
            let at = Instant::now();
            let body = match dechunk.as_mut() {
                Some(d) => d.feed(&data),
                None => std::mem::take(&mut data),
            };
            pending.extend_from_slice(&body);
            while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=pos).collect();
                let text = String::from_utf8_lossy(&line[..pos]).trim().to_string();
                if !text.is_empty() && tx.send(Line { at, text }).is_err() {
                    return;
                }
            }
            if dechunk.as_ref().is_some_and(|d| d.done) {
                return;
            }
            let mut chunk = vec![0u8; 65536];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    chunk.truncate(n);
                    data = chunk;
                }
            }
        }
    });
    Ok(rx)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dechunker_should_join_chunks_split_anywhere() {
        let raw = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        for split in 0..raw.len() {
            let mut d = Dechunker::default();
            let mut out = d.feed(&raw[..split]);
            out.extend(d.feed(&raw[split..]));
            assert_eq!(out, b"hello, world", "split at {split}");
            assert!(d.done);
        }
    }

    #[test]
    fn head_should_give_status_and_framing() {
        let h = parse_head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX: y").unwrap();
        assert_eq!(
            h,
            Head {
                status: 200,
                chunked: true,
                content_length: None
            }
        );
        let h = parse_head("HTTP/1.1 404 Not Found\r\ncontent-length: 12").unwrap();
        assert_eq!(h.status, 404);
        assert_eq!(h.content_length, Some(12));
        assert!(parse_head("garbage").is_none());
    }
}
