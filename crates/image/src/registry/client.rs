//! A small Docker/OCI distribution client: GETs of one repository's
//! manifests and blobs on one host, with the auth challenge flow.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE,
};
use reqwest::{Client, Response, StatusCode};

use super::auth::{parse_challenge, Challenge, Credentials};
use super::hosts::Host;
use crate::limits::{MAX_ERROR_BODY_BYTES, MAX_TOKEN_ANSWER_BYTES};
use crate::ImageError;

/// Why one request to one host failed; the pull decides whether to try
/// the next host.
#[derive(Debug)]
pub enum FetchError {
    /// 404: this host does not have it.
    NotFound,
    /// The host cannot be reached or failed (connect error, 5xx, timeout).
    Unavailable(String),
    /// 401/403 after authenticating (or without credentials to offer).
    Denied(String),
    /// Anything else (unexpected status, bad token answer).
    Other(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound => f.write_str("not found"),
            Self::Unavailable(s) | Self::Denied(s) | Self::Other(s) => f.write_str(s),
        }
    }
}

/// Builds and caches one reqwest client per TLS setting, so connections
/// are reused across pulls.
#[derive(Debug, Default)]
pub struct Clients {
    cache: Mutex<HashMap<(Vec<PathBuf>, bool), Client>>,
}

impl Clients {
    /// The client for `host`'s TLS settings (its CA files are read once).
    pub fn for_host(&self, host: &Host) -> Result<Client, ImageError> {
        let key = (host.ca.clone(), host.skip_verify);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.get(&key) {
            return Ok(c.clone());
        }
        let mut b = Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("petrel/", env!("CARGO_PKG_VERSION")))
            .danger_accept_invalid_certs(host.skip_verify);
        for path in &host.ca {
            let pem = std::fs::read(path).map_err(|e| ImageError::io("read CA", path, e))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                ImageError::RegistryConfig {
                    path: path.clone(),
                    reason: format!("invalid CA certificate: {e}"),
                }
            })?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        let client = b.build().map_err(|e| ImageError::RegistryUnavailable {
            host: host.authority.clone(),
            reason: format!("cannot build HTTP client: {e}"),
        })?;
        cache.insert(key, client.clone());
        Ok(client)
    }
}

/// One repository on one host, with the authorization it earned.
pub struct RepoClient {
    client: Client,
    /// The host this talks to.
    pub host: Host,
    repository: String,
    creds: Credentials,
    headers: HeaderMap,
    /// The `Authorization` value to send, once a challenge was answered
    /// (or the registry token given up front).
    authorization: Mutex<Option<HeaderValue>>,
}

fn header_value(s: &str) -> Result<HeaderValue, FetchError> {
    HeaderValue::from_str(s).map_err(|_| FetchError::Other("invalid header value".to_string()))
}

