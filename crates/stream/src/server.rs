//! The HTTP side: listening, issuing URLs, and upgrading each request to
//! WebSocket or SPDY/3.1 before handing it to the transport's server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::command::Command;
use crate::origin::ServerNames;
use crate::protocol::{self, Version};
use crate::spdy::session::{Role as SpdyRole, Session};
use crate::tokens::{TokenCache, TokenError};
use crate::{spdy, ws, AttachSpec, ExecSpec, StreamBackend, StreamConfig, StreamError};

/// WebSocket channel numbers are one byte and each port takes two.
const MAX_PORTS: usize = 128;

/// A request accepted over CRI, waiting for its client.
#[derive(Debug, Clone)]
pub(crate) enum Pending {
    Command(Command),
    PortForward { pod: String, ports: Vec<u16> },
}

/// What the connection handlers share.
pub(crate) struct Ctx {
    pub(crate) backend: Arc<dyn StreamBackend>,
    pub(crate) config: StreamConfig,
    /// Cancelled at shutdown.
    pub(crate) stop: CancellationToken,
    cache: TokenCache<Pending>,
    tracker: TaskTracker,
    /// The names a browser's request must be sent to ([`crate::origin`]).
    names: ServerNames,
}

/// The streaming server: hands out URLs for accepted requests and serves
/// them on a tokio task until [`StreamServer::shutdown`].
pub struct StreamServer {
    ctx: Arc<Ctx>,
    local_addr: SocketAddr,
    base_url: String,
}

impl std::fmt::Debug for StreamServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamServer")
            .field("local_addr", &self.local_addr)
            .field("base_url", &self.base_url)
            .finish()
    }
}

/// A streaming server's socket, bound but not served yet (see
/// [`StreamServer::listen`]).
#[derive(Debug)]
pub struct Listening {
    listener: TcpListener,
    local_addr: SocketAddr,
    config: StreamConfig,
}

impl Listening {
    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Starts serving with `backend`. Must be called within the tokio
    /// runtime the socket was bound in.
    pub fn serve(self, backend: Arc<dyn StreamBackend>) -> StreamServer {
        let Listening {
            listener,
            local_addr,
            config,
        } = self;
        let base_url = config
            .base_url
            .clone()
            .unwrap_or_else(|| format!("http://{local_addr}"))
            .trim_end_matches('/')
            .to_owned();
        if !local_addr.ip().is_loopback() {
            // Kubelet's documentation warns alike: whoever sees a URL can
            // use it once, and plain HTTP shows it to the network.
            tracing::warn!(
                address = %local_addr,
                "the streaming server listens on a non-loopback address over plain HTTP: \
                 its exec, attach and port-forward URLs are bearer tokens that anyone on \
                 the network path can read and use; keep it on loopback unless the network \
                 between it and its clients is trusted"
            );
        }
        let names = ServerNames::new(url_host(&base_url)).with_host_name();
        let ctx = Arc::new(Ctx {
            backend,
            names,
            cache: TokenCache::new(config.token_ttl, config.max_in_flight),
            config,
            stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
        });
        ctx.tracker.spawn(accept_loop(listener, ctx.clone()));
        tracing::info!(address = %local_addr, "streaming server listening");
        StreamServer {
            ctx,
            local_addr,
            base_url,
        }
    }
}

impl StreamServer {
    /// Listens on `config.address` and starts serving. Must be called
    /// within a tokio runtime.
    pub fn bind(
        config: StreamConfig,
        backend: Arc<dyn StreamBackend>,
    ) -> Result<StreamServer, StreamError> {
        Ok(Self::listen(config)?.serve(backend))
    }

