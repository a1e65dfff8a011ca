//! The agent's HTTP server: `/healthz`, `/metrics`, `/node` (pressure
//! conditions), `/stats/summary` (kubelet's shape, cached per eviction
//! pass) and `/metrics/resource` (kubelet's resource metrics from it), `/pods` (list, watch, get), in the Kubernetes JSON shapes so kubectl-minded tools read them;
//! and kubelet's container endpoints: `/containerLogs/...` (`logs`),
//! `/exec/...`, `/attach/...`, `/portForward/...` (`stream_routes`,
//! proxied to the runtime's streaming server by `proxy`).
//!
//! Exposure (`guard`): the full API on a unix socket for root and a
//! configured group ([`socket`], [`peer`]), and on TCP only with TLS and
//! client certificates ([`tls`]); plain HTTP on loopback serves
//! `/healthz` and `/metrics` alone. `Host` (TCP) and `Origin` are checked
//! against DNS rebinding and cross-origin WebSockets.

mod guard;
mod logs;
mod params;
pub mod peer;
mod proxy;
mod resolve;
mod resource_metrics;
pub mod socket;
mod stream_routes;
pub mod tls;
pub mod webhook;

pub use guard::Access;

use std::future::Future;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, on, MethodFilter};
use axum::Router;
use futures_util::StreamExt;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio::sync::{broadcast, watch};

use crate::cache::PodCache;
use crate::cri::RuntimeObserver;
use crate::health::Health;
use crate::status::{StatusStore, WatchEvent, WatchEventType};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// What the handlers share.
#[derive(Clone)]
pub struct ServerState {
    /// The published pods.
    pub store: Arc<StatusStore>,
    /// The agent's health.
    pub health: Arc<Health>,
    /// The metrics to expose.
    pub registry: Arc<Registry>,
    /// The runtime (status of followed containers, streaming URLs).
    pub runtime: Arc<dyn RuntimeObserver>,
    /// The PLEG's view of each pod's containers and sandboxes.
    pub cache: Arc<PodCache>,
    /// The node's pressure conditions (`GET /node`).
    pub node: Arc<crate::eviction::NodeState>,
    /// The node's name.
    pub node_name: String,
}

#[derive(Clone)]
struct AppState {
    shared: ServerState,
    /// Becomes true at shutdown: ends the watch streams, which would
    /// otherwise hold the graceful shutdown open forever.
    stopping: watch::Receiver<bool>,
}

/// Where the server listens (`guard` says what each serves).
#[derive(Debug)]
pub struct Listeners {
    /// TCP: `/healthz` and `/metrics` in plain HTTP, or everything over
    /// TLS with client certificates when `tls` is given.
    pub tcp: tokio::net::TcpListener,
    /// The TLS configuration of `tcp` (see [`tls`]).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The names a request on `tcp` may carry as `Host`, besides IP
    /// literals and `localhost`.
    pub names: petrel_stream::origin::ServerNames,
    /// The unix socket with the full API (see [`socket`]).
    pub unix: Option<socket::AgentSocket>,
    /// Cluster mode: every TCP request authenticated and authorized by the
    /// API server ([`webhook`]).
    pub webhook: Option<Arc<webhook::Webhook>>,
}

/// Serves on `listeners` until `shutdown` completes; open watches and log
/// streams end then, and open connections close gracefully.
pub async fn serve(
    listeners: Listeners,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stopping) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        // Keep the sender alive until every receiver is gone, so none of
        // them mistakes a dropped sender for a change.
        stop_tx.closed().await;
    });
    let app = router(AppState {
        shared: state,
        stopping: stopping.clone(),
    });
    let hint: Arc<str> = match &listeners.unix {
        Some(u) => format!("the agent's unix socket {}", u.path.display()).into(),
        None => "the agent's unix socket (disabled here)".into(),
    };
    let tls = listeners.tls.is_some();
    let tcp_app = match &listeners.webhook {
        Some(w) => app.clone().layer(axum::middleware::from_fn_with_state(
            Arc::clone(w),
            webhook::authorize,
        )),
        None => app.clone(),
    };
    let tcp_app = tcp_app.layer(axum::middleware::from_fn_with_state(
        guard::Guard {
            access: if tls { Access::Full } else { Access::ReadOnly },
            names: Some(Arc::new(listeners.names)),
            tls,
            full_api_hint: hint.clone(),
        },
        guard::check,
    ));
    if let Ok(addr) = listeners.tcp.local_addr() {
        tracing::info!(%addr, tls, "agent server listening");
    }
    let tcp = serve_tcp(listeners.tcp, listeners.tls, tcp_app, stopping.clone());
    let unix = async {
        let Some(sock) = listeners.unix else {
            return Ok(());
        };
        tracing::info!(path = %sock.path.display(), group = ?sock.policy.group, "agent socket listening");
        let unix_app = app.layer(axum::middleware::from_fn_with_state(
            guard::Guard {
                access: Access::Full,
                names: None,
                tls: false,
                full_api_hint: hint,
            },
            guard::check,
        ));
        serve_unix(sock, unix_app, stopping.clone()).await
    };
    let (a, b) = tokio::join!(tcp, unix);
    a.and(b)
}