/// Percent-encodes a query parameter value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b))
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl RepoClient {
    /// A client for `repository` (e.g. `library/busybox`) on `host`.
    pub fn new(
        client: Client,
        host: Host,
        repository: &str,
        creds: Credentials,
    ) -> Result<Self, ImageError> {
        let mut headers = HeaderMap::new();
        for (k, v) in &host.headers {
            let name = HeaderName::from_bytes(k.as_bytes());
            let value = HeaderValue::from_str(v);
            match (name, value) {
                (Ok(n), Ok(v)) => {
                    headers.append(n, v);
                }
                _ => {
                    return Err(ImageError::RegistryConfig {
                        path: PathBuf::from("hosts.toml"),
                        reason: format!("invalid header {k:?} of {}", host.origin),
                    })
                }
            }
        }
        let authorization = if creds.registry_token.is_empty() {
            None
        } else {
            HeaderValue::from_str(&format!("Bearer {}", creds.registry_token)).ok()
        };
        Ok(Self {
            client,
            host,
            repository: repository.to_string(),
            creds,
            headers,
            authorization: Mutex::new(authorization),
        })
    }

    fn describe(&self, e: &reqwest::Error) -> String {
        // reqwest's Display omits the cause ("error sending request");
        // the chain says "connection refused".
        let mut s = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(c) = src {
            s.push_str(": ");
            s.push_str(&c.to_string());
            src = c.source();
        }
        s
    }

    async fn send(&self, url: &str, accept: &str) -> Result<Response, FetchError> {
        let mut req = self
            .client
            .get(url)
            .headers(self.headers.clone())
            .header(ACCEPT, accept);
        let auth = self
            .authorization
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(a) = auth {
            req = req.header(AUTHORIZATION, a);
        }
        req.send()
            .await
            .map_err(|e| FetchError::Unavailable(self.describe(&e)))
    }

    /// GETs `<repo url>/<kind>/<reference>` (kind: `manifests` or
    /// `blobs`), answering one auth challenge. Returns a 2xx response.
    pub async fn get(
        &self,
        kind: &str,
        reference: &str,
        accept: &str,
    ) -> Result<Response, FetchError> {
        let url = format!(
            "{}/{kind}/{reference}",
            self.host.repo_url(&self.repository)
        );
        let mut resp = self.send(&url, accept).await?;
        if resp.status() == StatusCode::UNAUTHORIZED {
            let challenge = resp
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_challenge);
            let Some(challenge) = challenge else {
                return Err(FetchError::Denied(
                    "401 Unauthorized without a usable WWW-Authenticate challenge".to_string(),
                ));
            };
            let answer = self.answer(challenge).await?;
            *self.authorization.lock().unwrap_or_else(|e| e.into_inner()) = Some(answer);
            resp = self.send(&url, accept).await?;
        }
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        // Only the start of an error answer is quoted: read no more.
        let body = read_bounded(&mut resp, MAX_ERROR_BODY_BYTES)
            .await
            .unwrap_or_default();
        let body: String = String::from_utf8_lossy(&body).chars().take(300).collect();
        Err(match status {
            StatusCode::NOT_FOUND => FetchError::NotFound,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                FetchError::Denied(format!("{status}: {}", body.trim()))
            }
            s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                FetchError::Unavailable(format!("{status}: {}", body.trim()))
            }
            s => FetchError::Other(format!("GET {url}: {s}: {}", body.trim())),
        })
    }

    /// The `Authorization` value answering `challenge`.
    async fn answer(&self, challenge: Challenge) -> Result<HeaderValue, FetchError> {
        match challenge {
            Challenge::Basic => match self.creds.basic() {
                Some(b) => header_value(&b),
                // The registry's own answer is in the message, as other
                // runtimes show it: the 401 is what users search for.
                None => Err(FetchError::Denied(
                    "401 Unauthorized: the registry requires credentials and none were given"
                        .to_string(),
                )),
            },
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                let token = self.fetch_token(&realm, service.as_deref(), &scope).await?;
                header_value(&format!("Bearer {token}"))
            }
        }
    }

    /// Asks the token server at `realm` for a pull token (docker's token
    /// protocol: GET with Basic credentials, or an OAuth2 refresh-token
    /// POST for an identity token).
    async fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, FetchError> {
        let mut params = vec![format!("scope={}", encode(scope))];
        if let Some(s) = service {
            params.push(format!("service={}", encode(s)));
        }
        let req = if !self.creds.identity_token.is_empty() {
            params.push("grant_type=refresh_token".to_string());
            params.push(format!(
                "refresh_token={}",
                encode(&self.creds.identity_token)
            ));
            params.push("client_id=petrel".to_string());
            self.client
                .post(realm)
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(params.join("&"))
        } else {
            let sep = if realm.contains('?') { '&' } else { '?' };
            let mut r = self.client.get(format!("{realm}{sep}{}", params.join("&")));
            if let Some(b) = self.creds.basic() {
                r = r.header(AUTHORIZATION, b);
            }
            r
        };
        let resp = req.send().await.map_err(|e| {
            FetchError::Unavailable(format!("token server {realm}: {}", self.describe(&e)))
        })?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(FetchError::Denied(format!(
                "token server {realm}: {status}"
            )));
        }
        if !status.is_success() {
            return Err(FetchError::Other(format!("token server {realm}: {status}")));
        }
        let mut resp = resp;
        let too_large = || {
            FetchError::Other(format!(
                "token server {realm}: answer larger than {MAX_TOKEN_ANSWER_BYTES} bytes"
            ))
        };
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_TOKEN_ANSWER_BYTES as u64)
        {
            return Err(too_large());
        }
        let body = read_bounded(&mut resp, MAX_TOKEN_ANSWER_BYTES + 1)
            .await
            .map_err(|e| FetchError::Unavailable(format!("token server {realm}: {e}")))?;
        if body.len() > MAX_TOKEN_ANSWER_BYTES {
            return Err(too_large());
        }
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|e| FetchError::Other(format!("token server {realm}: bad answer: {e}")))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| FetchError::Other(format!("token server {realm}: no token in answer")))
    }
}