    /// Listens on `config.address`; [`Listening::serve`] then starts
    /// serving. Apart, so that the backend can be made once the address is
    /// known to be free (a backend that lives in the object holding the
    /// server). Must be called within a tokio runtime.
    pub fn listen(config: StreamConfig) -> Result<Listening, StreamError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StreamError::NoRuntime);
        }
        let bind_err = |source| StreamError::Bind {
            address: config.address,
            source,
        };
        let std_listener = std::net::TcpListener::bind(config.address).map_err(bind_err)?;
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let listener = TcpListener::from_std(std_listener).map_err(bind_err)?;
        let local_addr = listener.local_addr().map_err(bind_err)?;
        Ok(Listening {
            listener,
            local_addr,
            config,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The URL for an accepted CRI `Exec`. With a terminal, stderr is
    /// merged into stdout, so `spec.stderr` is cleared.
    pub fn exec_url(&self, mut spec: ExecSpec) -> Result<String, StreamError> {
        if spec.container_id.is_empty() {
            return Err(StreamError::InvalidArgument(
                "missing required container_id".into(),
            ));
        }
        if spec.cmd.is_empty() {
            return Err(StreamError::InvalidArgument("cmd must not be empty".into()));
        }
        spec.stderr &= !spec.tty;
        if !spec.stdin && !spec.stdout && !spec.stderr {
            return Err(StreamError::InvalidArgument(
                "one of stdin, stdout, or stderr must be set".into(),
            ));
        }
        self.issue("exec", Pending::Command(Command::Exec(spec)))
    }

    /// The URL for an accepted CRI `Attach` (stderr cleared with a terminal).
    pub fn attach_url(&self, mut spec: AttachSpec) -> Result<String, StreamError> {
        if spec.container_id.is_empty() {
            return Err(StreamError::InvalidArgument(
                "missing required container_id".into(),
            ));
        }
        spec.stderr &= !spec.tty;
        if !spec.stdin && !spec.stdout && !spec.stderr {
            return Err(StreamError::InvalidArgument(
                "one of stdin, stdout, or stderr must be set".into(),
            ));
        }
        self.issue("attach", Pending::Command(Command::Attach(spec)))
    }

    /// The URL for an accepted CRI `PortForward`. SPDY clients name the
    /// port of each forwarded connection themselves; WebSocket clients get
    /// `ports` (or, if empty, the `port` query parameters they send).
    pub fn port_forward_url(
        &self,
        pod_sandbox_id: String,
        ports: Vec<u16>,
    ) -> Result<String, StreamError> {
        if pod_sandbox_id.is_empty() {
            return Err(StreamError::InvalidArgument(
                "missing required pod_sandbox_id".into(),
            ));
        }
        if ports.contains(&0) {
            return Err(StreamError::InvalidArgument(
                "port 0 cannot be forwarded".into(),
            ));
        }
        if ports.len() > MAX_PORTS {
            return Err(StreamError::InvalidArgument(format!(
                "at most {MAX_PORTS} ports per request"
            )));
        }
        self.issue(
            "portforward",
            Pending::PortForward {
                pod: pod_sandbox_id,
                ports,
            },
        )
    }

    fn issue(&self, kind: &str, pending: Pending) -> Result<String, StreamError> {
        if self.ctx.stop.is_cancelled() {
            return Err(StreamError::ShutDown);
        }
        let token = self.ctx.cache.insert(pending)?;
        Ok(format!("{}/{kind}/{token}", self.base_url))
    }

    /// Stops listening, ends every session (running execs are killed by
    /// their backend when their futures are dropped) and waits for the
    /// server's tasks, at most twice the configured linger.
    pub async fn shutdown(&self) {
        self.ctx.stop.cancel();
        self.ctx.tracker.close();
        if tokio::time::timeout(self.ctx.config.linger * 2, self.ctx.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("streaming sessions still running after shutdown");
        }
    }
}

impl Drop for StreamServer {
    fn drop(&mut self) {
        self.ctx.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = ctx.stop.cancelled() => return,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors and the like: back off a little.
                tracing::warn!(error = %e, "streaming server accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let conn_ctx = ctx.clone();
        ctx.tracker.spawn(async move {
            let svc_ctx = conn_ctx.clone();
            let svc = service_fn(move |req| {
                let ctx = svc_ctx.clone();
                async move { Ok::<_, Infallible>(handle(ctx, req)) }
            });
            let conn = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "streaming HTTP connection ended");
                    }
                }
                _ = conn_ctx.stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(conn_ctx.config.linger, conn).await;
                }
            }
        });
    }
}

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Full<Bytes>> {
    let mut body = msg.into();
    body.push('\n');
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn header_values<'a>(req: &'a Request<Incoming>, name: &str) -> Vec<&'a str> {
    protocol::split_list(
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    )
}