/// Waits a little after a failed accept (out of descriptors and the
/// like) rather than spinning.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

/// HTTP/1.1 with upgrades on one connection until it ends; at shutdown
/// it is closed gracefully.
async fn serve_connection<I>(io: I, app: Router, mut stop: watch::Receiver<bool>, peer: &str)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper_util::service::TowerToHyperService::new(app);
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            return;
        }
        _ = stop.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// The TCP accept loop: plain, or each connection's TLS handshake (which
/// verifies the client's certificate) first, in a task of its own.
async fn serve_tcp(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    mut stopping: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopping.wait_for(|s| *s) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                accept_failed(e).await;
                continue;
            }
        };
        let (acceptor, app, stop) = (acceptor.clone(), app.clone(), stopping.clone());
        conns.spawn(async move {
            let peer = peer.to_string();
            let Some(acceptor) = acceptor else {
                return serve_connection(tcp, app, stop, &peer).await;
            };
            let handshake =
                tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp));
            match handshake.await {
                Ok(Ok(s)) => {
                    // The subject of the verified certificate, for the
                    // webhook (cluster mode).
                    let cert = s
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| webhook::identity_of_certificate(c.as_ref()));
                    let app = app.layer(axum::Extension(webhook::PeerCertificate(cert)));
                    serve_connection(s, app, stop, &peer).await
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake refused"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
        // Reap finished connections as we go.
        while conns.try_join_next().is_some() {}
    }
    while conns.join_next().await.is_some() {}
    Ok(())
}

/// The unix socket's accept loop: each peer's credentials are checked
/// ([`peer`]); a peer that is neither root nor of the socket's group is
/// answered 403 whatever it asks.
async fn serve_unix(
    sock: socket::AgentSocket,
    app: Router,
    mut stopping: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = sock.listener.accept() => a,
            _ = stopping.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                accept_failed(e).await;
                continue;
            }
        };
        let (app, refusal) = match peer::peer_of(&stream) {
            Ok(p) => match sock.policy.refusal(&p) {
                None => (app.clone(), String::new()),
                Some(why) => {
                    tracing::warn!(
                        uid = p.uid,
                        gid = p.gid,
                        pid = p.pid,
                        "agent socket: peer refused"
                    );
                    (refuse_all(why.clone()), why)
                }
            },
            Err(e) => {
                let why = format!("forbidden: the peer's credentials cannot be read: {e}");
                (refuse_all(why.clone()), why)
            }
        };
        let stop = stopping.clone();
        conns.spawn(async move {
            let peer = if refusal.is_empty() {
                "unix"
            } else {
                "unix (refused)"
            };
            serve_connection(stream, app, stop, peer).await
        });
        while conns.try_join_next().is_some() {}
    }
    while conns.join_next().await.is_some() {}
    // The socket file goes with the server (a stale one is replaced at
    // the next start anyway).
    let _ = std::fs::remove_file(&sock.path);
    Ok(())
}

