//! A minimal HTTP/1.1 GET client over the agent's unix socket or a TCP
//! stream: enough for the agent's plain-HTTP endpoints (Content-Length,
//! chunked and read-to-close bodies), without pulling an HTTP client stack
//! into the CLI.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};

/// Longest status line or header accepted.
const MAX_LINE: usize = 16 * 1024;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The server address is not `unix://PATH` or `http://host:port`.
    #[error("invalid server address {0:?}: expected unix:///PATH or http://HOST:PORT")]
    BadUrl(String),
    /// Connecting failed.
    #[error("cannot reach the agent at {url}: {reason}")]
    Unreachable {
        /// The server address.
        url: String,
        /// Why.
        reason: String,
    },
    /// The connection failed mid-way or the answer is not HTTP.
    #[error("reading from the agent at {url}: {reason}")]
    Protocol {
        /// The server address.
        url: String,
        /// What was wrong.
        reason: String,
    },
}

/// A connection to the agent, whichever transport.
trait Conn: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> Conn for T {}

type Stream = BufReader<Box<dyn Conn>>;

/// Where the agent is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    /// Its unix socket (the whole API, for root and its group).
    Unix(PathBuf),
    /// `host:port` over TCP.
    Tcp(String),
}

/// The agent's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    url: String,
    endpoint: Endpoint,
}

impl Server {
    /// Parses `unix:///path` (or `unix:path`) or `http://host:port` (a
    /// trailing `/` allowed; port 80 if none).
    pub fn parse(url: &str) -> Result<Self, HttpError> {
        let bad = || HttpError::BadUrl(url.to_string());
        if let Some(path) = url
            .strip_prefix("unix://")
            .or_else(|| url.strip_prefix("unix:"))
        {
            if path.is_empty() {
                return Err(bad());
            }
            return Ok(Self {
                url: url.to_string(),
                endpoint: Endpoint::Unix(PathBuf::from(path)),
            });
        }
        let rest = url.strip_prefix("http://").ok_or_else(bad)?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(bad());
        }
        // Bracketed IPv6 literals carry colons of their own.
        let has_port = match authority.rfind(']') {
            Some(i) => authority[i..].contains(':'),
            None => authority.contains(':'),
        };
        let authority = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(Self {
            url: url.trim_end_matches('/').to_string(),
            endpoint: Endpoint::Tcp(authority),
        })
    }

    async fn connect(&self) -> std::io::Result<Box<dyn Conn>> {
        Ok(match &self.endpoint {
            Endpoint::Unix(p) => Box::new(UnixStream::connect(p).await?),
            Endpoint::Tcp(a) => Box::new(TcpStream::connect(a.as_str()).await?),
        })
    }

    /// Sends `GET path` and reads the response head.
    pub async fn get(&self, path: &str) -> Result<Response, HttpError> {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, self.connect()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(self.unreachable(e.to_string())),
            Err(_) => return Err(self.unreachable(format!("no answer within {CONNECT_TIMEOUT:?}"))),
        };
        let mut stream = BufReader::new(stream);
        let host = match &self.endpoint {
            Endpoint::Unix(_) => "localhost",
            Endpoint::Tcp(a) => a.as_str(),
        };
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nUser-Agent: petrel\r\nConnection: close\r\n\r\n"
        );
        stream
            .get_mut()
            .write_all(req.as_bytes())
            .await
            .map_err(|e| self.unreachable(e.to_string()))?;
        let status_line = self.line(&mut stream).await?;
        let status = parse_status(&status_line)
            .ok_or_else(|| self.protocol(format!("not an HTTP status line: {status_line:?}")))?;
        let mut length = None;
        let mut chunked = false;
        loop {
            let line = self.line(&mut stream).await?;
            if line.is_empty() {
                break;
            }
            let Some((k, v)) = line.split_once(':') else {
                return Err(self.protocol(format!("bad header line {line:?}")));
            };
            let v = v.trim();
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => {
                    length = Some(
                        v.parse::<u64>()
                            .map_err(|_| self.protocol(format!("bad content-length {v:?}")))?,
                    )
                }
                "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
        let body = if chunked {
            Body::Chunked
        } else if let Some(n) = length {
            Body::Length(n)
        } else {
            Body::UntilClose
        };
        Ok(Response {
            status,
            url: self.url.clone(),
            stream,
            body,
            done: false,
        })
    }

    async fn line(&self, r: &mut Stream) -> Result<String, HttpError> {
        read_line(r).await.map_err(|reason| self.protocol(reason))
    }

    fn unreachable(&self, reason: String) -> HttpError {
        HttpError::Unreachable {
            url: self.url.clone(),
            reason,
        }
    }

    fn protocol(&self, reason: String) -> HttpError {
        HttpError::Protocol {
            url: self.url.clone(),
            reason,
        }
    }
}

