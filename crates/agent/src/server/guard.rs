//! What each listener serves and to whom, checked before any handler:
//!
//! | listener                      | serves               | Host checked | cross-origin requests |
//! |-------------------------------|----------------------|--------------|-----------------------|
//! | unix socket (root, group)     | everything           | no           | refused               |
//! | TCP with client certificates  | everything           | yes          | refused               |
//! | TCP loopback, plain HTTP      | /healthz, /metrics   | yes          | refused               |
//!
//! The plain port is kubelet's read-only port less its pod listings and
//! statistics: any local user, and any container sharing the host's
//! network, reaches it. The `Host` check keeps DNS-rebinding pages out of
//! the TCP listeners; the `Origin` check keeps cross-origin WebSockets
//! (browsers always send `Origin`; kubectl sends none) away from exec,
//! attach and port-forward.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use petrel_stream::origin::{self, ServerNames};

use super::proxy::wants_upgrade;

/// What a listener may serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `/healthz` and `/metrics` only.
    ReadOnly,
    /// Every endpoint: pods, logs, exec, attach, port-forward.
    Full,
}

/// The paths of the read-only port.
const READ_ONLY: &[&str] = &["/healthz", "/metrics"];

/// The checks of one listener.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub access: Access,
    /// The names `Host` may carry (TCP); None: not checked (unix socket,
    /// which no browser reaches).
    pub names: Option<Arc<ServerNames>>,
    /// TLS: a `Host` without a port means 443.
    pub tls: bool,
    /// Where the full API is, for the read-only port's refusals.
    pub full_api_hint: Arc<str>,
}

fn forbidden(msg: String) -> Response {
    (
        StatusCode::FORBIDDEN,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{msg}\n"),
    )
        .into_response()
}

/// The middleware: refuses with 403, or passes the request on.
pub(crate) async fn check(State(g): State<Guard>, req: Request, next: Next) -> Response {
    if let Some(names) = &g.names {
        if let Err(r) = origin::check_host(req.headers(), names) {
            tracing::info!(refusal = %r, path = req.uri().path(), "request refused");
            return forbidden(r.to_string());
        }
    }
    // Nothing here is for a web page: any request with a foreign Origin
    // is refused, the WebSocket upgrades to exec above all.
    if let Err(r) = origin::check_origin(req.headers(), g.tls) {
        tracing::info!(
            refusal = %r,
            path = req.uri().path(),
            upgrade = wants_upgrade(req.headers()),
            "cross-origin request refused"
        );
        return forbidden(r.to_string());
    }
    if g.access == Access::ReadOnly && !READ_ONLY.contains(&req.uri().path()) {
        return forbidden(format!(
            "forbidden: this port serves only /healthz and /metrics; {} is served on {}",
            req.uri().path(),
            g.full_api_hint
        ));
    }
    next.run(req).await
}
