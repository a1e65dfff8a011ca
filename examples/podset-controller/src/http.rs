//! `/metrics` (Prometheus text), on its own address as the reference
//! serves it (`/readyz` and `/healthz` are the kit's `serve_readiness`).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use petrel_controller::leader::LeaderMetrics;
use petrel_controller::WorkQueue;

use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// The registry `/metrics` encodes: the leader election's metrics, if on,
/// and the current term's queue. Rebuilt whole when the queue changes (a
/// new term gets a new queue, and a registry holds a name once).
#[derive(Clone, Default)]
pub struct Metrics {
    registry: Arc<RwLock<Registry>>,
    leader: Option<(LeaderMetrics, String)>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics with the leader election's, labelled with the lock's name.
    pub fn with_leader(leader: LeaderMetrics, lock: &str) -> Self {
        let m = Self {
            registry: Arc::default(),
            leader: Some((leader, lock.to_string())),
        };
        m.rebuild(None);
        m
    }

    /// Serves `queue`'s metrics (and the leader's) from now on.
    pub fn set_queue(&self, queue: &WorkQueue<String>) {
        self.rebuild(Some(queue));
    }

    fn rebuild(&self, queue: Option<&WorkQueue<String>>) {
        let mut registry = Registry::default();
        if let Some((leader, lock)) = &self.leader {
            leader.register(&mut registry, lock);
        }
        if let Some(q) = queue {
            q.register(&mut registry);
        }
        *self.registry.write().unwrap_or_else(|p| p.into_inner()) = registry;
    }

    fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(
            &mut out,
            &self.registry.read().unwrap_or_else(|p| p.into_inner()),
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
