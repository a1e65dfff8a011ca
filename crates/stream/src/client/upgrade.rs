//! URL handling and the HTTP upgrade to SPDY/3.1 on the client side.

use bytes::{Bytes, BytesMut};
use http::{header, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::ClientError;
use crate::protocol::HEADER_PROTOCOL_VERSION;
use crate::spdy::session::{Incoming, Role, Session};

/// Where a streaming URL points.
pub(crate) struct Target {
    /// host:port.
    pub(crate) authority: String,
    /// Path and query.
    pub(crate) path: String,
}

pub(crate) fn parse(url: &str) -> Result<Target, ClientError> {
    let bad = |reason: &str| ClientError::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") | Some("ws") => {}
        _ => return Err(bad("only http:// URLs are supported")),
    }
    let auth = uri.authority().ok_or_else(|| bad("no host"))?;
    let authority = match auth.port_u16() {
        Some(_) => auth.as_str().to_owned(),
        None => format!("{}:80", auth.as_str()),
    };
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    Ok(Target { authority, path })
}

pub(crate) async fn connect(authority: &str) -> Result<TcpStream, ClientError> {
    let tcp = TcpStream::connect(authority)
        .await
        .map_err(|source| ClientError::Connect {
            address: authority.to_owned(),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

fn proto(e: impl std::fmt::Display) -> ClientError {
    ClientError::Protocol(e.to_string())
}

/// Upgrades a POST to `url` to SPDY/3.1 offering `protocols`; returns the
/// session, the streams the server opens (none, in these protocols) and
/// the negotiated protocol.
pub(crate) async fn spdy_upgrade(
    url: &str,
    protocols: &[&str],
) -> Result<(Session, mpsc::Receiver<Incoming>, String), ClientError> {
    let target = parse(url)?;
    let tcp = connect(&target.authority).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(proto)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "SPDY upgrade connection ended");
        }
    });
    let mut req = Request::post(target.path.as_str())
        .header(header::HOST, target.authority.as_str())
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1");
    for p in protocols {
        req = req.header(HEADER_PROTOCOL_VERSION, *p);
    }
    let req = req.body(Empty::<Bytes>::new()).map_err(proto)?;
    let resp = sender.send_request(req).await.map_err(proto)?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_owned())
            .unwrap_or_default();
        return Err(ClientError::Refused { status, body });
    }
    let negotiated = resp
        .headers()
        .get(HEADER_PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let upgraded = hyper::upgrade::on(resp).await.map_err(proto)?;
    let started = match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => {
            let (r, w) = parts.io.into_inner().into_split();
            Session::start(
                r,
                w,
                BytesMut::from(&parts.read_buf[..]),
                Role::Client,
                None,
            )
        }
        Err(upgraded) => {
            let (r, w) = tokio::io::split(TokioIo::new(upgraded));
            Session::start(r, w, BytesMut::new(), Role::Client, None)
        }
    };
    let (session, incoming) = started.map_err(proto)?;
    Ok((session, incoming, negotiated))
}