/// Whether header `name` mentions `token` (case-insensitive substring, as
/// kubelet's checks are).
fn has_token(req: &Request<Incoming>, name: header::HeaderName, token: &str) -> bool {
    req.headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains(token))
}

/// The host of `url` (`scheme://host[:port][/path]`), brackets kept.
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    (!host.is_empty()).then(|| host.to_string())
}

fn handle(ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and POST are served",
        );
    }
    // Before the token is spent: a web page gets nothing, not even that.
    if let Err(refusal) = crate::origin::check_browser(req.headers(), &ctx.names, false) {
        tracing::info!(%refusal, "streaming request refused");
        return text(StatusCode::FORBIDDEN, refusal.to_string());
    }
    let path = req.uri().path().to_owned();
    // The last two segments: a `base_url` may put a prefix before them
    // (a proxy in front of the server strips or keeps it).
    let mut parts = path.trim_end_matches('/').rsplitn(3, '/');
    let (token, kind) = (parts.next(), parts.next());
    let (kind, token) = match (kind, token) {
        (Some(k @ ("exec" | "attach" | "portforward")), Some(t))
            if !t.is_empty() && !t.contains('/') =>
        {
            (k, t)
        }
        _ => return text(StatusCode::NOT_FOUND, "404 page not found"),
    };
    let pending = match ctx.cache.consume(token) {
        Ok(p) => p,
        Err(e) => return text(StatusCode::NOT_FOUND, e.to_string()),
    };
    let matches = matches!(
        (&pending, kind),
        (Pending::Command(Command::Exec(_)), "exec")
            | (Pending::Command(Command::Attach(_)), "attach")
            | (Pending::PortForward { .. }, "portforward")
    );
    if !matches {
        return text(StatusCode::NOT_FOUND, TokenError::Unknown.to_string());
    }
    let connection_upgrade = has_token(&req, header::CONNECTION, "upgrade");
    if connection_upgrade && has_token(&req, header::UPGRADE, "websocket") {
        websocket(ctx, req, pending)
    } else if connection_upgrade && has_token(&req, header::UPGRADE, "spdy/3.1") {
        spdy(ctx, req, pending)
    } else {
        text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request (want WebSocket or SPDY/3.1)",
        )
    }
}