/// At most `limit` bytes of a response body; the rest is left unread (the
/// connection is not reused then).
async fn read_bounded(resp: &mut Response, limit: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(chunk) = resp.chunk().await? else {
            break;
        };
        let room = limit - out.len();
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    /// A registry and token server in one: answers `/v2/r/manifests/1`
    /// with a Bearer challenge unless it carries the token, and `/token`
    /// with the token when Basic credentials `u:p` come with the right
    /// scope and service. Returns its address and the request lines seen.
    async fn fake_registry() -> (String, std::sync::Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (a, log) = (addr.clone(), seen.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (a, log) = (a.clone(), log.clone());
                tokio::spawn(async move {
                    let (r, mut w) = stream.into_split();
                    let mut lines = BufReader::new(r).lines();
                    loop {
                        let Ok(Some(request)) = lines.next_line().await else {
                            return;
                        };
                        let mut auth = String::new();
                        while let Ok(Some(h)) = lines.next_line().await {
                            if h.is_empty() {
                                break;
                            }
                            if let Some(v) = h.strip_prefix("authorization: ") {
                                auth = v.to_string();
                            }
                        }
                        log.lock().expect("log").push(format!("{request} [{auth}]"));
                        let (status, extra, body) = if request
                            .starts_with("GET /token?scope=repository%3Ar%3Apull&service=fake HTTP")
                            && auth == "Basic dTpw"
                        {
                            ("200 OK", String::new(), r#"{"token":"t0k"}"#.to_string())
                        } else if request.starts_with("GET /v2/r/manifests/1 ")
                            && auth == "Bearer t0k"
                        {
                            ("200 OK", String::new(), "{}".to_string())
                        } else if request.starts_with("GET /v2/") {
                            (
                                "401 Unauthorized",
                                format!("WWW-Authenticate: Bearer realm=\"http://{a}/token\",service=\"fake\",scope=\"repository:r:pull\"\r\n"),
                                String::new(),
                            )
                        } else {
                            ("401 Unauthorized", String::new(), String::new())
                        };
                        let resp = format!(
                            "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if w.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    fn host(addr: &str) -> Host {
        Host {
            origin: format!("http://{addr}"),
            authority: addr.to_string(),
            base_path: "/v2".to_string(),
            capabilities: super::super::hosts::Capabilities {
                pull: true,
                resolve: true,
            },
            skip_verify: false,
            ca: vec![],
            headers: vec![],
        }
    }

    #[tokio::test]
    async fn bearer_challenge_should_fetch_a_token_with_basic_credentials() {
        let (addr, seen) = fake_registry().await;
        let clients = Clients::default();
        let h = host(&addr);
        let creds = Credentials {
            username: "u".into(),
            password: "p".into(),
            ..Default::default()
        };
        let c = RepoClient::new(clients.for_host(&h).expect("client"), h.clone(), "r", creds)
            .expect("repo client");
        let resp = c.get("manifests", "1", "*/*").await.expect("authorized");
        assert_eq!(resp.status(), StatusCode::OK);
        let log = seen.lock().expect("log").clone();
        assert_eq!(log.len(), 3, "{log:?}");
        // The token is kept: the next request needs no new challenge.
        c.get("manifests", "1", "*/*").await.expect("again");
        assert_eq!(seen.lock().expect("log").len(), 4);

        let wrong = Credentials {
            username: "u".into(),
            password: "x".into(),
            ..Default::default()
        };
        let c = RepoClient::new(clients.for_host(&h).expect("client"), h, "r", wrong)
            .expect("repo client");
        match c.get("manifests", "1", "*/*").await {
            Err(FetchError::Denied(m)) => assert!(m.contains("token server"), "{m}"),
            other => panic!("expected denied, got {:?}", other.map(|r| r.status())),
        }
    }

    #[test]
    fn query_values_should_be_percent_encoded() {
        assert_eq!(
            encode("repository:library/busybox:pull"),
            "repository%3Alibrary%2Fbusybox%3Apull"
        );
        assert_eq!(encode("a b~"), "a%20b~");
    }
}