/// A router that answers 403 with `why` to everything.
fn refuse_all(why: String) -> Router {
    Router::new().fallback(move || {
        let why = why.clone();
        async move {
            (
                StatusCode::FORBIDDEN,
                [(header::CONTENT_TYPE, TEXT)],
                format!("{why}\n"),
            )
        }
    })
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/node", get(node))
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(metrics_resource))
        .route("/pods", get(pods))
        .route("/pods/:namespace/:name", get(pod))
        .route(
            "/containerLogs/:namespace/:pod/:container",
            get(logs::container_logs),
        )
        .route(
            "/exec/:namespace/:pod/:container",
            on(
                MethodFilter::GET.or(MethodFilter::POST),
                stream_routes::exec,
            ),
        )
        .route(
            "/attach/:namespace/:pod/:container",
            on(
                MethodFilter::GET.or(MethodFilter::POST),
                stream_routes::attach,
            ),
        )
        .route(
            "/portForward/:namespace/:pod",
            on(
                MethodFilter::GET.or(MethodFilter::POST),
                stream_routes::port_forward,
            ),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, TEXT)],
                "404 page not found\n",
            )
        })
        .with_state(state)
}

async fn healthz(State(st): State<AppState>) -> Response {
    match st.shared.health.check() {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, TEXT)], "ok").into_response(),
        Err(reasons) => {
            let mut body = reasons.join("\n");
            body.push('\n');
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, TEXT)],
                body,
            )
                .into_response()
        }
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &st.shared.registry) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, OPENMETRICS)], out).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "metrics encoding failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, TEXT)],
                "metrics encoding failed\n",
            )
                .into_response()
        }
    }
}

/// `?watch=true` (or `1`) turns the list into a watch.
#[derive(Debug, Default, Deserialize)]
struct ListParams {
    watch: Option<String>,
}

async fn pods(State(st): State<AppState>, Query(q): Query<ListParams>) -> Response {
    if matches!(q.watch.as_deref(), Some("true" | "1")) {
        return watch_pods(st);
    }
    let items = st.shared.store.list();
    let items: Vec<&k8s_openapi::api::core::v1::Pod> = items.iter().map(|p| &**p).collect();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": items,
        }),
    )
}

/// Newline-delimited watch events: ADDED for every pod now, then the
/// store's feed. Subscribing before listing means no change is lost in
/// between (one may arrive twice, which a watcher treats as an update).
fn watch_pods(st: AppState) -> Response {
    let rx = st.shared.store.subscribe();
    let initial: Vec<WatchEvent> = st
        .shared
        .store
        .list()
        .into_iter()
        .map(|object| WatchEvent {
            kind: WatchEventType::Added,
            object,
        })
        .collect();
    let live = futures_util::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(ev) => Some((ev, rx)),
            // A watcher that fell behind has lost events: end the stream
            // so the client lists again rather than showing stale pods.
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::debug!(missed = n, "pod watcher lagged; ending its stream");
                None
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    });
    let mut stopping = st.stopping;
    let stop = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    let lines = futures_util::stream::iter(initial)
        .chain(live)
        .take_until(stop)
        .map(|ev| {
            let mut line = serde_json::to_vec(&ev)?;
            line.push(b'\n');
            Ok::<_, serde_json::Error>(Bytes::from(line))
        });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, JSON)
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn node(State(st): State<AppState>) -> Response {
    json(StatusCode::OK, &st.shared.node.node(&st.shared.node_name))
}

/// kubelet's summary, as of the eviction manager's last pass.
async fn stats_summary(State(st): State<AppState>) -> Response {
    let summary = st
        .shared
        .node
        .summary_for_request(crate::eviction::manager::SUMMARY_WAIT)
        .await;
    match summary {
        Some(s) => json(StatusCode::OK, &*s),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, TEXT)],
            "no statistics yet\n",
        )
            .into_response(),
    }
}

async fn metrics_resource(State(st): State<AppState>) -> Response {
    let summary = st
        .shared
        .node
        .summary_for_request(crate::eviction::manager::SUMMARY_WAIT)
        .await;
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        resource_metrics::render(summary.as_deref()),
    )
        .into_response()
}

async fn pod(
    State(st): State<AppState>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    match st.shared.store.get(&namespace, &name) {
        Some(p) => json(StatusCode::OK, &*p),
        None => json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": format!("pods {name:?} not found"),
                "reason": "NotFound",
                "details": {"name": name, "kind": "pods"},
                "code": 404,
            }),
        ),
    }
}

fn json<T: serde::Serialize + ?Sized>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (status, [(header::CONTENT_TYPE, JSON)], body).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "json encoding failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod test_support;
