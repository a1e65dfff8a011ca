//! The agent's HTTP server: `/healthz`, `/metrics`, `/pods` (list, watch,
//! get), in the Kubernetes JSON shapes so kubectl-minded tools read them.

use std::future::Future;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio::sync::{broadcast, watch};

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
}

#[derive(Clone)]
struct AppState {
    shared: ServerState,
    /// Becomes true at shutdown: ends the watch streams, which would
    /// otherwise hold the graceful shutdown open forever.
    stopping: watch::Receiver<bool>,
}

/// Serves on `listener` until `shutdown` completes; open watches end then.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stopping) = watch::channel(false);
    let mut stopped = stopping.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        // Keep the sender alive until every receiver is gone, so none of
        // them mistakes a dropped sender for a change.
        stop_tx.closed().await;
    });
    let app = router(AppState {
        shared: state,
        stopping,
    });
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "agent server listening");
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
        .await
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/pods", get(pods))
        .route("/pods/:namespace/:name", get(pod))
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
