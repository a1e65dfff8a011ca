//! The client's deadline (`grpc-timeout`), answered the way gRPC clients
//! expect: DEADLINE_EXCEEDED.
//!
//! tonic 0.12 enforces `grpc-timeout` itself, but answers an expired one
//! with an HTTP 200 that carries the grpc-status headers and no
//! content-type; grpc-go takes that for a malformed response ("missing
//! HTTP content-type", code Unknown). critest's "should timeout if
//! requested" failed whenever the server's timer beat the client's. This
//! layer runs inside tonic's and ends the call a millisecond before tonic's
//! timer with a complete DEADLINE_EXCEEDED response; tonic polls the inner
//! service before its timer, so this answer is the one sent.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::{http, Service};
use tonic::Status;

/// How much earlier than tonic's own timer the call is ended.
const MARGIN: Duration = Duration::from_millis(1);

/// Wraps the gRPC routes in [`Deadline`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

/// Ends a call whose `grpc-timeout` passes with DEADLINE_EXCEEDED.
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for Deadline<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::BoxBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let timeout = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout);
        let call = self.inner.call(req);
        let Some(timeout) = timeout else {
            return Box::pin(call);
        };
        let expired = tokio::time::sleep(timeout.saturating_sub(MARGIN));
        Box::pin(async move {
            tokio::select! {
                biased;
                r = call => r,
                () = expired => Ok(Status::deadline_exceeded(
                    "the client's deadline (grpc-timeout) passed",
                )
                .into_http()),
            }
        })
    }
}

/// Parses a `grpc-timeout` value: at most 8 digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`); None for anything else, which tonic ignores too.
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let split = v.len().checked_sub(1)?;
    let (digits, unit) = (v.get(..split)?, v.get(split..)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    #[test]
    fn parse_grpc_timeout_should_read_every_unit_and_refuse_the_rest() {
        assert_eq!(parse_grpc_timeout("1m"), Some(Duration::from_millis(1)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "123456789m", "1x", "-1m", "1.5S", "é"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    /// A route that never answers.
    #[derive(Clone)]
    struct Never;

    impl Service<http::Request<()>> for Never {
        type Response = http::Response<tonic::body::BoxBody>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_should_answer_deadline_exceeded_with_a_grpc_content_type() {
        let mut svc = tower::Layer::layer(&DeadlineLayer, Never);
        let req = http::Request::builder()
            .header("grpc-timeout", "20m")
            .body(())
            .unwrap_or_else(|e| panic!("{e}"));
        let started = tokio::time::Instant::now();
        let res = svc.call(req).await.unwrap_or_else(|e| match e {});
        assert!(
            started.elapsed() < Duration::from_millis(20),
            "before tonic's timer"
        );
        assert_eq!(res.status(), http::StatusCode::OK);
        assert_eq!(
            res.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/grpc")
        );
        assert_eq!(
            res.headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok()),
            Some("4"),
            "DEADLINE_EXCEEDED"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_should_leave_calls_without_one_alone() {
        let mut svc = tower::Layer::layer(&DeadlineLayer, Never);
        let req = http::Request::builder()
            .body(())
            .unwrap_or_else(|e| panic!("{e}"));
        let r = tokio::time::timeout(Duration::from_secs(3600), svc.call(req)).await;
        assert!(
            r.is_err(),
            "no deadline, no answer from a route that never answers"
        );
    }
}
