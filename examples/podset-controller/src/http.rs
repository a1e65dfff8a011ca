//! `/metrics` (Prometheus text) and `/readyz` + `/healthz`, each on its
//! own address as the reference serves them.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// The registry `/metrics` encodes; replaced whole when the queue changes
/// (a new term gets a new queue, and a registry holds a name once).
#[derive(Clone, Default)]
pub struct Metrics(Arc<RwLock<Registry>>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Serves `registry` from now on.
    pub fn set(&self, registry: Registry) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = registry;
    }

    fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(
            &mut out,
            &self.0.read().unwrap_or_else(|p| p.into_inner()),
        )?;
        Ok(out)
    }
}

/// Binds `addr`, naming it in the error.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, std::io::Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("bind {what} address {addr}: {e}")))
}

/// Serves `/metrics` on `listener` until the process ends.
pub async fn serve_metrics(listener: TcpListener, metrics: Metrics) -> std::io::Result<()> {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                match metrics.encode() {
                    Ok(body) => (
                        StatusCode::OK,
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    ),
                    Err(_) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [(header::CONTENT_TYPE, "text/plain")],
                        "metrics encoding failed\n".to_string(),
                    ),
                }
            }
        }),
    );
    axum::serve(listener, app).await
}

/// Serves `/readyz` (200 once `ready()`) and `/healthz` on `listener`.
pub async fn serve_probes(
    listener: TcpListener,
    ready: Arc<dyn Fn() -> bool + Send + Sync>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/readyz",
            get(move || {
                let ready = ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ok\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "informers not synced\n")
                    }
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    axum::serve(listener, app).await
}
