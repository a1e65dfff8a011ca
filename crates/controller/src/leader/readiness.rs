//! The readiness gate of warm standby: `GET /readyz` answers 200 only once
//! the controller's caches are synced, on leader and standby alike, so a
//! rolling update kills the old leader only after its replacement is warm
//! (Pinterest's readiness probe). `GET /healthz` answers 200 while the
//! process serves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Whether the caches are synced; cheap to clone (shared flag).
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    synced: Arc<AtomicBool>,
}

impl Readiness {
    /// Not ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets whether the caches are synced.
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Release);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}

async fn readyz(readiness: Readiness) -> (StatusCode, &'static str) {
    if readiness.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n")
    }
}

/// Serves `/readyz` and `/healthz` on `listener` until `shutdown`.
pub async fn serve_readiness(
    listener: TcpListener,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/readyz", get(move || readyz(readiness.clone())))
        .route("/healthz", get(|| async { "ok\n" }));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn status_of(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("writes");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("reads");
        out.lines().next().unwrap_or_default().to_owned()
    }

    #[tokio::test]
    async fn readiness_should_answer_ready_only_when_synced() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("has an address");
        let readiness = Readiness::new();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_readiness(listener, readiness.clone(), stop.clone()));
        assert_eq!(
            status_of(addr, "/readyz").await,
            "HTTP/1.1 503 Service Unavailable"
        );
        assert_eq!(status_of(addr, "/healthz").await, "HTTP/1.1 200 OK");
        readiness.set_synced(true);
        assert_eq!(status_of(addr, "/readyz").await, "HTTP/1.1 200 OK");
        stop.cancel();
        server.await.expect("joins").expect("serves");
    }
}