/// One CRLF-terminated line, without the terminator.
async fn read_line(r: &mut Stream) -> Result<String, String> {
    let mut buf = Vec::new();
    let n = (&mut *r)
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("connection closed".into());
    }
    if buf.last() != Some(&b'\n') {
        return Err("line too long or cut short".into());
    }
    let s = String::from_utf8(buf).map_err(|_| "header is not UTF-8".to_string())?;
    Ok(s.trim_end_matches(['\r', '\n']).to_string())
}

fn parse_status(line: &str) -> Option<u16> {
    let mut parts = line.splitn(3, ' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.parse().ok()
}

#[derive(Debug)]
enum Body {
    Length(u64),
    Chunked,
    UntilClose,
}

/// A response whose body is read piece by piece.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    url: String,
    stream: Stream,
    body: Body,
    done: bool,
}

impl Response {
    /// The next piece of the body; None at its end.
    pub async fn chunk(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        if self.done {
            return Ok(None);
        }
        let piece = match self.body {
            Body::Length(0) => None,
            Body::Length(ref mut left) => {
                let mut buf = vec![0; (*left).min(64 * 1024) as usize];
                let n = self
                    .stream
                    .read(&mut buf)
                    .await
                    .map_err(|e| err(&self.url, e.to_string()))?;
                if n == 0 {
                    return Err(err(
                        &self.url,
                        "connection closed before the end of the body".into(),
                    ));
                }
                *left -= n as u64;
                buf.truncate(n);
                Some(buf)
            }
            Body::UntilClose => {
                let mut buf = vec![0; 64 * 1024];
                let n = self
                    .stream
                    .read(&mut buf)
                    .await
                    .map_err(|e| err(&self.url, e.to_string()))?;
                buf.truncate(n);
                (n > 0).then_some(buf)
            }
            Body::Chunked => {
                let size_line = read_line(&mut self.stream)
                    .await
                    .map_err(|r| err(&self.url, r))?;
                // Chunk extensions after ';' carry nothing we need.
                let size_text = size_line.split(';').next().unwrap_or_default().trim();
                let size = usize::from_str_radix(size_text, 16)
                    .map_err(|_| err(&self.url, format!("bad chunk size {size_line:?}")))?;
                if size == 0 {
                    // Trailers end with an empty line.
                    while !read_line(&mut self.stream)
                        .await
                        .map_err(|r| err(&self.url, r))?
                        .is_empty()
                    {}
                    None
                } else {
                    let mut buf = vec![0; size + 2];
                    self.stream
                        .read_exact(&mut buf)
                        .await
                        .map_err(|e| err(&self.url, e.to_string()))?;
                    if &buf[size..] != b"\r\n" {
                        return Err(err(&self.url, "chunk not terminated by CRLF".into()));
                    }
                    buf.truncate(size);
                    Some(buf)
                }
            }
        };
        if piece.is_none() {
            self.done = true;
        }
        Ok(piece)
    }

    /// The whole body.
    pub async fn body(&mut self) -> Result<Vec<u8>, HttpError> {
        let mut out = Vec::new();
        while let Some(c) = self.chunk().await? {
            out.extend(c);
        }
        Ok(out)
    }
}

fn err(url: &str, reason: String) -> HttpError {
    HttpError::Protocol {
        url: url.to_string(),
        reason,
    }
}

/// Splits a body into lines as pieces arrive.
#[derive(Debug, Default)]
pub struct Lines {
    pending: Vec<u8>,
}

impl Lines {
    /// Adds a piece; returns the lines it completed (without '\n').
    pub fn push(&mut self, piece: &[u8]) -> Vec<Vec<u8>> {
        self.pending.extend_from_slice(piece);
        let mut out = Vec::new();
        while let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
            let mut line: Vec<u8> = self.pending.drain(..=i).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if !line.is_empty() {
                out.push(line);
            }
        }
        out
    }
}
