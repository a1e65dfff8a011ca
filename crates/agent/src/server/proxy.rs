//! Proxying an upgrade request (exec, attach, port-forward) to the URL the
//! runtime's streaming server gave, as kubelet does by default: the
//! client's request goes to that URL with its upgrade headers; a `101
//! Switching Protocols` is answered to the client with the runtime's
//! headers, and then bytes are copied both ways between the two upgraded
//! connections until either side closes. Any other answer is relayed as it
//! is (status, headers, body). The protocol on top (WebSocket or SPDY
//! streams) is the client's and the runtime's business.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, Method, StatusCode, Uri};
use axum::response::Response;
use hyper_util::rt::TokioIo;

use super::resolve::ApiError;

/// Deadline to connect to the runtime's streaming server and get its
/// answer (the streams themselves have none).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers that describe one hop's connection or body framing, never
/// copied from one connection to the other (the upgrade headers are
/// added back explicitly).
const HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::UPGRADE,
    header::TRANSFER_ENCODING,
    header::CONTENT_LENGTH,
    header::HOST,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    // Checked by the agent against its own Host ([`super::guard`]); the
    // streaming server, reached by another address, would see a
    // same-origin request as a cross-origin one.
    header::ORIGIN,
];

/// Whether the client asked to upgrade the connection.
pub(crate) fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        && headers.contains_key(header::UPGRADE)
}

/// Proxies `req` to `url` (`http://host:port/path?query`).
pub(crate) async fn proxy_upgrade(mut req: Request, url: &str) -> Result<Response, ApiError> {
    if !wants_upgrade(req.headers()) {
        return Err(ApiError::BadRequest(
            "upgrade request required (Connection: Upgrade with an Upgrade header)".into(),
        ));
    }
    let target: Uri = url
        .parse()
        .map_err(|e| ApiError::Internal(format!("runtime returned an invalid URL {url:?}: {e}")))?;
    if target.scheme_str() != Some("http") {
        return Err(ApiError::Internal(format!(
            "runtime streaming URL {url:?}: only http:// is supported"
        )));
    }
    let authority = target
        .authority()
        .ok_or_else(|| ApiError::Internal(format!("runtime streaming URL {url:?} has no host")))?
        .clone();
    let port = authority.port_u16().unwrap_or(80);
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');

    let client_upgrade = hyper::upgrade::on(&mut req);
    let upstream_req = upstream_request(&req, &target, authority.as_str())?;

    let connect = async {
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| {
                ApiError::BadGateway(format!(
                    "connect to runtime streaming server {authority}: {e}"
                ))
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| {
                ApiError::BadGateway(format!("runtime streaming server {authority}: {e}"))
            })?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "runtime streaming connection ended");
            }
        });
        sender
            .send_request(upstream_req)
            .await
            .map_err(|e| ApiError::BadGateway(format!("runtime streaming server {authority}: {e}")))
    };
    let mut resp = tokio::time::timeout(UPSTREAM_TIMEOUT, connect)
        .await
        .map_err(|_| {
            ApiError::BadGateway(format!(
                "runtime streaming server {authority} did not answer within {UPSTREAM_TIMEOUT:?}"
            ))
        })??;

    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Relay the refusal as it is.
        let mut out = Response::builder().status(resp.status());
        for (k, v) in resp.headers() {
            if !HOP.contains(k) {
                out = out.header(k, v);
            }
        }
        return out
            .body(Body::new(resp.into_body()))
            .map_err(|e| ApiError::Internal(format!("relay runtime answer: {e}")));
    }

    let upstream_upgrade = hyper::upgrade::on(&mut resp);
    let mut out = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in resp.headers() {
        out = out.header(k, v);
    }
    let out = out
        .body(Body::empty())
        .map_err(|e| ApiError::Internal(format!("relay runtime answer: {e}")))?;
    tokio::spawn(async move {
        // The client's upgrade completes once the 101 is written.
        let (client, upstream) = match tokio::try_join!(client_upgrade, upstream_upgrade) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "stream upgrade failed");
                return;
            }
        };
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => tracing::debug!(up, down, "stream closed"),
            Err(e) => tracing::debug!(error = %e, "stream ended"),
        }
    });
    Ok(out)
}

/// The request to the runtime: the client's method and headers (its
/// upgrade headers included) to the runtime's path, with no body.
fn upstream_request(
    req: &Request,
    target: &Uri,
    authority: &str,
) -> Result<hyper::Request<http_body_util::Empty<axum::body::Bytes>>, ApiError> {
    let path = target
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let method = if req.method() == Method::POST {
        Method::POST
    } else {
        Method::GET
    };
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, authority);
    for (k, v) in req.headers() {
        if !HOP.contains(k) {
            b = b.header(k, v);
        }
    }
    b = b.header(header::CONNECTION, "Upgrade");
    for v in req.headers().get_all(header::UPGRADE) {
        b = b.header(header::UPGRADE, v);
    }
    b.body(http_body_util::Empty::new())
        .map_err(|e| ApiError::Internal(format!("build runtime request: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