fn websocket(ctx: Arc<Ctx>, mut req: Request<Incoming>, pending: Pending) -> Response<Full<Bytes>> {
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    let offered = header_values(&req, header::SEC_WEBSOCKET_PROTOCOL.as_str());
    let supported = match pending {
        Pending::Command(_) => ws::REMOTE_COMMAND,
        Pending::PortForward { .. } => ws::PORT_FORWARD,
    };
    let chosen: String = if offered.is_empty() {
        String::new()
    } else {
        match protocol::negotiate(&offered, supported) {
            Some(p) => p.to_owned(),
            None => {
                return text(
                    StatusCode::FORBIDDEN,
                    format!(
                        "unable to upgrade: requested protocol(s) are not supported: {offered:?}; supports {supported:?}"
                    ),
                )
            }
        }
    };
    // Port-forward over WebSocket needs its ports up front.
    let pending = match pending {
        Pending::PortForward { pod, ports } if ports.is_empty() => {
            let query = req.uri().query().unwrap_or_default();
            let mut parsed = Vec::new();
            for (k, v) in query.split('&').filter_map(|kv| kv.split_once('=')) {
                if k != protocol::PORT {
                    continue;
                }
                for p in v.split(',') {
                    match p.parse::<u16>() {
                        Ok(p) if p > 0 => parsed.push(p),
                        _ => {
                            return text(
                                StatusCode::BAD_REQUEST,
                                format!("unable to parse {p:?} as a port"),
                            )
                        }
                    }
                }
            }
            if parsed.is_empty() || parsed.len() > MAX_PORTS {
                return text(
                    StatusCode::BAD_REQUEST,
                    "query parameter \"port\" is required",
                );
            }
            Pending::PortForward { pod, ports: parsed }
        }
        other => other,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let proto = chosen.clone();
    let task_ctx = ctx.clone();
    ctx.tracker.spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "WebSocket upgrade failed");
                return;
            }
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        match pending {
            Pending::Command(cmd) => {
                let version = Version::of(&proto).unwrap_or(Version {
                    number: 1,
                    base64: false,
                });
                ws::server::remote_command(ws, version, cmd, task_ctx).await
            }
            Pending::PortForward { pod, ports } => {
                let base64 = proto == protocol::V4_BASE64;
                ws::server::port_forward(ws, base64, pod, ports, task_ctx).await
            }
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if !chosen.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&chosen) {
            h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
        }
    }
    r
}

fn spdy(ctx: Arc<Ctx>, mut req: Request<Incoming>, pending: Pending) -> Response<Full<Bytes>> {
    let offered = header_values(&req, protocol::HEADER_PROTOCOL_VERSION);
    let supported = match pending {
        Pending::Command(_) => protocol::SPDY_REMOTE_COMMAND,
        Pending::PortForward { .. } => protocol::SPDY_PORT_FORWARD,
    };
    if offered.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: X-Stream-Protocol-Version is required",
        );
    }
    let Some(chosen) = protocol::negotiate(&offered, supported).map(str::to_owned) else {
        let mut r = text(
            StatusCode::FORBIDDEN,
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {supported:?}"
            ),
        );
        for s in supported {
            r.headers_mut().append(
                protocol::HEADER_ACCEPTED_VERSIONS,
                HeaderValue::from_static(s),
            );
        }
        return r;
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let proto = chosen.clone();
    let task_ctx = ctx.clone();
    ctx.tracker.spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "SPDY upgrade failed");
                return;
            }
        };
        let idle = task_ctx.config.idle_timeout;
        let started = match upgraded.downcast::<TokioIo<TcpStream>>() {
            Ok(parts) => {
                let (r, w) = parts.io.into_inner().into_split();
                Session::start(
                    r,
                    w,
                    BytesMut::from(&parts.read_buf[..]),
                    SpdyRole::Server,
                    idle,
                )
            }
            Err(upgraded) => {
                let (r, w) = tokio::io::split(TokioIo::new(upgraded));
                Session::start(r, w, BytesMut::new(), SpdyRole::Server, idle)
            }
        };
        let (session, incoming) = match started {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start SPDY session");
                return;
            }
        };
        match pending {
            Pending::Command(cmd) => {
                let version = Version::of(&proto).unwrap_or(Version {
                    number: 1,
                    base64: false,
                });
                spdy::server::remote_command(session, incoming, version, cmd, task_ctx).await
            }
            Pending::PortForward { pod, .. } => {
                spdy::server::port_forward(session, incoming, pod, task_ctx).await
            }
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if let Ok(v) = HeaderValue::from_str(&chosen) {
        h.insert(protocol::HEADER_PROTOCOL_VERSION, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::url_host;

    #[test]
    fn url_host_should_be_the_host_of_the_base_url() {
        assert_eq!(
            url_host("http://127.0.0.1:10010").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(url_host("http://node/cri").as_deref(), Some("node"));
        assert_eq!(url_host("http://[::1]:5/x").as_deref(), Some("::1"));
        assert_eq!(url_host("http://").as_deref(), None);
    }
}
