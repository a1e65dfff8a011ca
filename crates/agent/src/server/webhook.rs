//! Who may use the kubelet API in cluster mode, decided as kubelet's
//! webhook modes decide it: the caller is the subject of its verified
//! client certificate (CN the user, O the groups) or the user a bearer
//! token belongs to (a TokenReview); what it asks is a verb on a
//! subresource of this Node (kubelet's mapping of paths); the API server
//! answers (a SubjectAccessReview). Answers are cached as kubelet caches
//! them: a token for 2 min, an allowed request for 5 min, a denied one
//! for 30 s.
//!
//! Without cluster mode there is no one to ask, and a client certificate
//! of the configured CA is enough (as before).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// How long a token's review is kept (kubelet's
/// `authentication.webhook.cacheTTL`).
const TOKEN_TTL: Duration = Duration::from_secs(120);
/// How long an allowed request is kept (`cacheAuthorizedTTL`).
const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied request is kept (`cacheUnauthorizedTTL`).
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Entries kept at most per cache; a full cache is emptied (rare: one
/// entry per caller and request kind).
const CACHE_MAX: usize = 4096;

/// A caller, as Kubernetes names users.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Identity {
    /// The user name.
    pub user: String,
    /// Its groups.
    pub groups: Vec<String>,
    /// Its UID, if the authenticator gives one.
    pub uid: String,
    /// Extra attributes (a token's), sorted.
    pub extra: Vec<(String, Vec<String>)>,
}

/// What a request asks of the node: `verb` on `nodes/<subresource>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attributes {
    /// get, create, update, patch, delete.
    pub verb: &'static str,
    /// proxy, stats, metrics, log, spec.
    pub subresource: &'static str,
}

/// The path's subresource and the method's verb, as kubelet maps them.
/// Exec, attach, port-forward and run change the node whatever the
/// method (a WebSocket upgrade is a GET), so they ask `create`.
pub fn attributes(method: &Method, path: &str) -> Attributes {
    let under = |p: &str| path == p || path.starts_with(&format!("{p}/"));
    let subresource = if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else if under("/spec") {
        "spec"
    } else {
        "proxy"
    };
    let changes = ["/exec", "/attach", "/portForward", "/run"]
        .iter()
        .any(|p| under(p));
    let verb = if changes {
        "create"
    } else {
        match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "get",
        }
    };
    Attributes { verb, subresource }
}

/// The API server's answers (a trait, so the middleware is tested without
/// one).
#[async_trait]
pub trait Reviewer: Send + Sync {
    /// The user `token` belongs to; None if the API server does not know
    /// it.
    async fn review_token(&self, token: &str) -> Result<Option<Identity>, String>;
    /// Whether `who` may do `what` on node `node`.
    async fn allowed(&self, who: &Identity, node: &str, what: Attributes) -> Result<bool, String>;
}

/// The webhook authenticator and authorizer of one node.
pub struct Webhook {
    reviewer: Arc<dyn Reviewer>,
    node: String,
    tokens: Mutex<HashMap<String, (Instant, Option<Identity>)>>,
    decisions: Mutex<HashMap<(Identity, Attributes), (Instant, bool)>>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook").field("node", &self.node).finish()
    }
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials, or a token the API server does not know (401).
    Unauthenticated,
    /// Known, but not allowed (403), with kubelet's message.
    Forbidden(String),
    /// The API server could not be asked (503: retry).
    Unavailable(String),
}

impl Webhook {
    /// The webhook of node `node`, asking `reviewer`.
    pub fn new(reviewer: Arc<dyn Reviewer>, node: &str) -> Self {
        Self {
            reviewer,
            node: node.to_string(),
            tokens: Mutex::new(HashMap::new()),
            decisions: Mutex::new(HashMap::new()),
        }
    }

    /// Decides one request: the bearer token's user if there is a token,
    /// else the certificate's subject.
    pub async fn check(
        &self,
        token: Option<&str>,
        cert: Option<&Identity>,
        what: Attributes,
    ) -> Result<Identity, Refusal> {
        let who = match token {
            Some(t) => self.identify(t).await?,
            None => cert.cloned().ok_or(Refusal::Unauthenticated)?,
        };
        if self.allowed(&who, what).await? {
            Ok(who)
        } else {
            Err(Refusal::Forbidden(format!(
                "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
                who.user, what.verb, what.subresource
            )))
        }
    }

    async fn identify(&self, token: &str) -> Result<Identity, Refusal> {
        if let Some((at, who)) = lock(&self.tokens).get(token).cloned() {
            if at.elapsed() < TOKEN_TTL {
                return who.ok_or(Refusal::Unauthenticated);
            }
        }
        let who = self
            .reviewer
            .review_token(token)
            .await
            .map_err(Refusal::Unavailable)?;
        let mut cache = lock(&self.tokens);
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(token.to_string(), (Instant::now(), who.clone()));
        who.ok_or(Refusal::Unauthenticated)
    }

    async fn allowed(&self, who: &Identity, what: Attributes) -> Result<bool, Refusal> {
        let key = (who.clone(), what);
        if let Some((at, ok)) = lock(&self.decisions).get(&key).copied() {
            let ttl = if ok { ALLOWED_TTL } else { DENIED_TTL };
            if at.elapsed() < ttl {
                return Ok(ok);
            }
        }
        let ok = self
            .reviewer
            .allowed(who, &self.node, what)
            .await
            .map_err(Refusal::Unavailable)?;
        let mut cache = lock(&self.decisions);
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, (Instant::now(), ok));
        Ok(ok)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The subject of a verified client certificate, put on each request of
/// its connection.
#[derive(Debug, Clone)]
pub struct PeerCertificate(pub Option<Identity>);

/// The middleware of the TCP listener in cluster mode: every request is
/// authenticated and authorized by `webhook`.
pub async fn authorize(State(webhook): State<Arc<Webhook>>, req: Request, next: Next) -> Response {
    let what = attributes(req.method(), req.uri().path());
    let cert = req
        .extensions()
        .get::<PeerCertificate>()
        .and_then(|p| p.0.clone());
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    match webhook.check(token.as_deref(), cert.as_ref(), what).await {
        Ok(_) => next.run(req).await,
        Err(Refusal::Unauthenticated) => {
            (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response()
        }
        Err(Refusal::Forbidden(m)) => (StatusCode::FORBIDDEN, format!("{m}\n")).into_response(),
        Err(Refusal::Unavailable(e)) => {
            tracing::warn!(error = %e, "kubelet API: the API server could not review a request");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the API server could not be asked; retry\n",
            )
                .into_response()
        }
    }
}

/// The subject of a DER certificate as a Kubernetes identity: CN the user,
/// each O a group. None if it cannot be read or has no CN.
pub fn identity_of_certificate(der: &[u8]) -> Option<Identity> {
    let (user, groups) = crate::der::subject(der)?;
    let user = user?;
    Some(Identity {
        user,
        groups,
        ..Identity::default()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
